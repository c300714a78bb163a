"""Reductions over the row blocks of a row-sharded matrix (``docs/distributed.rst``).

When X (..., N, M) is held as row blocks X_k, one per process, everything a Stiefel step
needs beyond a block's own rows is a sum of M×M Gram-type products X_kᴴY_k, a maximum over
rows (the exact power-of-two scales, the range guards), or the stacked R factors of the
blocks (the QR fallback of ``polar``). :class:`Rows` names these reductions; :data:`LOCAL`
is the one-block case, where each is the identity, and
:mod:`householderla._interop.torch_distributed` implements them with ``torch.distributed``.
Every process calls the same reductions in the same order (the branches that choose them
depend only on reduced, hence identical, values).
"""

from __future__ import annotations

from typing import Any

from .namespace import device_of, mH, real_dtype

__all__ = ["LOCAL", "Rows", "block_max", "row_gram", "row_sum"]


class Rows:
    """The row blocks of X: one block (every reduction is the identity) unless a subclass
    reduces across processes.

    ``reduce(sums, maxes)`` returns the sums over the blocks of the arrays ``sums`` and the
    element-wise maxima of ``maxes`` (one round of communication for both); ``stack(a)``
    the blocks' arrays (..., K, M) stacked along axis −2 in block order, ``own(a, width, k)``
    this block's k rows of such a stack of ``width``-row arrays; ``index`` is this block's
    position in that order (traced on a JAX mesh), ``total(n)`` the row count of X from this
    block's ``n``.
    """

    sharded = False
    index = 0

    def total(self, n: int) -> int:
        return n

    def reduce(self, sums: Any = (), maxes: Any = ()) -> tuple[list[Any], list[Any]]:
        return list(sums), list(maxes)

    def stack(self, a: Any) -> Any:
        return a

    def own(self, a: Any, width: int, k: int) -> Any:
        start = self.index * width
        return a[..., start : start + k, :]


#: One block: X is whole.
LOCAL = Rows()


def row_sum(rows: Rows, a: Any) -> Any:
    """The sum over the blocks of one array (e.g. a local product X_kᴴY_k)."""
    return rows.reduce([a])[0][0]


def row_gram(rows: Rows, X: Any, xp: Any) -> Any:
    """XᴴX (..., M, M) summed over the blocks, made exactly Hermitian after the sum (a sum
    of Hermitian blocks in another order per entry need not be)."""
    A = row_sum(rows, mH(X, xp) @ X)
    return 0.5 * (A + mH(A, xp))


def block_max(a: Any, xp: Any, axis: Any) -> Any:
    """max |a| over ``axis`` (keepdims) of this block, 0 for a block without rows: the block's
    part of a maximum over the rows of X."""
    if 0 in a.shape:
        axes = {i % a.ndim for i in (axis if isinstance(axis, tuple) else (axis,))}
        shape = tuple(1 if i in axes else n for i, n in enumerate(a.shape))
        return xp.zeros(shape, dtype=real_dtype(xp, a.dtype), device=device_of(a))
    return xp.max(xp.abs(a), axis=axis, keepdims=True)
