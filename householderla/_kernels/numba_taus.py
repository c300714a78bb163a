"""τ_k = 2/‖v_k‖² of the reflections' columns for :mod:`~householderla._kernels.numba_loops`,
with the check that decides whether a column must be rescaled first.

‖v_k‖² is summed in four partial sums by row mod 4 (the loops' order), so τ does not depend on
the batch width or the machine. Inside [2^−e, 2^e] (``SAFE_EXP``) τ = 2/‖v‖²; a nonzero column
outside gets τ = 0 and is counted (the caller rescales by a power of two, exact, H(cv) = H(v));
a non-finite column gets τ = NaN, counted apart; a zero column τ = 0 (H(0) = I). O(N·L) flops.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .numba_loops import njit

__all__ = ["SAFE_EXP", "all_taus", "taus"]

#: A hash of the sibling kernel modules this one imports: Numba's on-disk cache keys a
#: compiled function on its own file only, so changing this line when one of them changes
#: makes the cache recompile (tests/test_numba_kernels.py checks it).
KERNEL_DEPS = "b0a0beb634880961"

#: log2 of the safe range of ‖v‖² per dtype: inside it τ = 2/‖v‖², the products τ·γ and the
#: squares v_i² neither overflow nor lose precision to underflow.
SAFE_EXP = {np.dtype(np.float64): 500, np.dtype(np.float32): 60}


@njit()
def taus(V: Any, trap: bool, safe_exp: int, tau: Any) -> Any:
    """τ_k = 2/‖v_k‖² into ``tau`` (L,); ‖v_k‖² row by row (vectorised over k) in the
    loops' order (four partial sums by row index mod 4). Returns (non-finite columns:
    τ = NaN; nonzero columns whose ‖v‖² is outside [2^−safe_exp, 2^safe_exp]: τ = 0, the
    caller rescales them)."""
    n, L = V.shape
    two = V.dtype.type(2)
    lo = math.ldexp(1.0, -safe_exp)
    hi = math.ldexp(1.0, safe_exp)
    acc = np.zeros((4, L), V.dtype)
    for i in range(n):
        r = i & 3
        kmax = min(i + 1, L) if trap else L
        for k in range(kmax):
            x = V[i, k]
            acc[r, k] += x * x
    nonfinite = 0
    outside = 0
    for k in range(L):
        ss = (acc[0, k] + acc[1, k]) + (acc[2, k] + acc[3, k])
        if lo <= ss <= hi:
            tau[k] = two / ss
            continue
        m = 0.0
        bad = False
        for i in range(k if trap else 0, n):
            a = abs(np.float64(V[i, k]))
            if not (a <= 1.7976931348623157e308):  # NaN or Inf
                bad = True
            elif a > m:
                m = a
        tau[k] = 0  # H(0) = I for a zero column
        if bad:
            tau[k] = np.nan
            nonfinite += 1
        elif m > 0.0:
            outside += 1
    return nonfinite, outside


@njit()
def all_taus(V: Any, trap: bool, safe_exp: int) -> Any:
    """τ (Pv, L) for every batch entry; status −1 if a column needs rescaling, else the
    number of non-finite columns."""
    Pv, _, L = V.shape
    tau = np.empty((Pv, L), V.dtype)
    nonfinite = 0
    outside = 0
    for p in range(Pv):
        a, b = taus(V[p], trap, safe_exp, tau[p])
        nonfinite += a
        outside += b
    return tau, (-1 if outside else nonfinite)
