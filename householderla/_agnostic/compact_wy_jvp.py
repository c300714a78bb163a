"""Forward-mode derivative (JVP) of the compact WY factors V ↦ (U, T), for lineax.

lineax differentiates a solve by the operator's JVP; the factors are the only non-linear part
of a CWY / T-CWY operator (the products are bilinear in (U, T) and h). Per column u = v/‖v‖,
S = ½I + striu(UᵀU), T = S⁻¹ (Likhosherstov et al., AISTATS 2021, Theorem 2):
du = (dv − u(uᵀdv))/‖v‖ (0 for a zero column), dS = striu(dUᵀU + UᵀdU), dT = −T dS T.
Linear in dV, so JAX transposes it for reverse mode (derivation: ``docs/jax_ecosystem.rst``).
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
