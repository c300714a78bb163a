"""Linear algebra the Array API standard lacks, with one native route per backend.

``inv_upper_triangular``: NumPy by LAPACK ``trtri`` (one matrix) or
``scipy.linalg.solve_triangular`` (batched); torch and JAX by their ``solve_triangular``; CuPy by
``cupyx.scipy.linalg.solve_triangular`` per matrix; anything else by
:func:`inv_upper_triangular_recursive` (pure Array API).
"""

from __future__ import annotations

import math
from typing import Any

import array_api_compat as aac
import numpy as np

from .blas import gemm_available, gemm_subtract
from .namespace import device_of, is_complex, is_half, mH, mT, real_dtype

__all__ = [
    "abs2",
    "eye_like",
    "gram_upper",
    "inv_upper_triangular",
    "inv_upper_triangular_recursive",
    "max_abs_parts",
    "own_numpy",
    "pow2_normalise",
    "pow2_scale",
    "real_dot",
    "row_major_copy",
    "solve_upper_triangular",
    "subtract_product",
    "sum_to_shape",
    "where0",
    "with_diagonal",
    "workspace",
]


def eye_like(xp: Any, n: int, dtype: Any, device: Any, batch: tuple[int, ...] = ()) -> Any:
    """Identity of shape ``batch + (n, n)`` (broadcast, not materialised per batch)."""
    eye = xp.eye(n, dtype=dtype, device=device)
    return xp.broadcast_to(eye, batch + (n, n)) if batch else eye


def with_diagonal(S: Any, d: Any, xp: Any) -> Any:
    """S (..., L, L) with its diagonal set to d (..., L), for an S whose diagonal is zero
    and which the caller owns (a fresh ``triu(G, k=1)``): written in place on torch (one
    op: a copy into the diagonal view, which autograd records if it records S) and NumPy;
    S + I·d elsewhere (JAX, array-api-strict, Dask: immutable or without views)."""
    if aac.is_torch_namespace(xp):
        S.diagonal(dim1=-2, dim2=-1).copy_(d)
        return S
    if aac.is_numpy_namespace(xp) and S.flags.writeable:
        np.einsum("...ii->...i", S)[...] = d
        return S
    return S + eye_like(xp, S.shape[-1], S.dtype, device_of(S)) * d[..., None, :]


def inv_upper_triangular(S: Any, xp: Any) -> Any:
    """Inverse of the upper-triangular ``S``: (..., L, L) -> (..., L, L).

    Uses LAPACK's trtri for a single NumPy matrix (L³/3 flops), else the backend's triangular
    solve against the identity (L³); backends without one use
    :func:`inv_upper_triangular_recursive`.
    """
    n = S.shape[-1]
    if n == 0 or math.prod(S.shape) == 0:  # nothing to invert (LAPACK rejects n = 0, and
        return S  # SciPy a zero-size batch): the empty result of the right shape
    eye = eye_like(xp, n, S.dtype, device_of(S), tuple(S.shape[:-2]))
    if aac.is_numpy_namespace(xp):
        import numpy as np
        import scipy.linalg

        if S.ndim == 2:  # LAPACK trtri: L³/3 flops, 1.7× faster than a solve at L = 1024
            (trtri,) = scipy.linalg.lapack.get_lapack_funcs(("trtri",), (S,))
            inv, info = trtri(S, lower=0)
            if info == 0:
                return inv
        return scipy.linalg.solve_triangular(S, np.array(eye), lower=False, check_finite=False)
    if aac.is_torch_namespace(xp):
        import torch

        return torch.linalg.solve_triangular(S, eye.contiguous(), upper=True)
    if aac.is_jax_namespace(xp):
        import jax.scipy.linalg

        return jax.scipy.linalg.solve_triangular(S, eye, lower=False)
    if aac.is_cupy_namespace(xp):  # pragma: no cover - needs a GPU
        import cupy
        import cupyx.scipy.linalg

        flat = xp.reshape(S, (-1, n, n))
        eye2 = cupy.eye(n, dtype=S.dtype)
        out = cupy.stack([cupyx.scipy.linalg.solve_triangular(s, eye2) for s in flat])
        return xp.reshape(out, S.shape)
    return inv_upper_triangular_recursive(S, xp)


def solve_upper_triangular(S: Any, B: Any, xp: Any, adjoint: bool = False) -> Any:
    """S⁻¹ B (``adjoint``: S⁻ᴴ B, a lower-triangular solve with Sᴴ) for upper-triangular S
    (..., L, L) and B (..., L, K): L²·K flops (trsm).

    One triangular solve instead of trtri (L³/3) followed by a full product (2·L²·K). NumPy
    uses LAPACK through ``scipy.linalg.solve_triangular`` (batched), torch
    ``torch.linalg.solve_triangular``, JAX ``jax.scipy.linalg.solve_triangular``; other
    namespaces multiply by :func:`inv_upper_triangular`.
    """
    if math.prod(S.shape) == 0 or math.prod(B.shape) == 0:
        return B if B.shape[-2] == S.shape[-1] else mT(S) @ B  # empty: the right shape
    if aac.is_numpy_namespace(xp):
        import scipy.linalg

        trans = "C" if adjoint else "N"
        return scipy.linalg.solve_triangular(S, B, trans=trans, lower=False, check_finite=False)
    if aac.is_torch_namespace(xp):
        import torch

        if adjoint:
            return torch.linalg.solve_triangular(S.mH, B, upper=False)
        return torch.linalg.solve_triangular(S, B, upper=True)
    if aac.is_jax_namespace(xp):
        import jax.scipy.linalg

        return jax.scipy.linalg.solve_triangular(S, B, trans="C" if adjoint else 0, lower=False)
    inv = inv_upper_triangular(S, xp)
    return (mH(inv, xp) if adjoint else inv) @ B


def gram_upper(V: Any, xp: Any) -> Any:
    """VᴴV (..., L, L) for V (..., N, L) (VᵀV for real V); on a single NumPy matrix only
    the upper triangle is computed (BLAS syrk, complex herk: N·L² flops instead of 2·N·L²)
    and the strict lower part is zero. Callers must read the upper triangle only."""
    if aac.is_numpy_namespace(xp) and V.ndim == 2 and V.dtype.kind in "fc" and V.size:
        # (BLAS rejects N = 0 or L = 0, printing "illegal value" to stderr: matmul then)
        import numpy as np
        import scipy.linalg

        cx = V.dtype.kind == "c"
        (rk,) = scipy.linalg.blas.get_blas_funcs(("herk" if cx else "syrk",), (V,))
        # on the Fortran view of Vᵀ (C-contiguous V is F-contiguous Vᵀ): no copy. herk there
        # gives Vᵀ conj(V) = conj(VᴴV).
        if V.flags.c_contiguous:
            G = np.asarray(rk(1.0, V.T, trans=0, lower=0))
            return np.conjugate(G, out=G) if cx else G
        return np.asarray(rk(1.0, V, trans=2 if cx else 1, lower=0))
    return mH(V, xp) @ V


def subtract_product(Y: Any, A: Any, B: Any, xp: Any, work: Any = None) -> None:
    """Y −= A @ B in place, for a writeable Y (..., r, c) (a view of a NumPy, torch or CuPy
    array), A (..., r, n), B (..., n, c); 2·r·n·c flops.

    No temporary of Y's size is allocated: torch accumulates inside the GEMM (``addmm_``,
    β = 1, on a 2-D Y), and so does a 2-D NumPy Y through the CBLAS ``?gemm`` of NumPy's
    own OpenBLAS where it applies (:func:`householderla._lib.blas.gemm_subtract`). Otherwise
    NumPy and CuPy write the product of a block of A's rows into ``work``
    (``matmul(out=)``; an array the caller allocated once, with at least c columns and any
    number of rows: Y is then updated in row blocks of that height) and subtract it. Loops
    that update a trailing block of one matrix (``?orgqr``) would otherwise allocate a
    temporary per step, which glibc serves from fresh pages, one page fault per 4 KiB (see
    :func:`workspace`). Without ``work``: Y −= A @ B.
    """
    if aac.is_torch_namespace(xp) and Y.ndim == 2:
        Y.addmm_(A, B, alpha=-1)
    elif aac.is_numpy_namespace(xp) and Y.ndim == 2 and gemm_subtract(Y, A, B):
        return
    elif work is not None and (aac.is_numpy_namespace(xp) or aac.is_cupy_namespace(xp)):
        if aac.is_numpy_namespace(xp):
            import numpy as raw
        else:  # pragma: no cover - needs a GPU
            import cupy as raw
        R = work.shape[-2]  # rows per GEMM: row blocks of Y when work has fewer rows
        for r in range(0, Y.shape[-2], R):
            w = work[..., : min(R, Y.shape[-2] - r), : Y.shape[-1]]
            raw.matmul(A[..., r : r + R, :], B, out=w)
            Yr = Y[..., r : r + R, :]
            raw.subtract(Yr, w, out=Yr)
    else:
        Y -= A @ B


def row_major_copy(x: Any, xp: Any) -> Any:
    """A copy of x in row-major (C) order that the caller may update in place (torch:
    ``clone``, which under no-grad is not attached to autograd; elsewhere
    ``asarray(copy=True)``). Row-major, so that its column blocks ``x[..., s:]`` are BLAS
    operands with unit stride along their rows (see :func:`subtract_product`); a lazily
    conjugated torch view is conjugated in the copy. (NumPy's ``asarray(copy=True)`` keeps
    the layout of its input, so a transposed view would stay column-major.)"""
    if aac.is_torch_namespace(xp):
        import torch

        return x.clone(memory_format=torch.contiguous_format)
    if aac.is_numpy_namespace(xp) or aac.is_cupy_namespace(xp):
        return x.copy(order="C")
    return xp.asarray(x, copy=True)


def workspace(batch: tuple[int, ...], rows: int, cols: int, like: Any, xp: Any) -> Any:
    """Scratch for :func:`subtract_product` on NumPy and CuPy (None elsewhere: torch
    accumulates in ``addmm_``, and so does 2-D NumPy in ``?gemm`` where
    :func:`~householderla._lib.blas.gemm_available`): at most ``rows`` rows, fewer when
    ``cols`` is wide, so that it holds about 2¹⁷ numbers (1 MiB in float64), and never
    fewer than 256 rows. The updates then run in row blocks of a buffer allocated once,
    instead of one temporary the size of each trailing block: glibc serves large
    temporaries from fresh pages (``mmap``, or a ``brk`` heap it trims after the call), one
    page fault per 4 KiB — a third of the time of a thin 1024 × 256 Q from a built operator
    (``benchmarks/results/tuning.md``, which also has the row-block sizes measured at
    N = 4096)."""
    if not (aac.is_numpy_namespace(xp) or aac.is_cupy_namespace(xp)):
        return None
    if aac.is_numpy_namespace(xp) and not batch and gemm_available(like.dtype):
        return None  # 2-D NumPy updates run in ?gemm itself (subtract_product)
    r = min(rows, max(256, (1 << 17) // max(cols, 1)))
    return xp.empty((*batch, r, cols), dtype=like.dtype, device=device_of(like))


def abs2(x: Any, xp: Any) -> Any:
    """|x|² elementwise, real: ``x * x`` for real arrays, Re² + Im² for complex ones."""
    if is_complex(x.dtype):
        re, im = xp.real(x), xp.imag(x)
        return re * re + im * im
    return x * x


def real_dot(a: Any, b: Any, xp: Any, axis: int = -2) -> Any:
    """Re Σ conj(a) b along ``axis`` (keepdims): the real inner product ⟨a, b⟩ = Re(aᴴb) of
    columns, the pairing every VJP of this library is adjoint for (``a * b`` summed for real
    arrays; real NumPy arrays of one shape and dtype by ``einsum``, which forms no product
    array: the same sums row by row, without a temporary of a's size)."""
    if is_complex(a.dtype) or is_complex(b.dtype):
        return xp.sum(xp.real(xp.conj(a) * b), axis=axis, keepdims=True)
    if isinstance(axis, int) and _large_numpy(a, b):
        axes = list(range(a.ndim))
        kept = [i for i in axes if i != axis % a.ndim]
        return np.expand_dims(np.einsum(a, axes, b, axes, kept), axis)
    return xp.sum(a * b, axis=axis, keepdims=True)


#: glibc's default ``M_MMAP_THRESHOLD``: smaller temporaries come from its heap, larger ones
#: from fresh pages (mmap, or a heap it trims after the call), one page fault per 4 KiB.
FRESH_PAGES_BYTES = 128 * 1024


def own_numpy(y: Any, *operands: Any) -> bool:
    """Whether an elementwise result of ``y`` with ``operands`` may be written into ``y``
    itself: ``y`` is a writeable NumPy array of at least ``FRESH_PAGES_BYTES`` that the
    caller computed (never an input), with the result's shape and dtype. Each temporary of
    that size that a chain of elementwise steps would allocate instead comes from fresh
    pages: the VJP of ``cwy(V) @ h`` at N = 1024, L = 256, B = 64 (2 MiB per N × L array)
    took 3,296 page faults a call before its steps wrote in place and summed by ``einsum``,
    2,032 after, and 0.89–0.93× the time (paired in one process). Smaller arrays keep the
    plain expressions, whose calls cost less (N = 128, L = 16, B = 8: 1.10× the time in
    place)."""
    return _large_numpy(y, *operands) and y.flags.writeable


def _large_numpy(y: Any, *operands: Any) -> bool:
    """y is a NumPy array of at least ``FRESH_PAGES_BYTES``, the operands of its shape and
    dtype."""
    if type(y) is not np.ndarray or y.nbytes < FRESH_PAGES_BYTES:
        return False
    return all(o.dtype == y.dtype and o.shape == y.shape for o in operands)


def inv_upper_triangular_recursive(S: Any, xp: Any) -> Any:
    """Pure Array API inverse of an upper-triangular matrix by recursive 2×2 blocking.

    ``inv([[A, B], [0, C]]) = [[A⁻¹, −A⁻¹ B C⁻¹], [0, C⁻¹]]``: all the work is matrix
    multiplication and the dependency depth is log₂ L (DESIGN, "Numerics we already know").
    The nilpotent power series is avoided: its terms overflow for large L.
    """
    n = S.shape[-1]
    if n == 0:
        return S
    if n == 1:
        return 1.0 / S
    k = n // 2
    Ai = inv_upper_triangular_recursive(S[..., :k, :k], xp)
    Ci = inv_upper_triangular_recursive(S[..., k:, k:], xp)
    X = -((Ai @ S[..., :k, k:]) @ Ci)
    zeros = xp.zeros(tuple(S.shape[:-2]) + (n - k, k), dtype=S.dtype, device=device_of(S))
    top = xp.concat([Ai, X], axis=-1)
    bottom = xp.concat([zeros, Ci], axis=-1)
    return xp.concat([top, bottom], axis=-2)


def sum_to_shape(x: Any, shape: tuple[int, ...], xp: Any) -> Any:
    """Sum ``x`` over the axes broadcasting added to an array of ``shape`` (reverse of
    broadcasting, for gradients of broadcast inputs)."""
    if tuple(x.shape) == tuple(shape):
        return x
    lead = x.ndim - len(shape)
    if lead:
        x = xp.sum(x, axis=tuple(range(lead)))
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and x.shape[i] != 1)
    if axes:
        x = xp.sum(x, axis=axes, keepdims=True)
    return x


def where0(xp: Any, cond: Any, x: Any) -> Any:
    """``x`` where ``cond`` else 0, without evaluating anything unsafe."""
    return xp.where(cond, x, xp.zeros_like(x))


def pow2_normalise(
    X: Any, xp: Any, axis: Any = (-2, -1), keep: float | None = None, m: Any = None
) -> tuple[Any, Any]:
    """(X·2^{-e}, e) with e = ⌊log₂ m⌋, m = max |x| over ``axis`` (complex: max of |Re x| and
    |Im x|), keepdims, in X's real dtype (float32 for half X); e = 0 where m is 0 or not
    finite (NaN and Inf pass through). The largest entry of the result lies in [1, 2) (up to
    the rounding of log₂), so sums of squares of it neither overflow nor lose the scale to
    underflow, and the scaling is exact: a multiplication by a power of two only moves the
    exponent, subnormal X included (LAPACK's ``dnrm2`` scales for the same reason). 2^{-e}
    does not exist in X's dtype for every e (subnormal X, |e| > 1022 in float64), so it is
    applied as two factors 2^{-h}·2^{-(e-h)}, h = ⌊e/2⌋. Backends that flush subnormals to
    zero (JAX/XLA on CPU and GPU) see a subnormal X as 0. ``keep``: only the part of e
    beyond [−keep, keep] is removed (X with |e| ≤ keep is returned as it is; the rest lands
    at |e| = keep). Elementwise Array API operations only: no value-dependent Python branch
    (traceable under ``jax.jit``). ``m``: that maximum, given (a row-sharded X's, reduced over
    its blocks: ``householderla._lib.rows``)."""
    rd = real_dtype(xp, X.dtype)
    if m is None:
        m = max_abs_parts(X, xp, axis)
    if is_half(xp, rd):
        m = xp.astype(m, xp.float32)
    ok = (m > 0) & (m <= float(xp.finfo(m.dtype).max))
    e = xp.floor(xp.log2(xp.where(ok, m, xp.ones_like(m))))
    if keep is not None:
        e = e - xp.clip(e, min=-keep, max=keep)
    return pow2_scale(X, e, xp), e


def max_abs_parts(X: Any, xp: Any, axis: Any) -> Any:
    """max |x| over ``axis`` (keepdims); for complex X the max of |Re x| and |Im x|."""
    if is_complex(X.dtype):
        return xp.maximum(
            xp.max(xp.abs(xp.real(X)), axis=axis, keepdims=True),
            xp.max(xp.abs(xp.imag(X)), axis=axis, keepdims=True),
        )
    return xp.max(xp.abs(X), axis=axis, keepdims=True)


def pow2_scale(X: Any, e: Any, xp: Any) -> Any:
    """X·2^{-e} exactly, as two factors 2^{-h}·2^{-(e-h)}, h = ⌊e/2⌋ (each exists in X's real
    dtype); the scaling of :func:`pow2_normalise`."""
    rd = real_dtype(xp, X.dtype)
    h = xp.floor(0.5 * e)
    f1, f2 = 2.0 ** (-h), 2.0 ** (h - e)
    if f1.dtype != rd:
        f1, f2 = xp.astype(f1, rd), xp.astype(f2, rd)
    return (X * f1) * f2
