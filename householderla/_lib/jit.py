"""The compilation helpers: JAX functions compiled once per shape, and the branch that
works on eager and traced values alike.

``jit_for(xp, fn, static)`` compiles a backend-neutral kernel that JAX would otherwise dispatch
(and compile) operation by operation; other namespaces get ``fn`` itself. ``eager_program``
runs a whole step (an optimizer's) as one program on eager JAX arrays, with the value checks
it would have made on the way (``defer``) made on the host after it. Under an outer
``jax.jit`` both are inlined.
"""

from __future__ import annotations

import collections
import contextvars
import functools
from collections.abc import Callable
from typing import Any

import array_api_compat as aac

__all__ = [
    "defer",
    "deferring",
    "eager_program",
    "fori",
    "host",
    "jit_for",
    "kernel_namespace",
    "select",
]


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


#: the checks deferred while ``eager_program`` traces its function (None otherwise)
_DEFERRED: contextvars.ContextVar[list | None] = contextvars.ContextVar("hl_deferred", default=None)
#: compiled programs by key (an optimizer's kind and flags), the most recently used
#: last; at most ``MAX_PROGRAMS`` kept
_PROGRAMS: collections.OrderedDict[Any, Any] = collections.OrderedDict()
MAX_PROGRAMS = 32


def deferring(xp: Any) -> bool:
    """Whether ``eager_program`` is tracing: a value check cannot look now but can be deferred.
    Only JAX namespaces are asked (dynamo cannot trace ``ContextVar.get``: under
    ``torch.compile`` the question alone would break the graph)."""
    return aac.is_jax_namespace(xp) and _DEFERRED.get() is not None


def defer(value: Any, check: Callable[[float], None]) -> None:
    """``check(float(value))`` after the program ``eager_program`` is tracing has run (in the
    order deferred: the first that raises is the error the eager step would have raised)."""
    _DEFERRED.get().append((value, check))


def eager_program(key: Any, fn: Callable, static: tuple[int, ...], *args: Any) -> Any:
    """``fn(*args)`` on eager JAX arrays as one compiled program (one per ``key`` and shape),
    then its deferred checks on the host. ``key`` must determine what ``fn`` closes over (the
    closures of two optimizers of the same kind and flags share one program); values that
    vary (an optimizer's float hyperparameters) go in ``args``, traced, so a new value
    compiles nothing; ``static`` are the positions of Python-valued arguments. Eager JAX
    otherwise compiles and dispatches each operation of the step, each on its own
    (``docs/adapters.rst`` has the figures).

    At most ``MAX_PROGRAMS`` programs are kept, the least recently used dropped (each holds
    its compiled executables)."""
    import jax

    program = _PROGRAMS.get(key)
    if program is None:
        program = _PROGRAMS[key] = _with_checks(fn, static)
        while len(_PROGRAMS) > MAX_PROGRAMS:
            _PROGRAMS.popitem(last=False)
    else:
        _PROGRAMS.move_to_end(key)
    # arrays committed to their device, as the program's results are: a mix of uncommitted
    # (jnp.asarray) and committed arguments is another cache entry, so the second step of a
    # loop would compile the program again
    args = jax.tree_util.tree_map(
        lambda a: a if getattr(a, "committed", True) else jax.device_put(a, a.sharding), args
    )
    out, checks = program(*args)
    for value, check in zip(checks.values, checks.checks, strict=True):
        check(host(value))
    return out


class _Checks:
    """The deferred checks of a program: the values as its outputs, the checks as the static
    part of its output tree (a pytree node; registered with JAX on first use)."""

    def __init__(self, values: tuple, checks: tuple) -> None:
        self.values, self.checks = values, checks


def _with_checks(fn: Callable, static: tuple[int, ...]) -> Any:
    import jax

    if not getattr(_Checks, "_registered", False):
        jax.tree_util.register_pytree_node(
            _Checks, lambda c: (c.values, c.checks), lambda checks, values: _Checks(values, checks)
        )
        _Checks._registered = True

    def traced(*args: Any) -> tuple[Any, _Checks]:
        token = _DEFERRED.set([])
        try:
            out = fn(*args)
            found = _DEFERRED.get()
        finally:
            _DEFERRED.reset(token)
        return out, _Checks(tuple(v for v, _ in found), tuple(c for _, c in found))

    return jax.jit(traced, static_argnums=static)


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
