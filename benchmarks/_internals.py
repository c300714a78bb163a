"""Every private householderla import of the benchmarks, in one place.

Two scripts measure internals next to the public API: ``sequential.py`` (the Numba kernels)
and ``structured.py`` (the dense and blocked low-rank products behind ``hl.cwy``). They get
them from here, so a move inside the package changes this file only.

``compact_wy()``     cwy_factors, lowrank_apply, lowrank_vjp, factors_vjp (dense CWY kernels)
``trapezoidal()``    lowrank_apply, apply_vjp, use_structured (blocked lower-trapezoidal CWY)
``householder()``    apply_sequential, sequential_is_faster (the dispatch rule and its constants)
``numba_kernels()``  hprod, hgrad, HAVE_NUMBA, SAFE_EXP (importing it compiles or loads the
                     JIT cache, so it is imported on first call, and timed by sequential.py)
``entry_kernels()``  the three @njit entry kernels (forward, forward one vector, backward)
``NUMBA_MODULE``     the kernels' module name, for a fresh interpreter (cold compile time)
``numba_disabled()`` a block run with ``HL_DISABLE_NUMBA=1`` (the package's switch to its
                     Array API loop of reflections; used by run.py's rows and sequential.py)
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

# The private modules used (the package's layers: _agnostic is backend-neutral, _kernels holds
# the Numba kernels). Before the "Layers:" commit they were householderla._compact_wy,
# householderla._structured and householderla._numba_kernels.
_COMPACT_WY = "householderla._agnostic.compact_wy"
_TRAPEZOIDAL = "householderla._agnostic.trapezoidal"
NUMBA_MODULE = "householderla._kernels.numba"


def compact_wy() -> ModuleType:
    return importlib.import_module(_COMPACT_WY)


def trapezoidal() -> ModuleType:
    return importlib.import_module(_TRAPEZOIDAL)


def householder() -> ModuleType:
    """The reflections module: ``apply_sequential``, ``sequential_is_faster`` (its constants
    ``SEQUENTIAL_*`` are in ``householderla._lib.tuning``)."""
    return importlib.import_module("householderla.householder")


def numba_kernels() -> ModuleType:
    return importlib.import_module(NUMBA_MODULE)


def entry_kernels() -> tuple[Any, Any, Any]:
    """(forward, forward for one vector, backward) @njit kernels."""
    nk = numba_kernels()
    batched = importlib.import_module("householderla._kernels.numba_batched")
    return batched.fp_kernel, nk.fp_vec_kernel, nk.bp_kernel


@contextlib.contextmanager
def numba_disabled() -> Iterator[None]:
    """``HL_DISABLE_NUMBA=1`` inside the block: the package's Array API loop of reflections
    instead of its Numba kernels (an internal switch, read on every call)."""
    old = os.environ.get("HL_DISABLE_NUMBA")
    os.environ["HL_DISABLE_NUMBA"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["HL_DISABLE_NUMBA"]
        else:
            os.environ["HL_DISABLE_NUMBA"] = old
