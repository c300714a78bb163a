"""The diagonal phase factor D(θ) = diag(e^{iθ₁}, …, e^{iθ_K}) of unitary operators.

A product of Hermitian reflections has determinant ±1 and its Householder QR leaves a unit
complex number on each diagonal entry of R, so reaching all of U(N) (and the complex Stiefel
manifold) takes a diagonal of phases on the right: Q = H(v₁)…H(v_L) D(θ) (Mhammedi et al.,
ICML 2017, §4.3, Corollary 1, whose Ĥ₁(θ) is D(θ)). Applying D costs K·B multiplications.

VJPs (cotangents ∂L/∂Re + i ∂L/∂Im, real θ): for z = D(θ) h, h̄ = D(θ)ᴴ z̄ and
θ̄_k = −Σ_b Im(conj(z̄_kb) z_kb), from dz_k = i z_k dθ_k; the same formula serves
y = D(θ)ᴴ w with (z, z̄) = (y, ȳ) and a minus sign, since dy_k = −i y_k dθ_k.
"""

from __future__ import annotations

from typing import Any

from .._lib.linalg import sum_to_shape
from .._lib.namespace import complex_dtype
from . import compact_wy as K

__all__ = ["apply_vjp", "matrix_vjp", "phase_factor", "phase_vjp"]


def phase_factor(theta: Any, xp: Any) -> Any:
    """e^{iθ} (..., K) for real θ (..., K), in the complex dtype of θ's precision."""
    return xp.exp(xp.astype(theta, complex_dtype(xp, theta.dtype)) * 1j)


def phase_vjp(z: Any, z_bar: Any, xp: Any) -> Any:
    """θ̄ (..., K) of z = D(θ) h (..., K, B) for the cotangent z̄ of z: −Σ_b Im(conj(z̄) z)."""
    return -xp.sum(xp.imag(xp.conj(z_bar) * z), axis=-1)


def apply_vjp(
    U: Any, T: Any, r: Any, p: Any, h: Any, g: Any, xp: Any, *, transpose: bool, mode: str
) -> tuple[Any, Any, Any]:
    """(V̄, h̄, θ̄ before summing broadcast axes) of y = Q₀ D h (``transpose``: y = Dᴴ Q₀ᴴ h),
    Q₀ the CWY/T-CWY map of the factors (U, T, r) in ``mode``, D = diag(p), p = e^{iθ}.

    Forward direction: z = D h, (V̄, z̄) from the CWY backward, h̄ = Dᴴ z̄, θ̄ = phase_vjp(z, z̄).
    Transposed: w = Q₀ᴴ h (one more apply, 4·N·L·B flops), w̄ = D g, (V̄, h̄) from the CWY
    backward at w̄, θ̄ = −phase_vjp(w, w̄) (dy = −i y dθ and conj(g) y = conj(w̄) w).
    """
    pc = p[..., :, None]
    if transpose:
        w = K.lowrank_apply(U, T, h, xp, transpose=True, mode=mode)
        w_bar = pc * g
        U_bar, h_bar, _, S_bar = K.lowrank_vjp(U, T, h, w_bar, xp, transpose=True, mode=mode)
        t_bar = -phase_vjp(w, w_bar, xp)
    else:
        z = pc * h
        U_bar, z_bar, _, S_bar = K.lowrank_vjp(U, T, z, g, xp, transpose=False, mode=mode)
        h_bar = sum_to_shape(xp.conj(pc) * z_bar, tuple(h.shape), xp)
        t_bar = phase_vjp(z, z_bar, xp)
    return K.factors_vjp(U, r, U_bar, S_bar, xp), h_bar, t_bar


def matrix_vjp(U: Any, T: Any, r: Any, p: Any, G: Any, xp: Any, *, mode: str) -> tuple[Any, Any]:
    """(V̄, θ̄) of Q = Q₀ D (the dense matrix, columns scaled by p = e^{iθ}) for the cotangent
    G: Q̄₀ = G Dᴴ and θ̄_k = −Σ_i Im(conj(G_ik) Q_ik) (dQ_ik = i Q_ik dθ_k); forms Q₀ once
    (2·N²·L flops) besides the CWY matrix backward."""
    Q = K.lowrank_apply(U, T, None, xp, transpose=False, mode=mode) * p[..., None, :]
    t_bar = -xp.sum(xp.imag(xp.conj(G) * Q), axis=-2)
    U_bar, _, _, S_bar = K.lowrank_vjp(
        U, T, None, G * xp.conj(p)[..., None, :], xp, transpose=False, mode=mode
    )
    return K.factors_vjp(U, r, U_bar, S_bar, xp), t_bar
