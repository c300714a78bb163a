"""Householder reflections applied to one vector (NumPy, CPU): one pass over y per reflection.

Each pass applies reflection k (y ← y − τ_kγ_k v_k) and sums the next one's γ = vᵀy and ‖v‖²
(τ = 2/‖v‖²), on a transposed copy of V whose columns are contiguous, so LLVM's SLP
vectoriser packs the four partial sums by row mod 4 into one vector. Numerics are those of
:mod:`~householderla._kernels.numba_loops` and :mod:`~householderla._kernels.numba_taus` bit for
bit (input dtype, each partial sum in row order, no ``fastmath``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .numba_loops import HAVE_NUMBA, lane_add, njit
from .numba_simd import slp_njit, transpose8
from .numba_taus import SAFE_EXP

__all__ = ["fp_vec_kernel"]

#: A hash of the sibling kernel modules this one imports: Numba's on-disk cache keys a
#: compiled function on its own file only, so changing this line when one of them changes
#: makes the cache recompile (tests/test_numba_kernels.py checks it).
KERNEL_DEPS = "db47621425445c1d"


#: ``SAFE_EXP`` of each dtype, as constants the kernel compiles in (an argument fewer per call)
_SAFE_F64, _SAFE_F32 = SAFE_EXP[np.dtype(np.float64)], SAFE_EXP[np.dtype(np.float32)]


def _sigs() -> Any:
    if not HAVE_NUMBA:
        return None
    from numba import types as nt

    out = []
    for f in (nt.float32, nt.float64):
        ro2, rw1 = nt.Array(f, 2, "C", readonly=True), nt.Array(f, 1, "C")
        out.append(nt.int64(ro2, rw1, nt.boolean, nt.boolean))
    return out


@njit(inline="always")
def _transposed(V: Any, Vt: Any) -> None:
    """Vt (L, N) ← Vᵀ for V (N, L), both C-contiguous: 8 × 8 blocks in registers, the rest
    one by one."""
    n, L = V.shape
    n8, L8 = n - n % 8, L - L % 8
    for i0 in range(0, n8, 8):
        for k0 in range(0, L8, 8):
            transpose8(V, i0 * L + k0, L, Vt, k0 * n + i0, n)
        for k in range(L8, L):
            for i in range(i0, i0 + 8):
                Vt[k, i] = V[i, k]
    for i in range(n8, n):
        for k in range(L):
            Vt[k, i] = V[i, k]


@njit(inline="always")
def _scalar_rows(
    Vt: Any, k: int, ct: Any, kn: int, y: Any, lo: int, hi: int, s: Any, q: Any
) -> tuple[Any, Any]:
    """:func:`_pass` on rows lo…hi−1 one at a time (its head and tail)."""
    for i in range(lo, hi):
        yi = y[i]
        if k >= 0:
            yi -= ct * Vt[k, i]
            y[i] = yi
        if kn >= 0:
            u = Vt[kn, i]
            s = lane_add(i & 3, u * yi, s[0], s[1], s[2], s[3])
            q = lane_add(i & 3, u * u, q[0], q[1], q[2], q[3])
    return s, q


@njit(inline="always")
def _pass(
    Vt: Any, k: int, ct: Any, kn: int, y: Any, lo: int, hi: int, s: Any, q: Any
) -> tuple[Any, Any]:
    """Rows lo…hi−1: y_i ← y_i − ct·Vt[k, i] (k ≥ 0; none for k < 0), then the next
    column's partial sums by i mod 4, s of Vt[kn, i]·y_i (the updated value) and q of
    Vt[kn, i]² (kn ≥ 0; none for kn < 0). A scalar head up to a multiple of four, four rows at
    a time (one vector each), a scalar tail: every partial sum in row order."""
    i = min(hi, max(lo, (lo + 3) & ~3))  # the head: up to a multiple of four
    s, q = _scalar_rows(Vt, k, ct, kn, y, lo, i, s, q)
    s0, s1, s2, s3 = s
    q0, q1, q2, q3 = q
    nq = max(hi - i, 0) // 4
    one, two, three = np.uint64(1), np.uint64(2), np.uint64(3)
    if k >= 0 and kn >= 0:  # (unsigned row indices: no wraparound code between the loads)
        vk, vn = Vt[k], Vt[kn]
        for r in range(np.uint64(i), np.uint64(i + 4 * nq), np.uint64(4)):
            y0 = y[r] - ct * vk[r]
            y1 = y[r + one] - ct * vk[r + one]
            y2 = y[r + two] - ct * vk[r + two]
            y3 = y[r + three] - ct * vk[r + three]
            y[r] = y0
            y[r + one] = y1
            y[r + two] = y2
            y[r + three] = y3
            u0, u1, u2, u3 = vn[r], vn[r + one], vn[r + two], vn[r + three]
            s0 += u0 * y0
            s1 += u1 * y1
            s2 += u2 * y2
            s3 += u3 * y3
            q0 += u0 * u0
            q1 += u1 * u1
            q2 += u2 * u2
            q3 += u3 * u3
    elif kn >= 0:  # the next dot product alone
        vn = Vt[kn]
        for r in range(np.uint64(i), np.uint64(i + 4 * nq), np.uint64(4)):
            u0, u1, u2, u3 = vn[r], vn[r + one], vn[r + two], vn[r + three]
            s0 += u0 * y[r]
            s1 += u1 * y[r + one]
            s2 += u2 * y[r + two]
            s3 += u3 * y[r + three]
            q0 += u0 * u0
            q1 += u1 * u1
            q2 += u2 * u2
            q3 += u3 * u3
    elif k >= 0:  # the update alone
        vk = Vt[k]
        for r in range(np.uint64(i), np.uint64(i + 4 * nq), np.uint64(4)):
            y[r] -= ct * vk[r]
            y[r + one] -= ct * vk[r + one]
            y[r + two] -= ct * vk[r + two]
            y[r + three] -= ct * vk[r + three]
    i += 4 * nq
    return _scalar_rows(Vt, k, ct, kn, y, i, hi, (s0, s1, s2, s3), (q0, q1, q2, q3))


@njit(inline="always")
def _tau(Vt: Any, k: int, start: int, ss: Any, lo: float, hi: float) -> tuple[Any, int]:
    """(τ_k, status) from ‖v_k‖² = ``ss`` by the rule of
    :func:`householderla._kernels.numba_taus.taus`: 2/‖v‖² inside [lo, hi] (status 0); else
    NaN for a non-finite column (status 1), 0 for a zero one (status 0), and status −1 for a
    nonzero column outside (the caller rescales it first)."""
    if lo <= ss <= hi:
        return Vt.dtype.type(2) / ss, 0
    bad = False
    nonzero = False
    for i in range(start, Vt.shape[1]):
        a = abs(np.float64(Vt[k, i]))
        if not (a <= 1.7976931348623157e308):  # NaN or Inf
            bad = True
        elif a > 0.0:
            nonzero = True
    if bad:
        return Vt.dtype.type(np.nan), 1
    if nonzero:
        return Vt.dtype.type(0), -1
    return Vt.dtype.type(0), 0  # H(0) = I


@slp_njit(_sigs())
def fp_vec_kernel(V: Any, y: Any, trap: bool, transpose: bool) -> int:
    """y (N,) ← H(v₁)…H(v_L) y (H(v_L)…H(v₁) y with ``transpose``) in place, for one V (N, L);
    ``trap``: column k is read from row k on. One pass over y per reflection (4·N flops, and
    2·N for the next ‖v‖²): reflection k's update fused with the next reflection's dot
    product and squared norm; zero columns (τ = 0) are skipped, a dot pass then starting
    afresh. Returns −1 (y unfinished) if a column's ‖v‖² leaves [2^−e, 2^e] (e =
    ``SAFE_EXP`` of the dtype: the caller rescales it), else the number of non-finite columns
    (τ = NaN, applied). Every argument costs the call tens of ns at N = 128, L = 16: y is
    updated in place (the caller copies h) and e is compiled in."""
    n, L = V.shape
    Vt = np.empty((L, n), V.dtype)
    _transposed(V, Vt)
    safe_exp = _SAFE_F64 if y.itemsize == 8 else _SAFE_F32  # (frozen in at compile time)
    lo = math.ldexp(1.0, -safe_exp)
    hi = math.ldexp(1.0, safe_exp)
    z = V.dtype.type(0)
    zero = (z, z, z, z)
    nonfinite = 0
    k, ct = -1, z  # the reflection whose update is pending, and its τγ
    for idx in range(L):
        kn = idx if transpose else L - 1 - idx
        sn = kn if trap else 0
        s, q = zero, zero
        if k < 0:  # a dot pass
            s, q = _pass(Vt, -1, ct, kn, y, sn, n, s, q)
        elif not trap:  # every row: the update and the next column's sums in one pass
            s, q = _pass(Vt, k, ct, kn, y, 0, n, s, q)
        else:  # the rows the next column reads alone, those the update writes alone, both
            both = max(k, sn)
            s, q = _pass(Vt, -1, ct, kn, y, sn, both, s, q)
            _pass(Vt, k, ct, -1, y, k, both, s, q)
            s, q = _pass(Vt, k, ct, kn, y, both, n, s, q)
        t, status = _tau(Vt, kn, sn, (q[0] + q[1]) + (q[2] + q[3]), lo, hi)
        if status < 0:
            return -1
        nonfinite += status
        k = -1
        if t != 0:  # (NaN too: applied)
            k, ct = kn, t * ((s[0] + s[1]) + (s[2] + s[3]))
    if k >= 0:
        _pass(Vt, k, ct, -1, y, k if trap else 0, n, zero, zero)
    return nonfinite
