"""householderla operators as lineax operators (issue 14, item 1; lineax issue 6).

Checked against dense linear algebra on ``op.matrix()`` in float64: single products and the
dense matrix to a few eps·N (``PROD_TOL``); solves of the orthogonal operators (condition 1)
to the same order, those of SVD-Householder (condition κ) to κ times it; gradients of a solve
with respect to the reflectors against central differences (ε = 1e-6, truncation O(ε²) and
rounding O(eps/ε) ≲ 1e-9 relative; bound 1e-7, a wrong term is off by O(1)).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from conftest import require
from helpers import EPS

import householderla as hl

jax = require("jax")
lx = require("lineax")
import jax.numpy as jnp  # noqa: E402

jax.config.update("jax_enable_x64", True)
hlx = hl.lineax

N = 12
PROD_TOL = 50 * N * EPS[np.float64]  # a few GEMMs and a triangular inverse, entries O(1)


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _ops(rng: np.random.Generator) -> dict:
    """Every kind of operator of the library, on JAX arrays."""
    j = lambda *shape: jnp.asarray(rng.standard_normal(shape))  # noqa: E731
    a = rng.standard_normal((N, 4))
    (qa, tau), _ = scipy.linalg.qr(a, mode="raw")
    ops = {
        "cwy": hl.cwy(j(N, 5)),
        "cwy.T": hl.cwy(j(N, 5)).T,
        "cwy full": hl.cwy(j(N, N)),
        "tcwy": hl.tcwy(j(N, 4)),
        "tcwy.T": hl.tcwy(j(N, 4)).T,
        "from_lapack": hl.from_lapack(jnp.asarray(qa), jnp.asarray(tau)),
        "from_lapack thin": hl.from_lapack(jnp.asarray(qa), jnp.asarray(tau), thin=True),
        "svd square": hl.svd_householder(j(N, N), jnp.linspace(3.0, 1.0, N), j(N, N)),
        "svd tall": hl.svd_householder(j(N, N), jnp.asarray([3.0, 2.0, 1.5, 1.0]), j(4, 4)),
        "svd wide": hl.svd_householder(j(4, 4), jnp.asarray([3.0, 2.0, 1.5, 1.0]), j(N, 6)),
    }
    ops["product"] = ops["cwy"] @ ops["tcwy"]
    return ops


def test_products_transpose_and_matrix_equal_dense():
    rng = _rng(0)
    for name, op in _ops(rng).items():
        A = hlx.operator(op)
        M = np.asarray(op.matrix())
        m, n = M.shape
        assert A.in_structure() == jax.ShapeDtypeStruct((n,), jnp.float64), name
        assert A.out_structure() == jax.ShapeDtypeStruct((m,), jnp.float64), name
        x, y = rng.standard_normal(n), rng.standard_normal(m)
        np.testing.assert_allclose(A.mv(jnp.asarray(x)), M @ x, atol=PROD_TOL, err_msg=name)
        np.testing.assert_allclose(A.T.mv(jnp.asarray(y)), M.T @ y, atol=PROD_TOL, err_msg=name)
        np.testing.assert_allclose(A.as_matrix(), M, atol=PROD_TOL, err_msg=name)
        np.testing.assert_allclose(A.transpose().as_matrix(), M.T, atol=PROD_TOL, err_msg=name)
        if isinstance(A, hlx.CWYLinearOperator):
            k = min(m, n)  # lineax's diagonal, without the N x N matrix
            np.testing.assert_allclose(lx.diagonal(A), np.diag(M)[:k], atol=PROD_TOL)


@pytest.mark.parametrize(
    "solver", ["Orthogonal", "QR", "SVD", "Normal", "Auto", "GMRES"], ids=lambda s: s
)
def test_solves_equal_dense_least_squares(solver):
    """Square: A⁻¹b; tall: the least-squares solution; wide: the minimum-norm solution —
    all A⁺b, which np.linalg.lstsq computes from the dense matrix."""
    rng = _rng(1)
    make = {
        "Orthogonal": hlx.Orthogonal,
        "QR": lx.QR,
        "SVD": lx.SVD,
        "Normal": lambda: lx.Normal(lx.Cholesky()),
        "Auto": lambda: lx.AutoLinearSolver(well_posed=None),
        "GMRES": lambda: lx.GMRES(rtol=1e-13, atol=1e-13),
    }[solver]
    checked = 0
    for name, op in _ops(rng).items():
        M = np.asarray(op.matrix())
        m, n = M.shape
        orthogonal = not name.startswith(("svd", "product"))
        if solver == "Orthogonal" and not orthogonal:
            continue
        if solver in ("GMRES", "Normal") and m != n:
            continue  # GMRES: square only; Normal: covered by the square and QR cases
        b = rng.standard_normal(m)
        x = lx.linear_solve(hlx.operator(op), jnp.asarray(b), make()).value
        kappa = np.linalg.cond(M)
        ref = np.linalg.lstsq(M, b, rcond=None)[0]
        tol = (1e-9 if solver == "GMRES" else PROD_TOL) * kappa**2  # κ² for Normal
        np.testing.assert_allclose(x, ref, atol=tol, err_msg=f"{solver} on {name}")
        checked += 1
    assert checked >= 3


def _program(A, b, solver) -> str:
    """The lowered (StableHLO) text of a jitted solve."""
    return jax.jit(lambda A, b: lx.linear_solve(A, b, solver).value).lower(A, b).as_text()


def test_orthogonal_solve_is_one_application_of_the_transpose():
    """The compiled program has three matrix products (Uᵀb, M·a, U·c) and no factorisation
    (no LAPACK call: QR on the same operator needs geqrf, ormqr and a triangular solve)."""
    rng = _rng(2)
    for op in (hl.cwy(jnp.asarray(rng.standard_normal((N, 5)))), hl.tcwy(jnp.ones((N, 3)))):
        A = hlx.operator(op)
        b = jnp.ones(op.shape[0])

        text = _program(A, b, hlx.Orthogonal())
        assert text.count("stablehlo.dot_general") == 3
        # no factorisation: LAPACK's geqrf on the CPU, cuSOLVER's on a GPU (the default
        # device there: custom call "cusolver_geqrf_ffi")
        assert "geqrf" not in text and "lapack" not in text and "cusolver" not in text
        assert "geqrf" in _program(A, b, lx.QR())  # the check can fail


def test_tags_and_orthogonal_solver_contract():
    rng = _rng(3)
    A = hlx.operator(hl.tcwy(jnp.asarray(rng.standard_normal((N, 3)))))
    assert hlx.orthogonal_tag in A.tags and hlx.orthogonal_tag in A.T.tags
    assert hlx.is_orthogonal(A) and hlx.is_orthogonal(A.T)
    Q = hlx.operator(hl.cwy(jnp.asarray(rng.standard_normal((N, 4)))))
    assert hlx.is_orthogonal(Q @ Q.T)
    assert not hlx.is_orthogonal(A @ A.T)  # a projection, not orthogonal
    for query in (
        lx.is_symmetric,
        lx.is_diagonal,
        lx.is_lower_triangular,
        lx.is_positive_semidefinite,
    ):
        assert not query(Q)
    dense = lx.MatrixLinearOperator(jnp.asarray(Q.as_matrix()))
    with pytest.raises(ValueError, match="orthonormal columns or rows"):
        lx.linear_solve(dense, jnp.ones(N), hlx.Orthogonal())
    tagged = lx.MatrixLinearOperator(dense.matrix, hlx.orthogonal_tag)
    x = lx.linear_solve(tagged, jnp.ones(N), hlx.Orthogonal()).value
    np.testing.assert_allclose(x, dense.matrix.T @ jnp.ones(N), atol=PROD_TOL)


def _central_difference(f, V, dV, eps=1e-6):
    return (f(V + eps * dV) - f(V - eps * dV)) / (2 * eps)


@pytest.mark.parametrize(
    ("kind", "solver"),
    [
        ("cwy", "QR"),
        ("cwy", "Orthogonal"),
        ("tcwy", "Orthogonal"),
        ("tcwy", "QR"),
        ("lapack", "LU"),
    ],
)
def test_grad_and_jvp_of_a_solve_with_respect_to_the_reflectors(kind, solver):
    rng = _rng(4)
    V = jnp.asarray(rng.standard_normal((N, 4)))
    b = jnp.asarray(rng.standard_normal(N))
    w = jnp.asarray(rng.standard_normal(N if kind != "tcwy" else 4))
    make = {"QR": lx.QR, "Orthogonal": hlx.Orthogonal, "LU": lx.LU}[solver]

    def build(V):
        if kind == "lapack":
            # V's columns below the diagonal as LAPACK's reflectors (τ = 2/‖v‖²)
            a = jnp.tril(V, -1)
            v = a + jnp.eye(N, 4)
            tau = 2 / jnp.sum(v * v, axis=0)
            return hl.from_lapack(a, tau)
        return (hl.cwy if kind == "cwy" else hl.tcwy)(V)

    def loss(V):
        x = lx.linear_solve(hlx.operator(build(V)), b, make()).value
        return jnp.sum(w * x**3)

    g = jax.jit(jax.grad(loss))(V)
    dV = jnp.asarray(rng.standard_normal(V.shape))
    fd = _central_difference(loss, V, dV)
    scale = 1.0 + float(jnp.linalg.norm(g) * jnp.linalg.norm(dV))
    assert abs(float(jnp.sum(g * dV)) - float(fd)) <= 1e-7 * scale
    _, tangent = jax.jvp(loss, (V,), (dV,))
    assert abs(float(tangent) - float(fd)) <= 1e-7 * scale


def test_grad_with_respect_to_singular_values():
    rng = _rng(5)
    Uv, Vv = jnp.asarray(rng.standard_normal((N, N))), jnp.asarray(rng.standard_normal((6, 6)))
    b = jnp.asarray(rng.standard_normal(N))

    def loss(sigma):
        A = hlx.operator(hl.svd_householder(Uv, sigma, Vv))
        return jnp.sum(lx.linear_solve(A, b, lx.QR()).value ** 2)

    sigma = jnp.asarray([3.0, 2.5, 2.0, 1.5, 1.2, 1.0])
    g = jax.grad(loss)(sigma)
    d = jnp.asarray(rng.standard_normal(6))
    fd = _central_difference(loss, sigma, d)
    assert abs(float(jnp.sum(g * d)) - float(fd)) <= 1e-7 * (1.0 + float(jnp.linalg.norm(g)))


def test_jit_vmap_and_float32():
    rng = _rng(6)
    Vs = jnp.asarray(rng.standard_normal((3, N, 4)))
    bs = jnp.asarray(rng.standard_normal((3, N)))

    @jax.jit
    @jax.vmap
    def solve(V, b):  # one operator per matrix of the batch
        return lx.linear_solve(hlx.operator(hl.cwy(V)), b, hlx.Orthogonal()).value

    xs = solve(Vs, bs)
    for i in range(3):
        M = np.asarray(hl.cwy(Vs[i]).matrix())
        np.testing.assert_allclose(xs[i], M.T @ np.asarray(bs[i]), atol=PROD_TOL)
    A32 = hlx.operator(hl.cwy(Vs[0].astype(jnp.float32)))
    assert A32.in_structure().dtype == jnp.float32
    x32 = lx.linear_solve(A32, bs[0].astype(jnp.float32), lx.QR()).value
    assert x32.dtype == jnp.float32
    np.testing.assert_allclose(x32, xs[0], atol=100 * N * EPS[np.float32])


def test_bad_operators_say_why():
    rng = _rng(7)
    with pytest.raises(ValueError, match=r"batched operator \(shape \(2, 12, 12\)\)"):
        hlx.operator(hl.cwy(jnp.asarray(rng.standard_normal((2, N, 3)))))
    with pytest.raises(TypeError, match="householderla operator"):
        hlx.operator(jnp.eye(3))
    # NumPy operators are converted
    A = hlx.operator(hl.cwy(rng.standard_normal((N, 3))))
    assert isinstance(A.U, jax.Array)
    torch = require("torch")
    with pytest.raises(TypeError, match="lineax operators need JAX"):
        hlx.operator(hl.cwy(torch.ones(N, 2, dtype=torch.float64)))
