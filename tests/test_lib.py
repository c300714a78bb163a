"""The linear-algebra shims and the namespace resolution."""

from __future__ import annotations

import array_api_compat as aac
import numpy as np
import pytest
from conftest import require, to_numpy

from householderla._lib.linalg import inv_upper_triangular, inv_upper_triangular_recursive
from householderla._lib.namespace import resolve


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 33])
def test_triangular_inverse_native_and_recursive(bk_eager, n):
    bk = bk_eager
    rng = np.random.default_rng(n)
    S = np.triu(rng.standard_normal((2, n, n)), 1) + 0.5 * np.eye(n)
    ref = np.linalg.inv(S)
    for fn in (inv_upper_triangular, inv_upper_triangular_recursive):
        out = to_numpy(fn(bk.asarray(S), bk.xp))
        # error bound of a triangular inverse: eps·n·κ(S)
        kappa = np.linalg.cond(S).max()
        np.testing.assert_allclose(out, ref, atol=10 * 2.2e-16 * n * kappa)
        np.testing.assert_array_equal(np.tril(out, -1), 0.0)


def test_resolve_promotes_and_names_arguments():
    _, _, dtype, (a, b) = resolve([("a", np.ones(2, dtype=np.int32)), ("b", [1.0, 2.0])])
    assert dtype == np.float64 and a.dtype == np.float64 and isinstance(b, np.ndarray)
    with pytest.raises(TypeError, match="x has dtype object"):
        resolve([("x", object())])
    same = np.ones(3)
    _, _, _, (c,) = resolve([("c", same)])
    assert c is same  # no copy when nothing needs converting


def test_resolve_numpy_constants_join_jax():
    """NumPy arrays mixed with JAX arrays (or tracers, under jax.grad over one argument)
    join JAX's namespace; other mixes still raise TypeError naming the arguments."""
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    def f(x):
        _, _, dtype, (a, b) = resolve([("a", np.ones(3)), ("b", x)], None)
        assert aac.is_jax_array(a) and dtype == jnp.float64
        return jnp.sum(a * b)

    np.testing.assert_array_equal(np.asarray(jax.grad(f)(jnp.arange(3.0))), np.ones(3))
    torch = require("torch")
    with pytest.raises(TypeError, match=r"different array libraries \(a: numpy"):
        resolve([("a", np.ones(3)), ("b", torch.ones(3))], None)
