"""Row-sharded Stiefel steps on a JAX mesh (``docs/distributed.rst``, "JAX: a mesh"): under
``jax.shard_map`` each device holds a row block of X, and the reductions of
:class:`householderla._lib.rows.Rows` are collectives over the mesh axis: ``psum`` of the M×M
sums, ``pmax`` of the maxima over rows, ``all_gather`` of the M×M R factors of TSQR. The step
is traced, so its value checks (eager only) are skipped, as under ``jax.jit``.
"""

from __future__ import annotations

from typing import Any

from .._lib.rows import Rows

__all__ = ["ROW_FIELDS", "MeshRows", "shard_rows"]

#: The state fields with X's rows (U, Adam's q and q_max); the others (count, Z, p, p_max)
#: are the same on every device.
ROW_FIELDS = ("U", "q", "q_max")


class MeshRows(Rows):
    """The row blocks of X over the mesh axis (or axes) ``axis``, inside ``jax.shard_map``:
    equal blocks, one a device, in the axis's order."""

    sharded = True

    def __init__(self, axis: Any) -> None:
        self.axis = axis

    @property
    def index(self) -> Any:  # a traced int32: this device's position on the axis
        import jax

        return jax.lax.axis_index(self.axis)

    def total(self, n: int) -> int:
        import jax

        return n * jax.lax.axis_size(self.axis)

    def reduce(self, sums: Any = (), maxes: Any = ()) -> tuple[list[Any], list[Any]]:
        import jax

        sums, maxes = list(sums), list(maxes)
        if sums:
            sums = list(jax.lax.psum(tuple(sums), self.axis))
        if maxes:
            maxes = list(jax.lax.pmax(tuple(maxes), self.axis))
        return sums, maxes

    def stack(self, a: Any) -> Any:
        import jax

        return jax.lax.all_gather(a, self.axis, axis=a.ndim - 2, tiled=True)

    def own(self, a: Any, width: int, k: int) -> Any:
        import jax

        return jax.lax.dynamic_slice_in_dim(a, self.index * width, k, axis=a.ndim - 2)


def shard_rows(fn: Any, mesh: Any, axis: Any, ndim: int, state_type: Any, update: bool) -> Any:
    """``fn`` under ``jax.shard_map``: ``update(X, G, state) -> (X, state)`` (``update``) or
    ``init(X) -> state``, with X and G (..., N, M) of ``ndim`` dimensions by rows over
    ``axis``, the :data:`ROW_FIELDS` of the state (a NamedTuple ``state_type``) likewise, its
    other fields replicated."""
    import jax

    P = jax.sharding.PartitionSpec
    rows = P(*([None] * (ndim - 2)), axis, None)
    state = state_type(*(rows if f in ROW_FIELDS else P() for f in state_type._fields))
    if update:
        return jax.shard_map(fn, mesh=mesh, in_specs=(rows, rows, state), out_specs=(rows, state))
    return jax.shard_map(fn, mesh=mesh, in_specs=(rows,), out_specs=state)
