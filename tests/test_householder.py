"""Theorems 1 and 3 (surjectivity) through the constructive inverses, on every backend.

``householder_vectors`` is Householder QR with a positive diagonal: for Q ∈ O(N) it returns
N vectors, the last zero when det Q = +1 and −2e_N when det Q = −1, so cwy reaches both
components of O(N). Tolerances: QR of an orthogonal matrix is backward stable, so the
reconstruction error is ~eps·N² in the worst case (N reflections of N-vectors): 10·eps·N².

On JAX the inverses run a Python loop over the columns, each step a new shape to compile:
the examples there draw N from a few fixed sizes (``helpers.few_shapes``).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import to_numpy
from helpers import ci_examples, few_shapes, haar_orthogonal, product_of_reflections, reflection
from hypothesis import given
from hypothesis import strategies as st

import householderla as hl

pytestmark = pytest.mark.no_dask("the inverses and householder_product take no Dask arrays")


# module-level: jax.jit caches a compilation per function object (and shapes)
def _cwy_matrix(V):
    return hl.cwy(V).matrix()


def _tcwy_matrix(V):
    return hl.tcwy(V).matrix()


def test_reflection_definition(bk):
    v = np.array([3.0, 4.0, 0.0])
    H = to_numpy(bk.call(hl.householder_product, bk.asarray(v[:, None])))
    np.testing.assert_allclose(H, np.eye(3) - 2 * np.outer(v, v) / 25, atol=1e-15)
    np.testing.assert_allclose(H @ v, -v, atol=1e-14)  # v ↦ −v, v⊥ fixed
    np.testing.assert_allclose(H @ H, np.eye(3), atol=1e-14)  # involution
    Z = to_numpy(bk.call(hl.householder_product, bk.asarray(np.zeros((3, 1)))))
    np.testing.assert_array_equal(Z, np.eye(3))  # H(0) = I


@given(
    n=st.integers(1, 8),
    det=st.sampled_from([1, -1]),
    seed=st.integers(0, 2**31 - 1),
)
@ci_examples(12)
def test_theorem1_householder_vectors_both_determinants(bk, n, det, seed):
    n = few_shapes(bk, n, [1, 3, 6], seed)
    Q = haar_orthogonal(np.random.default_rng(seed), n, det)
    V = bk.call(hl.householder_vectors, bk.asarray(Q))
    Vn = to_numpy(V)
    assert Vn.shape == (n, n)
    # lower trapezoidal (Mhammedi et al., ICML 2017, eq. 9)
    np.testing.assert_array_equal(np.triu(Vn, 1), 0.0)
    back = to_numpy(bk.call(_cwy_matrix, V))
    np.testing.assert_allclose(back, Q, atol=10 * 2.2e-16 * max(n, 2) ** 2)
    # each nonzero reflector has det −1: their number has the parity of det Q, and the last
    # one is 0 or −e_N (H(−e_N) = diag(1, …, 1, −1)) to make it so
    assert np.all(Vn[:-1, -1] == 0)
    assert Vn[-1, -1] == 0.0 or Vn[-1, -1] == -1.0
    nonzero = np.linalg.norm(Vn, axis=0) > 0
    assert (-1) ** int(np.sum(nonzero)) == det


@given(
    n=st.integers(1, 9),
    data=st.data(),
    batch=st.sampled_from([(), (3,)]),
    seed=st.integers(0, 2**31 - 1),
)
@ci_examples(12)
def test_theorem3_tcwy_vectors_surjective(bk, n, data, batch, seed):
    m = data.draw(st.integers(1, n))
    n, m, batch = few_shapes(bk, (n, m, batch), [(1, 1, ()), (6, 3, (3,)), (5, 5, ())], seed)
    rng = np.random.default_rng(seed)
    Om = np.linalg.qr(rng.standard_normal(batch + (n, m)))[0]
    V = bk.call(hl.tcwy_vectors, bk.asarray(Om))
    back = to_numpy(bk.call(_tcwy_matrix, V))
    np.testing.assert_allclose(back, Om, atol=10 * 2.2e-16 * max(n, 2) ** 2)


def test_inverse_of_general_matrix_is_positive_qr_factor(bk):
    """Defined result off the manifold: the Q factor of A = QR with diag(R) > 0."""
    rng = np.random.default_rng(12)
    A = rng.standard_normal((7, 3))
    q, r = np.linalg.qr(A)
    q = q * np.sign(np.diag(r))
    V = bk.call(hl.tcwy_vectors, bk.asarray(A))
    np.testing.assert_allclose(to_numpy(bk.call(_tcwy_matrix, V)), q, atol=1e-13)


def test_inverse_float32_roundtrip(bk):
    rng = np.random.default_rng(13)
    N = few_shapes(bk, 32, [8], 0)  # JAX compiles each of the N steps: N = 32 in test-long
    Q = haar_orthogonal(rng, N, -1).astype(np.float32)
    V = bk.call(hl.householder_vectors, bk.asarray(Q, dtype=np.float32))
    assert to_numpy(V).dtype == np.float32
    back = to_numpy(bk.call(_cwy_matrix, V))
    np.testing.assert_allclose(back, Q, atol=10 * 1.2e-7 * N)


def test_sequential_product_matches_dense_and_batches(bk):
    rng = np.random.default_rng(14)
    V = rng.standard_normal((2, 3, 5, 4))
    V[0, 1, :, 2] = 0
    P = to_numpy(bk.call(hl.householder_product, bk.asarray(V)))
    np.testing.assert_allclose(P, product_of_reflections(V), atol=1e-14)
    h = rng.standard_normal(5)
    y = to_numpy(bk.call(hl.householder_apply, bk.asarray(V), bk.asarray(h)))
    assert y.shape == (2, 3, 5)
    np.testing.assert_allclose(y[1, 2], product_of_reflections(V[1, 2]) @ h, atol=1e-14)


def test_reflection_oracle_helper_is_right():
    """The test oracle itself: H(v) maps v to −v (guards the helpers against typos)."""
    v = np.array([1.0, 2.0])
    np.testing.assert_allclose(reflection(v) @ v, -v)


@pytest.mark.parametrize("fn", [hl.householder_vectors, hl.tcwy_vectors])
def test_inverse_of_empty_and_identity(fn):
    V = fn(np.eye(4))
    np.testing.assert_array_equal(V, 0.0)  # identity ↦ all-zero reflectors
