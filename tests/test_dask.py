"""Dask operands: ``hl.cwy(V) @ H`` with H a Dask array is lazy, chunkwise and exact.

Exactness: each chunk runs the very same NumPy code on a column block as the eager apply on
the whole H. BLAS may block a product of 8 columns differently from one of 64, so the
comparison is to a few ulps (rtol 1e-13 in float64: ~ 500 eps, far below any real bug, which
would show as an O(1) error), not bit-for-bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require

import householderla as hl

dask = require("dask")
da = require("dask.array")
from dask.callbacks import Callback  # noqa: E402

RTOL = 1e-13


class _CountTasks(Callback):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def _pretask(self, key: object, dsk: object, state: object) -> None:
        self.count += 1


def _data(N: int = 40, L: int = 12, B: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((N, L)), rng.standard_normal((N, B))


def test_cwy_matmul_is_lazy_and_exact() -> None:
    V, H = _data()
    Hd = da.from_array(H, chunks=(40, 16))
    with _CountTasks() as counter:
        Y = hl.cwy(V) @ Hd
        assert counter.count == 0, "building the product must not run any task"
    assert isinstance(Y, da.Array)
    assert Y.shape == (40, 64) and Y.dtype == np.float64
    assert Y.chunks == ((40,), (16, 16, 16, 16))
    with _CountTasks() as counter:
        got = Y.compute(scheduler="threads")
    assert counter.count >= 4  # at least one task per chunk
    np.testing.assert_allclose(got, hl.cwy(V) @ H, rtol=RTOL, atol=RTOL)


def test_factors_are_one_shared_graph_node() -> None:
    V, H = _data()
    Y = hl.cwy(V) @ da.from_array(H, chunks=(40, 8))
    graph = dict(Y.__dask_graph__())
    # 8 chunks of H, 8 result chunks and ONE node holding the operator with its factors.
    assert len(graph) == 8 + 8 + 1


def test_rows_chunked_are_rechunked() -> None:
    V, H = _data()
    Y = hl.cwy(V) @ da.from_array(H, chunks=(10, 32))
    np.testing.assert_allclose(Y.compute(), hl.cwy(V) @ H, rtol=RTOL, atol=RTOL)


def test_tcwy_embeds_and_projects() -> None:
    rng = np.random.default_rng(1)
    V = rng.standard_normal((50, 6))
    X = rng.standard_normal((6, 30))
    op = hl.tcwy(V)
    Y = op @ da.from_array(X, chunks=(6, 7))
    assert Y.shape == (50, 30)
    np.testing.assert_allclose(Y.compute(), op @ X, rtol=RTOL, atol=RTOL)
    Z = rng.standard_normal((50, 20))
    P = op.T @ da.from_array(Z, chunks=(50, 5))
    assert P.shape == (6, 20)
    np.testing.assert_allclose(P.compute(), op.T @ Z, rtol=RTOL, atol=RTOL)


def test_left_operand_and_vector() -> None:
    V, H = _data()
    op = hl.cwy(V)
    Hl = H.T.copy()  # (B, N): rows are the batch
    Y = da.from_array(Hl, chunks=(16, 40)) @ op
    assert isinstance(Y, da.Array)
    np.testing.assert_allclose(Y.compute(), Hl @ op, rtol=RTOL, atol=RTOL)
    h = H[:, 0]
    y = op @ da.from_array(h, chunks=10)
    np.testing.assert_allclose(y.compute(), op @ h, rtol=RTOL, atol=RTOL)


def test_batched_operator_and_integer_operand() -> None:
    rng = np.random.default_rng(2)
    V = rng.standard_normal((3, 20, 5))
    H = rng.integers(-3, 4, size=(3, 20, 12))
    op = hl.cwy(V)
    Y = op @ da.from_array(H, chunks=(1, 20, 4))
    assert Y.dtype == np.float64
    np.testing.assert_allclose(Y.compute(), op @ H.astype(np.float64), rtol=RTOL, atol=RTOL)


def test_float32_stays_float32() -> None:
    V, H = _data()
    op = hl.cwy(V.astype(np.float32))
    Y = op @ da.from_array(H.astype(np.float32), chunks=(40, 16))
    assert Y.dtype == np.float32
    assert Y.compute().dtype == np.float32


def test_bad_shapes_name_the_operand() -> None:
    V, _ = _data()
    with pytest.raises(ValueError, match="H must have shape"):
        hl.cwy(V) @ da.zeros((39, 4), chunks=(39, 2))
    with pytest.raises(ValueError, match="batch shape"):
        hl.cwy(np.stack([V, V])) @ da.zeros((3, 40, 4), chunks=(1, 40, 2))
    with pytest.raises(TypeError, match="dtype"):
        hl.cwy(V) @ da.zeros((40, 4), dtype=object, chunks=(40, 2))


def test_input_not_mutated() -> None:
    V, H = _data()
    V.setflags(write=False)
    H0 = H.copy()
    H.setflags(write=False)
    (hl.cwy(V) @ da.from_array(H, chunks=(40, 16))).compute()
    np.testing.assert_array_equal(H, H0)


def test_distributed_local_cluster() -> None:
    distributed = require("dask.distributed")
    V, H = _data(N=60, L=10, B=48)
    op = hl.cwy(V)
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        Y = op @ da.from_array(H, chunks=(60, 12))
        got = client.compute(Y).result()
    np.testing.assert_allclose(got, op @ H, rtol=RTOL, atol=RTOL)


def test_batched_operator_and_vector_operand():
    rng = np.random.default_rng(3)
    op = hl.cwy(rng.standard_normal((3, 20, 5)))
    h = rng.standard_normal(20)
    for product, ref in ((lambda x: op @ x, op @ h), (lambda x: x @ op, h @ op)):
        try:
            y = product(da.from_array(h, chunks=10))
        except ValueError as exc:  # refusing, as for a 2-D operand, is fine too
            assert "batch shape" in str(exc)
            continue
        assert y.shape == ref.shape
        np.testing.assert_allclose(y.compute(), ref, rtol=RTOL, atol=RTOL)


def test_svd_householder_operand():
    rng = np.random.default_rng(4)
    W = hl.svd_householder(
        rng.standard_normal((30, 6)), rng.standard_normal(8), rng.standard_normal((8, 8))
    )
    X, Y = rng.standard_normal((8, 20)), rng.standard_normal((30, 9))
    got = W @ da.from_array(X, chunks=(8, 5))
    assert isinstance(got, da.Array)
    np.testing.assert_allclose(got.compute(), W @ X, rtol=RTOL, atol=RTOL)
    got_t = W.T @ da.from_array(Y, chunks=(30, 4))
    np.testing.assert_allclose(got_t.compute(), W.T @ Y, rtol=RTOL, atol=RTOL)
