"""LAPACK's blocked loops ``?ormqr`` and ``?orgqr`` on one column-major ``(a, τ)``, compiled.

The loops of :func:`householderla._agnostic.lapack_panels.apply_panels` and ``form_panels``
over ``LapackPanels`` in one Numba call each: per panel the copy out of aᵀ, its Gram by one
``?gemm`` (``?herk`` for complex), T_p by ``?larft``'s recurrence, then two or three GEMMs, every
BLAS call through a pointer to NumPy's own CBLAS (:func:`householderla._lib.blas.blas_pointers`).
What goes is the interpreter between the calls. Matrices are row-major for CBLAS (aᵀ, panel
buffer ``buf`` and its conjugate ``cbuf``); complex α, β go by address. The workspace comes
from the caller: an array allocated inside the kernel may be freed before BLAS writes to it.
"""

from __future__ import annotations

from typing import Any

from .._lib.tuning import PANEL_COPY_ROWS
from .numba_larft import larft_one, panel_rows
from .numba_loops import HAVE_NUMBA, njit

__all__ = ["orgqr_panels", "orgqr_rows", "ormqr_panels"]

#: A hash of the sibling kernel modules this one imports: Numba's on-disk cache keys a
#: compiled function on its own file only, so changing this line when one of them changes
#: makes the cache recompile (tests/test_numba_kernels.py checks it).
KERNEL_DEPS = "2a47d763e1a37a6b"

_ROW, _NO, _TRANS, _CONJ_TRANS, _UPPER = 101, 111, 112, 113, 121


def _sigs(kind: str) -> Any:
    if not HAVE_NUMBA:
        return None
    import numba
    from numba import types as nt

    from .._lib.blas import GEMM_PROTOTYPES, RANK_K_PROTOTYPES

    out = []
    for t, f in zip("sdcz", (nt.float32, nt.float64, nt.complex64, nt.complex128), strict=True):
        gemm = numba.typeof(GEMM_PROTOTYPES[t](0))  # the type only: the address comes per call
        rk = numba.typeof(RANK_K_PROTOTYPES[t](0))
        scalar = f if t in "sd" else nt.uintp
        real = nt.float32 if t in "sc" else nt.float64
        ro2, ro1 = nt.Array(f, 2, "C", readonly=True), nt.Array(f, 1, "C", readonly=True)
        rw2, rw1, i, b = nt.Array(f, 2, "C"), nt.Array(f, 1, "C"), nt.int64, nt.boolean
        work = (rw2, rw2, rw1, rw1, rw1, rw1)
        blas = (gemm, rk, real, real)
        if kind == "ormqr":
            out.append(nt.void(*blas, ro2, ro1, rw2, i, b, b, scalar, scalar, scalar, *work))
        elif kind == "orgqr":
            out.append(nt.void(*blas, ro2, ro1, rw2, i, b, scalar, scalar, scalar, *work))
        elif t == "d":  # "rows": float64 V, τ written
            out.append(nt.boolean(*blas, ro2, rw1, rw2, i, scalar, scalar, scalar, *work))
    return out


@njit(inline="always")
def _at(x: Any, offset: int) -> Any:
    """The address of element ``offset`` of C-contiguous x, taken where it is passed (an
    array Numba allocated would be released after its last use, so an address kept in a
    variable could dangle)."""
    return x.ctypes.data + offset * x.itemsize


@njit(inline="always")
def _gram(
    gemm: Any, rk: Any, rone: Any, rzero: Any, one: Any, zero: Any, cx: bool,
    buf: Any, cbuf: Any, s: int, w: int, r: int, m: int, G: Any,
) -> None:  # fmt: skip
    """G (w, w) ← V_pᴴ V_p for V_p = buf[:w, s:s + r]ᵀ: its upper triangle by ``?herk`` for
    complex (half the flops), all of it by ``?gemm`` for real, where ``?syrk`` was slower
    (``benchmarks/results/tuning.md``). Only the strict upper triangle is read."""
    if cx:
        rk(_ROW, _UPPER, _NO, w, r, rone, _at(cbuf, s), m, rzero, _at(G, 0), w)
    else:
        gemm(_ROW, _NO, _TRANS, w, w, r, one, _at(cbuf, s), m, _at(buf, s), m, zero, _at(G, 0), w)


@njit(_sigs("ormqr"))
def ormqr_panels(
    gemm: Any, rk: Any, rone: Any, rzero: Any,
    at: Any, tau: Any, y: Any, nb: int, adjoint: bool, cx: bool, one: Any, mone: Any, zero: Any,
    buf: Any, cbuf: Any, G: Any, T: Any, W1: Any, W2: Any,
) -> None:  # fmt: skip
    """y ← Q y (``adjoint``: Qᴴ y) in place, Q = H(1)…H(k) of aᵀ (n, m) and τ (k,), for y
    (m, B) C-contiguous: ``?ormqr`` with panels of ``nb``, the last panel first (Qᴴ: the
    first first, with T_pᴴ). Per panel, on rows s:m only: W₁ = V_pᴴ y[s:], W₂ = T_p W₁,
    y[s:] −= V_p W₂ — 4·w·B·(m − s) + 2·w²·B flops after the Gram's 2·w²·(m − s).
    Workspace (C-contiguous, of y's dtype): ``buf``, ``cbuf`` (nb, m) (``cbuf`` is ``buf``
    for real dtypes), G and T (≥ nb²), W1 and W2 (≥ nb·B)."""
    m, k, B = at.shape[1], tau.shape[0], y.shape[1]
    t_op = (_CONJ_TRANS if cx else _TRANS) if adjoint else _NO
    P = (k + nb - 1) // nb
    for q in range(P):
        p = q if adjoint else P - 1 - q
        s = p * nb
        e = min(s + nb, k)
        w, r = e - s, m - s
        panel_rows(at, tau, s, e, buf, cbuf, cx)
        _gram(gemm, rk, rone, rzero, one, zero, cx, buf, cbuf, s, w, r, m, G)
        larft_one(G[: w * w].reshape((w, w)), tau[s:e], T[: w * w].reshape((w, w)))
        gemm(_ROW, _NO, _NO, w, B, r, one, _at(cbuf, s), m, _at(y, s * B), B, zero, _at(W1, 0), B)
        gemm(_ROW, t_op, _NO, w, B, w, one, _at(T, 0), w, _at(W1, 0), B, zero, _at(W2, 0), B)
        gemm(_ROW, _TRANS, _NO, r, B, w, mone, _at(buf, s), m, _at(W2, 0), B, one, _at(y, s * B), B)


@njit(inline="always")
def _unit_tail(Q: Any, k: int) -> None:
    """Q[i, i] = 1 for the columns k ≤ i < min(m, n) no reflector touches."""
    m, n = Q.shape
    for i in range(k, min(m, n)):
        Q[i, i] = 1


@njit(inline="always")
def _orgqr_panel(
    gemm: Any, rk: Any, rone: Any, rzero: Any,
    tau: Any, Q: Any, s: int, e: int, cx: bool, one: Any, mone: Any, zero: Any,
    buf: Any, cbuf: Any, G: Any, T: Any, W1: Any, W2: Any,
) -> None:  # fmt: skip
    """Panel [s, e) of :func:`orgqr_panels`, its V_p in ``buf[:e − s, s:]`` (``cbuf``)."""
    m, n = Q.shape
    w, r, c = e - s, m - s, n - s
    _gram(gemm, rk, rone, rzero, one, zero, cx, buf, cbuf, s, w, r, m, G)
    larft_one(G[: w * w].reshape((w, w)), tau[s:e], T[: w * w].reshape((w, w)))
    for j in range(w):  # W₁ (w, c): [V_p[:w]ᴴ, V_p[w:]ᴴ Q[e:, e:]]
        for i in range(w):
            W1[j * c + i] = cbuf[j, s + i]
    if n > e:
        gemm(_ROW, _NO, _NO, w, n - e, m - e, one, _at(cbuf, e), m, _at(Q, e * n + e), n,
             zero, _at(W1, w), c)  # fmt: skip
    gemm(_ROW, _NO, _NO, w, c, w, one, _at(T, 0), w, _at(W1, 0), c, zero, _at(W2, 0), c)
    for i in range(s, e):
        Q[i, i] = 1
    gemm(_ROW, _TRANS, _NO, r, c, w, mone, _at(buf, s), m, _at(W2, 0), c, one,
         _at(Q, s * n + s), n)  # fmt: skip


@njit(inline="always")
def _panel_from_rows(V: Any, tau: Any, s: int, e: int, out: Any, work: Any) -> bool:
    """Panel [s, e) of real lower-trapezoidal V (m, k) as :func:`panel_rows` lays out
    LAPACK's: out[j, s:] ← v_c[s:]/v_cc for c = s + j (zeros above the diagonal, 1 on it; all
    zeros for a zero column, τ_c = 0), τ_c = 2 v_cc²/‖v_c‖². V is read in tiles of 16 rows
    (a tile's columns stay in cache while each row of ``out`` is written in order), each
    tile's partial sum, in row order, added to the column's running sum.
    False where a column's ‖v_c‖² is NaN, Inf, overflows or underflows, or v_cc² <
    1e-16·‖v_c‖² (``work`` ≥ 2·(e − s) scratch)."""
    m = V.shape[0]
    w = e - s
    inv, ss = work[:w], work[w : 2 * w]
    for j in range(w):
        c = s + j
        inv[j] = 1.0 / V[c, c] if V[c, c] != 0 else 0.0
        ss[j] = 0.0
        out[j, s:c] = 0
    for i0 in range(s - s % PANEL_COPY_ROWS, m, PANEL_COPY_ROWS):
        i1 = min(i0 + PANEL_COPY_ROWS, m)
        for j in range(min(w, i1 - s)):  # the columns c = s + j < i1
            c = s + j
            part, f = 0.0, inv[j]
            row = out[j]
            for i in range(max(i0, c), i1):
                x = V[i, c]
                part += x * x
                row[i] = x * f
            ss[j] += part
    for j in range(w):
        c = s + j
        d2 = V[c, c] * V[c, c]
        out[j, c] = 1
        if ss[j] == 0:
            tau[c] = 0.0
            out[j, s:] = 0
        elif not (2.2250738585072014e-308 < ss[j] <= 1.7976931348623157e308):
            return False
        elif d2 < 1e-16 * ss[j]:
            return False
        else:
            tau[c] = 2.0 * d2 / ss[j]
    return True


@njit(_sigs("orgqr"))
def orgqr_panels(
    gemm: Any, rk: Any, rone: Any, rzero: Any,
    at: Any, tau: Any, Q: Any, nb: int, cx: bool, one: Any, mone: Any, zero: Any,
    buf: Any, cbuf: Any, G: Any, T: Any, W1: Any, W2: Any,
) -> None:  # fmt: skip
    """Q (m, n) ← the first n columns of H(1)…H(k) of aᵀ and τ (k,), k ≤ n ≤ m, for a
    zero-filled C-contiguous Q: ``?orgqr``, the last panel first, from the identity. Before
    panel [s, e) Q[s:, s:] is [[I, 0], [0, Q[e:, e:]]], so W = T_p [V_p[:w]ᴴ, V_p[w:]ᴴ Q[e:, e:]]
    needs one GEMM on the trailing block (and one with T_p), and Q[s:, s:] −= V_p W one more
    after Q[s:e, s:e] = I: 4·m·n·k − 2·(m + n)·k² + 4k³/3 flops as ``?orgqr``, plus
    2·w²·(n − s) a panel for T_p W. Workspace as :func:`ormqr_panels`', W1 and W2
    ≥ nb·n."""
    k = tau.shape[0]
    _unit_tail(Q, k)
    for p in range((k + nb - 1) // nb - 1, -1, -1):
        s, e = p * nb, min(p * nb + nb, k)
        panel_rows(at, tau, s, e, buf, cbuf, cx)
        _orgqr_panel(gemm, rk, rone, rzero, tau, Q, s, e, cx, one, mone, zero,
                     buf, cbuf, G, T, W1, W2)  # fmt: skip


@njit(_sigs("rows"))
def orgqr_rows(
    gemm: Any, rk: Any, rone: Any, rzero: Any,
    V: Any, tau: Any, Q: Any, nb: int, one: Any, mone: Any, zero: Any,
    buf: Any, cbuf: Any, G: Any, T: Any, W1: Any, W2: Any,
) -> bool:  # fmt: skip
    """:func:`orgqr_panels` straight from lower-trapezoidal real V (m, k) in C order (a
    ``cwy`` operator's reflectors), without LAPACK's aᵀ: each panel's columns are copied out
    of V's rows, divided by their diagonal entry (H(αv) = H(v)), and their τⱼ = 2 v_jj²/‖vⱼ‖²
    written to ``tau`` (k,) on the way (:func:`_panel_from_rows`). Returns False, Q
    unfinished, where a column cannot be scaled so (the caller then forms Q otherwise)."""
    k = tau.shape[0]
    _unit_tail(Q, k)
    for p in range((k + nb - 1) // nb - 1, -1, -1):
        s, e = p * nb, min(p * nb + nb, k)
        if not _panel_from_rows(V, tau, s, e, buf, W1):
            return False
        _orgqr_panel(gemm, rk, rone, rzero, tau, Q, s, e, False, one, mone, zero,
                     buf, cbuf, G, T, W1, W2)  # fmt: skip
    return True
