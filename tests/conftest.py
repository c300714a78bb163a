"""The ``bk`` fixture: one parametrisation over every array backend.

``HL_TEST_BACKENDS`` (comma-separated) names the backends that must run; a named backend
that cannot be imported fails the run instead of silently dropping out. Unset, every known
backend runs if importable and is reported as skipped otherwise.

Backends: numpy, numpy_readonly (inputs are read-only NumPy arrays: any write into a user
array raises), array_api_strict, torch (CPU), torch_cuda, jax_gpu and cupy (when a GPU is present),
jax (x64, eager) and jax_jit (every call under ``jax.jit``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=25,
    deadline=None,  # first calls under jax.jit compile
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# `make fuzz`: the same properties with many more examples (minutes), random per run
settings.register_profile(
    "fuzz",
    max_examples=1500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

KNOWN = (
    "numpy",
    "numpy_readonly",
    "array_api_strict",
    "torch",
    "jax",
    "jax_jit",
    "torch_cuda",
    "jax_gpu",
    "cupy",
)
REQUESTED = [b for b in os.environ.get("HL_TEST_BACKENDS", "").split(",") if b]
unknown = sorted(set(REQUESTED) - set(KNOWN))
if unknown:
    raise pytest.UsageError(f"HL_TEST_BACKENDS names unknown backends {unknown}; known: {KNOWN}")


@dataclass
class Backend:
    """How tests create, call and read arrays of one backend."""

    name: str
    xp: Any
    _asarray: Callable[[np.ndarray], Any]
    eager: bool = True
    jit: Callable[[Callable], Callable] | None = None

    def asarray(self, a: Any, dtype: Any = np.float64) -> Any:
        a = np.array(a, dtype=dtype)
        return self._asarray(a)

    def call(self, fn: Callable, *args: Any) -> Any:
        """``fn(*args)``, under ``jax.jit`` for the jax_jit backend."""
        return self.jit(fn)(*args) if self.jit else fn(*args)

    def __repr__(self) -> str:
        return self.name


def to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    if type(x).__module__.startswith("cupy"):
        return x.get()
    return np.asarray(x)


def _readonly(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


def _make(name: str) -> Backend:
    import array_api_compat as aac

    if name == "numpy":
        return Backend(name, aac.array_namespace(np.empty(0)), lambda a: a)
    if name == "numpy_readonly":
        return Backend(name, aac.array_namespace(np.empty(0)), _readonly)
    if name == "array_api_strict":
        import array_api_strict as xps

        return Backend(name, xps, xps.asarray)
    if name in ("torch", "torch_cuda"):
        import torch

        dev = "cpu"
        if name == "torch_cuda":
            if not torch.cuda.is_available():
                raise ImportError("torch has no CUDA device")
            dev = "cuda"
        return Backend(
            name, aac.array_namespace(torch.empty(0)), lambda a: torch.asarray(a, device=dev)
        )
    if name in ("jax", "jax_jit"):
        import jax

        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp

        if name == "jax":
            return Backend(name, jnp, jnp.asarray)
        return Backend(name, jnp, jnp.asarray, eager=False, jit=jax.jit)
    if name == "jax_gpu":
        import jax

        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp

        try:
            gpu = jax.devices("gpu")[0]
        except RuntimeError as exc:
            raise ImportError(f"jax has no GPU: {exc}") from exc
        return Backend(name, jnp, lambda a: jax.device_put(jnp.asarray(a), gpu))
    if name == "cupy":
        import cupy

        if not cupy.is_available():
            raise ImportError("cupy has no GPU")
        return Backend(name, aac.array_namespace(cupy.empty(0)), cupy.asarray)
    raise AssertionError(name)


_CACHE: dict[str, Backend | BaseException] = {}


def get_backend(name: str) -> Backend:
    if name not in _CACHE:
        try:
            _CACHE[name] = _make(name)
        except ImportError as exc:
            _CACHE[name] = exc
    b = _CACHE[name]
    if isinstance(b, BaseException):
        if name in REQUESTED:
            pytest.fail(f"backend {name!r} was requested in HL_TEST_BACKENDS but: {b}")
        pytest.skip(f"backend {name} not available: {b}")
    return b


PARAMS = REQUESTED or list(KNOWN)


@pytest.fixture(scope="session", params=PARAMS)
def bk(request: pytest.FixtureRequest) -> Backend:
    """Every backend (see module docstring)."""
    return get_backend(request.param)


@pytest.fixture(scope="session", params=[p for p in PARAMS if p != "jax_jit"])
def bk_eager(request: pytest.FixtureRequest) -> Backend:
    """Every backend whose values can be inspected (value checks are eager-only)."""
    return get_backend(request.param)
