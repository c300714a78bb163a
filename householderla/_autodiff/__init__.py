"""The one autodiff switch: which rule table a call runs through.

Every differentiable primitive has one rule per table, with one signature: ``cwy_factors``
``(xp, V, sdiag)``, ``lowrank`` ``(xp, U, T, h, transpose, mode, out)``, ``householder_apply``
``(xp, V, h)``, ``polar`` ``(xp, X, num_iters, restart)``, ``cayley`` ``(xp, X, Z, step)``,
``qr_q`` ``(xp, Y)``. Tables: :mod:`.plain` (nothing recorded), :mod:`.torch`
(``autograd.Function``s calling our VJPs) and :mod:`.jax` (``custom_jvp`` rules), imported on
first use. :func:`route` picks the table from a call's arrays, :func:`call` runs a rule. This
package imports the layers below it, never a public module.
"""

from __future__ import annotations

from typing import Any

import array_api_compat as aac

from .._lib.tracing import needs_graph

__all__ = ["ROUTES", "call", "route"]

ROUTES = ("plain", "torch", "jax")
_TABLES: dict[str, dict[str, Any]] = {}


def route(xp: Any, *arrays: Any) -> str:
    """ "jax" for JAX (custom_jvp costs nothing when nothing differentiates), "torch" when a
    graph will be recorded or a ``torch.func`` transform wraps an input, "plain" otherwise."""
    if aac.is_jax_namespace(xp):
        return "jax"
    if aac.is_torch_namespace(xp) and needs_graph(*arrays):
        return "torch"
    return "plain"


def call(route: str, rule: str, xp: Any, *args: Any) -> Any:
    """Run ``rule`` of the table ``route`` (see the module docstring for the signatures)."""
    table = _TABLES.get(route)
    if table is None:
        table = _TABLES[route] = _load(route)
    return table[rule](xp, *args)


def _load(route: str) -> dict[str, Any]:
    # import statements, not importlib.import_module: torch.compile runs an import statement
    # while tracing (a first call may happen there) but breaks the graph on importlib
    if route == "plain":
        from . import plain as table
    elif route == "torch":
        from . import torch as table
    elif route == "jax":
        from . import jax as table
    else:
        raise ValueError(f"route must be one of {ROUTES}; got {route!r}")
    return table.RULES
