"""NumPy entry points of the Numba kernels for sequential Householder products.

``hprod`` (forward) and ``hgrad`` (backward) validate and lay out NumPy operands (broadcast
batch axes, float32/float64, C order, inputs never written) and call the compiled loops of
:mod:`householderla._kernels.numba_loops` (algorithms and numerics there). The entry kernels
have explicit read-only signatures, compiled on first import and then loaded from Numba's disk
cache; each kernel module records a hash of the sibling modules it compiles from
(``KERNEL_DEPS``) so a change there recompiles it. Without Numba the module still imports
(``HAVE_NUMBA = False``) and callers take the NumPy path.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._lib.checks import broadcast_batch, check_finite_norms
from .._lib.linalg import sum_to_shape
from .numba_batched import (
    BATCH_MIN,
    LANES_MAX_N,
    TILE_MAX_N,
    forward,
    output,
    rescaled,
    taus_of,
)
from .numba_checks import (
    finite_lower,
    lapack_check,
    lapack_check_columns,
    lapack_check_transposed,
    lapack_unit_lower,
    lapack_unit_lower_columns,
    upper_is_zero,
)
from .numba_grad import bp_kernel
from .numba_larft import lapack_panel, larft_forward
from .numba_loops import HAVE_NUMBA
from .numba_panels import orgqr_panels, orgqr_rows, ormqr_panels
from .numba_taus import SAFE_EXP
from .numba_vec import fp_vec_kernel

__all__ = [
    "BATCH_MIN",
    "HAVE_NUMBA",
    "LANES_MAX_N",
    "TILE_MAX_N",
    "finite_lower",
    "hform",
    "hgrad",
    "hprod",
    "hprod_vector",
    "lapack_check",
    "lapack_check_columns",
    "lapack_check_transposed",
    "lapack_panel",
    "lapack_unit_lower",
    "lapack_unit_lower_columns",
    "larft_forward",
    "orgqr_panels",
    "orgqr_rows",
    "ormqr_panels",
    "upper_is_zero",
]

#: A hash of the sibling kernel modules this one imports: Numba's on-disk cache keys a
#: compiled function on its own file only, so changing this line when one of them changes
#: makes the cache recompile (tests/test_numba_kernels.py checks it).
KERNEL_DEPS = "60b48f91b03392ef"


# -- NumPy wrappers ---------------------------------------------------------------------------

_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


def _dtype_of(*arrays: np.ndarray) -> Any:
    """The common dtype, float32 or float64 (identity checks first: this runs per call)."""
    dt = arrays[0].dtype
    for a in arrays[1:]:
        if a.dtype is not dt:
            dt = np.result_type(*arrays)
            break
    if dt is _F64 or dt is _F32:
        return dt
    if dt == _F64 or dt == _F32:  # non-native byte order
        return _F64 if dt == _F64 else _F32
    raise TypeError(f"the Numba kernels take float32 or float64 arrays; got {dt}")


def _as3(a: np.ndarray, batch: tuple[int, ...], P: int, tail: tuple[int, ...], dtype: Any) -> Any:
    """``a`` (…, *tail) as a C-contiguous (P', *tail) with P' = 1 or P = prod(batch); copies
    only where the layout, dtype or a genuine broadcast needs it (never writes into ``a``)."""
    own = a.shape[: a.ndim - len(tail)]
    if own == batch:
        a3 = a.reshape((P, *tail))
    elif math.prod(own) == 1:
        a3 = a.reshape((1, *tail))
    else:
        a3 = np.broadcast_to(a, batch + tail).reshape((P, *tail))
    if a3.dtype is not dtype or not a3.flags.c_contiguous:
        a3 = np.ascontiguousarray(a3, dtype=dtype)
    return a3


def _shapes(V: np.ndarray, h: np.ndarray, name: str = "h") -> tuple:
    """N, L, the broadcast batch shape, whether h is a vector, and B."""
    if V.ndim < 2 or V.shape[-1] > V.shape[-2]:
        raise ValueError(f"V must have shape (..., N, L) with L <= N; got {tuple(V.shape)}")
    n = V.shape[-2]
    vector = h.ndim == 1
    if h.ndim == 0 or h.shape[-1 if vector else -2] != n:
        raise ValueError(f"{name} must have shape ({n},) or (..., {n}, B); got {tuple(h.shape)}")
    vb = V.shape[:-2]
    hb = () if vector else h.shape[:-2]
    if vb == hb or not hb:
        batch = vb
    elif not vb:
        batch = hb
    else:
        batch = broadcast_batch([("V", vb), (name, hb)])
    return n, V.shape[-1], batch, vector, 1 if vector else h.shape[-1]


def _operands(V: np.ndarray, x: np.ndarray, name: str) -> tuple:
    """(dtype, n, L, batch, P, vector, B, V3 (Pv, n, L), X3 (Px, n, B)) for the kernels.
    Unbatched contiguous inputs take a short path: this is most of a tiny call's overhead."""
    dtype = _dtype_of(V, x)
    if V.ndim == 2 and 1 <= x.ndim <= 2:
        n, L = V.shape
        if L > n:
            raise ValueError(f"V must have shape (..., N, L) with L <= N; got {V.shape}")
        if x.shape[0] != n:
            raise ValueError(f"{name} must have shape ({n},) or (..., {n}, B); got {x.shape}")
        B = 1 if x.ndim == 1 else x.shape[1]
        V3 = V[None]
        if V.dtype is not dtype or not V.flags.c_contiguous:
            V3 = np.ascontiguousarray(V3, dtype=dtype)
        X3 = x.reshape((1, n, B))
        if x.dtype is not dtype or not X3.flags.c_contiguous:
            X3 = np.ascontiguousarray(X3, dtype=dtype)
        return dtype, n, L, (), 1, x.ndim == 1, B, V3, X3
    n, L, batch, vector, B = _shapes(V, x, name)
    P = math.prod(batch)
    if P == 0:
        return dtype, n, L, batch, 0, vector, B, None, None
    V3 = _as3(V, batch, P, (n, L), dtype)
    X3 = _as3(x, batch, P, (n,), dtype) if vector else _as3(x, batch, P, (n, B), dtype)
    return dtype, n, L, batch, P, vector, B, V3, X3.reshape((X3.shape[0], n, B))


def _raise_nonfinite(V: Any, trapezoidal: bool) -> None:
    W = np.tril(V) if trapezoidal else V
    check_finite_norms(np.max(np.abs(W), axis=-2, keepdims=True), np)


def hprod_vector(
    V: np.ndarray,
    h: np.ndarray,
    *,
    trapezoidal: bool = False,
    transpose: bool = False,
    check: bool = True,
) -> np.ndarray | None:
    """:func:`hprod` for the tiny common call — one V (N, L), L ≤ N, one vector h (N,) or
    one column (N, 1), both C-contiguous of one float32/float64 dtype — with no other checks
    (an RNN step costs little more than the kernel; each test here is tens of ns of a call of
    a few µs at N = 128, L = 16); None for any other input (:func:`hprod` then takes it, or
    the caller's checks name what is wrong) and for columns that need rescaling."""
    dt = V.dtype
    if h.dtype is not dt or (dt is not _F64 and dt is not _F32) or V.ndim != 2:
        return None
    n, L = V.shape
    if h.ndim != 1:
        if h.ndim == 2 and h.shape[1] == 1:  # one column: the vector's kernel
            y = hprod_vector(V, h[:, 0], trapezoidal=trapezoidal, transpose=transpose, check=check)
            return None if y is None else y[:, None]
        return None
    if L <= n == len(h) and V.flags.c_contiguous:  # (h is 1-D here)
        y = h.copy()  # (C-contiguous whatever h's stride)
        status = fp_vec_kernel(V, y, trapezoidal, transpose)
        if status >= 0:
            if status and check:
                _raise_nonfinite(V, trapezoidal)
            return y
    return None


def hprod(
    V: Any,
    h: Any,
    *,
    trapezoidal: bool = False,
    transpose: bool = False,
    check: bool = True,
    tau: Any = None,
) -> np.ndarray:
    """y = H(v₁)(H(v₂)(…H(v_L) h)) (``transpose``: H(v_L)…H(v₁) h) by the Numba kernel.

    Parameters
    ----------
    V : ndarray, shape (..., N, L), L ≤ N
        Unnormalised reflection vectors; a zero column is the identity. Read, never written.
    h : ndarray, shape (N,) or (..., N, B)
        Right operand (``matmul`` rules; batch axes broadcast with V's).
    trapezoidal : bool
        Column k is zero above row k (oRNN layout); those entries are not read.
    transpose : bool
        Apply Qᵀ = H(v_L)…H(v₁) instead of Q.
    check : bool
        Raise ``ValueError`` for NaN/Inf in V (else they propagate as NaN).
    tau : ndarray, shape (..., L), optional
        LAPACK's τ: V is then LAPACK's ``a`` (``?geqrf``), whose reflectors are read as
        ``?ormqr`` reads them (unit lower trapezoid, τ = 0: H = I; τ itself is not used
        otherwise: the kernels recompute 2/‖v‖², which the caller has checked against it).
        The batched kernels read ``a`` in place; no V is built. Implies ``trapezoidal``.

    Returns
    -------
    ndarray, shape (..., N) or (..., N, B), dtype of the inputs (float32 or float64)
        Freshly allocated. 4·N·L·B flops (dense), (4N − L + 2)·L·B (trapezoidal, Mhammedi et al.,
        ICML 2017 Table 2), plus 2·N·L for the ‖v_k‖².
    """
    V, h = np.asarray(V), np.asarray(h)
    if tau is None:
        y = hprod_vector(V, h, trapezoidal=trapezoidal, transpose=transpose, check=check)
        if y is not None:
            return y
    dtype, n, _, batch, P, vector, B, V3, H3 = _operands(V, h, "h")
    Y = output((*batch, n) if vector else (*batch, n, B), dtype)
    if P == 0:
        return Y
    t2 = taus_of(tau, V3, dtype)
    trap = trapezoidal or t2 is not None
    status = forward(V3, H3, Y.reshape((P, n, B)), trap, transpose, False, t2)
    if status and check:
        _raise_nonfinite(V, trapezoidal)
    return Y


def hform(
    V: Any, ncols: int | None = None, *, trapezoidal: bool = False, tau: Any = None
) -> np.ndarray:
    """The dense H(v₁)…H(v_L) (its first ``ncols`` columns), shape (..., N, ncols), by the
    reflections applied to [I; 0]; NaN/Inf in V raise ``ValueError``. A batch of small
    matrices runs in the SIMD lanes (:mod:`~householderla._kernels.numba_lanes`, N ≤
    ``LANES_MAX_N``; the dispatch: :mod:`~householderla._kernels.numba_batched`), which
    with ``trapezoidal`` V also skip
    the columns < k that H(v_k) leaves unchanged (LAPACK orgqr's 4N³/3 flops for L = N);
    4·N·L·ncols flops per matrix otherwise. ``tau``: V is LAPACK's ``a``, as in :func:`hprod`
    (``?orgqr``); a stack of column-major ``a`` (``?geqrf``'s and ``torch.geqrf``'s layout)
    is read in place, column by column, with the bits of its row-major copy."""
    V = np.asarray(V)
    n = V.shape[-2] if V.ndim >= 2 else 0
    E = np.eye(n, n if ncols is None else ncols, dtype=V.dtype)
    Vc = _columns_stack(V) if tau is not None else None
    if Vc is not None:  # (…, L, N) views of the matrices' columns: no copy to C order
        P, B = Vc.shape[0], E.shape[1]
        Y = output((*V.shape[:-2], n, B), V.dtype)
        t2 = taus_of(tau, np.swapaxes(Vc, 1, 2), V.dtype)
        if forward(Vc, E[None], Y.reshape((P, n, B)), True, False, True, t2, True):
            _raise_nonfinite(V, True)
        return Y
    dtype, n, _, batch, P, _, B, V3, E3 = _operands(V, E, "ncols")
    Y = output((*batch, n, B), dtype)
    t2 = taus_of(tau, V3, dtype) if P else None
    trap = trapezoidal or t2 is not None
    if P and forward(V3, E3, Y.reshape((P, n, B)), trap, False, True, t2):
        _raise_nonfinite(V, trapezoidal)
    return Y


def _columns_stack(V: np.ndarray) -> np.ndarray | None:
    """The C-contiguous (P, L, N) transposed view of a stack V (…, N, L) of P ≥ 1 matrices,
    each stored column-major (LAPACK's layout) and not also row-major, float32/float64,
    L ≤ N; else None (the caller copies V to C order as for any other layout)."""
    if V.ndim < 3 or V.flags.c_contiguous or V.dtype not in (_F32, _F64) or V.size == 0:
        return None
    if V.shape[-1] > V.shape[-2]:
        return None
    Vc = np.swapaxes(V, -1, -2)
    if not Vc.flags.c_contiguous:
        return None
    return Vc.reshape((-1, *Vc.shape[-2:]))


def hgrad(
    V: Any,
    g: Any,
    *,
    h: Any = None,
    y: Any = None,
    trapezoidal: bool = False,
    transpose: bool = False,
    check: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Backward of :func:`hprod`: (V̄, h̄) for the cotangent ``g`` of y = hprod(V, h).

    Give the input ``h`` (the output is recomputed, 4·N·L·B more flops) or the output ``y``
    (Mhammedi et al., ICML 2017, Algorithm 1's BP, which starts from C = y). Exactly one of them.

    Returns
    -------
    V_bar : ndarray, shape of V
        Full gradient with respect to the unnormalised columns (Zhang, Lei & Dhillon, ICML 2018 eq.
        15); zero columns get zero; with ``trapezoidal`` the entries above the diagonal get zero.
    h_bar : ndarray, shape of h (or of y)
        H(v_L)…H(v₁) g (Mhammedi et al., ICML 2017 eq. 15), summed over the batch axes h was
        broadcast along.

    Notes
    -----
    11·N·L·B flops (dense; Zhang, Lei & Dhillon, ICML 2018, Table 1: Hgrad 3n + 6k plus the 4k
    recomputation) with O(N·B) working memory: each reflection's input is recovered from its output.
    Non-finite V gives NaN (``check=False``, like the NumPy VJP) or raises (``check=True``).
    """
    if (h is None) == (y is None):
        raise ValueError("give exactly one of h (the input) or y (the output)")
    x_name = "h" if y is None else "y"
    V, x, g = np.asarray(V), np.asarray(h if y is None else y), np.asarray(g)
    dtype, n, _, batch, P, vector, B, V3, X3 = _operands(V, x, x_name)
    gshape = (*batch, n) if vector else (*batch, n, B)
    if g.shape != gshape:
        raise ValueError(f"g must have the shape of the output {gshape}; got {tuple(g.shape)}")
    if y is not None and x.shape != gshape:
        raise ValueError(f"y must have the shape of the output {gshape}; got {tuple(x.shape)}")
    if P == 0:
        return np.zeros(V.shape, dtype), np.zeros(x.shape, dtype)
    G3 = g.reshape((P, n, B))
    if g.dtype is not dtype or not G3.flags.c_contiguous:
        G3 = np.ascontiguousarray(G3, dtype=dtype)
    Vb = np.empty(V3.shape, dtype)
    Hb = np.empty(X3.shape, dtype)
    args = (y is not None, trapezoidal, transpose, SAFE_EXP[dtype])
    status = bp_kernel(V3, X3, G3, Vb, Hb, *args)
    if status < 0:  # rescale the columns whose ‖v‖² is out of range; v̄ = c·v̄' (degree −1)
        Vs, shift = rescaled(V3, trapezoidal)
        status = bp_kernel(Vs, X3, G3, Vb, Hb, *args)
        with np.errstate(over="ignore"):  # a gradient beyond the dtype's range is ±inf
            Vb = np.ldexp(Vb, shift).astype(dtype)
    if status and check:
        _raise_nonfinite(V, trapezoidal)
    V_bar = _unbroadcast(Vb, tuple(V.shape), batch)
    h_bar = _unbroadcast(Hb, (*x.shape, 1) if vector else tuple(x.shape), batch)
    return V_bar, (h_bar.reshape(x.shape) if vector else h_bar)


def _unbroadcast(a3: np.ndarray, shape: tuple[int, ...], batch: tuple[int, ...]) -> np.ndarray:
    """The kernel's (P', *tail) gradient back to ``shape`` (sum over broadcast batch axes)."""
    if a3.shape[0] == 1 or a3.size == math.prod(shape):
        return a3.reshape(shape)
    return sum_to_shape(a3.reshape((*batch, *a3.shape[1:])), shape, np)
