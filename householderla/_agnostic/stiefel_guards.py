"""Range guards of the momentum Stiefel optimizers (Kong, Wang & Tao, "Momentum Stiefel
optimizer, with applications to suitably-orthogonal attention, and optimal transport", ICLR
2023, Algorithms 1 and 2): before a step forms quantities that would lose every digit or
overflow, raise a ``ValueError`` that says which input is to blame. Eager arrays only (under a
trace there is no value to look at). Backend-neutral: ``xp`` explicit.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

from .._lib.jit import defer, deferring, host
from .._lib.rows import LOCAL, Rows

__all__ = ["check_powers", "check_step", "momentum_growth"]


def check_step(name: str, W: Any, xp: Any, eager: bool) -> None:
    """The rotation step W = ηZ (Adam: ηκ Z ⊘ (p^½ + ε)) must stay below 1/√eps: beyond it
    R = I + W and S = RᵀR = I − W² lose every digit of their identity part, so the update
    means nothing in the working precision (and S turns numerically singular). Eager only
    (deferred to after the program under :func:`~householderla._lib.jit.eager_program`)."""
    if 0 in W.shape or not (eager or deferring(xp)):
        return
    limit = 1.0 / math.sqrt(float(xp.finfo(W.dtype).eps))
    if eager:
        _step_error(name, limit, host(xp.max(xp.abs(W))))
    else:
        defer(xp.max(xp.abs(W)), partial(_step_error, name, limit))


def _step_error(name: str, limit: float, m: float) -> None:
    if not m <= limit:
        raise ValueError(
            f"{name}: the rotation step lr·Z has entries up to {m:.1e}, beyond 1/sqrt(eps) = "
            f"{limit:.1e} where the update loses all precision: the gradient G has exploded "
            "or lr is too large (clip G or lower lr)"
        )


def momentum_growth(method: str) -> str:
    """Why the momentum U can grow without bound (the message of a ValueError)."""
    if method == "euler":
        return (
            "the forward-Euler momentum rotation μI + dηZ grows ‖U‖ by up to "
            "(μ² + (dη‖Z‖₂)²)^½ per step (expm_method='cayley' or 'expm' keeps it bounded)"
        )
    return "the gradient's scale carried the momentum out of range"


def check_powers(
    name: str,
    what: str,
    a: Any,
    k: int,
    why: str,
    xp: Any,
    eager: bool,
    rows: Rows = LOCAL,
    m: Any = None,
) -> None:
    """The step forms sums of k-th powers of the entries of ``a`` (second moments: k = 2; the
    momentum's energy ⟨ηB, S⁻¹ηB⟩, B = ŨᵀU½: k = 4): entries beyond (max/size)^{1/k}/4 would
    overflow them. Raise, saying why, before they do (eager only); a NaN gets the same.
    Row-sharded ``a`` (``rows``): ``m`` is max |a| reduced over the blocks, the size the
    whole a's."""
    rows_a = rows.total(a.shape[-2])
    if 0 in (*a.shape[:-2], rows_a, a.shape[-1]) or not (eager or deferring(xp)):
        return
    size = a.shape[-1] * rows_a
    limit = 0.25 * (float(xp.finfo(a.dtype).max) / size**2) ** (1.0 / k)
    fail = partial(_powers_error, name, what, k, why, str(a.dtype), limit)
    value = xp.max(xp.abs(a)) if m is None else xp.max(m)
    if eager:
        fail(host(value))
    else:
        defer(value, fail)


def _powers_error(name: str, what: str, k: int, why: str, dtype: str, limit: float, m: float):
    if not m <= limit:
        raise ValueError(
            f"{name}: {what} has entries up to {m:.1e}, whose {'squares' if k == 2 else 'powers'}"
            f" overflow {dtype} (limit {limit:.1e}): {why}; clip G or lower lr"
        )
