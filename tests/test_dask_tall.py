"""Tall operators over row-chunked Dask reflectors, and TSQR retractions (issue 14, item 3).

Oracles: the eager NumPy operators and retractions on the same (computed) arrays. The Dask
path sums the Gram matrix and Uᵀh over row chunks in another order than one BLAS call, so
results agree to a few hundred eps for these sizes (entries O(1)): ``TOL`` = 1e-13, where a
wrong chunk or a missing term is O(1) off.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from conftest import require

import householderla as hl

dask = require("dask")
da = require("dask.array")
from dask.callbacks import Callback  # noqa: E402

TOL = 1e-13
N, M, B = 600, 7, 5


class _Tasks(Callback):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def _pretask(self, key: object, dsk: object, state: object) -> None:
        self.count += 1


def _V(seed: int = 0, n: int = N, m: int = M) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, m))


@pytest.mark.parametrize("make", [hl.cwy, hl.tcwy], ids=["cwy", "tcwy"])
def test_products_equal_the_eager_operator(make):
    rng = np.random.default_rng(1)
    V = _V()
    Vd = da.from_array(V, chunks=(70, M))
    op, ref = make(Vd), make(V)
    assert type(op).__name__ == ("TallCWY" if make is hl.cwy else "TallTCWY")
    for o, r in ((op, ref), (op.T, ref.T)):
        assert o.shape == r.shape and o.dtype == np.float64
        n = o.shape[1]
        for h in (rng.standard_normal(n), rng.standard_normal((n, B))):
            # NumPy operand, Dask operand chunked unlike V (rows, and columns)
            chunks = (45, 2)[: h.ndim]
            for operand in (h, da.from_array(h, chunks=chunks)):
                y = o @ operand
                assert isinstance(y, da.Array) and y.shape == (r @ h).shape
                np.testing.assert_allclose(y.compute(), r @ h, atol=TOL)
        np.testing.assert_allclose(o.matrix().compute(), r.matrix(), atol=TOL)
    rows = rng.standard_normal((3, op.shape[0]))
    np.testing.assert_allclose((rows @ op).compute(), rows @ ref, atol=TOL)
    np.testing.assert_allclose(op.T_factor, ref.T_factor, atol=TOL)
    np.testing.assert_allclose(op.U.compute(), ref.U, atol=TOL)


def test_lazy_until_compute_and_one_factor_pass():
    V = _V(2)
    Vd = da.from_array(V, chunks=(50, M))  # 12 row chunks
    with _Tasks() as tasks:
        op = hl.tcwy(Vd)
        opT = op.T
    assert tasks.count == 0, "building the operator must not compute anything"
    with _Tasks() as tasks:
        op.factors()
    # one Gram task per chunk, ceil(12/8) + 1 combine tasks, the top rows: one pass over V
    assert 12 <= tasks.count <= 12 * 3 + 4
    assert opT.factors() is op.factors()  # shared with the transpose, computed once
    x = np.ones((M, B))
    with _Tasks() as tasks:
        y = op @ x
        z = opT @ da.from_array(np.ones((N, B)), chunks=(50, B))
        w = hl.cwy(Vd)
    assert tasks.count == 0, "products are lazy once the factors exist"
    np.testing.assert_allclose(y.compute(), hl.tcwy(V) @ x, atol=TOL)
    np.testing.assert_allclose(z.compute(), hl.tcwy(V).T @ np.ones((N, B)), atol=TOL)
    assert w.shape == (N, N)


def test_extreme_scales_zero_columns_and_float32():
    rng = np.random.default_rng(3)
    V = _V(3)
    V[:, 2] = 0.0  # H(0) = I
    V[:, 0] *= 1e200  # the Gram of V itself would overflow
    V[:, 1] *= 1e-200  # ... or underflow
    Vd = da.from_array(V, chunks=(64, M))
    x = rng.standard_normal((M, B))
    np.testing.assert_allclose((hl.tcwy(Vd) @ x).compute(), hl.tcwy(V) @ x, atol=TOL)
    h = rng.standard_normal((N, B))
    np.testing.assert_allclose((hl.cwy(Vd) @ h).compute(), hl.cwy(V) @ h, atol=TOL)
    V32 = _V(4).astype(np.float32)
    y = hl.tcwy(da.from_array(V32, chunks=(64, M))) @ x.astype(np.float32)
    assert y.dtype == np.float32
    got = y.compute()
    assert got.dtype == np.float32
    # float32: T and the norms accumulated in float64 on both paths; products in float32
    np.testing.assert_allclose(got, hl.tcwy(V32) @ x.astype(np.float32), atol=50 * 2**-23)
    assert (
        hl.cwy(da.from_array(np.arange(12).reshape(6, 2), chunks=3)) @ np.ones(6)
    ).dtype == np.float64


def test_peak_memory_stays_per_chunk():
    """Q h needs two passes over V and h (Uᵀh, then h − U b), TSQR two over X + tZ; the second
    reads clones, so no chunk is held between them: the peak (tracemalloc, one thread) stays a
    few chunks, far below V and h (here 16 MB and 6 MB), and does not grow with N."""
    chunk = 20_000

    def peak(n: int, what: str) -> int:
        Vd = da.random.RandomState(0).standard_normal((n, 8), chunks=(chunk, 8))
        op = hl.cwy(Vd) if what == "cwy" else hl.tcwy(Vd)
        op.factors()
        if what == "cwy":
            h = da.random.RandomState(1).standard_normal((n, 3), chunks=(chunk, 3))
            y = (op @ h).sum(axis=0)
        elif what == "tcwy":
            y = (op @ np.ones((8, 3))).sum(axis=0)
        else:  # two passes of TSQR, local Q factors recomputed
            Z = da.random.RandomState(1).standard_normal((n, 8), chunks=(chunk, 8))
            y = hl.qr_retraction(Vd, Z, 0.1).sum(axis=0)
        tracemalloc.start()
        y.compute(scheduler="synchronous")
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top

    chunk_bytes = chunk * (8 + 3) * 8
    for what in ("cwy", "tcwy", "qr"):
        small, large = peak(100_000, what), peak(250_000, what)
        assert large < 10 * chunk_bytes, (what, large, chunk_bytes)
        assert large < 1.5 * small + chunk_bytes, (what, small, large)


def test_retractions_by_tsqr():
    rng = np.random.default_rng(5)
    X = np.linalg.qr(rng.standard_normal((N, M)))[0]
    Z = 0.1 * rng.standard_normal((N, M))
    Xd = da.from_array(X, chunks=(100, M))
    for f in (hl.qr_retraction, hl.polar_retraction):
        for Zop in (Z, da.from_array(Z, chunks=(250, 3))):
            with _Tasks() as tasks:
                Y = f(Xd, Zop, 0.7)
            assert tasks.count == 0 and isinstance(Y, da.Array)
            got = Y.compute()
            np.testing.assert_allclose(got, f(X, Z, 0.7), atol=TOL)
            np.testing.assert_allclose(got.T @ got, np.eye(M), atol=TOL)
    W = X * 3.0 + 0.1 * rng.standard_normal((N, M))
    np.testing.assert_allclose(
        hl.polar(da.from_array(W, chunks=(100, M))).compute(), hl.polar(W), atol=TOL
    )
    _, info = hl.polar(da.from_array(W, chunks=(100, M)), return_info=True)
    assert info["method"] == "tsqr"
    X32, Z32 = X.astype(np.float32), Z.astype(np.float32)
    Y32 = hl.qr_retraction(da.from_array(X32, chunks=(100, M)), Z32, 0.7)
    assert Y32.dtype == np.float32
    # float32 computed in float64 on both paths and rounded once: equal to the rounding
    np.testing.assert_allclose(Y32.compute(), hl.qr_retraction(X32, Z32, 0.7), atol=4 * 2**-24)


def test_distributed_local_cluster():
    distributed = require("dask.distributed")
    rng = np.random.default_rng(6)
    V, h = _V(6), rng.standard_normal((N, B))
    X = np.linalg.qr(_V(7))[0]
    Z = rng.standard_normal((N, M))
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        op = hl.cwy(da.from_array(V, chunks=(80, M)))
        y = client.compute(op @ da.from_array(h, chunks=(80, B))).result()
        x = client.compute(hl.tcwy(da.from_array(V, chunks=(80, M))) @ np.ones(M)).result()
        Q = client.compute(hl.polar_retraction(da.from_array(X, chunks=(80, M)), Z, 0.1)).result()
    np.testing.assert_allclose(y, hl.cwy(V) @ h, atol=TOL)
    np.testing.assert_allclose(x, hl.tcwy(V) @ np.ones(M), atol=TOL)
    np.testing.assert_allclose(Q, hl.polar_retraction(X, Z, 0.1), atol=TOL)


def test_bad_input_says_what():
    Vd = da.from_array(_V(), chunks=(100, M))
    with pytest.raises(ValueError, match=r"shape \(N, M\)"):
        hl.cwy(da.zeros((2, N, M), chunks=(1, 100, M)))
    with pytest.raises(ValueError, match="M <= N"):
        hl.tcwy(da.zeros((3, 5), chunks=1))
    with pytest.raises(TypeError, match="complex128"):
        hl.cwy(da.zeros((N, M), dtype=complex, chunks=100))
    with pytest.raises(ValueError, match=r"h must have shape \(7,\) or \(7, B\)"):
        hl.tcwy(Vd) @ np.ones(N)
    with pytest.raises(ValueError, match=r"h must have shape \(600,\) or \(600, B\)"):
        hl.cwy(Vd) @ np.ones((5, 2))
    bad = _V()
    bad[3, 4] = np.nan
    with pytest.raises(ValueError, match="NaN or Inf in column 4"):
        hl.cwy(da.from_array(bad, chunks=(100, M))) @ np.ones(N)
    with pytest.raises(ValueError, match="Z must have the shape of X"):
        hl.qr_retraction(Vd, np.ones((N, M + 1)), 0.1)
    with pytest.raises(TypeError, match="step must be a finite real number"):
        hl.qr_retraction(Vd, np.ones((N, M)), float("nan"))
    torch = require("torch")
    with pytest.raises(TypeError, match="Dask or NumPy operands"):
        hl.tcwy(Vd) @ torch.ones(M)
