"""``explicit_linear``: a JAX primitive for a linear map with an explicit transpose, so that a
``custom_jvp`` rule can return our JVP as its tangent while ``jax.grad`` runs our VJP.

JAX's ``linear_call`` does this for first derivatives only: its JVP rule requires residuals
without tangents (no jvp of grad, grad of grad) and it has no batching rule (no ``jacfwd``).
Here the tangent also carries ``jax.jvp`` of ``fun`` in the residuals (plain jnp), the transpose
swaps ``fun`` and ``fun_T``, and ``vmap`` binds the vmapped pair. Written against JAX 0.10.2,
with its public extension points only (``jax.extend.core``, ``jax.interpreters``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive, unmapped_aval
from jax.interpreters import ad, batching, mlir

__all__ = ["explicit_linear"]

explicit_linear_p = Primitive("householderla_explicit_linear")
explicit_linear_p.multiple_results = True


def explicit_linear(
    fun: Callable[..., tuple[Any, ...]],
    fun_T: Callable[..., tuple[Any, ...]],
    residuals: Sequence[Any],
    linear: Sequence[Any],
    out_avals: Sequence[Any],
) -> list[Any]:
    """``fun(*residuals, *linear)``, a tuple of arrays linear in ``linear``, whose transpose
    in ``linear`` is ``fun_T(*residuals, *cotangents)`` (JAX's convention: for complex
    values the pairing Re Σ ct·y, without conjugation).

    ``out_avals``: the abstract values of ``fun``'s outputs (``jax.typeof`` of what they
    equal: shape, dtype and, inside ``jax.shard_map``, the mesh axes they vary over). ``fun``
    and ``fun_T`` must be plain ``jax.numpy`` code (differentiable, batchable) and hashable
    (module-level functions or cached closures, so that traces and compilations are reused).
    """
    lin_avals = tuple(jax.typeof(a) for a in linear)
    return explicit_linear_p.bind(
        *residuals,
        *linear,
        fun=fun,
        fun_T=fun_T,
        num_res=len(residuals),
        out_avals=tuple(out_avals),
        lin_avals=lin_avals,
    )


def _call(fun: Callable, args: Sequence[Any], avals: Sequence[Any]) -> list[Any]:
    """``fun(*args)`` in the dtypes of ``avals`` (a mixed-precision map's tangent is
    computed in the wider dtype and rounded once to its output's)."""
    outs = fun(*args)
    return [
        o if o.dtype == a.dtype else o.astype(a.dtype) for o, a in zip(outs, avals, strict=True)
    ]


def _impl(*args: Any, fun: Callable, out_avals: tuple, **_: Any) -> list[Any]:
    return _call(fun, args, out_avals)


def _abstract_eval(*args: Any, out_avals: tuple, **_: Any) -> list[Any]:
    return list(out_avals)


def _jvp(primals: Sequence[Any], tangents: Sequence[Any], **params: Any) -> tuple[list, list]:
    num_res, fun = params["num_res"], params["fun"]
    res, lin = list(primals[:num_res]), list(primals[num_res:])
    dres, dlin = tangents[:num_res], tangents[num_res:]
    out = explicit_linear_p.bind(*primals, **params)
    parts = []
    if any(type(t) is not ad.Zero for t in dlin):
        parts.append(explicit_linear_p.bind(*res, *map(ad.instantiate_zeros, dlin), **params))
    if any(type(t) is not ad.Zero for t in dres):
        # ∂fun/∂res at fixed lin: the map's second derivative, plain jax.numpy
        avals = params["out_avals"]
        dres = tuple(map(ad.instantiate_zeros, dres))
        _, t = jax.jvp(lambda *r: _call(fun, (*r, *lin), avals), tuple(res), dres)
        parts.append(list(t))
    tangent = [functools.reduce(jnp.add, ts) for ts in zip(*parts, strict=True)]
    return out, tangent


def _transpose(cts: Sequence[Any], *args: Any, **params: Any) -> list[Any]:
    num_res = params["num_res"]
    res = args[:num_res]
    if any(ad.is_undefined_primal(r) for r in res):
        raise ValueError("explicit_linear is linear in its linear arguments only")
    cts = [ad.instantiate_zeros(c) for c in cts]
    lin = explicit_linear_p.bind(
        *res,
        *cts,
        fun=params["fun_T"],
        fun_T=params["fun"],
        num_res=num_res,
        out_avals=params["lin_avals"],
        lin_avals=params["out_avals"],
    )
    return [None] * num_res + list(lin)


def _batch(args: Sequence[Any], dims: Sequence[Any], **params: Any) -> tuple[list, list]:
    """Moves every batch axis to the front (broadcasting unbatched linear arguments, whose
    transpose then returns them batched: consistent with the avals) and binds the vmapped
    pair of functions."""
    num_res = params["num_res"]
    size = next(a.shape[d] for a, d in zip(args, dims, strict=True) if d is not None)
    moved = []
    for i, (a, d) in enumerate(zip(args, dims, strict=True)):
        if d is not None:
            a = jnp.moveaxis(a, d, 0)
        elif i >= num_res:
            a = jnp.broadcast_to(a, (size, *a.shape))
        moved.append(a)
    res_axes = tuple(None if d is None else 0 for d in dims[:num_res])
    out_avals = tuple(unmapped_aval(size, 0, a) for a in params["out_avals"])
    lin_avals = tuple(unmapped_aval(size, 0, a) for a in params["lin_avals"])
    out = explicit_linear_p.bind(
        *moved,
        fun=_vmapped(params["fun"], res_axes, len(lin_avals)),
        fun_T=_vmapped(params["fun_T"], res_axes, len(out_avals)),
        num_res=num_res,
        out_avals=out_avals,
        lin_avals=lin_avals,
    )
    return out, [0] * len(out)


@functools.lru_cache(maxsize=256)
def _vmapped(fun: Callable, res_axes: tuple, num_lin: int) -> Callable:
    """``fun`` mapped over axis 0 of its batched residuals and of every linear argument
    (cached: the same pair for the same batching, so JAX reuses its traces)."""
    return jax.vmap(fun, in_axes=(*res_axes, *(0,) * num_lin), out_axes=0)


explicit_linear_p.def_impl(_impl)
explicit_linear_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[explicit_linear_p] = _jvp
ad.primitive_transposes[explicit_linear_p] = _transpose
batching.primitive_batchers[explicit_linear_p] = _batch
mlir.register_lowering(explicit_linear_p, mlir.lower_fun(_impl, multiple_results=True))
