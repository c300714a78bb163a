"""Interoperability: Dask operands (lazy, chunkwise) and zero-copy DLPack hand-over."""
