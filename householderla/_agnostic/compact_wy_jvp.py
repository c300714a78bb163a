"""Forward-mode derivative (JVP) of the compact WY factors V ↦ (U, T), for lineax.

lineax differentiates a solve by the operator's JVP; the factors are the only non-linear part
of a CWY / T-CWY operator (the products are bilinear in (U, T) and h). Per column u = v/‖v‖,
S = ½I + striu(UᴴU), T = S⁻¹ (Likhosherstov et al., AISTATS 2021, Theorem 2):
du = (dv − u·Re(uᴴdv))/‖v‖ (0 for a zero column), dS = striu(dUᴴU + UᴴdU), dT = −T dS T.
Linear in dV, so JAX transposes it for reverse mode (derivation: ``docs/jax_ecosystem.rst``).
"""

from __future__ import annotations

from typing import Any

from .._lib.linalg import eye_like, where0
from .._lib.namespace import conj, device_of, is_complex, mH
from .compact_wy import cwy_factors


def factors_jvp(
    V: Any, dV: Any, xp: Any, sdiag: Any = None, dsdiag: Any = None
) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """``(U, T)`` of ``V`` (..., N, L) and their tangents ``(dU, dT)`` along ``dV`` (and, for
    a given diagonal ``sdiag`` of S, along its tangent ``dsdiag``; None: no tangent).

    Values as :func:`~householderla._agnostic.compact_wy.cwy_factors` (no value checks: this
    runs under tracing); tangents in ``V``'s dtype. Complex V: dr = Re(uᴴdv), so
    du = (dv − u·Re(uᴴdv))/‖v‖, and dS = diag(dsdiag) + striu(dUᴴU + UᴴdU).
    """
    U, T, r = cwy_factors(V, xp, check=False, sdiag=sdiag)
    nonzero = r > 0
    r_safe = xp.where(nonzero, r, xp.ones_like(r))
    proj = xp.sum(conj(U, xp) * dV, axis=-2, keepdims=True)
    proj = xp.real(proj) if is_complex(proj.dtype) else proj
    dU = where0(xp, nonzero, (dV - U * proj) / r_safe)
    P = mH(dU, xp) @ U
    dS = xp.triu(P + mH(P, xp), k=1)
    if dsdiag is not None:
        eye = eye_like(xp, T.shape[-1], dS.dtype, device_of(V))
        dS = dS + eye * xp.astype(dsdiag, dS.dtype)[..., None, :]
    dT = -(T @ (dS @ T))
    return (U, T), (dU, dT)
