"""optax-style front end of the momentum Stiefel optimizers (Kong, Wang & Tao, ICLR 2023,
Algorithms 1, 2, 4, 5), re-exported from ``householderla.jax``.

:func:`stiefel_sgd` / :func:`stiefel_adam` return an ``optax.GradientTransformation`` (a NamedTuple
with the same fields without optax). A Stiefel leaf's update is X⁺ − X, so ``apply_updates`` is
within one rounding of X⁺ (:func:`update_params` returns X⁺ itself). ``stiefel`` selects the
Stiefel leaves (bool, pytree prefix or function); others get the Euclidean update. Wide leaves go
through their transpose; complex leaves take ``jax.grad``'s conjugate gradient as it is
(``complex_grads="jax"``) or an already conjugated one (``"gradient"``). ``row_axis``: leaves
sharded by rows step under ``jax.shard_map`` with M×M collectives (``_interop/jax_mesh.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from .. import stiefel as S
from .._interop.jax_mesh import MeshRows, shard_rows
from .._lib.tracing import is_eager

__all__ = [
    "GradientTransformation",
    "apply_updates",
    "stiefel_adam",
    "stiefel_sgd",
    "update_params",
]


class _GradientTransformation(NamedTuple):
    """Stand-in for ``optax.GradientTransformation`` (same fields) when optax is absent."""

    init: Any
    update: Any


try:  # a real optax transformation when optax is there, never a hard dependency
    from optax import GradientTransformation
except ImportError:  # pragma: no cover - depends on the environment
    GradientTransformation = _GradientTransformation


def _mT(x: Any) -> Any:
    return x.mT if hasattr(x, "mT") else jax.numpy.swapaxes(x, -1, -2)


class SkipState(NamedTuple):
    """State with ``nonfinite="skip"``: the per-leaf states and the number of skipped steps."""

    inner: Any
    skipped: Any


NONFINITE = ("raise", "skip")
#: What the grads of complex leaves are: jax.grad's output (conjugated here) or the gradient.
COMPLEX_GRADS = ("jax", "gradient")


class _Update:
    """``update(grads, state, params)`` of the transformation; ``.step`` gives new params."""

    def __init__(
        self,
        manifold: S.StiefelOptimizer,
        euclid: S.StiefelOptimizer,
        mask: Any,
        nonfinite: str = "raise",
        complex_grads: str = "jax",
        mesh: Any = None,
        sharded: S.StiefelOptimizer | None = None,
    ):
        if nonfinite not in NONFINITE:
            raise ValueError(f"nonfinite must be one of {NONFINITE}; got {nonfinite!r}")
        if complex_grads not in COMPLEX_GRADS:
            raise ValueError(f"complex_grads must be one of {COMPLEX_GRADS}; got {complex_grads!r}")
        self.manifold, self.euclid, self.mask, self.nonfinite = manifold, euclid, mask, nonfinite
        self.conj = complex_grads == "jax"
        # row-sharded Stiefel leaves: (mesh, axis) and the optimizer reducing over the axis
        self.mesh, self.sharded = mesh, sharded

    def manifold_init(self, x: Any) -> Any:
        if self.sharded is None:
            return self.manifold.init(x)
        mesh, axis = self.mesh
        kind = type(jax.eval_shape(self.manifold.init, x))  # the state's NamedTuple
        return shard_rows(self.sharded.init, mesh, axis, x.ndim, kind, update=False)(x)

    def manifold_update(self, x: Any, g: Any, s: Any) -> tuple[Any, Any]:
        if self.sharded is None:
            return self.manifold.update(x, g, s)
        mesh, axis = self.mesh
        return shard_rows(self.sharded.update, mesh, axis, x.ndim, type(s), update=True)(x, g, s)

    def leaves(self, params: Any) -> tuple[list[Any], Any, list[bool]]:
        leaves, treedef = jax.tree_util.tree_flatten(params)
        mask = self.mask(params) if callable(self.mask) else self.mask
        if isinstance(mask, bool):
            flags = [mask] * len(leaves)
        else:  # a prefix of the params' structure, broadcast over each subtree
            tm = jax.tree_util.tree_map
            flags = treedef.flatten_up_to(tm(lambda m, sub: tm(lambda _: m, sub), mask, params))
        for i, (leaf, flag) in enumerate(zip(leaves, flags, strict=True)):
            if not isinstance(flag, bool):
                raise ValueError(f"stiefel must give a Python bool per leaf; leaf {i}: {flag!r}")
            if flag and leaf.ndim < 2:
                raise ValueError(
                    f"leaf {i} has shape {tuple(leaf.shape)} but is marked stiefel; Stiefel "
                    "leaves need (..., N, M) — mark it False (stiefel= mask or function)"
                )
        return leaves, treedef, flags

    def init(self, params: Any) -> Any:
        leaves, treedef, flags = self.leaves(params)
        states = [
            self.manifold_init(_orient(x)) if flag else self.euclid.init(x)
            for x, flag in zip(leaves, flags, strict=True)
        ]
        inner = treedef.unflatten(states)
        if self.nonfinite == "skip":
            return SkipState(inner, jax.numpy.zeros((), dtype=jax.numpy.int32))
        return inner

    def step(self, grads: Any, state: Any, params: Any) -> tuple[Any, Any]:
        """(new params, new state): X⁺ exactly, without the rounding of X + (X⁺ − X)."""
        if params is None:
            raise ValueError("params are required: a Stiefel step depends on the point X")
        leaves, treedef, flags = self.leaves(params)
        g_leaves = treedef.flatten_up_to(grads)
        outer, state = (state, state.inner) if self.nonfinite == "skip" else (None, state)
        s_leaves = treedef.flatten_up_to(state)
        jnp = jax.numpy
        finite = [jnp.all(jnp.isfinite(g)) for g in g_leaves]
        if self.nonfinite == "raise":
            bad = [i for i, ok in enumerate(finite) if is_eager(ok) and not bool(ok)]
            if bad:  # checked before any leaf moves; under jax.jit NaN propagates instead
                paths = [
                    jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(params)
                ]
                names = ", ".join(paths[i] or "(root)" for i in bad)
                raise ValueError(
                    f"the gradient of {names} contains NaN or Inf; no parameter was changed "
                    "(nonfinite='skip' skips such steps)"
                )
        new_params, new_states = [], []
        for x, g, s, flag in zip(leaves, g_leaves, s_leaves, flags, strict=True):
            if self.conj and jnp.iscomplexobj(g):
                g = jnp.conj(g)  # jax.grad's cotangent -> the gradient ∂L/∂Re + i ∂L/∂Im
            if flag:
                wide = x.shape[-2] < x.shape[-1]
                x_new, s_new = self.manifold_update(_orient(x), _orient(g), s)
                x_new = _mT(x_new) if wide else x_new
            else:
                x_new, s_new = self.euclid.update(x, g, s)
            new_params.append(x_new)
            new_states.append(s_new)
        new_params, new_state = treedef.unflatten(new_params), treedef.unflatten(new_states)
        if self.nonfinite != "skip":
            return new_params, new_state
        ok = jnp.all(jnp.stack(finite)) if finite else jnp.asarray(True)
        keep = jax.tree_util.tree_map  # all or nothing, without Python control flow (jit)
        new_params = keep(lambda new, old: jnp.where(ok, new, old), new_params, params)
        new_state = keep(lambda new, old: jnp.where(ok, new, old), new_state, state)
        return new_params, SkipState(new_state, outer.skipped + jnp.where(ok, 0, 1))

    def __call__(self, updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        new_params, new_state = self.step(updates, state, params)
        return jax.tree_util.tree_map(lambda a, b: a - b, new_params, params), new_state


def _orient(x: Any) -> Any:
    """The tall view of a leaf: xᵀ for a wide one (N < M)."""
    return _mT(x) if x.shape[-2] < x.shape[-1] else x


def _transformation(update: _Update) -> Any:
    return GradientTransformation(update.init, update)


def _on_mesh(mesh: Any, row_axis: Any, make: Callable[..., Any]) -> tuple[Any, Any]:
    """((mesh, row_axis), ``make(rows=...)`` reducing over row_axis), or (None, None)."""
    if row_axis is None:
        if mesh is not None:
            raise ValueError("mesh is given without row_axis: name the mesh axis of the rows")
        return None, None
    names = row_axis if isinstance(row_axis, tuple) else (row_axis,)
    if mesh is not None and not set(names) <= set(mesh.axis_names):
        raise ValueError(f"row_axis {row_axis!r} is not an axis of the mesh {mesh.axis_names}")
    return (mesh, row_axis), make(rows=MeshRows(row_axis))


def stiefel_sgd(
    lr: float = 0.1,
    momentum: float = 0.9,
    metric: Any = 0.5,
    *,
    expm_method: str = "euler",
    transport: str = "energy",
    nesterov: bool = False,
    dampening: float = 0.0,
    stiefel: bool | Any | Callable[[Any], Any] = True,
    nonfinite: str = "raise",
    complex_grads: str = "jax",
    row_axis: Any = None,
    mesh: Any = None,
) -> Any:
    """Momentum SGD on Stiefel leaves (Kong, Wang & Tao, ICLR 2023, Algorithm 1) as an optax
    transformation.

    Parameters
    ----------
    lr, momentum, metric, expm_method, transport, nesterov, dampening
        As in :func:`householderla.stiefel.momentum_sgd` (and, for the Euclidean leaves,
        :func:`~householderla.stiefel.euclidean_sgd`).
    stiefel : bool, pytree of bools, or callable
        Which leaves are Stiefel matrices (default: all); the others get
        :func:`~householderla.stiefel.euclidean_sgd` with the same lr and momentum.
    nonfinite : {"raise", "skip"}
        A NaN/Inf gradient: ``ValueError`` naming the leaf before anything moves (eager; under
        ``jax.jit`` values cannot be inspected and NaN propagates), or "skip": the whole step
        keeps params and state (``jnp.where``, so it works under ``jax.jit``) and
        ``state.skipped`` counts such steps.
    complex_grads : {"jax", "gradient"}
        Complex leaves (complex Stiefel / U(n) matrices with Hermitian transposes, or
        Euclidean): "jax" (default) takes ``jax.grad``'s output, ∂L/∂Re z − i ∂L/∂Im z, and
        conjugates it; "gradient" takes ∂L/∂Re z + i ∂L/∂Im z (what optax's own optimizers
        expect, ``jnp.conj(jax.grad(...))``). Real leaves are unaffected.
    row_axis : str or tuple of str, optional
        The Stiefel leaves are sharded by rows over this axis of a device mesh
        (``NamedSharding(mesh, P(..., row_axis, None))`` of a tall leaf (..., N, M),
        ``P(..., None, row_axis)`` of a wide one, the batch dimensions replicated): each step
        runs under ``jax.shard_map``, each device on its own rows, and what it needs from the
        others is sums and maxima of M×M matrices (``psum``, ``pmax``; the QR fallback of the
        polar step gathers the M×M R factors), never X (``docs/distributed.rst``, "JAX: a
        mesh"). The rows must split evenly over the axis; the result and the state's U (Adam's
        q) keep the row sharding, Z and p are replicated. The same steps as on one device up
        to the order of the sums. Default: GSPMD partitions the step as it sees fit (under
        ``jax.jit`` a row-sharded X is then gathered in the polar step's QR fallback).
    mesh : jax.sharding.Mesh, optional
        The mesh of ``row_axis``; default: the mesh set by ``jax.set_mesh``.

    Returns
    -------
    GradientTransformation
        ``init(params)`` and ``update(grads, state, params) -> (updates, state)`` with
        ``updates = X⁺ − X`` (add them with ``optax.apply_updates`` or :func:`apply_updates`;
        :func:`update_params` returns X⁺ directly). Usable inside ``jax.jit``.

    Examples
    --------
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> import householderla.jax as hlj
    >>> X = jnp.asarray(np.linalg.qr(np.random.default_rng(0).standard_normal((6, 2)))[0])
    >>> params = {"W": X, "b": jnp.zeros(2)}
    >>> tx = hlj.stiefel_sgd(0.1, stiefel={"W": True, "b": False})
    >>> state = tx.init(params)
    >>> grads = {"W": jnp.ones((6, 2)), "b": jnp.ones(2)}
    >>> updates, state = jax.jit(tx.update)(grads, state, params)
    >>> params = hlj.apply_updates(params, updates)
    >>> W = params["W"]  # orthonormal to the rounding of its dtype (float32 without x64)
    >>> bool(jnp.abs(W.T @ W - jnp.eye(2)).max() < 10 * jnp.finfo(W.dtype).eps)
    True
    """
    kw = {"nesterov": nesterov, "dampening": dampening}
    make = functools.partial(
        S.momentum_sgd, lr, momentum, metric, expm_method=expm_method, transport=transport, **kw
    )
    euclid = S.euclidean_sgd(lr, momentum, **kw)
    on_mesh = _on_mesh(mesh, row_axis, make)
    return _transformation(_Update(make(), euclid, stiefel, nonfinite, complex_grads, *on_mesh))


def stiefel_adam(
    lr: float = 1e-3,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    metric: Any = 0.5,
    *,
    expm_method: str = "euler",
    transport: str = "energy",
    amsgrad: bool = False,
    stiefel: bool | Any | Callable[[Any], Any] = True,
    nonfinite: str = "raise",
    complex_grads: str = "jax",
    row_axis: Any = None,
    mesh: Any = None,
) -> Any:
    """Adam on Stiefel leaves (Kong, Wang & Tao, ICLR 2023, Algorithm 2) as an optax transformation.

    Parameters
    ----------
    lr, b1, b2, eps, metric, expm_method, transport, amsgrad
        As in :func:`householderla.stiefel.adam`.
    stiefel : bool, pytree of bools, or callable
        As in :func:`stiefel_sgd`; non-Stiefel leaves get
        :func:`~householderla.stiefel.euclidean_adam` (Algorithm 2's bias correction, which
        is not ``optax.adam``'s).
    nonfinite, complex_grads, row_axis, mesh
        As in :func:`stiefel_sgd`.

    Returns
    -------
    GradientTransformation
        As in :func:`stiefel_sgd`.
    """
    kw = {"expm_method": expm_method, "transport": transport, "amsgrad": amsgrad}
    make = functools.partial(S.adam, lr, b1, b2, eps, metric, **kw)
    euclid = S.euclidean_adam(lr, b1, b2, eps, amsgrad=amsgrad)
    on_mesh = _on_mesh(mesh, row_axis, make)
    return _transformation(_Update(make(), euclid, stiefel, nonfinite, complex_grads, *on_mesh))


def update_params(tx: Any, grads: Any, state: Any, params: Any) -> tuple[Any, Any]:
    """``(new_params, new_state)`` for a transformation made by :func:`stiefel_sgd` or
    :func:`stiefel_adam`: the new points themselves, without the one rounding that
    ``apply_updates(params, updates)`` adds. Usable inside ``jax.jit``."""
    if not isinstance(tx.update, _Update):
        raise TypeError("update_params needs a transformation made by stiefel_sgd/stiefel_adam")
    return tx.update.step(grads, state, params)


def apply_updates(params: Any, updates: Any) -> Any:
    """``params + updates`` leaf by leaf, as ``optax.apply_updates``: for a Stiefel leaf the
    result is X⁺ up to one rounding per entry (updates have the leaves' dtypes)."""
    return jax.tree_util.tree_map(lambda p, u: p + u, params, updates)
