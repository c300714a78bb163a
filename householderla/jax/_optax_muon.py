"""optax-style Muon (:func:`muon`), re-exported as ``householderla.jax.muon``.

The same step as :class:`householderla.torch.Muon` (``torch.optim.Muon``'s conventions:
``lerp`` momentum, Nesterov, decoupled weight decay, ``adjust_lr_fn``), written as an optax
``GradientTransformation``: ``updates, state = tx.update(grads, state, params)`` then
``optax.apply_updates(params, updates)``. Every leaf is a matrix or a batch of matrices
(..., A, B); route vectors and embeddings to another transformation
(``optax.multi_transform`` / ``optax.partition``). Runs under ``jax.jit``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .._agnostic.fixed_polar import (
    ADJUST_LR,
    DEFAULT_STEPS,
    adjusted_lr,
    check_split_sizes,
    orthogonalize,
)
from ._optax import GradientTransformation

__all__ = ["MuonState", "muon"]


class MuonState(NamedTuple):
    """``count`` (int32 steps taken, for learning-rate schedules) and ``momentum`` (the
    buffers B, a pytree like the params)."""

    count: Any
    momentum: Any


def muon(
    learning_rate: Any = 1e-3,
    weight_decay: float = 0.1,
    momentum: float = 0.95,
    nesterov: bool = True,
    ns_coefficients: tuple[float, float, float] | None = None,
    eps: float = 1e-7,
    ns_steps: int = DEFAULT_STEPS,
    adjust_lr_fn: str | None = None,
    *,
    schedule: str = "certified",
    ns_dtype: Any = jnp.bfloat16,
    split_sizes: Any = None,
) -> Any:
    """Muon as an optax transformation (Jordan et al., Muon, 2024; ``torch.optim.Muon``'s
    hyperparameters, see :class:`householderla.torch.Muon`).

    Parameters
    ----------
    learning_rate : float or callable
        η, or an optax schedule ``count -> η``.
    weight_decay, momentum, nesterov, ns_coefficients, eps, ns_steps, adjust_lr_fn, schedule
        As :class:`householderla.torch.Muon`.
    ns_dtype : dtype
        Precision of the orthogonalisation (default ``jnp.bfloat16``).
    split_sizes : sequence of int, or callable, optional
        Row blocks orthogonalised each on its own (:class:`householderla.torch.Muon`): one
        sequence for every leaf (each must have that many rows), or ``leaf -> sizes or
        None`` choosing per leaf (a fused QKV weight split, the others whole).

    Returns
    -------
    GradientTransformation
        ``init(params) -> MuonState`` and ``update(grads, state, params) -> (updates,
        state)`` with updates = −ηλθ − η·adjust(A, B)·polar(U).

    Examples
    --------
    >>> import jax, jax.numpy as jnp
    >>> import householderla.jax as hlj
    >>> params = {"W": jnp.ones((4, 8)) + jnp.eye(4, 8)}
    >>> tx = hlj.muon(0.02)
    >>> state = tx.init(params)
    >>> updates, state = jax.jit(tx.update)({"W": jnp.ones((4, 8))}, state, params)
    >>> params = hlj.apply_updates(params, updates)  # optax.apply_updates likewise
    """
    if not callable(learning_rate) and not 0.0 <= learning_rate:
        raise ValueError(f"Learning rate should be >= 0 but is: {learning_rate}")
    if not 0.0 <= momentum:
        raise ValueError(f"momentum should be >= 0 but is: {momentum}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"weight decay should be >= 0 but is: {weight_decay}")
    if adjust_lr_fn not in ADJUST_LR:
        raise ValueError(f"Adjust learning rate function {adjust_lr_fn} is not supported")
    if ns_coefficients is not None:
        if schedule not in ("muon", "certified"):
            raise ValueError("ns_coefficients replaces the schedule: leave schedule unset")
        schedule = "muon"
    orthogonalize(None, schedule, ns_steps, ns_coefficients)  # validates now
    if split_sizes is not None and not callable(split_sizes):
        check_split_sizes(split_sizes)

    def sizes_of(i: int, leaf: Any) -> tuple[int, ...] | None:
        sizes = split_sizes(leaf) if callable(split_sizes) else split_sizes
        if sizes is None:
            return None
        sizes = tuple(int(a) for a in sizes)
        if sum(sizes) != leaf.shape[-2] or min(sizes) < 1:
            raise ValueError(
                f"split_sizes {sizes} do not split the {leaf.shape[-2]} rows of leaf {i} "
                f"(shape {tuple(leaf.shape)}) into positive blocks"
            )
        return sizes

    def polar_step(u: Any, p: Any, lr: Any, sizes: tuple[int, ...] | None) -> Any:
        """η·adjust·polar(u), whole or per row block (equal blocks in one batched call)."""

        def polar(x: Any) -> Any:
            return orthogonalize(x, schedule, ns_steps, ns_coefficients, eps=eps)

        B = p.shape[-1]
        if sizes is None:
            return adjusted_lr(lr, adjust_lr_fn, tuple(p.shape)) * polar(u).astype(p.dtype)
        if len(set(sizes)) == 1:
            ub = u.reshape(*u.shape[:-2], len(sizes), sizes[0], B)
            O = polar(ub).reshape(u.shape).astype(p.dtype)
            return adjusted_lr(lr, adjust_lr_fn, (sizes[0], B)) * O
        blocks, start = [], 0
        for a in sizes:
            O = polar(u[..., start : start + a, :]).astype(p.dtype)
            blocks.append(adjusted_lr(lr, adjust_lr_fn, (a, B)) * O)
            start += a
        return jnp.concatenate(blocks, axis=-2)

    def init(params: Any) -> MuonState:
        for i, leaf in enumerate(jax.tree_util.tree_leaves(params)):
            if leaf.ndim < 2:
                raise ValueError(
                    f"muon optimises matrices; leaf {i} has shape {tuple(leaf.shape)}: route "
                    "it to another transformation (optax.multi_transform / optax.partition)"
                )
            sizes_of(i, leaf)  # a wrong split is named at init, not inside a jitted update
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        return MuonState(jnp.zeros((), jnp.int32), zeros)

    def update(grads: Any, state: MuonState, params: Any = None) -> tuple[Any, MuonState]:
        if params is None:
            raise ValueError("muon needs params (decoupled weight decay)")
        lr = learning_rate(state.count) if callable(learning_rate) else learning_rate

        def one(i: int, g: Any, buf: Any, p: Any) -> tuple[Any, Any]:
            buf = buf + (1.0 - momentum) * (g - buf)  # lerp, as torch.optim.Muon
            u = g + momentum * (buf - g) if nesterov else buf
            step = polar_step(u.astype(ns_dtype), p, lr, sizes_of(i, p))
            return -(lr * weight_decay) * p - step, buf

        tdef = jax.tree_util.tree_structure(params)
        pairs = [
            one(i, g, b, p)
            for i, (g, b, p) in enumerate(
                zip(
                    tdef.flatten_up_to(grads),
                    tdef.flatten_up_to(state.momentum),
                    tdef.flatten_up_to(params),
                    strict=True,
                )
            )
        ]
        updates = tdef.unflatten([u for u, _ in pairs])
        bufs = tdef.unflatten([b for _, b in pairs])
        return updates, MuonState(state.count + 1, bufs)

    return GradientTransformation(init, update)
