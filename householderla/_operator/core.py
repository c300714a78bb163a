"""The compact WY operator machinery shared by :class:`~householderla.CWY`,
:class:`~householderla.TCWY` and the sides of :class:`~householderla.SVDHouseholder`.

An operator holds the resolved V, never copied or written, and a :class:`LazyFactors` that builds
U, T = S⁻¹ on the first product and shares them with its transpose; products go through the
autodiff switch (Likhosherstov et al., AISTATS 2021, Theorems 2 and 3). An operator is Q, Qᴴ
(``transposed``) or, for complex V, the conjugate of either (``conjugated``); a unitary operator
may carry a right phase factor diag(e^{iθ}) (:mod:`householderla._agnostic.phases`).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import array_api_compat as aac
import numpy as np

from .._agnostic import cwy_rows as R
from .._agnostic import forming as F
from .._agnostic.lapack_panels import form_from_rows
from .._interop.dask import dask_matmul, dask_rmatmul, is_dask_array
from .._interop.dlpack import from_numpy, plain_cpu_views
from .._kernels import numba_enabled, numba_for, numba_for_torch
from .._lib.checks import as_matrix_operand, broadcast_batch
from .._lib.device import device_kind
from .._lib.linalg import solve_upper_triangular
from .._lib.modes import is_deterministic
from .._lib.namespace import conj, device_of, is_complex, is_half, mH, mT, resolve
from .._lib.tracing import is_eager, needs_graph
from .._lib.tuning import SEQ_DETECT_FLOPS
from .blocked import apply_blocks
from .compose import compose, is_operator
from .factors import LazyFactors, lowrank
from .linear_operator import LinearOperatorMixin
from .plan import ApplyFacts, History, MatrixFacts, Path, plan_apply, plan_direct, plan_matrix
from .sequential import run_sequential

__all__ = ["CompactWYOperator"]


class CompactWYOperator(LinearOperatorMixin):
    """Shared machinery of :class:`CWY` and :class:`TCWY` (and their transposes)."""

    _mode_forward = "square"
    _mode_transpose = "square"
    # make ``ndarray @ op`` defer to ``op.__rmatmul__`` instead of treating op as a scalar
    __array_ufunc__ = None

    def __init__(
        self,
        V: Any,
        xp: Any,
        transposed: bool = False,
        factors: Any = None,
        structure: str = "auto",
        conjugated: bool = False,
        sdiag: Any = None,
        theta: Any = None,
        tau: Any = None,
        trapezoidal: bool | None = None,
    ) -> None:
        self._V = V  # the given vectors, resolved but never copied or written
        self._xp = xp
        self._transposed = transposed  # Qᴴ (Qᵀ for real V)
        self._conjugated = conjugated  # conj(·) of that; only ever True for complex V
        if factors is None:
            factors = LazyFactors(V, xp, structure, sdiag, theta, tau, trapezoidal)
        self._factors = factors

    # -- array-like metadata -------------------------------------------------------------
    @property
    def _U(self) -> Any:
        return self._factors.get()[0]

    @property
    def _T(self) -> Any:
        return self._factors.get()[1]

    @property
    def _n_rows_cols(self) -> tuple[int, int]:
        N, m = self._V.shape[-2], self._V.shape[-1]
        full = (N, N) if self._mode_forward == "square" else (N, m)
        return (full[1], full[0]) if self._transposed else full

    @property
    def shape(self) -> tuple[int, ...]:
        """``(..., rows, cols)`` of the matrix this operator represents."""
        return tuple(self._V.shape[:-2]) + self._n_rows_cols

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> Any:
        return self._V.dtype

    @property
    def device(self) -> Any:
        return device_of(self._V)

    def _reference_array(self) -> Any:
        return self._V

    @property
    def V(self) -> Any:
        """The reflection vectors as given (resolved, never copied), shape (..., N, L)."""
        return self._V

    @property
    def transposed(self) -> bool:
        """Whether this is the transpose of the operator :func:`cwy` / :func:`tcwy` built."""
        return self._transposed

    @property
    def U(self) -> Any:
        """Unit reflection vectors, shape (..., N, L) (zero columns stay zero)."""
        return self._U

    @property
    def T_factor(self) -> Any:
        """T = S⁻¹, upper triangular, shape (..., L, L)."""
        return self._T

    def _variant(self, transposed: bool, conjugated: bool) -> CompactWYOperator:
        return type(self)(self._V, self._xp, transposed, self._factors, conjugated=conjugated)

    @property
    def theta(self) -> Any:
        """The phases θ (..., K) of the right factor diag(e^{iθ}), or None (no factor)."""
        return self._factors.theta

    @property
    def T(self) -> CompactWYOperator:
        """The transposed operator Qᵀ; shares the factors. For real V also the inverse; for
        complex V the *plain* transpose, Qᵀ = conj(Qᴴ), as NumPy's ``.T`` (the inverse is
        :attr:`H`)."""
        flip = is_complex(self.dtype)
        return self._variant(not self._transposed, self._conjugated ^ flip)

    mT = T

    @property
    def H(self) -> CompactWYOperator:
        """The conjugate transpose Qᴴ, the inverse of a CWY operator (``.T`` for real V);
        shares the factors."""
        return self._variant(not self._transposed, self._conjugated)

    mH = H

    def conj(self) -> CompactWYOperator:
        """The complex conjugate operator (this operator itself for real V)."""
        return self._variant(self._transposed, self._conjugated ^ is_complex(self.dtype))

    @property
    def _mode(self) -> str:
        return self._mode_transpose if self._transposed else self._mode_forward

    def __repr__(self) -> str:
        t = ".T" if self._transposed else ""
        if is_complex(self.dtype):
            t = {(True, False): ".H", (True, True): ".T", (False, True): ".conj()"}.get(
                (self._transposed, self._conjugated), ""
            )
        return f"{type(self).__name__}(shape={self.shape}, dtype={self.dtype}){t}"

    # -- products ------------------------------------------------------------------------
    def _operand(self, h: Any) -> Any:
        """``h`` as an array of this operator's namespace, device and common float dtype."""
        if aac.is_jax_namespace(self._xp) and aac.is_numpy_array(h):
            h = self._xp.asarray(h)  # JAX code mixes in NumPy constants routinely
        if aac.is_array_api_obj(h) and aac.array_namespace(h) is not self._xp:
            held = type(self._V)
            raise TypeError(
                f"h is a {type(h).__module__}.{type(h).__name__} but the operator holds "
                f"{held.__module__}.{held.__name__} arrays; convert h first"
            )
        xp, device, _, (h,) = resolve([("h", h)], self._xp, complex_ok=True, half=True)
        if device is not None and self.device is not None and device != self.device:
            raise ValueError(f"h is on device {device} but the operator is on {self.device}")
        if h.dtype != self.dtype:
            h = xp.astype(h, xp.result_type(h.dtype, self.dtype))
        return h

    def reflector_sequence(self) -> tuple[Any, Any] | None:
        """(V, namespace) with V's columns in the order the product applies them: H(v₁)…H(v_L)
        for a CWY operator, reversed for its (conjugate) transpose, conjugated for the
        conjugate operator; None for T-CWY (not square) and for operators with phases or
        generalised reflectors (``from_lapack``), which do not concatenate."""
        f = self._factors
        if self._mode_forward != "square" or f.phase is not None or f.sdiag is not None:
            return None
        V = self._xp.flip(self._V, axis=-1) if self._transposed else self._V
        return conj(V, self._xp) if self._conjugated else V, self._xp

    def __getstate__(self) -> dict[str, Any]:
        # a namespace is a module, which pickle cannot store: re-derived from V on load
        return {**self.__dict__, "_xp": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._xp = aac.array_namespace(self._V)

    def __matmul__(self, h: Any) -> Any:
        """``self @ h`` with ``matmul`` semantics: h (K,) or (..., K, B), K = cols; an
        operator ``h`` gives the composed operator (:func:`.compose.compose`).

        A Dask array ``h`` gives a lazy Dask array computed chunk by chunk
        (:mod:`householderla._interop.dask`). Otherwise h is validated once and the planner
        (:func:`~householderla._operator.plan.plan_apply`) names the path, which runs
        unchecked: on the CPU, the first NumPy product may run the reflections one at a time
        (Numba kernel) when :func:`~householderla.householder.sequential_is_faster` says so;
        later products build and reuse U, T (or blocks). A plain product (no autodiff) of an
        operator used again and again switches, once the columns it has multiplied add up to
        N, to one GEMM with the dense Q (L > N/2 reflectors) or to h − W (Uᴴ h) with W = U T
        (:meth:`~householderla._operator.factors.LazyFactors.product_factor`).
        """
        if self._direct_gate(h):
            return self._run(self._plan_direct(h), h, h)
        if is_dask_array(h):
            return dask_matmul(self, h)
        if is_operator(h):
            return compose(self, h)
        h = self._operand(h)
        if self._conjugated:  # conj(A) h = conj(A conj(h))
            return conj(self._variant(self._transposed, False) @ conj(h, self._xp), self._xp)
        hm, vector = as_matrix_operand(h, self._n_rows_cols[1])
        broadcast_batch([("the operator", self._V.shape[:-2]), ("h", hm.shape[:-2])])
        path = plan_apply(self._apply_facts(h, hm))
        if path.name == "sequential":  # (takes h as given: the kernels' vector loop)
            return self._run(path, h, h)
        y = self._run(path, hm, h)
        return y[..., 0] if vector else y

    def _direct_gate(self, h: Any) -> bool:
        """Whether the direct factors or a built repeat factor serve this h as it is: a plain
        single square operator, h of their type, dtype and rows (the products and nothing
        else; the general path's checks cost 5% of a 1024 × 256 apply)."""
        f = self._factors
        return (
            (f.direct is not None or (f.shortcut is not None and self._transposed in f.shortcut))
            and not self._conjugated
            and f.phase is None
            and type(h) is f.direct_type
            and self._mode == "square"
            and self._V.ndim == 2
            and 1 <= h.ndim <= 2
            and h.dtype == f.U.dtype
            and h.shape[0] == f.U.shape[0]
            and (f.direct_type.__name__ == "ndarray" or self._torch_direct(h))
            and not is_deterministic()  # the general path alone: the same bits every call
        )

    def _plan_direct(self, h: Any) -> Path:
        f = self._factors
        B = 1 if h.ndim == 1 else h.shape[1]
        return plan_direct(f.V.shape[-2], B, f.applied, f.shortcut is not None, f.dense_pays)

    def planned_path(self, h: Any) -> Path:
        """The path ``self @ h`` takes now (:mod:`householderla._operator.plan`), nothing run;
        for tests and for looking. Dask and operator ``h`` are not planned (their own paths)."""
        if self._direct_gate(h):
            return self._plan_direct(h)
        h = self._operand(h)
        if self._conjugated:
            return self._variant(self._transposed, False).planned_path(conj(h, self._xp))
        hm, _ = as_matrix_operand(h, self._n_rows_cols[1])
        return plan_apply(self._apply_facts(h, hm))

    def planned_matrix_path(self) -> Path:
        """The path ``self.matrix()`` takes now, nothing run."""
        return plan_matrix(self._matrix_facts()) if self._V is not None else Path("factors")

    def _apply_facts(self, h: Any, hm: Any) -> ApplyFacts:
        """The facts :func:`~householderla._operator.plan.plan_apply` reads, for the validated
        h and its matrix form hm."""
        f, xp, V = self._factors, self._xp, self._V
        backend = _backend(xp)
        half = is_half(xp, h.dtype)
        graph = backend == "jax" or needs_graph(V, h)
        sc = f.shortcut
        return ApplyFacts(
            backend=backend,
            device=device_kind(V),
            N=V.shape[-2],
            L=V.shape[-1],
            B=hm.shape[-1],
            batch=math.prod(V.shape[:-2]),
            mode=self._mode,
            kernel_dtype=not (is_complex(h.dtype) or half),
            half=half,
            graph=graph,
            v_graph=needs_graph(V),
            deterministic=is_deterministic(),
            tau=f.tau is not None and f.panels_apply(hm),
            sdiag=f.sdiag is not None,
            phase=f.phase is not None,
            kernels=lambda: numba_for_torch(V, h) is not None,
            trapezoidal=f.trapezoidal,
            dense_pays=f.dense_pays,
            history=History(
                factors=f.U is not None,
                blocks=f.blocks is not None,
                sequential_used=f.sequential_used,
                panels_used=f.panels_used,
                applied=f.applied,
                shortcut=sc is not None,
                direct=f.direct is not None,
            ),
        )

    def _run(self, path: Path, hm: Any, h: Any) -> Any:
        """Run the planned path on hm (..., K, B), unchecked (``sequential``: on h as given)."""
        f, xp, name = self._factors, self._xp, path.name
        if name == "direct":
            U, T, Ut, Tt = f.direct
            f.applied += hm.shape[-1] if hm.ndim == 2 else 1  # (planned: record)
            return hm - U @ ((Tt if self._transposed else T) @ (Ut @ hm))
        if name == "sequential":
            return self._run_sequential(hm)
        if name == "lapack_panels":  # LAPACK's (a, τ): ?ormqr's panels, no whole factor built
            f.panels_used = True
            return f.run_panels(hm, self._transposed, self._mode)
        if name == "gpu_fused":  # a GPU's first product: a Gram, one solve, two GEMMs
            f.sequential_used = True  # (the first product is spent: later ones build U, T)
            return _fused_product(self._V, hm, xp, self._transposed)
        phase = f.phase
        if phase is not None and not self._transposed:  # Q₀ D h
            hm = phase[..., :, None] * hm
        if name in ("dense_q", "folded"):  # the repeat switch: one GEMM, or two with (F, G)
            f.get()
            B = 1 if hm.ndim == 1 else hm.shape[-1]
            y = _shortcut_product(f.product_factor(B, self._transposed), hm)
        elif name == "blocked":  # many reflectors, few columns: blocked compact WY
            if path.record:
                f.applied += hm.shape[-1]
            y = apply_blocks(f.build_blocks(), hm, xp, self._transposed)
        else:
            U, T = self._U, self._T
            if U.dtype != hm.dtype and not is_half(xp, hm.dtype):  # (half h: float32 U, T)
                U, T = xp.astype(U, hm.dtype), xp.astype(T, hm.dtype)
            if path.record:
                f.applied += hm.shape[-1]
            structured = name == "structured"
            y = lowrank(U, T, hm, xp, self._transposed, self._mode, structured)
        if phase is not None and self._transposed:  # Dᴴ Q₀ᴴ h
            y = xp.conj(phase)[..., :, None] * y
        return y

    def _torch_direct(self, h: Any) -> bool:
        """A torch product may skip the general path: same device, no graph to record."""
        return h.device == self._V.device and not needs_graph(self._V, h)

    @property
    def structure(self) -> str:
        """The ``structure`` given to :func:`cwy` / :func:`tcwy`: auto, trapezoidal or dense."""
        return self._factors.structure

    def _run_sequential(self, h: Any) -> Any:
        """Q h by sequential reflections (Numba) for the operator's first product, as planned
        (``sequential``): the next product builds the factors and reuses them."""
        f = self._factors
        f.sequential_used = True
        V = self._V if self._V.dtype == h.dtype else self._xp.astype(self._V, h.dtype)
        L = self._V.shape[-1]
        B = 1 if h.ndim == 1 else h.shape[-1]
        # skipping the zeros of a trapezoidal V saves ~2L²B of the 4NLB flops per matrix;
        # "auto" detects them (an N·L comparison per matrix and a few torch calls) only
        # where that can pay off
        P = math.prod(self._V.shape[:-2])  # matrices in the batch
        worth = f.structure != "auto" or 2 * L * L * B * P >= SEQ_DETECT_FLOPS
        trap = f.trapezoidal() if worth else False
        return run_sequential(V, h, self._transposed, trap, self._xp)

    def __rmatmul__(self, h: Any) -> Any:
        """``h @ self`` = (selfᵀ @ hᵀ)ᵀ; h (K,) or (..., B, K), K = rows."""
        if is_dask_array(h):
            return dask_rmatmul(self, h)
        if is_operator(h):
            return compose(h, self)
        h = self._operand(h)
        if h.ndim == 1:
            return self.T @ h
        return mT(self.T @ mT(h))

    def mv(self, h: Any) -> Any:
        """Apply to a stack of vectors along the last axis: h (..., K) -> (..., rows)."""
        if not is_dask_array(h):
            h = self._operand(h)
        K = self._n_rows_cols[1]
        if h.ndim == 0 or h.shape[-1] != K:
            got = "a scalar" if h.ndim == 0 else f"shape {tuple(h.shape)}"
            raise ValueError(
                f"h must have shape (..., {K}) (vectors along the last axis); got {got}"
            )
        return (self @ h[..., None])[..., 0]

    def _matrix_facts(self, box: dict[str, Any] | None = None) -> MatrixFacts:
        """The facts :func:`~householderla._operator.plan.plan_matrix` reads; ``box`` keeps
        the kernels' view of V if the planner asked for it (read once: a torch view costs
        three ops)."""
        f, xp, V = self._factors, self._xp, self._V
        backend = _backend(xp)
        box = {} if box is None else box

        def kernels() -> bool:
            box["view"] = _cpu_kernel_view(V, xp)
            return box["view"] is not None

        return MatrixFacts(
            backend=backend,
            device=device_kind(V),
            N=V.shape[-2],
            L=V.shape[-1],
            graph=backend == "jax" or needs_graph(V),
            eager=is_eager(V),
            sdiag=f.sdiag is not None,
            kernels=kernels,
            tau=f.tau is not None and f.panels_apply(V),
            trapezoidal=f.trapezoidal,
            float64_matrix=V.ndim == 2
            and V.shape[-1] <= V.shape[-2]
            and f.sdiag is None
            and str(V.dtype).endswith("float64"),
        )

    def _form(self, path: Path, view: Any = None) -> Any:
        """The dense matrix by the planned path, straight from V (all but ``factors``): the
        Numba kernels on [I; 0] (``numba_stack``: every matrix of a batch in one call, eight
        at a time in the SIMD lanes, :func:`householderla._kernels.numba.hform`, orgqr's flop
        count for lower-trapezoidal V; ``benchmarks/results/small.md``), LAPACK's ``?orgqr``
        panels, orgqr-style blocks for lower-trapezoidal V, or the one-shot I − V S⁻¹ Vᵀ."""
        xp, V, f = self._xp, self._V, self._factors
        ncols = None if self._mode_forward == "square" else V.shape[-1]
        if path.name == "numba_stack":
            nk, view = view or _cpu_kernel_view(V, xp)
            Q = nk.hform(view, ncols, trapezoidal=f.trapezoidal())
            return Q if view is V else from_numpy(Q, like=V)
        if path.name == "lapack_panels":
            return f.panel_matrix(ncols)
        if path.name == "native_orgqr":
            return _native_orgqr(V, f.tau, xp, V.shape[-2] if ncols is None else ncols)
        if path.name == "orgqr_kernel":  # (None where V's diagonal does not allow it)
            nk, view = view or _cpu_kernel_view(V, xp)
            Q = form_from_rows(view, nk, ncols)
            if Q is not None:
                return Q if view is V else from_numpy(Q, like=V)
        if path.name in ("orgqr_kernel", "structured_form"):
            return F.structured_matrix(V, xp, ncols, sdiag=f.sdiag)
        return F.dense_matrix(V, xp, ncols, sdiag=f.sdiag)

    def matrix(self) -> Any:
        """The dense matrix, shape ``self.shape``.

        Lower-trapezoidal V (LAPACK's layout, and what :func:`householder_vectors` returns) on
        NumPy/torch/CuPy without autodiff: blocked like LAPACK orgqr on the trailing submatrices
        (:func:`~householderla._agnostic.forming.structured_matrix`, 4N³/3 flops for L = N, float64
        ‖QᵀQ − I‖ at orgqr's level); any other V there: the one-shot I − V S⁻¹ Vᵀ with unnormalised
        factors (:func:`~householderla._agnostic.forming.dense_matrix`: syrk, one triangular solve,
        one GEMM). With autodiff or on other namespaces: I − U (T Uᵀ) through the differentiable
        factors (2·N²·L flops for CWY, 2·N·M² for T-CWY). float32 input is formed in float64 on CPU,
        except for N ≤ 64 on NumPy, where the reflections are applied to [I; 0] by the Numba kernel,
        every matrix of a batch in one call. The path is
        :func:`~householderla._operator.plan.plan_matrix`'s; on CUDA always the one-shot form.
        """
        if self._conjugated:
            return conj(self._variant(self._transposed, False).matrix(), self._xp)
        out = self._dense_unphased()
        phase = self._factors.phase
        if phase is None:
            return out
        if self._transposed:  # Dᴴ Q₀ᴴ: rows scaled
            return self._xp.conj(phase)[..., :, None] * out
        return out * phase[..., None, :]  # Q₀ D: columns scaled

    def _dense_unphased(self) -> Any:
        """The dense Q₀ (or Q₀ᴴ) of the reflectors, without the phase factor."""
        mode, xp = self._mode_forward, self._xp
        if self._V is not None:
            box: dict[str, Any] = {}
            path = plan_matrix(self._matrix_facts(box))
            if path.name != "factors":
                dense = self._form(path, box.get("view"))
                return mH(dense, xp) if self._transposed else dense
        # half-precision V: formed from its float32 factors in float32, rounded once
        dt = self._V.dtype
        if self._transposed and mode != "embed":
            return lowrank(self._U, self._T, None, xp, True, mode, out=dt)
        out = lowrank(self._U, self._T, None, xp, False, mode, out=dt)
        return mH(out, xp) if self._transposed else out


def _fused_product(V: Any, h: Any, xp: Any, transposed: bool) -> Any:
    """Q h = h − V S⁻¹ (Vᵀ h) (Qᵀ h with S⁻ᵀ) from the unnormalised V (N, L) and S = ½
    diag(‖v‖²) + striu(VᵀV) (:func:`householderla._agnostic.cwy_rows.rows_factor`: NaN
    columns raise, zero columns are H(0) = I): ten-odd ops whatever L, nothing cached."""
    V = V if V.dtype == h.dtype else xp.astype(V, h.dtype)
    S = R.rows_factor(V, xp)
    Vh = mT(V) @ h
    acc = S.dtype
    b = solve_upper_triangular(S, Vh if Vh.dtype == acc else xp.astype(Vh, acc), xp, transposed)
    return h - V @ (b if b.dtype == h.dtype else xp.astype(b, h.dtype))


def _native_orgqr(V: Any, tau: Any, xp: Any, ncols: int) -> Any:
    """The first ``ncols`` columns of Q from LAPACK's (V, τ) by torch's own ``?orgqr``
    (``torch.linalg.householder_product``, one op on a GPU); ncols > L pads V and τ with
    zero columns (τ = 0: H = I)."""
    torch = sys.modules["torch"]
    pad = ncols - V.shape[-1]
    if pad > 0:
        V = torch.nn.functional.pad(V, (0, pad))
        tau = torch.nn.functional.pad(tau, (0, pad))
    return torch.linalg.householder_product(V, tau.to(V.dtype))


def _backend(xp: Any) -> str:
    """The planner's name of a namespace."""
    if aac.is_numpy_namespace(xp):
        return "numpy"
    if aac.is_torch_namespace(xp):
        return "torch"
    if aac.is_jax_namespace(xp):
        return "jax"
    if aac.is_cupy_namespace(xp):
        return "cupy"
    return "other"


def _cpu_kernel_view(V: Any, xp: Any) -> tuple[Any, Any] | None:
    """(the Numba kernels, a NumPy view of V) for real float32/float64 V on the CPU (NumPy,
    or a torch tensor without autograd); None otherwise."""
    nk = numba_for(xp, V)
    views = [V] if nk is not None else plain_cpu_views(V)
    nk = nk or (numba_enabled() if views is not None else None)
    if nk is None or views[0].dtype not in (np.float32, np.float64):
        return None
    return nk, views[0]


def _shortcut_product(P: tuple[str, Any], h: Any) -> Any:
    """Q h from the factor ``LazyFactors.product_factor`` built: ("dense", Q) → Q h (one
    GEMM), ("folded", (F, G)) → h − F (G h) (two; F = W = U T and G = Uᴴ for Q, F = U and
    G = Wᴴ for Qᴴ)."""
    kind, F = P
    if kind == "dense":
        return F @ h
    F, G = F
    return h - F @ (G @ h)
