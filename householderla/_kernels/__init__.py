"""Opaque fast paths: compiled kernels loaded on first use (Numba on CPU; CuPy later).

:func:`numba_for` is the one place that decides whether a NumPy call runs the Numba kernels of
:mod:`householderla._kernels.numba`: numba importable, every operand a NumPy array, and the
environment variable ``HL_DISABLE_NUMBA`` unset (or "0"). ``import householderla`` never
imports numba; the first NumPy call that can use it does.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import array_api_compat as aac
import numpy as np

__all__ = ["load_numba", "numba_for"]


@functools.cache
def load_numba() -> Any:
    """The Numba kernel module, or None when numba is missing or broken."""
    try:
        from . import numba as kernels
    except ImportError:  # pragma: no cover - numba present but broken
        return None
    return kernels if kernels.HAVE_NUMBA else None


def numba_for(xp: Any, *arrays: Any) -> Any:
    """The Numba kernel module when ``xp`` is NumPy, every array is a NumPy array,
    ``HL_DISABLE_NUMBA`` is unset (or "0") and numba imports; else None."""
    if not all(type(a) is np.ndarray for a in arrays) or not aac.is_numpy_namespace(xp):
        return None
    if os.environ.get("HL_DISABLE_NUMBA", "0") not in ("", "0"):
        return None
    return load_numba()
