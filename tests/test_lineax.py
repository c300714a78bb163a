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
from conftest import LONG, require
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


#: lineax solvers that materialise the operator (``as_matrix``, then a dense factorisation):
#: on our operators they differ only in the dense solver behind the same ``as_matrix``, which
#: is checked on every operator. ``make test`` gives each operator one of them in turn (and
#: each of them several operators), ``make test-long`` every pair: each pair compiles its own
#: program (~0.5 s).
MATERIALISING = ("QR", "SVD", "Auto", "LU")


def _runs(solver: str, i: int, group: tuple[str, ...]) -> bool:
    """Whether the ``i``-th operator meets ``solver`` here (see ``MATERIALISING``)."""
    if LONG or solver not in MATERIALISING:
        return True
    return group[i % len(group)] == solver


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
    for i, (name, op) in enumerate(_ops(rng).items()):
        M = np.asarray(op.matrix())
        m, n = M.shape
        orthogonal = not name.startswith(("svd", "product"))
        if solver == "Orthogonal" and not orthogonal:
            continue
        if solver in ("GMRES", "Normal") and m != n:
            continue  # GMRES: square only; Normal: covered by the square and QR cases
        if not _runs(solver, i, ("QR", "SVD", "Auto")):
            continue
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


# -- complex operators -----------------------------------------------------------------------
#
# Each lineax operator is checked against lineax's own answer for the dense matrix
# ``op.matrix()`` (``lx.MatrixLinearOperator``), in its dtype, and its solves against A⁺b from
# NumPy's complex128 least squares on the same matrix. Bound: C_CPLX·eps·N relative,
# C_CPLX = 50 as PROD_TOL (a few GEMMs of O(1) entries, the triangular inverse of S and one
# LU/QR of the dense matrix, each ≲ N·eps; the library forms the reference in the same
# precision), times κ(W) ≤ 3 for SVD-Householder's solves. The defects this catches (Qᴴ for
# Qᵀ, dropped phases or conjugation, LAPACK's τ read as a reflection) are O(1) errors.

C_CPLX = 50


def _cplx(rng: np.random.Generator, dtype, *shape):
    z = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    return jnp.asarray(z.astype(dtype))


def _complex_ops(rng: np.random.Generator, dtype) -> dict:
    """Every kind of complex operator of the library (with and without phases, transposed,
    conjugate-transposed, conjugated), on JAX arrays of ``dtype``."""
    c = lambda *shape: _cplx(rng, dtype, *shape)  # noqa: E731
    rdt = np.float32 if dtype == np.complex64 else np.float64
    th = lambda k: jnp.asarray(rng.uniform(-np.pi, np.pi, k).astype(rdt))  # noqa: E731
    (qa, tau), _ = scipy.linalg.qr(np.asarray(c(N, 4)), mode="raw")
    qa, tau = jnp.asarray(qa.astype(dtype)), jnp.asarray(tau.astype(dtype))
    sig = jnp.linspace(3.0, 1.0, N, dtype=rdt)
    sig4 = jnp.asarray([3.0, 2.0, 1.5, 1.0], dtype=rdt)
    ops = {
        "cwy": hl.cwy(c(N, 5)),
        "cwy.T": hl.cwy(c(N, 5)).T,
        "cwy.H": hl.cwy(c(N, 5)).H,
        "cwy.conj": hl.cwy(c(N, 5)).conj(),
        "cwy theta": hl.cwy(c(N, 5), theta=th(N)),
        "cwy theta.T": hl.cwy(c(N, 5), theta=th(N)).T,
        "cwy theta.H": hl.cwy(c(N, N), theta=th(N)).H,
        "tcwy": hl.tcwy(c(N, 4)),
        "tcwy.T": hl.tcwy(c(N, 4)).T,
        "tcwy theta": hl.tcwy(c(N, 4), theta=th(4)),
        "tcwy theta.T": hl.tcwy(c(N, 4), theta=th(4)).T,
        "from_lapack": hl.from_lapack(qa, tau),
        "from_lapack.T": hl.from_lapack(qa, tau).T,
        "from_lapack thin": hl.from_lapack(qa, tau, thin=True),
        "svd": hl.svd_householder(c(N, N), sig, c(N, N)),
        "svd theta": hl.svd_householder(c(N, N), sig, c(N, N), theta=th(N)),
        "svd theta.T": hl.svd_householder(c(N, N), sig, c(N, N), theta=th(N)).T,
        "svd tall": hl.svd_householder(c(N, N), sig4, c(4, 4), theta=th(4)),
        "svd wide.H": hl.svd_householder(c(4, 4), sig4, c(N, 6)).H,
    }
    ops["product"] = ops["cwy theta"] @ ops["tcwy.T"].T
    return ops


def _rel(x, ref) -> float:
    x, ref = np.asarray(x), np.asarray(ref)
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize(
    "dtype",
    [
        # the same dtype-generic operators and solvers as complex128, at 32-bit tolerances:
        # ~60 s of XLA compiling on the 2-core CI, so in `make test-long` only
        pytest.param(np.complex64, marks=pytest.mark.long),
        np.complex128,
    ],
    ids=lambda d: d.__name__,
)
def test_complex_operators_equal_lineax_on_the_dense_matrix(dtype):
    """mv, transpose (Qᵀ, not Qᴴ), conj, diagonal, materialise, as_matrix and the solves
    against the same lineax calls on lx.MatrixLinearOperator(op.matrix()); the solves
    (AutoLinearSolver(well_posed=True), QR, LU, Orthogonal; the materialising ones in turn
    outside ``make test-long``: ``MATERIALISING``) against A⁺y of the same matrix."""
    rng = _rng(10)
    tol = C_CPLX * EPS[dtype] * N
    solvers = {
        "Auto": lambda: lx.AutoLinearSolver(well_posed=True),
        "QR": lx.QR,
        "LU": lx.LU,
        "Orthogonal": hlx.Orthogonal,
    }
    checked = 0
    for i, (name, op) in enumerate(_complex_ops(rng, dtype).items()):
        A = hlx.operator(op)
        M = jnp.asarray(op.matrix())
        assert M.dtype == dtype, name
        D = lx.MatrixLinearOperator(M)
        m, n = M.shape
        assert A.in_structure() == jax.ShapeDtypeStruct((n,), dtype), name
        assert A.out_structure() == jax.ShapeDtypeStruct((m,), dtype), name
        x, y = _cplx(rng, dtype, n), _cplx(rng, dtype, m)
        assert _rel(A.mv(x), D.mv(x)) <= tol, name
        assert _rel(A.as_matrix(), M) <= tol, name
        assert _rel(lx.materialise(A).as_matrix(), M) <= tol, name
        assert _rel(A.transpose().mv(y), D.transpose().mv(y)) <= tol, name
        assert _rel(A.T.as_matrix(), M.T) <= tol, name
        assert _rel(lx.conj(A).mv(x), lx.conj(D).mv(x)) <= tol, name
        assert _rel(lx.conj(A.transpose()).as_matrix(), M.conj().T) <= tol, name
        assert _rel(lx.diagonal(A), lx.diagonal(D)) <= tol, name
        Mc = np.asarray(M, np.complex128)
        kappa = float(np.linalg.cond(Mc))
        # what every solver computes: A⁻¹y (square), the least-squares (tall) or minimum-norm
        # (wide) solution, i.e. A⁺y, as lineax's QR on D gives it (to the dtype's rounding)
        ref = np.linalg.lstsq(Mc, np.asarray(y, np.complex128), rcond=None)[0]
        square = ("Auto", "QR", "LU") if m == n else ("QR",)
        for sname, make in solvers.items():
            if sname in ("Auto", "LU") and m != n:
                continue  # lineax's LU and well_posed=True need a square operator
            if sname == "Orthogonal" and not hlx.is_orthogonal(A):
                continue
            if not _runs(sname, i, square):
                continue
            got = lx.linear_solve(A, y, make()).value
            assert got.dtype == dtype
            assert _rel(got, ref) <= tol * kappa, f"{sname} on {name}"
            checked += 1
    assert checked >= (50 if LONG else 30)


def test_complex_orthogonal_solve_is_one_application_of_the_adjoint():
    """Complex: x = Qᴴb (the inverse; Qᵀb would be wrong), in the same three products as for
    real V plus the phase scaling, and no factorisation."""
    rng = _rng(11)
    for op in (
        hl.cwy(_cplx(rng, np.complex128, N, 5)),
        hl.cwy(_cplx(rng, np.complex128, N, 5), theta=jnp.asarray(rng.standard_normal(N))).T,
        hl.tcwy(_cplx(rng, np.complex128, N, 3)),
    ):
        A = hlx.operator(op)
        b = _cplx(rng, np.complex128, op.shape[0])
        text = _program(A, b, hlx.Orthogonal())
        assert text.count("stablehlo.dot_general") == 3
        assert "lapack" not in text
        x = lx.linear_solve(A, b, hlx.Orthogonal()).value
        M = np.asarray(op.matrix())
        np.testing.assert_allclose(x, M.conj().T @ np.asarray(b), atol=PROD_TOL)
        assert _rel(A.mv(x)[: min(M.shape)], np.asarray(b)[: min(M.shape)]) <= PROD_TOL or (
            M.shape[0] > M.shape[1]
        )


def _complex_build(kind: str, phi):
    """A complex operator from real parameters (Re V, Im V, θ or σ): the function whose
    derivative the next test checks. LAPACK: τ = (1 + e^{iφ})/‖v‖² makes I − τvvᴴ unitary
    (eigenvalue λ = −e^{iφ} on v), a generalised reflector as ``zgeqrf`` returns."""

    def build(re, im, theta):
        V = re + 1j * im
        if kind == "cwy":
            return hl.cwy(V, theta=theta)
        if kind == "tcwy.T":
            return hl.tcwy(V[:, :4], theta=theta[:4]).T
        if kind == "lapack":
            a = jnp.tril(V[:, :4], -1)
            v = a + jnp.eye(N, 4)
            tau = (1 + jnp.exp(1j * phi)) / jnp.sum(jnp.abs(v) ** 2, axis=0)
            return hl.from_lapack(a, tau)
        sigma = jnp.linspace(3.0, 1.0, N)
        return hl.svd_householder(V, sigma, V[:, ::-1] * 0.5, theta=theta)

    return build


@pytest.mark.parametrize(
    ("kind", "solver"),
    [("cwy", "QR"), ("cwy", "Orthogonal"), ("tcwy.T", "QR"), ("lapack", "LU"), ("svd", "LU")],
)
def test_grad_of_a_complex_solve_matches_central_differences(kind, solver):
    """jax.grad of a real loss of x = A⁻¹b (A⁺b for the wide T-CWY transpose) with respect to
    the real parameters Re V, Im V, θ and Re b, against a central difference along a random
    direction (complex128; the loss is real, so no Wirtinger convention enters), and jax.jvp
    against the same difference."""
    rng = _rng(12)
    re, im = (jnp.asarray(rng.standard_normal((N, N if kind != "lapack" else 4))) for _ in "ri")
    if kind in ("cwy", "tcwy.T"):
        re, im = re[:, :5], im[:, :5]
    theta = jnp.asarray(rng.uniform(-np.pi, np.pi, N))
    phi = jnp.asarray(rng.uniform(-np.pi, np.pi, 4))
    b_re = jnp.asarray(rng.standard_normal(N if kind != "tcwy.T" else 4))
    b_im = jnp.asarray(rng.standard_normal(b_re.shape))
    make = {"QR": lx.QR, "Orthogonal": hlx.Orthogonal, "LU": lx.LU}[solver]
    build = _complex_build(kind, phi)
    w = _cplx(rng, np.complex128, N)

    def loss(p):
        A = hlx.operator(build(p[0], p[1], p[2]))
        x = lx.linear_solve(A, p[3] + 1j * b_im, make()).value
        return jnp.real(jnp.sum(w[: x.shape[0]] * x**3))

    p = (re, im, theta, b_re)
    g = jax.jit(jax.grad(loss))(p)
    d = tuple(jnp.asarray(rng.standard_normal(q.shape)) for q in p)
    e = 1e-6
    fd = (
        loss(jax.tree.map(lambda a, b: a + e * b, p, d))
        - loss(jax.tree.map(lambda a, b: a - e * b, p, d))
    ) / (2 * e)
    gd = sum(float(jnp.sum(a * b)) for a, b in zip(g, d, strict=True))
    gn = float(jnp.sqrt(sum(jnp.sum(a * a) for a in g)))
    dn = float(jnp.sqrt(sum(jnp.sum(b * b) for b in d)))
    scale = 1.0 + gn * dn
    assert abs(gd - float(fd)) <= 1e-7 * scale
    used = g[:2] + g[3:] if kind == "lapack" else g  # (from_lapack has no θ)
    for q in used:  # every parameter has a derivative (a dropped term would leave zeros)
        assert float(jnp.max(jnp.abs(q))) > 0
    _, tangent = jax.jvp(loss, (p,), (d,))
    assert abs(float(tangent) - float(fd)) <= 1e-7 * scale
