"""The constructive inverse of the SVD-Householder map (:func:`householderla.svd_householder`):
parameters (U_vecs, σ, V_vecs[, θ]) that reproduce a given W, by one SVD and two Householder
QRs (Zhang, Lei & Dhillon, ICML 2018, Theorems 2 and 4; ``docs/theory/svd.rst``). Exported by
:mod:`householderla.svd`.
"""

from __future__ import annotations

from typing import Any

from ._lib.checks import check_finite
from ._lib.jit import jit_for
from ._lib.namespace import accumulation_dtype_for, is_complex, mH, real_dtype, resolve
from .householder import householder_vectors, tcwy_vectors

__all__ = ["svd_householder_params"]


def svd_householder_params(
    W: Any, *, return_phases: bool = False, xp: Any = None
) -> tuple[Any, ...]:
    """Constructive inverse of :func:`svd_householder`: parameters that reproduce any real W
    (any complex W with ``return_phases=True``).

    Parameters
    ----------
    W : array, shape (..., m, n)
        Any real matrices (square or rectangular, any rank), m, n ≥ 1; or complex ones, which
        need ``return_phases=True`` (ValueError otherwise).
    return_phases : bool, default False
        Also return θ (..., r) with ``svd_householder(U_vecs, sigma, V_vecs,
        theta=theta).matrix() ≈ W``: the unitary singular-vector matrices are Hermitian
        reflections times phases (:func:`householder_vectors`), and the phases of both sides
        meet at Σ, θ = θ_left − θ_right. Zero for real W.

    Returns
    -------
    U_vecs : array, shape (..., m, k₁) sigma : array, shape (..., r), r = min(m, n)
        The singular values as the SVD returns them (≥ 0, descending).
    V_vecs : array, shape (..., n, k₂)
        Lower-trapezoidal reflection vectors with ``svd_householder(U_vecs, sigma, V_vecs).matrix()
        ≈ W``, where (k₁, k₂) = (r − 1, r) for m ≤ n and (r, r − 1) for m > n: 2·min(m, n) − 1
        reflectors in total, one fewer than Zhang, Lei & Dhillon, ICML 2018, Theorem 4.

    Notes
    -----
    Reduced SVD W = U diag(σ) Vᵀ (``xp.linalg.svd(W, full_matrices=False)``; for m ≤ n, U is
    m×m orthogonal and V ∈ St(n, m), and the other way round for m > n). The square factor
    (size r) goes through :func:`householder_vectors`; its r-th vector is 0 or −2e_r, and in
    the second case the r-th columns of *both* singular-vector matrices are negated, which
    leaves W and σ unchanged and makes that vector 0, so it is dropped (r − 1 vectors). The
    other factor, now in St(·, r), goes through :func:`tcwy_vectors` (r vectors; for m = n
    this is :func:`householder_vectors`). Shapes depend only on (m, n), so this runs under
    ``jax.jit``. Cost: the SVD plus 4r³/3 + 2r²(N − r/3) flops for the two Householder QRs,
    computed in float64 for float32 input on CPU backends.

    Complex W: the same with Hermitian reflections; the square factor's r-th vector is then
    always 0 (its phase went to θ), so the counts are those above.

    Rank-deficient W (some σ_i = 0): the SVD still returns orthogonal singular vectors
    (not unique — any orthonormal basis of the null spaces will do), and the parameters
    reproduce W to the same accuracy; which basis you get is the backend's choice.

    Examples
    --------
    >>> import numpy as np, householderla as hl
    >>> W = np.random.default_rng(0).standard_normal((5, 3))
    >>> U_vecs, sigma, V_vecs = hl.svd_householder_params(W)
    >>> U_vecs.shape, sigma.shape, V_vecs.shape
    ((5, 3), (3,), (3, 2))
    >>> bool(np.allclose(hl.svd_householder(U_vecs, sigma, V_vecs).matrix(), W))
    True
    """
    xp, _, dtype, (W,) = resolve([("W", W)], xp, complex_ok=True)
    if W.ndim < 2 or W.shape[-1] == 0 or W.shape[-2] == 0:
        raise ValueError(f"W must have shape (..., m, n) with m, n >= 1; got {tuple(W.shape)}")
    if is_complex(dtype) and return_phases is not True:
        raise ValueError(
            "W is complex: its singular vectors need phases besides the reflections; use "
            "U_vecs, sigma, V_vecs, theta = svd_householder_params(W, return_phases=True)"
        )
    check_finite(W, xp, "W")
    acc = accumulation_dtype_for(xp, W)
    Wa = W if W.dtype == acc else xp.astype(W, acc)
    out = list(jit_for(xp, _params_core)(xp, Wa))
    rdtype = real_dtype(xp, dtype)
    if len(out) == 3 and return_phases:
        out.append(xp.zeros_like(out[1]))
    types = (dtype, rdtype, dtype, rdtype)[: len(out)]
    out = [a if a.dtype == t else xp.astype(a, t) for a, t in zip(out, types, strict=True)]
    return tuple(out)


def _params_core(xp: Any, W: Any) -> tuple[Any, ...]:
    """SVD, sign flip and the two Householder QRs (compiled once per shape on JAX); for
    complex W the QRs with phases, and θ = θ_left − θ_right returned last."""
    m, n = W.shape[-2], W.shape[-1]
    r = min(m, n)
    # W = 2^e·Ws with max|Ws| in [1, 2): exact, and the SVD then never squares entries at
    # 1e±300 (XLA on the CPU would also flush their subnormal squares to zero); two steps,
    # since 2^±1074 itself is not a normal number
    mx = xp.max(xp.abs(W), axis=(-2, -1), keepdims=True)
    e = xp.floor(xp.log2(xp.where(mx > 0, mx, xp.ones_like(mx))))
    half = xp.floor(e / 2)
    U, s, Vh = xp.linalg.svd((W * 2.0**-half) * 2.0 ** (half - e), full_matrices=False)
    s = (s * 2.0 ** half[..., 0]) * 2.0 ** (e - half)[..., 0]
    V = mH(Vh, xp)
    square, other = (U, V) if m <= n else (V, U)
    if is_complex(W.dtype):  # W = U Σ Vᴴ = Q_U D_U Σ D_Vᴴ Q_Vᴴ, the r-th square vector is 0
        sq_vecs, sq_theta = householder_vectors(square, return_phases=True, xp=xp)
        other_vecs, o_theta = tcwy_vectors(other, return_phases=True, xp=xp)
        sq_vecs = sq_vecs[..., : r - 1]
        if m <= n:
            return sq_vecs, s, other_vecs, sq_theta - o_theta
        return other_vecs, s, sq_vecs, o_theta - sq_theta
    sq_vecs = householder_vectors(square, xp=xp)
    # the r-th vector is 0 or −e_r; in the second case negate the r-th column of both
    # factors (W and σ unchanged), which turns it into the zero vector
    last = sq_vecs[..., r - 1, r - 1]
    sign = xp.where(last < 0, -xp.ones_like(last), xp.ones_like(last))
    other = xp.concat([other[..., : r - 1], other[..., r - 1 :] * sign[..., None, None]], axis=-1)
    sq_vecs = sq_vecs[..., : r - 1]
    other_vecs = tcwy_vectors(other, xp=xp)
    return (sq_vecs, s, other_vecs) if m <= n else (other_vecs, s, sq_vecs)
