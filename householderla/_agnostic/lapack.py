"""LAPACK's compact Householder storage ``(a, τ)`` as this library's reflection vectors.

``?geqrf`` stores H(i) = I − τᵢvᵢvᵢᴴ with vᵢ unit lower trapezoidal below the diagonal of ``a``
and τᵢ = 0 for H(i) = I (LAPACK Users' Guide, Anderson et al., SIAM 1999, §5.4). Real τᵢ ≠ 0
from ``?larfg`` is 2/‖vᵢ‖², so Q = H(1)…H(k) is ``cwy(V)`` with the τ = 0 columns zeroed.
Complex τ gives unitary, non-Hermitian H(i) with eigenvalue λᵢ = 1 − τᵢ‖vᵢ‖²: in the compact
WY form only the diagonal of S changes, sᵢ = 1/(1 − λᵢ) (:func:`normalized_sdiag`).
"""

from __future__ import annotations

import functools
from typing import Any

import array_api_compat as aac
import numpy as np

from .._lib.namespace import device_of, is_complex
from .._lib.tracing import is_eager

__all__ = ["lapack_reflectors", "normalized_sdiag", "sq_norms", "tau_mismatch"]


def lapack_reflectors(a: Any, tau: Any) -> Any:
    """V (..., m, k): column i is vᵢ = eᵢ + tril(a, −1)[:, i] where τᵢ ≠ 0, else 0.

    a (..., m, n), tau (..., k), k ≤ min(m, n); O(m·k), no copy of ``a`` beyond V.
    """
    xp = aac.array_namespace(a, tau)
    m, k = a.shape[-2], tau.shape[-1]
    if aac.is_numpy_array(a):
        V = _unit_lower_numpy(a[..., :, :k])
    else:
        V = xp.tril(a[..., :, :k], k=-1) + xp.eye(m, k, dtype=a.dtype, device=device_of(a))
    zero = tau == 0
    if is_eager(zero) and not bool(xp.any(zero)):
        return V  # geqrf's usual output: no pass to zero columns
    if aac.is_numpy_array(V):  # our own copy: zero the τ = 0 columns in place
        if V.ndim == 2:  # (a square geqrf's last τ is 0: one column, not a pass over V)
            V[:, np.flatnonzero(zero)] = 0
        else:
            np.copyto(V, 0, where=zero[..., None, :])
        return V
    return xp.where(zero[..., None, :], xp.zeros_like(V), V)  # (exact zeros, NaN or not)


def _unit_lower_numpy(a: Any) -> Any:
    """tril(a, −1) + I for a NumPy ``a`` (..., m, k), k ≤ m: one copy in ``a``'s memory order,
    then per block of 32 columns the rows above it and its diagonal block's upper triangle
    zeroed.
    LAPACK's ``a`` is Fortran-ordered, where ``np.tril`` (a masked ``where``) is several times
    slower than these blocks (``benchmarks/results/tuning.md``)."""
    V = np.array(a, order="K", copy=True)
    k = V.shape[-1]
    for s in range(0, k, 32):
        e = min(s + 32, k)
        V[..., :s, s:e] = 0
        np.copyto(V[..., s:e, s:e], 0, where=_upper(e - s))  # (no arithmetic on R's inf/NaN)
    np.einsum("...ii->...i", V[..., :k, :])[...] = 1
    return V


@functools.lru_cache(maxsize=32)
def _upper(n: int) -> Any:
    """The n × n mask of the upper triangle with the diagonal (read-only, cached)."""
    M = ~np.tri(n, n, -1, dtype=bool)
    M.flags.writeable = False
    return M


def tau_mismatch(V: Any, tau: Any, ss: Any = None) -> Any:
    """max over columns with τᵢ ≠ 0 of |τᵢ‖vᵢ‖²/2 − 1| (0 when H(i) is exactly the
    reflection by vᵢ), shape (...). For complex τ: ||1 − τᵢ‖vᵢ‖²| − 1| (0 when H(i) is
    unitary). ‖vᵢ‖² ≥ 1 (unit diagonal), so no underflow; a column whose ‖vᵢ‖² overflows
    gives inf. ``ss``: :func:`sq_norms` (V) when the caller has it."""
    xp = aac.array_namespace(V, tau)
    ss = sq_norms(V) if ss is None else ss
    if is_complex(tau.dtype):
        err = xp.abs(xp.abs(1 - tau * ss) - 1)
    else:
        err = xp.abs(tau * ss / 2 - 1)
    return xp.max(xp.where(tau != 0, err, xp.zeros_like(err)), axis=-1)


def normalized_sdiag(V: Any, tau: Any, ss: Any = None) -> Any:
    """sᵢ = 1/(τᵢ‖vᵢ‖²) (..., k), the diagonal of S for unit columns (½ for a reflection;
    ½ also where τᵢ = 0, whose column V zeroes). ``ss``: :func:`sq_norms` (V) if known."""
    xp = aac.array_namespace(V, tau)
    ts = tau * (sq_norms(V) if ss is None else ss)
    nz = tau != 0
    return xp.where(nz, 1 / xp.where(nz, ts, xp.ones_like(ts)), 0.5 * xp.ones_like(ts))


def sq_norms(V: Any) -> Any:
    """‖vᵢ‖² (..., k), real-valued (in V's dtype): one pass over V. Complex NumPy V: NumPy's
    ``vecdot`` gufunc, which conjugates its first argument (Σ conj(v)·v, imaginary part
    exactly 0; no temporary: V·conj(V) and conj(V) were two copies of V; ``vecdot`` is also
    faster than ``einsum`` over the real and imaginary views, benchmarks/results/tuning.md)."""
    xp = aac.array_namespace(V)
    if not is_complex(V.dtype) or aac.is_numpy_array(V):
        return xp.linalg.vecdot(V, V, axis=-2)
    return xp.sum(V * xp.conj(V), axis=-2)
