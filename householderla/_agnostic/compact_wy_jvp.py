"""Forward-mode derivative (JVP) of the compact WY factors V ↦ (U, T).

lineax differentiates a linear solve by the JVP of the operator (its ``TangentLinearOperator``)
and gets reverse mode by transposing that JVP, so an operator handed to lineax needs a JVP
rule, not the VJP rules of :mod:`householderla._autodiff.jax`. The factors are the only
non-linear part of a CWY / T-CWY operator: once (U, T) are known, every product
R(h) − U_out M U_inᵀ h (:func:`~householderla._agnostic.compact_wy.lowrank_apply`) is bilinear
in (U, T) and h, and JAX differentiates it exactly. Derivation (``docs/jax_ecosystem.rst``),
per column u = v/‖v‖ and with S = ½I + striu(UᵀU), T = S⁻¹ (Likhosherstov et al., AISTATS
2021, Theorem 2):

    du = (dv − u (uᵀdv)) / ‖v‖            (0 for a zero column, as H(0) = I has no derivative)
    dS = striu(dUᵀU + UᵀdU)
    dT = −T dS T                          (d(S⁻¹) = −S⁻¹ dS S⁻¹)

The tangent (dU, dT) is linear in dV, so JAX transposes it for reverse mode. Cost on top of
the factors: 2·N·L² (dUᵀU) + 2·L³ (two triangular-times-full products) flops.
"""

from __future__ import annotations

from typing import Any

from .._lib.linalg import where0
from .._lib.namespace import mT
from .compact_wy import cwy_factors


def factors_jvp(V: Any, dV: Any, xp: Any) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """``(U, T)`` of ``V`` (..., N, L) and their tangents ``(dU, dT)`` along ``dV``.

    Values as :func:`~householderla._agnostic.compact_wy.cwy_factors` (no value checks: this
    runs under tracing); tangents in ``V``'s dtype.
    """
    U, T, r = cwy_factors(V, xp, check=False)
    nonzero = r > 0
    r_safe = xp.where(nonzero, r, xp.ones_like(r))
    proj = xp.sum(U * dV, axis=-2, keepdims=True)
    dU = where0(xp, nonzero, (dV - U * proj) / r_safe)
    P = mT(dU) @ U
    dS = xp.triu(P + mT(P), k=1)
    dT = -(T @ (dS @ T))
    return (U, T), (dU, dT)
