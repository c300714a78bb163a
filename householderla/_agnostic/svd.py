"""Backend-neutral side maps of the SVD-Householder parametrization and their backward passes.

One side of W = Q_U Σ Q_Vᵀ (Zhang, Lei & Dhillon, ICML 2018, eq. 3 and 17) is Q = H(v₁)…H(v_k)
seen through E_r = [I_r; 0]: ``embed`` c ↦ Q E_r c, ``project`` x ↦ P_r Qᵀ x, ``stiefel`` Q E_r,
computed with the CWY kernels of :mod:`.compact_wy` (T-CWY when the side has exactly r
reflectors). :func:`apply_vjp_core` and :func:`matrix_vjp_core` compose them into the VJPs of
``W @ x`` and of ``W``; the derivation is in ``docs/theory/svd.rst``.
"""

from __future__ import annotations

from typing import Any

from .._lib.linalg import sum_to_shape
from .._lib.namespace import conj, device_of, mH
from . import compact_wy as K

__all__ = [
    "apply_vjp_core",
    "embed_vjp",
    "matrix_vjp_core",
    "pad",
    "project",
    "project_vjp",
    "side_mode",
    "stiefel",
    "stiefel_vjp",
]


def side_mode(N: int, k: int, r: int) -> str:
    """How Q E_r is computed: "identity" (k = 0, Q = I), "square" (r = N: Q E_r = Q),
    "stiefel" (k = r < N: Q E_r = γ_{N,r}(V), T-CWY) or "pad" (Q [c; 0], any other k)."""
    if k == 0:
        return "identity"
    if r == N:
        return "square"
    if k == r:
        return "stiefel"
    return "pad"


def pad(c: Any, N: int, xp: Any) -> Any:
    """[c; 0] with N rows (E_r c)."""
    r = c.shape[-2]
    if r == N:
        return c
    z = xp.zeros((*c.shape[:-2], N - r, c.shape[-1]), dtype=c.dtype, device=device_of(c))
    return xp.concat([c, z], axis=-2)


def factors(V: Any, xp: Any) -> tuple[Any, Any, Any]:
    return K.cwy_factors(V, xp, check=False)  # finiteness was checked on entry


def embed_vjp(V: Any, c: Any, g: Any, r: int, xp: Any) -> tuple[Any, Any]:
    """Backward of c ↦ Q E_r c: (V̄, c̄)."""
    N, k = V.shape[-2], V.shape[-1]
    mode = side_mode(N, k, r)
    if mode == "identity":
        return xp.zeros_like(V), sum_to_shape(g[..., :r, :], tuple(c.shape), xp)
    U, T, rn = factors(V, xp)
    h = c if mode == "stiefel" else pad(c, N, xp)
    kmode = "embed" if mode == "stiefel" else "square"
    U_bar, h_bar, _, S_bar = K.lowrank_vjp(U, T, h, g, xp, transpose=False, mode=kmode)
    return K.factors_vjp(U, rn, U_bar, S_bar, xp), h_bar[..., :r, :]


def project(V: Any, x: Any, r: int, xp: Any) -> Any:
    """x ↦ P_r Qᵀ x with the explicit kernels."""
    N, k = V.shape[-2], V.shape[-1]
    mode = side_mode(N, k, r)
    if mode == "identity":
        return x[..., :r, :]
    U, T, _ = factors(V, xp)
    kmode = "project" if mode == "stiefel" else "square"
    y = K.lowrank_apply(U, T, x, xp, transpose=True, mode=kmode)
    return y[..., :r, :]


def project_vjp(V: Any, x: Any, a_bar: Any, r: int, xp: Any) -> tuple[Any, Any]:
    """Backward of x ↦ P_r Qᵀ x: (V̄, x̄)."""
    N, k = V.shape[-2], V.shape[-1]
    mode = side_mode(N, k, r)
    if mode == "identity":
        return xp.zeros_like(V), sum_to_shape(pad(a_bar, N, xp), tuple(x.shape), xp)
    U, T, rn = factors(V, xp)
    kmode = "project" if mode == "stiefel" else "square"
    g = a_bar if mode == "stiefel" else pad(a_bar, N, xp)
    U_bar, x_bar, _, S_bar = K.lowrank_vjp(U, T, x, g, xp, transpose=True, mode=kmode)
    return K.factors_vjp(U, rn, U_bar, S_bar, xp), x_bar


def stiefel(V: Any, r: int, xp: Any) -> Any:
    """Q E_r, dense (N × r)."""
    N, k = V.shape[-2], V.shape[-1]
    mode = side_mode(N, k, r)
    if mode == "identity":
        return xp.eye(N, r, dtype=V.dtype, device=device_of(V))
    U, T, _ = factors(V, xp)
    if mode == "pad":
        return K.lowrank_apply(
            U,
            T,
            xp.eye(N, r, dtype=V.dtype, device=device_of(V)),
            xp,
            transpose=False,
            mode="square",
        )
    kmode = "embed" if mode == "stiefel" else "square"
    return K.lowrank_apply(U, T, None, xp, transpose=False, mode=kmode)


def stiefel_vjp(V: Any, A_bar: Any, r: int, xp: Any) -> Any:
    """Backward of V ↦ Q E_r for the cotangent A_bar (..., N, r)."""
    N, k = V.shape[-2], V.shape[-1]
    mode = side_mode(N, k, r)
    if mode == "identity":
        return xp.zeros_like(V)
    U, T, rn = factors(V, xp)
    h = xp.eye(N, r, dtype=V.dtype, device=device_of(V)) if mode == "pad" else None
    kmode = "embed" if mode == "stiefel" else "square"
    U_bar, _, _, S_bar = K.lowrank_vjp(U, T, h, A_bar, xp, transpose=False, mode=kmode)
    return K.factors_vjp(U, rn, U_bar, S_bar, xp)


def apply_vjp_core(xp: Any, U_vecs: Any, sigma: Any, V_vecs: Any, x: Any, g: Any) -> Any:
    """(Ū, σ̄, V̄, x̄) of W x; ``sigma`` is the diagonal d of Σ (complex d = σ e^{iθ} in the
    complex case: then σ̄ is d̄ = Σ_b c̄ conj(a), and ā = conj(d) c̄)."""
    r = min(U_vecs.shape[-2], V_vecs.shape[-2])
    a = project(V_vecs, x, r, xp)
    c = sigma[..., :, None] * a
    U_bar, c_bar = embed_vjp(U_vecs, c, g, r, xp)
    s_bar = sum_to_shape(xp.sum(c_bar * conj(a, xp), axis=-1), tuple(sigma.shape), xp)
    V_bar, x_bar = project_vjp(V_vecs, x, conj(sigma, xp)[..., :, None] * c_bar, r, xp)
    return U_bar, s_bar, V_bar, x_bar


def matrix_vjp_core(xp: Any, U_vecs: Any, sigma: Any, V_vecs: Any, G: Any) -> Any:
    """(Ū, d̄, V̄) of W = A diag(d) Bᴴ: Ā = G B diag(conj d), B̄ = Gᴴ A diag(d),
    d̄_i = (Aᴴ G B)_ii (``sigma`` is d; real for real W)."""
    r = min(U_vecs.shape[-2], V_vecs.shape[-2])
    A = stiefel(U_vecs, r, xp)
    B = stiefel(V_vecs, r, xp)
    GB = G @ B
    GtA = mH(G, xp) @ A
    s_bar = sum_to_shape(xp.sum(conj(A, xp) * GB, axis=-2), tuple(sigma.shape), xp)
    s_row = sigma[..., None, :]
    U_bar = stiefel_vjp(U_vecs, GB * conj(s_row, xp), r, xp)
    V_bar = stiefel_vjp(V_vecs, GtA * s_row, r, xp)
    return U_bar, s_bar, V_bar
