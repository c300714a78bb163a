"""Complex Stiefel matrices: polar (Newton–Schulz with Hermitian products), the polar, Cayley and
QR retractions, Riemannian gradients, and their VJPs (docs/theory/complex.rst, "Retractions and
gradients").

Oracles: ``scipy.linalg.polar`` (the unitary factor), ``scipy.stats.unitary_group``, dense
Cayley transforms and NumPy's QR. Cotangent conventions as in tests/test_complex_vjp.py:
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
    assert_vjp_matches_central_differences,
    orth_error,
    stable_seed,
)
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


@pytest.mark.parametrize("dtype", [C128, C64])
@pytest.mark.parametrize("shape", [(7, 3), (2, 6, 4), (5, 5), (3, 8)])
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


@pytest.mark.parametrize("schedule", ["certified", "polar_express", "muon", "newton_schulz"])
@pytest.mark.parametrize("dtype", [C128, C64])
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


# -- VJPs: the dot-product test on every backend --------------------------------------------


def _vjp_maps():
    """name -> (forward, hl.vjp function, inputs from (rng, X, Z))."""
    return {
        "polar": (hl.polar, hl.vjp.polar, lambda rng, X, Z: [X + 0.3 * Z]),
        "polar_retraction": (
            hl.polar_retraction,
            hl.vjp.polar_retraction,
            lambda rng, X, Z: [X, Z, np.float64(0.3)],
        ),
    }


@pytest.mark.jax_split
@pytest.mark.parametrize("name", list(_vjp_maps()))
def test_vjp_dot_product_against_central_differences(bk, name):
    """Re⟨ḡ, J δ⟩ (central differences) = Re⟨J*ḡ, δ⟩ with complex δ and ḡ (the step real)."""
    f, vjp, inputs = _vjp_maps()[name]
    rng = np.random.default_rng(stable_seed("vjp", name))
    X = haar_stiefel(rng, 6, 3, (2,))
    Z = crandn(rng, 2, 6, 3)
    assert_vjp_matches_central_differences(bk, f, vjp, inputs(rng, X, Z), rng)


def test_vjp_real_inputs_get_real_cotangents():
    rng = np.random.default_rng(10)
    X, Z, g = rng.standard_normal((6, 3)), crandn(rng, 6, 3), crandn(rng, 6, 3)
    Xb, Zb, sb = hl.vjp.polar_retraction(X, Z, 0.2, g)
    Xb_c, Zb_c, sb_c = hl.vjp.polar_retraction(X.astype(C128), Z, 0.2, g)
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
    }


@pytest.mark.parametrize("name", ["polar", "polar_retraction"])
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
    Xt, Zt = (torch.tensor(a, requires_grad=True) for a in (X, Z))
    hl.polar_retraction(Xt, Zt, 0.4).backward(torch.tensor(g))
    Xb, Zb, _ = hl.vjp.polar_retraction(X, Z, 0.4, g)
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
    }


@pytest.mark.parametrize("name", list(_jax_maps()))
@pytest.mark.parametrize("jit", [False, True])
def test_jax_grad_against_real_and_imaginary_differences(name, jit):
    """``jax.grad`` of a real loss is ∂L/∂Re − i ∂L/∂Im: Re Σ grad·δ must equal the central
    difference along a real δ and along an imaginary iδ (a missing conjugation flips the sign
    of the second; 1e-7 relative as in tests/test_complex_vjp.py)."""
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
    eps = 1e-6
    for i, a in enumerate(args):
        d = rng.standard_normal(np.shape(a))
        for direction in (d + 0j, 1j * d):
            plus, minus = list(args), list(args)
            plus[i], minus[i] = a + eps * direction, a - eps * direction
            fd = float(loss(*map(jnp.asarray, plus))) - float(loss(*map(jnp.asarray, minus)))
            fd /= 2 * eps
            an = float(np.real(np.sum(np.asarray(grads[i]) * direction)))
            scale = np.linalg.norm(np.asarray(grads[i])) * np.linalg.norm(d)
            assert abs(fd - an) <= 1e-7 * max(scale, 1.0), (i, direction.dtype, fd, an)


def test_jax_grad_is_the_conjugate_of_the_plain_vjp():
    jax = _jax()
    jnp = jax.numpy
    rng = np.random.default_rng(12)
    X, Z, g = haar_stiefel(rng, 6, 3), crandn(rng, 6, 3), crandn(rng, 6, 3)
    _, pullback = jax.vjp(
        lambda X, Z: hl.polar_retraction(X, Z, 0.4), jnp.asarray(X), jnp.asarray(Z)
    )
    Xj, Zj = pullback(jnp.asarray(np.conj(g)))
    Xb, Zb, _ = hl.vjp.polar_retraction(X, Z, 0.4, g)
    np.testing.assert_allclose(np.asarray(Xj), np.conj(Xb), atol=1e-13)
    np.testing.assert_allclose(np.asarray(Zj), np.conj(Zb), atol=1e-13)
