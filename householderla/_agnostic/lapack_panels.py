"""LAPACK's own algorithms on LAPACK's ``(a, τ)``: panels of reflectors, each with its small T.

Panels [s, e) of nb = PANEL columns: I − V_p T_p V_pᴴ (Schreiber & Van Loan, SIAM J. Sci. Stat.
Comput. 1989) acts on rows s:m only, T_p = (I + diag(τ_p) striu(V_pᴴV_p))⁻¹ diag(τ_p) by
``?larft``'s recurrence (τᵢ = 0 gives a zero row and column). :func:`apply_panels` is
``?ormqr`` (≈ 4·m·k·B − 2·k²·B flops), :func:`form_panels` is ``?orgqr``, backwards from the
identity, keeping ‖QᴴQ − I‖ at orgqr's level; the panel T's cost ≈ 2·m·k·nb against m·k² for
the whole T. Panels come from :class:`ViewPanels` (views of a built V) or :class:`LapackPanels`
(a column-major NumPy ``a`` read in place). Every function takes ``xp``; no autodiff.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import array_api_compat as aac

from .._lib.blas import blas_pointers
from .._lib.checks import broadcast_batch
from .._lib.linalg import gram_upper, inv_upper_triangular, subtract_product, workspace
from .._lib.namespace import device_of, is_complex, mH, mT
from .._lib.tuning import PANEL, SMALL_FORM_MAX_MK, SMALL_FORM_PANEL

__all__ = [
    "PANEL",
    "LapackPanels",
    "ViewPanels",
    "apply_panels",
    "form_from_rows",
    "form_panel_width",
    "form_panels",
    "panel_bounds",
    "panel_factors",
]


def form_from_rows(V: Any, nk: Any, ncols: int | None = None) -> Any:
    """``?orgqr``'s Q (N, ncols or N) of lower-trapezoidal float64 NumPy V (N, L), L ≤ N, C
    order, in one compiled call that reads V's rows itself (``nk.orgqr_rows``: each column
    divided by its diagonal entry, H(αv) = H(v), τⱼ = 2/‖aⱼ‖², panel by panel, never a
    whole aᵀ). None where that kernel declines a column (v_jj² < 1e-16·‖vⱼ‖², v_jj = 0
    with vⱼ ≠ 0, ‖vⱼ‖² out of the normal range), V is not C-contiguous float64 or NumPy's
    CBLAS is not reachable: the caller then forms Q from V itself."""
    import numpy as np

    N, L = V.shape
    cols = N if ncols is None else ncols
    if L > N or cols < L or V.dtype != np.float64 or not V.flags.c_contiguous:
        return None
    nb = form_panel_width(L, compiled_rows=N)
    c = _compiled_arguments(V.dtype, lambda: _panel_buffers(nb, N, V.dtype), nb, cols)
    if c is None:
        return None
    blas, scalars, work = c
    Q = np.zeros((N, cols))
    ok = nk.orgqr_rows(*blas, V, np.empty(L), Q, nb, *scalars, *work)
    return Q if ok else None


def form_panel_width(k: int, compiled_rows: int | None = None) -> int:
    """Reflectors per panel for forming Q (m rows) from k reflectors: k/16 rounded down to a
    power of two, clipped to [32, 256]; ``SMALL_FORM_PANEL`` (16) where the compiled kernel
    forms a real Q of m = ``compiled_rows`` rows with m·k ≤ ``SMALL_FORM_MAX_MK`` (faster
    there, ``benchmarks/results/tuning.md``; the Python loop over panels keeps the wider
    ones). Wider panels make the trailing update one larger GEMM per panel and halve the
    passes over Q, which pays once Q is large. Square Q from
    ``dgeqrf``'s (a, τ), float64, one thread, idle 2-core VM, time / dorgqr's (median of
    paired rounds), nb = 32 / 64 / 128 / 256: N = 512: 1.04 / 1.14 / 1.44 / 2.24;
    N = 1024: 1.08 / 0.99 / 1.01 / 1.28; N = 2048: 1.23 / 0.98 / 0.84 / 0.87; N = 4096:
    — / 1.04 / 0.77 / 0.73."""
    if compiled_rows is not None and compiled_rows * k <= SMALL_FORM_MAX_MK:
        return SMALL_FORM_PANEL
    nb = PANEL
    while nb < 256 and 2 * nb * 16 <= k:
        nb *= 2
    return nb


def panel_bounds(k: int, nb: int = PANEL) -> list[tuple[int, int]]:
    """The panels [s, e) of k reflectors, first first; the last may be narrower."""
    return [(s, min(s + nb, k)) for s in range(0, k, nb)]


def _writeable(xp: Any) -> bool:
    return aac.is_numpy_namespace(xp) or aac.is_torch_namespace(xp) or aac.is_cupy_namespace(xp)


def _inv_unit_upper(M: Any, xp: Any) -> Any:
    """M⁻¹ for unit upper-triangular M (..., n, n). NumPy: its own LAPACK (``inv``: the LU of
    an upper-triangular matrix swaps no rows, so this is the triangular inverse) — the same
    BLAS build as the GEMMs around it (see ``forming._solve_upper_same_blas``)."""
    if aac.is_numpy_namespace(xp):
        return xp.linalg.inv(M)
    return inv_upper_triangular(M, xp)


def _t_of(G: Any, tau: Any, xp: Any) -> Any:
    """T = (I + diag(τ) striu(G))⁻¹ diag(τ) for Gram blocks G (..., n, n), τ (..., n)."""
    n = G.shape[-1]
    eye = xp.eye(n, dtype=G.dtype, device=device_of(G))
    M = xp.triu(G * tau[..., :, None], k=1) + eye
    return _inv_unit_upper(M, xp) * tau[..., None, :]


def _panel_h(V: Any, s: int, e: int, xp: Any, buf: Any) -> Any:
    """V[..., s:, s:e]ᴴ: a transposed view for real V; for complex V the conjugate lands in
    ``buf`` (..., ≥ m − s, ≥ e − s) on NumPy (one panel, reused: no copy of all of V)."""
    Vp = V[..., s:, s:e]
    if not is_complex(V.dtype):
        return mT(Vp)
    if buf is None or not aac.is_numpy_namespace(xp):
        return mH(Vp, xp)
    import numpy as np

    out = buf[..., : Vp.shape[-2], : Vp.shape[-1]]
    np.conjugate(Vp, out=out)
    return mT(out)


def _conj_buffer(V: Any, nb: int, xp: Any) -> Any:
    """The panel buffer of :func:`_panel_h` (complex NumPy V only, else None)."""
    if not (is_complex(V.dtype) and aac.is_numpy_namespace(xp)):
        return None
    return xp.empty((*V.shape[:-2], V.shape[-2], nb), dtype=V.dtype, device=device_of(V))


def panel_factors(
    V: Any, tau: Any, xp: Any, nb: int = PANEL, t_of: Callable[[Any, Any], Any] | None = None
) -> list[Any]:
    """[T_p] (..., e − s, e − s) of the panels of V (..., m, k), τ (..., k) (same dtype as V).

    Each Gram V_pᴴV_p covers the panel's rows s:m only, and only its strict upper triangle is
    read (a single complex NumPy V: ``zherk``/``cherk``); the full-width panels' T's are made
    in one batched call of ``t_of(G, τ)`` (G (..., P, nb, nb), τ (..., P, nb); default the
    closed form T = (I + diag(τ) striu(G))⁻¹ diag(τ); the caller may pass a compiled
    ``?larft`` recurrence, :mod:`householderla._kernels.numba_larft`)."""
    if t_of is None:
        t_of = lambda G, t: _t_of(G, t, xp)  # noqa: E731
    k = V.shape[-1]
    herk = is_complex(V.dtype) and V.ndim == 2 and aac.is_numpy_namespace(xp)
    buf = None if herk else _conj_buffer(V, nb, xp)
    bounds = panel_bounds(k, nb)
    grams = []
    for s, e in bounds:
        if herk:  # the upper triangle only, half the flops (real syrk was no faster than @)
            grams.append(gram_upper(V[s:, s:e], xp))
        else:
            grams.append(_panel_h(V, s, e, xp, buf) @ V[..., s:, s:e])
    full = [g for g in grams if g.shape[-1] == nb]
    out = []
    if full:
        P = len(full)
        G = xp.stack(full, axis=-3)  # (..., P, nb, nb)
        t = xp.reshape(tau[..., : P * nb], (*tau.shape[:-1], P, nb))
        T = t_of(G, t)
        out = [T[..., p, :, :] for p in range(P)]
    if len(full) < len(grams):  # the narrower last panel
        s = bounds[-1][0]
        out.append(t_of(grams[-1], tau[..., s:]))
    return out


class ViewPanels:
    """The panels of V (..., m, k) as views, their T's built up front by :func:`panel_factors`
    (one batched ``t_of`` call for all the full-width panels): ``get(p)`` is (V_p, V_pᴴ, T_p)
    with V_p = V[..., s:, s:e]."""

    def __init__(self, V: Any, tau: Any, xp: Any, nb: int = PANEL, t_of: Any = None) -> None:
        self.V, self.xp, self.nb = V, xp, nb
        self.m, self.k = V.shape[-2], V.shape[-1]
        self.batch, self.dtype, self.device = tuple(V.shape[:-2]), V.dtype, device_of(V)
        self.bounds = panel_bounds(self.k, nb)
        self.Ts = panel_factors(V, tau, xp, nb, t_of)
        self.buf = _conj_buffer(V, nb, xp)

    def get(self, p: int) -> tuple[Any, Any, Any]:
        s, e = self.bounds[p]
        return self.V[..., s:, s:e], _panel_h(self.V, s, e, self.xp, self.buf), self.Ts[p]


class LapackPanels:
    """The panels of LAPACK's reflectors read from one column-major NumPy ``a`` (m, n), τ (k,)
    themselves, without building V. ``get(p)`` writes V_p (e − s columns, rows s:m: zeros
    above the diagonal, the implicit 1, ``a`` below it; zeros where τᵢ = 0) into one
    (m, nb) column-major buffer reused for every panel, with its conjugate for complex
    ``a``, by one call of ``nk.lapack_panel``; then T_p from the panel's Gram (GEMM into a
    reused buffer) by ``nk.larft_forward``. ``nk``: the Numba entry module
    (:mod:`householderla._kernels.numba`), given by the caller. The panel views are valid
    until the next ``get``. A fresh V (m × k) would be written once and read once, and
    freeing it with the result made glibc hand the heap back, so a plain loop page-faulted it
    in again on every call (``benchmarks/results/tuning.md``).

    Where NumPy's own CBLAS is reachable (:func:`householderla._lib.blas.blas_pointers`),
    :func:`apply_panels` and :func:`form_panels` run their whole loop in one compiled call
    instead (``nk.ormqr_panels``, ``nk.orgqr_panels``: the same panels and GEMMs, without
    the interpreter between them; see :mod:`householderla._kernels.numba_panels`)."""

    def __init__(self, a: Any, tau: Any, nb: int, nk: Any) -> None:
        self.tau, self.nb, self.nk = tau, nb, nk
        self.m, self.k = a.shape[0], tau.shape[0]
        self.batch, self.dtype, self.device = (), a.dtype, "cpu"
        self.bounds = panel_bounds(self.k, nb)
        self.at = a.T  # (n, m) C-contiguous: column i of a is row i
        self._bufs: tuple[Any, ...] | None = None

    def _buffers(self) -> tuple[Any, Any, Any, Any]:
        """:func:`_panel_buffers`, made once."""
        if self._bufs is None:
            self._bufs = _panel_buffers(self.nb, self.m, self.dtype)
        return self._bufs

    def get(self, p: int) -> tuple[Any, Any, Any]:
        import numpy as np

        buf, cbuf, G, T = self._buffers()
        s, e = self.bounds[p]
        w = e - s
        self.nk.lapack_panel(self.at, self.tau, s, e, buf, cbuf, cbuf is not buf)
        Vp, Vh = buf[:w, s:].T, cbuf[:w, s:]
        G, T = G[: w * w].reshape(1, w, w), T[: w * w].reshape(1, w, w)
        np.matmul(Vh, Vp, out=G[0])
        self.nk.larft_forward(G, self.tau[None, s:e], T)
        return Vp, Vh, T[0]

    def _compiled(self, cols: int) -> tuple[Any, ...] | None:
        """:func:`_compiled_arguments` with this object's buffers."""
        return _compiled_arguments(self.dtype, self._buffers, self.nb, cols)

    def compiled_apply(self, h: Any, adjoint: bool) -> Any:
        """Q h (Qᴴ h) for a 2-D NumPy h (m, B) in one compiled call, as a fresh C-ordered
        array; None where that does not run (then :func:`apply_panels` loops in Python)."""
        import numpy as np

        c = self._compiled(h.shape[1]) if h.ndim == 2 and h.dtype == self.dtype else None
        if c is None:
            return None
        blas, scalars, work = c
        y = np.array(h, order="C")
        self.nk.ormqr_panels(*blas, self.at, self.tau, y, self.nb, adjoint,
                             is_complex(self.dtype), *scalars, *work)  # fmt: skip
        return y

    def compiled_form(self, ncols: int) -> Any:
        """:func:`form_panels`' Q in one compiled call, or None where that does not run."""
        import numpy as np

        c = self._compiled(ncols)
        if c is None:
            return None
        blas, scalars, work = c
        Q = np.zeros((self.m, ncols), self.dtype)
        self.nk.orgqr_panels(*blas, self.at, self.tau, Q, self.nb, is_complex(self.dtype),
                             *scalars, *work)  # fmt: skip
        return Q


def _panel_buffers(nb: int, m: int, dtype: Any) -> tuple[Any, Any, Any, Any]:
    """(buf, cbuf, G, T) of the compiled panel kernels: the panel buffer (nb, m), which holds
    V_pᵀ in its rows (V_p column-major), its conjugate (``buf`` itself for a real dtype), and
    flat nb² buffers for the Gram and T (a (w, w) reshape of their head is contiguous for
    every panel width w)."""
    import numpy as np

    buf = np.empty((nb, m), dtype)
    cbuf = np.empty_like(buf) if is_complex(dtype) else buf
    return buf, cbuf, np.empty(nb * nb, dtype), np.empty(nb * nb, dtype)


def _compiled_arguments(dtype: Any, buffers: Callable[[], tuple], nb: int, cols: int) -> Any:
    """The arguments of ``nk.ormqr_panels`` / ``orgqr_panels`` / ``orgqr_rows`` around the
    operands: (``?gemm``, ``?syrk``/``?herk``, real 1, real 0), (1, −1, 0) as CBLAS takes
    them, and the workspace (``buffers()``, then W1, W2 of nb·``cols``); None where NumPy's
    CBLAS is not reachable (the buffers are then not made)."""
    import numpy as np

    ptrs = blas_pointers(dtype)
    if ptrs is None:
        return None
    real = np.float32 if np.dtype(dtype).char in "fF" else np.float64
    W = (np.empty(nb * cols, dtype), np.empty(nb * cols, dtype))
    return (*ptrs, real(1), real(0)), _blas_scalars(np.dtype(dtype)), (*buffers(), *W)


#: (1, −1, 0) as one-element arrays per complex dtype, kept for the process: CBLAS takes
#: complex α and β by address.
_COMPLEX_SCALARS: dict[Any, tuple[Any, ...]] = {}


def _blas_scalars(dtype: Any) -> tuple[Any, ...]:
    """(1, −1, 0) as CBLAS ``?gemm`` takes α and β for ``dtype``: values for real dtypes,
    the addresses of :data:`_COMPLEX_SCALARS`' arrays for complex ones."""
    import numpy as np

    if not is_complex(dtype):
        return tuple(dtype.type(v) for v in (1, -1, 0))
    if dtype not in _COMPLEX_SCALARS:
        _COMPLEX_SCALARS[dtype] = tuple(np.full(1, v, dtype) for v in (1, -1, 0))
    return tuple(x.ctypes.data for x in _COMPLEX_SCALARS[dtype])


def apply_panels(panels: Any, h: Any, xp: Any, adjoint: bool, mode: str = "square") -> Any:
    """Q h (``adjoint``: Qᴴ h) for h (..., m, B), Q = ∏ (I − V_p T_p V_pᴴ) over the panels
    of :class:`ViewPanels` or :class:`LapackPanels`; h is not written. Panel p touches rows
    s_p:m only (``?larfb`` on the trapezoid). ``mode`` is the operator's: "square", "embed"
    (the thin Q's product Q [x; 0] for x (..., k, B)) or "project" (the first k rows of
    Qᴴ y)."""
    if mode == "embed":
        pad = (*h.shape[:-2], panels.m - panels.k, h.shape[-1])
        h = xp.concat([h, xp.zeros(pad, dtype=h.dtype, device=device_of(h))], axis=-2)
    y = panels.compiled_apply(h, adjoint) if isinstance(panels, LapackPanels) else None
    if y is not None:
        return y[: panels.k] if mode == "project" else y
    bounds = panels.bounds
    order = range(len(bounds)) if adjoint else range(len(bounds) - 1, -1, -1)
    inplace = _writeable(xp)
    batch = broadcast_batch([("the operator", panels.batch), ("h", h.shape[:-2])])
    y = xp.asarray(xp.broadcast_to(h, (*batch, *h.shape[-2:])), copy=True)
    work = workspace(batch, y.shape[-2], y.shape[-1], y, xp)
    for p in order:
        s = bounds[p][0]
        Vp, Vh, T = panels.get(p)
        x = y[..., s:, :]
        w = (mH(T, xp) if adjoint else T) @ (Vh @ x)
        if inplace:
            subtract_product(y[..., s:, :], Vp, w, xp, work)
        else:
            x = x - Vp @ w
            y = xp.concat([y[..., :s, :], x], axis=-2) if s else x
    return y[..., : panels.k, :] if mode == "project" else y


def form_panels(panels: Any, ncols: int, xp: Any) -> Any:
    """The first ``ncols`` columns of Q (..., m, ncols), k ≤ ncols ≤ m, formed as ``?orgqr``
    from the panels of :class:`ViewPanels` or :class:`LapackPanels`: from the identity, last
    panel first. Before panel [s, e) is applied, Q[s:, s:] is [[I, 0], [0, Q[e:, e:]]], so
    V_pᴴ Q[s:, s:] needs one GEMM on the trailing block only, and one more GEMM updates
    Q[s:, s:]. Writeable namespaces only (NumPy, torch, CuPy).
    """
    Q = panels.compiled_form(ncols) if isinstance(panels, LapackPanels) else None
    if Q is not None:
        return Q
    m, k, batch = panels.m, panels.k, panels.batch
    dtype, device = panels.dtype, panels.device
    Q = xp.zeros((*batch, m, ncols), dtype=dtype, device=device)
    if k < ncols:  # the columns no reflector reaches before the panels: the identity
        Q[..., k:, k:] = xp.eye(m - k, ncols - k, dtype=dtype, device=device)
    bounds = panels.bounds
    work = workspace(batch, m, ncols, Q, xp)
    eye = xp.eye(panels.nb, dtype=dtype, device=device)
    for p in range(len(bounds) - 1, -1, -1):
        s, e = bounds[p]
        Vp, Vhp, T = panels.get(p)
        # V_pᴴ Q[s:, s:] = [V_p[:e−s]ᴴ (its unit lower triangle, against E), V_p[e−s:]ᴴ Q[e:, e:]]
        parts = [Vhp[..., :, : e - s]]
        if ncols > e:
            parts.append(Vhp[..., :, e - s :] @ Q[..., e:, e:])
        W = T @ (parts[0] if len(parts) == 1 else xp.concat(parts, axis=-1))
        Q[..., s:e, s:e] = eye[: e - s, : e - s]
        subtract_product(Q[..., s:, s:], Vp, W, xp, work)
    return Q
