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
from typing import Any

import array_api_compat as aac
import numpy as np

from .._agnostic import forming as F
from .._agnostic import trapezoidal as S
from .._autodiff import route
from .._interop.dask import dask_matmul, dask_rmatmul, is_dask_array
from .._interop.dlpack import from_numpy, plain_cpu_views
from .._kernels import numba_enabled, numba_for, numba_for_torch
from .._lib.checks import as_matrix_operand, broadcast_batch
from .._lib.modes import is_deterministic
from .._lib.namespace import conj, device_of, is_complex, is_half, mH, mT, resolve
from .._lib.tracing import is_eager, needs_graph
from .._lib.tuning import SEQ_DETECT_FLOPS
from .blocked import apply_blocks
from .compose import compose, is_operator
from .factors import SMALL_N, LazyFactors, lowrank
from .linear_operator import LinearOperatorMixin
from .sequential import apply_sequential, sequential_is_faster

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
        (:mod:`householderla._interop.dask`). On NumPy, the first product of an operator whose
        factors are not built yet may run the reflections one at a time (Numba kernel) when
        :func:`~householderla.householder.sequential_is_faster` says so for its shape; later
        products build and reuse U, T. A plain product (no autodiff) of an operator used
        again and again switches, once the columns it has multiplied add up to N, to one GEMM
        with the dense Q (L > N/2 reflectors) or to h − W (Uᴴ h) with W = U T
        (:meth:`~householderla._operator.factors.LazyFactors.product_factor`).
        """
        f = self._factors
        direct = f.direct
        sc = f.shortcut
        if is_deterministic():  # the general path alone: the same bits on every call
            direct = sc = None
        # the products and nothing else, for a plain single operator whose factors serve
        # this h as they are: with few reflectors (``direct``) Q h = h − U (T (Uᴴ h)), Qᴴ h
        # with Tᴴ, or, once they pay, the dense Q or h − W (Uᴴ h)
        # (LazyFactors.product_factor), which is also served directly once built for more
        # reflectors (the general path's checks cost 5% of a 1024 × 256 apply)
        if (
            (direct is not None or (sc is not None and self._transposed in sc))
            and not self._conjugated
            and f.phase is None
            and type(h) is f.direct_type
            and self._mode == "square"
            and self._V.ndim == 2
            and 1 <= h.ndim <= 2
            and h.dtype == f.U.dtype
            and h.shape[0] == f.U.shape[0]
            and (f.direct_type.__name__ == "ndarray" or self._torch_direct(h))
        ):
            if direct is None:
                return _shortcut_product(sc[self._transposed], h)
            U, T, Ut, Tt = direct
            P = f.product_factor(1 if h.ndim == 1 else h.shape[1], self._transposed)
            if P is None:
                return h - U @ ((Tt if self._transposed else T) @ (Ut @ h))
            return _shortcut_product(P, h)
        xp = self._xp
        if is_dask_array(h):
            return dask_matmul(self, h)
        if is_operator(h):
            return compose(self, h)
        h = self._operand(h)
        if self._conjugated:  # conj(A) h = conj(A conj(h))
            return conj(self._variant(self._transposed, False) @ conj(h, xp), xp)
        hm, vector = as_matrix_operand(h, self._n_rows_cols[1])
        broadcast_batch([("the operator", self._V.shape[:-2]), ("h", hm.shape[:-2])])
        y = self._first_product_sequential(h)
        if y is not None:
            return y
        y = self._factors.first_panel_product(hm, self._transposed, self._mode)
        if y is not None:  # LAPACK's (a, τ): ?ormqr's panels, no whole factor built
            return y[..., 0] if vector else y
        phase = self._factors.phase
        if phase is not None and not self._transposed:  # Q₀ D h
            hm = phase[..., :, None] * hm
        blocks = self._factors.get_blocks(hm.shape[-1]) if self._mode == "square" else None
        if blocks is not None:  # many reflectors, few columns: blocked compact WY
            y = apply_blocks(blocks, hm, xp, self._transposed)
        else:
            U, T = self._U, self._T
            if U.dtype != h.dtype and not is_half(xp, h.dtype):  # (half h: float32 U, T)
                U, T = xp.astype(U, h.dtype), xp.astype(T, h.dtype)
            structured = self._use_structured(hm.shape[-1])
            P = None
            if self._mode == "square" and not structured and U.dtype == hm.dtype:
                if route(xp, U, T, hm) == "plain":  # no autodiff to record
                    P = f.product_factor(hm.shape[-1], self._transposed)
            if P is not None:  # one GEMM with the dense Q (Qᴴ), or two with the folded (F, G)
                y = _shortcut_product(P, hm)
            else:
                y = lowrank(U, T, hm, xp, self._transposed, self._mode, structured)
        if phase is not None and self._transposed:  # Dᴴ Q₀ᴴ h
            y = xp.conj(phase)[..., :, None] * y
        return y[..., 0] if vector else y

    def _torch_direct(self, h: Any) -> bool:
        """A torch product may skip the general path: same device, no graph to record."""
        return h.device == self._V.device and not needs_graph(self._V, h)

    @property
    def structure(self) -> str:
        """The ``structure`` given to :func:`cwy` / :func:`tcwy`: auto, trapezoidal or dense."""
        return self._factors.structure

    def _use_structured(self, B: int) -> bool:
        """Blocked trapezoidal products for ``@`` with B right-hand sides: V lower trapezoidal
        and a shape where they were measured faster (``trapezoidal.use_structured``)."""
        N, L = self._V.shape[-2], self._V.shape[-1]
        return S.use_structured(N, L, B) and self._factors.trapezoidal()

    def _first_product_sequential(self, h: Any) -> Any:
        """Q h by sequential reflections (Numba) for the operator's first NumPy product, or
        CPU torch product without autograd, when the measured crossover favours it over
        building U, T; None otherwise."""
        f = self._factors
        if f.U is not None or f.sequential_used or self._mode != "square" or is_deterministic():
            return None
        if is_complex(h.dtype) or is_half(self._xp, h.dtype):
            # the Numba kernels are real float32/float64: complex and half-precision
            # products go through U, T
            return None
        if not aac.is_numpy_namespace(self._xp) and not (
            aac.is_torch_namespace(self._xp)
            and not needs_graph(self._V, h)
            and numba_for_torch(self._V, h) is not None
        ):
            return None
        N, L = self._V.shape[-2], self._V.shape[-1]
        B = 1 if h.ndim == 1 else h.shape[-1]
        if not sequential_is_faster(N, L, B, h.dtype):
            return None
        f.sequential_used = True  # the next product builds the factors and reuses them
        V = self._V if self._V.dtype == h.dtype else self._xp.astype(self._V, h.dtype)
        # skipping the zeros of a trapezoidal V saves ~2L²B of the 4NLB flops per matrix;
        # "auto" detects them (an N·L comparison per matrix and a few torch calls) only
        # where that can pay off
        P = math.prod(self._V.shape[:-2])  # matrices in the batch
        worth = f.structure != "auto" or 2 * L * L * B * P >= SEQ_DETECT_FLOPS
        trap = f.trapezoidal() if worth else False
        return apply_sequential(V, h, transpose=self._transposed, trapezoidal=trap, xp=self._xp)

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

    def _direct_dense(self) -> Any:
        """The dense matrix straight from V when no autodiff follows (NumPy/CuPy/torch):
        orgqr-style for lower-trapezoidal V, else the one-shot I − V S⁻¹ Vᵀ. Not under
        ``torch.compile``: its rescaling of extreme columns is data dependent."""
        xp, V = self._xp, self._V
        if V is None or not (
            aac.is_numpy_namespace(xp)
            or aac.is_cupy_namespace(xp)
            or (aac.is_torch_namespace(xp) and not needs_graph(V) and is_eager(V))
        ):
            return None
        ncols = None if self._mode_forward == "square" else V.shape[-1]
        small = self._small_matrix(V, xp, ncols)
        if small is not None:
            return small
        panels = self._factors.panel_matrix(ncols)  # LAPACK's (a, τ): ?orgqr's algorithm
        if panels is not None:
            return panels
        sdiag = self._factors.sdiag
        if self._factors.trapezoidal():
            return F.structured_matrix(V, xp, ncols, sdiag=sdiag)
        return F.dense_matrix(V, xp, ncols, sdiag=sdiag)

    def _small_matrix(self, V: Any, xp: Any, ncols: int | None) -> Any:
        """Small N (≤ SMALL_N = 64) on NumPy: the reflections applied to [I; 0] by the Numba
        kernels, all matrices of a batch in one call (eight at a time in the SIMD lanes:
        :func:`householderla._kernels.numba.hform`; no per-matrix BLAS call or factor
        build), orgqr's flop count for lower-trapezoidal V. None otherwise (complex V, other
        reflectors). Timings are in ``benchmarks/results/small.md``."""
        if V.shape[-2] > SMALL_N or self._factors.sdiag is not None:
            return None
        nk = numba_for(xp, V)
        views = [V] if nk is not None else plain_cpu_views(V)  # CPU torch without autograd
        nk = nk or (numba_enabled() if views is not None else None)
        if nk is None or views[0].dtype not in (np.float32, np.float64):
            return None
        Q = nk.hform(views[0], ncols, trapezoidal=self._factors.trapezoidal())
        return Q if views[0] is V else from_numpy(Q, like=V)

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
        every matrix of a batch in one call (``_small_matrix``).
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
        dense = self._direct_dense()
        if dense is not None:
            return mH(dense, xp) if self._transposed else dense
        # half-precision V: formed from its float32 factors in float32, rounded once
        dt = self._V.dtype
        if self._transposed and mode != "embed":
            return lowrank(self._U, self._T, None, xp, True, mode, out=dt)
        out = lowrank(self._U, self._T, None, xp, False, mode, out=dt)
        return mH(out, xp) if self._transposed else out


def _shortcut_product(P: tuple[str, Any], h: Any) -> Any:
    """Q h from the factor ``LazyFactors.product_factor`` built: ("dense", Q) → Q h (one
    GEMM), ("folded", (F, G)) → h − F (G h) (two; F = W = U T and G = Uᴴ for Q, F = U and
    G = Wᴴ for Qᴴ)."""
    kind, F = P
    if kind == "dense":
        return F @ h
    F, G = F
    return h - F @ (G @ h)
