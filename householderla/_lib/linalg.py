"""Linear algebra the Array API standard lacks, with one native route per backend.

========================  ====================================================
backend                   ``inv_upper_triangular`` route
========================  ====================================================
NumPy                     LAPACK ``trtri`` (one matrix), ``scipy.linalg.solve_triangular`` (batched)
torch                     ``torch.linalg.solve_triangular(..., upper=True)``
JAX                       ``jax.scipy.linalg.solve_triangular(..., lower=False)``
CuPy                      ``cupyx.scipy.linalg.solve_triangular`` per matrix
anything else             :func:`inv_upper_triangular_recursive` (pure Array API)
========================  ====================================================
"""

from __future__ import annotations

from typing import Any

import array_api_compat as aac

from .namespace import device_of

__all__ = ["eye_like", "inv_upper_triangular", "inv_upper_triangular_recursive"]


def eye_like(xp: Any, n: int, dtype: Any, device: Any, batch: tuple[int, ...] = ()) -> Any:
    """Identity of shape ``batch + (n, n)`` (broadcast, not materialised per batch)."""
    eye = xp.eye(n, dtype=dtype, device=device)
    return xp.broadcast_to(eye, batch + (n, n)) if batch else eye


def inv_upper_triangular(S: Any, xp: Any) -> Any:
    """Inverse of the upper-triangular ``S``: (..., L, L) -> (..., L, L).

    Uses LAPACK's trtri for a single NumPy matrix (L³/3 flops), else the backend's triangular
    solve against the identity (L³); backends without one use
    :func:`inv_upper_triangular_recursive`.
    """
    n = S.shape[-1]
    eye = eye_like(xp, n, S.dtype, device_of(S), tuple(S.shape[:-2]))
    if aac.is_numpy_namespace(xp):
        import numpy as np
        import scipy.linalg

        if S.ndim == 2:  # LAPACK trtri: L³/3 flops, 1.7× faster than a solve at L = 1024
            (trtri,) = scipy.linalg.lapack.get_lapack_funcs(("trtri",), (S,))
            inv, info = trtri(S, lower=0)
            if info == 0:
                return inv
        return scipy.linalg.solve_triangular(S, np.array(eye), lower=False, check_finite=False)
    if aac.is_torch_namespace(xp):
        import torch

        return torch.linalg.solve_triangular(S, eye.contiguous(), upper=True)
    if aac.is_jax_namespace(xp):
        import jax.scipy.linalg

        return jax.scipy.linalg.solve_triangular(S, eye, lower=False)
    if aac.is_cupy_namespace(xp):  # pragma: no cover - needs a GPU
        import cupy
        import cupyx.scipy.linalg

        flat = xp.reshape(S, (-1, n, n))
        eye2 = cupy.eye(n, dtype=S.dtype)
        out = cupy.stack([cupyx.scipy.linalg.solve_triangular(s, eye2) for s in flat])
        return xp.reshape(out, S.shape)
    return inv_upper_triangular_recursive(S, xp)


def inv_upper_triangular_recursive(S: Any, xp: Any) -> Any:
    """Pure Array API inverse of an upper-triangular matrix by recursive 2×2 blocking.

    ``inv([[A, B], [0, C]]) = [[A⁻¹, −A⁻¹ B C⁻¹], [0, C⁻¹]]``: all the work is matrix
    multiplication and the dependency depth is log₂ L (DESIGN, "Numerics we already know").
    The nilpotent power series is avoided: its terms overflow for large L.
    """
    n = S.shape[-1]
    if n == 1:
        return 1.0 / S
    k = n // 2
    Ai = inv_upper_triangular_recursive(S[..., :k, :k], xp)
    Ci = inv_upper_triangular_recursive(S[..., k:, k:], xp)
    X = -((Ai @ S[..., :k, k:]) @ Ci)
    zeros = xp.zeros(tuple(S.shape[:-2]) + (n - k, k), dtype=S.dtype, device=device_of(S))
    top = xp.concat([Ai, X], axis=-1)
    bottom = xp.concat([zeros, Ci], axis=-1)
    return xp.concat([top, bottom], axis=-2)
