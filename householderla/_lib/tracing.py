"""Whether an array's values can be inspected now, and whether autodiff will follow.

JAX tracers, Dask arrays and tensors batched by ``torch.func.vmap`` hold no values yet; torch
tensors that require grad (or that a ``torch.func`` transform wraps) must go through the
``torch.autograd.Function``s of :mod:`householderla._autodiff.torch`. Nothing here imports a
framework: torch and JAX are looked up in ``sys.modules`` (they are imported already whenever
one of their arrays exists).
"""

from __future__ import annotations

import sys
from typing import Any

import array_api_compat as aac
import numpy as np

__all__ = ["is_eager", "is_transformed", "is_vmapped", "needs_graph"]


def is_transformed(x: Any) -> bool:
    """True for a tensor wrapped by a ``torch.func`` transform (grad, vmap, jvp levels).
    False while ``torch.compile`` traces: dynamo cannot call the functorch query (a graph
    break) and handles the transforms itself."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor) or torch.compiler.is_compiling():
        return False
    return torch._C._functorch.is_functorch_wrapped_tensor(x)


def is_vmapped(x: Any) -> bool:
    """True for a tensor batched by ``torch.func.vmap`` at some level (``bool(x)`` raises)."""
    while is_transformed(x):
        functorch = sys.modules["torch"]._C._functorch
        if functorch.is_batchedtensor(x):
            return True
        x = functorch.get_unwrapped(x)
    return False


def needs_graph(*tensors: Any) -> bool:
    """Whether a torch call must go through the autograd ``Function``s: grad is enabled and
    an input requires grad, a ``torch.func`` transform wraps an input, or an input is a
    forward-mode dual tensor. False for anything that is not a torch tensor (None included)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    grad = torch.is_grad_enabled()
    dual = _forward_level(torch) >= 0
    return any(
        isinstance(t, torch.Tensor)
        and ((grad and t.requires_grad) or is_transformed(t) or (dual and _is_dual(torch, t)))
        for t in tensors
    )


def _forward_level(torch: Any) -> int:
    """The innermost ``torch.autograd.forward_ad.dual_level`` (−1 outside one)."""
    return torch.autograd.forward_ad._current_level


def _is_dual(torch: Any, t: Any) -> bool:
    """Whether ``t`` carries a forward-mode tangent (a dual tensor of ``forward_ad``): its
    products must go through the ``Function``s, whose ``jvp`` carries the tangent on."""
    return torch.autograd.forward_ad.unpack_dual(t).tangent is not None


def is_eager(x: Any) -> bool:
    """True when the values of ``x`` can be inspected now (not a JAX tracer, not Dask, not a
    tensor batched by ``torch.func.vmap``, no tensor while ``torch.compile`` traces: value
    checks are skipped there as under ``jax.jit``, instead of breaking the graph)."""
    if type(x) is np.ndarray:
        return True
    if aac.is_jax_array(x):
        jax = sys.modules.get("jax")
        return jax is None or not isinstance(x, jax.core.Tracer)
    if aac.is_dask_array(x):
        return False
    if aac.is_torch_array(x):
        return not (sys.modules["torch"].compiler.is_compiling() or is_vmapped(x))
    return not aac.is_lazy_array(x)
