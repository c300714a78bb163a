"""Momentum Stiefel optimizers by operator splitting (Kong, Wang, Tao, ICLR 2023; seed 004).

Functional, optax-style: ``opt = momentum_sgd(...)`` or ``opt = adam(...)`` is a frozen pair of
pure functions, ``state = opt.init(X)`` and ``X, state = opt.update(X, G, state)``, with ``G``
the Euclidean gradient ∂f/∂X. The state is a NamedTuple of arrays in X's namespace, device and
dtype (a JAX pytree, so ``update`` runs under ``jax.jit``). Everything is batched over leading
dimensions: one manifold St(N, M) per matrix, every moment per matrix.

Notation (seed 004 §2, App. M.4–M.5): a < 1 is the metric parameter of Definition 1
(a = ½ canonical, a = 0 Euclidean), b = a/(a − 1), so (1 − b)/2 = 1/(2(1 − a)); η is ``lr``,
μ ``momentum``. The momentum Q = XY + V (eq. 8) is stored rescaled as Z (M×M, skew) and
U (N×M, XᵀU = 0). The mathematics is in ``docs/theory/stiefel.rst``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from ._lib.namespace import is_eager, mT, resolve
from ._newton_schulz import select
from .retractions import check_stiefel_shape, polar

__all__ = ["AdamState", "MomentumState", "StiefelOptimizer", "adam", "momentum_sgd"]

_NAMED_METRICS = {"canonical": 0.5, "euclidean": 0.0}


class StiefelOptimizer(NamedTuple):
    """A pair of pure functions, like optax's ``GradientTransformation``.

    ``init(X) -> state`` and ``update(X, G, state) -> (X_next, state_next)``; note that
    ``update`` returns the next *point*, not an increment (a retraction is not additive).
    """

    init: Any
    update: Any


class MomentumState(NamedTuple):
    """State of :func:`momentum_sgd`: ``count`` (int32, steps taken), ``U`` (..., N, M) with
    XᵀU = 0 and ``Z`` (..., M, M) skew. For M = N (SO(n), seed 004 App. O) ``U`` is an empty
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


def _metric_a(metric: Any) -> float:
    """The a of Definition 1 from a number (a < 1) or 'canonical' / 'euclidean'."""
    if isinstance(metric, str):
        if metric not in _NAMED_METRICS:
            raise ValueError(
                f"metric must be a number a < 1, 'canonical' or 'euclidean'; got {metric!r}"
            )
        return _NAMED_METRICS[metric]
    if isinstance(metric, bool) or not isinstance(metric, (int, float)):
        raise ValueError(f"metric must be a number a < 1 or a name; got {metric!r}")
    a = float(metric)
    if not (math.isfinite(a) and a < 1.0):
        raise ValueError(f"metric a must be finite and < 1 (seed 004 Definition 1); got {a}")
    return a


def _check_real(name: str, value: Any, lo: float, hi: float, lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a real number; got {value!r}")
    v = float(value)
    ok = math.isfinite(v) and (v > lo if lo_open else v >= lo) and v < hi
    if not ok:
        left = "(" if lo_open else "["
        raise ValueError(f"{name} must lie in {left}{lo}, {hi}); got {value!r}")
    return v


def _prepare(X: Any, G: Any, state: Any, xp: Any) -> tuple[Any, Any, Any, Any]:
    """X and G in X's namespace and dtype (G never promotes X), shapes checked."""
    xp, _, dtype, (X,) = resolve([("X", X)], xp)
    check_stiefel_shape(X)
    _, _, _, (G,) = resolve([("G", G)], xp)
    if tuple(G.shape) != tuple(X.shape):
        raise ValueError(f"G must have the shape of X {tuple(X.shape)}; got {tuple(G.shape)}")
    if G.dtype != dtype:
        G = xp.astype(G, dtype)
    N, M = X.shape[-2], X.shape[-1]
    U_cols = 0 if M == N else M
    for name in state._fields:
        arr = getattr(state, name)
        want = {
            "count": (),
            "U": X.shape[:-1] + (U_cols,),
            "q": X.shape[:-1] + (U_cols,),
            "Z": X.shape[:-2] + (M, M),
            "p": X.shape[:-2] + (M, M),
        }[name]
        if tuple(arr.shape) != tuple(want):
            raise ValueError(
                f"state.{name} has shape {tuple(arr.shape)} but X {tuple(X.shape)} needs "
                f"{tuple(want)}; was the state made by init() for this X?"
            )
    return xp, X, G, dtype


def _project_first(X: Any, count: Any, xp: Any) -> Any:
    """polar(X) on the first step (count == 0), X afterwards (seed 004 App. P.1: any full-rank
    start; the iteration preserves the structure only from a point of St)."""
    return select(
        xp, is_eager(X) and is_eager(count), count == 0, lambda: polar(X, xp=xp), lambda: X
    )


def _gradients(X: Any, G: Any, c: float, square: bool) -> tuple[Any, Any]:
    """f = (1 − b)/2 (XᵀG − GᵀX) (exactly skew) and g = (I − XXᵀ)G (Algorithm 1 line 2)."""
    A = mT(X) @ G
    f = c * (A - mT(A))
    g = None if square else G - X @ A
    return f, g


def _zeros(xp: Any, shape: tuple[int, ...], dtype: Any, device: Any) -> Any:
    return xp.zeros(shape, dtype=dtype, device=device)


def _init_arrays(X: Any, xp: Any, adam: bool) -> Any:
    xp, device, dtype, (X,) = resolve([("X", X)], xp)
    check_stiefel_shape(X)
    N, M = X.shape[-2], X.shape[-1]
    u_shape = X.shape[:-1] + (0 if M == N else M,)
    z_shape = X.shape[:-2] + (M, M)
    count = xp.asarray(0, dtype=xp.int32, device=device)
    U, Z = _zeros(xp, u_shape, dtype, device), _zeros(xp, z_shape, dtype, device)
    if not adam:
        return MomentumState(count, U, Z)
    p, q = _zeros(xp, z_shape, dtype, device), _zeros(xp, u_shape, dtype, device)
    return AdamState(count, U, Z, p, q)


def _retract(X_half: Any, U_half: Any, Ut: Any, lr: float, xp: Any) -> tuple[Any, Any]:
    """φ̄₃ (eq. 13, rescaled as App. M.4): X† = X½ + η Ũ X½ᵀX½, X⁺ = X†(X†ᵀX†)^{-1/2} by
    :func:`~householderla.polar`, U⁺ = U½ − η X½ ŨᵀU½ (Ũ = U½ for Algorithm 1)."""
    S = mT(X_half) @ X_half
    X_dag = X_half + lr * (Ut @ S)
    U_next = U_half - lr * (X_half @ (mT(Ut) @ U_half))
    return polar(X_dag, xp=xp), U_next


def momentum_sgd(
    lr: float = 0.1, momentum: float = 0.9, metric: Any = 0.5, *, xp: Any = None
) -> StiefelOptimizer:
    """Momentum (S)GD on St(N, M) by the splitting integrator φ̄₃ ∘ φ̃₁ ∘ φ̄₂ (seed 004
    Algorithm 1; Algorithm 4 for M = N).

    Parameters
    ----------
    lr : float
        η > 0.
    momentum : float
        μ ∈ [0, 1).
    metric : float or str
        a < 1 of the canonical-type metric (Definition 1): 0.5 (``"canonical"``, default) or
        0 (``"euclidean"``) or any other a < 1.
    xp : namespace, optional
        Force this array namespace in ``init`` and ``update``.

    Returns
    -------
    StiefelOptimizer
        ``init(X) -> MomentumState`` (U = 0, Z = 0, count = 0) and
        ``update(X, G, state) -> (X_next, state_next)``.

    Notes
    -----
    One step from (X, U, Z), G = ∂f/∂X, c = (1 − b)/2 = 1/(2(1 − a)):

    0. First step only (count = 0): X ← polar(X), so any full-rank start works (App. P.1).
    1. f = c(XᵀG − GᵀX), g = (I − XXᵀ)G (line 2).
    2. φ̄₂ (eq. 14 / eq. 34): U½ = μU + ((3a − 2)/2) η U Z − g (line 3).
    3. φ̃₁ (Theorem 6, forward Euler for expm of eq. 12): Z⁺ = μZ − f, X½ = X + η X Z⁺ (line 4).
    4. φ̄₃ (eq. 13): X† = X½ + η U½ X½ᵀX½, X⁺ = polar(X†), U⁺ = U½ − η X½ U½ᵀU½ (line 5).

    Two printed-algorithm details are taken from the equations instead (docs/theory/stiefel):
    the sign of the UZ term is + as in eq. 8, 14, 34 and App. M.4 (Algorithm 1 prints −), and
    X½ uses the updated Z⁺ as in Theorem 6, App. M.4, Algorithms 2 and 4 (Algorithm 1 prints
    Zᵢ). For M = N the normal part g, U vanish (Algorithm 4 with forward Euler for expm): the
    point stays in the connected component of O(N) of its (projected) start. Structure
    (Theorems 4–6): XᵀX = I, Z skew, XᵀU = 0 after every step, up to rounding.

    Examples
    --------
    >>> import numpy as np, householderla as hl
    >>> rng = np.random.default_rng(0)
    >>> B = rng.standard_normal((6, 6)); A = (B + B.T) / 2 / np.sqrt(6)
    >>> opt = hl.stiefel.momentum_sgd(lr=0.1, momentum=0.9)
    >>> X = np.linalg.qr(rng.standard_normal((6, 2)))[0]; state = opt.init(X)
    >>> for _ in range(300):
    ...     X, state = opt.update(X, -2 * A @ X, state)   # f(X) = -tr(XᵀAX)
    >>> bool(np.isclose(np.trace(X.T @ A @ X), np.linalg.eigvalsh(A)[-2:].sum()))
    True
    """
    lr = _check_real("lr", lr, 0.0, math.inf, lo_open=True)
    mu = _check_real("momentum", momentum, 0.0, 1.0)
    a = _metric_a(metric)
    c, d = 0.5 / (1.0 - a), 0.5 * (3.0 * a - 2.0)
    fixed_xp = xp

    def init(X: Any) -> MomentumState:
        return _init_arrays(X, fixed_xp, adam=False)

    def update(X: Any, G: Any, state: MomentumState) -> tuple[Any, MomentumState]:
        xp, X, G, _ = _prepare(X, G, state, fixed_xp)
        square = X.shape[-1] == X.shape[-2]
        X = _project_first(X, state.count, xp)
        f, g = _gradients(X, G, c, square)
        Z = mu * state.Z - f
        X_half = X + lr * (X @ Z)
        if square:
            X_next, U_next = polar(X_half, xp=xp), state.U
        else:
            U_half = mu * state.U + (d * lr) * (state.U @ state.Z) - g
            X_next, U_next = _retract(X_half, U_half, U_half, lr, xp)
        return X_next, MomentumState(state.count + 1, U_next, Z)

    return StiefelOptimizer(init, update)


def adam(
    lr: float = 1e-3,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    metric: Any = 0.5,
    *,
    xp: Any = None,
) -> StiefelOptimizer:
    """Adam on St(N, M) by the splitting φ̂₃ ∘ φ̂₁ ∘ φ̂₂ (seed 004 Algorithm 2, App. M.5;
    Algorithm 5 for M = N).

    Parameters
    ----------
    lr : float
        η > 0.
    b1, b2 : float
        β₁, β₂ ∈ [0, 1).
    eps : float
        ε > 0, added to the square roots of the second moments.
    metric : float or str
        a < 1 of Definition 1, as in :func:`momentum_sgd`.
    xp : namespace, optional

    Returns
    -------
    StiefelOptimizer
        ``init(X) -> AdamState`` (all moments 0) and ``update(X, G, state)``.

    Notes
    -----
    One step i → i + 1 from (X, U, Z, p, q), with f, g, c, d = (3a − 2)/2 as in
    :func:`momentum_sgd` and κ = √(1 − β₂^{i+1}) (the paper's bias correction; there is none
    for β₁):

    0. First step only: X ← polar(X) (App. P.1).
    1. p⁺ = β₂p + (1 − β₂) f∘f, q⁺ = β₂q + (1 − β₂) g∘g (line 3).
    2. φ̂₂: U½ = β₁U + d η U Z − (1 − β₁) g (line 4; sign of the UZ term as in eq. 8).
    3. φ̂₁: Z⁺ = β₁Z − (1 − β₁) f, X½ = X + ηκ X (Z⁺ ⊘ (p⁺^{∘½} + ε)) (line 5).
    4. φ̂₃: Ũ = κ (I − XXᵀ)(U½ ⊘ (q⁺^{∘½} + ε)), X† = X½ + η Ũ X½ᵀX½, X⁺ = polar(X†),
       U⁺ = U½ − η X½ ŨᵀU½ (line 6).

    ⊘ is element-wise division: Algorithm 2 prints ∘ (a product) where §2.3 and Algorithm 5
    mean ⊘. The paper's projection I − X½(X½ᵀX½)⁻¹X½ᵀ equals I − XXᵀ exactly, because
    X½ = X(I + ηκ Z⁺⊘(…)) and I + (skew) is invertible, so no M×M solve is needed. Z⁺ ⊘ (…)
    is exactly skew because p⁺ is exactly symmetric (f is exactly skew); Ũ ⟂ X½ gives
    X⁺ᵀU⁺ = 0 (Theorem 7).
    """
    lr = _check_real("lr", lr, 0.0, math.inf, lo_open=True)
    b1 = _check_real("b1", b1, 0.0, 1.0)
    b2 = _check_real("b2", b2, 0.0, 1.0)
    eps = _check_real("eps", eps, 0.0, math.inf, lo_open=True)
    a = _metric_a(metric)
    c, d = 0.5 / (1.0 - a), 0.5 * (3.0 * a - 2.0)
    log_b2 = math.log(b2) if b2 > 0 else None
    fixed_xp = xp

    def init(X: Any) -> AdamState:
        return _init_arrays(X, fixed_xp, adam=True)

    def update(X: Any, G: Any, state: AdamState) -> tuple[Any, AdamState]:
        xp, X, G, dtype = _prepare(X, G, state, fixed_xp)
        square = X.shape[-1] == X.shape[-2]
        X = _project_first(X, state.count, xp)
        f, g = _gradients(X, G, c, square)
        count = state.count + 1
        if log_b2 is None:
            kappa = 1.0
        else:
            t = xp.astype(count, dtype)
            kappa = xp.sqrt(-xp.expm1(t * log_b2))
        p = b2 * state.p + (1.0 - b2) * (f * f)
        Z = b1 * state.Z - (1.0 - b1) * f
        X_half = X + (lr * kappa) * (X @ (Z / (xp.sqrt(p) + eps)))
        if square:
            X_next, U_next, q = polar(X_half, xp=xp), state.U, state.q
        else:
            q = b2 * state.q + (1.0 - b2) * (g * g)
            U_half = b1 * state.U + (d * lr) * (state.U @ state.Z) - (1.0 - b1) * g
            W = U_half / (xp.sqrt(q) + eps)
            Ut = kappa * (W - X @ (mT(X) @ W))
            X_next, U_next = _retract(X_half, U_half, Ut, lr, xp)
        return X_next, AdamState(count, U_next, Z, p, q)

    return StiefelOptimizer(init, update)
