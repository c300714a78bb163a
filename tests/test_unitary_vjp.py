"""VJPs of the phased unitary maps (``theta=``; their dot-product test on every backend,
complex V, h and cotangent with real θ and its real direction, is tests/test_vjp.py's over
the registry): torch's ``gradcheck`` / ``gradgradcheck`` through the operators, and ``jax.grad``
against the plain VJP (JAX's complex cotangent is the conjugate; θ's is real and equal).

Tolerances: as in test_complex_vjp.py (central differences with ε = 1e-6, 1e-7 relative).
θ̄ is real: a formula that returned Re instead of −Im (or dropped the sign of the adjoint
phase) is off by O(1) along θ's direction.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import LONG, require
from helpers import stable_seed

import householderla as hl

pytestmark = pytest.mark.no_dask("the VJPs take no Dask arrays")


def crandn(rng, *shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


N, L, B = 6, 4, 2


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
