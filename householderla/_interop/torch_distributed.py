"""Sharded steps on ``torch.distributed`` (``docs/distributed.rst``). Stiefel: beyond its
own rows a step needs sums of M×M matrices, maxima over rows and (``polar``'s QR fallback) the
stacked R factors: one ``all_reduce`` of O(M²) numbers a round (maxima ride in the sums: each
process writes its own slot of a P-slot block). Muon: each matrix orthogonalised on one owner
(:func:`round_robin`), its row blocks moved there and back by :func:`all_to_all`. Which DTensor
placements apply: :func:`layout`, :func:`muon_layout`. :data:`SENT` counts the bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._lib.rows import Rows

__all__ = [
    "SENT",
    "ProcessRows",
    "all_to_all",
    "any_bad",
    "is_dtensor",
    "layout",
    "muon_layout",
    "reset_sent",
    "round_robin",
    "row_range",
]

#: Bytes this process handed to collectives since the last :func:`reset_sent`, and their
#: number (the payload: a ring ``all_reduce`` puts about twice its payload on the wire, an
#: ``all_gather`` (P − 1)/P of the gathered array).
SENT = {"bytes": 0, "calls": 0}


def reset_sent() -> dict[str, int]:
    """The counts so far (a copy), then zero them."""
    out = dict(SENT)
    SENT.update(bytes=0, calls=0)
    return out


def _count(t: Any) -> None:
    SENT["bytes"] += t.numel() * t.element_size()
    SENT["calls"] += 1


class ProcessRows(Rows):
    """The row blocks of X over the processes of ``group``: this process holds block
    ``index`` of ``n_rows`` rows in all (torch's ``Shard`` sizes: ⌈N/P⌉ rows a block, the
    last blocks shorter or empty)."""

    sharded = True

    def __init__(self, group: Any, index: int, size: int, n_rows: int) -> None:
        self.group, self.index, self.size, self.n_rows = group, index, size, n_rows

    def total(self, n: int) -> int:
        return self.n_rows

    def _device(self) -> Any:
        import torch
        import torch.distributed as dist

        if dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def reduce(self, sums: Any = (), maxes: Any = ()) -> tuple[list[Any], list[Any]]:
        import torch
        import torch.distributed as dist

        sums, maxes = list(sums), list(maxes)
        if not sums and not maxes:
            return [], []
        parts = [_as_real_torch(a) for a in sums + maxes]
        dtype = _widest([t.dtype for t in parts])
        device = self._device()
        n_sum = sum(t.numel() for t in parts[: len(sums)])
        n_max = sum(t.numel() for t in parts[len(sums) :])
        buf = torch.zeros(n_sum + self.size * n_max, dtype=dtype, device=device)
        at = 0
        for t in parts[: len(sums)]:
            buf[at : at + t.numel()] = t.reshape(-1)
            at += t.numel()
        slot = n_sum + self.index * n_max
        for t in parts[len(sums) :]:
            buf[slot : slot + t.numel()] = t.reshape(-1)
            slot += t.numel()
        _count(buf)
        dist.all_reduce(buf, group=self.group)
        out, at = [], 0
        for a, t in zip(sums, parts[: len(sums)], strict=True):
            out.append(_back(buf[at : at + t.numel()], a, t))
            at += t.numel()
        table = buf[n_sum:].reshape(self.size, n_max).amax(dim=0) if n_max else buf[:0]
        out_max, at = [], 0
        for a, t in zip(maxes, parts[len(sums) :], strict=True):
            out_max.append(_back(table[at : at + t.numel()], a, t))
            at += t.numel()
        return out, out_max

    def stack(self, a: Any) -> Any:
        import torch
        import torch.distributed as dist

        t = _as_torch(a).to(self._device()).contiguous()
        r = torch.view_as_real(t) if t.is_complex() else t
        bufs = [torch.empty_like(r) for _ in range(self.size)]
        _count(r)
        dist.all_gather(bufs, r, group=self.group)
        out = torch.cat([torch.view_as_complex(b) if t.is_complex() else b for b in bufs], -2)
        return out.cpu().numpy() if isinstance(a, _NUMPY) else out.to(a.device)


#: NumPy arrays and scalars (a sum over axes of a NumPy array is a NumPy scalar).
_NUMPY = (np.ndarray, np.generic)


def _as_torch(a: Any) -> Any:
    import torch

    return torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, _NUMPY) else a


def _as_real_torch(a: Any) -> Any:
    """``a`` (NumPy or torch) as a real torch tensor; complex as its (..., 2) real view."""
    import torch

    t = _as_torch(a)
    if t.ndim == 0:
        t = t.reshape(1)
    return torch.view_as_real(t.contiguous()) if t.is_complex() else t


def _widest(dtypes: list[Any]) -> Any:
    import torch

    return torch.float64 if torch.float64 in dtypes else dtypes[0]


def _back(flat: Any, like: Any, real: Any) -> Any:
    """The reduced numbers of ``like`` (NumPy or torch, shape and dtype) from ``flat``."""
    import torch

    t = flat.reshape(real.shape).to(real.dtype)
    if like.dtype in (np.complex64, np.complex128) or (
        isinstance(like, torch.Tensor) and like.is_complex()
    ):
        t = torch.view_as_complex(t.contiguous())
    t = t.reshape(tuple(like.shape))
    if isinstance(like, _NUMPY):
        return t.cpu().numpy()
    return t.to(like.device)


def layout(p: Any, wide: bool, what: str) -> ProcessRows | None:
    """How a Stiefel step treats the DTensor ``p`` (..., N, M) (its transpose when ``wide``):
    None for a local step on each process's tensor (``Replicate()``, or ``Shard`` of a batch
    dimension: each process holds whole matrices), :class:`ProcessRows` for ``Shard`` of the
    rows of the Stiefel matrix (``Shard(0)`` of a tall 2-D parameter, as ``fully_shard`` makes
    it). Anything else raises ``ValueError`` naming the placement."""
    mesh, placements = p.device_mesh, tuple(p.placements)
    if mesh.ndim != 1:
        raise ValueError(
            f"{what} is a DTensor with placements {placements} on a {mesh.ndim}-D device mesh; "
            "Stiefel steps take DTensors on a 1-D mesh, sharded by rows (Shard) or replicated "
            "(Replicate)"
        )
    (pl,) = placements
    if pl.is_replicate():
        return None
    nd = p.ndim
    rows_dim, cols_dim = (nd - 1, nd - 2) if wide else (nd - 2, nd - 1)
    if pl.is_shard():
        d = pl.dim % nd
        if d < nd - 2:
            return None
        if d == rows_dim:
            n_rows = p.shape[rows_dim]
            return ProcessRows(mesh.get_group(), mesh.get_local_rank(), mesh.size(), n_rows)
        shape = tuple(p.shape)
        kind = "wide (the Stiefel matrix is its transpose)" if wide else "tall"
        raise ValueError(
            f"{what} ({kind}, shape {shape}) has placement Shard({pl.dim}), which shards the "
            f"columns of its Stiefel matrix; shard it by rows, Shard({rows_dim}), or replicate "
            f"it: the step's M×M reductions need whole rows (Shard({cols_dim}) would need the "
            "N×N ones)"
        )
    raise ValueError(
        f"{what} has placement {pl}; Stiefel steps take parameters sharded by rows "
        f"(Shard({rows_dim})) or replicated (Replicate())"
    )


def any_bad(flags: Any, group: Any) -> Any:
    """The element-wise OR over the processes of ``group`` of a float tensor of 0/1 flags."""
    import torch.distributed as dist

    _count(flags)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
    return flags


def is_dtensor(t: Any) -> bool:
    """Whether ``t`` is a ``torch.distributed`` DTensor (without importing it otherwise)."""
    return type(t).__name__ == "DTensor" and type(t).__module__.startswith("torch.distributed")


def muon_layout(p: Any, what: str) -> str:
    """How Muon steps the DTensor ``p`` (..., A, B): ``"rows"`` for ``Shard`` of the rows of
    its matrices (each matrix gathered to its owner), ``"local"`` for ``Replicate()`` or
    ``Shard`` of a batch dimension (each process holds whole matrices). Anything else
    raises ``ValueError`` naming the placement."""
    mesh, placements = p.device_mesh, tuple(p.placements)
    if mesh.ndim != 1:
        raise ValueError(
            f"{what} is a DTensor with placements {placements} on a {mesh.ndim}-D device mesh; "
            "Muon takes DTensors on a 1-D mesh, sharded by rows (Shard) or replicated "
            "(Replicate)"
        )
    (pl,) = placements
    nd = p.ndim
    if pl.is_replicate():
        return "local"
    if pl.is_shard():
        d = pl.dim % nd
        if d < nd - 2:
            return "local"
        if d == nd - 2:
            return "rows"
        raise ValueError(
            f"{what} (shape {tuple(p.shape)}) has placement Shard({pl.dim}), which shards the "
            f"columns of its matrices; shard it by rows, Shard({nd - 2}), or replicate it "
            "(Replicate())"
        )
    raise ValueError(
        f"{what} has placement {pl!r}; Muon takes parameters sharded by rows (Shard({nd - 2})) "
        "or replicated (Replicate())"
    )


def row_range(n: int, size: int, index: int) -> tuple[int, int]:
    """Rows [start, stop) of block ``index`` of ``n`` rows over ``size`` processes: torch's
    ``Shard`` (⌈n/size⌉ rows a block, the last blocks shorter or empty)."""
    block = -(-n // size)
    start = min(index * block, n)
    return start, min(start + block, n)


def round_robin(costs: list[int], size: int) -> list[int]:
    """The owner of each item: the items by decreasing cost (ties in their order) dealt to
    processes 0, 1, …, size − 1, 0, 1, … in turn."""
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    owner = [0] * len(costs)
    for turn, i in enumerate(order):
        owner[i] = turn % size
    return owner


def all_to_all(send: list[list[Any]], expect: list[list[Any]], group: Any, device: Any) -> Any:
    """One ``all_to_all_single`` of raw bytes: ``send[d]`` the tensors for process ``d``,
    ``expect[s]`` the ``(shape, dtype)`` of those process ``s`` sends here, in order (the
    lists of this process itself empty: its own rows do not travel). Returns the received
    tensors, ``out[s]`` in order. Bytes, so any dtype travels (bfloat16 over gloo too)."""
    import torch
    import torch.distributed as dist

    def nbytes(shape: Any, dtype: Any) -> int:
        return int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()

    flat = [t.contiguous().reshape(-1).view(torch.uint8) for ts in send for t in ts]
    in_splits = [sum(t.numel() * t.element_size() for t in ts) for ts in send]
    out_splits = [sum(nbytes(s, d) for s, d in es) for es in expect]
    buf = torch.cat(flat) if flat else torch.empty(0, dtype=torch.uint8, device=device)
    out = torch.empty(sum(out_splits), dtype=torch.uint8, device=device)
    _count(buf)
    dist.all_to_all_single(out, buf, out_splits, in_splits, group=group)
    received, at = [], 0
    for es in expect:
        got = []
        for shape, dtype in es:
            n = nbytes(shape, dtype)
            got.append(out[at : at + n].clone().view(dtype).reshape(shape))
            at += n
        received.append(got)
    return received
