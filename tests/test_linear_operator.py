"""Operators as ``scipy.sparse.linalg.LinearOperator`` (issue 14, item 1): SciPy's iterative
solvers and eigensolvers run on CWY, T-CWY, SVD-Householder operators and their products
without a formed matrix, and agree with dense linear algebra on ``op.matrix()``.

Tolerances: the solvers stop at a relative residual of 1e-12 to 1e-14; an orthogonal operator
(condition number 1) turns that into the same error of x, a conditioned one into κ times it,
so the checks allow 1e-9·κ; single products agree with dense ones to a few eps·N.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse.linalg as sla
from conftest import require
from helpers import EPS

import householderla as hl

N = 30
PROD_TOL = 20 * N * EPS[np.float64]  # one product: a few GEMMs, entries of order ‖x‖


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_protocol_methods_equal_dense_products():
    rng = _rng(0)
    ops = {
        "cwy": hl.cwy(rng.standard_normal((N, 6))),
        "tcwy": hl.tcwy(rng.standard_normal((N, 6))),
        "svd": hl.svd_householder(
            rng.standard_normal((N, N)), rng.standard_normal(5), rng.standard_normal((5, 5))
        ),
    }
    ops["product"] = ops["cwy"] @ ops["tcwy"]
    for name, op in ops.items():
        M = op.matrix()
        m, n = M.shape
        x, y = rng.standard_normal(n), rng.standard_normal(m)
        X, Y = rng.standard_normal((n, 3)), rng.standard_normal((m, 3))
        np.testing.assert_allclose(op.matvec(x), M @ x, atol=PROD_TOL, err_msg=name)
        assert op.matvec(x[:, None]).shape == (m, 1)
        np.testing.assert_allclose(op.rmatvec(y), M.T @ y, atol=PROD_TOL, err_msg=name)
        np.testing.assert_allclose(op.matmat(X), M @ X, atol=PROD_TOL, err_msg=name)
        np.testing.assert_allclose(op.rmatmat(Y), M.T @ Y, atol=PROD_TOL, err_msg=name)
        L = sla.aslinearoperator(op)
        assert L.shape == (m, n) and L.dtype == np.float64
        np.testing.assert_allclose(L @ X, M @ X, atol=PROD_TOL)
        np.testing.assert_allclose(L.H @ Y, M.T @ Y, atol=PROD_TOL)
        L2 = op.aslinearoperator()
        np.testing.assert_allclose(L2.rmatmat(Y), M.T @ Y, atol=PROD_TOL)


def test_gmres_on_an_orthogonal_operator():
    """Q orthogonal: GMRES converges to x = Qᵀb (error ≤ the residual, ‖Q⁻¹‖ = 1)."""
    rng = _rng(1)
    Q = hl.cwy(rng.standard_normal((N, N)))
    b = rng.standard_normal(N)
    x, info = sla.gmres(sla.aslinearoperator(Q), b, rtol=1e-12, atol=0.0, restart=N)
    assert info == 0
    np.testing.assert_allclose(x, Q.matrix().T @ b, atol=1e-9)


def test_lsqr_on_tall_stiefel_and_svd_householder():
    rng = _rng(2)
    Om = hl.tcwy(rng.standard_normal((N, 5)))
    b = rng.standard_normal(N)
    x = sla.lsqr(sla.aslinearoperator(Om), b, atol=1e-14, btol=1e-14)[0]
    np.testing.assert_allclose(x, Om.matrix().T @ b, atol=1e-9)  # Ω⁺ = Ωᵀ
    sigma = np.array([3.0, 2.0, 1.0, 0.5])
    W = hl.svd_householder(rng.standard_normal((N, N)), sigma, rng.standard_normal((4, 4)))
    x = sla.lsqr(W.aslinearoperator(), b, atol=1e-14, btol=1e-14)[0]
    ref = np.linalg.lstsq(W.matrix(), b, rcond=None)[0]
    np.testing.assert_allclose(x, ref, atol=1e-9 * 6)  # κ(W) = 6


def test_eigsh_and_svds_find_the_spectrum():
    """A = Q D Qᵀ as a product of LinearOperators: eigsh finds D's extreme entries; svds of
    SVD-Householder finds |σ|."""
    rng = _rng(3)
    Q = sla.aslinearoperator(hl.cwy(rng.standard_normal((N, N))))
    d = np.linspace(1.0, 10.0, N)
    A = Q @ sla.aslinearoperator(np.diag(d)) @ Q.H
    w = sla.eigsh(A, k=3, which="LA", tol=1e-12, return_eigenvectors=False)
    np.testing.assert_allclose(np.sort(w), d[-3:], rtol=1e-9)
    sigma = np.array([4.0, -3.0, 2.0, 1.0, 0.5])
    W = hl.svd_householder(rng.standard_normal((N, N)), sigma, rng.standard_normal((5, 5)))
    s = sla.svds(W.aslinearoperator(), k=2, tol=1e-12, return_singular_vectors=False)
    np.testing.assert_allclose(np.sort(s), [3.0, 4.0], rtol=1e-9)


def test_float32_stays_float32():
    V = _rng(4).standard_normal((N, 4)).astype(np.float32)
    L = hl.cwy(V).aslinearoperator()
    assert L.dtype == np.float32
    assert L.matvec(np.ones(N, np.float32)).dtype == np.float32


def test_batched_and_wrong_shapes_raise():
    Q = hl.cwy(_rng(5).standard_normal((2, N, 4)))
    with pytest.raises(ValueError, match=r"batched operator \(shape \(2, 30, 30\)\)"):
        Q.aslinearoperator()
    with pytest.raises(ValueError, match="batched operator"):
        Q.matvec(np.ones(N))
    Q = hl.cwy(_rng(5).standard_normal((N, 4)))
    with pytest.raises(ValueError, match=r"x must have shape \(30,\) or \(30, 1\)"):
        Q.matvec(np.ones(N + 1))
    with pytest.raises(ValueError, match=r"X must have shape \(30, B\)"):
        Q.matmat(np.ones(N))


def _operator_on(backend: str, V: np.ndarray):
    if backend == "numpy":
        return hl.cwy(V)
    if backend == "torch":
        return hl.cwy(require("torch").asarray(V))
    if backend == "jax":
        require("jax").config.update("jax_enable_x64", True)
        return hl.cwy(require("jax.numpy").asarray(V))
    return hl.cwy(require("array_api_strict").asarray(V))


@pytest.mark.parametrize("backend", ["numpy", "torch", "jax", "array_api_strict"])
def test_scipy_solvers_on_every_backends_operator(backend):
    """gmres, lsqr, eigs, svds on ``op.aslinearoperator()`` of an operator of each backend
    (issue 41, item 5: a JAX operator's read-only results made gmres fail, a torch operator
    was refused): NumPy arrays in and out, fresh and writable, the dense answer."""
    rng = _rng(6)
    V = rng.standard_normal((N, N))
    op = _operator_on(backend, V)
    Q = hl.cwy(V).matrix()
    L = op.aslinearoperator()
    assert L.dtype == np.float64
    b = rng.standard_normal(N)
    y = L.matvec(b)
    assert isinstance(y, np.ndarray) and y.flags.writeable
    np.testing.assert_allclose(y, Q @ b, atol=PROD_TOL)
    np.testing.assert_allclose(L.rmatmat(b[:, None]), Q.T @ b[:, None], atol=PROD_TOL)
    x, info = sla.gmres(L, b, rtol=1e-12, atol=0.0, restart=N)
    assert info == 0
    np.testing.assert_allclose(x, Q.T @ b, atol=1e-9)  # Q⁻¹ = Qᵀ, ‖Q⁻¹‖ = 1
    x = sla.lsqr(L, b, atol=1e-14, btol=1e-14)[0]
    np.testing.assert_allclose(x, Q.T @ b, atol=1e-9)
    s = sla.svds(L, k=2, tol=1e-12, return_singular_vectors=False)
    np.testing.assert_allclose(s, [1.0, 1.0], rtol=1e-9)  # orthogonal: every σ is 1


def test_torch_operator_of_a_parameter_gives_plain_numpy():
    torch = require("torch")
    V = torch.randn(N, 4, dtype=torch.float64, requires_grad=True)
    Q = hl.cwy(V)
    np.testing.assert_allclose(
        Q.matvec(torch.ones(N)).detach().numpy(), (Q @ torch.ones(N)).detach().numpy(),
        rtol=0, atol=1e-13,
    )  # fmt: skip
    y = Q.aslinearoperator().matvec(np.ones(N))
    assert type(y) is np.ndarray and y.flags.writeable
    np.testing.assert_allclose(
        y, (Q @ torch.ones(N, dtype=torch.float64)).detach().numpy(), rtol=0, atol=1e-13
    )
