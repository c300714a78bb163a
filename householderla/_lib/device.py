"""Which kind of device an array lives on, the one place paths are chosen by device.

A GPU runs each kernel launch in microseconds whatever its size, a CPU pays per flop: the
planner and the half-precision code pick their path from :func:`device_kind`. Tests run the
GPU paths on CPU arrays under :func:`emulate_device` ("cuda"), so CI covers their arithmetic
and counts their ops (``torch.profiler``) without a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import array_api_compat as aac

__all__ = ["KINDS", "device_kind", "emulate_device", "emulated_kind"]

#: the device kinds a path is chosen for
KINDS = ("cpu", "cuda")

_EMULATED: list[str | None] = [None]


def device_kind(x: Any) -> str:
    """``"cuda"`` for a torch CUDA tensor, a CuPy array or a JAX array on a GPU, else
    ``"cpu"`` (NumPy, Dask, array-api-strict, tracers); under :func:`emulate_device` the
    emulated kind for arrays that live on the CPU."""
    kind = _actual_kind(x)
    emulated = _EMULATED[0]
    return emulated if emulated is not None and kind == "cpu" else kind


def _actual_kind(x: Any) -> str:
    if aac.is_torch_array(x):
        return "cuda" if x.device.type == "cuda" else "cpu"
    if aac.is_cupy_array(x):  # pragma: no cover - needs CuPy and a GPU
        return "cuda"
    if aac.is_jax_array(x):
        try:
            devices = x.devices()
        except Exception:  # tracers carry no committed device
            return "cpu"
        return "cuda" if any(d.platform == "gpu" for d in devices) else "cpu"
    return "cpu"


def emulated_kind() -> str | None:
    """The kind set by an enclosing :func:`emulate_device`, or None."""
    return _EMULATED[0]


@contextlib.contextmanager
def emulate_device(kind: str) -> Iterator[None]:
    """Inside the block, CPU arrays take the paths chosen for ``kind`` ("cpu" or "cuda"):
    the GPU's path runs, and is tested and counted, on a machine without one. Arithmetic
    that needs the device itself (a CUDA-only torch argument, a CUDA stream) is not run."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    old = _EMULATED[0]
    _EMULATED[0] = kind
    try:
        yield
    finally:
        _EMULATED[0] = old
