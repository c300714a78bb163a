"""The lazily built factors of a compact WY operator, shared by an operator and its
(conjugate) transposes: U and T = S⁻¹ of V (N·L² + L³/3 flops on first use), and the one
function that applies them through the autodiff switch.

``sdiag`` generalises the reflectors: S = diag(sdiag) + striu(UᴴU), so column k is the unitary
rank-one map I − (1 − λ_k) u_k u_kᴴ with λ_k = 1 − 1/sdiag_k (a reflection, λ = −1, for the
default sdiag = ½). LAPACK's complex reflectors I − τ v vᴴ are of this kind
(:func:`householderla.from_lapack`, ``docs/theory/complex.rst``).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import array_api_compat as aac
import numpy as np

from .._agnostic import compact_wy as K
from .._agnostic import trapezoidal as S
from .._agnostic.lapack_panels import (
    ViewPanels,
    apply_panels,
    form_panel_width,
    form_panels,
)
from .._agnostic.phases import phase_factor
from .._autodiff import call, route
from .._interop.dlpack import plain_cpu_views
from .._kernels import numba_enabled
from .._lib.linalg import eye_like, row_major_copy
from .._lib.mixed import widen
from .._lib.modes import is_deterministic
from .._lib.namespace import device_of, mH
from .._lib.tracing import is_eager, needs_graph
from .._lib.tuning import SMALL_N
from .blocked import block_factors

__all__ = ["SMALL_N", "LazyFactors", "factors_of", "lowrank"]


def factors_of(V: Any, xp: Any, sdiag: Any = None) -> tuple[Any, Any]:
    """U and T of ``V`` (and the diagonal ``sdiag`` of S, default ½), through the explicit VJP
    when autodiff may follow. Half-precision V gives float32 factors
    (:func:`~householderla._lib.mixed.widen`)."""
    U, T, _ = call(route(xp, V), "cwy_factors", xp, widen(V, xp), sdiag)
    return U, T


def lowrank(
    U: Any,
    T: Any,
    h: Any,
    xp: Any,
    transpose: bool,
    mode: str,
    structured: bool = False,
    out: Any = None,
) -> Any:
    """R(h) − U_out M U_inᴴ h through the rule table of the call; ``structured`` asks for the
    blocked trapezoidal products, which only the plain route has. ``out``: the dtype of the
    dense matrix (``h=None``) when it differs from the factors' (half-precision V)."""
    r = route(xp, U, T, h)
    if r == "plain" and structured and h is not None:
        if h.dtype != U.dtype:  # half-precision h: float32 products, one rounding
            y = S.lowrank_apply(U, T, xp.astype(h, U.dtype), xp, transpose=transpose, mode=mode)
            return xp.astype(y, h.dtype)
        return S.lowrank_apply(U, T, h, xp, transpose=transpose, mode=mode)
    if out is None or out == U.dtype:
        return call(r, "lowrank", xp, U, T, h, transpose, mode)
    return call(r, "lowrank", xp, U, T, h, transpose, mode, out)


class LazyFactors:
    """U and T of V, computed on first use and shared by an operator and its transpose.

    ``cwy(V).matrix()`` for lower-trapezoidal V never needs them. With torch, factors cached
    without a graph (first used under ``no_grad``) are rebuilt when a later use needs one.
    Also holds the ``structure`` of V and, for "auto", the result of detecting it (once),
    ``sdiag`` (None: reflections; see the module docstring), a constant of the operator, and
    the phases θ of a right factor diag(e^{iθ}) (None: no such factor), LAPACK's ``tau``
    (:func:`householderla.from_lapack`; None otherwise), with which the first product and
    ``.matrix()`` run LAPACK's panel algorithms (:meth:`run_panels`), and the
    ``shortcut`` of repeated plain products (the dense Q, or W = U T; :meth:`product_factor`).
    """

    __slots__ = (
        "T",
        "U",
        "V",
        "_trapezoidal",
        "applied",
        "blocks",
        "dense_pays",
        "direct",
        "direct_type",
        "panels_used",
        "phase",
        "sdiag",
        "sequential_used",
        "shortcut",
        "structure",
        "tau",
        "theta",
        "xp",
    )

    def __init__(
        self,
        V: Any,
        xp: Any,
        structure: str = "auto",
        sdiag: Any = None,
        theta: Any = None,
        tau: Any = None,
        trapezoidal: bool | None = None,
    ) -> None:
        self.V, self.xp, self.structure, self.sdiag = V, xp, structure, sdiag
        self.tau, self.panels_used = tau, False  # LAPACK's τ (..., L) of V, or None
        # the right phase factor D(θ) = diag(e^{iθ}) of a unitary operator, or None
        self.theta = theta
        self.phase = None if theta is None else phase_factor(theta, xp)
        self.U = self.T = self.shortcut = None
        self.applied = 0  # columns multiplied (by the single pair or the blocks) so far
        # more than N/2 reflectors: repeated products switch to the dense Q (else to W = U T)
        self.dense_pays = 2 * V.shape[-1] > V.shape[-2]
        self.blocks: list[tuple[int, Any, Any]] | None = None  # blocked factors (``_blocked``)
        # "auto"'s detected structure: None until needed, unless the caller scanned V already
        self._trapezoidal: bool | None = trapezoidal
        self.sequential_used = False
        # the products of a built single-matrix operator on NumPy / torch without autodiff:
        # (U, T, Uᴴ, Tᴴ), and the array type they serve (see CompactWYOperator.__matmul__)
        self.direct: tuple[Any, Any, Any, Any] | None = None
        self.direct_type = _direct_type(V, xp)

    def __getstate__(self) -> dict[str, Any]:
        # the namespace (a module) is re-derived from V on load
        return {k: getattr(self, k) for k in self.__slots__ if k != "xp"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # (states pickled before these existed)
        self.tau, self.panels_used, self.shortcut, self.applied = None, False, None, 0
        V = state["V"]
        self.dense_pays = 2 * V.shape[-1] > V.shape[-2]
        for k, v in state.items():
            setattr(self, k, v)
        sc = self.shortcut
        if isinstance(sc, tuple):  # (Q, Qᴴ), as pickled before W = U T existed
            self.shortcut = {False: ("dense", sc[0]), True: ("dense", sc[1])}
        elif sc is not None:  # a folded W alone (before (F, G)): rebuilt on the next product
            self.shortcut = {
                k: P for k, P in sc.items() if P[0] == "dense" or isinstance(P[1], tuple)
            }
        self.xp = aac.array_namespace(self.V)

    def trapezoidal(self) -> bool:
        """Whether V is lower trapezoidal: declared ("trapezoidal"), excluded ("dense"), or
        detected once on eager arrays ("auto": one N·L comparison; never on lazy arrays, and
        never while autodiff records V: its zeros are then values, not the map's structure,
        and the entries above the diagonal have derivatives that the products skipping them
        would drop)."""
        if self.structure != "auto":
            return self.structure == "trapezoidal"
        if needs_graph(self.V):
            return False
        if self._trapezoidal is None:
            self._trapezoidal = _upper_is_zero(self.V, self.xp)
        return self._trapezoidal

    def _stale(self, factor: Any) -> bool:
        """No factor yet, or one cached without a graph (torch) that a later use needs."""
        return factor is None or (
            aac.is_torch_namespace(self.xp) and needs_graph(self.V) and not factor.requires_grad
        )

    def build_blocks(self) -> list[tuple[int, Any, Any]]:
        """The blocked factors (``_operator.blocked``), built on the first product the planner
        sends down the ``blocked`` path, then reused (rebuilt when a graph is needed)."""
        if self._stale(None if self.blocks is None else self.blocks[0][1]):
            self.blocks = block_factors(self.V, self.xp, self.trapezoidal(), self.sdiag)
        return self.blocks

    def panels_apply(self, h: Any) -> bool:
        """Whether LAPACK's panels (:mod:`householderla._agnostic.lapack_panels`) serve a
        product or ``.matrix()`` with ``h``: LAPACK's τ known, no autodiff to follow, eager
        arrays of V's dtype, not JAX (its products always go through the custom_jvp rules)."""
        return (
            self.tau is not None
            and h.dtype == self.V.dtype
            and not aac.is_jax_namespace(self.xp)
            and is_eager(h)
            and is_eager(self.V)
            and not needs_graph(self.V, h)
        )

    def run_panels(self, h: Any, transposed: bool, mode: str) -> Any:
        """Q h (Qᴴ h) for h (..., K, B) by LAPACK's panels (``?ormqr``), the planner's
        ``lapack_panels`` path of an operator's first product: panel T's of nb columns cost
        ≈ 2·m·L·nb flops instead of m·L² + L³/3, and nothing is cached; later products build
        and reuse the blocked or whole factors. ``mode``: "square" (m × m Q), "embed"
        (Q[:, :L] x) or "project" (Q[:, :L]ᴴ y)."""
        V, xp = self.V, self.xp
        panels = ViewPanels(V, self.tau, xp, t_of=_compiled_larft(V))
        return apply_panels(panels, h, xp, transposed, mode)

    def panel_matrix(self, ncols: int | None) -> Any:
        """The first ``ncols`` (None: all) columns of Q formed as ``?orgqr`` from LAPACK's τ
        (the planner's ``lapack_panels`` path of ``.matrix()``)."""
        V, xp = self.V, self.xp
        ncols = V.shape[-2] if ncols is None else ncols
        nb = form_panel_width(V.shape[-1])
        return form_panels(ViewPanels(V, self.tau, xp, nb, _compiled_larft(V)), ncols, xp)

    def get(self) -> tuple[Any, Any]:
        if self._stale(self.U):
            first = self.U is None  # (columns the blocks multiplied count for the switch)
            self.U, self.T = factors_of(self.V, self.xp, self.sdiag)
            self.direct, self.shortcut = None, None
            self.applied = self.applied if first else 0
            U, T = self.U, self.T
            small = self.V.ndim == 2 and self.V.shape[-1] < S.MIN_COLUMNS  # never blocked
            if self.direct_type is not None and small and not needs_graph(self.V, U):
                self.direct = (U, T, mH(U, self.xp), mH(T, self.xp))
        return self.U, self.T

    def product_factor(self, B: int, transposed: bool) -> tuple[str, Any] | None:
        """The factor of a plain (no autodiff) product Q h (Qᴴ h where ``transposed``) with B
        columns, for an operator used again and again; None until it pays:

        - ``("dense", Q)`` (or Qᴴ) for L > N/2 reflectors: a product is one GEMM of 2·N²·B
          flops instead of 4·N·L·B + 2·L²·B. Q = I − (U T) Uᴴ costs 2·N·L² + 2·N²·L flops
          once and takes N² ≤ 2·N·L entries, no more than U and T; at L = N a product with
          Q is several times faster (``benchmarks/results/tuning.md``).
        - ``("folded", (F, G))`` for L ≤ N/2: Q h = h − F (G h), the two GEMMs of 4·N·L·B
          flops without T's product (2·L²·B): with W = U T, Q h = h − W (Uᴴ h) (F = W,
          G = Uᴴ) and Qᴴ h = h − U (Wᴴ h) (F = U, G = Wᴴ = Tᴴ Uᴴ). G, the L × N factor of
          the first GEMM, is kept row-major: Uᴴ as a view of the row-major U made that GEMM
          a transposed one, which OpenBLAS and MKL run slower (NumPy, one thread, float64,
          ratio to the two GEMMs Uᵣ (Uᵣᵀ h) of one row-major Uᵣ, paired in one process:
          N = 1024, L = 256, B = 64: 1.07–1.17× with the view, 0.97–0.99× row-major;
          N = 2048, L = 512, B = 32: 1.08× and 0.79×; torch (MKL) 1.04× and 0.94×). The
          folded factors cost 2·N·L² flops once and 2·N·L entries for Q (W and Uᴴ), N·L for
          Qᴴ (Wᴴ), built for a direction on its first product after the switch.

        Either is built when the columns of the products so far add up to N, where the flops
        they would have saved (at least 2·L² per column) match its cost: ski rental, never
        more than about twice the best choice made knowing the future. None in deterministic
        mode (:func:`householderla.set_deterministic`): the path may not depend on history."""
        if is_deterministic():
            return None
        sc = self.shortcut
        if sc is not None and transposed in sc:
            return sc[transposed]
        if sc is None:
            self.applied += B
            if self.applied < self.V.shape[-2]:
                return None
            sc = self.shortcut = {}
        xp, U, T = self.xp, self.U, self.T
        if self.dense_pays:
            Q = eye_like(xp, U.shape[-2], U.dtype, device_of(U)) - (U @ T) @ mH(U, xp)
            sc[False], sc[True] = ("dense", Q), ("dense", mH(Q, xp))
        elif transposed:  # (the other direction's factors: on its first product after this)
            sc[True] = ("folded", (U, mH(T, xp) @ mH(U, xp)))
        else:
            sc[False] = ("folded", (U @ T, row_major_copy(mH(U, xp), xp)))
        return sc[transposed]


def _compiled_larft(V: Any) -> Any:
    """The panel T's builder for :func:`~householderla._agnostic.lapack_panels.panel_factors`
    on a NumPy V: ``?larft``'s recurrence compiled by Numba
    (:mod:`householderla._kernels.numba_larft`; an order of magnitude faster than the closed
    form's batched ``inv``). None (the
    closed form) without Numba or for other arrays."""
    if type(V) is not np.ndarray or V.dtype.char not in "fdFD":
        return None
    nk = numba_enabled()
    if nk is None:
        return None

    def t_of(G: Any, tau: Any) -> Any:
        n = G.shape[-1]
        T = np.empty(G.shape, G.dtype)
        g = np.ascontiguousarray(G).reshape(-1, n, n)
        t = np.ascontiguousarray(tau, dtype=G.dtype).reshape(-1, n)
        nk.larft_forward(g, t, T.reshape(-1, n, n))
        return T

    return t_of


def scan_reflectors(V: Any) -> tuple[bool, bool] | None:
    """(all entries finite, lower trapezoidal) for V (..., N, L), one matrix or a stack, of
    NumPy arrays or plain CPU tensors (float32/float64, C order), from one Numba pass; None
    (nothing checked) for other input or without Numba. The two checks an operator's
    construction and first ``.matrix()`` make, in one read of V instead of two."""
    if V.ndim < 2 or not math.prod(V.shape) or not is_eager(V):
        return None
    views = [V] if type(V) is np.ndarray else plain_cpu_views(V)
    nk = numba_enabled() if views is not None else None
    v = views[0] if nk is not None else None
    if v is None or v.dtype not in (np.float32, np.float64) or not v.flags.c_contiguous:
        return None  # (another layout would cost a copy: the NumPy checks read it in place)
    finite, lower = nk.finite_lower(v.reshape((-1, *v.shape[-2:])))
    return bool(finite), bool(lower)


def _upper_is_zero(V: Any, xp: Any) -> bool:
    """:func:`~householderla._agnostic.compact_wy.is_lower_trapezoidal`; for NumPy arrays or
    plain CPU tensors (float32/float64, one matrix or a stack) one Numba pass over the strict
    upper part, stopping at its first nonzero, instead of ``triu(V) == 0``'s two full-size
    temporaries (a third of forming Q at N = 256)."""
    if V.ndim >= 2 and math.prod(V.shape) and is_eager(V):
        views = [V] if type(V) is np.ndarray else plain_cpu_views(V)
        nk = numba_enabled() if views is not None else None
        if nk is not None and views[0].dtype in (np.float32, np.float64):
            v = np.ascontiguousarray(views[0].reshape((-1, *V.shape[-2:])))
            return bool(nk.upper_is_zero(v))
    return K.is_lower_trapezoidal(V, xp)


def _direct_type(V: Any, xp: Any) -> type | None:
    """The exact array type the direct products of :class:`LazyFactors` serve: NumPy's
    ndarray, torch's Tensor; None elsewhere (JAX always goes through its custom_jvp rules,
    other namespaces through the general path)."""
    if aac.is_numpy_namespace(xp):
        return type(V) if type(V).__name__ == "ndarray" else None
    if aac.is_torch_namespace(xp):
        return sys.modules["torch"].Tensor
    return None
