"""VJPs of the complex maps (their dot-product test on every backend is tests/test_vjp.py's,
over the registry): the theorems their gradients obey, and each framework's convention — torch's
``gradcheck`` / ``gradgradcheck`` (conjugate Wirtinger derivatives) and ``jax.grad`` against
central differences along real *and* imaginary directions.

Conventions (docs/theory/complex.rst): ``hl.vjp`` and torch use the cotangent
ḡ = ∂L/∂Re + i ∂L/∂Im, so dL = Re⟨ḡ, dz⟩ = Re Σ conj(ḡ)·dz; JAX's cotangent is its conjugate,
dL = Re Σ g_jax·dz. Tolerances of the difference checks: ε = 1e-6 central differences in
complex128 are accurate to ~1e-9 relative; the bounds are 1e-7 relative, while a missing
conjugate flips the sign of the imaginary-direction derivative (an O(1) error).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import LONG, require, to_numpy
from helpers import (
    assert_jax_grad_matches_real_and_imaginary_differences,
    stable_seed,
)

import householderla as hl

pytestmark = pytest.mark.no_dask("the VJPs take no Dask arrays")

C128 = np.complex128


def crandn(rng, *shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


def _maps():
    """name -> (forward f(V, *others), hl.vjp function, shapes of the others for (N, L))."""
    return {
        "cwy_apply": (lambda V, h: hl.cwy(V) @ h, hl.vjp.cwy_apply, lambda N, L: [(N, 3)]),
        "cwy_apply_vector": (lambda V, h: hl.cwy(V) @ h, hl.vjp.cwy_apply, lambda N, L: [(N,)]),
        "cwy_transpose_apply": (
            lambda V, h: hl.cwy(V).H @ h,
            hl.vjp.cwy_transpose_apply,
            lambda N, L: [(N, 2)],
        ),
        "cwy_matrix": (lambda V: hl.cwy(V).matrix(), hl.vjp.cwy_matrix, lambda N, L: []),
        "tcwy_apply": (lambda V, x: hl.tcwy(V) @ x, hl.vjp.tcwy_apply, lambda N, L: [(L, 2)]),
        "tcwy_transpose_apply": (
            lambda V, y: hl.tcwy(V).H @ y,
            hl.vjp.tcwy_transpose_apply,
            lambda N, L: [(N, 3)],
        ),
        "tcwy_matrix": (lambda V: hl.tcwy(V).matrix(), hl.vjp.tcwy_matrix, lambda N, L: []),
        "householder_apply": (
            hl.householder_apply,
            hl.vjp.householder_apply,
            lambda N, L: [(N, 2)],
        ),
        "householder_product": (
            hl.householder_product,
            hl.vjp.householder_product,
            lambda N, L: [],
        ),
    }


@pytest.mark.parametrize("name", ["cwy_apply", "cwy_matrix", "tcwy_transpose_apply"])
def test_cotangent_is_orthogonal_to_v_and_iv(bk_eager, name):
    """H(cv) = H(v) for every complex c ≠ 0, so the loss is constant along v ↦ (1 + t)v and
    v ↦ e^{it}v: Re⟨v̄_k, v_k⟩ = 0 and Re⟨v̄_k, i v_k⟩ = 0 for every column (to rounding,
    ~eps·‖v̄‖‖v‖)."""
    bk = bk_eager
    f, vjp, other_shapes = _maps()[name]
    rng = np.random.default_rng(stable_seed("phase", name))
    V = crandn(rng, 7, 4)
    others = [crandn(rng, *s) for s in other_shapes(7, 4)]
    g = crandn(rng, *np.shape(to_numpy(f(*(bk.asarray(a, C128) for a in [V, *others])))))
    out = vjp(*(bk.asarray(a, C128) for a in [V, *others, g]))
    Vb = to_numpy(out[0] if isinstance(out, tuple) else out)
    scale = np.linalg.norm(Vb, axis=0) * np.linalg.norm(V, axis=0)
    for c in (1.0, 1.0j):
        radial = np.sum(np.real(np.conj(Vb) * (c * V)), axis=0)
        assert np.all(np.abs(radial) <= 1e-13 * scale), (c, radial)
    assert np.max(np.abs(Vb)) > 0.1  # not vacuous


def test_real_inputs_get_real_cotangents():
    """V real, h complex: V̄ is real and equals the real part of V̄ at the same (complex-typed)
    point, since only real perturbations of V are allowed."""
    rng = np.random.default_rng(1)
    V, h, g = rng.standard_normal((6, 3)), crandn(rng, 6, 2), crandn(rng, 6, 2)
    Vb, hb = hl.vjp.cwy_apply(V, h, g)
    Vb_c, hb_c = hl.vjp.cwy_apply(V.astype(C128), h, g)
    assert Vb.dtype == np.float64 and hb.dtype == C128
    np.testing.assert_allclose(Vb, Vb_c.real, atol=1e-14)
    np.testing.assert_allclose(hb, hb_c, atol=1e-14)
    Gb = hl.vjp.householder_product(V, crandn(rng, 6, 6))
    assert Gb.dtype == np.float64


# -- torch: conjugate Wirtinger derivatives ------------------------------------------------


def _torch_maps():
    return {
        "cwy_apply": (lambda V, h: hl.cwy(V) @ h, "h"),
        "cwy_H_apply": (lambda V, h: hl.cwy(V).H @ h, "h"),
        "cwy_T_apply": (lambda V, h: hl.cwy(V).T @ h, "h"),
        "cwy_matrix": (lambda V: hl.cwy(V).matrix(), None),
        "tcwy_apply": (lambda V, x: hl.tcwy(V) @ x, "x"),
        "tcwy_H_apply": (lambda V, h: hl.tcwy(V).H @ h, "h"),
        "tcwy_matrix": (lambda V: hl.tcwy(V).matrix(), None),
        "householder_apply": (hl.householder_apply, "h"),
    }


@pytest.mark.parametrize("name", list(_torch_maps()))
def test_torch_gradcheck_and_gradgradcheck(name):
    torch = require("torch")
    f, other = _torch_maps()[name]
    rng = np.random.default_rng(stable_seed("torch", name))
    N, L = 5, 3
    args = [torch.tensor(crandn(rng, N, L), requires_grad=True)]
    if other is not None:
        shape = (L, 2) if other == "x" else (N, 2)
        args.append(torch.tensor(crandn(rng, *shape), requires_grad=True))
    assert torch.autograd.gradcheck(f, tuple(args))
    if LONG or name in ("cwy_apply", "cwy_matrix", "tcwy_apply", "householder_apply"):
        # second order for the maps issue 15 names; the transposed variants (same Functions,
        # 7-12 s each) in `make test-long`
        assert torch.autograd.gradgradcheck(f, tuple(args))


def test_torch_grad_is_the_plain_vjp():
    """``.grad`` after ``backward(g)`` is ``hl.vjp``'s cotangent: one convention for both."""
    torch = require("torch")
    rng = np.random.default_rng(2)
    V, h, g = crandn(rng, 6, 4), crandn(rng, 6, 2), crandn(rng, 6, 2)
    Vt, ht = (torch.tensor(a, requires_grad=True) for a in (V, h))
    (hl.cwy(Vt) @ ht).backward(torch.tensor(g))
    Vb, hb = hl.vjp.cwy_apply(V, h, g)
    np.testing.assert_allclose(Vt.grad.numpy(), Vb, atol=1e-13)
    np.testing.assert_allclose(ht.grad.numpy(), hb, atol=1e-13)


# -- JAX: the conjugate convention ----------------------------------------------------------


def _jax():
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)  # as the jax backends of conftest do
    return jax


def _loss(f, W):
    """A real loss of a complex output that is not holomorphic in it (Re⟨W, y⟩ + 0.3‖y‖²)."""
    jnp = _jax().numpy

    def loss(*args):
        y = f(*args)
        return jnp.sum(jnp.real(jnp.conj(W) * y)) + 0.3 * jnp.sum(jnp.abs(y) ** 2)

    return loss


@pytest.mark.parametrize("name", ["cwy_apply", "cwy_matrix", "tcwy_transpose_apply"])
@pytest.mark.parametrize("jit", [False, True])
def test_jax_grad_against_real_and_imaginary_differences(name, jit):
    """``jax.grad`` of a real loss is ∂L/∂Re − i ∂L/∂Im (JAX's convention): its pairing
    Re Σ grad·δ with a real δ and with an imaginary iδ must equal the central differences
    along each. A rule that skipped the conjugation passes the real direction and fails the
    imaginary one by a sign."""
    jax = _jax()
    jnp = jax.numpy
    f, _, other_shapes = _maps()[name]
    rng = np.random.default_rng(stable_seed("jax", name))
    N, L = 5, 3
    args = [crandn(rng, N, L), *(crandn(rng, *s) for s in other_shapes(N, L))]
    W = jnp.asarray(crandn(rng, *np.shape(f(*args))))
    loss = _loss(f, W)
    grad = jax.grad(loss, argnums=tuple(range(len(args))))
    grads = (jax.jit(grad) if jit else grad)(*map(jnp.asarray, args))
    assert_jax_grad_matches_real_and_imaginary_differences(loss, args, grads, rng)


def test_jax_grad_is_the_conjugate_of_the_plain_vjp():
    jax = _jax()
    jnp = jax.numpy
    rng = np.random.default_rng(3)
    V, h, g = crandn(rng, 6, 4), crandn(rng, 6, 2), crandn(rng, 6, 2)
    _, pullback = jax.vjp(lambda V, h: hl.cwy(V) @ h, jnp.asarray(V), jnp.asarray(h))
    Vj, hj = pullback(jnp.asarray(np.conj(g)))
    Vb, hb = hl.vjp.cwy_apply(V, h, g)
    np.testing.assert_allclose(np.asarray(Vj), np.conj(Vb), atol=1e-13)
    np.testing.assert_allclose(np.asarray(hj), np.conj(hb), atol=1e-13)


@pytest.mark.parametrize("name", ["cwy_apply", "tcwy_matrix", "householder_apply"])
def test_jax_check_grads_order_2(name):
    """``jax.test_util.check_grads``: reverse mode against numerical derivatives, and the
    reverse of the reverse (the backward rules are written in jnp, so differentiable)."""
    jax = _jax()
    from jax.test_util import check_grads

    f, _, other_shapes = _maps()[name]
    rng = np.random.default_rng(stable_seed("check_grads", name))
    args = [crandn(rng, 5, 3), *(crandn(rng, *s) for s in other_shapes(5, 3))]
    check_grads(f, tuple(map(jax.numpy.asarray, args)), order=2, modes=["rev"])
