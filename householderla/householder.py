"""Householder reflections: sequential products and the constructive inverses.

H(v) = I − 2 v vᵀ / ‖v‖² for v ≠ 0 and H(0) = I (Zhang, Lei & Dhillon, ICML 2018 eq. 1). The
sequential path applies the reflections one at a time (4·N·L·B flops for L reflections on B
vectors): the reference implementation against which CWY is tested, and the fastest path for tiny
shapes.

The constructive inverses run Householder QR with a positive diagonal (Mhammedi et al., ICML 2017,
Algorithm 2; the proof of Likhosherstov et al., AISTATS 2021, Theorems 1 and 3, eq. 4–7): the k-th
reflector maps the current k-th column x to +‖x‖ e_k, computed without cancellation by Parlett's
formula v_k = −‖x_{k+1:}‖² / (x_k + ‖x‖) when x_k > 0. For Q ∈ O(N) the first N − 1 steps leave R =
diag(1, …, 1, ρ) with ρ = (−1)^m det Q, m the number of nonzero reflectors so far; the N-th
reflector is then 0 (ρ = +1) or −e_N (ρ = −1). So N vectors, one possibly zero, reach both
components of O(N), and the number of nonzero vectors has the parity of det Q.
"""

from __future__ import annotations

from typing import Any

from ._agnostic.reflections import positive_qr_reflectors, unitary_qr_reflectors
from ._lib.checks import (
    check_finite_norms,
    check_reflectors,
)
from ._lib.jit import jit_for
from ._lib.linalg import eye_like, pow2_normalise
from ._lib.namespace import (
    accumulation_dtype_for,
    device_of,
    is_complex,
    real_dtype,
    resolve,
)
from ._operator.sequential import (
    apply_sequential,
    householder_apply,
    householder_apply_vjp,
    sequential_is_faster,
)

__all__ = [
    "apply_sequential",
    "householder_apply",
    "householder_apply_vjp",
    "householder_product",
    "householder_vectors",
    "sequential_is_faster",
    "tcwy_vectors",
]


def householder_product(V: Any, *, xp: Any = None) -> Any:
    """Dense H(v₁)…H(v_L), shape (..., N, N), by sequential reflections (4·N²·L flops).

    The reference path; ``cwy(V).matrix()`` computes the same matrix with GEMMs.
    """
    xp, device, dtype, (V,) = resolve([("V", V)], xp, complex_ok=True, half=True)
    N, _ = check_reflectors(V)
    return householder_apply(V, eye_like(xp, N, dtype, device), xp=xp)


def householder_vectors(Q: Any, *, return_phases: bool = False, xp: Any = None) -> Any:
    """Constructive inverse of CWY: reflection vectors V with ``cwy(V).matrix() == Q``.

    Parameters
    ----------
    Q : array, shape (..., N, N)
        Orthogonal matrices, either determinant; or unitary (complex) matrices, which need
        ``return_phases=True``.
    return_phases : bool, default False
        Also return phases θ with ``cwy(V, theta=theta).matrix() == Q``. Required for complex Q:
        a product of Hermitian reflections has determinant ±1, so a unitary Q is H(v₁)…H(v_N)
        diag(e^{iθ}) (Mhammedi et al., ICML 2017, §4.3, Corollary 1); complex Q without it raises
        ``ValueError``. For real Q, θ = 0.

    Returns
    -------
    V : array, shape (..., N, N)
        Column k is zero above row k (lower trapezoidal, as in Mhammedi et al., ICML 2017 eq. 9).
        Real Q: the last column is 0 or −e_N, whichever makes (−1)^(number of nonzero columns) =
        det Q, so V ↦ cwy(V) reaches all of O(N) (Likhosherstov et al., AISTATS 2021, Theorem 1
        with H(0) = I). Complex Q: the last column is 0 (N − 1 reflectors and N phases).
    theta : array, shape (..., N), only with ``return_phases=True``
        Real, Q's real dtype: θ_k = arg of the k-th diagonal entry of R in Householder QR with
        Hermitian reflections.

    Notes
    -----
    Householder QR with positive diagonal (Mhammedi et al., ICML 2017, Algorithm 2), 4N³/3 flops,
    computed in float64 (complex128) for float32 (complex64) inputs on CPU backends. For a
    non-orthogonal full-rank Q the result parametrises the orthogonal (unitary) factor of Q = QR
    with diag(R) > 0.

    Examples
    --------
    >>> import numpy as np, householderla as hl
    >>> Q = np.linalg.qr(np.random.default_rng(0).standard_normal((4, 4)))[0]
    >>> bool(np.allclose(hl.cwy(hl.householder_vectors(Q)).matrix(), Q))
    True
    >>> from scipy.stats import unitary_group
    >>> U = unitary_group.rvs(4, random_state=0)
    >>> V, theta = hl.householder_vectors(U, return_phases=True)
    >>> bool(np.allclose(hl.cwy(V, theta=theta).matrix(), U))
    True
    """
    xp, _, _, (Q,) = resolve([("Q", Q)], xp, complex_ok=True)
    if Q.ndim < 2 or Q.shape[-1] != Q.shape[-2]:
        raise ValueError(f"Q must have shape (..., N, N); got shape {tuple(Q.shape)}")
    return _inverse(Q, xp, "Q", return_phases)


def tcwy_vectors(Omega: Any, *, return_phases: bool = False, xp: Any = None) -> Any:
    """Constructive inverse of T-CWY: V with ``tcwy(V).matrix() == Omega``.

    Parameters
    ----------
    Omega : array, shape (..., N, M), M ≤ N
        Matrices with orthonormal columns (points of the Stiefel manifold St(N, M), real or
        complex; complex input needs ``return_phases=True``).
    return_phases : bool, default False
        Also return phases θ (..., M) with ``tcwy(V, theta=theta).matrix() == Omega``; required
        for complex Omega (see :func:`householder_vectors`). For real Omega, θ = 0.

    Returns
    -------
    V : array, shape (..., N, M)
        Lower-trapezoidal reflection vectors (Likhosherstov et al., AISTATS 2021, Theorem 3,
        constructive proof).
    theta : array, shape (..., M), only with ``return_phases=True``

    Notes
    -----
    Householder QR with positive diagonal, 2·M²(N − M/3) flops. For a full-rank
    non-orthonormal input the result parametrises its Q factor (the QR retraction point).
    """
    xp, _, _, (Omega,) = resolve([("Omega", Omega)], xp, complex_ok=True)
    if Omega.ndim < 2 or Omega.shape[-1] > Omega.shape[-2]:
        raise ValueError(
            f"Omega must have shape (..., N, M) with M <= N; got shape {tuple(Omega.shape)}"
        )
    return _inverse(Omega, xp, "Omega", return_phases)


def _inverse(A: Any, xp: Any, name: str, return_phases: bool) -> Any:
    if not isinstance(return_phases, bool):
        raise TypeError(f"return_phases must be True or False; got {return_phases!r}")
    cplx = is_complex(A.dtype)
    if cplx and not return_phases:
        raise ValueError(
            f"{name} is complex: a unitary matrix is a product of Hermitian reflections times "
            "a diagonal of phases; use V, theta = householder_vectors(Q, return_phases=True) "
            "(tcwy_vectors likewise) and cwy(V, theta=theta)"
        )
    rdtype = real_dtype(xp, A.dtype)
    if A.shape[-1] == 0:
        theta = xp.zeros(A.shape[:-2] + (0,), dtype=rdtype, device=device_of(A))
        return (A, theta) if return_phases else A
    check_finite_norms(xp.max(xp.abs(A), axis=-2, keepdims=True), xp, name)
    acc = accumulation_dtype_for(xp, A)
    Aa = A if A.dtype == acc else xp.astype(A, acc)
    # the Q factor of A·D is A's for positive diagonal D: each column scaled exactly to
    # max ∈ [1, 2) (subnormal and huge columns alike), the reflectors then see no underflow
    Aa = pow2_normalise(Aa, xp, axis=-2)[0]
    if cplx:
        V, theta = jit_for(xp, unitary_qr_reflectors, ())(Aa)
        theta = theta if theta.dtype == rdtype else xp.astype(theta, rdtype)
    else:
        V = jit_for(xp, positive_qr_reflectors, ())(Aa)
        theta = xp.zeros(A.shape[:-2] + (A.shape[-1],), dtype=rdtype, device=device_of(A))
    V = V if V.dtype == A.dtype else xp.astype(V, A.dtype)
    return (V, theta) if return_phases else V


def __dir__() -> list[str]:
    """Only the public names: the imports above stay attributes but are not listed."""
    return sorted(__all__)
