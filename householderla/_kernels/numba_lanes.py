"""Many tiny Householder products at once: eight matrices in the SIMD lanes (NumPy, CPU).

A tile of ``LANES`` = 8 matrices is transposed into (N, ·, 8) scratch so that matrix l is lane l
of every number; each reflection acts on two columns of all eight at once, fused with the next
dot product, sums in registers, compiled with LLVM's SLP vectoriser
(:func:`~householderla._kernels.numba_simd.slp_njit`). Tiles go out by 8 × 8 register transposes,
non-temporally from ``NT_MIN_BYTES``; scratch rows hold an odd number of 64-byte lanes. Numerics
are the column-block kernel's, bit for bit (input dtype, running sums in row order, no
``fastmath``); ‖v‖² outside the safe range returns −1, non-finite columns give τ = NaN.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._lib.tuning import FUSE_MIN_N, NT_MIN_BYTES
from .numba_loops import HAVE_NUMBA, njit
from .numba_simd import (
    LANES,
    address,
    operands_in,
    slp_njit,
    store_fence,
    tile_in,
    tile_in_columns,
    tile_out,
)

__all__ = ["LANES", "apply_lanes"]

#: A hash of the sibling kernel modules this one imports: Numba's on-disk cache keys a
#: compiled function on its own file only, so changing this line when one of them changes
#: makes the cache recompile (tests/test_numba_kernels.py checks it).
KERNEL_DEPS = "f37c83a0d185e148"


def _sigs() -> Any:
    if not HAVE_NUMBA:
        return None
    from numba import types as nt

    out = []
    for f in (nt.float32, nt.float64):
        ro3, rw3 = nt.Array(f, 3, "C", readonly=True), nt.Array(f, 3, "C")
        ro2, b = nt.Array(f, 2, "C", readonly=True), nt.boolean
        out.append(nt.int64(ro3, ro3, rw3, b, b, b, nt.int64, ro2, b, b))
    return out


# Eight lanes written out: lane l of a tuple is matrix l of the tile. Row indices are unsigned
# (no negative-index wraparound code, as in numba_columns).


@njit(inline="always")
def _dot2(Vt: Any, k: int, Yt: Any, j: int, lo: int, hi: int) -> Any:
    """(γ_j, γ_{j+1}) = v_kᵀ y_j, v_kᵀ y_{j+1} over rows lo…hi−1, per lane."""
    z = Yt.dtype.type(0)
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = z
    b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = z
    for i in range(np.uint64(lo), np.uint64(hi)):
        v0, v1, v2, v3 = Vt[i, k, 0], Vt[i, k, 1], Vt[i, k, 2], Vt[i, k, 3]
        v4, v5, v6, v7 = Vt[i, k, 4], Vt[i, k, 5], Vt[i, k, 6], Vt[i, k, 7]
        a0 += v0 * Yt[i, j, 0]
        a1 += v1 * Yt[i, j, 1]
        a2 += v2 * Yt[i, j, 2]
        a3 += v3 * Yt[i, j, 3]
        a4 += v4 * Yt[i, j, 4]
        a5 += v5 * Yt[i, j, 5]
        a6 += v6 * Yt[i, j, 6]
        a7 += v7 * Yt[i, j, 7]
        b0 += v0 * Yt[i, j + 1, 0]
        b1 += v1 * Yt[i, j + 1, 1]
        b2 += v2 * Yt[i, j + 1, 2]
        b3 += v3 * Yt[i, j + 1, 3]
        b4 += v4 * Yt[i, j + 1, 4]
        b5 += v5 * Yt[i, j + 1, 5]
        b6 += v6 * Yt[i, j + 1, 6]
        b7 += v7 * Yt[i, j + 1, 7]
    return (a0, a1, a2, a3, a4, a5, a6, a7), (b0, b1, b2, b3, b4, b5, b6, b7)


@njit(inline="always")
def _dot1(Vt: Any, k: int, Yt: Any, j: int, lo: int, hi: int) -> Any:
    """γ_j = v_kᵀ y_j over rows lo…hi−1, per lane."""
    z = Yt.dtype.type(0)
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = z
    for i in range(np.uint64(lo), np.uint64(hi)):
        a0 += Vt[i, k, 0] * Yt[i, j, 0]
        a1 += Vt[i, k, 1] * Yt[i, j, 1]
        a2 += Vt[i, k, 2] * Yt[i, j, 2]
        a3 += Vt[i, k, 3] * Yt[i, j, 3]
        a4 += Vt[i, k, 4] * Yt[i, j, 4]
        a5 += Vt[i, k, 5] * Yt[i, j, 5]
        a6 += Vt[i, k, 6] * Yt[i, j, 6]
        a7 += Vt[i, k, 7] * Yt[i, j, 7]
    return a0, a1, a2, a3, a4, a5, a6, a7


@njit(inline="always")
def _scaled(tt: Any, k: int, a: Any) -> Any:
    """c = τ_k·γ per lane."""
    return (
        tt[k, 0] * a[0],
        tt[k, 1] * a[1],
        tt[k, 2] * a[2],
        tt[k, 3] * a[3],
        tt[k, 4] * a[4],
        tt[k, 5] * a[5],
        tt[k, 6] * a[6],
        tt[k, 7] * a[7],
    )


@njit(inline="always")
def _axpy2(Vt: Any, k: int, Yt: Any, j: int, lo: int, hi: int, c: Any, d: Any) -> None:
    """y_j −= c v_k and y_{j+1} −= d v_k over rows lo…hi−1, per lane."""
    c0, c1, c2, c3, c4, c5, c6, c7 = c
    d0, d1, d2, d3, d4, d5, d6, d7 = d
    for i in range(np.uint64(lo), np.uint64(hi)):
        v0, v1, v2, v3 = Vt[i, k, 0], Vt[i, k, 1], Vt[i, k, 2], Vt[i, k, 3]
        v4, v5, v6, v7 = Vt[i, k, 4], Vt[i, k, 5], Vt[i, k, 6], Vt[i, k, 7]
        Yt[i, j, 0] -= c0 * v0
        Yt[i, j, 1] -= c1 * v1
        Yt[i, j, 2] -= c2 * v2
        Yt[i, j, 3] -= c3 * v3
        Yt[i, j, 4] -= c4 * v4
        Yt[i, j, 5] -= c5 * v5
        Yt[i, j, 6] -= c6 * v6
        Yt[i, j, 7] -= c7 * v7
        Yt[i, j + 1, 0] -= d0 * v0
        Yt[i, j + 1, 1] -= d1 * v1
        Yt[i, j + 1, 2] -= d2 * v2
        Yt[i, j + 1, 3] -= d3 * v3
        Yt[i, j + 1, 4] -= d4 * v4
        Yt[i, j + 1, 5] -= d5 * v5
        Yt[i, j + 1, 6] -= d6 * v6
        Yt[i, j + 1, 7] -= d7 * v7


@njit(inline="always")
def _axpy1(Vt: Any, k: int, Yt: Any, j: int, lo: int, hi: int, c: Any) -> None:
    """y_j −= c v_k over rows lo…hi−1, per lane."""
    c0, c1, c2, c3, c4, c5, c6, c7 = c
    for i in range(np.uint64(lo), np.uint64(hi)):  # (as _axpy2: then SLP packs it)
        v0, v1, v2, v3 = Vt[i, k, 0], Vt[i, k, 1], Vt[i, k, 2], Vt[i, k, 3]
        v4, v5, v6, v7 = Vt[i, k, 4], Vt[i, k, 5], Vt[i, k, 6], Vt[i, k, 7]
        Yt[i, j, 0] -= c0 * v0
        Yt[i, j, 1] -= c1 * v1
        Yt[i, j, 2] -= c2 * v2
        Yt[i, j, 3] -= c3 * v3
        Yt[i, j, 4] -= c4 * v4
        Yt[i, j, 5] -= c5 * v5
        Yt[i, j, 6] -= c6 * v6
        Yt[i, j, 7] -= c7 * v7


@njit(inline="always")
def _axpy_dot2(
    Vt: Any, k: int, kn: int, Yt: Any, j: int, lo: int, hi: int, c: Any, d: Any, a: Any, b: Any
) -> Any:
    """:func:`_axpy2` for reflection k, then the sums a, b of :func:`_dot2` for kn continued
    on the updated rows lo…hi−1, in one pass (Y loaded once)."""
    c0, c1, c2, c3, c4, c5, c6, c7 = c
    d0, d1, d2, d3, d4, d5, d6, d7 = d
    a0, a1, a2, a3, a4, a5, a6, a7 = a
    b0, b1, b2, b3, b4, b5, b6, b7 = b
    for i in range(np.uint64(lo), np.uint64(hi)):
        v0, v1, v2, v3 = Vt[i, k, 0], Vt[i, k, 1], Vt[i, k, 2], Vt[i, k, 3]
        v4, v5, v6, v7 = Vt[i, k, 4], Vt[i, k, 5], Vt[i, k, 6], Vt[i, k, 7]
        u0, u1, u2, u3 = Vt[i, kn, 0], Vt[i, kn, 1], Vt[i, kn, 2], Vt[i, kn, 3]
        u4, u5, u6, u7 = Vt[i, kn, 4], Vt[i, kn, 5], Vt[i, kn, 6], Vt[i, kn, 7]
        y0 = Yt[i, j, 0] - c0 * v0
        y1 = Yt[i, j, 1] - c1 * v1
        y2 = Yt[i, j, 2] - c2 * v2
        y3 = Yt[i, j, 3] - c3 * v3
        y4 = Yt[i, j, 4] - c4 * v4
        y5 = Yt[i, j, 5] - c5 * v5
        y6 = Yt[i, j, 6] - c6 * v6
        y7 = Yt[i, j, 7] - c7 * v7
        x0 = Yt[i, j + 1, 0] - d0 * v0
        x1 = Yt[i, j + 1, 1] - d1 * v1
        x2 = Yt[i, j + 1, 2] - d2 * v2
        x3 = Yt[i, j + 1, 3] - d3 * v3
        x4 = Yt[i, j + 1, 4] - d4 * v4
        x5 = Yt[i, j + 1, 5] - d5 * v5
        x6 = Yt[i, j + 1, 6] - d6 * v6
        x7 = Yt[i, j + 1, 7] - d7 * v7
        Yt[i, j, 0] = y0
        Yt[i, j, 1] = y1
        Yt[i, j, 2] = y2
        Yt[i, j, 3] = y3
        Yt[i, j, 4] = y4
        Yt[i, j, 5] = y5
        Yt[i, j, 6] = y6
        Yt[i, j, 7] = y7
        Yt[i, j + 1, 0] = x0
        Yt[i, j + 1, 1] = x1
        Yt[i, j + 1, 2] = x2
        Yt[i, j + 1, 3] = x3
        Yt[i, j + 1, 4] = x4
        Yt[i, j + 1, 5] = x5
        Yt[i, j + 1, 6] = x6
        Yt[i, j + 1, 7] = x7
        a0 += u0 * y0
        a1 += u1 * y1
        a2 += u2 * y2
        a3 += u3 * y3
        a4 += u4 * y4
        a5 += u5 * y5
        a6 += u6 * y6
        a7 += u7 * y7
        b0 += u0 * x0
        b1 += u1 * x1
        b2 += u2 * x2
        b3 += u3 * x3
        b4 += u4 * x4
        b5 += u5 * x5
        b6 += u6 * x6
        b7 += u7 * x7
    return (a0, a1, a2, a3, a4, a5, a6, a7), (b0, b1, b2, b3, b4, b5, b6, b7)


@njit(inline="always")
def _sweep2(Vt: Any, tt: Any, Yt: Any, j: int, k: int, nref: int, step: int, trap: bool) -> None:
    """Columns j, j+1 ← H(v_k) H(v_{k+step}) … applied last-first: nref reflections from k
    by ``step`` (±1), each update fused with the next reflection's dot product
    (:func:`_axpy_dot2`). ``trap``: reflection k reads and writes rows ≥ k only."""
    N = Yt.shape[0]
    s = k if trap else 0
    a, b = _dot2(Vt, k, Yt, j, s, N)
    c, d = _scaled(tt, k, a), _scaled(tt, k, b)
    for _ in range(nref - 1):
        kn = k + step
        sn = kn if trap else 0
        a, b = _dot2(Vt, kn, Yt, j, sn, s)  # rows only the next dot reads
        _axpy2(Vt, k, Yt, j, s, sn, c, d)  # rows only this update writes
        a, b = _axpy_dot2(Vt, k, kn, Yt, j, max(s, sn), N, c, d, a, b)
        c, d = _scaled(tt, kn, a), _scaled(tt, kn, b)
        k, s = kn, sn
    _axpy2(Vt, k, Yt, j, s, N, c, d)


@njit(inline="always")
def _sweep1(Vt: Any, tt: Any, Yt: Any, j: int, k: int, nref: int, step: int, trap: bool) -> None:
    """:func:`_sweep2` on column j alone, unfused (an odd column or reflection)."""
    for q in range(nref):
        kq = k + q * step
        r0 = kq if trap else 0
        c = _scaled(tt, kq, _dot1(Vt, kq, Yt, j, r0, Yt.shape[0]))
        _axpy1(Vt, kq, Yt, j, r0, Yt.shape[0], c)


@njit(inline="always")
def _lane_tau(Vt: Any, k: int, w: int, lo_row: int, ss: Any, lo: float, hi: float, tt: Any) -> int:
    """τ_k of lane w from its ‖v_k‖² = ``ss``: 0 (set), 1 (non-finite: τ = NaN) or −1 (a
    nonzero ‖v‖² outside [lo, hi]: rescale first, exact since H(cv) = H(v)); zero: τ = 0.
    The rule of :func:`householderla._kernels.numba_columns._taus`, written again on the lane
    layout: one helper shared by both, taking a column view, cost this kernel 10–15% at
    N = 3…16 (measured side by side)."""
    if lo <= ss <= hi:
        tt[k, w] = Vt.dtype.type(2) / ss
        return 0
    finite = True
    nonzero = False
    for i in range(lo_row, Vt.shape[0]):
        a = abs(np.float64(Vt[i, k, w]))
        if not (a <= 1.7976931348623157e308):  # NaN or Inf
            finite = False
        elif a > 0.0:
            nonzero = True
    if not finite:
        tt[k, w] = np.nan
        return 1
    if nonzero:
        return -1
    tt[k, w] = 0  # H(0) = I
    return 0


@njit(inline="always")
def _taus(Vt: Any, L: int, trap: bool, lo: float, hi: float, tt: Any) -> int:
    """τ[k, lane] = 2/‖v_k‖² (one running sum over the rows; rows < k skipped with
    ``trap``). Returns −1 if some column must be rescaled, else the non-finite count."""
    bad = 0
    for k in range(L):
        r0 = k if trap else 0
        s = _dot1(Vt, k, Vt, k, r0, Vt.shape[0])
        ok = (lo <= s[0] <= hi) & (lo <= s[1] <= hi) & (lo <= s[2] <= hi) & (lo <= s[3] <= hi)
        ok &= (lo <= s[4] <= hi) & (lo <= s[5] <= hi) & (lo <= s[6] <= hi) & (lo <= s[7] <= hi)
        if ok:  # all eight lanes in range: one vector division
            two = Vt.dtype.type(2)
            tt[k, 0], tt[k, 1], tt[k, 2], tt[k, 3] = two / s[0], two / s[1], two / s[2], two / s[3]
            tt[k, 4], tt[k, 5], tt[k, 6], tt[k, 7] = two / s[4], two / s[5], two / s[6], two / s[7]
            continue
        for w in range(LANES):
            status = _lane_tau(Vt, k, w, r0, s[w], lo, hi, tt)
            if status < 0:
                return -1
            bad += status
    return bad


@slp_njit(_sigs())
def apply_lanes(
    V: Any,
    H: Any,
    Y: Any,
    trap: bool,
    identity: bool,
    transpose: bool,
    safe_exp: int,
    tau_in: Any,
    unit: bool,
    columns: bool,
) -> int:
    """Y[p] ← H(v₁)…H(v_L) X[p] for every p (H(v_L)…H(v₁) with ``transpose``), X = [I; 0]
    (``identity``) or H[p] (H[0] for a shared operand); the interface of
    :func:`householderla._kernels.numba_columns.apply_columns` (plus ``columns``), and its bits.

    V (P, N, L) and H (Ph, N, C) read-only, Y (P, N, C) written. Returns −1 (Y incomplete)
    if a column of V must be rescaled first, else the number of non-finite columns.
    Forming from [I; 0] with ``trap`` skips the columns < k (still e_j when H(v_k) comes):
    LAPACK orgqr's 4N³/3 flops for L = N. ``unit``: V is LAPACK's ``a`` (P, N, ≥ L) with
    τ ``tau_in`` (P, L), read as ``?orgqr`` reads it
    (:func:`~householderla._kernels.numba_checks.unit_reflectors`; ``trap`` True).
    ``columns``: V is given transposed, (P, L, N) C-contiguous ((P, n, N) with ``unit``: a
    column-major ``a`` read in place, :func:`~householderla._kernels.numba_simd.tile_in_columns`);
    the same bits."""
    P = V.shape[0]
    N, L = (V.shape[2], V.shape[1]) if columns else (V.shape[1], V.shape[2])
    if unit:
        L = tau_in.shape[1]
    C = Y.shape[2]
    Ph = H.shape[0]
    dt = V.dtype
    lo = math.ldexp(1.0, -safe_exp)
    hi = math.ldexp(1.0, safe_exp)
    # rows of an odd number of 64-byte lanes: a walk down a column meets every L1 set (an
    # even count, e.g. 32 or 64 columns, maps a column to 2 or 1 of the 64 sets: forming
    # 1024 matrices of 64 × 64 took over four times as long)
    Ls = L | 1
    Vt = np.zeros((N, Ls, LANES), dt)  # (trap: the entries above row k stay 0)
    Cs = C | 1
    Yt = np.empty((N, Cs, LANES), dt)
    tt = np.empty((max(L, 1), LANES), dt)
    skip = trap and identity and not transpose
    # an output beyond a quarter of the last-level cache, aligned to the vector: its full
    # 8 × 8 blocks bypass the caches (no write-allocate read of Y)
    vec = LANES * Y.itemsize
    nt = Y.size * Y.itemsize >= NT_MIN_BYTES and C % LANES == 0 and address(Y) % vec == 0
    bad = 0
    for p0 in range(0, P, LANES):
        wn = min(LANES, P - p0)
        if wn == LANES and columns:  # each column's rows in 8 × 8 blocks
            tile_in_columns(V, p0, L, trap, unit, tau_in, Vt, Ls)
        elif wn == LANES:  # full 8 × 8 blocks transposed in registers, then the rest
            tile_in(V, p0, L, trap, unit, tau_in, Vt, Ls)
        else:
            for w in range(LANES):
                for i in range(N):
                    for k in range(min(i + 1, L) if trap else L):
                        x = dt.type(0)
                        if w < wn:
                            x = V[p0 + w, k, i] if columns else V[p0 + w, i, k]
                        if unit and w < wn:  # the unit diagonal; τ = 0: H = I
                            x = (x if i > k else 1) if tau_in[p0 + w, k] != 0 else 0
                        Vt[i, k, w] = x
        status = _taus(Vt, L, trap, lo, hi, tt)
        if status < 0:
            return -1
        bad += status
        if identity:
            for i in range(N):
                for j in range(C):
                    e = dt.type(1) if i == j else dt.type(0)
                    for w in range(LANES):
                        Yt[i, j, w] = e
        elif wn == LANES and Ph > 1:  # the operands' 8 × 8 blocks transposed in registers
            operands_in(H, p0, Yt, Cs)
        else:
            for w in range(LANES):
                for i in range(N):
                    for j in range(C):
                        Yt[i, j, w] = H[p0 + w if Ph > 1 else 0, i, j] if w < wn else 0
        for idx in range(L if N < FUSE_MIN_N else 0):  # reflections outer
            k = idx if transpose else L - 1 - idx
            r0 = k if trap else 0
            j = min(k, C) if skip else 0
            while j + 2 <= C:
                a, b = _dot2(Vt, k, Yt, j, r0, N)
                _axpy2(Vt, k, Yt, j, r0, N, _scaled(tt, k, a), _scaled(tt, k, b))
                j += 2
            if j < C:
                _axpy1(Vt, k, Yt, j, r0, N, _scaled(tt, k, _dot1(Vt, k, Yt, j, r0, N)))
        # or column pairs outer, each update fused with the next reflection's dot (each
        # column's reflections in the product's order; the columns are independent):
        # ``skip`` gives column j the reflections k ≤ j only
        for j in range(0, C if L > 0 and N >= FUSE_MIN_N else 0, 2):
            pair = j + 1 < C
            if transpose:
                k, nref, step = 0, L, 1
            elif skip:
                k = min(j, L - 1)
                if pair and j + 1 <= L - 1:  # reflection j + 1 touches column j + 1 alone
                    _sweep1(Vt, tt, Yt, j + 1, j + 1, 1, -1, trap)
                nref, step = k + 1, -1
            else:
                k, nref, step = L - 1, L, -1
            if pair:
                _sweep2(Vt, tt, Yt, j, k, nref, step, trap)
            else:
                _sweep1(Vt, tt, Yt, j, k, nref, step, trap)
        if wn == LANES:  # 8 × 8 blocks transposed in registers (past the caches with nt)
            tile_out(Yt, Y, p0, Cs, nt)
        else:
            for w in range(wn):
                for i in range(N):
                    for j in range(C):
                        Y[p0 + w, i, j] = Yt[i, j, w]
    if nt:
        store_fence()
    return bad
