"""householderla for JAX: every map differentiable through ``jax.custom_jvp`` rules.

Called with JAX arrays, the maps of :mod:`householderla` go through hand-derived JVPs and
backward passes (:mod:`householderla._autodiff.jax`), never through autodiff of their
internals, and compose with ``jax.grad``, ``jax.jvp``, ``jax.jit``, ``jax.vmap`` in any order
(e.g. ``jax.jit(jax.vmap(jax.grad(loss)))``, ``jax.jacfwd``); the rules are themselves
differentiable, so second derivatives work in forward and reverse mode. Arrays are never
``nondiff_argnums``. Every rule is traced with ``jax.default_matmul_precision("highest")``
(full float32 matmuls on GPU instead of TF32).

==========================================  ============================================
map                                         custom_jvp rule(s)
==========================================  ============================================
``cwy(V) @ h``, ``.T @``, ``.matrix()``     ``cwy_factors`` + ``lowrank_apply`` / ``_matrix``
``tcwy(V) @ x``, ``.T @ y``, ``.matrix()``  ``cwy_factors`` + ``lowrank_apply`` / ``_matrix``
``householder_apply``, ``_product``         ``householder_apply`` (sequential reflections)
``polar``, ``polar_retraction``             ``polar`` (X + tZ by JAX's autodiff)
``cayley_retraction``                       ``cayley_smw`` (+ ``polar`` for the drift guard)
``qr_retraction``                           ``qr_q`` (X + tZ by JAX's autodiff)
==========================================  ============================================

:func:`orthogonal_linear` is the functional form of ``hl.torch.OrthogonalLinear`` for
flax/equinox-style models: x Wᵀ for the orthogonal / Stiefel weight of reflection vectors V,
without forming W for batches of at most N rows.

float32 and float64 (``jax_enable_x64``) inputs keep their dtype.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from .. import householder as _householder
from .._autodiff.jax import PRECISION
from ..cwy import CWY, TCWY, cwy, tcwy
from ..retractions import cayley_retraction, polar, polar_retraction, qr_retraction

# -- optax-style wrapper of hl.stiefel (jax/_optax.py) and Muon (jax/_optax_muon.py) --------
from ._optax import apply_updates, stiefel_adam, stiefel_sgd, update_params
from ._optax_muon import MuonState, muon

__all__ = [
    "CWY",
    "PRECISION",
    "TCWY",
    "MuonState",
    "apply_updates",
    "cayley_retraction",
    "cwy",
    "householder_apply",
    "householder_product",
    "muon",
    "orthogonal_linear",
    "polar",
    "polar_retraction",
    "qr_retraction",
    "stiefel_adam",
    "stiefel_sgd",
    "tcwy",
    "update_params",
]


def householder_apply(V: Any, h: Any) -> Any:
    """H(v₁)(H(v₂)(…H(v_L) h)) by sequential reflections, through the ``householder_apply``
    custom_jvp rule.

    Parameters
    ----------
    V : array, shape (..., N, L)
        Reflection vectors as columns (L ≤ N); H(0) = I.
    h : array, shape (N,) or (..., N, B)

    Returns
    -------
    array, shape (..., N) or (..., N, B)
        As :func:`householderla.householder_apply`: 4·N·L·B flops forward; the backward
        replays the reflections in forward order (18·N·L·B flops, O(N·B) extra memory).
    """
    return _householder.householder_apply(V, h, xp=jnp)


def householder_product(V: Any) -> Any:
    """Dense H(v₁)…H(v_L), shape (..., N, N), by sequential reflections (4·N²·L flops)."""
    return _householder.householder_product(V, xp=jnp)


def orthogonal_linear(V: Any, x: Any) -> Any:
    """y = x Wᵀ for the weight W of reflection vectors V, W applied without being formed when
    x has at most max(in, out) rows (blocked compact WY), formed otherwise.

    Parameters
    ----------
    V : array, shape (N, L), L ≤ N
        The trainable reflection vectors: L = N gives W = cwy(V) ∈ O(N) (in = out = N);
        L < N gives the Stiefel matrix Ω = tcwy(V) (N × L), used as W = Ω (in = L, out = N)
        or W = Ωᵀ (in = N, out = L) according to ``x.shape[-1]``.
    x : array, shape (..., in)

    Returns
    -------
    array, shape (..., out)
        Through the ``cwy_factors`` / ``lowrank_apply`` custom_jvp rules, so ``jax.grad``
        reaches V (and x); ``jax.jit``-able. The flax/equinox counterpart of
        :class:`householderla.torch.OrthogonalLinear` (same cost model).

    Examples
    --------
    >>> import jax, jax.numpy as jnp, householderla as hl
    >>> V = jax.random.normal(jax.random.PRNGKey(0), (6, 6))
    >>> x = jnp.ones((2, 6))
    >>> y = hl.jax.orthogonal_linear(V, x)
    >>> bool(jnp.allclose(y, x @ hl.cwy(V).matrix().T, atol=1e-5))
    True
    """
    N, L = V.shape[-2], V.shape[-1]
    k = x.shape[-1]
    if L == N and k == N:
        op = cwy(V)
    elif L < N and k in (L, N):
        op = tcwy(V) if k == L else tcwy(V).T
    else:
        raise ValueError(
            f"x must have shape (..., {L}) or (..., {N}) for V of shape {tuple(V.shape)} "
            f"(square V: (..., {N})); got {tuple(x.shape)}"
        )
    x2 = jnp.reshape(x, (-1, k))
    out = op.shape[-2]
    if x2.shape[0] <= max(N, L):
        y = (op @ x2.T).T
    else:
        y = x2 @ op.matrix().T
    return jnp.reshape(y, (*x.shape[:-1], out))


def __dir__() -> list[str]:
    """Only the public names: the imports above stay attributes but are not listed."""
    return sorted(__all__)
