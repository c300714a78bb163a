"""Argument checks shared by every public function: shapes, names, finiteness.

Each check raises ``ValueError`` (``TypeError`` for a wrong kind of argument) whose message
names the argument as the caller's signature does. Shape checks are static (they run under
``jax.jit`` too); value checks (NaN/Inf) run on eager arrays only and cost one reduction.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from .device import emulated_kind
from .tracing import is_eager, is_transformed

__all__ = [
    "STRUCTURES",
    "RankDeficientError",
    "as_matrix_operand",
    "broadcast_batch",
    "check_choice",
    "check_cotangent",
    "check_finite",
    "check_finite_columns",
    "check_finite_norms",
    "check_like",
    "check_metric",
    "check_real",
    "check_reflectors",
    "check_stiefel_shape",
    "check_structure",
    "finite_reflectors",
]

#: Values of the ``structure=`` argument of :func:`householderla.cwy` / ``tcwy``.
STRUCTURES = ("auto", "trapezoidal", "dense")


class RankDeficientError(ValueError):
    """A matrix that must have full rank does not (a ``ValueError``, so existing handlers
    catch it); raised on eager arrays only."""


#: Values of the ``metric=`` argument of the retractions and optimizers.
METRICS = ("canonical", "euclidean")


def check_reflectors(V: Any, name: str = "V") -> tuple[int, int]:
    """(N, L) of reflection vectors V (..., N, L) with L ≤ N."""
    if V.ndim < 2:
        raise ValueError(
            f"{name} must have shape (..., N, L) with one reflection vector per column; "
            f"got shape {tuple(V.shape)}"
        )
    N, L = V.shape[-2], V.shape[-1]
    if L > N:
        raise ValueError(
            f"{name} has L={L} reflection vectors of length N={N}; need L <= N "
            f"(shape (..., N, L), got {tuple(V.shape)})"
        )
    return N, L


def check_stiefel_shape(X: Any, name: str = "X") -> tuple[int, int]:
    """(N, M) of X (..., N, M) with M ≤ N."""
    if X.ndim < 2 or X.shape[-1] > X.shape[-2]:
        raise ValueError(
            f"{name} must have shape (..., N, M) with M <= N; got shape {tuple(X.shape)}"
        )
    return X.shape[-2], X.shape[-1]


def check_like(Z: Any, X: Any, name: str) -> None:
    """``Z`` has exactly the shape of ``X``."""
    if tuple(Z.shape) != tuple(X.shape):
        raise ValueError(f"{name} must have the shape of X {tuple(X.shape)}; got {tuple(Z.shape)}")


def check_cotangent(g: Any, shape: Sequence[int], name: str) -> None:
    """A cotangent has the shape of the forward output."""
    if tuple(g.shape) != tuple(shape):
        raise ValueError(
            f"{name} must have the shape of the forward output {tuple(shape)}; got {tuple(g.shape)}"
        )


def check_metric(metric: Any) -> bool:
    """True for the Euclidean metric, False for the canonical one; ValueError otherwise."""
    if metric not in METRICS:
        raise ValueError(f"metric must be 'canonical' or 'euclidean'; got {metric!r}")
    return metric == "euclidean"


def check_structure(structure: Any) -> str:
    """One of :data:`STRUCTURES`; ValueError naming ``structure`` otherwise."""
    if not (isinstance(structure, str) and structure in STRUCTURES):
        raise ValueError(
            f"structure must be one of 'auto', 'trapezoidal', 'dense'; got {structure!r}"
        )
    return structure


def as_matrix_operand(h: Any, n: int, name: str = "h") -> tuple[Any, bool]:
    """``h`` as (..., n, B) following ``matmul``'s rule for a 1-D right operand, and whether
    it was a vector."""
    if h.ndim == 0:
        raise ValueError(f"{name} must have shape ({n},) or (..., {n}, B); got a scalar")
    vector = h.ndim == 1
    hm = h[:, None] if vector else h
    if hm.shape[-2] != n:
        want = f"({n},) or (..., {n}, B)"
        raise ValueError(f"{name} must have shape {want}; got shape {tuple(h.shape)}")
    return hm, vector


def broadcast_batch(named: Sequence[tuple[str, Sequence[int]]]) -> tuple[int, ...]:
    """The broadcast of the named batch shapes; ValueError naming all of them otherwise."""
    n = max([0] + [len(s) for _, s in named])  # max(..., default=) breaks torch.compile
    out = []
    for dims in zip(*((1,) * (n - len(s)) + tuple(s) for _, s in named), strict=True):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            what = ", ".join(f"{name} {tuple(s)}" for name, s in named)
            raise ValueError(f"batch shapes do not broadcast: {what}")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def check_finite_columns(V: Any, xp: Any, name: str = "V") -> None:
    """NaN/Inf in an eager, nonempty V (..., N, L) raise, naming the columns. NumPy arrays and
    CPU torch tensors are checked through a zero-copy NumPy view (one pass, against four
    torch kernels); other arrays by one max-abs reduction per column."""
    if not is_eager(V) or not math.prod(V.shape):
        return
    view = _numpy_view(V)
    if view is not None:
        if not np.isfinite(view).all():
            check_finite_norms(np.max(np.abs(view), axis=-2, keepdims=True), np, name)
        return
    check_finite_norms(xp.max(xp.abs(V), axis=-2, keepdims=True), xp, name)


def finite_reflectors(V: Any, xp: Any, name: str = "V") -> Any:
    """``V`` (..., N, L) of reflection vectors after :func:`check_finite_columns`, with the
    columns that a flushing backend would lose rescaled.

    XLA on CPU (JAX) flushes subnormal numbers to zero in every operation, so a subnormal
    column v would act as H(0) = I there while NumPy and torch reflect by it. A reflection
    is invariant under scaling, H(cv) = H(v), so when an eager JAX V on the CPU holds
    subnormal entries each column is multiplied on the host by the power of two that brings
    its largest entry into [½, 1) (exact: ``np.ldexp``), and the same reflections reach XLA.
    One pass over V on the host; under ``jax.jit`` or on a GPU, V is used as given.
    """
    check_finite_columns(V, xp, name)
    if not (is_eager(V) and math.prod(V.shape) and type(V).__module__.startswith("jax")):
        return V
    if any(d.platform != "cpu" for d in V.devices()):
        return V
    view = np.asarray(V)
    if view.dtype.kind == "V" or view.dtype.name == "bfloat16":
        # ml_dtypes' bfloat16 (no np.finfo): float32 holds its values and its range
        view = view.astype(np.float32)
    a = np.abs(view)
    if not np.any((a < np.finfo(view.dtype).tiny) & (a > 0)):
        return V
    _, e = np.frexp(np.max(a, axis=-2, keepdims=True))  # column max = f · 2^e, f ∈ [½, 1)
    k = (-e).astype(np.int32)  # zero columns: e = 0, unchanged
    if np.iscomplexobj(view):  # ldexp is real: scale both parts (exact as well)
        scaled = (np.ldexp(view.real, k) + 1j * np.ldexp(view.imag, k)).astype(view.dtype)
    else:
        scaled = np.ldexp(view, k)
    scaled = xp.asarray(scaled, device=next(iter(V.devices())))
    return scaled if scaled.dtype == V.dtype else xp.astype(scaled, V.dtype)


def _numpy_view(x: Any) -> Any:
    if type(x) is np.ndarray:
        return x
    if type(x).__name__ in ("Tensor", "Parameter") and type(x).__module__.startswith("torch"):
        torch = sys.modules["torch"]
        if (
            x.device.type == "cpu"
            and emulated_kind() != "cuda"  # under emulate_device("cuda"): the CUDA path
            and not is_transformed(x)  # torch.func wrappers have no storage to view,
            and torch._C._functorch.maybe_current_level() is None  # nor anything inside one
            and not torch.compiler.is_compiling()
            and not (x.is_conj() or x.is_neg())
            and x.dtype != torch.bfloat16  # NumPy has no bfloat16
        ):
            return x.detach().numpy()
    return None


def check_finite_norms(r: Any, xp: Any, name: str = "V") -> None:
    """Raise if a per-column norm (or max-abs) ``r`` (..., 1, L) is NaN/Inf, naming the
    columns; eager arrays only (one reduction over L values)."""
    if not is_eager(r) or bool(xp.all(xp.isfinite(r))):
        return
    ok = xp.all(xp.isfinite(r), axis=tuple(range(r.ndim - 1)))
    bad = [i for i in range(ok.shape[0]) if not bool(ok[i])]
    more = " ..." if len(bad) > 10 else ""
    raise ValueError(f"{name} contains NaN or Inf (in column(s) {bad[:10]}{more})")


def check_finite(a: Any, xp: Any, name: str) -> None:
    """NaN/Inf in ``a`` raise, naming it (eager arrays; one pass). The reduction's result is
    what is tested for eagerness: under ``jax.jit`` even a closed-over concrete array gives a
    tracer. Empty arrays pass (``0 in shape``: torch's ``size`` is a method)."""
    if 0 in a.shape:
        return
    ok = xp.all(xp.isfinite(a))
    if is_eager(ok) and not bool(ok):
        raise ValueError(f"{name} contains NaN or Inf")


def check_real(name: str, value: Any, lo: float, hi: float, lo_open: bool = False) -> float:
    """``value`` as a float in [lo, hi) (or (lo, hi)); ValueError naming it otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a real number; got {value!r}")
    v = float(value)
    ok = math.isfinite(v) and (v > lo if lo_open else v >= lo) and v < hi
    if not ok:
        left = "(" if lo_open else "["
        raise ValueError(f"{name} must lie in {left}{lo}, {hi}); got {value!r}")
    return v


def check_choice(name: str, value: Any, options: tuple[str, ...]) -> str:
    """``value`` if it is one of ``options``; ValueError naming it otherwise."""
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of {options}; got {value!r}")
    return value
