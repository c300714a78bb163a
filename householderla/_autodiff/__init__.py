"""The one autodiff switch: which rule table a call runs through.

Every differentiable primitive of the package has one rule per table, with one signature:

=====================  =========================================  ==========================
rule                   arguments                                  returns
=====================  =========================================  ==========================
``cwy_factors``        ``(xp, V, sdiag)``                         ``(U, T, r)``
``lowrank``            ``(xp, U, T, h, transpose, mode, out)``    ``R(h) − U_out M U_inᵀ h``
``householder_apply``  ``(xp, V, h)``                             ``H(v₁)…H(v_L) h``
``polar``              ``(xp, X, num_iters, restart)``            ``(Q, info)``
``cayley``             ``(xp, X, Z, step)``                       ``(Y, drift)``
``qr_q``               ``(xp, Y)``                                ``qf(Y)``
=====================  =========================================  ==========================

``sdiag`` is None for reflections (diag S = ½) or the constant diagonal of S for LAPACK's
complex reflectors (no cotangent). ``out`` (optional, ``h=None`` only) is the dtype the dense
matrix is rounded to once: the half dtype of V, whose factors are float32. Tables:
:mod:`.plain` (the backend-neutral forward, nothing recorded), :mod:`.torch`
(``torch.autograd.Function``s whose backward calls our explicit VJPs; torch.func-ready) and
:mod:`.jax` (``jax.custom_vjp`` rules, compiled once per shape). :func:`route` picks the
table from the arrays of a call, :func:`call` runs a rule. Tables are imported on first use,
so torch and JAX are imported only when their arrays arrive.
This package imports the layers below it (``_lib``, ``_agnostic``, ``_kernels``,
``_interop``), never a public module.
"""

from __future__ import annotations

from typing import Any

import array_api_compat as aac

from .._lib.tracing import needs_graph

__all__ = ["ROUTES", "call", "route"]

ROUTES = ("plain", "torch", "jax")
_TABLES: dict[str, dict[str, Any]] = {}


def route(xp: Any, *arrays: Any) -> str:
    """ "jax" for JAX (custom_vjp costs nothing when nothing differentiates), "torch" when a
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
