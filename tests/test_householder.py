"""Theorems 1 and 3 (surjectivity) through the constructive inverses, on every backend, and their
complex forms: surjectivity onto U(N) and the complex Stiefel manifold with phases (Mhammedi et
al., "Efficient Orthogonal Parametrisation of Recurrent Neural Networks Using Householder
Reflections", ICML 2017, §4.3, Corollary 1).

``householder_vectors`` is Householder QR with a positive diagonal: for Q ∈ O(N) it returns
N vectors, the last zero when det Q = +1 and −2e_N when det Q = −1, so cwy reaches both
components of O(N). For Q ∈ U(N) (``return_phases=True``) it returns N − 1 reflectors and N
phases θ, Q = H(v₁)…H(v_{N−1}) diag(e^{iθ}): a product of Hermitian reflections alone has
det ±1.

Oracles: Haar samples (``helpers.haar_stack``: ``scipy.stats.unitary_group`` for U(n); every
determinant phase), NumPy's ``linalg.qr``; none shares code with the library. Tolerances: a
round trip is a Householder QR (backward stable, ~N·eps) followed by a CWY product (~N·eps·‖T‖,
‖T‖ ≤ 4 for these lower-trapezoidal reflectors), and in the worst case ~eps·N² (N reflections of
N-vectors): 10·eps·N·min(N, 4) takes the smaller of the two (``tol`` with scale 4 for N ≥ 4); a
wrong sign or phase convention is off by O(1).

On JAX the inverses run a Python loop over the columns, each step a new shape to compile:
the examples there draw N from a few fixed sizes (``helpers.few_shapes``).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import to_numpy
from helpers import (
    EPS,
    ci_examples,
    crandn,
    few_shapes,
    haar_orthogonal,
    haar_stack,
    product_of_reflections,
    reflection,
    tol,
)
from hypothesis import example, given
from hypothesis import strategies as st

import householderla as hl

pytestmark = pytest.mark.no_dask("the inverses and householder_product take no Dask arrays")

C128 = np.complex128


def haar(n, seed, dtype=np.float64, det=None, batch=()):
    """Haar samples of O(n) or, for a complex dtype, of U(n), shaped batch + (n, n), each of
    determinant ``det`` unless None (``helpers.haar_stack``)."""
    size = int(np.prod(batch)) if batch else 1
    return haar_stack(n, [det] * size, dtype, seed).reshape(batch + (n, n))


def _cmp(actual, expected, bound):
    a = to_numpy(actual)
    err = float(np.max(np.abs(a - expected))) if a.size else 0.0
    assert err <= bound, f"max error {err:.3e} > {bound:.3e}"


def _round_trip_bound(dtype, n):
    """10·eps·N·min(N, 4) (module docstring)."""
    n = max(n, 2)
    return 10 * EPS[np.dtype(dtype).type] * n * min(n, 4)


# module-level: jax.jit caches a compilation per function object (and shapes)
def _cwy_matrix(V):
    return hl.cwy(V).matrix()


def _round_trip(Q):
    """Q ↦ (V, cwy(V)): real Q, no phases."""
    V = hl.householder_vectors(Q)
    return V, hl.cwy(V).matrix()


def _round_trip_phases(Q):
    """Q ↦ (V, θ, cwy(V, theta=θ)): Corollary 1 (complex Q needs the phases)."""
    V, theta = hl.householder_vectors(Q, return_phases=True)
    return V, theta, hl.cwy(V, theta=theta).matrix()


def _stiefel_round_trip(Om):
    return hl.tcwy(hl.tcwy_vectors(Om)).matrix()


def _stiefel_round_trip_phases(Om):
    V, theta = hl.tcwy_vectors(Om, return_phases=True)
    return hl.tcwy(V, theta=theta).matrix()


#: Ω ↦ tcwy(tcwy_vectors(Ω)) by dtype kind: real without phases, complex with them
STIEFEL_ROUND_TRIP = {"f": _stiefel_round_trip, "c": _stiefel_round_trip_phases}


def test_reflection_definition(bk):
    v = np.array([3.0, 4.0, 0.0])
    H = to_numpy(bk.call(hl.householder_product, bk.asarray(v[:, None])))
    np.testing.assert_allclose(H, np.eye(3) - 2 * np.outer(v, v) / 25, atol=1e-15)
    np.testing.assert_allclose(H @ v, -v, atol=1e-14)  # v ↦ −v, v⊥ fixed
    np.testing.assert_allclose(H @ H, np.eye(3), atol=1e-14)  # involution
    Z = to_numpy(bk.call(hl.householder_product, bk.asarray(np.zeros((3, 1)))))
    np.testing.assert_array_equal(Z, np.eye(3))  # H(0) = I


ROUND_TRIP_CASES = [
    pytest.param(np.float64, 1, id="float64-det+1"),
    pytest.param(np.float64, -1, id="float64-det-1"),
    pytest.param(C128, None, id="complex128-haar"),
    pytest.param(C128, 1.0, id="complex128-det+1"),
    pytest.param(C128, -1.0, id="complex128-det-1"),
    pytest.param(C128, 1j, id="complex128-det+i"),
]


@pytest.mark.parametrize(("dtype", "det"), ROUND_TRIP_CASES)
@given(n=st.integers(1, 9), seed=st.integers(0, 2**31 - 1))
# every determinant at these sizes, as well as the drawn ones (N = 1: the phase or sign alone)
@example(n=1, seed=101)
@example(n=2, seed=102)
@example(n=5, seed=105)
@example(n=9, seed=109)
@ci_examples(3)
def test_theorem1_and_corollary1_round_trip_every_determinant(bk, dtype, det, n, seed):
    """Q = H(v₁)…H(v_N) diag(e^{iθ}) for every Q ∈ O(N) (Theorem 1: θ = 0, no phases) and
    every Q ∈ U(N) (Corollary 1: ``return_phases=True``), V lower trapezoidal (Mhammedi et al.,
    ICML 2017, eq. 9). Each nonzero Hermitian reflector has det −1, so det Q =
    (−1)^(number of nonzero v_k)·e^{iΣθ}: real Q gets v_N = 0 or −e_N (H(−e_N) =
    diag(1, …, 1, −1)) to make the parity right, complex Q v_N = 0, its phase in θ_N."""
    n = few_shapes(bk, n, [1, 3, 6], seed)
    Q = haar(n, seed, dtype, det)
    cx = np.dtype(dtype).kind == "c"
    if cx:
        V, theta, back = (to_numpy(a) for a in bk.call(_round_trip_phases, bk.asarray(Q, dtype)))
        assert theta.dtype == np.float64 and theta.shape == (n,)
    else:
        V, back = (to_numpy(a) for a in bk.call(_round_trip, bk.asarray(Q, dtype)))
        theta = np.zeros(n)
    assert V.dtype == dtype and V.shape == (n, n)
    np.testing.assert_array_equal(np.triu(V, 1), 0.0)  # lower trapezoidal
    _cmp(back, Q, _round_trip_bound(dtype, n))
    assert np.all(V[:-1, -1] == 0), "the N-th reflector acts on e_N alone"
    assert V[-1, -1] in ((0.0,) if cx else (0.0, -1.0)), "complex: its phase went to θ_N"
    nonzero = int(np.sum(np.linalg.norm(V, axis=0) > 0))
    det_back = (-1.0) ** nonzero * np.exp(1j * np.sum(theta))
    assert abs(det_back - np.linalg.det(Q)) <= tol(dtype, n, 4.0)


@pytest.mark.parametrize("dtype", [np.float64, C128])
@given(
    n=st.integers(1, 9),
    k=st.integers(0, 8),
    batch=st.sampled_from([(), (3,)]),
    seed=st.integers(0, 2**31 - 1),
)
# (N, M) = (6, 1), (7, 3), (5, 5) with a batch of two, as well as the drawn ones
@example(n=6, k=0, batch=(2,), seed=201)
@example(n=7, k=2, batch=(2,), seed=203)
@example(n=5, k=4, batch=(2,), seed=205)
@ci_examples(9)
def test_theorem3_tcwy_vectors_surjective(bk, dtype, n, k, batch, seed):
    """Ω = γ_{N,M}(V) diag(e^{iθ}) for every Ω with orthonormal columns, real (θ = 0, no
    phases: Theorem 3) or complex (``return_phases=True``), batched; M = 1 + (k mod N)."""
    m = 1 + k % n
    n, m, batch = few_shapes(bk, (n, m, batch), [(1, 1, ()), (6, 3, (3,)), (5, 5, ())], seed)
    Om = haar(n, seed, dtype, batch=batch)[..., :m]
    back = bk.call(STIEFEL_ROUND_TRIP[np.dtype(dtype).kind], bk.asarray(Om, dtype))
    _cmp(back, Om, _round_trip_bound(dtype, n))


@pytest.mark.parametrize(("dtype", "shape"), [(np.float64, (7, 3)), (C128, (7, 4))])
def test_inverse_of_general_matrix_is_positive_qr_factor(bk, dtype, shape):
    """Defined result off the manifold: the Q factor of A = QR with diag(R) > 0 (the phases of
    complex A's R moved into Q: d/|d| is sign(d) for real d)."""
    rng = np.random.default_rng(12)
    A = crandn(rng, *shape) if np.dtype(dtype).kind == "c" else rng.standard_normal(shape)
    q, r = np.linalg.qr(A)
    d = np.diag(r)
    q = q * (d / np.abs(d))
    back = bk.call(STIEFEL_ROUND_TRIP[np.dtype(dtype).kind], bk.asarray(A, dtype))
    _cmp(back, q, 1e-13)


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
    np.testing.assert_allclose(reflection(v) @ v, -v, rtol=0, atol=8 * np.finfo(float).eps)


@pytest.mark.parametrize("fn", [hl.householder_vectors, hl.tcwy_vectors])
def test_inverse_of_empty_and_identity(fn):
    V = fn(np.eye(4))
    np.testing.assert_array_equal(V, 0.0)  # identity ↦ all-zero reflectors


# -- phases: θ of the complex inverses, cwy(V, theta=θ) and tcwy(V, theta=θ) -------------------


def test_batched_round_trips_and_complex64(bk_eager):
    """Batched unitary Q: V (..., N, N) and θ (..., N); complex64 Q gives complex64 V and
    float32 θ, to complex64's accuracy."""
    bk = bk_eager
    Q = haar(4, 7, C128, batch=(2, 3))
    V, theta, back = (to_numpy(a) for a in _round_trip_phases(bk.asarray(Q, C128)))
    assert V.shape == (2, 3, 4, 4) and theta.shape == (2, 3, 4)
    _cmp(back, Q, tol(C128, 4, 4.0))
    V32, theta32, back32 = (to_numpy(a) for a in _round_trip_phases(bk.asarray(Q, np.complex64)))
    assert V32.dtype == np.complex64 and theta32.dtype == np.float32
    _cmp(back32, Q, tol(np.complex64, 4, 4.0))


def test_stiefel_round_trip_with_phases_keyword(bk_eager):
    bk = bk_eager
    Om = haar(6, 9, C128)[:, :3]
    V, theta = hl.tcwy_vectors(bk.asarray(Om, C128), return_phases=True)
    _cmp(hl.tcwy(V, theta=theta).matrix(), Om, tol(C128, 6, 4.0))
    assert tuple(theta.shape) == (3,)


def test_real_input_with_phases_is_unchanged():
    rng = np.random.default_rng(12)
    Q = np.linalg.qr(rng.standard_normal((5, 5)))[0]
    V, theta = hl.householder_vectors(Q, return_phases=True)
    np.testing.assert_array_equal(V, hl.householder_vectors(Q))
    np.testing.assert_array_equal(theta, np.zeros(5))
    _cmp(hl.cwy(V, theta=theta).matrix(), Q, 1e-13)


def test_bad_phase_arguments_are_named():
    Q = haar(3, 1, C128)
    with pytest.raises(ValueError, match=r"Q is complex.*return_phases=True"):
        hl.householder_vectors(Q)
    with pytest.raises(ValueError, match="Omega is complex"):
        hl.tcwy_vectors(Q[:, :2])
    with pytest.raises(TypeError, match="return_phases must be True or False"):
        hl.householder_vectors(Q, return_phases=1)
    V = crandn(np.random.default_rng(0), 3, 2)
    with pytest.raises(TypeError, match="theta must be real"):
        hl.cwy(V, theta=np.ones(3, dtype=complex))
    with pytest.raises(ValueError, match=r"theta must have shape \(\.\.\., 3\)"):
        hl.cwy(V, theta=np.ones(2))
    with pytest.raises(ValueError, match=r"theta must have shape \(\.\.\., 2\)"):
        hl.tcwy(V, theta=np.ones(3))
    with pytest.raises(ValueError, match="theta contains NaN"):
        hl.cwy(V, theta=np.array([0.0, np.nan, 1.0]))


def test_phases_broadcast_and_are_a_right_factor(bk):
    """cwy(V, theta=θ) = cwy(V) diag(e^{iθ}), θ batched against one V; ``.H`` is the inverse."""
    rng = np.random.default_rng(13)
    V, theta, h = crandn(rng, 5, 3), rng.standard_normal((2, 5)), crandn(rng, 5, 2)
    Q0 = hl.cwy(V).matrix()
    ref = Q0 * np.exp(1j * theta)[..., None, :]
    out = bk.call(
        lambda V, t, h: (hl.cwy(V, theta=t).matrix(), hl.cwy(V, theta=t).H @ h),
        bk.asarray(V, C128),
        bk.asarray(theta),
        bk.asarray(h, C128),
    )
    _cmp(out[0], ref, 1e-13)
    _cmp(out[1], np.conj(np.swapaxes(ref, -1, -2)) @ h, 1e-13)
