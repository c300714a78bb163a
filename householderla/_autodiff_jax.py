"""JAX ``custom_vjp`` wiring of the explicit CWY backward passes (imported only for JAX input).

The same two primitives as the torch wiring: V ↦ (U, T, r) and (U, T, h) ↦ R(h) − U_out M
U_inᵀ h, whose backward passes are the hand-derived ones in
:mod:`householderla._compact_wy`. Static arguments (``transpose``, ``mode``) are Python
values in ``nondiff_argnums``; arrays never are.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from . import _compact_wy as K


def _j(*arrays: Any) -> Any:
    """JAX hands custom rules NumPy arrays and literals too: make them jax arrays."""
    return tuple(None if a is None else jnp.asarray(a) for a in arrays)


@jax.custom_vjp
def cwy_factors(V: Any) -> tuple[Any, Any, Any]:
    """V ↦ (U, T, r): unit columns, T = S⁻¹ and the column norms (∂‖v‖/∂v = u)."""
    return K.cwy_factors(*_j(V), jnp, check=False)


def _factors_fwd(V: Any) -> tuple[tuple[Any, Any, Any], tuple[Any, Any, Any]]:
    U, T, r = K.cwy_factors(*_j(V), jnp, check=False)
    return (U, T, r), (U, T, r)


def _factors_bwd(res: tuple[Any, Any, Any], cts: tuple[Any, Any, Any]) -> tuple[Any]:
    U, T, r = res
    U_bar, T_bar, r_bar = _j(*cts)
    V_bar = K.factors_vjp(U, r, U_bar, K.s_bar_from_t_bar(T, T_bar), jnp) + U * r_bar
    return (V_bar,)


cwy_factors.defvjp(_factors_fwd, _factors_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def lowrank_apply(U: Any, T: Any, h: Any, transpose: bool, mode: str) -> Any:
    """R(h) − U_out M U_inᵀ h."""
    U, T, h = _j(U, T, h)
    return K.lowrank_apply(U, T, h, jnp, transpose=transpose, mode=mode)


def _apply_fwd(U: Any, T: Any, h: Any, transpose: bool, mode: str) -> tuple[Any, Any]:
    U, T, h = _j(U, T, h)
    return K.lowrank_apply(U, T, h, jnp, transpose=transpose, mode=mode), (U, T, h)


def _apply_bwd(transpose: bool, mode: str, res: Any, g: Any) -> tuple[Any, Any, Any]:
    U, T, h, g = _j(*res, g)
    U_bar, h_bar, T_bar, _ = K.lowrank_vjp(U, T, h, g, jnp, transpose=transpose, mode=mode)
    return U_bar, T_bar, h_bar


lowrank_apply.defvjp(_apply_fwd, _apply_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def lowrank_matrix(U: Any, T: Any, transpose: bool, mode: str) -> Any:
    """The dense matrix R(I) − U_out M U_inᵀ."""
    U, T = _j(U, T)
    return K.lowrank_apply(U, T, None, jnp, transpose=transpose, mode=mode)


def _matrix_fwd(U: Any, T: Any, transpose: bool, mode: str) -> tuple[Any, Any]:
    U, T = _j(U, T)
    return K.lowrank_apply(U, T, None, jnp, transpose=transpose, mode=mode), (U, T)


def _matrix_bwd(transpose: bool, mode: str, res: Any, G: Any) -> tuple[Any, Any]:
    U, T, G = _j(*res, G)
    U_bar, _, T_bar, _ = K.lowrank_vjp(U, T, None, G, jnp, transpose=transpose, mode=mode)
    return U_bar, T_bar


lowrank_matrix.defvjp(_matrix_fwd, _matrix_bwd)

# Compiled once per shape: eager calls then run one XLA executable instead of dispatching
# (and compiling) every operation; under an outer ``jax.jit`` these are inlined.
cwy_factors = jax.jit(cwy_factors)
lowrank_apply = jax.jit(lowrank_apply, static_argnums=(3, 4))
lowrank_matrix = jax.jit(lowrank_matrix, static_argnums=(2, 3))
