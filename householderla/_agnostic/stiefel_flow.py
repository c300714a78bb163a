"""The M×M parts of the momentum Stiefel optimizers (Kong, Wang & Tao, ICLR 2023): the
optimizer and state types, and the matrix exponentials of App. M.2. Backend-neutral (``xp``
explicit); the N×M steps, which need the polar retraction, are in :mod:`householderla.stiefel`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .._lib.linalg import eye_like
from .._lib.namespace import device_of, mT

__all__ = [
    "AMSGradState",
    "AdamState",
    "MomentumState",
    "StiefelOptimizer",
    "expm_skew",
    "momentum_rotation",
    "sym",
]


class StiefelOptimizer(NamedTuple):
    """A pair of pure functions, like optax's ``GradientTransformation``.

    ``init(X) -> state`` and ``update(X, G, state) -> (X_next, state_next)``; note that
    ``update`` returns the next *point*, not an increment (a retraction is not additive;
    :func:`householderla._optax.stiefel_sgd` gives the optax convention).
    """

    init: Any
    update: Any


class MomentumState(NamedTuple):
    """State of :func:`momentum_sgd`: ``count`` (int32, steps taken), ``U`` (..., N, M) with
    XᵀU = 0 and ``Z`` (..., M, M) skew. For M = N (SO(n), Kong, Wang & Tao, ICLR 2023 App. O) ``U``
    is an empty
    (..., N, 0) array: there is no normal component."""

    count: Any
    U: Any
    Z: Any


class AdamState(NamedTuple):
    """State of :func:`adam`: as :class:`MomentumState` plus the second moments ``p``
    (..., M, M, symmetric) of the Z-'gradient' and ``q`` (..., N, M; (..., N, 0) for M = N)
    of the U-'gradient'."""

    count: Any
    U: Any
    Z: Any
    p: Any
    q: Any


class AMSGradState(NamedTuple):
    """State of :func:`adam` with ``amsgrad=True``: :class:`AdamState` plus the running
    maxima ``p_max``, ``q_max`` of the second moments."""

    count: Any
    U: Any
    Z: Any
    p: Any
    q: Any
    p_max: Any
    q_max: Any


def sym(A: Any) -> Any:
    """The symmetric part ½(A + Aᵀ)."""
    return 0.5 * (A + mT(A))


def expm_skew(W: Any, method: str, xp: Any) -> Any:
    """An approximation of expm(W) for skew W (..., M, M) (Kong, Wang & Tao, ICLR 2023 App. M.2).

    ``"euler"``: I + W (first order, not orthogonal: (I + W)ᵀ(I + W) = I − W²);
    ``"cayley"``: (I − W/2)⁻¹(I + W/2) (eq. 32, orthogonal, second order);
    ``"expm"``: the exponential itself, cos(Θ) + W·sinc(Θ) with Θ = (WᵀW)^{1/2} (for skew W,
    W² = −WᵀW commutes with W), from one symmetric eigendecomposition. O(M³).
    """
    eye = eye_like(xp, W.shape[-1], W.dtype, device_of(W))
    if method == "euler":
        return eye + W
    if method == "cayley":
        return xp.linalg.solve(eye - 0.5 * W, eye + 0.5 * W)
    lam, Q = xp.linalg.eigh(sym(mT(W) @ W))
    th = xp.sqrt(xp.maximum(lam, xp.zeros_like(lam)))
    small = th < 1e-4  # sinc(θ) = 1 − θ²/6 + O(θ⁴): exact to rounding below 1e-4
    one = xp.ones_like(th)
    sinc = xp.where(small, one - th * th / 6.0, xp.sin(th) / xp.where(small, one, th))
    cos_part = (Q * xp.cos(th)[..., None, :]) @ mT(Q)
    sinc_part = (Q * sinc[..., None, :]) @ mT(Q)
    return cos_part + W @ sinc_part


def momentum_rotation(Z: Any, damping: float, d_lr: float, method: str, xp: Any) -> Any:
    """L with U½ = U L − (gradient term): φ̄₂ without the gradient, i.e. the flow of
    V̇ = −γV + dVY over one step (eq. 30, rescaled): μI + dηZ (eq. 34, ``"euler"``) or
    μ·R(dηZ) with R the orthogonal Cayley / exponential (eq. 33, ``"cayley"`` / ``"expm"``)."""
    if method == "euler":
        eye = eye_like(xp, Z.shape[-1], Z.dtype, device_of(Z))
        return damping * eye + d_lr * Z
    return damping * expm_skew(d_lr * Z, method, xp)
