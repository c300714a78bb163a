"""Retractions (polar by Newton–Schulz, Cayley by SMW, QR) as property tests on every backend.

Oracles are float64 NumPy/SciPy computations from the definitions: ``scipy.linalg.polar``
(SVD), the dense Cayley transform by an N×N ``solve``, NumPy QR with a sign fix.

Tolerances. A Gram product and one or two N×M by M×M products give each result entry a
relative error of a few eps·M, so ‖QᵀQ − I‖_F ≤ 20·eps·M (``orth_tol``) is a loose bound
that still fails by orders of magnitude for a wrong iteration count (a Newton–Schulz step
short leaves ‖XᵀX − I‖² ≫ eps) or a wrong formula (O(1)). Comparisons with the SVD polar
factor scale with κ(X) = σ_max/σ_min (the polar factor's condition number is ≤ 1/σ_min);
Cayley comparisons scale with 1 + η‖G‖₂, the size of the SMW matrix K − I.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.linalg
from conftest import require, to_numpy
from helpers import EPS, orth_error
from hypothesis import given
from hypothesis import strategies as st

import householderla as hl
from householderla._agnostic import newton_schulz as NS
from householderla._agnostic import ns_bounds

pytestmark = pytest.mark.no_dask("the retractions take no Dask arrays")

INF = float("inf")


def orth_tol(dtype, M):
    return 20.0 * EPS[np.dtype(dtype).type] * max(M, 1)


def stiefel(rng, batch, N, M):
    Q, R = np.linalg.qr(rng.standard_normal(batch + (N, M)))
    return Q * np.sign(np.diagonal(R, axis1=-2, axis2=-1))[..., None, :]


def tangent(rng, X, norm2=None):
    """A tangent vector at X (XᵀZ skew), scaled to spectral norm ``norm2`` if given."""
    Z = rng.standard_normal(X.shape)
    XtZ = np.swapaxes(X, -1, -2) @ Z
    Z = Z - X @ (0.5 * (XtZ + np.swapaxes(XtZ, -1, -2)))
    if norm2 is not None:
        Z = Z * (norm2 / np.linalg.norm(Z, 2, axis=(-2, -1)))[..., None, None]
    return Z


def conditioned(rng, batch, N, M, log_kappa):
    """Random X with singular values spread over [e^{-a/2}, e^{a/2}], a = log κ."""
    U = stiefel(rng, batch, N, M)
    V = stiefel(rng, batch, M, M)
    s = np.exp(rng.uniform(-0.5, 0.5, batch + (M,)) * log_kappa)
    s[..., 0], s[..., -1] = np.exp(-0.5 * log_kappa), np.exp(0.5 * log_kappa)
    return (U * s[..., None, :]) @ np.swapaxes(V, -1, -2), float(np.exp(log_kappa))


def scipy_polar(X):
    X = np.asarray(X, dtype=np.float64)
    if X.ndim > 2:
        return np.stack([scipy_polar(x) for x in X])
    return scipy.linalg.polar(X)[0]


def dense_cayley(X, G, eta, metric):
    """(I + ηA/2)⁻¹(I − ηA/2)X with A = Â − Âᵀ formed as an N×N matrix (Likhosherstov et al.,
    AISTATS 2021, §2.2.2)."""
    if X.ndim > 2:
        return np.stack([dense_cayley(x, g, eta, metric) for x, g in zip(X, G, strict=True)])
    Ah = G @ X.T
    if metric == "euclidean":
        Ah = Ah - 0.5 * X @ X.T @ Ah
    A = Ah - Ah.T
    eye = np.eye(X.shape[0])
    return np.linalg.solve(eye + 0.5 * eta * A, (eye - 0.5 * eta * A) @ X)


# module-level wrappers: jax.jit caches compilations per function object
def _polar(X):
    return hl.polar(X)


def _polar_retraction(X, Z, t):
    return hl.polar_retraction(X, Z, t)


def _cayley_canonical(X, G, t):
    """The Cayley step of the canonical metric for the Euclidean gradient G."""
    return hl.cayley_retraction(X, -hl.riemannian_gradient(X, G), t)


def _cayley_euclidean(X, G, t):
    return hl.cayley_retraction(X, -hl.riemannian_gradient(X, G, metric="euclidean"), t)


def _cayley_canonical_raw(X, G, t):
    return hl.cayley_retraction(X, -hl.riemannian_gradient(X, G), t, drift_tol=INF)


def _cayley_euclidean_raw(X, G, t):
    Z = -hl.riemannian_gradient(X, G, metric="euclidean")
    return hl.cayley_retraction(X, Z, t, drift_tol=INF)


def _cayley_raw(X, Z, t):
    return hl.cayley_retraction(X, Z, t, drift_tol=INF)


def _qr_retraction(X, Z, t):
    return hl.qr_retraction(X, Z, t)


CAYLEY = {"canonical": _cayley_canonical, "euclidean": _cayley_euclidean}
CAYLEY_RAW = {"canonical": _cayley_canonical_raw, "euclidean": _cayley_euclidean_raw}

# few shapes: JAX compiles once per shape (and function)
shape_st = st.sampled_from([((), (5, 2)), ((2,), (6, 6)), ((2,), (8, 3))])
seed_st = st.integers(0, 2**31 - 1)


@given(shape=shape_st, seed=seed_st, log_kappa=st.sampled_from([0.0, 1.0, 3.0, 6.0]))
def test_polar_is_orthonormal_and_equals_scipy(bk, shape, seed, log_kappa):
    batch, (N, M) = shape
    X, kappa = conditioned(np.random.default_rng(seed), batch, N, M, log_kappa)
    Q = to_numpy(bk.call(_polar, bk.asarray(X)))
    assert Q.shape == X.shape and np.all(np.isfinite(Q))
    assert orth_error(Q) <= orth_tol(np.float64, M)
    err = np.max(np.abs(Q - scipy_polar(X)))
    assert err <= 20 * EPS[np.float64] * M * kappa, err


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_polar_dtype_batch_and_scipy_float32(bk, dtype):
    rng = np.random.default_rng(1)
    X, kappa = conditioned(rng, (3,), 9, 4, 2.0)
    Q = bk.call(_polar, bk.asarray(X, dtype=dtype))
    Qn = to_numpy(Q)
    assert Qn.dtype == dtype and Qn.shape == X.shape
    assert orth_error(Qn) <= orth_tol(dtype, 4)
    assert np.max(np.abs(Qn - scipy_polar(X.astype(dtype)))) <= 20 * EPS[dtype] * 4 * kappa


@given(shape=shape_st, seed=seed_st, t=st.sampled_from([1e-3, 0.3, 1.0, 3.0]))
def test_retractions_land_on_stiefel(bk, shape, seed, t):
    batch, (N, M) = shape
    rng = np.random.default_rng(seed)
    X = stiefel(rng, batch, N, M)
    Z, G = tangent(rng, X), rng.standard_normal(X.shape)
    args = [bk.asarray(a) for a in (X, Z)]
    tt = bk.asarray(t)
    outs = {
        "polar": bk.call(_polar_retraction, *args, tt),
        "qr": bk.call(_qr_retraction, *args, tt),
        "cayley-c": bk.call(_cayley_canonical, args[0], bk.asarray(G), tt),
        "cayley-e": bk.call(_cayley_euclidean, args[0], bk.asarray(G), tt),
    }
    for name, Y in outs.items():
        Y = to_numpy(Y)
        assert Y.shape == X.shape and np.all(np.isfinite(Y)), name
        assert orth_error(Y) <= orth_tol(np.float64, M), name


def dense_cayley_along(X, Z, t):
    """(I − tW/2)⁻¹(I + tW/2)X with the skew lift W = ẐXᵀ − XẐᵀ, Ẑ = (I − ½XXᵀ)Z, formed as
    an N×N matrix (the definition of ``cayley_retraction(X, Z, t)``)."""
    if X.ndim > 2:
        return np.stack([dense_cayley_along(x, z, t) for x, z in zip(X, Z, strict=True)])
    Zh = Z - 0.5 * X @ (X.T @ Z)
    W = Zh @ X.T - X @ Zh.T
    eye = np.eye(X.shape[0])
    return np.linalg.solve(eye - 0.5 * t * W, (eye + 0.5 * t * W) @ X)


@given(shape=shape_st, seed=seed_st, eta=st.sampled_from([1e-3, 0.5, 5.0]))
def test_cayley_smw_equals_dense_cayley(bk, shape, seed, eta):
    """Likhosherstov et al., AISTATS 2021, App. B Lemma 1 for the skew lift of Z; X need not be
    orthonormal for the lemma, nor Z tangent."""
    batch, (N, M) = shape
    rng = np.random.default_rng(seed)
    X = stiefel(rng, batch, N, M) + 0.1 * rng.standard_normal(batch + (N, M))
    Z = rng.standard_normal(X.shape)
    size = 1.0 + eta * np.max(np.linalg.norm(Z, 2, axis=(-2, -1))) * 2.0
    Y = to_numpy(bk.call(_cayley_raw, bk.asarray(X), bk.asarray(Z), bk.asarray(eta)))
    ref = dense_cayley_along(X, Z, eta)
    assert np.max(np.abs(Y - ref)) <= 50 * EPS[np.float64] * (N + M) * size**2


@given(shape=shape_st, seed=seed_st, eta=st.sampled_from([1e-3, 0.5, 5.0]))
def test_cayley_of_a_riemannian_gradient_is_that_metrics_step(shape, seed, eta):
    """For X on the manifold, Z = −riemannian_gradient(X, G, metric) gives exactly the Cayley
    step (I + ηA/2)⁻¹(I − ηA/2)X of that metric (the lift of AX is A itself)."""
    batch, (N, M) = shape
    rng = np.random.default_rng(seed)
    X = stiefel(rng, batch, N, M)
    G = rng.standard_normal(X.shape)
    size = 1.0 + eta * np.max(np.linalg.norm(G, 2, axis=(-2, -1))) * 2.0
    for metric, fn in CAYLEY_RAW.items():
        Y = fn(X, G, eta)
        ref = dense_cayley(X, G, eta, metric)
        assert np.max(np.abs(Y - ref)) <= 50 * EPS[np.float64] * (N + M) * size**2, metric


def test_retractions_swap_in_one_descent_loop():
    """One convention for every retraction (issue 18): R(X, Z, t) moves along Z, so the same
    descent loop with Z = −riemannian_gradient(X, G) decreases f whichever retraction runs."""
    rng = np.random.default_rng(21)
    C = rng.standard_normal((8, 8))
    C = C + C.T

    def f(Y):
        return float(np.trace(Y.T @ C @ Y))

    X0 = stiefel(rng, (), 8, 3)
    for retract in (hl.polar_retraction, hl.qr_retraction, hl.cayley_retraction):
        X = X0
        for _ in range(20):
            Z = -hl.riemannian_gradient(X, 2 * C @ X, metric="euclidean")
            Y = retract(X, Z, 0.05)
            assert f(Y) < f(X), retract.__name__
            X = Y


def test_paper_euclidean_factors_equal_rank_2m_form():
    """The paper's N×3M factors B, C (App. B, case 2) and our N×2M ones give the same A."""
    rng = np.random.default_rng(2)
    X, G, eta = stiefel(rng, (), 7, 3), rng.standard_normal((7, 3)), 0.7
    E = G.T @ X - X.T @ G
    B = eta * np.concatenate([G, X, 0.5 * X @ E], axis=1)
    C = np.concatenate([X, -G, X], axis=1)
    Gt = G - 0.5 * X @ (X.T @ G)
    A2 = eta * (Gt @ X.T - X @ Gt.T)
    Ah = G @ X.T - 0.5 * X @ X.T @ G @ X.T
    np.testing.assert_allclose(B @ C.T, A2, atol=1e-14)
    np.testing.assert_allclose(A2, eta * (Ah - Ah.T), atol=1e-14)


@pytest.mark.parametrize("name", ["polar", "qr", "cayley-c", "cayley-e"])
def test_first_order_agreement(bk, name):
    """R(X, tξ) = X + tξ + O(t²): halving t divides the error by ≈ 4. For Cayley, ξ is
    −riemannian_gradient(X, G) (the curve's velocity)."""
    rng = np.random.default_rng(3)
    X = stiefel(rng, (2,), 7, 3)
    if name.startswith("cayley"):
        G = rng.standard_normal(X.shape)
        metric = "canonical" if name == "cayley-c" else "euclidean"
        xi = -to_numpy(hl.riemannian_gradient(X, G, metric=metric))
        fn, D = CAYLEY[metric], G
    else:
        xi = tangent(rng, X)
        fn, D = (_polar_retraction if name == "polar" else _qr_retraction), xi
    errs = []
    for t in (0.02, 0.01, 0.005):
        Y = to_numpy(bk.call(fn, bk.asarray(X), bk.asarray(D), bk.asarray(t)))
        errs.append(np.linalg.norm(Y - X - t * xi))
    for a, b in itertools.pairwise(errs):
        assert 3.6 <= a / b <= 4.4, errs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_zero_gradient_or_step_gives_x_back_exactly(bk, dtype):
    rng = np.random.default_rng(4)
    X = bk.asarray(stiefel(rng, (2,), 6, 3), dtype=dtype)
    G = bk.asarray(rng.standard_normal((2, 6, 3)), dtype=dtype)
    for fn in CAYLEY.values():
        for g, t in ((bk.asarray(np.zeros((2, 6, 3)), dtype=dtype), 0.5), (G, 0.0)):
            Y = bk.call(fn, X, g, bk.asarray(t, dtype=dtype))
            np.testing.assert_array_equal(to_numpy(Y), to_numpy(X))


def test_cayley_decreases_f_and_velocity_is_the_direction():
    rng = np.random.default_rng(5)
    X = stiefel(rng, (), 10, 3)
    C = rng.standard_normal((10, 10))
    C = C + C.T

    def f(Y):
        return np.trace(Y.T @ C @ Y)

    G = 2 * C @ X
    for metric in ("canonical", "euclidean"):
        Z = -hl.riemannian_gradient(X, G, metric=metric)
        for eta in (1e-3, 1e-2):
            assert f(hl.cayley_retraction(X, Z, eta)) < f(X)
        h = 1e-6
        vel = (hl.cayley_retraction(X, Z, h) - hl.cayley_retraction(X, Z, -h)) / (2 * h)
        np.testing.assert_allclose(vel, Z, atol=1e-8)


@pytest.mark.parametrize("metric", ["canonical", "euclidean"])
def test_riemannian_gradient_definition(bk, metric):
    """⟨grad f, ξ⟩_metric = ⟨G, ξ⟩ for every tangent ξ, and grad f is tangent."""
    rng = np.random.default_rng(6)
    X = stiefel(rng, (2,), 7, 3)
    G = rng.standard_normal(X.shape)
    rg = to_numpy(hl.riemannian_gradient(bk.asarray(X), bk.asarray(G), metric=metric))
    Xt = np.swapaxes(X, -1, -2)
    S = Xt @ rg
    np.testing.assert_allclose(S, -np.swapaxes(S, -1, -2), atol=1e-13)
    ref = G - X @ (np.swapaxes(G, -1, -2) @ X) if metric == "canonical" else None
    if ref is None:
        XtG = Xt @ G
        ref = G - X @ (0.5 * (XtG + np.swapaxes(XtG, -1, -2)))
    np.testing.assert_allclose(rg, ref, atol=1e-13)
    for _ in range(3):
        xi = tangent(rng, X)
        w = rg if metric == "euclidean" else rg - 0.5 * X @ (Xt @ rg)
        np.testing.assert_allclose(np.sum(w * xi), np.sum(G * xi), rtol=1e-12)


# -- Newton–Schulz iteration counts and accuracy ----------------------------------------------


def _residual_count(lo, hi, c, tol):
    """The rule on spec ⊂ [lo, hi] scaled by 1/c: 0 if already within tol, else one step to
    max(φ(1 − lo/c), φ(1 − hi/c)) and steps of r ↦ ¾r² + ¼r³ until ≤ tol."""
    p, q = 1 - lo / c, 1 - hi / c
    if max(abs(p), abs(q)) <= tol:
        return 0
    if not (lo > 0 and q > -2):
        return None
    k, r = 1, max(NS.phi(p), NS.phi(q))
    while r > tol:
        r, k = NS.phi(r), k + 1
    return k


@pytest.mark.parametrize(
    ("shape", "norm2", "most"),
    [
        (shape, norm2, most)
        if shape != (4096, 256) or norm2 == 1.5
        # the large shape at the largest step in `make test` (the same code; ~5 s a case)
        else pytest.param(shape, norm2, most, marks=pytest.mark.long)
        for shape in ((1000, 10), (200, 64), (4096, 256))
        for norm2, most in ((0.01, 2), (0.3, 4), (1.5, 9))
    ],
)
def test_iteration_counts_from_a_tangent_step(shape, norm2, most):
    """ANCHORS targets: ≤ 2 / 4 / 9 iterations for ‖ξ‖₂ = 0.01 / 0.3 / 1.5, at the float64
    floor (≤ 1.5× Householder QR's ‖QᵀQ − I‖_F on the same matrix)."""
    rng = np.random.default_rng(7)
    X = stiefel(rng, (), *shape)
    xi = tangent(rng, X, norm2)
    Q, info = hl.polar(X + xi, return_info=True)
    assert info["method"] == "newton-schulz" and info["certified"]
    assert info["iterations"] <= most, info
    floor = orth_error(np.linalg.qr(X + xi)[0])
    assert orth_error(Q) <= 1.5 * floor
    np.testing.assert_allclose(Q, scipy_polar(X + xi), atol=1e-14)
    # the residual recursion on the exact spectrum, unscaled or centred (+1: cheap bounds)
    lam = np.linalg.eigvalsh((X + xi).T @ (X + xi))
    ks = [_residual_count(lam[0], lam[-1], c, EPS[np.float64]) for c in (1, lam.mean())]
    assert info["iterations"] <= min(k for k in ks if k is not None) + 1


@pytest.mark.parametrize(
    ("N", "M", "target"),
    [
        (1000, 10, 6e-7),
        pytest.param(4096, 256, 3e-6, marks=pytest.mark.slow),
        # M = 1024: ~15 s of SVDs and QRs, in `make test-long`
        pytest.param(2048, 1024, 1.1e-5, marks=pytest.mark.long),
    ],
)
def test_one_shot_polar_vs_householder_qr_floor(N, M, target):
    """ANCHORS: one-shot polar within 1.5× the Householder-QR floor of the same shape and
    dtype. The float32 floor is LAPACK sgeqrf/sorgqr (scipy; numpy.linalg.qr computes in
    float64); float32 input is computed in float64 and rounded once, so it lands far below."""
    X = np.random.default_rng(16).standard_normal((N, M))
    for dtype, qr in ((np.float32, scipy.linalg.qr), (np.float64, np.linalg.qr)):
        Xd = X.astype(dtype)
        floor = orth_error(qr(Xd, mode="economic" if qr is scipy.linalg.qr else "reduced")[0])
        Q = hl.polar(Xd)
        assert Q.dtype == dtype
        assert orth_error(Q) <= 1.5 * floor, (dtype, orth_error(Q), floor)
        if dtype == np.float32:
            assert orth_error(Q) <= target


def test_count_rule_is_the_residual_recursion():
    """``counts`` equals the scalar recursion on the bounds, including the first-step
    asymmetry (negative residuals shrink faster: φ(−r) < φ(r))."""
    xp = hl.retractions.aac.array_namespace(np.empty(0))
    for lo, hi in [(0.99, 1.0), (1.0, 1.01), (1.0, 1.09), (0.5, 1.5), (1.0, 3.25)]:
        got = float(NS.counts(np.asarray(lo), np.asarray(hi), np.asarray(1.0), 1e-16, xp))
        want = _residual_count(lo, hi, 1.0, 1e-16)
        assert got == (NS.MAX_ITERS + 1 if want is None else min(want, NS.MAX_ITERS + 1))


def _unscaled_ns(A, iters=30):
    """The printed Algorithm 3 (Y₀ = A, Z₀ = I, no scaling), a fixed number of steps."""
    eye = np.eye(A.shape[-1])
    Yk, Zk = A, eye
    with np.errstate(all="ignore"):
        for _ in range(iters):
            T = 0.5 * (3 * eye - Zk @ Yk)
            Yk, Zk = Yk @ T, T @ Zk
    return Zk


@pytest.mark.parametrize("norm2", [1.5, 2.5])
def test_paper_algorithm_fails_where_we_converge(norm2):
    """Unscaled NS (Kong, Wang & Tao, ICLR 2023, Algorithm 3) leaves the region λ(XᵀX) ∈ (0, 3): at
    ‖ξ‖₂ = 1.5 (λ_max = 3.25) it converges to another square root (z → −λ^{-1/2} on that
    eigenvector: orthonormal, not the polar factor); at 2.5 (λ_max = 7.25) it diverges. Ours scales,
    certifies the count and converges to the polar factor."""
    rng = np.random.default_rng(8)
    X = stiefel(rng, (), 40, 4)
    Y = X + tangent(rng, X, norm2)
    Zk = _unscaled_ns(Y.T @ Y)
    ref = scipy_polar(Y)
    assert not np.all(np.isfinite(Zk)) or np.max(np.abs(Y @ Zk - ref)) > 0.1
    Q, info = hl.polar(Y, return_info=True)
    assert info["method"] == "newton-schulz" and info["iterations"] <= 9
    assert orth_error(Q) <= orth_tol(np.float64, 4)
    np.testing.assert_allclose(Q, ref, atol=1e-14)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_restart_and_num_iters(dtype):
    rng = np.random.default_rng(9)
    X, kappa = conditioned(rng, (2,), 30, 5, 1.0)
    X = X.astype(dtype)
    Q, info = hl.polar(X, restart=True, return_info=True)
    assert info["restart_iterations"] >= 1
    assert orth_error(Q) <= orth_tol(dtype, 5)
    np.testing.assert_allclose(Q, scipy_polar(X), atol=20 * EPS[dtype] * 5 * kappa)
    # too few iterations are not certified: the result comes from QR + SVD, never garbage
    Q1, info1 = hl.polar(X, num_iters=1, return_info=True)
    assert info1["method"] == "qr-svd"
    np.testing.assert_allclose(Q1, scipy_polar(X), atol=20 * EPS[dtype] * 5 * kappa)


def test_ill_conditioned_falls_back_and_rank_deficient_raises(bk):
    rng = np.random.default_rng(10)
    X, kappa = conditioned(rng, (), 8, 3, np.log(1e6))
    Q = to_numpy(bk.call(_polar, bk.asarray(X)))
    assert orth_error(Q) <= orth_tol(np.float64, 3)
    np.testing.assert_allclose(Q, scipy_polar(X), atol=50 * EPS[np.float64] * kappa)
    Xd = X.copy()
    Xd[:, 2] = Xd[:, 0] + Xd[:, 1]  # rank 2
    for bad in (Xd, np.zeros((8, 3))):
        if bk.eager:
            with pytest.raises(ValueError, match="rank deficient"):
                hl.polar(bk.asarray(bad))
        else:  # under jit: the QR + SVD fallback, orthonormal and finite, never NaN
            Q = to_numpy(bk.call(_polar, bk.asarray(bad)))
            assert np.all(np.isfinite(Q)) and orth_error(Q) <= orth_tol(np.float64, 3)
    Qr = to_numpy(bk.call(_qr_retraction, bk.asarray(Xd), bk.asarray(0 * Xd), bk.asarray(1.0)))
    assert np.all(np.isfinite(Qr)) and orth_error(Qr) <= orth_tol(np.float64, 3)


def test_polar_scale_invariance_no_overflow():
    rng = np.random.default_rng(11)
    X, _ = conditioned(rng, (), 9, 3, 1.0)
    for scale in (1e-150, 1e-8, 1e8, 1e150):
        np.testing.assert_allclose(hl.polar(scale * X), scipy_polar(X), atol=1e-13)


def test_cayley_drift_guard(bk):
    rng = np.random.default_rng(12)
    X = stiefel(rng, (), 9, 3)
    X = X + 1e-7 * rng.standard_normal(X.shape)  # drifted off the manifold
    G = rng.standard_normal(X.shape)
    args = (bk.asarray(X), bk.asarray(G), bk.asarray(0.2))
    assert orth_error(to_numpy(bk.call(_cayley_canonical, *args))) <= orth_tol(np.float64, 3)
    raw = to_numpy(bk.call(_cayley_canonical_raw, *args))
    assert orth_error(raw) == pytest.approx(orth_error(X), rel=1e-3)  # Cayley keeps XᵀX


def test_batched_step(bk):
    rng = np.random.default_rng(13)
    X = stiefel(rng, (3,), 6, 2)
    G = rng.standard_normal(X.shape)
    t = np.array([0.1, 0.5, 2.0])
    Y = to_numpy(bk.call(_cayley_euclidean, bk.asarray(X), bk.asarray(G), bk.asarray(t)))
    for i in range(3):
        np.testing.assert_allclose(Y[i], dense_cayley(X[i], G[i], t[i], "euclidean"), atol=1e-13)
    Yp = to_numpy(bk.call(_polar_retraction, bk.asarray(X), bk.asarray(G), bk.asarray(t)))
    np.testing.assert_allclose(Yp, scipy_polar(X + t[:, None, None] * G), atol=1e-13)


def test_qr_retraction_positive_diagonal_and_matches_numpy(bk):
    rng = np.random.default_rng(14)
    X = stiefel(rng, (2,), 7, 3)
    Z = rng.standard_normal(X.shape)
    Q = to_numpy(bk.call(_qr_retraction, bk.asarray(X), bk.asarray(Z), bk.asarray(0.7)))
    R = np.swapaxes(Q, -1, -2) @ (X + 0.7 * Z)
    assert np.all(np.diagonal(R, axis1=-2, axis2=-1) > 0)
    np.testing.assert_allclose(np.tril(R, -1), 0, atol=1e-13)
    np.testing.assert_allclose(Q @ R, X + 0.7 * Z, atol=1e-13)


def test_dtypes_follow_x_and_step_does_not_promote():
    X = stiefel(np.random.default_rng(15), (), 5, 2).astype(np.float32)
    for Y in (
        hl.polar_retraction(X, X, np.float64(0.1)),
        hl.cayley_retraction(X, X, np.asarray(0.1)),
        hl.qr_retraction(X, X, 0.1),
        hl.riemannian_gradient(X, X),
    ):
        assert Y.dtype == np.float32
    assert hl.polar(X.astype(np.float64)).dtype == np.float64


# -- bad input ---------------------------------------------------------------------------------


def test_bad_shapes_and_names():
    X, G = np.eye(5, 2), np.ones((5, 2))
    with pytest.raises(ValueError, match=r"X must have shape \(\.\.\., N, M\); got shape \(5,\)"):
        hl.polar(np.ones(5))  # (a wide X is accepted: tests/test_reliability.py)
    for fn in (hl.polar_retraction, hl.qr_retraction):
        with pytest.raises(ValueError, match="Z must have the shape of X"):
            fn(X, np.ones((5, 3)), 0.1)
        with pytest.raises(ValueError, match="X must have shape"):
            fn(np.ones((2, 5)), np.ones((2, 5)), 0.1)
    with pytest.raises(ValueError, match="Z must have the shape of X"):
        hl.cayley_retraction(X, np.ones((4, 2)), 0.1)
    with pytest.raises(ValueError, match="G must have the shape of X"):
        hl.riemannian_gradient(X, np.ones((5, 1)))
    with pytest.raises(ValueError, match="metric must be 'canonical' or 'euclidean'"):
        hl.riemannian_gradient(X, G, metric="canonicl")
    with pytest.raises(TypeError, match="metric"):  # a direction has no metric: see the docs
        hl.cayley_retraction(X, G, 0.1, metric="canonical")
    with pytest.raises(ValueError, match=r"step must be a scalar or broadcast"):
        hl.cayley_retraction(np.stack([X, X]), np.stack([G, G]), np.ones(3))
    with pytest.raises(TypeError, match="step must be a real number"):
        hl.qr_retraction(X, G, True)
    with pytest.raises(ValueError, match="num_iters must be a non-negative integer"):
        hl.polar(X, num_iters=-1)
    # complex X is accepted (tests/test_complex_retractions.py); a step is a real number
    with pytest.raises(TypeError, match="step has complex dtype"):
        hl.polar_retraction(X, G, np.asarray(0.1 + 0j))


def test_nan_and_mixed_namespaces():
    X = np.eye(5, 2)
    X[3, 1] = np.nan
    with pytest.raises(ValueError, match=r"X contains NaN or Inf \(in column\(s\) \[1\]\)"):
        hl.polar(X)
    with pytest.raises(ValueError, match="NaN or Inf"):
        hl.qr_retraction(np.eye(5, 2), X, 0.1)
    torch = require("torch")
    with pytest.raises(TypeError, match="different array libraries"):
        hl.cayley_retraction(np.eye(5, 2), torch.ones(5, 2), 0.1)
    with pytest.raises(TypeError, match=r"step is a torch\.Tensor"):
        hl.polar_retraction(np.eye(5, 2), np.ones((5, 2)), torch.tensor(0.1))


def test_empty_and_float32_extremes():
    assert hl.polar(np.ones((4, 0))).shape == (4, 0)
    assert hl.cayley_retraction(np.ones((4, 0)), np.ones((4, 0)), 0.1).shape == (4, 0)
    X, _ = conditioned(np.random.default_rng(17), (), 9, 3, 1.0)
    for scale in (1e-30, 1e30):
        Q = hl.polar((scale * X).astype(np.float32))
        assert np.all(np.isfinite(Q)) and orth_error(Q) <= orth_tol(np.float32, 3)


def test_a_posteriori_check_catches_a_wrong_count(monkeypatch):
    """Safety net: if the a priori count were wrong (simulated: every count claims one
    iteration), the residual check of (I + D)A(I + D) rejects the result and QR + SVD runs.
    Both plans are patched: arrays (batches) and Python floats (one eager NumPy matrix)."""
    X, kappa = conditioned(np.random.default_rng(18), (), 12, 4, 2.0)
    monkeypatch.setattr(ns_bounds, "counts", lambda lo, *args: np.ones_like(lo))
    monkeypatch.setattr(ns_bounds, "count_float", lambda *args: 1.0)
    Q, info = hl.polar(X, return_info=True)
    assert info["method"] == "qr-svd" and not info["certified"]
    np.testing.assert_allclose(Q, scipy_polar(X), atol=20 * EPS[np.float64] * 4 * kappa)
