"""Many small Householder products at once: eight columns per pass, sums in registers (NumPy, CPU).

For P matrices of N ≲ 64, each with its own V, every matrix's output columns are swept in blocks
of eight: γ_j = v_kᵀy_j, y_j ← y_j − (τ_kγ_j)v_k (Mhammedi et al., ICML 2017, Algorithm 1), the
update fused with the next dot products; rows and reflections that cannot touch a block are
skipped (orgqr's 4N³/3 flops for L = N). From ``WIDE_MIN_C`` columns one vectorised sweep over all
of them (:func:`_sweep_wide`). The SIMD lanes (:mod:`~.numba_lanes`) give the same bits faster;
this is their reference and fallback. Numerics: input dtype, one running sum per dot product in
row order, so results do not depend on the batch; ‖v‖² outside the safe range returns −1 (the
caller rescales), non-finite columns give τ = NaN.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._lib.tuning import WIDE_MIN_C, WIDE_MIN_C_FORM
from .numba_checks import unit_reflectors
from .numba_loops import HAVE_NUMBA, njit

__all__ = ["WIDE_MIN_C", "WIDE_MIN_C_FORM", "apply_columns"]

#: A hash of the sibling kernel modules this one imports: Numba's on-disk cache keys a
#: compiled function on its own file only, so changing this line when one of them changes
#: makes the cache recompile (tests/test_numba_kernels.py checks it).
KERNEL_DEPS = "1aec937d7d385737"


def _sigs(kind: str) -> Any:
    """Explicit signatures (float32, float64): one compiled version of each function, where
    literal arguments (a column offset of 0, a step of −1) would each make another."""
    if not HAVE_NUMBA:
        return None
    from numba import types as nt

    i, b = nt.int64, nt.boolean
    out = []
    for f in (nt.float32, nt.float64):
        ro2, rw2, rw1 = nt.Array(f, 2, "C", readonly=True), nt.Array(f, 2, "C"), nt.Array(f, 1, "C")
        ro3, rw3 = nt.Array(f, 3, "C", readonly=True), nt.Array(f, 3, "C")
        out.append(
            {
                "wide": nt.none(ro2, rw1, rw2, i, i, i, b, b, rw1, rw1),
                "taus": i(ro2, b, nt.float64, nt.float64, rw1, rw1),
                "entry": i(ro3, ro3, rw3, b, b, b, i, ro2, b),
            }[kind]
        )
    return out


# Each helper below works on one block of 8 (or 4) columns of Y starting at column j, rows
# lo…hi−1. Row indices are unsigned, so Numba emits no negative-index wraparound: the loops
# are then plain pointer walks (1.3× faster at N = 64).


@njit(inline="always")
def _dot8(V: Any, kn: int, Y: Any, j: int, lo: int, hi: int, s: Any) -> Any:
    """s + V[lo:hi, kn]ᵀ Y[lo:hi, j:j+8] (eight running sums)."""
    s0, s1, s2, s3, s4, s5, s6, s7 = s
    for i in range(np.uint64(lo), np.uint64(hi)):
        v = V[i, kn]
        s0 += v * Y[i, j]
        s1 += v * Y[i, j + 1]
        s2 += v * Y[i, j + 2]
        s3 += v * Y[i, j + 3]
        s4 += v * Y[i, j + 4]
        s5 += v * Y[i, j + 5]
        s6 += v * Y[i, j + 6]
        s7 += v * Y[i, j + 7]
    return s0, s1, s2, s3, s4, s5, s6, s7


@njit(inline="always")
def _axpy8(V: Any, k: int, Y: Any, j: int, lo: int, hi: int, c: Any) -> None:
    """Y[lo:hi, j:j+8] −= V[lo:hi, k] cᵀ."""
    c0, c1, c2, c3, c4, c5, c6, c7 = c
    for i in range(np.uint64(lo), np.uint64(hi)):
        v = V[i, k]
        Y[i, j] -= c0 * v
        Y[i, j + 1] -= c1 * v
        Y[i, j + 2] -= c2 * v
        Y[i, j + 3] -= c3 * v
        Y[i, j + 4] -= c4 * v
        Y[i, j + 5] -= c5 * v
        Y[i, j + 6] -= c6 * v
        Y[i, j + 7] -= c7 * v


@njit(inline="always")
def _axpy_dot8(V: Any, k: int, kn: int, Y: Any, j: int, lo: int, hi: int, c: Any, s: Any) -> Any:
    """:func:`_axpy8` for reflection k, then :func:`_dot8` for kn on the updated rows, one pass."""
    c0, c1, c2, c3, c4, c5, c6, c7 = c
    s0, s1, s2, s3, s4, s5, s6, s7 = s
    for i in range(np.uint64(lo), np.uint64(hi)):
        v = V[i, k]
        w = V[i, kn]
        y0 = Y[i, j] - c0 * v
        y1 = Y[i, j + 1] - c1 * v
        y2 = Y[i, j + 2] - c2 * v
        y3 = Y[i, j + 3] - c3 * v
        y4 = Y[i, j + 4] - c4 * v
        y5 = Y[i, j + 5] - c5 * v
        y6 = Y[i, j + 6] - c6 * v
        y7 = Y[i, j + 7] - c7 * v
        Y[i, j] = y0
        Y[i, j + 1] = y1
        Y[i, j + 2] = y2
        Y[i, j + 3] = y3
        Y[i, j + 4] = y4
        Y[i, j + 5] = y5
        Y[i, j + 6] = y6
        Y[i, j + 7] = y7
        s0 += w * y0
        s1 += w * y1
        s2 += w * y2
        s3 += w * y3
        s4 += w * y4
        s5 += w * y5
        s6 += w * y6
        s7 += w * y7
    return s0, s1, s2, s3, s4, s5, s6, s7


@njit(inline="always")
def _dot4(V: Any, kn: int, Y: Any, j: int, lo: int, hi: int, s: Any) -> Any:
    s0, s1, s2, s3 = s
    for i in range(np.uint64(lo), np.uint64(hi)):
        v = V[i, kn]
        s0 += v * Y[i, j]
        s1 += v * Y[i, j + 1]
        s2 += v * Y[i, j + 2]
        s3 += v * Y[i, j + 3]
    return s0, s1, s2, s3


@njit(inline="always")
def _axpy4(V: Any, k: int, Y: Any, j: int, lo: int, hi: int, c: Any) -> None:
    c0, c1, c2, c3 = c
    for i in range(np.uint64(lo), np.uint64(hi)):
        v = V[i, k]
        Y[i, j] -= c0 * v
        Y[i, j + 1] -= c1 * v
        Y[i, j + 2] -= c2 * v
        Y[i, j + 3] -= c3 * v


@njit(inline="always")
def _axpy_dot4(V: Any, k: int, kn: int, Y: Any, j: int, lo: int, hi: int, c: Any, s: Any) -> Any:
    c0, c1, c2, c3 = c
    s0, s1, s2, s3 = s
    for i in range(np.uint64(lo), np.uint64(hi)):
        v = V[i, k]
        w = V[i, kn]
        y0 = Y[i, j] - c0 * v
        y1 = Y[i, j + 1] - c1 * v
        y2 = Y[i, j + 2] - c2 * v
        y3 = Y[i, j + 3] - c3 * v
        Y[i, j] = y0
        Y[i, j + 1] = y1
        Y[i, j + 2] = y2
        Y[i, j + 3] = y3
        s0 += w * y0
        s1 += w * y1
        s2 += w * y2
        s3 += w * y3
    return s0, s1, s2, s3


@njit(inline="always")
def _scaled8(t: Any, s: Any) -> Any:
    return (t * s[0], t * s[1], t * s[2], t * s[3], t * s[4], t * s[5], t * s[6], t * s[7])


@njit(inline="always")
def _scaled4(t: Any, s: Any) -> Any:
    return (t * s[0], t * s[1], t * s[2], t * s[3])


@njit(inline="always")
def _sweep8(V: Any, tau: Any, Y: Any, j: int, k: int, nref: int, step: int, trap: bool) -> None:
    """Y[:, j:j+8] ← H(v_k) H(v_{k+step}) … applied last-first: nref reflections from k by
    ``step`` (±1). ``trap``: reflection k reads and writes rows ≥ k only."""
    N = Y.shape[0]
    z = Y.dtype.type(0)
    zero = (z, z, z, z, z, z, z, z)
    s = k if trap else 0
    c = _scaled8(tau[k], _dot8(V, k, Y, j, s, N, zero))
    for _ in range(nref - 1):
        kn = k + step
        sn = kn if trap else 0
        acc = _dot8(V, kn, Y, j, sn, s, zero)  # rows only the next dot reads
        _axpy8(V, k, Y, j, s, sn, c)  # rows only this update writes
        acc = _axpy_dot8(V, k, kn, Y, j, max(s, sn), N, c, acc)
        c = _scaled8(tau[kn], acc)
        k, s = kn, sn
    _axpy8(V, k, Y, j, s, N, c)


@njit(inline="always")
def _sweep4(V: Any, tau: Any, Y: Any, j: int, k: int, nref: int, step: int, trap: bool) -> None:
    """:func:`_sweep8` on four columns."""
    N = Y.shape[0]
    z = Y.dtype.type(0)
    zero = (z, z, z, z)
    s = k if trap else 0
    c = _scaled4(tau[k], _dot4(V, k, Y, j, s, N, zero))
    for _ in range(nref - 1):
        kn = k + step
        sn = kn if trap else 0
        acc = _dot4(V, kn, Y, j, sn, s, zero)
        _axpy4(V, k, Y, j, s, sn, c)
        acc = _axpy_dot4(V, k, kn, Y, j, max(s, sn), N, c, acc)
        c = _scaled4(tau[kn], acc)
        k, s = kn, sn
    _axpy4(V, k, Y, j, s, N, c)


@njit(_sigs("wide"))
def _sweep_wide(
    V: Any, tau: Any, Y: Any, k: int, nref: int, step: int, trap: bool, skip: bool, acc: Any, c: Any
) -> None:
    """:func:`_sweep8` on all columns of Y at once, the column loops innermost (they vectorise;
    sums in ``acc``, τγ in ``c``, each loaded and stored once per two rows): faster than the
    blocks from ``WIDE_MIN_C`` columns (``benchmarks/results/tuning.md``). The blocks'
    operations in their order: the same bits. ``skip``: columns < k are still e_j when
    reflection k comes (forming from [I; 0])."""
    N, C = Y.shape
    z = Y.dtype.type(0)
    s = k if trap else 0
    js = min(k, C) if skip else 0
    for q in range(np.uint64(js), np.uint64(C)):
        acc[q] = z
    for i in range(np.uint64(s), np.uint64(N)):
        w = V[i, k]
        for q in range(np.uint64(js), np.uint64(C)):
            acc[q] += w * Y[i, q]
    for q in range(np.uint64(js), np.uint64(C)):
        c[q] = tau[k] * acc[q]
    for _ in range(nref - 1):
        kn = k + step
        sn = kn if trap else 0
        jsn = min(kn, C) if skip else 0
        for q in range(np.uint64(jsn), np.uint64(C)):
            acc[q] = z
        for i in range(np.uint64(sn), np.uint64(s)):  # rows only the next dot reads
            w = V[i, kn]
            for q in range(np.uint64(jsn), np.uint64(C)):
                acc[q] += w * Y[i, q]
        for i in range(np.uint64(s), np.uint64(sn)):  # rows only this update writes
            v = V[i, k]
            for q in range(np.uint64(js), np.uint64(C)):
                Y[i, q] -= c[q] * v
        i0 = max(s, sn)
        for q in range(np.uint64(jsn), np.uint64(js)):  # columns only the next dot reads
            for i in range(np.uint64(i0), np.uint64(N)):
                acc[q] += V[i, kn] * Y[i, q]
        i = i0
        while i + 2 <= N:  # two rows per pass: acc and c loaded and stored once for both
            v, v1 = V[i, k], V[i + 1, k]
            w, w1 = V[i, kn], V[i + 1, kn]
            for q in range(np.uint64(js), np.uint64(C)):
                cq = c[q]
                y = Y[i, q] - cq * v
                y1 = Y[i + 1, q] - cq * v1
                Y[i, q] = y
                Y[i + 1, q] = y1
                acc[q] = (acc[q] + w * y) + w1 * y1
            i += 2
        if i < N:
            v = V[i, k]
            w = V[i, kn]
            for q in range(np.uint64(js), np.uint64(C)):
                y = Y[i, q] - c[q] * v
                Y[i, q] = y
                acc[q] += w * y
        for q in range(np.uint64(jsn), np.uint64(C)):
            c[q] = tau[kn] * acc[q]
        k, s, js = kn, sn, jsn
    for i in range(np.uint64(s), np.uint64(N)):
        v = V[i, k]
        for q in range(np.uint64(js), np.uint64(C)):
            Y[i, q] -= c[q] * v


@njit(_sigs("taus"))
def _taus(V: Any, trap: bool, lo: float, hi: float, tau: Any, acc: Any) -> int:
    """τ_k = 2/‖v_k‖² (running sums over the rows, vectorised over k; rows < k skipped with
    ``trap``); 0 for a zero column, NaN for a non-finite one. Returns −1 if some nonzero
    ‖v‖² is outside [lo, hi] (the caller rescales), else the number of non-finite columns."""
    n, L = V.shape
    acc[:L] = 0
    for i in range(n):
        for k in range(min(i + 1, L) if trap else L):
            x = V[i, k]
            acc[k] += x * x
    two = V.dtype.type(2)
    bad = 0
    for k in range(L):
        ss = acc[k]
        if lo <= ss <= hi:
            tau[k] = two / ss
            continue
        finite = True
        nonzero = False
        for i in range(k if trap else 0, n):
            a = abs(np.float64(V[i, k]))
            if not (a <= 1.7976931348623157e308):  # NaN or Inf
                finite = False
            elif a > 0.0:
                nonzero = True
        if not finite:
            tau[k] = np.nan
            bad += 1
        elif nonzero:  # ‖v‖² under- or overflows: rescale first (exact, H(cv) = H(v))
            return -1
        else:
            tau[k] = 0  # H(0) = I
    return bad


@njit(inline="always")
def _block(V: Any, tau: Any, Y: Any, j: int, w: int, last: int, skip: bool, trap: bool, tr: bool):
    """Columns j…j+w−1 (w = 8 or 4) of Y ← the product applied to them (``tr``: transposed
    order); ``skip``: Y started as [I; 0] and V is trapezoidal, so the reflections after
    ``last`` (the block's last column of the result) leave the block unchanged."""
    L = V.shape[1]
    if tr:
        k, nref, step = 0, L, 1
    elif skip:
        k = min(last, L - 1)
        if w == 8 and k > last - 4:  # reflections > last − 4 touch the last four columns only
            _sweep4(V, tau, Y, j + 4, k, k - last + 4, -1, trap)
            k = last - 4
        nref, step = k + 1, -1
    else:
        k, nref, step = L - 1, L, -1
    if w == 8 and nref > 0:
        _sweep8(V, tau, Y, j, k, nref, step, trap)
    elif nref > 0:
        _sweep4(V, tau, Y, j, k, nref, step, trap)


@njit(_sigs("entry"))
def apply_columns(
    V: Any,
    H: Any,
    Y: Any,
    trap: bool,
    identity: bool,
    transpose: bool,
    safe_exp: int,
    tau_in: Any,
    unit: bool,
) -> int:
    """Y[p] ← H(v₁)…H(v_L) X[p] for every p (H(v_L)…H(v₁) with ``transpose``), X = [I; 0]
    (``identity``) or H[p] (H[0] for a shared operand); the interface of
    :func:`householderla._kernels.numba_lanes.apply_lanes`.

    V (P, N, L) and H (Ph, N, C) read-only, Y (P, N, C) written. Returns −1 (Y incomplete)
    if a column of V must be rescaled first, else the number of non-finite columns.

    ``unit``: V is LAPACK's ``a`` (P, N, ≥ L), ``tau_in`` its τ (P, L), read as ``?orgqr``
    reads them (:func:`unit_reflectors`; ``trap`` True). Each matrix's V is copied into an L1
    scratch first (≤ 2 % of the kernel at N = 64), so both modes run one body."""
    P, N, L = V.shape
    if unit:
        L = tau_in.shape[1]
    C = Y.shape[2]
    Ph = H.shape[0]
    dt = V.dtype
    lo = math.ldexp(1.0, -safe_exp)
    hi = math.ldexp(1.0, safe_exp)
    tau = np.empty(max(L, 1), dt)
    acc = np.empty(max(L, C, 1), dt)
    c = np.empty(max(C, 1), dt)
    S = np.empty((N, 4), dt)  # the last C mod 4 columns, zero-padded to four
    skip = trap and identity and not transpose
    bad = 0
    Vp = np.empty((N, L), dt)
    for p in range(P):
        if unit:
            unit_reflectors(V[p], tau_in[p], Vp)
        else:
            Vp[:] = V[p]
        Yp = Y[p]
        status = _taus(Vp, trap, lo, hi, tau, acc)
        if status < 0:
            return -1
        bad += status
        if identity:
            for i in range(N):
                for j in range(C):
                    Yp[i, j] = 1 if i == j else 0
        else:
            Yp[:] = H[p if Ph > 1 else 0]
        if L == 0:
            continue
        if C >= (WIDE_MIN_C_FORM if skip else WIDE_MIN_C):
            k0, step = (0, 1) if transpose else (L - 1, -1)
            _sweep_wide(Vp, tau, Yp, k0, L, step, trap, skip, acc, c)
            continue
        j = 0
        while j < C:  # blocks of 8, one of 4, the rest zero-padded to 4 in S: one call site
            w = 8 if j + 8 <= C else 4
            rest = j + 4 > C
            if rest:  # the zero columns of S stay zero
                S[:] = 0
                for i in range(N):
                    for q in range(C - j):
                        S[i, q] = Yp[i, j + q]
            _block(
                Vp,
                tau,
                S if rest else Yp,
                0 if rest else j,
                w,
                min(j + w, C) - 1,
                skip,
                trap,
                transpose,
            )
            if rest:
                for i in range(N):
                    for q in range(C - j):
                        Yp[i, j + q] = S[i, q]
            j += w
    return bad
