"""Complex Stiefel matrices: polar (Newton–Schulz with Hermitian products), the polar, Cayley and
QR retractions, Riemannian gradients, and their VJPs (docs/theory/complex.rst, "Retractions and
gradients").

Oracles: ``scipy.linalg.polar`` (the unitary factor), ``scipy.stats.unitary_group``, dense
Cayley transforms and NumPy's QR. Cotangent conventions as in tests/test_vjp.py:
``hl.vjp`` and torch take ḡ = ∂L/∂Re + i ∂L/∂Im, JAX its conjugate.

Tolerances. Orthonormality: ‖QᴴQ − I‖_F ≤ 20·M·eps of the result's dtype: complex128 results
carry the Newton–Schulz residual check (≤ 2√M·eps + 16·M·eps, ``newton_schulz.polar_impl``)
plus the rounding of the last N × M product (~√M·eps per column pair); complex64 is computed in
complex128 and rounded once, which adds ≤ eps/2 per entry, ~√M·eps to the Frobenius norm.
Agreement with SciPy: ‖ΔQ‖ ≲ κ(X)·eps (the polar factor's condition number is at most
2/(σ_min + σ_max)·… ≤ κ), bounded by 100·κ·eps with κ from the SVD.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from conftest import require, to_numpy
from helpers import (
    EPS,
    assert_jax_grad_matches_real_and_imaginary_differences,
    examples,
    few_shapes,
    jax_once_each,
    orth_error,
    stable_seed,
)
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import unitary_group

import householderla as hl

pytestmark = pytest.mark.no_dask(
    "the complex retractions take no Dask arrays (Dask's TSQR is real)"
)

C64, C128 = np.complex64, np.complex128


def crandn(rng, *shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


def haar_stiefel(rng, N, M, batch=()):
    """First M columns of Haar unitary matrices (scipy.stats.unitary_group)."""
    n = int(np.prod(batch)) if batch else 1
    U = np.stack([unitary_group.rvs(N, random_state=rng)[:, :M] for _ in range(n)])
    return U.reshape(*batch, N, M)


def tangent(rng, X):
    """A random tangent vector at X: Z = X Ω + (I − XXᴴ)K with Ω skew-Hermitian, so
    XᴴZ + ZᴴX = 0."""
    M = X.shape[-1]
    A = crandn(rng, *X.shape[:-2], M, M)
    Om = A - np.conj(np.swapaxes(A, -1, -2))
    K = crandn(rng, *X.shape)
    K = K - X @ (np.conj(np.swapaxes(X, -1, -2)) @ K)
    return X @ Om + K


def herm_t(A):
    return np.conj(np.swapaxes(A, -1, -2))


def kappa(X):
    s = np.linalg.svd(np.asarray(X, dtype=C128), compute_uv=False)
    return float(np.max(s[..., 0] / s[..., -1]))


# -- polar ---------------------------------------------------------------------------------


POLAR_SHAPES = [(7, 3), (2, 6, 4), (5, 5), (3, 8)]


@pytest.mark.parametrize(
    ("shape", "dtype"),
    # JAX: each shape once, complex128 and complex64 alternating
    jax_once_each(
        POLAR_SHAPES, [C128, C64], [f"shape{i}" for i in range(4)], ["complex128", "complex64"]
    ),
)
def test_polar_is_unitary_and_matches_scipy(bk, dtype, shape):
    rng = np.random.default_rng(stable_seed("polar", shape))
    X = crandn(rng, *shape)
    Q = to_numpy(bk.call(hl.polar, bk.asarray(X, dtype)))
    assert Q.dtype == dtype and Q.shape == X.shape
    eps, M = EPS[dtype], min(shape[-2:])
    Qt = Q if shape[-2] >= shape[-1] else herm_t(Q)  # wide X: orthonormal rows
    assert orth_error(Qt) <= 20 * M * eps
    Xs = X.reshape(-1, *shape[-2:]).astype(dtype).astype(C128)
    ref = np.stack([scipy.linalg.polar(x)[0] for x in Xs]).reshape(shape)
    assert np.max(np.abs(Q - ref)) <= 100 * kappa(Xs) * eps
    assert np.max(np.abs(Q.imag)) > 0.1  # a complex result, not a real one


@given(
    shape=st.tuples(st.sampled_from([(), (2,)]), st.integers(1, 8), st.integers(1, 8)),
    seed=st.integers(0, 2**31 - 1),
)
@examples(10)
def test_polar_decomposition_theorem(bk, shape, seed):
    """For every full-rank complex X (tall or wide): Q = polar(X) has orthonormal columns (rows),
    and P = QᴴX is Hermitian positive definite (X = QP is the polar decomposition: that
    characterises Q). Gaussian X has full rank with probability 1; the tolerances scale with
    κ(X) (P's Hermitian part is exact only up to κ·eps)."""
    batch, N, M = few_shapes(bk, shape, [((), 6, 3), ((2,), 4, 4), ((), 3, 5)], seed)
    rng = np.random.default_rng(seed)
    X = crandn(rng, *batch, N, M)
    Q = to_numpy(bk.call(hl.polar, bk.asarray(X, C128)))
    Xt, Qt = (X, Q) if N >= M else (herm_t(X), herm_t(Q))
    k, m = kappa(X), min(N, M)
    assert orth_error(Qt) <= 20 * m * EPS[C128]
    P = herm_t(Qt) @ Xt
    scale = np.linalg.norm(X)
    assert np.max(np.abs(P - herm_t(P))) <= 100 * k * m * EPS[C128] * scale
    assert np.all(np.linalg.eigvalsh(0.5 * (P + herm_t(P))) > 0)


def test_polar_of_a_unitary_or_stiefel_matrix_is_itself(bk):
    rng = np.random.default_rng(5)
    for N, M in [(5, 5), (8, 3)]:
        U = haar_stiefel(rng, N, M)
        Q = to_numpy(bk.call(hl.polar, bk.asarray(U, C128)))
        assert np.max(np.abs(Q - U)) <= 20 * M * EPS[C128]


def test_polar_real_input_unchanged(bk):
    """Real X keeps its real path and dtype; it agrees with the polar factor of X as a complex
    matrix (whose imaginary part is then zero to rounding)."""
    rng = np.random.default_rng(6)
    X = rng.standard_normal((7, 3))
    Q = to_numpy(bk.call(hl.polar, bk.asarray(X)))
    assert Q.dtype == np.float64
    Qc = to_numpy(bk.call(hl.polar, bk.asarray(X, C128)))
    assert np.max(np.abs(Qc - Q)) <= 100 * kappa(X) * EPS[C128]


SCHEDULES = ["certified", "polar_express", "muon", "newton_schulz"]


@pytest.mark.parametrize(
    ("schedule", "dtype"),
    # JAX: each schedule once, complex128 and complex64 alternating
    jax_once_each(SCHEDULES, [C128, C64], SCHEDULES, ["complex128", "complex64"]),
)
def test_polar_fixed_step_modes(bk, schedule, dtype):
    """The schedules act on singular values, which are real for complex X too (A = XXᴴ): every
    output singular value from σ ≥ min_sv·‖X‖_F lies in the certified interval (with the
    rounding of complex64 on top: 30·√M·eps), and the singular vectors are X's."""
    rng = np.random.default_rng(stable_seed("fixed", schedule))
    X = crandn(rng, 9, 4)
    Q, info = hl.polar(X.astype(dtype), schedule=schedule, return_info=True)
    Qb = to_numpy(bk.call(lambda x: hl.polar(x, schedule=schedule), bk.asarray(X, dtype)))
    assert Qb.dtype == dtype
    np.testing.assert_allclose(Qb, Q, atol=30 * np.sqrt(4) * EPS[dtype])
    s = np.linalg.svd(Qb.astype(C128), compute_uv=False)
    lo, hi = info["interval"]
    slack = 30 * np.sqrt(4) * EPS[dtype]
    assert np.all(s >= lo - slack) and np.all(s <= hi + slack), (s, lo, hi)
    # same right singular vectors as X: Q = W f(Σ) Vᴴ, so XᴴQ is Hermitian positive definite
    P = herm_t(X.astype(C128)) @ Qb.astype(C128)
    assert np.max(np.abs(P - herm_t(P))) <= 100 * slack * np.linalg.norm(X)
    assert np.min(np.linalg.eigvalsh(0.5 * (P + herm_t(P)))) > 0


@pytest.mark.no_dask("eager options")
def test_polar_options(bk_eager):
    """num_iters, restart, return_info and rank_deficient with complex X."""
    bk = bk_eager
    rng = np.random.default_rng(7)
    X = crandn(rng, 8, 3)
    ref = scipy.linalg.polar(X)[0]
    for kw in ({"num_iters": 9}, {"restart": True}, {"restart": False}):
        Q, info = hl.polar(bk.asarray(X, C128), return_info=True, **kw)
        assert info["method"] == "newton-schulz" and info["certified"]
        np.testing.assert_allclose(to_numpy(Q), ref, atol=1e-13)
    # too few iterations: not certified, falls back to QR + SVD (still the polar factor)
    Q, info = hl.polar(bk.asarray(X, C128), num_iters=1, return_info=True)
    assert info["method"] == "qr-svd"
    np.testing.assert_allclose(to_numpy(Q), ref, atol=1e-13)
    # rank-deficient complex X: ValueError, or the SVD answer on request
    Xd = X.copy()
    Xd[:, 2] = (1 + 2j) * Xd[:, 0]
    with pytest.raises(ValueError, match="rank deficient"):
        hl.polar(bk.asarray(Xd, C128))
    Qd = to_numpy(hl.polar(bk.asarray(Xd, C128), rank_deficient="svd"))
    assert orth_error(Qd) <= 1e-13
    # an ill-conditioned X (κ = 1e4) needs the restart logic or the fallback: still exact
    W, _ = np.linalg.qr(crandn(rng, 8, 3))
    Xi = W @ np.diag([1.0, 1e-2, 1e-4]) @ unitary_group.rvs(3, random_state=rng)
    Qi = to_numpy(hl.polar(bk.asarray(Xi, C128)))
    np.testing.assert_allclose(Qi, scipy.linalg.polar(Xi)[0], atol=1e4 * 100 * EPS[C128])


def test_polar_retraction_first_order_and_unitary(bk):
    """R(X, tZ) = X + tZ + O(t²) for tangent Z: the error ratio between t and t/10 is ~100
    (slope 2 on a log scale, measured between 1.8 and 2.2), and R is on the manifold."""
    rng = np.random.default_rng(8)
    X = haar_stiefel(rng, 7, 3, (2,))
    Z = tangent(rng, X)
    errs = []
    for t in (1e-2, 1e-3):
        Y = to_numpy(
            bk.call(
                lambda x, z, t=t: hl.polar_retraction(x, z, t),
                *(bk.asarray(a, C128) for a in (X, Z)),
            )
        )
        assert Y.dtype == C128 and orth_error(Y) <= 20 * 3 * EPS[C128]
        errs.append(np.max(np.abs(Y - X - t * Z)))
    slope = np.log10(errs[0] / errs[1])
    assert 1.8 <= slope <= 2.2, errs


def test_polar_retraction_dtypes():
    rng = np.random.default_rng(9)
    X = haar_stiefel(rng, 6, 2)
    Z = tangent(rng, X)
    assert hl.polar_retraction(X.astype(C64), Z.astype(C64), 0.1).dtype == C64
    # real X, complex Z: the common complex dtype
    Y = hl.polar_retraction(np.eye(6, 2), Z, 0.1)
    assert Y.dtype == C128 and orth_error(Y) <= 1e-14
    with pytest.raises(TypeError, match="step has complex dtype"):
        hl.polar_retraction(X, Z, np.asarray(0.1 + 0.1j))


def test_dask_complex_is_refused_naming_the_argument():
    da = require("dask.array")
    X = da.from_array(crandn(np.random.default_rng(0), 8, 2), chunks=(4, 2))
    with pytest.raises(TypeError, match="X has dtype complex128"):
        hl.polar(X)
    with pytest.raises(TypeError, match="X has dtype complex128"):
        hl.qr_retraction(X, X, 0.1)


# -- Riemannian gradients --------------------------------------------------------------------


def _inner(A, B):
    """⟨A, B⟩ = Re tr(AᴴB) per matrix."""
    return np.sum(np.real(np.conj(A) * B), axis=(-2, -1))


@pytest.mark.parametrize("metric", ["canonical", "euclidean"])
def test_riemannian_gradient_is_tangent_and_represents_the_gradient(bk, metric):
    """ξ = riemannian_gradient(X, G) is tangent (XᴴΞ + ΞᴴX = 0), has the closed form
    G − XGᴴX (canonical) or G − X·herm(XᴴG) (Euclidean), and represents ⟨G, ·⟩ in its metric:
    g(ξ, η) = ⟨G, η⟩ for tangent η, with g_c(ξ, η) = ⟨ξ, (I − ½XXᴴ)η⟩ and g_e = ⟨·, ·⟩.
    All to 50·eps·‖G‖ (a few N × M × M products in complex128)."""
    rng = np.random.default_rng(stable_seed("rgrad", metric))
    X = haar_stiefel(rng, 7, 3, (2,))
    G = crandn(rng, 2, 7, 3)
    xi = to_numpy(
        bk.call(
            lambda x, g: hl.riemannian_gradient(x, g, metric=metric),
            bk.asarray(X, C128),
            bk.asarray(G, C128),
        )
    )
    assert xi.dtype == C128
    t = 50 * EPS[C128] * np.linalg.norm(G)
    S = herm_t(X) @ xi
    assert np.max(np.abs(S + herm_t(S))) <= t
    XhG = herm_t(X) @ G
    ref = G - X @ herm_t(G) @ X if metric == "canonical" else G - X @ (0.5 * (XhG + herm_t(XhG)))
    assert np.max(np.abs(xi - ref)) <= t
    eta = tangent(rng, X)
    lhs = (
        _inner(xi, eta - 0.5 * X @ (herm_t(X) @ eta)) if metric == "canonical" else _inner(xi, eta)
    )
    np.testing.assert_allclose(lhs, _inner(G, eta), atol=t * np.linalg.norm(eta))
    assert np.max(np.abs(xi.imag)) > 0.1


def test_riemannian_gradient_dtypes():
    rng = np.random.default_rng(13)
    X, G = haar_stiefel(rng, 6, 2), crandn(rng, 6, 2)
    assert hl.riemannian_gradient(X.astype(C64), G.astype(C64)).dtype == C64
    assert hl.riemannian_gradient(np.eye(6, 2), G).dtype == C128  # real X, complex G
    assert hl.riemannian_gradient(np.eye(6, 2), G.real).dtype == np.float64


# -- Cayley and QR retractions ----------------------------------------------------------------


def dense_cayley(X, A, t):
    """(I + tA/2)⁻¹(I − tA/2)X, dense."""
    eye = np.eye(X.shape[-2])
    return np.linalg.solve(eye + 0.5 * t * A, (eye - 0.5 * t * A) @ X)


@pytest.mark.parametrize("metric", ["canonical", "euclidean"])
def test_cayley_smw_equals_dense_cayley_and_is_unitary(bk, metric):
    """Z = −riemannian_gradient(X, G, metric) gives the Cayley step of that metric, with the
    skew-Hermitian A = G̃Xᴴ − XG̃ᴴ (G̃ = G, or G − ½X XᴴG): SMW equals the dense N × N Cayley
    transform to 100·eps·‖tA‖, and YᴴY = I to 20·M·eps (the map is unitary)."""
    rng = np.random.default_rng(stable_seed("cayley", metric))
    X = haar_stiefel(rng, 8, 3, (2,))
    G = crandn(rng, 2, 8, 3)
    Z = -hl.riemannian_gradient(X, G, metric=metric)
    Gt = G if metric == "canonical" else G - 0.5 * X @ (herm_t(X) @ G)
    A = Gt @ herm_t(X) - X @ herm_t(Gt)
    assert np.max(np.abs(A + herm_t(A))) <= 1e-14 * np.linalg.norm(A)  # skew-Hermitian
    t = 0.4
    Y = to_numpy(
        bk.call(
            lambda x, z: hl.cayley_retraction(x, z, t), bk.asarray(X, C128), bk.asarray(Z, C128)
        )
    )
    assert Y.dtype == C128
    ref = dense_cayley(X, A, t)
    assert np.max(np.abs(Y - ref)) <= 100 * EPS[C128] * max(1.0, t * np.linalg.norm(A))
    assert orth_error(Y) <= 20 * 3 * EPS[C128]


def test_qr_retraction_has_real_positive_diagonal(bk):
    """Y = X + tZ = QR with diag(R) real and positive: R = QᴴY is upper triangular with a real
    positive diagonal (imaginary parts ≤ 20·eps·‖Y‖), Q has orthonormal columns, and Q equals
    NumPy's Q up to the column phases r_kk/|r_kk| of NumPy's R."""
    rng = np.random.default_rng(14)
    X = haar_stiefel(rng, 7, 3, (2,))
    Z = crandn(rng, 2, 7, 3)
    Q = to_numpy(
        bk.call(lambda x, z: hl.qr_retraction(x, z, 0.5), bk.asarray(X, C128), bk.asarray(Z, C128))
    )
    Y = X + 0.5 * Z
    R = herm_t(Q) @ Y
    d = np.diagonal(R, axis1=-2, axis2=-1)
    scale = 20 * EPS[C128] * np.linalg.norm(Y)
    assert np.all(d.real > 0) and np.max(np.abs(d.imag)) <= scale
    assert np.max(np.abs(np.tril(R, -1))) <= scale
    assert orth_error(Q) <= 20 * 3 * EPS[C128]
    q, r = np.linalg.qr(Y)
    rd = np.diagonal(r, axis1=-2, axis2=-1)
    np.testing.assert_allclose(Q, q * (rd / np.abs(rd))[..., None, :], atol=scale)


def _retractions():
    return {
        "polar": hl.polar_retraction,
        "cayley": hl.cayley_retraction,
        "qr": hl.qr_retraction,
    }


@pytest.mark.parametrize("name", ["cayley", "qr"])
def test_retraction_first_order_and_unitary(bk, name):
    """R(X, tZ) = X + tZ + O(t²) for tangent Z (slope 2 between t = 1e-2 and 1e-3), on the
    manifold, in complex128; Z = 0 gives X."""
    f = _retractions()[name]
    rng = np.random.default_rng(stable_seed("first order", name))
    X = haar_stiefel(rng, 7, 3, (2,))
    Z = tangent(rng, X)
    errs = []
    for t in (1e-2, 1e-3):
        Y = to_numpy(
            bk.call(lambda x, z, t=t: f(x, z, t), bk.asarray(X, C128), bk.asarray(Z, C128))
        )
        assert Y.dtype == C128 and orth_error(Y) <= 20 * 3 * EPS[C128]
        errs.append(np.max(np.abs(Y - X - t * Z)))
    slope = np.log10(errs[0] / errs[1])
    assert 1.8 <= slope <= 2.2, errs
    Y0 = to_numpy(bk.call(lambda x, z: f(x, z, 0.3), bk.asarray(X, C128), bk.asarray(0 * Z, C128)))
    assert np.max(np.abs(Y0 - X)) <= 20 * 3 * EPS[C128]


@pytest.mark.parametrize("name", ["polar", "cayley", "qr"])
def test_retraction_dtypes(name):
    """complex64 in, complex64 out (computed in complex128: as accurate as a rounding of the
    complex128 result); real X with complex Z: complex128; real input: unchanged, real."""
    f = _retractions()[name]
    rng = np.random.default_rng(15)
    X = haar_stiefel(rng, 6, 2)
    Z = tangent(rng, X)
    Y64 = f(X.astype(C64), Z.astype(C64), 0.1)
    assert Y64.dtype == C64
    Y128 = f(X.astype(C64).astype(C128), Z.astype(C64).astype(C128), 0.1)
    assert np.max(np.abs(Y64 - Y128)) <= EPS[C64]
    Yrc = f(np.eye(6, 2), Z, 0.1)
    assert Yrc.dtype == C128 and orth_error(Yrc) <= 1e-14
    Xr = np.eye(6, 2)
    Zr = rng.standard_normal((6, 2))
    Zr = Zr - Xr @ (0.5 * (Xr.T @ Zr + Zr.T @ Xr))
    Yr = f(Xr, Zr, 0.1)
    assert Yr.dtype == np.float64
    np.testing.assert_allclose(f(Xr.astype(C128), Zr.astype(C128), 0.1), Yr, atol=1e-14)
    with pytest.raises(TypeError, match="step has complex dtype"):
        f(X, Z, np.asarray(0.1j))


# -- VJPs: the dot-product test on every backend --------------------------------------------


# their dot-product test (complex δ and ḡ, real steps): tests/test_vjp.py, over the registry


def test_vjp_real_inputs_get_real_cotangents():
    rng = np.random.default_rng(10)
    X, Z, g = np.linalg.qr(rng.standard_normal((6, 3)))[0], crandn(rng, 6, 3), crandn(rng, 6, 3)
    for vjp in (hl.vjp.polar_retraction, hl.vjp.cayley_retraction, hl.vjp.qr_retraction):
        Xb, Zb, sb = vjp(X, Z, 0.2, g)
        Xb_c, Zb_c, sb_c = vjp(X.astype(C128), Z, 0.2, g)
        assert Xb.dtype == np.float64 and Zb.dtype == C128 and np.isrealobj(sb)
        np.testing.assert_allclose(Xb, Xb_c.real, atol=1e-14)
        np.testing.assert_allclose(Zb, Zb_c, atol=1e-14)
        np.testing.assert_allclose(sb, sb_c, atol=1e-14)
    assert hl.vjp.polar(X, g).dtype == np.float64


# -- torch: gradcheck and gradgradcheck -----------------------------------------------------


def _torch_maps(torch):
    return {
        "polar": lambda X, Z: hl.polar(X + 0.3 * Z),
        "polar_retraction": lambda X, Z: hl.polar_retraction(X, Z, 0.3),
        "cayley_retraction": lambda X, Z: hl.cayley_retraction(X, Z, 0.3, drift_tol=float("inf")),
        "qr_retraction": lambda X, Z: hl.qr_retraction(X, Z, 0.3),
    }


@pytest.mark.parametrize(
    "name", ["polar", "polar_retraction", "cayley_retraction", "qr_retraction"]
)
def test_torch_gradcheck_and_gradgradcheck(name):
    torch = require("torch")
    f = _torch_maps(torch)[name]
    rng = np.random.default_rng(stable_seed("torch", name))
    X = haar_stiefel(rng, 5, 2)
    args = tuple(torch.tensor(a, requires_grad=True) for a in (X, crandn(rng, 5, 2)))
    assert torch.autograd.gradcheck(f, args)
    assert torch.autograd.gradgradcheck(f, args)


def test_torch_grad_is_the_plain_vjp():
    torch = require("torch")
    rng = np.random.default_rng(11)
    X, Z, g = haar_stiefel(rng, 6, 3), crandn(rng, 6, 3), crandn(rng, 6, 3)
    for name, vjp in (("polar", hl.vjp.polar_retraction), ("qr", hl.vjp.qr_retraction)):
        Xt, Zt = (torch.tensor(a, requires_grad=True) for a in (X, Z))
        _retractions()[name](Xt, Zt, 0.4).backward(torch.tensor(g))
        Xb, Zb, _ = vjp(X, Z, 0.4, g)
        np.testing.assert_allclose(Xt.grad.numpy(), Xb, atol=1e-13)
        np.testing.assert_allclose(Zt.grad.numpy(), Zb, atol=1e-13)


# -- JAX: jax.grad against central differences along real and imaginary directions ----------


def _jax():
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)
    return jax


def _jax_maps():
    return {
        "polar": lambda X, Z: hl.polar(X + 0.3 * Z),
        "polar_retraction": lambda X, Z: hl.polar_retraction(X, Z, 0.3),
        "cayley_retraction": lambda X, Z: hl.cayley_retraction(X, Z, 0.3, drift_tol=float("inf")),
        "qr_retraction": lambda X, Z: hl.qr_retraction(X, Z, 0.3),
    }


@pytest.mark.parametrize(
    ("jit", "name"),
    [
        pytest.param(
            jit,
            name,
            # `make test`: each map once, eager and under jax.jit alternating (each case
            # compiles anew); every map both ways in `make test-long`
            marks=() if jit == bool(i % 2) else pytest.mark.long,
        )
        for jit in (False, True)
        for i, name in enumerate(_jax_maps())
    ],
)
def test_jax_grad_against_real_and_imaginary_differences(name, jit):
    """``jax.grad`` of a real loss is ∂L/∂Re − i ∂L/∂Im: Re Σ grad·δ must equal the central
    difference along a real δ and along an imaginary iδ (a missing conjugation flips the sign
    of the second; 1e-7 relative as in tests/test_vjp.py)."""
    jax = _jax()
    jnp = jax.numpy
    f = _jax_maps()[name]
    rng = np.random.default_rng(stable_seed("jax", name))
    args = [haar_stiefel(rng, 6, 3), crandn(rng, 6, 3)]
    W = jnp.asarray(crandn(rng, 6, 3))

    def loss(X, Z):
        y = f(X, Z)
        return jnp.sum(jnp.real(jnp.conj(W) * y)) + 0.3 * jnp.sum(jnp.abs(y[0]) ** 3)

    grad = jax.grad(loss, argnums=(0, 1))
    grads = (jax.jit(grad) if jit else grad)(*map(jnp.asarray, args))
    assert_jax_grad_matches_real_and_imaginary_differences(loss, args, grads, rng)


def test_jax_grad_is_the_conjugate_of_the_plain_vjp():
    jax = _jax()
    jnp = jax.numpy
    rng = np.random.default_rng(12)
    X, Z, g = haar_stiefel(rng, 6, 3), crandn(rng, 6, 3), crandn(rng, 6, 3)
    for name, vjp in (("polar", hl.vjp.polar_retraction), ("qr", hl.vjp.qr_retraction)):
        f = _retractions()[name]
        _, pullback = jax.vjp(lambda X, Z, f=f: f(X, Z, 0.4), jnp.asarray(X), jnp.asarray(Z))
        Xj, Zj = pullback(jnp.asarray(np.conj(g)))
        Xb, Zb, _ = vjp(X, Z, 0.4, g)
        np.testing.assert_allclose(np.asarray(Xj), np.conj(Xb), atol=1e-13)
        np.testing.assert_allclose(np.asarray(Zj), np.conj(Zb), atol=1e-13)
