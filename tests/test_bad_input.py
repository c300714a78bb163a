"""Bad input: clear errors naming the argument, or documented defined results."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require, to_numpy

import householderla as hl


@pytest.mark.parametrize("fn", [hl.cwy, hl.tcwy, hl.householder_product])
def test_too_few_dimensions(fn):
    with pytest.raises(ValueError, match=r"V must have shape \(\.\.\., N, L\)"):
        fn(np.ones(3))


@pytest.mark.parametrize("fn", [hl.cwy, hl.tcwy, hl.householder_product])
def test_more_vectors_than_dimension(fn):
    with pytest.raises(ValueError, match="need L <= N"):
        fn(np.ones((3, 4)))


def test_nan_and_inf_rejected_on_eager_arrays(bk_eager):
    bk = bk_eager
    for bad in (np.nan, np.inf):
        V = np.ones((4, 3))
        V[2, 1] = bad
        with pytest.raises(ValueError, match=r"V contains NaN or Inf \(in column\(s\) \[1\]\)"):
            hl.cwy(bk.asarray(V))
        for structure in ("trapezoidal", "dense"):  # below the diagonal: not a structure error
            with pytest.raises(ValueError, match=r"V contains NaN or Inf \(in column\(s\) \[1\]\)"):
                hl.cwy(bk.asarray(np.tril(V)), structure=structure)
        with pytest.raises(ValueError, match="NaN or Inf"):
            hl.householder_apply(bk.asarray(V), bk.asarray(np.ones(4)))
        with pytest.raises(ValueError, match="NaN or Inf"):
            hl.householder_vectors(bk.asarray(np.where(np.eye(4) > 0, bad, 0.0)))


def test_nan_propagates_under_jit():
    """Lazy arrays cannot be inspected: NaN propagates instead of raising."""
    jax = require("jax")
    V = np.ones((4, 3))
    V[0, 0] = np.nan
    out = jax.jit(lambda V: hl.cwy(V).matrix())(jax.numpy.asarray(V))
    assert np.isnan(np.asarray(out)).any()


@pytest.mark.parametrize(
    ("fn", "value", "match"),
    [
        (hl.cwy, np.ones((4, 2), dtype=bool), "V has boolean dtype"),
        # half precision is taken by cwy/tcwy (tests/test_cwy.py), not the inverses
        (hl.householder_vectors, np.eye(4, dtype=np.float16), "Q has dtype float16"),
    ],
)
def test_unsupported_dtypes(fn, value, match):
    with pytest.raises(TypeError, match=match):
        fn(value)


def test_complex_rejected_where_only_the_real_case_exists():
    """Complex input is accepted by the Householder/CWY maps (tests/test_cwy.py) and the
    retractions (tests/test_retractions.py), and rejected, naming the argument, where
    only the real case exists: a step length is a real number."""
    with pytest.raises(TypeError, match="step has complex dtype"):
        hl.polar_retraction(np.eye(4, 2), np.ones((4, 2), dtype=complex), np.asarray(1j))


def test_mismatched_operand_shapes():
    Q = hl.cwy(np.ones((5, 2)))
    with pytest.raises(
        ValueError, match=r"h must have shape \(5,\) or \(\.\.\., 5, B\); got shape \(4, 3\)"
    ):
        Q @ np.ones((4, 3))
    with pytest.raises(ValueError, match="got a scalar"):
        Q @ np.float64(1.0)
    Om = hl.tcwy(np.ones((5, 2)))
    with pytest.raises(ValueError, match=r"\(2,\) or \(\.\.\., 2, B\)"):
        Om @ np.ones(5)
    with pytest.raises(ValueError, match=r"Q must have shape \(\.\.\., N, N\)"):
        hl.householder_vectors(np.ones((4, 3)))
    with pytest.raises(ValueError, match="Omega must have shape"):
        hl.tcwy_vectors(np.ones((3, 4)))


def test_mixed_namespaces():
    torch = require("torch")
    with pytest.raises(TypeError, match="different array libraries"):
        hl.householder_apply(np.ones((3, 2)), torch.ones(3))
    with pytest.raises(TypeError, match=r"h is a torch\.Tensor but the operator holds numpy"):
        hl.cwy(np.ones((3, 2))) @ torch.ones(3)


def test_mixed_dtypes_promote():
    Q = hl.cwy(np.ones((3, 2), dtype=np.float32))
    assert (Q @ np.ones(3)).dtype == np.float64
    assert (Q @ np.ones(3, dtype=np.float32)).dtype == np.float32
    # integers become the namespace's default float first (float64 for NumPy), as in NumPy
    assert (Q @ np.ones(3, dtype=np.int64)).dtype == np.float64


def test_lists_are_accepted_as_numpy():
    y = hl.cwy([[1.0], [0.0]]) @ [1.0, 2.0]
    np.testing.assert_array_equal(y, [-1.0, 2.0])  # exact: S = ½, every step an integer


def test_read_only_and_non_contiguous_inputs():
    rng = np.random.default_rng(15)
    V = rng.standard_normal((8, 6))[:, ::2]  # non-contiguous view
    V.flags.writeable = False
    h = np.asfortranarray(rng.standard_normal((8, 3)))
    h.flags.writeable = False
    y = hl.cwy(V) @ h
    np.testing.assert_allclose(y, hl.householder_apply(V, h), atol=1e-14)


def test_rank_deficient_reflectors_are_fine():
    """Parallel or repeated vectors are valid reflectors (H(u)H(u) = I)."""
    v = np.array([[1.0], [2.0], [2.0]])
    V = np.concatenate([v, v, 3 * v], axis=1)
    np.testing.assert_allclose(hl.cwy(V).matrix(), np.eye(3) - 2 * (v @ v.T) / 9, atol=1e-14)


def test_device_mismatch_is_reported(bk_eager):
    """Operands on one device pass; the check compares devices, so this can only fail if
    the comparison itself is broken (a GPU run exercises the mismatch branch)."""
    bk = bk_eager
    Q = hl.cwy(bk.asarray(np.ones((3, 2))))
    assert to_numpy(Q @ bk.asarray(np.ones(3))).shape == (3,)


def test_zero_reflectors_is_the_identity(bk):
    """L = 0 reflectors: Q = I (the empty product) on every backend; LAPACK's trtri rejects
    n = 0 and the recursive inverse must not recurse forever."""
    h = np.arange(6.0).reshape(3, 2)
    y, Q = bk.call(
        lambda V, h: (hl.cwy(V) @ h, hl.cwy(V).matrix()),
        bk.param(np.zeros((3, 0))),
        bk.asarray(h),
    )
    np.testing.assert_array_equal(to_numpy(y), h)
    np.testing.assert_array_equal(to_numpy(Q), np.eye(3))


def test_jax_grad_mixing_tracers_and_concrete_arrays():
    """jax.grad over V only: h stays a concrete array on a device while V is a tracer (device
    unknown); resolve must not call that a device mismatch."""
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)  # as the bk fixture does: float64 tolerances
    jnp = jax.numpy
    rng = np.random.default_rng(0)
    V, h = jnp.asarray(rng.standard_normal((5, 3))), jnp.asarray(rng.standard_normal((5, 2)))
    g = jax.grad(lambda V, h: jnp.sum(hl.householder_apply(V, h) ** 2))(V, h)
    # ‖Q h‖ = ‖h‖ for every V: the gradient with respect to V is zero (to rounding)
    assert float(jnp.max(jnp.abs(g))) <= 1e-12
    g2 = jax.grad(lambda V, h: jnp.sum(hl.cwy(V) @ h))(V, h)
    assert g2.shape == V.shape and bool(jnp.all(jnp.isfinite(g2)))
