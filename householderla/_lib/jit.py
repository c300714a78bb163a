"""The one compilation helper: JAX functions compiled once per shape, and the branch that
works on eager and traced values alike.

``jit_for(xp, fn, static)`` is the only ``jax.jit`` cache of the package: every backend-neutral
kernel that JAX would otherwise dispatch (and compile) operation by operation goes through it;
other namespaces get ``fn`` itself. Under an outer ``jax.jit`` the compiled function is inlined.
"""

from __future__ import annotations

import functools
from typing import Any

import array_api_compat as aac

__all__ = ["fori", "host", "jit_for", "kernel_namespace", "select"]


def jit_for(xp: Any, fn: Any, static: tuple[int, ...] = (0,)) -> Any:
    """``fn`` compiled once per shape on JAX, ``fn`` itself elsewhere.

    ``static`` are the positions of Python-valued arguments (the namespace, counts, flags);
    the default ``(0,)`` fits kernels written as ``fn(xp, *arrays)``.
    """
    return _jax_jit(fn, static) if aac.is_jax_namespace(xp) else fn


@functools.cache
def _jax_jit(fn: Any, static: tuple[int, ...]) -> Any:
    import jax

    return jax.jit(fn, static_argnums=static)


def host(x: Any) -> float:
    """A 0-d array's value as a Python float, detached from autograd (eager arrays only)."""
    return float(x.detach()) if hasattr(x, "detach") else float(x)


def kernel_namespace(xp: Any) -> Any:
    """The namespace the kernels run with: NumPy ≥ 2 itself for array-api-compat's NumPy
    wrapper (the same functions without a per-call wrapper, 3× less overhead on the many
    small M × M and batch-shaped operations), ``xp`` otherwise."""
    if aac.is_numpy_namespace(xp):
        import numpy

        return numpy
    return xp


def fori(xp: Any, n: int, body: Any, carry: Any) -> Any:
    """``carry = body(k, carry)`` for k = 0, …, n − 1: ``jax.lax.fori_loop`` on JAX (one
    compiled body whatever n; a Python loop unrolled under ``jax.jit`` compiles n copies), a
    Python loop elsewhere. ``body`` must keep the carry's shapes (index with k, mask by it)."""
    if aac.is_jax_namespace(xp):
        import jax

        return jax.lax.fori_loop(0, n, body, carry)
    for k in range(n):
        carry = body(k, carry)
    return carry


def select(xp: Any, eager: bool, pred: Any, on_true: Any, on_false: Any) -> Any:
    """``on_true()`` if ``pred`` else ``on_false()``: a Python branch on eager arrays,
    ``lax.cond`` under JAX tracing (only one branch runs), ``where`` on other lazy arrays."""
    if eager:
        return on_true() if bool(pred) else on_false()
    if aac.is_jax_namespace(xp):
        import jax

        return jax.lax.cond(pred, on_true, on_false)
    return xp.where(pred, on_true(), on_false())  # pragma: no cover - dask
