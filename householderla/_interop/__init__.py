"""Interoperability: Dask operands (lazy, chunkwise), zero-copy DLPack hand-over, and row-sharded
Stiefel steps on ``torch.distributed`` and on a JAX mesh."""
