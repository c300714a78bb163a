"""Opaque fast paths: compiled kernels loaded on first use (Numba on CPU; CuPy later).

:func:`numba_for` is the one place that decides whether a NumPy call runs the Numba kernels of
:mod:`householderla._kernels.numba`: numba importable, every operand a NumPy array, and the
environment variable ``HL_DISABLE_NUMBA`` unset (or "0"). ``import householderla`` never
imports numba; the first NumPy call that can use it does.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

import array_api_compat as aac
import numpy as np

__all__ = ["load_numba", "numba_enabled", "numba_for", "numba_for_torch"]

_FLAG = "HL_DISABLE_NUMBA"
# os.environ.get encodes the key on every call (a third of a tiny kernel call); the
# environment's own mapping with the key encoded once reads the same value far faster and
# still sees changes made through os.environ (monkeypatch.setenv, os.environ[...] = ...)
_ENV_DATA = getattr(os.environ, "_data", None)
_ENV_KEY = os.environ.encodekey(_FLAG) if hasattr(os.environ, "encodekey") else None


@functools.cache
def load_numba() -> Any:
    """The Numba kernel module, or None when numba is missing or broken."""
    try:
        from . import numba as kernels
    except ImportError:  # pragma: no cover - numba present but broken
        return None
    return kernels if kernels.HAVE_NUMBA else None


def numba_enabled() -> Any:
    """The Numba kernel module unless ``HL_DISABLE_NUMBA`` is set (to anything but "" or
    "0") or numba cannot be imported; else None."""
    if _ENV_DATA is not None and _ENV_KEY is not None:
        flag = _ENV_DATA.get(_ENV_KEY)
        disabled = flag is not None and flag not in (b"", b"0", "", "0")
    else:  # pragma: no cover - an os.environ without the CPython internals
        disabled = os.environ.get(_FLAG, "0") not in ("", "0")
    return None if disabled else load_numba()


def numba_for(xp: Any, *arrays: Any) -> Any:
    """The Numba kernel module when ``xp`` is NumPy, every array is a real NumPy array,
    ``HL_DISABLE_NUMBA`` is unset (or "0") and numba imports; else None.

    Complex arrays go to the Array API path (the kernels have float32/float64 signatures
    only): sequential complex reflections are the reference path, and the CWY operator,
    which handles complex through the same GEMMs, is the fast one."""
    for a in arrays:
        if type(a) is not np.ndarray or a.dtype.kind == "c":
            return None
    if not aac.is_numpy_namespace(xp):
        return None
    return numba_enabled()


def numba_for_torch(*tensors: Any) -> Any:
    """The Numba kernel module for CPU torch tensors of one float32/float64 dtype (the caller
    hands them over by DLPack, no copy): numba enabled and not under ``torch.compile``;
    else None. The caller has decided that no autograd graph is needed."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dtype = tensors[0].dtype
    if dtype != torch.float32 and dtype != torch.float64:
        return None
    for t in tensors:
        if type(t) is not torch.Tensor or t.device.type != "cpu" or t.dtype != dtype:
            return None
    if torch.compiler.is_compiling() or torch._C._functorch.maybe_current_level() is not None:
        return None  # traced, or inside a torch.func transform: no NumPy views there
    return numba_enabled()
