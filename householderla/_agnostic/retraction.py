"""Backend-neutral kernels of the Cayley (SMW), QR and polar retractions and their VJPs.

Cayley (Likhosherstov et al., AISTATS 2021, App. B, Lemma 1): A = G̃Xᴴ − XG̃ᴴ = B Cᴴ with
B = η[G̃, sX], C = [X, −G̃/s], so Cayley(ηA) X = X − B K⁻¹ CᴴX, K = I + ½CᴴB (2M × 2M), from
XᴴX, XᴴG and GᴴG only: 10·N·M² flops, no N × N matrix. Canonical or Euclidean metric; complex
X with ᵀ → ᴴ (``docs/theory/retractions.rst``, ``docs/theory/complex.rst``). Every function
takes ``xp`` explicitly and works in the dtype it is given.
"""

from __future__ import annotations

from typing import Any

import array_api_compat as aac
import numpy as np

from .._lib.jit import select
from .._lib.linalg import abs2, eye_like, inv_upper_triangular, own_numpy, real_dot
from .._lib.namespace import (
    accumulation_dtype,
    complex_dtype,
    device_of,
    is_complex,
    is_half,
    mH,
    real_dtype,
)
from .._lib.tracing import is_eager


def gram(X: Any, xp: Any) -> Any:
    """XᴴX (..., M, M), exactly Hermitian (XᵀX, symmetric, for real X)."""
    A = mH(X, xp) @ X
    return 0.5 * (A + mH(A, xp))


def step_sum(xp: Any, X: Any, Z: Any, t: Any) -> Any:
    """X + tZ; in float32 for half-precision X: a half-precision sum would drop every
    part of the step below u·|X| (a step of 10⁻³·|X| entirely in bfloat16)."""
    if is_half(xp, X.dtype):
        work = accumulation_dtype(xp, X.dtype)
        X, Z = xp.astype(X, work), xp.astype(Z, work)
    return X + t * Z


def power_of_two_max(A: Any, xp: Any) -> Any:
    """2^round(log₂ max|A|) per matrix, shape (..., 1, 1) (1 for A = 0): dividing by it is
    exact and brings the entries to about 1, so Gram products neither overflow nor
    underflow. Its derivative is 0 almost everywhere, so autodiff passes through."""
    m = xp.max(xp.abs(A), axis=(-2, -1), keepdims=True)
    e = xp.round(xp.log2(xp.where(m > 0, m, xp.ones_like(m))))
    return 2.0**e


def inner(A: Any, B: Any, xp: Any) -> Any:
    """⟨A, B⟩ = Re tr(AᴴB) per matrix (the real inner product in which complex cotangents
    are taken, ``docs/theory/complex.rst``), real, shape (...)."""
    return real_dot(A, B, xp, axis=(-2, -1))[..., 0, 0]


def sq_norm(A: Any, xp: Any) -> Any:
    """‖A‖_F² per matrix, real, shape (...)."""
    return xp.sum(abs2(A, xp), axis=(-2, -1))


def _trace(A: Any, xp: Any) -> Any:
    eye = eye_like(xp, A.shape[-1], A.dtype, device_of(A))
    return xp.sum(A * eye, axis=(-2, -1))


def _balance(GtG: Any, xp: Any) -> Any:
    """s = a power of two near the RMS column norm of G̃ (1 for G̃ = 0), shape (..., 1, 1):
    balances the blocks of K; the result does not depend on s, and powers of two are exact."""
    m = _trace(GtG, xp)
    m = (xp.real(m) if is_complex(m.dtype) else m) / GtG.shape[-1]  # a Hermitian trace
    pos = m > 0
    e = xp.round(0.5 * xp.log2(xp.where(pos, m, xp.ones_like(m))))
    return (2.0**e)[..., None, None]


def cayley_parts(X: Any, G: Any, step: Any, euclidean: bool, xp: Any) -> dict[str, Any]:
    """Small matrices of the SMW Cayley step (``step`` a float or (..., 1, 1) array)."""
    P = gram(X, xp)
    W0 = mH(X, xp) @ G
    GG = gram(G, xp)
    if euclidean:
        PW0 = P @ W0
        W0h = mH(W0, xp)
        W = W0 - 0.5 * PW0  # XᴴG̃
        GtG = GG - W0h @ W0 + 0.25 * (W0h @ PW0)  # G̃ᴴG̃
        GtG = 0.5 * (GtG + mH(GtG, xp))
    else:
        W, GtG = W0, GG
    d = _smw(P, W, GtG, step, xp)
    # U = G̃W₁ + sXW₂ = G W₁ + X c,  c = sW₂ − ½ε W₀W₁
    if euclidean:
        d["c"] = d["c"] - 0.5 * (W0 @ d["W1"])
    return {**d, "W0": W0, "GG": GG}


def _smw(P: Any, W: Any, GtG: Any, step: Any, xp: Any) -> dict[str, Any]:
    """The 2M × 2M solve of the SMW Cayley step from P = XᴴX, W = XᴴG̃ and G̃ᴴG̃: K, the
    halves W₁, W₂ of K⁻¹[P; −Wᴴ/s], c = sW₂ and the balance s."""
    s = _balance(GtG, xp)
    M = P.shape[-1]
    eye2 = eye_like(xp, 2 * M, P.dtype, device_of(P))
    Wh = mH(W, xp)
    CtB = xp.concat([xp.concat([W, s * P], axis=-1), xp.concat([-GtG / s, -Wh], axis=-1)], axis=-2)
    K = eye2 + (0.5 * step) * CtB
    R0 = xp.concat([P, -Wh / s], axis=-2)
    Sol = xp.linalg.solve(K, R0)
    W1, W2 = Sol[..., :M, :], Sol[..., M:, :]
    return {"P": P, "s": s, "K": K, "W1": W1, "W2": W2, "c": s * W2}


def cayley_forward(X: Any, G: Any, step: Any, euclidean: bool, xp: Any) -> tuple[Any, Any]:
    """Y = Cayley(step·A) X by SMW, and P = XᵀX (for the drift check)."""
    d = cayley_parts(X, G, step, euclidean, xp)
    U = G @ d["W1"] + X @ d["c"]
    return X - step * U, d["P"]


def tangent_lift(X: Any, Z: Any, xp: Any) -> Any:
    """G = −(I − ½XXᴴ)Z: the Cayley kernels' A = GXᴴ − XGᴴ is then −W for the canonical
    skew(-Hermitian) lift W = ẐXᴴ − XẐᴴ of the direction Z, so Cayley(ηA)X moves along +Z."""
    return 0.5 * (X @ (mH(X, xp) @ Z)) - Z


def tangent_lift_vjp(X: Any, Z: Any, G_bar: Any, xp: Any) -> tuple[Any, Any]:
    """(X̄, Z̄) of G = ½X(XᴴZ) − Z: Z̄ = ½X(XᴴḠ) − Ḡ, X̄ = ½(Ḡ ZᴴX + Z ḠᴴX)."""
    Z_bar = 0.5 * (X @ (mH(X, xp) @ G_bar)) - G_bar
    X_bar = 0.5 * (G_bar @ (mH(Z, xp) @ X) + Z @ (mH(G_bar, xp) @ X))
    return X_bar, Z_bar


def cayley_along(X: Any, Z: Any, step: Any, xp: Any) -> tuple[Any, Any]:
    """(Cayley(step·W) X along the direction Z, max ‖XᴴX − I‖_F): the primal of every
    autodiff rule of ``cayley_retraction``.

    SMW from Gram products only: with A = XᴴZ and G = ½XA − Z (:func:`tangent_lift`),
    XᴴG = ½PA − A and GᴴG = ¼AᴴPA − AᴴA + ZᴴZ, so Y = X − step(GW₁ + Xc) =
    X + (X(−step(½AW₁ + c)) + Z(step·W₁)): two N × M products, G never formed (peak memory
    two N × M arrays). Checked: Cayley(step·W) is unitary, so YᴴY = XᴴX; when
    ‖YᴴY − XᴴX‖_F exceeds :data:`SMW_CHECK`·√M·u·max(1, ‖XᴴX‖_F) (a singular or
    ill-conditioned K: columns of Z at very different scales), the solve fails, or
    |step|·‖G‖_F > u^(-1/4) (huge steps), Y is recomputed by :func:`cayley_basis`
    (2·N·M² more flops for the check).
    """
    P = gram(X, xp)
    A = mH(X, xp) @ Z
    ZZ = gram(Z, xp)
    Ah = mH(A, xp)
    AhPA = Ah @ (P @ A)
    GG = 0.25 * AhPA - Ah @ A + ZZ
    GG = 0.5 * (GG + mH(GG, xp))
    eye = eye_like(xp, P.shape[-1], P.dtype, device_of(P))
    drift = xp.max(xp.sqrt(sq_norm(P - eye, xp)))
    eager = is_eager(X) and is_eager(Z) and (isinstance(step, float) or is_eager(step))
    # a huge step may overflow K or Y: the check below then fails (NaN) and Y is recomputed,
    # so NumPy's warnings on the way are not the caller's business
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        try:
            d = _smw(P, 0.5 * (P @ A) - A, GG, step, xp)
        except Exception as e:  # a singular K (NumPy's LinAlgError, torch's _LinAlgError)
            if not eager or not any("LinAlgError" in k.__name__ for k in type(e).__mro__):
                raise
            return cayley_basis(X, Z, step, xp), drift
        # Y = X + (X·a + Z·b): the step's part summed first, so the rounding stays
        # proportional to step·‖U‖ (Z = 0 or step = 0 returns X bit for bit); NumPy in place
        Y = X @ (-step * (0.5 * (A @ d["W1"]) + d["c"]))
        Zb = Z @ (step * d["W1"])
        if own_numpy(Y, Zb, X):
            Y += Zb
            del Zb
            Y += X
        else:
            Y = (Y + Zb) + X
        err = xp.max(xp.sqrt(sq_norm(gram(Y, xp) - P, xp)))
    scale = xp.maximum(xp.sqrt(xp.max(sq_norm(P, xp))), xp.ones_like(err))
    eps = xp.finfo(real_dtype(xp, X.dtype)).eps
    good = err <= SMW_CHECK * P.shape[-1] ** 0.5 * eps * scale  # False for NaN
    # beyond |t|·‖G‖_F = u^(-1/4) the SMW result, orthogonal or not, is Cayley of a W
    # perturbed by u·t‖W‖, which turns W's null space (N odd, or 2M < N) by up to u^(3/4)
    # and at t‖W‖ ≳ 1/u reflects it: the basis path keeps that null space fixed
    gn = xp.sqrt(xp.abs(_trace(GG, xp)))
    with np.errstate(over="ignore"):
        tg = abs(step) * gn if isinstance(step, float) else xp.abs(step) * gn[..., None, None]
    good = good & (xp.max(tg) <= eps**-0.25)
    if not eager and not aac.is_jax_namespace(xp):
        # torch.func.vmap / torch.compile (lazy values, where would run both branches):
        # the check is skipped, as the library's value checks are there
        return Y, drift
    return select(xp, eager, good, lambda: Y, lambda: cayley_basis(X, Z, step, xp)), drift


#: :func:`cayley_along` recomputes Y when ‖YᴴY − XᴴX‖_F > SMW_CHECK·√M·u·max(1, ‖XᴴX‖_F).
SMW_CHECK = 64.0


def cayley_basis(X: Any, Z: Any, step: Any, xp: Any) -> Any:
    """Cayley(step·W)X, W = ẐXᴴ − XẐᴴ, in an orthonormal basis of span[X, Ẑ]: unitary to
    rounding for every step (``docs/theory/retractions.rst``, "Cayley at the edges").

    [X, Ẑ] = QR (thin), S = R₂R₁ᴴ − R₁R₂ᴴ, so W = QSQᴴ and Cayley(tW)X = X + Q(C − I)R₁
    with C = Cayley(tS); iS = V diag(μ) Vᴴ (``eigh``) gives C − I = V diag(δ) Vᴴ,
    δ = −2iτ/(1 + iτ), τ = μt/2, evaluated without overflow (δ → −2 as |τ| → ∞: the limit
    I − 2Π on the range of W; δ = 0 for |μ| ≤ k·u·max|μ|, zero to rounding). Real X: C's
    real part and its polar factor (O(M³)). About 20·N·M² flops."""
    M = X.shape[-1]
    Zh = Z - 0.5 * (X @ (mH(X, xp) @ Z))
    Q, R = xp.linalg.qr(xp.concat([X, Zh], axis=-1))
    R1, R2 = R[..., :M], R[..., M:]
    S = R2 @ mH(R1, xp) - R1 @ mH(R2, xp)
    cdt = complex_dtype(xp, X.dtype)
    H = 1j * xp.astype(S, cdt)
    mu, V = xp.linalg.eigh(0.5 * (H + mH(H, xp)))
    hs = 0.5 * (step if isinstance(step, float) or step.ndim < 2 else step[..., 0])
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        tau = mu * hs  # ±inf beyond the range: the limit
        big = xp.abs(tau) > 1
        a = xp.where(big, 1 / xp.where(big, tau, xp.ones_like(tau)), tau)
        den = 1 + a * a
        re = xp.where(big, -2 * xp.ones_like(a), -2 * a * a) / den
        delta = xp.astype(re, cdt) + 1j * xp.astype(-2 * a / den, cdt)
    # |μ| ≤ k·u·max|μ| is zero to rounding (S's numerical null space): Cayley is I there,
    # which defines the t → ∞ limit (a huge t would turn the rounding into a reflection)
    k, u = S.shape[-1], xp.finfo(real_dtype(xp, X.dtype)).eps
    null = xp.abs(mu) <= (k * u) * xp.max(xp.abs(mu), axis=-1, keepdims=True)
    delta = xp.where(null, xp.zeros_like(delta), delta)
    if is_complex(X.dtype):
        F = V @ (delta[..., :, None] * (mH(V, xp) @ R1))
        return X + Q @ F
    # real: C = I + V diag(δ) Vᴴ is real only up to the eigenvectors' rounding, which a huge
    # t amplifies (by t·u·‖S‖ on S's numerical null space); its real part, made orthogonal
    # by its polar factor (an SVD of 2M × 2M), is a real orthogonal C to rounding
    eye = eye_like(xp, S.shape[-1], S.dtype, device_of(S))
    C = eye + xp.real(V @ (delta[..., :, None] * mH(V, xp)))
    Uc, _, Wch = xp.linalg.svd(C, full_matrices=False)
    return X + Q @ ((Uc @ Wch - eye) @ R1)


def cayley_along_vjp(X: Any, Z: Any, step: Any, Ybar: Any, xp: Any) -> tuple[Any, Any, Any]:
    """(X̄, Z̄, step_bar per matrix) of :func:`cayley_along`: :func:`cayley_vjp` through the
    lift G = ½X(XᵀZ) − Z."""
    Xbar, Gbar, sb = cayley_vjp(X, tangent_lift(X, Z, xp), step, Ybar, False, xp)
    Xb, Zbar = tangent_lift_vjp(X, Z, Gbar, xp)
    return Xbar + Xb, Zbar, sb


def cayley_along_jvp(X: Any, Z: Any, step: Any, dX: Any, dZ: Any, dstep: Any, xp: Any) -> Any:
    """dY of :func:`cayley_along` (the SMW map Y = Cayley(tA)X, A = GXᴴ − XGᴴ, G = ½X(XᴴZ) − Z)
    along (dX, dZ, dstep) (None: no tangent; ``dstep`` shaped as ``step``, real).

    With M = I + ½tA, Y = 2M⁻¹X − X and V = X + Y: dY = M⁻¹(2dX − ½d(tA)V) − dX, where
    d(tA)V = G(dt·XᴴV + t·dXᴴV) − X(dt·GᴴV + t·dGᴴV) + t(dG·XᴴV − dX·GᴴV) and M⁻¹R =
    R − ½B K⁻¹CᴴR by the forward's SMW factors (B = t[G, sX], C = [X, −G/s]). Every N × M
    matrix is X·x + G·g + dX·a + dG·b with small coefficients, so the N-sized work is the
    forward's Gram products, dG, four Grams of [X, G] with [dX, dG] and one N × 4M by 4M × M
    product: 34·N·M² + O(M³) flops, no N × N matrix (``docs/theory/vjp.rst``, "Forward
    mode"). ᴴ = ᵀ for real X; t and dt real.
    """
    dX = xp.zeros_like(X) if dX is None else dX
    dZ = xp.zeros_like(Z) if dZ is None else dZ
    A = mH(X, xp) @ Z
    G = 0.5 * (X @ A) - Z  # tangent_lift
    # dG = ½dX(XᴴZ) + ½X(dXᴴZ + XᴴdZ) − dZ
    dG = 0.5 * (dX @ A + X @ (mH(dX, xp) @ Z + mH(X, xp) @ dZ)) - dZ
    d = cayley_parts(X, G, step, False, xp)
    P, W0, GG, s, K, W1, c = (d[k] for k in ("P", "W0", "GG", "s", "K", "W1", "c"))
    t = step
    dt = 0.0 if dstep is None else dstep
    M = X.shape[-1]
    eye = eye_like(xp, M, X.dtype, device_of(X))

    def h(a: Any) -> Any:
        return mH(a, xp)

    H = h(xp.concat([X, G], axis=-1)) @ xp.concat([dX, dG], axis=-1)
    XdX, XdG, GdX, GdG = H[..., :M, :M], H[..., :M, M:], H[..., M:, :M], H[..., M:, M:]
    # Y = X − t(G W₁ + X c): the Grams of V = X + Y with X, G, dX, dG
    XV = 2.0 * P - t * (W0 @ W1 + P @ c)
    GV = 2.0 * h(W0) - t * (GG @ W1 + h(W0) @ c)
    dXV = 2.0 * h(XdX) - t * (h(GdX) @ W1 + h(XdX) @ c)
    dGV = 2.0 * h(XdG) - t * (h(GdG) @ W1 + h(XdG) @ c)
    # R = 2dX − ½d(tA)V = X·rx + G·rg + dX·ra + dG·rb
    rx = 0.5 * (dt * GV + t * dGV)
    rg = -0.5 * (dt * XV + t * dXV)
    ra = 2.0 * eye + (0.5 * t) * GV
    rb = (-0.5 * t) * XV
    XR = P @ rx + W0 @ rg + XdX @ ra + XdG @ rb
    GR = h(W0) @ rx + GG @ rg + GdX @ ra + GdG @ rb
    Sol = xp.linalg.solve(K, xp.concat([XR, -GR / s], axis=-2))  # K⁻¹CᴴR
    S1, S2 = Sol[..., :M, :], Sol[..., M:, :]
    # dY = R − ½t(G S₁ + sX S₂) − dX
    coef = xp.concat([rx - (0.5 * t * s) * S2, rg - (0.5 * t) * S1, ra - eye, rb], axis=-2)
    return xp.concat([X, G, dX, dG], axis=-1) @ coef


def cayley_with_drift(X: Any, G: Any, step: Any, euclidean: bool, xp: Any) -> tuple[Any, Any]:
    """(Cayley(step·A) X by SMW, max ‖XᴴX − I‖_F over the batch): the drift feeds the
    orthogonality guard of ``cayley_retraction`` and is not differentiated."""
    Y, P = cayley_forward(X, G, step, euclidean, xp)
    E = P - eye_like(xp, P.shape[-1], P.dtype, device_of(P))
    return Y, xp.max(xp.sqrt(sq_norm(E, xp)))


def cayley_vjp(
    X: Any, G: Any, step: Any, Ybar: Any, euclidean: bool, xp: Any
) -> tuple[Any, Any, Any]:
    """(X̄, Ḡ, η̄ per batch element) of Y = X − B K⁻¹ CᴴX (ᴴ = ᵀ for real arrays; η̄ real).

    With Λ = K⁻ᴴBᴴȲ, D = ½CΛ − Ȳ and V = X + Y:  X̄ = Ȳ − CΛ + ηs D W₂ᴴ − ½V Λ₁ᴴ,
    Ḡ̃ = η D W₁ᴴ + ½ V Λ₂ᴴ/s,  η̄ = ⟨D, U⟩; Euclidean: Ḡ = Ḡ̃ − ½X XᴴḠ̃ and
    X̄ −= ½(Ḡ̃ W₀ᴴ + G Ḡ̃ᴴX). Every N × M matrix is kept as X·x + G·g + Ȳ·y with small
    coefficients, so the backward costs [X G]ᵀȲ and one N × 3M by 3M × 2M product on top
    of the forward's three Gram products: 22·N·M² flops (the forward: 10·N·M²).
    """
    d = cayley_parts(X, G, step, euclidean, xp)
    P, W0, GG, s, K, W1, W2, c = (d[k] for k in ("P", "W0", "GG", "s", "K", "W1", "W2", "c"))
    M = X.shape[-1]
    eye = eye_like(xp, M, X.dtype, device_of(X))
    zero = xp.zeros_like(P)
    e = 1.0 if euclidean else 0.0

    def h(a: Any) -> Any:
        return mH(a, xp)

    H = h(xp.concat([X, G], axis=-1)) @ Ybar
    Hx, Hg = H[..., :M, :], H[..., M:, :]  # XᴴȲ, GᴴȲ
    BtY = step * xp.concat([Hg - 0.5 * e * (h(W0) @ Hx), s * Hx], axis=-2)  # BᴴȲ
    Lam = xp.linalg.solve(h(K), BtY)
    L1, L2 = Lam[..., :M, :], Lam[..., M:, :]

    def mul(t: tuple[Any, ...], m: Any) -> tuple[Any, ...]:
        return tuple(a @ m for a in t)

    def add(*ts: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(sum(parts[1:], parts[0]) for parts in zip(*ts, strict=True))

    def xt(t: tuple[Any, ...]) -> Any:  # Xᴴ(X·x + G·g + Ȳ·y)
        return P @ t[0] + W0 @ t[1] + Hx @ t[2]

    # triples (x, g, y) stand for the N × M matrix X·x + G·g + Ȳ·y
    U = (c, W1, zero)
    V = (2.0 * eye - step * c, -step * W1, zero)
    CL = (L1 + (0.5 * e) * (W0 @ L2) / s, -L2 / s, zero)
    D = (0.5 * CL[0], 0.5 * CL[1], -eye)
    Xbar = add((-CL[0], -CL[1], eye), mul(D, (step * s) * h(W2)), mul(V, -0.5 * h(L1)))
    Gbar = add(mul(D, step * h(W1)), mul(V, (0.5 / s) * h(L2)))
    if euclidean:
        XtGbar = xt(Gbar)
        Xbar = add(Xbar, mul(Gbar, -0.5 * h(W0)), (zero, -0.5 * h(XtGbar), zero))
        Gbar = add(Gbar, (-0.5 * XtGbar, zero, zero))
    # η̄ = ⟨D, U⟩ = Re tr(DᴴU) through the Gram matrix of the basis [X, G, Ȳ] (U has no Ȳ
    # part): Σ_k ⟨d_k, (basis_k)ᴴU⟩
    gx = P @ U[0] + W0 @ U[1]
    gg = h(W0) @ U[0] + GG @ U[1]
    gy = h(Hx) @ U[0] + h(Hg) @ U[1]
    step_bar = inner(D[0], gx, xp) + inner(D[1], gg, xp) + inner(D[2], gy, xp)
    coef = xp.concat([xp.concat([a, b], axis=-1) for a, b in zip(Xbar, Gbar, strict=True)], axis=-2)
    out = xp.concat([X, G, Ybar], axis=-1) @ coef
    return out[..., :M], out[..., M:], step_bar


def qr_positive(Y: Any, xp: Any) -> tuple[Any, Any]:
    """Thin QR with R's diagonal real and ≥ 0 (a zero diagonal entry keeps its column).

    Real: columns of Q (rows of R) with r_kk < 0 are negated. Complex: Q ← Q·diag(φ),
    R ← diag(φ̄)R with the phases φ_k = r_kk/|r_kk| (Y = QR is unchanged, diag(φ̄)R has the
    diagonal |r_kk|)."""
    Q, R = xp.linalg.qr(Y)
    eye = eye_like(xp, R.shape[-1], R.dtype, device_of(R))
    d = xp.sum(R * eye, axis=-1)
    if is_complex(d.dtype):
        a = xp.abs(d)
        ph = xp.where(a > 0, d / xp.astype(xp.where(a > 0, a, xp.ones_like(a)), d.dtype), 1.0)
        return Q * ph[..., None, :], R * xp.conj(ph)[..., :, None]
    sgn = xp.where(d < 0, -xp.ones_like(d), xp.ones_like(d))
    return Q * sgn[..., None, :], R * sgn[..., :, None]


def qr_vjp(Y: Any, Qbar: Any, xp: Any) -> Any:
    """Ȳ of Y ↦ qf(Y) (diagonal of R real positive): Ȳ = (Q̄ − Q F) R⁻ᴴ with E = QᴴQ̄ and
    F = triu(E, 1) + diag(Re E) + tril(Eᴴ, −1) (= triu(E) + tril(Eᵀ, −1) for real Y).
    2·M²(N − M/3)·2 (QR) + 6·N·M² flops, no N × N matrix."""
    Q, R = qr_positive(Y, xp)
    E = mH(Q, xp) @ Qbar
    Eh = mH(E, xp)
    F = xp.triu(E) + xp.tril(Eh, k=-1)
    if is_complex(E.dtype):  # the diagonal's imaginary part is the phase gauge: removed
        eye = eye_like(xp, E.shape[-1], E.dtype, device_of(E))
        F = F - 0.5 * (E - Eh) * eye
    return (Qbar - Q @ F) @ mH(inv_upper_triangular(R, xp), xp)


def polar_vjp(X: Any, Qbar: Any, xp: Any) -> tuple[Any, Any]:
    """X̄ of X ↦ X P⁻¹, P = (XᴴX)^{1/2}: X̄ = Q̄P⁻¹ − 2XΩ with PΩ + ΩP = herm(P⁻¹XᴴQ̄P⁻¹),
    solved in the eigenbasis of XᴴX = V diag(σ²) Vᴴ: Ω̃_ij = herm(VᴴXᴴQ̄V)_ij /
    (σ_iσ_j(σ_i + σ_j)) (ᴴ = ᵀ for real X). Returns (X̄, σ). 8·N·M² + O(M³) flops."""
    lam, V = xp.linalg.eigh(gram(X, xp))
    sig = xp.sqrt(xp.maximum(lam, xp.zeros_like(lam)))
    F = mH(V, xp) @ ((mH(X, xp) @ Qbar) @ V)
    Fs = 0.5 * (F + mH(F, xp))
    si, sj = sig[..., :, None], sig[..., None, :]
    den = si * sj * (si + sj)
    Om = Fs / xp.where(den > 0, den, xp.ones_like(den))  # rank-deficient X: caller raises
    Vh = mH(V, xp)
    Pinv = (V / xp.where(sj > 0, sj, xp.ones_like(sj))) @ Vh
    Xbar = Qbar @ Pinv - X @ (2.0 * (V @ (Om @ Vh)))
    return Xbar, sig


def polar_jvp(X: Any, dX: Any, xp: Any) -> Any:
    """dQ of Q = X P⁻¹, P = (XᴴX)^{1/2}, along dX: dQ = dX P⁻¹ − X P⁻¹ dP P⁻¹ with
    P dP + dP P = dXᴴX + XᴴdX = E, in the eigenbasis of XᴴX = V diag(σ²) Vᴴ:
    dQ = dX P⁻¹ − X V (Ẽ_ij / (σ_iσ_j(σ_i + σ_j))) Vᴴ, Ẽ = VᴴEV (ᴴ = ᵀ for real X).
    Wide X: the transpose's (polar(Xᴴ) = polar(X)ᴴ). 8·N·M² + O(M³) flops."""
    if X.shape[-2] < X.shape[-1]:
        return mH(polar_jvp(mH(X, xp), mH(dX, xp), xp), xp)
    lam, V = xp.linalg.eigh(gram(X, xp))
    sig = xp.sqrt(xp.maximum(lam, xp.zeros_like(lam)))
    Vh = mH(V, xp)
    W = mH(dX, xp) @ X
    Et = Vh @ ((W + mH(W, xp)) @ V)
    si, sj = sig[..., :, None], sig[..., None, :]
    den = si * sj * (si + sj)
    D = Et / xp.where(den > 0, den, xp.ones_like(den))  # rank-deficient X: caller raises
    Pinv = (V / xp.where(sj > 0, sj, xp.ones_like(sj))) @ Vh
    return dX @ Pinv - X @ (V @ (D @ Vh))


def qr_jvp(Y: Any, dY: Any, xp: Any) -> Any:
    """dQ of Y ↦ qf(Y) (diag(R) real ≥ 0) along dY: C = QᴴdY R⁻¹ = Ω + dR R⁻¹ with Ω = QᴴdQ
    skew-Hermitian and dR R⁻¹ upper triangular with a real diagonal, so Ω = L − Lᴴ + i·Im
    diag(C), L = tril(C, −1); then dQ = dY R⁻¹ − Q (C − Ω). 2·M²(N − M/3)·2 (QR) + 6·N·M²."""
    Q, R = qr_positive(Y, xp)
    Rinv = inv_upper_triangular(R, xp)
    A = dY @ Rinv
    C = mH(Q, xp) @ A
    Lo = xp.tril(C, k=-1)
    Om = Lo - mH(Lo, xp)
    if is_complex(C.dtype):  # the diagonal's imaginary part: the phase of column k moves
        eye = eye_like(xp, C.shape[-1], C.dtype, device_of(C))
        Om = Om + 0.5 * (C - mH(C, xp)) * eye
    return A - Q @ (C - Om)


def riemannian_gradient(X: Any, G: Any, euclidean: bool, xp: Any) -> Any:
    """A X with A = G̃Xᴴ − XG̃ᴴ: G P − X Wᴴ (canonical), G P − X(Wᴴ + ½(W − Wᴴ)P)
    (Euclidean), W = XᴴG, P = XᴴX (ᴴ = ᵀ for real X). 8·N·M² flops."""
    P = gram(X, xp)
    W = mH(X, xp) @ G
    Wh = mH(W, xp)
    Mx = Wh + 0.5 * ((W - Wh) @ P) if euclidean else Wh
    return G @ P - X @ Mx
