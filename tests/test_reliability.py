"""Every input gets the right answer or a clear error (issue 12): extreme magnitudes,
subnormal numbers, empty shapes, non-finite arguments, wide and rank-deficient polar.

Oracles share no code with the library: dense products of the definition
H(v) = I − 2vvᵀ/‖v‖² (``product_of_reflections``), ``scipy.linalg.polar`` and
``scipy.linalg.qr``. Scale-invariant maps are compared with their c = 1 answer; tolerances are
eps·N-scaled (orthogonal outputs have entries of order 1).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
from conftest import to_numpy
from helpers import EPS, haar_orthogonal
from hypothesis import given, settings
from hypothesis import strategies as st

import householderla as hl

#: Powers of ten from tiny to huge (1e±300 and the 1e±154 edge where squares leave the range).
SCALES = st.sampled_from([1e-300, 1e-200, 1e-160, 1e-150, 1e-5, 1e5, 1e150, 1e160, 1e200, 1e300])
TOL = 100 * EPS[np.float64]  # orthogonal results of N ≤ 6: a few eps·N per entry, with margin


def _orth(seed: int, n: int, det: int = 1) -> np.ndarray:
    return haar_orthogonal(np.random.default_rng(seed), n, det)


@settings(max_examples=20)
@given(c=SCALES, det=st.sampled_from([1, -1]))
def test_constructive_inverses_are_scale_invariant(c, det):
    """householder_vectors, tcwy_vectors, ornn_params and svd_householder_params of c·Q give
    the c = 1 matrix (they used to flip the determinant, give NaN or raise at 1e±154)."""
    Q = _orth(1, 5, det)
    np.testing.assert_allclose(hl.cwy(hl.householder_vectors(c * Q)).matrix(), Q, atol=TOL)
    X = Q[:, :3]
    np.testing.assert_allclose(hl.tcwy(hl.tcwy_vectors(c * X)).matrix(), X, atol=TOL)
    np.testing.assert_allclose(hl.ornn(*hl.ornn_params(c * Q)).matrix(), Q, atol=TOL)
    W = hl.svd_householder(*hl.svd_householder_params(c * Q)).matrix()
    np.testing.assert_allclose(W / c, Q, atol=TOL)


def test_orthogonal_q_with_tiny_entries():
    """A rotation by 1e-200 rad has entries 1e-200 next to 1: the reflector of its first
    column must not lose them (‖y‖² underflows), or the wrong orthogonal matrix comes back."""
    for theta in (1e-200, 1e-160, 1e-308):
        Q = np.eye(4)
        Q[:2, :2] = [[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]]
        np.testing.assert_allclose(hl.cwy(hl.householder_vectors(Q)).matrix(), Q, atol=TOL, rtol=0)


def _rebuild(Q):
    return hl.cwy(hl.householder_vectors(Q)).matrix()


def test_rounding_noise_below_the_diagonal_is_deflated(bk):
    """An orthogonal Q whose QR leaves rounding noise (~1e-16) below the diagonal at step 3
    (the right singular vectors JAX returned for 100·Ω with equal singular values): that noise
    is treated as zero. Its direction used to decide the reflector, and under jax.jit XLA
    evaluated it inconsistently: the rebuilt Q was off by 1.0 (found by the fuzz suite)."""
    Q = np.array(
        [
            [0.0, -0.0, 0.0, 1.0],
            [-0.33333333333333326, 0.6666666666666666, -0.6666666666666666, 0.0],
            [0.6666666666666666, 0.6666666666666667, 0.3333333333333333, 0.0],
            [0.6666666666666666, -0.3333333333333333, -0.6666666666666667, 0.0],
        ]
    )
    if not bk.eager and bk.operand_only:
        pytest.skip("dask: householder_vectors takes no Dask operand")
    out = to_numpy(bk.call(_rebuild, bk.param(Q)))
    np.testing.assert_allclose(out, Q, atol=TOL)


@settings(max_examples=15)
@given(c=SCALES)
def test_retractions_and_polar_are_scale_invariant(c):
    """polar(cX) = polar(X); qr_retraction(cX, 0) = qf(X); Cayley with (cZ, step/c) equals
    (Z, step): the map depends on step·Z only (it used to give NaN or 1e-4 at c = 1e±160)."""
    rng = np.random.default_rng(2)
    X = np.linalg.qr(rng.standard_normal((6, 3)))[0]
    G = rng.standard_normal((6, 3))
    np.testing.assert_allclose(hl.polar(c * X), scipy.linalg.polar(X)[0], atol=TOL)
    np.testing.assert_allclose(hl.qr_retraction(c * X, 0 * X), hl.qr_retraction(X, 0 * X), atol=TOL)
    Y = hl.cayley_retraction(X, c * G, 0.3 / c)
    np.testing.assert_allclose(Y, hl.cayley_retraction(X, G, 0.3), atol=TOL)


def test_subnormal_reflectors_on_every_numpy_path(monkeypatch):
    """A subnormal column is a valid reflector (H(cv) = H(v)): the Numba kernels (forward and
    backward) and the Array API path give the answer of the same column scaled to 1
    (a power-of-two rescale used to overflow to inf and give NaN)."""
    V = np.array([[5e-324, 1.0], [3e-320, 2.0], [0.0, -1.0], [1e-310, 0.5]])
    W = np.ldexp(V, np.array([1074, 0]))  # column 0 scaled exactly into the normal range
    h = np.arange(1.0, 5.0)
    ref = hl.householder_apply(W, h)
    np.testing.assert_allclose(hl.householder_apply(V, h), ref, atol=TOL)
    Vb, hb = hl.vjp.householder_apply(V, h, np.ones(4))
    Wb, wb = hl.vjp.householder_apply(W, h, np.ones(4))
    assert np.all(np.isfinite(hb)) and np.allclose(hb, wb, atol=TOL)
    assert np.isfinite(Vb[:, 1]).all() and np.allclose(Vb[:, 1], Wb[:, 1], atol=TOL)
    np.testing.assert_allclose(hl.cwy(V).matrix(), hl.cwy(W).matrix(), atol=TOL)
    monkeypatch.setenv("HL_DISABLE_NUMBA", "1")
    np.testing.assert_allclose(hl.householder_apply(V, h), ref, atol=TOL)


def test_subnormal_reflectors_on_every_eager_backend(bk_eager):
    """The same subnormal columns on every eager backend: JAX on CPU flushes subnormal numbers
    to zero in every operation, so there the columns are rescaled by powers of two before
    they reach XLA (H(cv) = H(v)); without that, cwy, tcwy, householder_apply, ornn and
    svd_householder acted as if column 0 were zero (H(0) = I, an error of order 1)."""
    bk = bk_eager
    V = np.array([[5e-324, 1.0], [3e-320, 2.0], [0.0, -1.0], [1e-310, 0.5]])
    W = np.ldexp(V, np.array([1074, 0]))  # column 0 scaled exactly into the normal range
    h = np.arange(1.0, 5.0)
    Vb, hb = bk.asarray(V), bk.asarray(h)
    np.testing.assert_allclose(to_numpy(hl.cwy(Vb) @ hb), hl.cwy(W) @ h, atol=TOL)
    np.testing.assert_allclose(to_numpy(hl.tcwy(Vb).matrix()), hl.tcwy(W).matrix(), atol=TOL)
    np.testing.assert_allclose(to_numpy(hl.householder_apply(Vb, hb)), hl.cwy(W) @ h, atol=TOL)
    U = np.tril(V[:, :1] * [[1.0], [1.0], [1.0], [0.0]])  # u_4 subnormal (rows 0–2 used)
    Uw = np.tril(W[:, :1] * [[1.0], [1.0], [1.0], [0.0]])
    np.testing.assert_allclose(
        to_numpy(hl.ornn(bk.asarray(U), -1).matrix()), hl.ornn(Uw, -1).matrix(), atol=TOL
    )
    s = hl.svd_householder(Vb, bk.asarray([2.0, 0.5]), bk.asarray(np.eye(2)))
    ref = hl.svd_householder(W, np.array([2.0, 0.5]), np.eye(2))
    np.testing.assert_allclose(to_numpy(s.matrix()), ref.matrix(), atol=4 * TOL)


@pytest.mark.parametrize("shape", [(0, 0), (3, 0), (2, 0, 0), (0, 4, 2), (0, 0, 0)])
def test_empty_shapes_give_empty_results(bk, shape):
    """N = 0, L = 0 and empty batches: results of the right (empty) shape, no BLAS message,
    no reduction error."""
    V = bk.param(np.zeros(shape))
    n = shape[-2]
    for op in (hl.cwy(V), hl.tcwy(V)):
        rows, cols = op.shape[-2:]
        assert to_numpy(op.matrix()).shape == op.shape
        assert to_numpy(op @ bk.asarray(np.ones(cols))).shape == (*shape[:-2], rows)
        assert to_numpy(op.T @ bk.asarray(np.ones(rows))).shape == (*shape[:-2], cols)
    if bk.operand_only:
        return  # householder_apply and polar take no Dask operand
    y = hl.householder_apply(V, bk.asarray(np.ones(n)))
    assert to_numpy(y).shape == (*shape[:-2], n)
    assert to_numpy(hl.polar(V)).shape == shape
    # every retraction, the Riemannian gradient and the oRNN inverse (issue 41, item 7: an
    # empty batch was a NumPy zero-size reduction error in cayley_retraction, a 0 x 0 Q an
    # IndexError in ornn_params)
    for retract in (hl.cayley_retraction, hl.qr_retraction, hl.polar_retraction):
        assert to_numpy(retract(V, V, 0.5)).shape == shape, retract.__name__
    assert to_numpy(hl.riemannian_gradient(V, V)).shape == shape
    if shape[-1] == shape[-2]:
        U, sign = hl.ornn_params(V)
        assert to_numpy(U).shape == (*shape[:-1], max(n - 1, 0))
        assert to_numpy(sign).shape == shape[:-2]
        assert to_numpy(hl.ornn(U, sign).matrix()).shape == shape


def test_orthogonal_group_of_order_zero():
    """O(0) = {the 0 x 0 matrix}: ornn_params gives no reflector and sign +1, and the map of
    that is the empty matrix again; a 1 x 1 Q = [s] gives sign s."""
    U, sign = hl.ornn_params(np.zeros((0, 0)))
    assert U.shape == (0, 0) and float(sign) == 1.0
    assert hl.ornn(U, sign).matrix().shape == (0, 0)
    for s in (1.0, -1.0):
        U, sign = hl.ornn_params(np.array([[s]]))
        assert U.shape == (1, 0) and float(sign) == s
        np.testing.assert_array_equal(hl.ornn(U, sign).matrix(), [[s]])


@pytest.mark.parametrize("h_shape", [(2, 4, 5), (2, 4)])
def test_batches_that_do_not_broadcast_are_named(h_shape):
    """householder_apply's kernels say which batch shapes do not broadcast, as cwy does
    (it was NumPy's own broadcast error)."""
    rng = np.random.default_rng(5)
    V = rng.standard_normal((3, 4, 2))
    h = rng.standard_normal(h_shape if len(h_shape) == 3 else (2, 4, 1))
    with pytest.raises(ValueError, match=r"batch shapes do not broadcast: V \(3,\), h \(2,\)"):
        hl.householder_apply(V, h)
    with pytest.raises(ValueError, match=r"batch shapes do not broadcast"):
        hl.vjp.householder_apply(V, h, h)
    with pytest.raises(ValueError, match=r"batch shapes do not broadcast"):
        hl.cwy(V) @ h


def test_empty_operand_columns(bk):
    op = hl.cwy(bk.param(np.random.default_rng(3).standard_normal((5, 2))))
    assert to_numpy(op @ bk.asarray(np.zeros((5, 0)))).shape == (5, 0)


_sgd, _adam = hl.stiefel.momentum_sgd(lr=0.1), hl.stiefel.adam(lr=0.1)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda X, G: hl.riemannian_gradient(X, G * np.nan), "G"),
        (lambda X, G: hl.cayley_retraction(X, G, float("nan")), "step"),
        (lambda X, G: hl.cayley_retraction(X, G * np.inf, 0.1), "Z"),
        (lambda X, G: hl.polar_retraction(X, G * np.nan), "Z"),
        (lambda X, G: hl.qr_retraction(X, G, float("inf")), "step"),
        (lambda X, G: hl.qr_retraction(X, G, np.array(np.nan)), "step"),
        (lambda X, G: hl.qr_retraction(X * np.nan, G), "X"),
        (lambda X, G: _sgd.update(X, G * np.nan, _sgd.init(X)), "G"),
        (lambda X, G: _adam.update(X, G * np.inf, _adam.init(X)), "G"),
    ],
)
def test_non_finite_arguments_are_named(call, name):
    """A NaN or Inf in a gradient, tangent or step raises ValueError naming that argument
    (they used to return all-NaN arrays, or blame X)."""
    rng = np.random.default_rng(4)
    X = np.linalg.qr(rng.standard_normal((5, 2)))[0]
    with pytest.raises(ValueError, match=rf"^{name} (contains NaN or Inf|must be finite)"):
        call(X, rng.standard_normal((5, 2)))


@pytest.mark.no_dask("polar takes no Dask operand")
def test_polar_wide_matches_scipy(bk):
    """polar of a wide X has orthonormal rows, as scipy.linalg.polar returns."""
    X = np.random.default_rng(5).standard_normal((3, 7))
    Q = to_numpy(bk.call(hl.polar, bk.asarray(X)))
    np.testing.assert_allclose(Q, scipy.linalg.polar(X)[0], atol=TOL)
    np.testing.assert_allclose(Q @ Q.T, np.eye(3), atol=TOL)


def test_polar_rank_deficient_option():
    """Default: ValueError (the factor is not unique). rank_deficient="svd": an orthonormal
    nearest matrix W Vᵀ, which attains ‖X − Q‖_F = ‖X − scipy's polar factor‖_F."""
    rng = np.random.default_rng(6)
    X = rng.standard_normal((6, 2)) @ rng.standard_normal((2, 4))  # rank 2, 6 × 4
    with pytest.raises(ValueError, match="rank deficient"):
        hl.polar(X)
    Q, info = hl.polar(X, rank_deficient="svd", return_info=True)
    assert info["method"] == "svd"
    np.testing.assert_allclose(Q.T @ Q, np.eye(4), atol=TOL)
    best = np.linalg.norm(X - scipy.linalg.polar(X)[0])
    assert np.linalg.norm(X - Q) <= best * (1 + 1e-12)
    with pytest.raises(ValueError, match="rank_deficient must be"):
        hl.polar(X, rank_deficient="ignore")


def _nonfinite_operand(rows: int, cols: int) -> np.ndarray:
    """A (rows, cols) operand with a NaN in column 1 and an Inf in column 3."""
    h = np.random.default_rng(11).standard_normal((rows, cols))
    h[2, 1], h[0, 3] = np.nan, np.inf
    return h


def _assert_columns_1_and_3_alone_non_finite(y, ref, what):
    assert not np.isfinite(y[:, 1]).all() and not np.isfinite(y[:, 3]).all(), what
    np.testing.assert_allclose(
        np.delete(y, [1, 3], axis=1), ref, rtol=0, atol=10 * TOL, err_msg=what
    )


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NumPy's, as A @ h
def test_non_finite_operands_propagate_column_by_column(bk):
    """The documented rule for operands (docs/guarantees.rst, issue 41 item 4): a NaN or Inf in
    column j of the right-hand side of a product makes column j of the result non-finite, as
    ``matmul`` does, and leaves every other column what it is without it, on every path an
    operator's product takes (the first product by sequential reflections, the compact WY
    factors, the dense Q and the folded W = U T after the switch), for ``.T``, T-CWY,
    SVD-Householder, LAPACK reflectors, ``householder_apply`` and Dask operands. Parameters
    (V, σ, τ, ...) are checked instead (``test_nan_and_inf_rejected_on_eager_arrays``)."""
    rng = np.random.default_rng(10)
    N, B = 8, 6
    bad = _nonfinite_operand(N, B)
    clean = np.delete(bad, [1, 3], axis=1)
    a, tau = scipy.linalg.qr(rng.standard_normal((N, 5)), mode="raw")[0]
    makers = {
        "cwy L > N/2": (hl.cwy, [rng.standard_normal((N, 6))]),
        "cwy L <= N/2": (hl.cwy, [rng.standard_normal((N, 3))]),
        "cwy.T": (lambda V: hl.cwy(V).T, [rng.standard_normal((N, 6))]),
        "tcwy.T": (lambda V: hl.tcwy(V).T, [rng.standard_normal((N, 4))]),
        "svd_householder": (
            lambda U, s: hl.svd_householder(U, s, U),
            [rng.standard_normal((N, N)), rng.standard_normal(N)],
        ),
        "from_lapack": (hl.from_lapack, [np.asfortranarray(a), tau]),
    }
    for name, (make, params) in makers.items():
        ps = [bk.param(p) for p in params]
        ref = to_numpy(make(*ps) @ bk.asarray(clean))
        if bk.jit:  # under jax.jit: one product of an operator built in the trace
            y = to_numpy(bk.call(lambda h, *p, make=make: make(*p) @ h, bk.asarray(bad), *ps))
            _assert_columns_1_and_3_alone_non_finite(y, ref, name)
            continue
        op = make(*ps)
        for call in range(4):  # the first product, the factors, then past the switch (4B > N)
            y = to_numpy(bk.call(lambda h, op=op: op @ h, bk.asarray(bad)))
            _assert_columns_1_and_3_alone_non_finite(y, ref, f"{name}, product {call}")
    if bk.operand_only:
        return
    V = bk.param(rng.standard_normal((N, 5)))
    y = to_numpy(bk.call(hl.householder_apply, V, bk.asarray(bad)))
    ref = to_numpy(hl.householder_apply(V, bk.asarray(clean)))
    _assert_columns_1_and_3_alone_non_finite(y, ref, "householder_apply")
