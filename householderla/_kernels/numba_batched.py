"""The batched dispatch of the Numba Householder kernels: which kernel runs a stack of products.

A stack of P ≥ ``BATCH_MIN`` matrices of N ≤ ``TILE_MAX_N``, each with its own V, runs in
one call of a batched kernel: the SIMD lanes up to ``LANES_MAX_N``
(:mod:`~householderla._kernels.numba_lanes`; on this machine every such N), eight columns
at a time above (:mod:`~householderla._kernels.numba_columns`); the two give the same
bits. Anything else runs matrix by matrix (:func:`fp_kernel`, the per-matrix loops of
:mod:`~householderla._kernels.numba_loops`). LAPACK's ``(a, τ)`` are read in place by the
batched kernels (``unit`` mode); a V is built for the per-matrix one. Columns whose ‖v‖²
leaves the safe range are rescaled by a power of two first (exact: H(cv) = H(v)).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._lib.tuning import BATCH_MIN, LANES_MAX_N, TILE_MAX_N
from .numba_checks import lapack_unit_lower
from .numba_columns import apply_columns
from .numba_lanes import NT_MIN_BYTES, apply_lanes
from .numba_loops import HAVE_NUMBA, apply_one, njit
from .numba_taus import SAFE_EXP, all_taus

__all__ = [
    "BATCH_MIN",
    "LANES_MAX_N",
    "TILE_MAX_N",
    "forward",
    "fp_kernel",
    "output",
    "rescaled",
    "taus_of",
]

#: A hash of the sibling kernel modules this one imports: Numba's on-disk cache keys a
#: compiled function on its own file only, so changing this line when one of them changes
#: makes the cache recompile (tests/test_numba_kernels.py checks it).
KERNEL_DEPS = "b1c84cd579f16052"


def _sigs() -> Any:
    if not HAVE_NUMBA:
        return None
    from numba import types as nt

    out = []
    for f in (nt.float32, nt.float64):
        ro3, rw3 = nt.Array(f, 3, "C", readonly=True), nt.Array(f, 3, "C")
        out.append(nt.int64(ro3, ro3, rw3, nt.boolean, nt.boolean, nt.int64))
    return out


@njit(_sigs())
def fp_kernel(V: Any, H: Any, Y: Any, trap: bool, transpose: bool, safe_exp: int) -> int:
    """Y (P, N, B) ← H(v₁)…H(v_L) H for V (Pv, N, L), H (Ph, N, B), Pv, Ph ∈ {1, P}.
    Returns −1 (nothing computed) if a column must be rescaled first, else the number of
    non-finite columns of V."""
    Pv = V.shape[0]
    Ph, _, B = H.shape
    P = Y.shape[0]
    tau, status = all_taus(V, trap, safe_exp)
    if status < 0:
        return status
    acc = np.empty((4, B), V.dtype)
    c = np.empty((1, B), V.dtype)
    for p in range(P):
        Y[p] = H[p if Ph > 1 else 0]
        pv = p if Pv > 1 else 0
        apply_one(V[pv], tau[pv], Y[p], trap, transpose, acc, c)
    return status


#: τ of the kernels' plain mode (not read).
_NO_TAU = {np.dtype(t): np.empty((0, 0), t) for t in (np.float32, np.float64)}


def output(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised array for the kernels' result: from ``NT_MIN_BYTES`` on, aligned to
    64 bytes (a view into a slightly larger buffer), so that the lanes kernel may store it
    past the caches; NumPy's own allocation elsewhere."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < NT_MIN_BYTES:
        return np.empty(shape, dtype)
    buf = np.empty(nbytes + 64, np.uint8)
    off = -buf.ctypes.data % 64
    return buf[off : off + nbytes].view(dtype).reshape(shape)


def taus_of(tau: Any, V3: np.ndarray | None, dtype: Any) -> np.ndarray | None:
    """LAPACK's τ (..., L) as the kernels' C-contiguous (Pv, L) of V3's batch, or None."""
    if tau is None:
        return None
    t2 = np.asarray(tau).reshape((-1, tau.shape[-1]))
    if V3 is None or t2.shape != (V3.shape[0], V3.shape[2]):
        raise ValueError(f"tau must have shape (..., L) of V's batch; got {tuple(tau.shape)}")
    return np.ascontiguousarray(t2, dtype=dtype)


def forward(
    V3: np.ndarray,
    H3: np.ndarray,
    Y3: np.ndarray,
    trap: bool,
    transpose: bool,
    identity: bool,
    tau: np.ndarray | None = None,
    columns: bool = False,
) -> int:
    """Y3 (P, N, B) ← the products. When P ≥ BATCH_MIN matrices of N ≤ TILE_MAX_N each have
    their own V: the SIMD-lane kernel up to ``LANES_MAX_N``, the column-block kernel above
    (the two give the same bits); else the per-matrix one (``identity``: H3 is [I; 0],
    which the batched kernels exploit). ``tau``: V3 is LAPACK's ``a`` (P, N, L) with τ
    (P, L), read in place by the batched kernels (a V is built for the others). ``columns``:
    V3 is given transposed, (P, L, N) C-contiguous (a column-major ``a``), which the lanes
    kernel reads in place and the others after a copy to (P, N, L). Columns outside the
    safe range are rescaled first (exact). Returns the number of non-finite columns."""
    P, n, _ = Y3.shape
    safe = SAFE_EXP[Y3.dtype]
    batched = V3.shape[0] == P and P >= BATCH_MIN and n <= TILE_MAX_N
    lanes = batched and n <= LANES_MAX_N
    if columns and not lanes:  # only the lanes kernel reads columns
        V3, columns = _row_major(V3), False
    if tau is not None and not batched:  # the per-matrix kernel reads a V
        V3, tau = _built_reflectors(V3, tau), None
    if batched:
        kernel = apply_lanes if lanes else apply_columns
        extra = (identity, transpose, safe, _NO_TAU[V3.dtype] if tau is None else tau)
        extra = (*extra, tau is not None, columns) if lanes else (*extra, tau is not None)
    else:
        kernel, extra = fp_kernel, (transpose, safe)
    status = kernel(V3, H3, Y3, trap, *extra)
    if status < 0:  # some ‖v_k‖² outside the safe range: rescale those columns (exact)
        if columns:
            return forward(_row_major(V3), H3, Y3, trap, transpose, identity, tau)
        if tau is not None:
            return forward(_built_reflectors(V3, tau), H3, Y3, trap, transpose, identity)
        status = kernel(rescaled(V3, trap)[0], H3, Y3, trap, *extra)
    return status


def _row_major(Vc: np.ndarray) -> np.ndarray:
    """(P, N, L) C-contiguous of the transposed (P, L, N) ``columns`` operand."""
    return np.ascontiguousarray(np.swapaxes(Vc, 1, 2))


def _built_reflectors(a3: np.ndarray, tau: np.ndarray) -> np.ndarray:
    """The V (P, N, L) of LAPACK's ``a`` (P, N, ≥ L) and τ (P, L), built."""
    V3 = np.empty((*a3.shape[:2], tau.shape[1]), a3.dtype)
    lapack_unit_lower(a3, tau, V3)
    return V3


def rescaled(V3: np.ndarray, trapezoidal: bool) -> tuple[np.ndarray, np.ndarray]:
    """V3 with each finite nonzero column multiplied by c = 2^−e, its max-abs entry m = f·2^e
    (f ∈ [½, 1)), and the exponents −e (Pv, 1, L). H(c v) = H(v). ``np.ldexp`` scales
    exactly without forming c, which overflows for subnormal columns (c = 2^1074)."""
    W = np.tril(V3) if trapezoidal else V3
    m = np.max(np.abs(W), axis=-2, keepdims=True).astype(np.float64)
    ok = np.isfinite(m) & (m > 0)
    shift = np.where(ok, -np.frexp(np.where(ok, m, 1.0))[1], 0)
    with np.errstate(over="ignore", invalid="ignore"):  # entries above a trapezoid: unused
        Vs = np.ldexp(V3.astype(np.float64), shift).astype(V3.dtype)
    return Vs, shift
