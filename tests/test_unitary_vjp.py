"""VJPs of the phased unitary maps (``theta=``): the plain ``hl.vjp`` functions by the
dot-product test on every backend (complex V, h and cotangent, real θ and its real
direction), torch's ``gradcheck`` / ``gradgradcheck`` through the operators, and ``jax.grad``
against the plain VJP (JAX's complex cotangent is the conjugate; θ's is real and equal).

Tolerances: as in test_complex_vjp.py (central differences with ε = 1e-6, 1e-7 relative).
θ̄ is real: a formula that returned Re instead of −Im (or dropped the sign of the adjoint
phase) is off by O(1) along θ's direction.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import LONG, require
from helpers import assert_vjp_matches_central_differences, stable_seed

import householderla as hl

pytestmark = pytest.mark.no_dask("the VJPs take no Dask arrays")


def crandn(rng, *shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


N, L, B = 6, 4, 2


def _maps():
    """name -> (forward, vjp, input shapes (complex?, shape) after V)."""
    c, r = True, False
    return {
        "cwy_apply": (
            lambda V, h, t: hl.cwy(V, theta=t) @ h,
            lambda V, h, t, g: hl.vjp.cwy_apply(V, h, g, theta=t),
            [(c, (N, B)), (r, (N,))],
        ),
        "cwy_apply_batched_theta": (
            lambda V, h, t: hl.cwy(V, theta=t) @ h,
            lambda V, h, t, g: hl.vjp.cwy_apply(V, h, g, theta=t),
            [(c, (N, B)), (r, (3, N))],
        ),
        "cwy_transpose_apply": (
            lambda V, h, t: hl.cwy(V, theta=t).H @ h,
            lambda V, h, t, g: hl.vjp.cwy_transpose_apply(V, h, g, theta=t),
            [(c, (N, B)), (r, (N,))],
        ),
        "cwy_matrix": (
            lambda V, t: hl.cwy(V, theta=t).matrix(),
            lambda V, t, g: hl.vjp.cwy_matrix(V, g, theta=t),
            [(r, (N,))],
        ),
        "tcwy_apply": (
            lambda V, x, t: hl.tcwy(V, theta=t) @ x,
            lambda V, x, t, g: hl.vjp.tcwy_apply(V, x, g, theta=t),
            [(c, (L, B)), (r, (L,))],
        ),
        "tcwy_transpose_apply": (
            lambda V, y, t: hl.tcwy(V, theta=t).H @ y,
            lambda V, y, t, g: hl.vjp.tcwy_transpose_apply(V, y, g, theta=t),
            [(c, (N, B)), (r, (L,))],
        ),
        "tcwy_matrix": (
            lambda V, t: hl.tcwy(V, theta=t).matrix(),
            lambda V, t, g: hl.vjp.tcwy_matrix(V, g, theta=t),
            [(r, (L,))],
        ),
        "ornn_apply": (
            lambda U, h, t: hl.ornn(U, theta=t) @ h,
            lambda U, h, t, g: hl.vjp.ornn_apply(U, 1, h, g, theta=t),
            [(c, (N, B)), (r, (N,))],
        ),
        "ornn_matrix": (
            lambda U, t: hl.ornn(U, theta=t).matrix(),
            lambda U, t, g: hl.vjp.ornn_matrix(U, 1, g, theta=t),
            [(r, (N,))],
        ),
        "svd_apply": (
            lambda U, s, V, x, t: hl.svd_householder(U, s, V, theta=t) @ x,
            lambda U, s, V, x, t, g: hl.vjp.svd_householder_apply(U, s, V, x, g, theta=t),
            [(r, (L,)), (c, (L, 3)), (c, (L, B)), (r, (L,))],
        ),
        "svd_matrix": (
            lambda U, s, V, t: hl.svd_householder(U, s, V, theta=t).matrix(),
            lambda U, s, V, t, g: hl.vjp.svd_householder_matrix(U, s, V, g, theta=t),
            [(r, (L,)), (c, (L, 3)), (r, (L,))],
        ),
    }


@pytest.mark.jax_split  # FD checks compile per case on JAX: each on one JAX backend
@pytest.mark.parametrize("name", list(_maps()))
def test_dot_product_against_central_differences(bk, name):
    f, vjp, others = _maps()[name]
    rng = np.random.default_rng(stable_seed("theta", name))
    V = crandn(rng, N, L)
    if name.startswith("ornn"):
        V = np.tril(crandn(rng, N, N - 1))
    inputs = [V] + [crandn(rng, *s) if cx else rng.standard_normal(s) for cx, s in others]

    def freeze(dirs):
        if name.startswith("ornn"):
            dirs[0] = np.tril(dirs[0])  # entries above the diagonal are not parameters

    grads = assert_vjp_matches_central_differences(bk, f, vjp, inputs, rng, freeze)
    assert np.max(np.abs(grads[-1])) > 1e-3, "θ̄ is not vacuous"


def test_phase_gradient_is_zero_for_a_phase_invariant_loss():
    """‖cwy(V, theta=θ) h‖² does not depend on θ (or V): every cotangent is 0 to rounding,
    while Re⟨w, Q h⟩ does, along θ."""
    rng = np.random.default_rng(1)
    V, h, theta = crandn(rng, N, L), crandn(rng, N, B), rng.standard_normal(N)
    y = hl.cwy(V, theta=theta) @ h
    Vb, hb, tb = hl.vjp.cwy_apply(V, h, 2 * y, theta=theta)  # ∂‖y‖²: ȳ = 2y
    np.testing.assert_allclose(tb, 0, atol=1e-12)
    np.testing.assert_allclose(Vb, 0, atol=1e-12)
    np.testing.assert_allclose(hb, 2 * h, atol=1e-12)


@pytest.mark.parametrize(
    "name", ["cwy_apply", "cwy_H_apply", "tcwy_matrix", "ornn_apply", "svd_apply"]
)
def test_torch_gradcheck_and_gradgradcheck(name):
    """Through the operators: the CWY rules with the phase factor differentiated natively
    (gradgradcheck for cwy_apply here, all of them in ``make test-long``)."""
    torch = require("torch")
    rng = np.random.default_rng(stable_seed("torch-theta", name))
    t = lambda a: torch.tensor(a, requires_grad=True)  # noqa: E731
    V, h, th_N, th_L = (
        t(crandn(rng, 5, 3)),
        t(crandn(rng, 5, 2)),
        t(rng.random(5)),
        t(rng.random(3)),
    )
    cases = {
        "cwy_apply": (lambda V, h, t: hl.cwy(V, theta=t) @ h, (V, h, th_N)),
        "cwy_H_apply": (lambda V, h, t: hl.cwy(V, theta=t).H @ h, (V, h, th_N)),
        "tcwy_matrix": (lambda V, t: hl.tcwy(V, theta=t).matrix(), (V, th_L)),
        "ornn_apply": (
            lambda U, h, t: hl.ornn(U, theta=t) @ h,
            (t(np.tril(crandn(rng, 5, 4))), h, th_N),
        ),
        "svd_apply": (
            lambda U, s, W, x, t: hl.svd_householder(U, s, W, theta=t) @ x,
            (V, t(rng.random(3)), t(crandn(rng, 3, 2)), t(crandn(rng, 3, 2)), th_L),
        ),
    }
    f, args = cases[name]
    assert torch.autograd.gradcheck(f, args)
    if name == "cwy_apply" or LONG:  # second order through the phase; the others (5-40 s
        assert torch.autograd.gradgradcheck(f, args)  # each) in `make test-long`


def test_jax_grad_matches_the_plain_vjp():
    """``jax.vjp`` with the conjugated cotangent returns the conjugates of ``hl.vjp``'s
    complex cotangents and the same real θ̄ (eager and under ``jax.jit``)."""
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)  # as the jax backends of conftest do
    jnp = jax.numpy
    rng = np.random.default_rng(2)
    V, h, theta, g = crandn(rng, N, L), crandn(rng, N, B), rng.standard_normal(N), crandn(rng, N, B)
    ref = hl.vjp.cwy_transpose_apply(V, h, g, theta=theta)
    fwd = lambda V, h, t: hl.cwy(V, theta=t).H @ h  # noqa: E731
    for wrap in (lambda f: f, jax.jit):
        _, pull = jax.vjp(wrap(fwd), *map(jnp.asarray, (V, h, theta)))
        Vj, hj, tj = pull(jnp.asarray(np.conj(g)))
        np.testing.assert_allclose(np.asarray(Vj), np.conj(ref[0]), atol=1e-12)
        np.testing.assert_allclose(np.asarray(hj), np.conj(ref[1]), atol=1e-12)
        np.testing.assert_allclose(np.asarray(tj), ref[2], atol=1e-12)
