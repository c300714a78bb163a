"""Surjectivity onto U(N) and the complex Stiefel manifold: the constructive inverses with
phases (Mhammedi et al., ICML 2017, §4.3, Corollary 1), the complex oRNN and SVD maps, and
LAPACK's complex reflectors (``zgeqrf`` / ``zungqr`` / ``zunmqr``).

Oracles: ``scipy.stats.unitary_group`` samples (Haar, every determinant phase), NumPy's
``linalg.qr`` / ``linalg.svd`` and LAPACK; none shares code with the library. Tolerances:
a round trip is a Householder QR (backward stable, ~N·eps) followed by a CWY product (~N·eps
·‖T‖, ‖T‖ ≤ 4 for these lower-trapezoidal reflectors), so 10·N·eps·4 per entry (``tol`` with
scale 4); a wrong phase convention is off by O(1).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import scipy.linalg.lapack as lapack
from conftest import require, to_numpy
from helpers import jax_once_each, tol
from scipy.stats import unitary_group

import householderla as hl

pytestmark = pytest.mark.no_dask("the inverses take no Dask operand")

C128 = np.complex128


def crandn(rng, *shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


def haar_unitary(n, seed, det=None, batch=()):
    """Haar unitary matrices; with ``det``, the first column rescaled to that determinant."""
    size = int(np.prod(batch)) if batch else 1
    Q = unitary_group.rvs(n, size=size, random_state=seed) if n > 1 else None
    if n == 1:
        rng = np.random.default_rng(seed)
        Q = np.exp(2j * np.pi * rng.random(batch + (1, 1)))
    Q = np.asarray(Q).reshape(batch + (n, n))
    if det is not None:
        Q = Q.copy()
        Q[..., :, 0] *= det / np.linalg.det(Q)[..., None]
    return Q


def _cmp(actual, expected, bound):
    a = to_numpy(actual)
    err = float(np.max(np.abs(a - expected))) if a.size else 0.0
    assert err <= bound, f"max error {err:.3e} > {bound:.3e}"


def _round_trip(Q):
    V, theta = hl.householder_vectors(Q, return_phases=True)
    return V, theta, hl.cwy(V, theta=theta).matrix()


DETS = [None, 1.0, -1.0, 1j]


@pytest.mark.parametrize(
    ("det", "n"),
    # JAX: each determinant once, with n = 1, 2, 5, 9 in turn
    jax_once_each(DETS, [1, 2, 5, 9], [str(d) for d in DETS], ["1", "2", "5", "9"]),
)
def test_every_unitary_matrix_round_trips(bk, n, det):
    """Q = H(v₁)…H(v_N) diag(e^{iθ}) with v_N = 0: N − 1 reflectors and N phases reach every
    determinant (a product of Hermitian reflections alone has det ±1)."""
    Q = haar_unitary(n, 100 + n, det)
    V, theta, back = (to_numpy(a) for a in bk.call(_round_trip, bk.asarray(Q, C128)))
    _cmp(back, Q, tol(C128, n, 4.0))
    assert V.dtype == C128 and theta.dtype == np.float64 and theta.shape == (n,)
    assert np.all(np.triu(V, 1) == 0), "lower trapezoidal"
    assert np.all(V[:, -1] == 0), "the N-th reflector is 0: its phase went to θ_N"


def test_batched_round_trips_and_complex64(bk_eager):
    bk = bk_eager
    Q = haar_unitary(4, 7, batch=(2, 3))
    V, theta, back = (to_numpy(a) for a in _round_trip(bk.asarray(Q, C128)))
    assert V.shape == (2, 3, 4, 4) and theta.shape == (2, 3, 4)
    _cmp(back, Q, tol(C128, 4, 4.0))
    V32, theta32, back32 = (to_numpy(a) for a in _round_trip(bk.asarray(Q, np.complex64)))
    assert V32.dtype == np.complex64 and theta32.dtype == np.float32
    _cmp(back32, Q, tol(np.complex64, 4, 4.0))


def _stiefel_round_trip(Om):
    V, theta = hl.tcwy_vectors(Om, return_phases=True)
    return hl.tcwy(V, theta=theta).matrix()


@pytest.mark.parametrize("shape", [(6, 1), (7, 3), (5, 5)])
def test_every_complex_stiefel_matrix_round_trips(bk, shape):
    """Ω = γ_{N,M}(V) diag(e^{iθ}) for every Ω with orthonormal complex columns (batched)."""
    N, M = shape
    Om = haar_unitary(N, 200 + M, batch=(2,))[..., :M]
    _cmp(bk.call(_stiefel_round_trip, bk.asarray(Om, C128)), Om, tol(C128, N, 4.0))


def test_stiefel_round_trip_with_phases_keyword(bk_eager):
    bk = bk_eager
    Om = haar_unitary(6, 9)[:, :3]
    V, theta = hl.tcwy_vectors(bk.asarray(Om, C128), return_phases=True)
    _cmp(hl.tcwy(V, theta=theta).matrix(), Om, tol(C128, 6, 4.0))
    assert tuple(theta.shape) == (3,)


def test_full_rank_input_gives_its_positive_qr_factor():
    """For non-unitary A the map returns the Q factor of A = QR with R's diagonal > 0."""
    rng = np.random.default_rng(11)
    A = crandn(rng, 7, 4)
    V, theta = hl.tcwy_vectors(A, return_phases=True)
    q, r = np.linalg.qr(A)
    d = np.diag(r)
    q = q * (d / np.abs(d))
    _cmp(hl.tcwy(V, theta=theta).matrix(), q, 1e-13)


def test_real_input_with_phases_is_unchanged():
    rng = np.random.default_rng(12)
    Q = np.linalg.qr(rng.standard_normal((5, 5)))[0]
    V, theta = hl.householder_vectors(Q, return_phases=True)
    np.testing.assert_array_equal(V, hl.householder_vectors(Q))
    np.testing.assert_array_equal(theta, np.zeros(5))
    _cmp(hl.cwy(V, theta=theta).matrix(), Q, 1e-13)


def test_bad_phase_arguments_are_named():
    Q = haar_unitary(3, 1)
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


# -- oRNN: Corollary 1 ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 6])
def test_ornn_corollary_1_round_trip(bk, n):
    """ornn_params(Q) = (U, θ) with U lower trapezoidal n × (n − 1), and
    ornn(U, theta=θ) = Ĥ_n(u_n)…Ĥ_2(u_2) Ĥ_1(θ) = Q, for every unitary Q (batched)."""
    Q = haar_unitary(n, 300 + n, batch=(2,))

    def f(Q):
        U, theta = hl.ornn_params(Q)
        # the inverse's output feeds the map as is (issue 41 item 8): θ in sign's place
        return U, theta, hl.ornn(U, theta=theta).matrix(), hl.ornn(*hl.ornn_params(Q)).matrix()

    U, theta, back, back2 = (to_numpy(a) for a in bk.call(f, bk.asarray(Q, C128)))
    assert U.shape == (2, n, n - 1) and theta.shape == (2, n) and theta.dtype == np.float64
    assert np.all(np.triu(U, 1) == 0)
    _cmp(back, Q, tol(C128, n, 4.0))
    np.testing.assert_array_equal(back2, back)


def test_ornn_complex_sign_and_errors():
    rng = np.random.default_rng(14)
    U = np.tril(crandn(rng, 5, 3))
    V = np.concatenate([U, np.eye(5)[:, 4:]], axis=1)
    _cmp(hl.ornn(U, -1).matrix(), hl.cwy(V).matrix(), 1e-13)
    with pytest.raises(ValueError, match="sign or theta, not both"):
        hl.ornn(U, -1, theta=np.zeros(5))
    with pytest.raises(TypeError, match="theta must be real"):
        hl.vjp.ornn_apply(U, 1, np.ones(5), np.ones(5), theta=np.zeros(5, dtype=complex))


# -- SVD-Householder with complex sides ----------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 4), (6, 3), (3, 6), (1, 1)])
def test_complex_svd_parametrization_round_trips(bk, shape):
    """Every complex W is Q_U diag(e^{iθ}) Σ Q_Vᴴ with real σ: σ are the singular values."""
    W = crandn(np.random.default_rng(15), 2, *shape)

    def f(W):
        Uv, s, Vv, theta = hl.svd_householder_params(W, return_phases=True)
        return s, theta, hl.svd_householder(Uv, s, Vv, theta=theta).matrix()

    s, theta, back = (to_numpy(a) for a in bk.call(f, bk.asarray(W, C128)))
    assert s.dtype == np.float64 and theta.dtype == np.float64
    np.testing.assert_allclose(s, np.linalg.svd(W, compute_uv=False), atol=1e-13)
    _cmp(back, W, 40 * tol(C128, max(shape), 4.0))


def test_complex_svd_operator_products():
    rng = np.random.default_rng(16)
    Uv, Vv, s, theta = crandn(rng, 5, 3), crandn(rng, 3, 2), rng.random(3), rng.random(3)
    op = hl.svd_householder(Uv, s, Vv, theta=theta)
    W = op.matrix()
    A, B = hl.cwy(Uv).matrix()[:, :3], hl.cwy(Vv).matrix()
    _cmp(W, (A * (s * np.exp(1j * theta))) @ B.conj().T, 1e-13)
    x, y = crandn(rng, 3, 2), crandn(rng, 5, 2)
    _cmp(op @ x, W @ x, 1e-13)
    _cmp(op.H @ y, W.conj().T @ y, 1e-13)
    _cmp(op.T @ y, W.T @ y, 1e-13)
    _cmp(op.conj() @ x, W.conj() @ x, 1e-13)
    _cmp(y.T @ op, y.T @ W, 1e-13)
    _cmp(op.H.matrix(), W.conj().T, 1e-13)
    assert op.dtype == C128 and op.sigma.dtype == np.float64
    with pytest.raises(ValueError, match="W is complex"):
        hl.svd_householder_params(W)
    with pytest.raises(TypeError, match="sigma must be real"):
        hl.svd_householder(Uv, s + 0j, Vv)


# -- LAPACK's complex reflectors -----------------------------------------------------------------


@pytest.mark.parametrize("shape", [(8, 8), (10, 4), (5, 9)])
def test_from_lapack_complex_is_zungqr_and_zunmqr(shape):
    """zgeqrf's τ is complex: H(i) = I − τᵢvᵢvᵢᴴ is unitary, not Hermitian. ``.matrix()`` is
    zungqr, ``op @ C`` / ``op.H @ C`` / ``C @ op`` are zunmqr (L, N) / (L, C) / (R, N)."""
    m, n = shape
    rng = np.random.default_rng(17)
    A = crandn(rng, m, n)
    (a, tau), R = scipy.linalg.qr(A, mode="raw")
    k = tau.shape[0]
    assert np.max(np.abs(tau.imag)) > 0.01  # genuinely complex τ: not reflections
    full = np.zeros((m, m), dtype=C128)
    full[:, :k] = a[:, :k]
    Q, _, info = lapack.zungqr(full, tau, lwork=64 * m)
    assert info == 0
    op = hl.from_lapack(a, tau)
    b = tol(C128, m + k, 4.0)
    _cmp(op.matrix(), Q, b)
    C = crandn(rng, m, 3)
    ak = np.ascontiguousarray(a[:, :k])
    for side, trans, got in ((b"L", b"N", op @ C), (b"L", b"C", op.H @ C)):
        ref, _, info = lapack.zunmqr(side, trans, ak, tau, C, 64 * m)
        _cmp(got, ref, b)
    ref, _, _ = lapack.zunmqr(b"R", b"N", ak, tau, C.T.copy(), 64 * m)
    _cmp(C.T @ op, ref, b)
    thin = hl.from_lapack(a, tau, thin=True)
    _cmp(thin.matrix(), Q[:, :k], b)
    if k == n:
        _cmp(thin @ R[:k], A, 10 * b * np.linalg.norm(A))
    from helpers import orth_error

    assert orth_error(op.matrix()) <= m * b


def test_from_lapack_complex_rejects_non_unitary_tau():
    rng = np.random.default_rng(18)
    (a, tau), _ = scipy.linalg.qr(crandn(rng, 5, 3), mode="raw")
    with pytest.raises(ValueError, match="unitary"):
        hl.from_lapack(a, 1.1 * tau)


def test_from_lapack_complex_batched_torch_geqrf():
    """torch.geqrf (batched, complex) and torch.linalg.householder_product as the oracle."""
    torch = require("torch")
    rng = np.random.default_rng(19)
    a, tau = torch.geqrf(torch.tensor(crandn(rng, 3, 6, 4)))
    ref = torch.linalg.householder_product(a, tau)
    _cmp(hl.from_lapack(a, tau, thin=True).matrix(), ref.numpy(), 1e-13)


def test_from_lapack_complex_gradient_keeps_the_eigenvalues():
    """The gradient with respect to ``a`` holds each λᵢ = 1 − τᵢ‖vᵢ‖² fixed: it is that of
    householder_product(a, τ(a)) with τ(a) = (1 − λ)/‖v(a)‖² (torch's own autograd), and
    gradcheck passes for that consistent τ (a fixed τ would fail the unitarity check)."""
    torch = require("torch")
    rng = np.random.default_rng(20)
    a0, tau0 = torch.geqrf(torch.tensor(crandn(rng, 6, 4)))
    vecs = lambda a: torch.tril(a, -1) + torch.eye(6, 4, dtype=a.dtype)  # noqa: E731
    lam = 1 - tau0 * (vecs(a0).abs() ** 2).sum(0)
    tau_of = lambda a: (1 - lam) / (vecs(a).abs() ** 2).sum(0)  # noqa: E731
    W = torch.tensor(crandn(rng, 6, 4))

    def ours(a):
        return (hl.from_lapack(a, tau_of(a), thin=True).matrix() * W.conj()).sum().real

    def theirs(a):
        return (torch.linalg.householder_product(a, tau_of(a)) * W.conj()).sum().real

    a1, a2 = (a0.clone().requires_grad_(True) for _ in range(2))
    ours(a1).backward()
    theirs(a2).backward()
    np.testing.assert_allclose(
        torch.tril(a1.grad, -1).numpy(), torch.tril(a2.grad, -1).numpy(), atol=1e-12
    )
    assert torch.autograd.gradcheck(ours, (a0.clone().requires_grad_(True),))
