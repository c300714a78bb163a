"""Forward-mode derivatives (JVPs) of the compact WY factors V ↦ (U, T) and of the low-rank
apply, for lineax (a solve's derivative) and torch's forward mode (``jvp`` of the Functions).

Per column u = v/‖v‖, S = ½I + striu(UᴴU), T = S⁻¹ (Likhosherstov et al., AISTATS 2021,
Theorem 2): du = (dv − u·Re(uᴴdv))/‖v‖ (0 for a zero column), dS = striu(dUᴴU + UᴴdU),
dT = −T dS T; the products are multilinear in (U, T, h). Linear in the tangents, so JAX
transposes them for reverse mode (derivations: ``docs/theory/vjp.rst``, "Forward mode").
"""

from __future__ import annotations

from typing import Any

from .._lib.linalg import eye_like, where0
from .._lib.namespace import conj, device_of, is_complex, mH
from .compact_wy import cwy_factors, residual, roles


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
    dU, dT, _ = factor_tangents(U, T, r, dV, xp, dsdiag)
    return (U, T), (dU, dT)


def factor_tangents(
    U: Any, T: Any, r: Any, dV: Any, xp: Any, dsdiag: Any = None
) -> tuple[Any, Any, Any]:
    """(dU, dT, dr) at the factors ``(U, T, r)`` of :func:`cwy_factors` along ``dV`` (and
    the diagonal's tangent ``dsdiag``, or None). Cost 4·N·L² + 2·L³ flops."""
    nonzero = r > 0
    r_safe = xp.where(nonzero, r, xp.ones_like(r))
    proj = xp.sum(conj(U, xp) * dV, axis=-2, keepdims=True)
    proj = xp.real(proj) if is_complex(proj.dtype) else proj
    dU = where0(xp, nonzero, (dV - U * proj) / r_safe)
    P = mH(dU, xp) @ U
    dS = xp.triu(P + mH(P, xp), k=1)
    if dsdiag is not None:
        eye = eye_like(xp, T.shape[-1], dS.dtype, device_of(U))
        dS = dS + eye * xp.astype(dsdiag, dS.dtype)[..., None, :]
    dT = -(T @ (dS @ T))
    return dU, dT, proj


def lowrank_jvp(
    U: Any, T: Any, h: Any, dU: Any, dT: Any, dh: Any, xp: Any, *, transpose: bool, mode: str
) -> Any:
    """dy of y = R(h) − U_out M U_inᴴ h (:func:`~householderla._agnostic.compact_wy.
    lowrank_apply`) along (dU, dT, dh) (None: no tangent): the roles are linear in (U, T),
    so dy = R(dh) − dU_out b − U_out (dM a + M da), a = U_inᴴh, b = M a,
    da = dU_inᴴh + U_inᴴdh. Cost ≈ 2× the apply."""
    M, U_in, U_out = roles(U, T, transpose, mode, xp)
    dU = xp.zeros_like(U) if dU is None else dU
    dM, dU_in, dU_out = roles(dU, xp.zeros_like(T) if dT is None else dT, transpose, mode, xp)
    a = mH(U_in, xp) if h is None else mH(U_in, xp) @ h
    da = mH(dU_in, xp) if h is None else mH(dU_in, xp) @ h
    if dh is not None:
        da = da + mH(U_in, xp) @ dh
    dub = dU_out @ (M @ a) + U_out @ (dM @ a + M @ da)
    if dh is None:  # R(0) = 0 in every mode: dy = −dU_out b − U_out db
        return -dub
    return residual(dh, dub, U_out.shape[-2], mode, xp)
