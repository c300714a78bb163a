"""Y ← Y − A B in place by one BLAS call (``?gemm`` with β = 1) on NumPy arrays.

NumPy's ``matmul`` writes a fresh product, so Y −= A @ B costs a temporary and a second pass;
LAPACK's blocked algorithms accumulate into the trailing block with one GEMM. This calls the
CBLAS ``?gemm`` of the OpenBLAS NumPy is linked to (same thread pool, strided views, no copies),
only where it is safe and exact: Linux, the library already loaded by NumPy, 2-D aligned
operands of one dtype with a unit stride, Y writeable and not sharing memory with A or B; else
False and the caller takes the NumPy route. ``HL_DISABLE_CBLAS`` turns it off. The same
functions (and ``?syrk``/``?herk``) go to compiled code as pointers (:func:`blas_pointers`).
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

import numpy as np

__all__ = [
    "GEMM_PROTOTYPES",
    "RANK_K_PROTOTYPES",
    "blas_pointers",
    "gemm_available",
    "gemm_subtract",
]

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_CODES = {np.dtype(np.float32): "s", np.dtype(np.float64): "d",
          np.dtype(np.complex64): "c", np.dtype(np.complex128): "z"}  # fmt: skip


def _prototype(t: str) -> Any:
    i64, cint, vp = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    scalar = {"s": ctypes.c_float, "d": ctypes.c_double}.get(t, vp)  # c, z: pointers
    return ctypes.CFUNCTYPE(
        None, cint, cint, cint, i64, i64, i64, scalar, vp, i64, vp, i64, scalar, vp, i64
    )


#: The C prototype of CBLAS ``?gemm`` (ILP64) by type letter: (order, transa, transb, m, n,
#: k, α, A, lda, B, ldb, β, C, ldc); α and β by value for s/d, by address for c/z.
GEMM_PROTOTYPES = {t: _prototype(t) for t in "sdcz"}


def _rank_k_prototype(t: str) -> Any:
    i64, cint, vp = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    real = ctypes.c_float if t in "sc" else ctypes.c_double
    return ctypes.CFUNCTYPE(None, cint, cint, cint, i64, i64, real, vp, i64, real, vp, i64)


#: The C prototype of CBLAS ``?syrk`` (s, d) and ``?herk`` (c, z), ILP64: (order, uplo,
#: trans, n, k, α, A, lda, β, C, ldc), α and β real, by value.
RANK_K_PROTOTYPES = {t: _rank_k_prototype(t) for t in "sdcz"}


def _loaded_openblas64() -> str | None:
    """The path of NumPy's ``scipy_openblas64`` if this process has it mapped, else None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                name = os.path.basename(parts[5].strip()) if len(parts) == 6 else ""
                if "scipy_openblas64" in name and ".so" in name:
                    return parts[5].strip()
    except OSError:  # pragma: no cover - not Linux
        return None
    return None


@functools.cache
def _library() -> Any:
    """NumPy's ``scipy_openblas64`` opened by ctypes if this process has it mapped, else None."""
    path = _loaded_openblas64()
    if path is None:
        return None
    try:
        return ctypes.CDLL(path)
    except OSError:  # pragma: no cover - a mapped library that cannot be opened again
        return None


@functools.cache
def _gemms() -> dict[str, Any]:
    """The CBLAS ``?gemm`` functions by type letter, {} where unavailable."""
    lib = _library()
    out = {}
    for t in "sdcz":
        f = getattr(lib, f"scipy_cblas_{t}gemm64_", None) if lib is not None else None
        if f is None:
            return {}
        f.argtypes, f.restype = list(GEMM_PROTOTYPES[t]._argtypes_), None
        out[t] = f
    return out


@functools.cache
def _pointers() -> dict[str, Any]:
    """{type letter: (``?gemm``, ``?syrk``/``?herk``)} as ctypes function pointers, {} where
    unavailable."""
    out = {}
    for t, f in _gemms().items():
        rk = getattr(_library(), f"scipy_cblas_{t}{'herk' if t in 'cz' else 'syrk'}64_", None)
        if rk is None:
            return {}
        gemm = GEMM_PROTOTYPES[t](ctypes.cast(f, ctypes.c_void_p).value)
        out[t] = (gemm, RANK_K_PROTOTYPES[t](ctypes.cast(rk, ctypes.c_void_p).value))
    return out


def _disabled() -> bool:
    return os.environ.get("HL_DISABLE_CBLAS", "0") not in ("", "0")


def gemm_available(dtype: Any) -> bool:
    """Whether :func:`gemm_subtract` can run for NumPy arrays of ``dtype`` here (it may
    still refuse particular operands)."""
    return np.dtype(dtype) in _CODES and not _disabled() and bool(_gemms())


def blas_pointers(dtype: Any) -> tuple[Any, Any] | None:
    """NumPy's own CBLAS ``?gemm`` and ``?syrk`` (real) or ``?herk`` (complex) for ``dtype``
    as ctypes function pointers of ``GEMM_PROTOTYPES``' and ``RANK_K_PROTOTYPES``' types
    (compiled code, :mod:`householderla._kernels.numba_panels`, calls them with raw
    addresses), or None where :func:`gemm_available` is False."""
    return _pointers().get(_CODES[np.dtype(dtype)]) if gemm_available(dtype) else None


def _layout(X: np.ndarray) -> tuple[int, int] | None:
    """(trans, ld) with X = op(M) for a row-major M with leading dimension ld, or None."""
    isz = X.itemsize
    r, c = X.shape
    s0, s1 = X.strides
    # strides along axes of length 1 are arbitrary: take the ones BLAS expects
    n0, n1 = (max(c, 1) * isz if r == 1 else s0), (isz if c == 1 else s1)
    if n1 == isz and n0 % isz == 0 and n0 // isz >= max(1, c):
        return _NO_TRANS, n0 // isz
    t0, t1 = (isz if r == 1 else s0), (max(r, 1) * isz if c == 1 else s1)
    if t0 == isz and t1 % isz == 0 and t1 // isz >= max(1, r):
        return _TRANS, t1 // isz
    return None


def _plain(X: Any, dtype: np.dtype) -> bool:
    return (
        type(X) is np.ndarray
        and X.ndim == 2
        and X.dtype == dtype
        and X.flags.aligned
        and X.dtype.isnative
    )


def gemm_subtract(Y: Any, A: Any, B: Any) -> bool:
    """Y ← Y − A B in place by one ``?gemm`` (α = −1, β = 1) for NumPy Y (r, c), A (r, n),
    B (n, c); True when done, False (Y untouched) where the call does not apply (see the
    module docstring). 2·r·n·c flops, no temporary."""
    if type(Y) is not np.ndarray or Y.dtype not in _CODES or _disabled():
        return False
    if not (_plain(Y, Y.dtype) and _plain(A, Y.dtype) and _plain(B, Y.dtype)):
        return False
    if not Y.flags.writeable or A.shape[-1] != B.shape[0] or Y.shape != (A.shape[0], B.shape[1]):
        return False
    f = _gemms().get(_CODES[Y.dtype])
    if f is None:
        return False
    if Y.size == 0 or A.shape[1] == 0:
        return True
    ly = _layout(Y)
    if ly is None:
        return False
    if ly[0] == _TRANS:  # Yᵀ −= Bᵀ Aᵀ with a row-major Yᵀ
        Y, A, B = Y.T, B.T, A.T
        ly = _layout(Y)
    la, lb = _layout(A), _layout(B)
    if la is None or lb is None or ly is None or ly[0] != _NO_TRANS:
        return False
    if np.may_share_memory(Y, A) or np.may_share_memory(Y, B):
        return False
    r, c, n = Y.shape[0], Y.shape[1], A.shape[1]
    if Y.dtype.kind == "c":
        alpha, beta = np.array(-1, Y.dtype), np.array(1, Y.dtype)
        a_, b_ = alpha.ctypes.data, beta.ctypes.data
    else:
        a_, b_ = -1.0, 1.0
    f(_ROW_MAJOR, la[0], lb[0], r, c, n, a_, A.ctypes.data, la[1], B.ctypes.data, lb[1], b_,
      Y.ctypes.data, ly[1])  # fmt: skip
    return True
