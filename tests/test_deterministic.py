"""``hl.set_deterministic``: the same operator on the same input gives the same bits.

By default an operator's products take the fastest path, which depends on what earlier
products built (the first product by sequential reflections or LAPACK's panels, the blocks or
the whole factors, the dense Q or W = U T after N columns), and those paths round differently
(in the last bits: a few eps). In deterministic mode the path is a function of the shapes
alone. The checks are bit for bit (``np.array_equal``): any path change breaks them.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from conftest import require

import householderla as hl

pytestmark = pytest.mark.no_dask("the operators' own products")


@pytest.fixture
def deterministic():
    old = hl.set_deterministic(True)
    yield
    hl.set_deterministic(old)


def _cases(rng):
    """(name, operator factory, N, B): each takes a different path on its first products in
    the default mode, then switches (measured with these seeds: 2e-15 to 1e-14 apart)."""
    a, tau = scipy.linalg.qr(rng.standard_normal((300, 200)), mode="raw")[0]
    raw = [scipy.linalg.qr(M, mode="raw")[0] for M in rng.standard_normal((32, 8, 8))]
    stack = np.stack([q for q, _ in raw]), np.stack([t for _, t in raw])
    return [
        ("fresh, sequential first product", lambda: hl.cwy(rng.standard_normal((64, 40))), 64, 8),
        (
            "L <= N/2: folded W after N columns",
            lambda: hl.cwy(rng.standard_normal((64, 16))),
            64,
            8,
        ),
        ("blocked", lambda: hl.cwy(rng.standard_normal((600, 300))), 600, 4),
        ("LAPACK panels first", lambda: hl.from_lapack(a, tau), 300, 8),
        ("LAPACK stack, kernels first", lambda: hl.from_lapack(*stack), 8, 3),
        ("T-CWY", lambda: hl.tcwy(rng.standard_normal((64, 20))), 20, 8),
    ]


def _products(op, h, others):
    """op @ h twelve times, with products of other shapes (and the transpose) in between."""
    ys = []
    for i in range(12):
        ys.append(op @ h)
        op @ others[i % len(others)]
        op.T @ (op @ h)
    return ys


@pytest.mark.usefixtures("deterministic")
def test_the_same_product_gives_the_same_bits_on_numpy():
    rng = np.random.default_rng(0)
    for name, make, K, B in _cases(rng):
        op = make()
        h = rng.standard_normal((*op.shape[:-2], K, B))
        others = [rng.standard_normal((*op.shape[:-2], K, b)) for b in (1, 2 * B + 1, 3 * K)]
        ys = _products(op, h, others)
        assert all(np.array_equal(y, ys[0]) for y in ys), name
        np.testing.assert_allclose(ys[0], op.matrix() @ h, atol=1e-12, err_msg=name)


@pytest.mark.usefixtures("deterministic")
def test_the_same_product_gives_the_same_bits_on_torch():
    torch = require("torch")
    rng = np.random.default_rng(1)
    for N, L in ((64, 40), (64, 16)):
        op = hl.cwy(torch.asarray(rng.standard_normal((N, L))))
        h = torch.asarray(rng.standard_normal((N, 8)))
        ys = _products(
            op,
            h,
            [torch.ones(N, 1, dtype=torch.float64), torch.ones(N, 3 * N, dtype=torch.float64)],
        )
        assert all(torch.equal(y, ys[0]) for y in ys), (N, L)


def test_the_switch_returns_the_old_mode_and_checks_its_argument():
    assert hl.is_deterministic() is False  # the default: the fastest path
    assert hl.set_deterministic(True) is False
    assert hl.is_deterministic() is True
    assert hl.set_deterministic(False) is True
    with pytest.raises(TypeError, match="mode must be True or False"):
        hl.set_deterministic(1)
    assert hl.is_deterministic() is False
