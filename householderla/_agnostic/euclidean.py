"""Euclidean counterparts of the momentum Stiefel optimizers (Kong, Wang & Tao, ICLR 2023,
App. P: Stiefel and Euclidean parameters share one set of hyperparameters). Exported by
:mod:`householderla.stiefel`. Complex parameters: the gradient is ∂L/∂Re x + i ∂L/∂Im x
(torch's ``.grad``), and Adam's second moment is the real ``|g|²``, as on the manifold."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from .._lib.checks import check_real
from .._lib.linalg import abs2
from .._lib.namespace import is_complex, real_dtype, resolve
from .stiefel_flow import StiefelOptimizer

__all__ = [
    "EuclideanAMSGradState",
    "EuclideanAdamState",
    "EuclideanMomentumState",
    "euclidean_adam",
    "euclidean_sgd",
]


class EuclideanMomentumState(NamedTuple):
    """State of :func:`euclidean_sgd`: ``count`` (int32) and the velocity ``v`` (shape of x)."""

    count: Any
    v: Any


class EuclideanAdamState(NamedTuple):
    """State of :func:`euclidean_adam`: ``count``, first moment ``m``, second moment ``s``."""

    count: Any
    m: Any
    s: Any


class EuclideanAMSGradState(NamedTuple):
    """State of :func:`euclidean_adam` with ``amsgrad=True``: plus the running maximum
    ``s_max`` of ``s``."""

    count: Any
    m: Any
    s: Any
    s_max: Any


def _euclidean_prepare(x: Any, g: Any, xp: Any) -> tuple[Any, Any, Any, Any]:
    xp, _, dtype, (x,) = resolve([("x", x)], xp, complex_ok=True)
    _, _, _, (g,) = resolve([("G", g)], xp, complex_ok=True)
    if tuple(g.shape) != tuple(x.shape):
        raise ValueError(f"G must have the shape of x {tuple(x.shape)}; got {tuple(g.shape)}")
    if is_complex(g.dtype) and not is_complex(dtype):
        raise TypeError(f"G has complex dtype {g.dtype} but x is real ({dtype})")
    return xp, x, (g if g.dtype == dtype else xp.astype(g, dtype)), dtype


def euclidean_sgd(
    lr: float = 0.1,
    momentum: float = 0.9,
    *,
    nesterov: bool = False,
    dampening: float = 0.0,
    xp: Any = None,
) -> StiefelOptimizer:
    """Heavy-ball momentum SGD on ℝ^{shape}: the Euclidean limit of :func:`momentum_sgd`.

    ``v⁺ = μv − (1 − τ)g`` (τ = ``dampening``, 0 on the first step), ``x⁺ = x + ηv⁺``, or
    ``x + η(μv⁺ − g)`` with ``nesterov`` — Algorithm 1 with X unconstrained (only the U part,
    no projection, no φ̄₃), i.e. ``torch.optim.SGD(lr=η, momentum=μ, dampening=τ,
    nesterov=...)`` with v = −buffer. Kong, Wang & Tao, ICLR 2023, App. P: Stiefel and
    Euclidean parameters share lr and momentum. Any shape.
    """
    lr = check_real("lr", lr, 0.0, math.inf)  # lr = 0: a scheduler's last step
    mu = check_real("momentum", momentum, 0.0, 1.0)
    tau = check_real("dampening", dampening, 0.0, 1.0)
    if nesterov and (mu <= 0.0 or tau != 0.0):
        raise ValueError("Nesterov momentum requires a momentum and zero dampening")
    fixed_xp = xp

    def init(x: Any) -> EuclideanMomentumState:
        xp, device, dtype, (x,) = resolve([("x", x)], fixed_xp, complex_ok=True)
        count = xp.asarray(0, dtype=xp.int32, device=device)
        return EuclideanMomentumState(count, xp.zeros(tuple(x.shape), dtype=dtype, device=device))

    def update(x: Any, g: Any, state: EuclideanMomentumState) -> tuple[Any, Any]:
        xp, x, g, _ = _euclidean_prepare(x, g, fixed_xp)
        if tau:
            g = g * (1.0 - tau * xp.astype(state.count > 0, g.dtype))
        v = mu * state.v - g
        step = mu * v - g if nesterov else v
        return x + lr * step, EuclideanMomentumState(state.count + 1, v)

    return StiefelOptimizer(init, update)


def euclidean_adam(
    lr: float = 1e-3,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    amsgrad: bool = False,
    xp: Any = None,
) -> StiefelOptimizer:
    """Adam on ℝ^{shape} in the convention of :func:`adam` (Kong, Wang & Tao, ICLR 2023, Algorithm
    2 without the manifold): ``m⁺ = β₁m − (1 − β₁)g``, ``s⁺ = β₂s + (1 − β₂)g∘g``, ``x⁺ = x + ηκ m⁺
    ⊘ (s⁺^{∘½} + ε)``, κ = √(1 − β₂^{t}). Unlike ``torch.optim.Adam`` there is no β₁ bias correction
    (the paper has none) and ε is not rescaled by κ. ``amsgrad``: divide by the running
    maximum of s (Reddi, Kale & Kumar, ICLR 2018). Complex x: s⁺ = β₂s + (1 − β₂) ``|g|²`` (real,
    phase-invariant; ``torch.optim.Adam`` instead treats Re and Im as separate parameters).
    """
    lr = check_real("lr", lr, 0.0, math.inf)  # lr = 0: a scheduler's last step
    b1 = check_real("b1", b1, 0.0, 1.0)
    b2 = check_real("b2", b2, 0.0, 1.0)
    eps = check_real("eps", eps, 0.0, math.inf, lo_open=True)
    log_b2 = math.log(b2) if b2 > 0 else None
    fixed_xp = xp

    def init(x: Any) -> EuclideanAdamState:
        xp, device, dtype, (x,) = resolve([("x", x)], fixed_xp, complex_ok=True)
        count = xp.asarray(0, dtype=xp.int32, device=device)
        zeros = xp.zeros(tuple(x.shape), dtype=dtype, device=device)
        s = xp.zeros(tuple(x.shape), dtype=real_dtype(xp, dtype), device=device)  # |g|²
        if amsgrad:
            return EuclideanAMSGradState(count, zeros, s, xp.zeros_like(s))
        return EuclideanAdamState(count, zeros, s)

    def update(x: Any, g: Any, state: EuclideanAdamState) -> tuple[Any, Any]:
        xp, x, g, dtype = _euclidean_prepare(x, g, fixed_xp)
        if isinstance(state, EuclideanAMSGradState) != bool(amsgrad):
            raise ValueError("the state was made by init() of an adam with other amsgrad")
        count = state.count + 1
        rdtype = real_dtype(xp, dtype)
        kappa = 1.0 if log_b2 is None else xp.sqrt(-xp.expm1(xp.astype(count, rdtype) * log_b2))
        m = b1 * state.m - (1.0 - b1) * g
        s = b2 * state.s + (1.0 - b2) * abs2(g, xp)
        if not amsgrad:
            return x + (lr * kappa) * (m / (xp.sqrt(s) + eps)), EuclideanAdamState(count, m, s)
        s_max = xp.maximum(state.s_max, s)
        x_next = x + (lr * kappa) * (m / (xp.sqrt(s_max) + eps))
        return x_next, EuclideanAMSGradState(count, m, s, s_max)

    return StiefelOptimizer(init, update)
