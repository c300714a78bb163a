"""Opaque fast paths: compiled kernels loaded on first use (Numba on CPU; CuPy later).

:func:`numba_for` decides whether a NumPy call runs the Numba kernels: numba importable, every
operand a NumPy array, ``HL_DISABLE_NUMBA`` unset (or "0"); ``import householderla`` never
imports numba. A cold on-disk cache (told from a warm one by a stamp file holding a hash of
what the cache depends on) makes :func:`load_numba` print one line to stderr before compiling
(never a warning: the tests turn warnings into errors); without Numba the first call that would
have used it warns once with :class:`PerformanceWarning`. ``make warm`` compiles ahead.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import array_api_compat as aac
import numpy as np

__all__ = [
    "COMPILE_NOTICE",
    "PerformanceWarning",
    "cold_cache",
    "import_kernels",
    "load_numba",
    "numba_enabled",
    "numba_for",
    "numba_for_torch",
    "say_once",
]

_FLAG = "HL_DISABLE_NUMBA"
# os.environ.get encodes the key on every call (a third of a tiny kernel call); the
# environment's own mapping with the key encoded once reads the same value far faster and
# still sees changes made through os.environ (monkeypatch.setenv, os.environ[...] = ...)
_ENV_DATA = getattr(os.environ, "_data", None)
_ENV_KEY = os.environ.encodekey(_FLAG) if hasattr(os.environ, "encodekey") else None

_HERE = Path(__file__).resolve().parent
_STAMP = "householderla-kernels.stamp"
COMPILE_NOTICE = (
    "householderla: compiling the Numba kernels for this machine (first use only, a minute "
    "or more; cached afterwards - 'make warm' or 'python -m householderla._kernels.warm' "
    "compiles them ahead)"
)
MISSING_NOTICE = (
    "householderla: Numba is not {what}, so NumPy and CPU torch calls skip the compiled "
    "kernels (stacks of small matrices, sequential reflections, LAPACK-layout reflectors) and "
    "take the much slower Array API paths; for the fast paths: pip install "
    '"householderla[numba]"'
)


class PerformanceWarning(UserWarning):
    """A fast path is unavailable in this environment (e.g. Numba is not installed): the
    result is the same, only slower. Emitted once per process."""


_lock = threading.Lock()
_said = {"compile": False, "missing": False}


def say_once(what: str) -> bool:
    """True the first time ``what`` is asked for in this process."""
    with _lock:
        first = not _said[what]
        _said[what] = True
    return first


def _cache_key() -> str:
    """What Numba's cache of the kernels depends on: the Numba and Python versions, the CPU it
    compiles for, and the kernel sources (Numba's own stamp is their content hash)."""
    import numba
    from llvmlite import binding as ll

    h = hashlib.sha256()
    for part in (numba.__version__, sys.implementation.cache_tag, ll.get_host_cpu_name()):
        h.update(part.encode() + b"\0")
    h.update(ll.get_host_cpu_features().flatten().encode() + b"\0")
    for src in sorted(_HERE.glob("numba*.py")):
        h.update(src.name.encode() + b"\0" + src.read_bytes() + b"\0")
    return h.hexdigest()


def _stamp_path() -> Path | None:
    """The stamp file in the directory Numba caches this package's kernels in (Numba's own
    choice: ``NUMBA_CACHE_DIR``, the in-tree ``__pycache__`` or the user-wide cache); None
    when Numba cannot say."""
    try:
        from numba.core.caching import CompileResultCacheImpl

        # the kernels' modules share this file's directory, hence its cache directory
        return Path(CompileResultCacheImpl(_cache_key).locator.get_cache_path()) / _STAMP
    except Exception:  # pragma: no cover - another Numba layout, or no writable cache
        return None


def cold_cache() -> tuple[Path | None, str] | None:
    """(stamp path, key) when the kernels will compile on import (the stamp is missing or
    stale); None when Numba's cache holds them or the check itself fails."""
    try:
        key = _cache_key()
        path = _stamp_path()
        if path is not None and path.is_file() and path.read_text().strip() == key:
            return None
    except Exception:  # pragma: no cover - never let the notice break the import
        return None
    return path, key


def _write_stamp(path: Path, key: str) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(key + "\n")
        os.replace(tmp, path)
    except OSError:  # pragma: no cover - a read-only cache: the notice shows again
        tmp.unlink(missing_ok=True)


def import_kernels() -> tuple[Any, str]:
    """(the Numba kernel module, "") or (None, why not: "installed" / "importable"); prints
    :data:`COMPILE_NOTICE` to stderr once per process when the import compiles them."""
    if importlib.util.find_spec("numba") is None:
        return None, "installed"
    cold = cold_cache()
    loaded = f"{__name__}.numba" in sys.modules  # imported directly: compiled already
    if cold is not None and not loaded and say_once("compile"):
        print(COMPILE_NOTICE, file=sys.stderr, flush=True)
    try:
        from . import numba as kernels
    except ImportError:  # pragma: no cover - numba present but broken
        return None, "importable"
    if not kernels.HAVE_NUMBA:  # pragma: no cover - numba's own import failed
        return None, "importable"
    if cold is not None and cold[0] is not None:
        _write_stamp(*cold)
    return kernels, ""


def _warn_missing(what: str) -> None:
    if not say_once("missing"):
        return
    # point at the caller's code: the first frame outside this package
    frame, level = sys._getframe(1), 2
    package = str(_HERE.parent) + os.sep
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn(MISSING_NOTICE.format(what=what), PerformanceWarning, stacklevel=level)


@functools.cache
def load_numba() -> Any:
    """The Numba kernel module, or None when numba is missing or broken (then a
    :class:`PerformanceWarning` once per process)."""
    kernels, why = import_kernels()
    if kernels is None:
        _warn_missing(why)
    return kernels


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
    from .._lib.device import emulated_kind

    if emulated_kind() == "cuda":  # emulate_device("cuda"): the path a CUDA tensor takes
        return None
    return numba_enabled()
