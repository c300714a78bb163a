"""The fixed-step mode of :func:`householderla.polar` (``schedule=``): a polar factor for
update directions (Muon-style orthogonalisation of gradients) with the interval its singular
values are certified to land in. The schedules and the certificate are in
:mod:`householderla._agnostic.polar_schedules`; the mathematics in ``docs/theory/lowprec.rst``.
"""

from __future__ import annotations

import math
from typing import Any

from .._lib.checks import check_finite_columns
from .._lib.jit import jit_for
from .._lib.namespace import is_complex, mT, real_dtype, resolve
from .polar_schedules import SCHEDULES, divisor_slack, fixed_polar, schedule, schedule_of

__all__ = [
    "ADJUST_LR",
    "DEFAULT_STEPS",
    "adjusted_lr",
    "check_split_sizes",
    "fixed_step_polar",
    "fixed_step_schedule",
    "orthogonalize",
    "step_coefficients",
]

#: Steps of every schedule by default: Muon's (``torch.optim.Muon``: ``ns_steps=5``).
DEFAULT_STEPS = 5
#: ``torch.optim.Muon``'s learning-rate adjustments (``adjust_lr_fn``), for both Muons.
ADJUST_LR = (None, "original", "match_rms_adamw")
#: Most steps a schedule may take (``torch.optim.Muon`` refuses 100 and more likewise).
MAX_STEPS = 100


def adjusted_lr(lr: Any, adjust_lr_fn: str | None, shape: tuple[int, ...]) -> Any:
    """``torch.optim.Muon``'s η·ratio for a parameter (..., A, B): "original" (default)
    √max(1, A/B) (Jordan et al.), "match_rms_adamw" 0.2·√max(A, B) (Moonshot's RMS match)."""
    A, B = shape[-2], shape[-1]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1.0, A / B))
    return lr * 0.2 * math.sqrt(max(A, B))


def check_split_sizes(sizes: Any) -> tuple[int, ...]:
    """The Muons' ``split_sizes`` as a tuple of positive integers (ValueError naming it)."""
    sizes = tuple(sizes)
    if not sizes or any(isinstance(a, bool) or int(a) != a or a < 1 for a in sizes):
        raise ValueError(f"split_sizes must be positive integers; got {sizes!r}")
    return tuple(int(a) for a in sizes)


def fixed_step_schedule(
    name: Any, steps: Any, min_sv: Any, dtype_eps: float, m: int, margin: float = 0.0
) -> Any:
    """The validated :func:`~householderla._agnostic.polar_schedules.schedule` for a call."""
    if name not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES} or None; got {name!r}")
    steps = DEFAULT_STEPS if steps is None else steps
    if isinstance(steps, bool) or int(steps) != steps or not 1 <= steps < MAX_STEPS:
        raise ValueError(f"steps must be an integer in [1, {MAX_STEPS}); got {steps!r}")
    if isinstance(min_sv, bool) or not (isinstance(min_sv, (int, float)) and 0 < min_sv < 1):
        raise ValueError(f"min_sv must be a number in (0, 1); got {min_sv!r}")
    return schedule(name, int(steps), float(min_sv), dtype_eps / 2, max(int(m), 1), margin)


def _iterate(xp: Any, X: Any, sched: Any, eps: float = 0.0) -> Any:
    return fixed_polar(X, xp, sched, eps)


def step_coefficients(coefficients: Any, steps: Any) -> tuple[tuple[float, float, float], ...]:
    """``coefficients`` as one quintic (a, b, c) per step: one triple repeated ``steps`` times
    (``torch.optim.Muon``'s ``ns_coefficients``), or a sequence of triples, one per step
    (optax's ``ns_coeffs`` schedules), whose length must then match ``steps`` when given."""
    try:
        rows = [tuple(float(v) for v in row) for row in coefficients]
        per_step = len(rows) > 0 and all(len(r) == 3 for r in rows)
    except TypeError:  # one triple of numbers
        per_step = False
    if not per_step:
        if len(coefficients) != 3:
            raise ValueError(
                "coefficients must be (a, b, c) or a sequence of (a, b, c), one per step; "
                f"got {coefficients!r}"
            )
        steps = DEFAULT_STEPS if steps is None else steps
        fixed_step_schedule("muon", steps, 1e-3, 0.0, 1)  # validates steps
        return (tuple(float(v) for v in coefficients),) * int(steps)  # type: ignore[return-value]
    if steps is not None and int(steps) != len(rows):
        raise ValueError(f"steps={steps!r} but coefficients has {len(rows)} (a, b, c) rows")
    fixed_step_schedule("muon", len(rows), 1e-3, 0.0, 1)  # validates the count
    return tuple(rows)  # type: ignore[return-value]


def orthogonalize(
    G: Any,
    name: str,
    steps: int | None,
    coefficients: Any = None,
    *,
    eps: float = 0.0,
    min_sv: float = 1e-3,
    xp: Any = None,
) -> Any:
    """The optimizers' orthogonalisation: the fixed-step polar factor of G (..., A, B) in
    G's dtype, without value checks (NaN propagates, as in ``torch.optim.Muon``), with
    ``coefficients`` (:func:`step_coefficients`) fixed quintics when given. ``G=None`` only
    validates; ``xp`` (G's namespace, when the caller knows it) skips the namespace lookup."""
    if coefficients is not None:
        coeffs = step_coefficients(coefficients, steps)
        make = lambda u, m: schedule_of("muon", coeffs, 1.0, min_sv, u, m)  # noqa: E731
    else:
        fixed_step_schedule(name, steps, min_sv, 0.0, 1)  # validates name and steps
        make = lambda u, m: fixed_step_schedule(name, steps, min_sv, 2 * u, m)  # noqa: E731
    if G is None:
        return None
    xp = resolve([("G", G)], half=True)[0] if xp is None else xp
    tall = G.shape[-2] > G.shape[-1]
    sched = make(float(xp.finfo(G.dtype).eps) / 2, max(min(G.shape[-2:]), 1))
    W = mT(G) if tall else G
    Q = jit_for(xp, _iterate, (0, 2, 3))(xp, W, sched, float(eps))
    return mT(Q) if tall else Q


def fixed_step_polar(X: Any, name: Any, steps: Any, min_sv: Any, return_info: bool, xp: Any) -> Any:
    """``hl.polar(X, schedule=name, steps=..., min_sv=...)``: see :func:`householderla.polar`."""
    xp, _, dtype, (X,) = resolve([("X", X)], xp, half=True, complex_ok=True)
    if X.ndim < 2:
        raise ValueError(f"X must have shape (..., N, M); got shape {tuple(X.shape)}")
    tall = X.shape[-2] > X.shape[-1]
    # complex X: each entry of XXᴴ is a real inner product of length 2M per real and
    # imaginary part, so the rounding model of M × N real steps is taken at 2M
    m = min(X.shape[-2:]) * (2 if is_complex(dtype) else 1)
    # the certificate's start carries the rounding of the normalising norm (divisor_slack)
    margin = 2.0 * divisor_slack(xp, X)
    sched = fixed_step_schedule(
        name, steps, min_sv, float(xp.finfo(real_dtype(xp, dtype)).eps), m, margin
    )
    info = {
        "method": "fixed-step",
        "schedule": sched.name,
        "iterations": len(sched.coeffs),
        "interval": sched.interval,
        "interval_exact": sched.exact,
        "upper": sched.upper,
        "min_sv": sched.min_sv,
        "certified_min_sv": sched.certified_min_sv,
    }
    if math.prod(X.shape) == 0:
        return (X, info) if return_info else X
    check_finite_columns(X, xp, "X")
    W = mT(X) if tall else X  # (..., M, N) with M ≤ N: the Gram matrices are M × M
    Q = jit_for(xp, _iterate, (0, 2))(xp, W, sched)
    Q = mT(Q) if tall else Q
    return (Q, info) if return_info else Q
