"""The svdRNN parametrization W = Q_U Σ Q_Vᵀ (Zhang, Lei & Dhillon, ICML 2018): theorems as
property tests, the operator against a dense oracle, the constructive inverse, bounded singular
values, and every explicit VJP by the dot-product test — on every backend of ``bk``. Complex W
(Hermitian reflections and phases: W = Q_U diag(e^{iθ}) Σ Q_Vᴴ with real σ and θ) through the
same constructive inverse (``return_phases=True``), and the complex operator's products.

Tolerances: the oracle is the definition in float64 NumPy (dense products of reflections).
Each CWY side is accurate to ~eps·(N + k)·‖T‖ per entry (tests/test_cwy.py), and Σ scales
the error by max|σ|, so results are compared with 10·eps·(m + n + k₁ + k₂)·max(1, ‖T‖)·
max(1, max|σ|) (:func:`helpers.tol`). The constructive inverse adds a backward-stable SVD and
two Householder QRs, each ~eps·size·‖W‖₂, real or complex (Haar unitary samples:
``scipy.stats.unitary_group``). A wrong formula (Σ on the wrong side, Q_V instead of Q_Vᵀ, a
missing sign flip in the inverse, a phase on the wrong side) is off by O(‖W‖).

Backends: property tests on JAX draw from a few fixed shapes (``helpers.few_shapes``) and hand
module-level functions to ``bk.call``, so compilations are shared by the examples.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require, to_numpy
from helpers import (
    EPS,
    crandn,
    few_shapes,
    growth,
    haar_orthogonal,
    haar_stack,
    product_of_reflections,
    tol,
)
from hypothesis import example, given
from hypothesis import strategies as st
from registry import svd_vjp_inputs

import householderla as hl
from householderla.svd import (
    SVDHouseholder,
    bounded_sigma,
    bounded_sigma_vjp,
    svd_householder,
    svd_householder_apply_vjp,
    svd_householder_matrix_vjp,
    svd_householder_params,
)

# -- oracles --------------------------------------------------------------------------------------


def dense_W(U, s, V):
    """Q_U Σ Q_Vᵀ from the definition, float64, broadcast over batch axes."""
    m, n = U.shape[-2], V.shape[-2]
    r = min(m, n)
    s = np.asarray(s, dtype=np.float64)
    Sig = np.zeros(s.shape[:-1] + (m, n))
    Sig[..., np.arange(r), np.arange(r)] = s
    QU, QV = product_of_reflections(U), product_of_reflections(V)
    return QU @ Sig @ np.swapaxes(QV, -1, -2)


def bound(dtype, U, s, V):
    g = max([growth(a) for a in (U, V) if a.shape[-1] > 0] + [1.0])
    size = U.shape[-2] + V.shape[-2] + U.shape[-1] + V.shape[-1]
    return tol(dtype, size, g) * max(1.0, float(np.max(np.abs(s), initial=0.0)))


def _cmp(actual, expected, b):
    a = to_numpy(actual)
    a = a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)
    assert a.shape == np.shape(expected), (a.shape, np.shape(expected))
    err = float(np.max(np.abs(a - expected))) if a.size else 0.0
    assert err <= b, f"max error {err:.3e} > {b:.3e}"


@st.composite
def svd_specs(draw, max_n=4):
    """(m, n, k₁, k₂), batch shapes of U_vecs, sigma, V_vecs (broadcasting), zero columns."""
    m, n = draw(st.integers(1, max_n)), draw(st.integers(1, max_n))
    k1, k2 = draw(st.integers(0, m)), draw(st.integers(0, n))
    b = draw(st.sampled_from([(), (2,)]))
    bu, bs, bv = (draw(st.sampled_from([(), b])) for _ in range(3))
    return {
        "m": m,
        "n": n,
        "k1": k1,
        "k2": k2,
        "bu": bu,
        "bs": bs,
        "bv": bv,
        "seed": draw(st.integers(0, 2**31 - 1)),
        "zeros": draw(st.lists(st.booleans(), min_size=k1 + k2, max_size=k1 + k2)),
    }


#: (m, n, k₁, k₂, batch of U_vecs, of sigma, of V_vecs) on JAX: 1 × 1 with k₁ = 0, m < n with
#: broadcasting batches, m > n with k₂ = 0, square with k = N
FEW_SVD_SHAPES = [
    (1, 1, 0, 1, (), (), ()),
    (3, 4, 2, 4, (2,), (), (2,)),
    (4, 2, 3, 0, (), (2,), ()),
    (4, 4, 4, 4, (), (), ()),
]


def fit_svd_spec(bk, spec):
    """A :func:`svd_specs` spec as ``bk`` runs it: few shapes on JAX, unbatched on dask (a Dask
    operand is never broadcast against a batched operator)."""
    spec = dict(spec)
    keys = ("m", "n", "k1", "k2", "bu", "bs", "bv")
    drawn = tuple(spec[k] for k in keys)
    spec.update(zip(keys, few_shapes(bk, drawn, FEW_SVD_SHAPES, spec["seed"]), strict=True))
    if spec["k1"] + spec["k2"] != len(spec["zeros"]):
        spec["zeros"] = [
            bool((spec["seed"] >> (j + 2)) & 1) for j in range(spec["k1"] + spec["k2"])
        ]
    if bk.operand_only:
        spec.update(bu=(), bs=(), bv=())
    return spec


def make_params(spec):
    rng = np.random.default_rng(spec["seed"])
    m, n, k1, k2 = spec["m"], spec["n"], spec["k1"], spec["k2"]
    U = rng.standard_normal(spec["bu"] + (m, k1))
    V = rng.standard_normal(spec["bv"] + (n, k2))
    z = np.asarray(spec["zeros"], dtype=bool)
    U[..., z[:k1]] = 0.0
    V[..., z[k1:]] = 0.0
    s = rng.uniform(-3.0, 3.0, spec["bs"] + (min(m, n),))
    return U, s, V


def _matrix(U, s, V):
    return svd_householder(U, s, V).matrix()


# module-level: jax.jit caches a compilation per function object (and shapes)
def _apply_and_transpose(U, s, V, x, y):
    return svd_householder(U, s, V) @ x, svd_householder(U, s, V).T @ y


def _transpose_matrix(U, s, V):
    return svd_householder(U, s, V).T.matrix()


def _params_and_back(W):
    p = svd_householder_params(W)
    return p, svd_householder(*p).matrix()


# -- the operator ---------------------------------------------------------------------------------


@pytest.mark.no_dask("W.matrix() has no operand")
@given(spec=svd_specs(), dtype=st.sampled_from([np.float64, np.float32]))
def test_matrix_is_the_definition_and_singular_values_are_abs_sigma(bk, spec, dtype):
    """W = Q_U Σ Q_Vᵀ (Zhang, Lei & Dhillon, ICML 2018 eq. 3/17), and its singular values are |σ| —
    square, m > n
    and m < n, batched with broadcasting, zero reflectors and k = 0 included."""
    spec = fit_svd_spec(bk, spec)
    U, s, V = make_params(spec)
    W = bk.call(_matrix, *(bk.asarray(a, dtype) for a in (U, s, V)))
    assert to_numpy(W).dtype == dtype
    ref = dense_W(U, s, V)
    b = bound(dtype, U, s, V)
    _cmp(W, ref, b)
    sv = np.linalg.svd(to_numpy(W).astype(np.float64), compute_uv=False)
    want = np.sort(np.abs(np.broadcast_to(s, sv.shape)), axis=-1)[..., ::-1]
    # singular values are perturbed by at most ‖ΔW‖₂ ≤ √(mn)·max|ΔW| (Weyl)
    assert np.max(np.abs(sv - want)) <= b * np.sqrt(spec["m"] * spec["n"])


@pytest.mark.no_dask(
    "SVDHouseholder's @ takes no Dask operand yet (test_dask.py::test_svd_householder_operand)"
)
@given(spec=svd_specs(), B=st.sampled_from([None, 1, 3]))
def test_apply_transpose_and_matrix_agree(bk, spec, B):
    """W @ x = W.matrix() @ x = oracle; W.T @ y and W.T.matrix() are the transpose."""
    spec = fit_svd_spec(bk, spec)
    U, s, V = make_params(spec)
    m, n = spec["m"], spec["n"]
    rng = np.random.default_rng(spec["seed"] + 1)
    x = rng.standard_normal((n,) if B is None else (n, B))
    y = rng.standard_normal((m,) if B is None else (m, B))
    params = [bk.param(a) for a in (U, s, V)]
    Wx, WTy = bk.call(_apply_and_transpose, *params, bk.asarray(x), bk.asarray(y))
    WT = bk.call(_transpose_matrix, *params)
    ref = dense_W(U, s, V)
    b = bound(np.float64, U, s, V) * max(1.0, float(np.max(np.abs(x))), float(np.max(np.abs(y))))
    _cmp(Wx, ref @ x, b * n)
    _cmp(WTy, np.swapaxes(ref, -1, -2) @ y, b * m)
    _cmp(WT, np.swapaxes(ref, -1, -2), b)


@pytest.mark.no_dask("a Dask operand is not broadcast against the operator's batch")
def test_batched_equals_loop(bk):
    rng = np.random.default_rng(1)
    U = rng.standard_normal((3, 1, 6, 4))
    s = rng.standard_normal((2, 4))
    V = rng.standard_normal((3, 2, 4, 3))
    x = rng.standard_normal((2, 4, 5))
    f = lambda U, s, V, x: svd_householder(U, s, V) @ x  # noqa: E731
    y = to_numpy(bk.call(f, *(bk.asarray(a) for a in (U, s, V, x))))
    assert y.shape == (3, 2, 6, 5)
    for i in range(3):
        for j in range(2):
            args = (U[i, 0], s[j], V[i, j], x[j])
            yi = to_numpy(bk.call(f, *(bk.asarray(a) for a in args)))
            np.testing.assert_allclose(y[i, j], yi, atol=1e-13)


@pytest.mark.no_dask("broadcast operands and W.mv take no Dask arrays")
def test_matmul_semantics_and_metadata(bk):
    rng = np.random.default_rng(2)
    U, s, V = rng.standard_normal((2, 5, 5)), rng.standard_normal(3), rng.standard_normal((3, 2))
    args = [bk.asarray(a) for a in (U, s, V)]
    W = svd_householder(*args)
    assert isinstance(W, SVDHouseholder) and isinstance(W.T, SVDHouseholder)
    assert W.shape == (2, 5, 3) and W.T.shape == (2, 3, 5) and W.ndim == 3
    assert W.dtype == args[0].dtype and W.T.T.shape == W.shape
    assert "SVDHouseholder" in repr(W) and "(2, 5, 3)" in repr(W)
    assert isinstance(W.Q_U, hl.CWY) and W.Q_U.shape == (2, 5, 5) and W.Q_V.shape == (3, 3)
    if bk.eager:
        import array_api_compat as aac

        assert W.device == aac.device(args[0])
    ref = dense_W(U, s, V)
    for x in (rng.standard_normal(3), rng.standard_normal((3, 4)), rng.standard_normal((1, 3, 2))):
        out = W @ bk.asarray(x)
        assert type(out) is type(args[0])
        np.testing.assert_allclose(to_numpy(out), ref @ x, atol=1e-13)
    r = rng.standard_normal((2, 4, 5))
    if bk.name == "array_api_strict":  # its __matmul__ raises instead of deferring
        with pytest.raises(TypeError):
            bk.asarray(r) @ W
    else:
        np.testing.assert_allclose(to_numpy(bk.asarray(r) @ W), r @ ref, atol=1e-13)
    np.testing.assert_allclose(to_numpy(W.__rmatmul__(bk.asarray(r))), r @ ref, atol=1e-13)
    rv = rng.standard_normal(5)
    np.testing.assert_allclose(to_numpy(W.__rmatmul__(bk.asarray(rv))), rv @ ref, atol=1e-13)
    xv = rng.standard_normal((2, 3))
    np.testing.assert_allclose(
        to_numpy(W.mv(bk.asarray(xv))), np.einsum("bij,bj->bi", ref, xv), atol=1e-13
    )
    np.testing.assert_array_equal(to_numpy(W.sigma), s)  # stored as given


def test_numpy_array_on_the_left_defers_to_the_operator():
    rng = np.random.default_rng(3)
    U, s, V = rng.standard_normal((4, 4)), rng.standard_normal(4), rng.standard_normal((4, 4))
    r = rng.standard_normal((2, 4))
    np.testing.assert_allclose(r @ svd_householder(U, s, V), r @ dense_W(U, s, V), atol=1e-13)


# -- complex sides: W = Q_U diag(e^{iθ}) Σ Q_Vᴴ ---------------------------------------------------


def test_complex_svd_operator_products():
    """With complex reflectors and phases θ: W = Q_U diag(σ e^{iθ}) Q_Vᴴ (σ real), and ``@``,
    ``.H``, ``.T``, ``.conj()`` and the left product are those of W; σ stays real."""
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
    assert op.dtype == np.complex128 and op.sigma.dtype == np.float64
    with pytest.raises(ValueError, match="W is complex"):
        hl.svd_householder_params(W)
    with pytest.raises(TypeError, match="sigma must be real"):
        hl.svd_householder(Uv, s + 0j, Vv)


# -- Theorems 1–4 through the constructive inverse ------------------------------------------------


def _random_W(kind, m, n, batch, rng, complex_=False):
    """W of each kind: real, or complex (independent real and imaginary parts; "orthogonal±"
    is then a unitary matrix of determinant ±1)."""

    def draw(*shape):
        return crandn(rng, *shape) if complex_ else rng.standard_normal(shape)

    if kind == "gaussian":
        return draw(*batch, m, n)
    if kind == "rank_deficient":  # rank ≤ min(m, n) − 1, so at least one σ = 0
        k = min(m, n) - 1
        return draw(*batch, m, k) @ draw(*batch, k, n)
    if kind == "zero":
        return np.zeros(batch + (m, n), dtype=complex if complex_ else float)
    det = {"orthogonal+": 1, "orthogonal-": -1}[kind]
    dtype = np.complex128 if complex_ else np.float64
    Q = [haar_stack(n, [det], dtype, rng)[0] for _ in range(int(np.prod(batch)))]
    return np.reshape(np.stack(Q), batch + (n, n))


#: the dtype of each (field, precision) the constructive inverse draws
INVERSE_DTYPES = {
    ("real", "double"): np.float64,
    ("real", "single"): np.float32,
    ("complex", "double"): np.complex128,
    ("complex", "single"): np.complex64,
}


def _params_phases_and_back(W):
    Uv, s, Vv, theta = svd_householder_params(W, return_phases=True)
    return (Uv, s, Vv), theta, svd_householder(Uv, s, Vv, theta=theta).matrix()


@pytest.mark.no_dask("svd_householder_params takes no Dask arrays")
@pytest.mark.parametrize("field", ["real", "complex"])
@given(
    m=st.integers(1, 5),
    n=st.integers(1, 5),
    kind=st.sampled_from(["gaussian", "rank_deficient", "zero", "orthogonal+", "orthogonal-"]),
    batch=st.sampled_from([(), (3,)]),
    seed=st.integers(0, 2**31 - 1),
    precision=st.sampled_from(["double", "single"]),
)
# a batch of two Gaussian W of these shapes, as well as the drawn ones
@example(m=4, n=4, kind="gaussian", batch=(2,), seed=15, precision="double")
@example(m=6, n=3, kind="gaussian", batch=(2,), seed=15, precision="double")
@example(m=3, n=6, kind="gaussian", batch=(2,), seed=15, precision="double")
@example(m=1, n=1, kind="gaussian", batch=(2,), seed=15, precision="double")
def test_constructive_inverse_reproduces_any_W(bk, field, m, n, kind, batch, seed, precision):
    """Theorems 2 and 4 of Zhang, Lei & Dhillon, ICML 2018 (Theorem 1 for the orthogonal W of both
    determinants):
    every real W — square, rectangular, rank deficient, zero, orthogonal — is reached, with
    2·min(m, n) − 1 ≤ 2·min(m, n) reflectors in total. Complex W likewise with Hermitian
    reflections and phases (``return_phases=True``): W = Q_U diag(e^{iθ}) Σ Q_Vᴴ with real σ
    and real θ, the square factor's last reflector 0 (its phase in θ)."""
    # JAX: few (m, n, batch, precision), a batch in either precision
    few = [(1, 1, (), "double"), (4, 2, (3,), "single"), (3, 5, (3,), "double")]
    m, n, batch, precision = few_shapes(bk, (m, n, batch, precision), few, seed)
    dtype = INVERSE_DTYPES[field, precision]
    if kind.startswith("orthogonal"):
        m = n
    rng = np.random.default_rng(seed)
    W = _random_W(kind, m, n, batch, rng, complex_=field == "complex")
    Wb = bk.asarray(W, dtype)
    if field == "complex":
        (Uv, s, Vv), theta, Wr = bk.call(_params_phases_and_back, Wb)
        theta = to_numpy(theta)
        assert theta.dtype == np.finfo(dtype).dtype and theta.shape == batch + (min(m, n),)
    else:
        (Uv, s, Vv), Wr = bk.call(_params_and_back, Wb)
    Uv, s, Vv = to_numpy(Uv), to_numpy(s), to_numpy(Vv)
    r = min(m, n)
    assert Uv.dtype == Vv.dtype == dtype and s.dtype == np.finfo(dtype).dtype  # σ is real
    assert Uv.shape[-2] == m and Vv.shape[-2] == n and s.shape == batch + (r,)
    k1, k2 = Uv.shape[-1], Vv.shape[-1]
    assert k1 + k2 == 2 * r - 1 <= 2 * r
    assert (k1, k2) == ((r - 1, r) if m <= n else (r, r - 1))
    # σ as the SVD gives it: ≥ 0, descending, and equal to W's singular values
    assert np.all(s >= 0) and np.all(np.diff(s, axis=-1) <= 0)
    sv = np.linalg.svd(W, compute_uv=False)
    nrm = max(1.0, float(np.max(sv, initial=0.0)))
    b = tol(dtype, m + n, 1.0) * nrm * 4  # SVD + two Householder QRs, each ~eps·size·‖W‖₂
    assert np.max(np.abs(s - sv)) <= b
    # lower-trapezoidal vectors (the paper's û_i = [0; u_i] layout)
    assert np.all(np.triu(Uv, 1) == 0) and np.all(np.triu(Vv, 1) == 0)
    _cmp(Wr, W, b)


@pytest.mark.no_dask("W.matrix() has no operand")
@given(
    n=st.integers(1, 5),
    det=st.sampled_from([1, -1]),
    split=st.integers(0, 5),
    seed=st.integers(0, 2**31 - 1),
)
def test_theorem3_orthogonal_with_sigma_one(bk, n, det, split, seed):
    """Theorem 3 of Zhang, Lei & Dhillon, ICML 2018: with σ = 1, k₁ + k₂ ≥ n reflectors reach all
    of O(n). From
    Q = H(a₁)…H(a_n): Q_U = H(a₁)…H(a_{k₁}), Q_V = H(a_n)…H(a_{k₁+1}) (padded with zeros)."""
    n = few_shapes(bk, n, [1, 4], seed)
    rng = np.random.default_rng(seed)
    Q = haar_orthogonal(rng, n, det)
    a = to_numpy(hl.householder_vectors(Q))
    k1 = min(split, n)
    k2 = n - k1 + int(rng.integers(0, 2))  # k₁ + k₂ ≥ n, one zero column sometimes
    k2 = min(k2, n)
    U = a[:, :k1]
    V = np.zeros((n, k2))
    V[:, : n - k1] = a[:, k1:][:, ::-1]
    W = to_numpy(bk.call(_matrix, bk.asarray(U), bk.asarray(np.ones(n)), bk.asarray(V)))
    _cmp(W, Q, tol(np.float64, 2 * n))


def test_rank_deficient_w_documented_behaviour(bk_eager):
    """σ = 0 for a rank-1 W: the singular vectors of the null spaces are not unique, but
    the parameters are finite and reproduce W."""
    bk = bk_eager
    rng = np.random.default_rng(4)
    W = np.outer(rng.standard_normal(5), rng.standard_normal(4))
    Uv, s, Vv = svd_householder_params(bk.asarray(W))
    sn = to_numpy(s)
    assert np.all(sn[1:] <= 1e-14 * sn[0]) and sn[0] > 0
    assert all(np.all(np.isfinite(to_numpy(a))) for a in (Uv, Vv))
    np.testing.assert_allclose(to_numpy(svd_householder(Uv, s, Vv).matrix()), W, atol=1e-13)


# -- explicit VJPs --------------------------------------------------------------------------------


# the dot-product test of both VJPs at every side shape: tests/test_vjp.py, over the registry


def test_vjp_is_the_full_gradient_of_unnormalised_vectors():
    """svdRNN eq. 15: the gradient w.r.t. v has no radial component (W is invariant to the
    scale of v), unlike oRNN eq. 14 which omits the term that removes it."""
    rng = np.random.default_rng(5)
    U, s, V = rng.standard_normal((5, 5)), rng.standard_normal(4), rng.standard_normal((4, 4))
    x, g = rng.standard_normal((4, 3)), rng.standard_normal((5, 3))
    Ub, _, Vb, _ = svd_householder_apply_vjp(U, s, V, x, g)
    assert np.max(np.abs(np.sum(U * Ub, axis=0))) <= 1e-12 * np.max(np.abs(Ub))
    assert np.max(np.abs(np.sum(V * Vb, axis=0))) <= 1e-12 * np.max(np.abs(Vb))
    assert np.max(np.abs(Ub)) > 1e-3  # not trivially zero


def test_vjp_rejects_wrong_cotangent_shape():
    U, s, V, x = np.ones((4, 2)), np.ones(3), np.ones((3, 3)), np.ones((3, 2))
    with pytest.raises(ValueError, match="g must have the shape"):
        svd_householder_apply_vjp(U, s, V, x, np.ones((3, 2)))
    with pytest.raises(ValueError, match="G must have the shape"):
        svd_householder_matrix_vjp(U, s, V, np.ones((3, 4)))


# -- autodiff through the operator agrees with the explicit VJPs ----------------------------------

AUTODIFF_SHAPES = [(4, 4, 3, 4), (5, 3, 3, 2), (3, 5, 2, 4)]


@pytest.mark.parametrize("shape", AUTODIFF_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_torch_autograd_matches_explicit_vjps(shape):
    torch = require("torch")
    m, n, k1, k2 = shape
    rng = np.random.default_rng(6)
    U0, s0, V0 = svd_vjp_inputs(m, n, k1, k2, rng)
    x0, g0, G0 = (rng.standard_normal(sh) for sh in ((n, 3), (2, m, 3), (2, m, n)))
    U, s, V, x = (torch.asarray(a, requires_grad=True) for a in (U0, s0, V0, x0))
    W = svd_householder(U, s, V)
    ((W @ x) * torch.asarray(g0)).sum().backward()
    want = svd_householder_apply_vjp(U0, s0, V0, x0, g0)
    for got, ref in zip((U.grad, s.grad, V.grad, x.grad), want, strict=True):
        np.testing.assert_allclose(got.numpy(), ref, atol=1e-12)
    assert torch.all(U.grad[..., 1] == 0) and torch.all(V.grad[..., 0] == 0)
    for t in (U, s, V):
        t.grad = None
    (svd_householder(U, s, V).matrix() * torch.asarray(G0)).sum().backward()
    want = svd_householder_matrix_vjp(U0, s0, V0, G0)
    for got, ref in zip((U.grad, s.grad, V.grad), want, strict=True):
        np.testing.assert_allclose(got.numpy(), ref, atol=1e-12)


@pytest.mark.parametrize("shape", AUTODIFF_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_jax_grad_matches_explicit_vjps(shape):
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    m, n, k1, k2 = shape
    rng = np.random.default_rng(7)
    U0, s0, V0 = svd_vjp_inputs(m, n, k1, k2, rng)
    x0, g0, G0 = (rng.standard_normal(sh) for sh in ((n, 3), (2, m, 3), (2, m, n)))

    def loss_apply(U, s, V, x):
        return jnp.sum(g0 * (svd_householder(U, s, V) @ x))

    def loss_matrix(U, s, V):
        return jnp.sum(G0 * svd_householder(U, s, V).matrix())

    args = [jnp.asarray(a) for a in (U0, s0, V0, x0)]
    want = svd_householder_apply_vjp(U0, s0, V0, x0, g0)
    got = jax.jit(jax.grad(loss_apply, argnums=(0, 1, 2, 3)))(*args)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), b, atol=1e-12)
    want = svd_householder_matrix_vjp(U0, s0, V0, G0)
    got = jax.jit(jax.grad(loss_matrix, argnums=(0, 1, 2)))(*args[:3])
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), b, atol=1e-12)
    # jax.grad(f)(U, σ, V) traces U only: concrete JAX (and NumPy) arrays mix with the tracer
    for s_, V_ in ((args[1], args[2]), (s0, V0)):
        for tf in (lambda f: f, jax.jit):
            gU = tf(jax.grad(lambda U, s_=s_, V_=V_: loss_matrix(U, s_, V_)))(args[0])
            np.testing.assert_allclose(np.asarray(gU), want[0], atol=1e-12)


# -- bounded singular values (Zhang, Lei & Dhillon, ICML 2018 eq. 8)
# -----------------------------------------------------


@pytest.mark.no_dask("bounded_sigma is not an operator product")
@given(
    s_hat=st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=6),
    # subnormal centres: JAX on CPU flushes them to 0 (issue 12, class 2, still open)
    center=st.floats(0.0, 2.0, allow_subnormal=False),
    radius=st.one_of(st.just(0.0), st.floats(1e-3, 1.0)),
)
def test_bounded_sigma_range_and_exact_formula(bk, s_hat, center, radius):
    sh = np.asarray(s_hat)
    sig = to_numpy(bk.call(lambda s: bounded_sigma(s, center, radius), bk.asarray(sh)))
    # closed interval in floating point (tanh saturates to ±1 exactly); 2 ulps of slack for
    # the rounding of r·t + σ*
    slack = 2 * EPS[np.float64] * (center + radius)
    assert np.all(sig >= center - radius - slack) and np.all(sig <= center + radius + slack)
    # eq. 8 as printed, evaluated stably: 2r(sigmoid(ŝ) − ½) + σ*
    f = np.where(
        sh >= 0, 1 / (1 + np.exp(-np.abs(sh))), np.exp(-np.abs(sh)) / (1 + np.exp(-np.abs(sh)))
    )
    ref = 2 * radius * (f - 0.5) + center
    np.testing.assert_allclose(sig, ref, rtol=0, atol=8 * EPS[np.float64] * (center + radius + 1))
    # strictly inside for moderate ŝ, where r·(1 − tanh(|ŝ|/2)) ≥ 1e-3·4e-9 is far above an ulp
    mod = np.abs(sh) < 20
    if radius > 0:
        assert np.all(sig[mod] > center - radius) and np.all(sig[mod] < center + radius)


def test_bounded_sigma_saturation_is_finite_and_dtype_preserving(bk_eager):
    bk = bk_eager
    s = bk.asarray([-1e4, -40.0, 0.0, 40.0, 1e4], dtype=np.float32)
    out = bounded_sigma(s, 1.0, 0.1)
    assert out.dtype == s.dtype
    np.testing.assert_allclose(to_numpy(out), [0.9, 0.9, 1.0, 1.1, 1.1], rtol=1e-6)
    gbar = to_numpy(bounded_sigma_vjp(s, 1.0, 0.1, bk.xp.ones_like(s)))
    assert np.all(np.isfinite(gbar)) and gbar[0] == 0 and gbar[-1] == 0
    assert gbar[2] == pytest.approx(0.05)  # r/2 at ŝ = 0


def test_bounded_sigma_autodiff_matches_vjp():
    torch = require("torch")
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(9)
    s0, g0 = rng.standard_normal(5) * 4, rng.standard_normal(5)
    want = bounded_sigma_vjp(s0, 1.0, 0.3, g0)
    s = torch.asarray(s0, requires_grad=True)
    (bounded_sigma(s, 1.0, 0.3) * torch.asarray(g0)).sum().backward()
    np.testing.assert_allclose(s.grad.numpy(), want, atol=1e-14)
    gj = jax.grad(lambda s: jax.numpy.sum(g0 * bounded_sigma(s, 1.0, 0.3)))(jax.numpy.asarray(s0))
    np.testing.assert_allclose(np.asarray(gj), want, atol=1e-14)


def test_bounded_sigma_bad_input():
    with pytest.raises(ValueError, match="radius"):
        bounded_sigma(np.zeros(3), 1.0, -0.1)
    with pytest.raises(ValueError, match="radius"):
        bounded_sigma(np.zeros(3), 1.0, np.array([0.1, -0.1, 0.1]))
    with pytest.raises(ValueError, match="radius"):
        bounded_sigma(np.zeros(3), 1.0, float("nan"))
    with pytest.raises(TypeError, match="radius"):
        bounded_sigma(np.zeros(3), 1.0, True)
    with pytest.raises(ValueError, match="g must have the shape"):
        bounded_sigma_vjp(np.zeros(3), 1.0, 0.1, np.zeros(4))


# -- bad input ------------------------------------------------------------------------------------


def test_bad_shapes_name_the_argument():
    U, s, V = np.ones((4, 3)), np.ones(3), np.ones((3, 2))
    with pytest.raises(ValueError, match="sigma"):
        svd_householder(U, np.ones(4), V)
    with pytest.raises(ValueError, match="sigma"):
        svd_householder(U, np.float64(1.0), V)
    with pytest.raises(ValueError, match="U_vecs"):
        svd_householder(np.ones((4, 5)), s, V)  # k₁ > m
    with pytest.raises(ValueError, match="V_vecs"):
        svd_householder(U, s, np.ones((3, 4)))  # k₂ > n
    with pytest.raises(ValueError, match="U_vecs"):
        svd_householder(np.ones(4), s, V)
    with pytest.raises(ValueError, match="sigma"):  # m of U_vecs does not match sigma
        svd_householder(np.ones((2, 2)), s, V)
    with pytest.raises(ValueError, match="batch shapes"):
        svd_householder(np.ones((2, 4, 3)), np.ones((3, 3)), V)
    with pytest.raises(ValueError, match="m, n >= 1"):
        svd_householder(np.ones((0, 0)), np.ones(0), V)
    W = svd_householder(U, s, V)
    with pytest.raises(ValueError, match="x"):
        W @ np.ones(4)  # x must have n = 3 rows
    with pytest.raises(ValueError, match="x"):
        W @ np.ones((4, 2))
    with pytest.raises(ValueError, match="x"):
        svd_householder_apply_vjp(U, s, V, np.ones((4, 2)), np.ones((4, 2)))
    with pytest.raises(ValueError, match="W"):
        svd_householder_params(np.ones(3))
    with pytest.raises(ValueError, match="W"):
        svd_householder_params(np.ones((3, 0)))


def test_nan_and_dtypes(bk_eager):
    bk = bk_eager
    U, s, V = np.ones((4, 3)), np.ones(3), np.ones((3, 2))
    for i, name in enumerate(("U_vecs", "sigma", "V_vecs")):
        args = [U.copy(), s.copy(), V.copy()]
        args[i].flat[0] = np.nan
        with pytest.raises(ValueError, match=name):
            svd_householder(*(bk.asarray(a) for a in args))
    Wn = np.ones((3, 3))
    Wn[1, 1] = np.inf
    with pytest.raises(ValueError, match="W contains NaN or Inf"):
        svd_householder_params(bk.asarray(Wn))
    with pytest.raises(TypeError, match="sigma"):
        svd_householder(bk.asarray(U), bk.asarray(s, np.complex128), bk.asarray(V))
    # integers are promoted to the namespace's default float, as resolve does
    Ui, si, Vi = (bk.asarray(a, np.int64) for a in ([[1, 0], [1, 1], [0, 2]], [3, 1], [[1], [2]]))
    W = svd_householder(Ui, si, Vi)
    default = bk.xp.__array_namespace_info__().default_dtypes()["real floating"]
    assert W.dtype == default and W.matrix().dtype == default
    ref = dense_W(*(np.asarray(a, float) for a in ([[1, 0], [1, 1], [0, 2]], [3, 1], [[1], [2]])))
    np.testing.assert_allclose(to_numpy(W.matrix()), ref, atol=1e-5)
    p = svd_householder_params(bk.asarray([[2, 0], [0, 1]], np.int64))
    assert all(a.dtype == default for a in p)
    # float32 parameters with a float64 operand promote like matmul
    W32 = svd_householder(*(bk.asarray(a, np.float32) for a in (U, s, V)))
    assert (W32 @ bk.asarray(np.ones(3))).dtype == bk.asarray(np.ones(1)).dtype


def test_inputs_are_not_mutated(bk_eager):
    """With numpy_readonly every input is a read-only array, so any write raises."""
    bk = bk_eager
    rng = np.random.default_rng(10)
    arrays = [rng.standard_normal(sh) for sh in ((5, 5), (4,), (4, 3), (4, 2), (5, 2), (5, 4))]
    U, s, V, x, g, G = (bk.asarray(a) for a in arrays)
    W = svd_householder(U, s, V)
    W @ x
    W.T @ g
    W.matrix()
    svd_householder_params(G)
    svd_householder_apply_vjp(U, s, V, x, g)
    svd_householder_matrix_vjp(U, s, V, G)
    bounded_sigma_vjp(s, 1.0, 0.1, bounded_sigma(s, 1.0, 0.1))
    for a, a0 in zip((U, s, V, x, g, G), arrays, strict=True):
        np.testing.assert_array_equal(to_numpy(a), a0)


def test_zero_reflectors_have_zero_gradient_never_nan():
    rng = np.random.default_rng(11)
    U, V = np.zeros((4, 3)), np.zeros((4, 4))
    s, x, g = rng.standard_normal(4), rng.standard_normal((4, 2)), rng.standard_normal((4, 2))
    Ub, sb, Vb, xb = svd_householder_apply_vjp(U, s, V, x, g)
    assert np.all(Ub == 0) and np.all(Vb == 0)
    # W = diag(σ): σ̄ sums two products of entries below ~3 (rounded in another order than
    # np.sum's: a few eps of |σ̄| ≤ 10), x̄ = σ g exactly
    np.testing.assert_allclose(sb, np.sum(g * x, axis=-1), rtol=0, atol=40 * np.finfo(float).eps)
    np.testing.assert_array_equal(xb, s[:, None] * g)
