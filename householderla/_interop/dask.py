"""Dask arrays as right (or left) operands of the operators: ``hl.cwy(V) @ H`` beyond memory.

Every operator maps columns independently, so op @ H = [op @ H₁, op @ H₂, …] over the chunks
of H's batch columns: a lazy Dask array, one task per chunk, nothing run before
``.compute()``. The small factors are computed once, eagerly, and enter the graph as one
shared node (a ``dask.delayed`` of the operator). Same 4·N·L·B + L²·B flops as the eager apply;
O(N·L + N·b) memory per task; the contracted axis is rechunked into one chunk if needed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["dask_matmul", "dask_rmatmul", "is_dask_array"]


def is_dask_array(x: Any) -> bool:
    """True for a ``dask.array.Array`` (checked without importing dask)."""
    t = type(x)
    return t.__name__ == "Array" and t.__module__.split(".")[0] == "dask"


def _result_dtype(op: Any, H: Any) -> Any:
    import numpy as np

    dt = np.dtype(H.dtype)
    if dt.kind in "iub":
        return np.dtype(op.dtype)
    if dt.kind not in "fc":
        raise TypeError(f"H must have a floating, complex or integer dtype; got {dt}")
    return np.result_type(dt, np.dtype(op.dtype))


def _shared_operator(op: Any, K: int) -> Any:
    """The operator with its factors computed, as one shared graph node."""
    import dask
    import numpy as np

    # Build (and cache) the lazy factors now, so every task reuses them instead of
    # recomputing U and T per chunk: CWY/T-CWY operators expose them; any other operator gets
    # one eager apply to a zero column, which builds whatever it caches.
    factors = getattr(op, "_factors", None)
    if factors is not None and hasattr(factors, "get"):
        factors.get()
    else:
        op @ np.zeros((K, 1), dtype=np.dtype(op.dtype))
    return dask.delayed(op, pure=True, traverse=False)


def _check_batch(op: Any, H: Any, name: str) -> Any:
    """Rechunk leading axes of H to one chunk when the operator itself is batched."""
    batch_op = tuple(op.shape[:-2])
    if not batch_op:
        return H
    if tuple(H.shape[:-2]) != batch_op:
        raise ValueError(
            f"{name} has batch shape {tuple(H.shape[:-2])} but the operator has batch shape "
            f"{batch_op}; with a Dask operand they must be equal"
        )
    return H.rechunk({i: -1 for i in range(len(batch_op))})


def dask_matmul(op: Any, H: Any) -> Any:
    """``op @ H`` for a Dask array H (K,) or (..., K, B), K = op.shape[-1]; lazy, chunkwise.

    The result is chunked like ``H`` along every axis except the rows (one chunk of
    ``op.shape[-2]`` rows). dtype: the operator's dtype, or the promoted float dtype.
    """
    import dask.array as da
    import numpy as np

    rows, K = op.shape[-2], op.shape[-1]
    if H.ndim == 0 or H.shape[-1 if H.ndim == 1 else -2] != K:
        want = f"({K},) or (..., {K}, B)"
        raise ValueError(f"H must have shape {want}; got shape {tuple(H.shape)}")
    dtype = _result_dtype(op, H)
    if H.ndim == 1 and len(op.shape) > 2:
        # a vector against a batched operator: the batched result (..., rows), as eager
        return dask_matmul(op, da.broadcast_to(H[:, None], (*op.shape[:-2], K, 1)))[..., 0]
    op_d = _shared_operator(op, K)
    if H.ndim == 1:
        H = H.rechunk(-1)
        return da.map_blocks(
            _apply_block, H, op_d, dtype=dtype, chunks=((rows,),), meta=np.empty((0,), dtype)
        )
    H = _check_batch(op, H, "H").rechunk({H.ndim - 2: -1})
    chunks = (*H.chunks[:-2], (rows,), H.chunks[-1])
    return da.map_blocks(
        _apply_block, H, op_d, dtype=dtype, chunks=chunks, meta=np.empty((0,) * H.ndim, dtype)
    )


def dask_rmatmul(op: Any, H: Any) -> Any:
    """``H @ op`` for a Dask array H (K,) or (..., B, K), K = op.shape[-2]; lazy, chunkwise."""
    import dask.array as da
    import numpy as np

    K, cols = op.shape[-2], op.shape[-1]
    if H.ndim == 0 or H.shape[-1] != K:
        want = f"({K},) or (..., B, {K})"
        raise ValueError(f"H must have shape {want}; got shape {tuple(H.shape)}")
    dtype = _result_dtype(op, H)
    if H.ndim == 1 and len(op.shape) > 2:
        return dask_rmatmul(op, da.broadcast_to(H[None, :], (*op.shape[:-2], 1, K)))[..., 0, :]
    op_d = _shared_operator(op.T, K)
    if H.ndim == 1:
        H = H.rechunk(-1)
        return da.map_blocks(
            _rapply_block, H, op_d, dtype=dtype, chunks=((cols,),), meta=np.empty((0,), dtype)
        )
    H = _check_batch(op, H, "H").rechunk({H.ndim - 1: -1})
    chunks = (*H.chunks[:-1], (cols,))
    return da.map_blocks(
        _rapply_block, H, op_d, dtype=dtype, chunks=chunks, meta=np.empty((0,) * H.ndim, dtype)
    )


def _apply_block(block: Any, op: Any) -> Any:
    return op @ block


def _rapply_block(block: Any, op_t: Any) -> Any:
    """block @ op = (opᵀ @ blockᵀ)ᵀ, with opᵀ precomputed (shares the factors)."""
    if block.ndim == 1:
        return op_t @ block
    return (op_t @ block.swapaxes(-1, -2)).swapaxes(-1, -2)
