"""Explicit VJPs of the retractions by the dot-product test (float64, every backend).

For random directions δ and cotangent g, the central difference
(⟨g, f(x + εδ)⟩ − ⟨g, f(x − εδ)⟩)/2ε equals ⟨vjp(g), δ⟩ up to O(ε²)·|f'''| + O(eps/ε); with
ε = 1e-6 both are ≲ 1e-9 relative, the tolerance is 1e-7 relative (as tests/test_vjp.py). A
missing Sylvester term, a transposed K or a missing chain through G̃ = G − ½XXᵀG is off by
O(1). Cayley is differentiated without its drift guard (``drift_tol=inf``): the perturbed X
leave the manifold by ε, and the VJP is that of the SMW map itself.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require

import householderla as hl

pytestmark = pytest.mark.no_dask("the VJPs take no Dask arrays")

INF = float("inf")


def test_python_float_step_and_float32():
    rng = np.random.default_rng(20)
    X = np.linalg.qr(rng.standard_normal((5, 2)))[0].astype(np.float32)
    Z = rng.standard_normal((5, 2)).astype(np.float32)
    g = rng.standard_normal((5, 2)).astype(np.float32)
    for vjp in (hl.vjp.cayley_retraction, hl.vjp.qr_retraction, hl.vjp.polar_retraction):
        Xb, Zb, tb = vjp(X, Z, 0.3, g)
        assert Xb.dtype == Zb.dtype == tb.dtype == np.float32 and tb.shape == ()
        Xb64, _, tb64 = vjp(X.astype(np.float64), Z.astype(np.float64), 0.3, g.astype(np.float64))
        np.testing.assert_allclose(Xb, Xb64, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(tb, tb64, rtol=1e-5, atol=1e-5)


def test_vjp_bad_input():
    X, g = np.eye(4, 2), np.ones((4, 2))
    with pytest.raises(ValueError, match="Ybar must have the shape"):
        hl.vjp.cayley_retraction(X, X, 0.1, np.ones((4, 3)))
    with pytest.raises(ValueError, match="G must have the shape"):
        hl.vjp.polar(X, np.ones((2, 4)))
    with pytest.raises(ValueError, match="Z must have the shape"):
        hl.vjp.cayley_retraction(X, np.ones((4, 3)), 0.1, g)
    with pytest.raises(ValueError, match="rank deficient"):
        hl.vjp.polar(np.zeros((4, 2)), g)


def test_no_n_by_n_intermediate_in_cayley_vjp():
    """Memory: the VJP at N = 4096, M = 4 stays O(N·M) (an N×N float64 would be 134 MB)."""
    import tracemalloc

    rng = np.random.default_rng(21)
    N, M = 4096, 4
    X = np.linalg.qr(rng.standard_normal((N, M)))[0]
    G, g = rng.standard_normal((N, M)), rng.standard_normal((N, M))
    tracemalloc.start()
    hl.vjp.cayley_retraction(X, G, 0.1, g)
    hl.vjp.polar(X, g)
    hl.vjp.qr_retraction(X, G, 0.1, g)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 40 * N * M * 8, peak


def test_plain_autodiff_agrees_with_explicit_vjps():
    """Until the adapters wire these VJPs (torch.autograd.Function / jax.custom_vjp), torch
    and JAX differentiate through the array operations; both agree with hl.vjp, warning-free."""
    torch = require("torch")
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(22)
    X = np.linalg.qr(rng.standard_normal((7, 3)))[0]
    G, g = rng.standard_normal((7, 3)), rng.standard_normal((7, 3))
    ref_p = hl.vjp.polar(X + 0.3 * G, g)
    Xt = torch.tensor(X + 0.3 * G, requires_grad=True)
    (hl.polar(Xt) * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(Xt.grad.numpy(), ref_p, atol=1e-12)
    gj = jax.grad(lambda x: (hl.polar(x) * g).sum())(jax.numpy.asarray(X + 0.3 * G))
    np.testing.assert_allclose(np.asarray(gj), ref_p, atol=1e-12)
    ref_c = hl.vjp.cayley_retraction(X, G, 0.3, g)
    Xt, Gt = (torch.tensor(a, requires_grad=True) for a in (X, G))
    Y = hl.cayley_retraction(Xt, Gt, 0.3, drift_tol=INF)
    (Y * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(Xt.grad.numpy(), ref_c[0], atol=1e-12)
    np.testing.assert_allclose(Gt.grad.numpy(), ref_c[1], atol=1e-12)
