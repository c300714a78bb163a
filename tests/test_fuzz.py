"""Fuzz suite (issue 12): every public map against an oracle it shares no code with, on inputs
drawn across scales (1e-300 … 1e300), zero columns, empty batches and memory layouts
(C, Fortran, negative strides, read-only).

Oracles: explicit products of H(v) = I − 2vvᵀ/‖v‖² in float64 (computed on the unit-scaled
column, which defines the same reflection), ``scipy.linalg.polar``, ``scipy.linalg.qr`` (signs
fixed to a positive diagonal) and a dense Cayley solve. ``make test`` runs the "ci" profile (a
few dozen examples per test); ``make fuzz`` runs ``HYPOTHESIS_PROFILE=fuzz`` (thousands).
Tolerances: outputs are orthogonal (entries ≤ 1), so the error bound is c·eps·N with c = 50,
times the conditioning where an inverse enters (the CWY factor T, Cayley's I + A/2).
"""

from __future__ import annotations

import re

import array_api_compat
import numpy as np
import pytest
import scipy.linalg
from conftest import require, to_numpy
from helpers import (
    EPS,
    examples,
    few_shapes,
    growth,
    haar_orthogonal,
    product_of_reflections,
    stable_seed,
)
from hypothesis import assume, given
from hypothesis import strategies as st

import householderla as hl

LAYOUTS = ("C", "F", "negative", "readonly")


def layout(a: np.ndarray, how: str) -> np.ndarray:
    """The same values in another memory layout (never a different matrix)."""
    if how == "F":
        return np.asfortranarray(a)
    if how == "negative":  # negative strides on the last two axes
        return np.ascontiguousarray(a[..., ::-1, ::-1])[..., ::-1, ::-1]
    if how == "readonly":
        a = a.copy()
        a.flags.writeable = False
        return a
    return np.ascontiguousarray(a)


@st.composite
def reflectors(draw, square: bool = False):
    """V (batch, N, L), columns at scales 10^k (k ∈ [-300, 300]), some zero."""
    n = draw(st.integers(1, 6))
    L = n if square else draw(st.integers(0, n))
    batch = draw(st.sampled_from([(), (2,), (0,), (2, 1)]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    V = rng.standard_normal((*batch, n, L))
    exps = draw(st.lists(st.integers(-300, 300), min_size=L, max_size=L))
    zero = draw(st.lists(st.booleans(), min_size=L, max_size=L))
    scale = np.array([0.0 if z else 10.0**e for e, z in zip(exps, zero, strict=True)])
    return V, V * scale, draw(st.sampled_from(LAYOUTS))


def _unit(V: np.ndarray) -> np.ndarray:
    """The unit-scale columns (0 stays 0): the reflections the oracle multiplies."""
    m = np.max(np.abs(V), axis=-2, keepdims=True) if V.shape[-2] else np.zeros(V.shape)
    return np.divide(V, m, out=np.zeros_like(V), where=m > 0)


def _oracle_product(V: np.ndarray) -> np.ndarray:
    n = V.shape[-2]
    if V.size == 0:
        return np.broadcast_to(np.eye(n), (*V.shape[:-2], n, n)).copy()
    return product_of_reflections(_unit(V))


@given(data=reflectors())
def test_cwy_apply_and_matrix_match_the_definition(data):
    _, V, how = data
    Vl = layout(V, how)
    Q = _oracle_product(V)
    n = V.shape[-2]
    h = np.linspace(-1.0, 1.0, n * 3).reshape(n, 3)
    bound = 50 * EPS[np.float64] * max(n, 1) * max(growth(_unit(V)) if V.size else 1.0, 1.0)
    np.testing.assert_allclose(hl.cwy(Vl).matrix(), Q, atol=bound)
    np.testing.assert_allclose(hl.cwy(Vl) @ h, Q @ h, atol=bound)
    np.testing.assert_allclose(hl.cwy(Vl).T @ h, np.swapaxes(Q, -1, -2) @ h, atol=bound)
    np.testing.assert_allclose(hl.householder_apply(Vl, h), Q @ h, atol=bound)
    np.testing.assert_allclose(hl.tcwy(Vl).matrix(), Q[..., : V.shape[-1]], atol=bound)
    assert np.array_equal(Vl, layout(V, how))  # the input was not written


@given(data=reflectors(square=True), det=st.sampled_from([1, -1]))
def test_constructive_inverse_of_a_scaled_orthogonal_matrix(data, det):
    V0, _, how = data
    assume(V0.shape[-1] > 0 and V0.size)
    Q, _ = np.linalg.qr(V0)
    Q = Q.copy()
    Q[..., :, 0] *= det * np.sign(np.linalg.det(Q))[..., None]
    c = 10.0 ** float(np.random.default_rng(V0.size).integers(-300, 300))
    W = hl.householder_vectors(layout(c * Q, how))
    bound = 50 * EPS[np.float64] * Q.shape[-1]
    np.testing.assert_allclose(hl.cwy(W).matrix(), Q, atol=bound)


@given(
    seed=st.integers(0, 2**31 - 1),
    shape=st.sampled_from([(5, 2), (4, 4), (3, 6), (2, 5, 3)]),
    c_exp=st.integers(-300, 300),
    how=st.sampled_from(LAYOUTS),
)
def test_polar_and_qr_match_scipy(seed, shape, c_exp, how):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal(shape)
    Xc = layout(X * 10.0**c_exp, how)
    kappa = np.linalg.cond(X) if X.ndim == 2 else max(np.linalg.cond(x) for x in X)
    assume(kappa < 1e6)
    bound = 50 * EPS[np.float64] * max(shape) * kappa
    ref = np.stack([scipy.linalg.polar(x)[0] for x in X.reshape(-1, *shape[-2:])])
    np.testing.assert_allclose(hl.polar(Xc), ref.reshape(shape), atol=bound)
    if shape[-1] <= shape[-2]:
        q, r = np.linalg.qr(X)
        q = q * np.sign(np.diagonal(r, axis1=-2, axis2=-1))[..., None, :]
        np.testing.assert_allclose(hl.qr_retraction(Xc, np.zeros(shape)), q, atol=bound)


@given(
    seed=st.integers(0, 2**31 - 1),
    z_exp=st.integers(-300, 300),
    step=st.floats(-2.0, 2.0),
    metric=st.sampled_from(["canonical", "euclidean"]),
)
def test_cayley_matches_the_dense_solve(seed, z_exp, step, metric):
    """Cayley along Z = −riemannian_gradient(X, G, metric) is the dense Cayley step of that
    metric; the direction at 10^k with step/10^k gives the same point."""
    rng = np.random.default_rng(seed)
    X = np.linalg.qr(rng.standard_normal((6, 2)))[0]
    G = rng.standard_normal((6, 2))
    Gt = G if metric == "canonical" else G - 0.5 * X @ (X.T @ G)
    A = Gt @ X.T - X @ Gt.T
    eye = np.eye(6)
    ref = np.linalg.solve(eye + step / 2 * A, (eye - step / 2 * A) @ X)
    c = 10.0**z_exp
    Z = -hl.riemannian_gradient(X, G, metric=metric)
    Y = hl.cayley_retraction(X, Z * c, step / c)
    bound = 50 * EPS[np.float64] * 6 * np.linalg.cond(eye + step / 2 * A)
    np.testing.assert_allclose(Y, ref, atol=bound)


@pytest.mark.parametrize("how", LAYOUTS)
def test_layouts_on_every_backend_entry(bk_eager, how):
    """Non-contiguous, Fortran-order, negative-stride and read-only NumPy input converted to
    each eager backend gives the C-order answer."""
    rng = np.random.default_rng(7)
    V = rng.standard_normal((5, 3))
    ref = to_numpy(hl.cwy(bk_eager.asarray(V)).matrix())
    out = to_numpy(hl.cwy(bk_eager.asarray(layout(V, how))).matrix())
    np.testing.assert_allclose(out, ref, atol=10 * EPS[np.float64])


# -- every public map on every eager backend, across scales ----------------------------------

#: (batch, N, L) per backend that compiles per shape (JAX): a few fixed shapes, so the
#: compilations are shared by the examples (helpers.few_shapes)
FEW = [((), 4, 2), ((2,), 5, 5), ((), 1, 1)]


@st.composite
def scaled_reflectors(draw, bk):
    """(V at unit scale, the same columns at scales 10^k, k ∈ [−300, 300], some zero)."""
    seed = draw(st.integers(0, 2**31 - 1))
    n = draw(st.integers(1, 6))
    drawn = (draw(st.sampled_from([(), (2,)])), n, draw(st.integers(1, n)))
    batch, n, L = few_shapes(bk, drawn, FEW, seed)
    V = np.random.default_rng(seed).standard_normal((*batch, n, L))
    exps = draw(st.lists(st.integers(-300, 300), min_size=L, max_size=L))
    zero = draw(st.lists(st.booleans(), min_size=L, max_size=L))
    scale = np.array([0.0 if z else 10.0**e for e, z in zip(exps, zero, strict=True)])
    return V * (scale > 0), V * scale


@given(data=st.data())
@examples(15)
def test_reflector_maps_and_vjps_on_every_backend(bk_eager, data):
    """cwy, tcwy, householder_apply and their VJPs on each eager backend, with columns at
    10^±300: the maps equal the float64 definition on the unit-scale columns; the VJPs are
    scale-covariant (f(cv) = f(v) per column, so ∂f/∂V at cV is (1/c) ∂f/∂V at V, checked as
    c·ḡ(cV) = ḡ(V) column by column; ḡ(V) itself is checked against finite differences in
    test_vjp.py). Bound 50·eps·N·growth as above; the VJP comparison is relative to ‖ḡ(V)‖."""
    bk = bk_eager
    _, V = data.draw(scaled_reflectors(bk))
    n, L = V.shape[-2:]
    Q = product_of_reflections(_unit(V))
    h = np.linspace(-1.0, 1.0, n * 2).reshape(n, 2)
    g = np.broadcast_to(np.cos(np.arange(n * 2.0)).reshape(n, 2), (*V.shape[:-2], n, 2)).copy()
    bound = 50 * EPS[np.float64] * n * max(growth(_unit(V)), 1.0)
    Vb, hb, gb = bk.asarray(V), bk.asarray(h), bk.asarray(g)
    np.testing.assert_allclose(to_numpy(hl.cwy(Vb).matrix()), Q, atol=bound)
    np.testing.assert_allclose(to_numpy(hl.cwy(Vb).T @ hb), np.swapaxes(Q, -1, -2) @ h, atol=bound)
    np.testing.assert_allclose(to_numpy(hl.tcwy(Vb).matrix()), Q[..., :L], atol=bound)
    np.testing.assert_allclose(to_numpy(hl.householder_apply(Vb, hb)), Q @ h, atol=bound)
    V1 = _unit(V)  # columns of max-abs 1: there ḡ is O(‖g‖·‖h‖) and its rounding O(eps)
    c = np.max(np.abs(V), axis=-2, keepdims=True)
    c = np.where(c > 0, c, 1.0)  # V = c·V1 column by column
    for vjp in (hl.vjp.cwy_apply, hl.vjp.householder_apply):
        Vbar, hbar = (to_numpy(a) for a in vjp(Vb, hb, gb))
        Vbar1, hbar1 = (to_numpy(a) for a in vjp(bk.asarray(V1), hb, gb))
        scale = np.abs(Vbar1).max() + np.abs(hbar1).max() + 1.0
        np.testing.assert_allclose(hbar, hbar1, atol=bound * scale)
        live = (np.max(np.abs(V), axis=-2, keepdims=True) > 0) & np.ones_like(V, bool)
        np.testing.assert_allclose(
            np.where(live, Vbar * c, 0.0), np.where(live, Vbar1, 0.0), atol=bound * scale
        )


@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(2, 6),
    c_exp=st.integers(-300, 300),
    det=st.sampled_from([1, -1]),
)
@examples(12)
def test_constructive_inverses_of_scaled_matrices_on_every_backend(bk_eager, seed, n, c_exp, det):
    """householder_vectors, ornn_params, tcwy_vectors and svd_householder_params of c·Q
    (c = 10^k, k ∈ [−300, 300]) rebuild Q (and, for SVD-Householder, c·Q with singular
    values c) on each eager backend; Q is Haar-distributed with the drawn determinant."""
    bk = bk_eager
    n = few_shapes(bk, n, [3, 5], seed)
    Q = haar_orthogonal(np.random.default_rng(seed), n, det)
    c = 10.0**c_exp
    Qc = bk.asarray(c * Q)
    bound = 50 * EPS[np.float64] * n
    np.testing.assert_allclose(to_numpy(hl.cwy(hl.householder_vectors(Qc)).matrix()), Q, atol=bound)
    U, sign = hl.ornn_params(Qc)
    np.testing.assert_allclose(to_numpy(hl.ornn(U, sign).matrix()), Q, atol=bound)
    Om = Q[:, : n - 1]
    got = to_numpy(hl.tcwy(hl.tcwy_vectors(bk.asarray(c * Om))).matrix())
    np.testing.assert_allclose(got, Om, atol=bound)
    Uv, s, Vv = hl.svd_householder_params(bk.asarray(c * Om))
    W = to_numpy(hl.svd_householder(Uv, s, Vv).matrix())
    np.testing.assert_allclose(W / c, Om, atol=bound)


@given(
    seed=st.integers(0, 2**31 - 1),
    c_exp=st.integers(-300, 300),
    shape=st.sampled_from([(5, 2), (4, 4), (3, 6)]),
)
@examples(12)
def test_polar_qr_and_cayley_on_every_backend(bk_eager, seed, c_exp, shape):
    """polar and qr_retraction of c·X equal SciPy's answers for X, and the Cayley retraction
    along c·Z with step/c equals the dense Cayley step, on each eager backend."""
    bk = bk_eager
    rng = np.random.default_rng(seed)
    X = rng.standard_normal(shape)
    kappa = np.linalg.cond(X)
    assume(kappa < 1e6)
    c = 10.0**c_exp
    bound = 50 * EPS[np.float64] * max(shape) * kappa
    np.testing.assert_allclose(
        to_numpy(hl.polar(bk.asarray(c * X))), scipy.linalg.polar(X)[0], atol=bound
    )
    if shape[-1] > shape[-2]:
        return
    q, r = np.linalg.qr(X)
    q = q * np.sign(np.diagonal(r))[None, :]
    out = hl.qr_retraction(bk.asarray(c * X), bk.asarray(np.zeros(shape)))
    np.testing.assert_allclose(to_numpy(out), q, atol=bound)
    G = rng.standard_normal(shape)
    A = G @ q.T - q @ G.T
    eye = np.eye(shape[0])
    ref = np.linalg.solve(eye + 0.15 * A, (eye - 0.15 * A) @ q)
    Z = -hl.riemannian_gradient(q, G)
    Y = hl.cayley_retraction(bk.asarray(q), bk.asarray(Z * c), 0.3 / c)
    cond = np.linalg.cond(eye + 0.15 * A)
    np.testing.assert_allclose(to_numpy(Y), ref, atol=50 * EPS[np.float64] * shape[0] * cond)


def _ns(a):
    """The array's namespace (the layout tests run NumPy and torch inputs)."""
    return array_api_compat.array_namespace(a)


#: every public function on (X (6, 3) on St(6, 3) or any (6, 3) matrix, Z (6, 3), Q (6, 6)):
#: name → f(X, Z, Q) returning one array; each is run on the same values in every layout
PUBLIC = {
    "cwy": lambda X, Z, Q: hl.cwy(Z).matrix(),
    "cwy_apply": lambda X, Z, Q: hl.cwy(Z) @ X,
    "tcwy": lambda X, Z, Q: hl.tcwy(Z).matrix(),
    "householder_apply": lambda X, Z, Q: hl.householder_apply(Z, X),
    "householder_product": lambda X, Z, Q: hl.householder_product(Z),
    "householder_vectors": lambda X, Z, Q: hl.householder_vectors(Q),
    "tcwy_vectors": lambda X, Z, Q: hl.tcwy_vectors(X),
    "ornn": lambda X, Z, Q: hl.ornn(_ns(Z).tril(Z)[:, :3], -1).matrix(),
    "ornn_params": lambda X, Z, Q: hl.ornn_params(Q)[0],
    "svd_householder": lambda X, Z, Q: hl.svd_householder(
        Z, _ns(Z).arange(1.0, 4.0, dtype=Z.dtype), Q[:3, :3]
    ).matrix(),
    "svd_householder_params": lambda X, Z, Q: hl.svd_householder_params(Z)[0],
    "bounded_sigma": lambda X, Z, Q: hl.bounded_sigma(Z, 1.0, 0.5),
    "polar": lambda X, Z, Q: hl.polar(Z),
    "riemannian_gradient": lambda X, Z, Q: hl.riemannian_gradient(X, Z),
    "cayley_retraction": lambda X, Z, Q: hl.cayley_retraction(X, Z, 0.1),
    "polar_retraction": lambda X, Z, Q: hl.polar_retraction(X, Z, 0.1),
    "qr_retraction": lambda X, Z, Q: hl.qr_retraction(X, Z, 0.1),
    "momentum_sgd": lambda X, Z, Q: hl.stiefel.momentum_sgd(lr=0.1).update(
        X, Z, hl.stiefel.momentum_sgd(lr=0.1).init(X)
    )[0],
    "adam": lambda X, Z, Q: hl.stiefel.adam(lr=0.1).update(X, Z, hl.stiefel.adam(lr=0.1).init(X))[
        0
    ],
    "vjp.cwy_apply": lambda X, Z, Q: hl.vjp.cwy_apply(Z, X, X)[0],
    "vjp.householder_apply": lambda X, Z, Q: hl.vjp.householder_apply(Z, X, X)[0],
    "vjp.polar": lambda X, Z, Q: hl.vjp.polar(Z, X),
    "vjp.cayley_retraction": lambda X, Z, Q: hl.vjp.cayley_retraction(X, Z, 0.1, X)[0],
}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_public_function_in_every_layout(name):
    """Fortran-order, negative-stride, read-only and non-contiguous (every other row of a
    bigger array) NumPy inputs give the C-order result to the last bit or a few ulps (BLAS
    may block differently), and are never written."""
    rng = np.random.default_rng(stable_seed(name))
    X = np.linalg.qr(rng.standard_normal((6, 3)))[0]
    Z = rng.standard_normal((6, 3))
    Q = haar_orthogonal(rng, 6, 1)
    ref = np.asarray(PUBLIC[name](X, Z, Q))
    for how in (*LAYOUTS, "strided"):
        if how == "strided":
            args = [np.repeat(a, 2, axis=0)[::2] for a in (X, Z, Q)]
        else:
            args = [layout(a, how) for a in (X, Z, Q)]
        copies = [a.copy() for a in args]
        out = np.asarray(PUBLIC[name](*args))
        np.testing.assert_allclose(out, ref, rtol=0, atol=100 * EPS[np.float64], err_msg=how)
        for a, c in zip(args, copies, strict=True):
            assert np.array_equal(a, c), f"{name} wrote into its {how} input"


# -- issue 12's last gaps: ornn / SVD VJPs and bounded_sigma across scales, optimizers at
# extreme gradients, torch layouts -------------------------------------------------------------


@given(seed=st.integers(0, 2**31 - 1), exps=st.lists(st.integers(-300, 300), min_size=6))
@examples(10)
def test_ornn_and_svd_vjps_are_scale_covariant_on_every_backend(bk_eager, seed, exps):
    """ornn(cU) = ornn(U) and svd_householder(c₁U, σ, c₂V) = svd_householder(U, σ, V) column
    by column (H(cv) = H(v)), so their VJPs with respect to the vectors scale by 1/c and the
    others do not change: checked at scales 10^±300 on each eager backend against the unit
    columns. Bound: 50·eps·n relative to the unit-scale cotangents (the maps are orthogonal)."""
    bk = bk_eager
    rng = np.random.default_rng(seed)
    n = 5
    U = np.tril(rng.standard_normal((n, 3)))
    Uv, Vv = rng.standard_normal((n, 3)), rng.standard_normal((4, 3))
    sigma = np.array([2.0, 1.0, 0.5, 0.25])
    h, g = rng.standard_normal((n, 2)), rng.standard_normal((n, 2))
    x, gy = rng.standard_normal((4, 2)), rng.standard_normal((n, 2))
    scale = 10.0 ** np.array((exps * 2)[:6], dtype=float)
    cU, cUv, cVv = scale[:3], scale[3:6], scale[:3][::-1]
    bound = 50 * EPS[np.float64] * n

    def close(a, b, ref_scale, what):
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), rtol=0, atol=bound * ref_scale,
                                   err_msg=what)  # fmt: skip

    A = lambda a: bk.asarray(a)  # noqa: E731
    y1 = hl.ornn(A(U), 1) @ A(h)
    close(hl.ornn(A(U * cU), 1) @ A(h), y1, 1 + np.abs(h).max(), "ornn")
    Ub1, hb1 = (to_numpy(a) for a in hl.vjp.ornn_apply(A(U), 1, A(h), A(g)))
    Ub, hb = (to_numpy(a) for a in hl.vjp.ornn_apply(A(U * cU), 1, A(h), A(g)))
    ref = np.abs(Ub1).max() + np.abs(hb1).max() + 1
    close(hb, hb1, ref, "ornn h_bar")
    close(Ub * cU, Ub1, ref, "ornn U_bar · c")
    W1 = hl.svd_householder(A(Uv), A(sigma), A(Vv))
    Wc = hl.svd_householder(A(Uv * cUv), A(sigma), A(Vv * cVv))
    close(Wc @ A(x), W1 @ A(x), 2 * (1 + np.abs(x).max()), "svd_householder")
    out1 = [to_numpy(a) for a in hl.vjp.svd_householder_apply(A(Uv), A(sigma), A(Vv), A(x), A(gy))]
    outc = [
        to_numpy(a)
        for a in hl.vjp.svd_householder_apply(A(Uv * cUv), A(sigma), A(Vv * cVv), A(x), A(gy))
    ]
    ref = 1 + max(np.abs(a).max() for a in out1)
    close(outc[0] * cUv, out1[0], ref, "svd U_bar · c")
    close(outc[1], out1[1], ref, "svd sigma_bar")
    close(outc[2] * cVv, out1[2], ref, "svd V_bar · c")
    close(outc[3], out1[3], ref, "svd x_bar")


@pytest.mark.parametrize("s_hat", [-1e300, -1e30, -1.0, -1e-300, 0.0, 1e-300, 1.0, 1e30, 1e300])
def test_bounded_sigma_at_extreme_inputs_on_every_backend(bk_eager, s_hat):
    """σ = 2r(sigmoid(ŝ) − ½) + c stays in [c − r, c + r] for every finite ŝ (saturating at
    ±1e30 and beyond, no NaN, no warning), and its VJP is 2r·f(1 − f)·g ≥ 0, exactly 0 once
    e^{−|ŝ|} underflows — checked against the closed form in float64."""
    bk = bk_eager
    s = bk.asarray(np.array([s_hat, -s_hat]))
    c, r = 1.0, 0.5
    sig = to_numpy(hl.bounded_sigma(s, c, r))
    f = 0.5 * (1 + np.tanh(0.5 * np.array([s_hat, -s_hat])))
    np.testing.assert_allclose(sig, 2 * r * (f - 0.5) + c, rtol=0, atol=4 * EPS[np.float64])
    assert np.all((sig >= c - r) & (sig <= c + r))
    gbar = to_numpy(hl.vjp.bounded_sigma(s, c, r, bk.asarray(np.ones(2))))
    e = np.exp(-abs(s_hat))
    np.testing.assert_allclose(gbar, 2 * r * e / (1 + e) ** 2 * np.ones(2), rtol=1e-14, atol=0)
    assert np.all(gbar >= 0)


OPTIMIZERS = {
    "sgd": lambda m: hl.stiefel.momentum_sgd(lr=0.1, expm_method=m),
    "adam": lambda m: hl.stiefel.adam(lr=0.1, expm_method=m),
}


@given(
    seed=st.integers(0, 2**31 - 1),
    k=st.integers(-300, 300),
    kind=st.sampled_from(sorted(OPTIMIZERS)),
    method=st.sampled_from(["euler", "cayley"]),
)
@examples(12)
def test_optimizer_steps_at_extreme_gradient_scales_on_every_backend(
    bk_eager, seed, k, kind, method
):
    """Ten steps with the gradient 10^k·G₀, k ∈ [−300, 300]: every step either gives a finite
    point on the manifold (‖XᵀX − I‖ ≤ 50·eps·M) with a finite state, or raises ValueError
    naming what went out of range (the gradient G, the rotation step lr·Z, the momentum U) —
    never a backend error, a warning (the suite turns warnings into errors) or a NaN."""
    bk = bk_eager
    rng = np.random.default_rng(seed)
    X = np.linalg.qr(rng.standard_normal((6, 3)))[0]
    G = rng.standard_normal((6, 3)) * 10.0**k
    opt = OPTIMIZERS[kind](method)
    Xb = bk.asarray(X)
    state = opt.init(Xb)
    for _ in range(10):
        try:
            Xb, state = opt.update(Xb, bk.asarray(G), state)
        except ValueError as exc:
            assert re.search(r"the gradient G|the rotation step|the momentum U", str(exc)), exc
            return
        Xn = to_numpy(Xb)
        assert np.all(np.isfinite(Xn))
        assert np.abs(Xn.T @ Xn - np.eye(3)).max() <= 50 * EPS[np.float64] * 3
        assert all(np.all(np.isfinite(to_numpy(a))) for a in state)


#: torch layouts: (name, how a contiguous (rows, cols) tensor becomes that layout)
TORCH_LAYOUTS = {
    "transposed": lambda t: t.mT.contiguous().mT,  # column-major strides
    "strided": lambda t: t.repeat_interleave(2, dim=0)[::2],  # every other row of a bigger one
    "expanded": lambda t: t[None].expand(2, *t.shape)[1],  # a view of a stride-0 batch
    "neg_bit": lambda t: (-t).neg(),  # lazy negation bit resolved by the library
}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_public_function_in_every_torch_layout(name):
    """Non-contiguous torch tensors (column-major, strided, views of an expanded batch, with
    the lazy neg bit) give the contiguous result to a few ulps, the same type and dtype, and
    are never written (torch's version counter would count a write)."""
    torch = require("torch")
    rng = np.random.default_rng(stable_seed(name))
    X = np.linalg.qr(rng.standard_normal((6, 3)))[0]
    Z = rng.standard_normal((6, 3))
    Q = haar_orthogonal(rng, 6, 1)
    base = [torch.from_numpy(a.copy()) for a in (X, Z, Q)]
    ref = PUBLIC[name](*base)
    for how, make in TORCH_LAYOUTS.items():
        args = [make(a) for a in base]
        if how == "neg_bit":
            args = [torch._neg_view(a.neg()) for a in base]  # the same values, neg bit set
        versions = [a._version for a in args]
        copies = [a.clone() for a in args]
        out = PUBLIC[name](*args)
        assert type(out) is type(ref) and out.dtype == ref.dtype, how
        np.testing.assert_allclose(to_numpy(out), to_numpy(ref), rtol=0,
                                   atol=100 * EPS[np.float64], err_msg=how)  # fmt: skip
        for a, c, v in zip(args, copies, versions, strict=True):
            assert a._version == v and torch.equal(a, c), f"{name} wrote into its {how} input"


# -- issue 41: every power-of-two scale, subnormals included -----------------------------------

#: the fixed-step schedules and the Newton–Schulz polar (None)
POLAR_PATHS = (None, "newton_schulz", "muon", "polar_express", "certified")
#: name → (numpy dtype of the values, exponent range of 2^k·X for X with entries m/8,
#: |m| ≤ 17: from the smallest subnormal + 3 bits to the largest finite / 4)
SCALE_DTYPES = {
    "float64": (np.float64, -1071, 1020),
    "float32": (np.float32, -146, 125),
    "complex128": (np.complex128, -1071, 1020),
    "complex64": (np.complex64, -146, 125),
    "bfloat16": (np.float32, -130, 125),
    "float16": (np.float32, -21, 13),
}


def exactly_scalable(rng, shape, cplx):
    """Entries m/8, |m| ≤ 17 (5 significant bits): 2^k·X is exact over SCALE_DTYPES' range."""
    X = rng.integers(-17, 18, shape) / 8.0
    return X + 1j * rng.integers(-17, 18, shape) / 8.0 if cplx else X


def _ldexp(X, k):
    if np.iscomplexobj(X):
        return _ldexp(X.real, k) + 1j * _ldexp(X.imag, k)
    return np.ldexp(X, k)


def _on(bk, X, name):
    """X (values exact in ``name``) as ``bk``'s array of dtype ``name``."""
    if name in ("bfloat16", "float16"):
        return bk.xp.astype(bk.asarray(X, np.float32), getattr(bk.xp, name))
    return bk.asarray(X, SCALE_DTYPES[name][0])


def _values(Q):
    """Q as NumPy, half precision widened to float32 (NumPy has no bfloat16); other dtypes
    as they are (a float64 result rounded to float32 would exceed its certified bound)."""
    if "bfloat16" in str(Q.dtype) or "float16" in str(Q.dtype):
        Q = Q.float() if hasattr(Q, "detach") else Q.astype("float32")
    return to_numpy(Q)


#: the smallest k of SCALE_DTYPES on JAX, whose XLA flushes subnormal numbers to zero
JAX_LOWEST = {"float64": -1018, "complex128": -1018, "float32": -122, "complex64": -122,
              "bfloat16": -122, "float16": -10}  # fmt: skip


@given(
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
    path=st.sampled_from(POLAR_PATHS),
    frac=st.floats(0.0, 1.0),
    wide=st.booleans(),
)
@examples(25)
def test_polar_paths_at_every_power_of_two_scale_on_every_backend(
    bk_eager, seed, data, path, frac, wide
):
    """polar(2^k X, schedule=…) == polar(X) bit for bit, k anywhere in the dtype's finite
    range with subnormal entries included, for every fixed-step schedule (the certified one
    among them) and the Newton–Schulz polar, and the certified bound holds at every scale
    (the fixed-step norm is taken after an exact power-of-two scaling); the Newton–Schulz
    polar to rounding (it scales out-of-range X into range exactly, and keeps the scale of
    X inside it). Half precision on torch and JAX. JAX flushes subnormals to zero: the
    range starts at its smallest normal there."""
    bk = bk_eager
    names = sorted(SCALE_DTYPES)
    if not bk.name.startswith(("torch", "jax")):
        names = [n for n in names if n not in ("bfloat16", "float16")]
    name = data.draw(st.sampled_from(names))
    _, lo, hi = SCALE_DTYPES[name]
    if bk.name.startswith("jax"):
        lo = JAX_LOWEST[name]
    k = round(lo + frac * (hi - lo))
    rng = np.random.default_rng(seed)
    shape = few_shapes(bk, (6, 9) if wide else (9, 6), [(9, 6), (6, 9)], seed)
    X = exactly_scalable(rng, shape, name.startswith("complex")) + 2.0 * np.eye(*shape)
    Xk = _ldexp(X, k)
    assert np.array_equal(_ldexp(Xk, -k), X)
    ref, info = hl.polar(_on(bk, X, name), schedule=path, return_info=True)
    got = hl.polar(_on(bk, Xk, name), schedule=path)
    a, b = _values(ref), _values(got)
    assert np.all(np.isfinite(b))
    if path is None:  # in range, the plan may pick another scale for 2^k X: to rounding
        half_eps = {"bfloat16": 2.0**-7, "float16": 2.0**-10}
        tol = 4 * half_eps[name] if name in half_eps else 1e3 * EPS[SCALE_DTYPES[name][0]]
        np.testing.assert_allclose(b, a, rtol=0, atol=tol, err_msg=f"{name} {k}")
    else:
        assert np.array_equal(a, b), (name, k, np.max(np.abs(a - b)))
    if path is not None:
        wide_dt = np.complex128 if np.iscomplexobj(b) else np.float64
        s = np.linalg.svd(b.astype(wide_dt), compute_uv=False)
        assert s.max() <= info["upper"], (s.max(), info["upper"])


@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(2, 6),
    frac=st.floats(0.0, 1.0),
)
@examples(12)
def test_constructive_inverse_at_every_power_of_two_scale(bk_eager, seed, n, frac):
    """householder_vectors(2^k A) == householder_vectors(A) bit for bit, k over the whole
    float64 range, subnormal A included (was 6e-4 off at 1e-320): every column is scaled
    exactly before the reflectors are formed (not on JAX, which flushes subnormals)."""
    bk = bk_eager
    lo = -1018 if bk.name.startswith("jax") else -1071
    k = round(lo + frac * (1020 - lo))
    n = few_shapes(bk, n, [3, 5], seed)
    A = exactly_scalable(np.random.default_rng(seed), (n, n), False) + 3.0 * np.eye(n)
    ref = to_numpy(hl.householder_vectors(bk.asarray(A)))
    got = to_numpy(hl.householder_vectors(bk.asarray(_ldexp(A, k))))
    assert np.array_equal(ref, got), (k, np.max(np.abs(ref - got)))


# -- non-finite operands, complex lineax solves, Cayley at the edges ---------------------------

_OPERAND_KINDS = ("cwy", "cwy.T", "cwy.H", "tcwy", "tcwy.T", "from_lapack", "svd", "apply")


def _operand_map(kind: str, V: np.ndarray, s: np.ndarray):
    """(map h ↦ result, rows of h) for a fresh operator of ``kind`` on V (n, L) (and σ = s
    for SVD-Householder)."""
    n, L = V.shape
    if kind == "apply":
        return (lambda h: hl.householder_apply(V, h)), n
    if kind == "tcwy":
        return hl.tcwy(V).__matmul__, L
    if kind == "tcwy.T":
        return hl.tcwy(V).T.__matmul__, n
    if kind == "from_lapack":
        a = V + 0 * 1j if np.iscomplexobj(V) else V
        a, tau = scipy.linalg.qr(a, mode="raw")[0]
        return hl.from_lapack(np.asfortranarray(a), tau).__matmul__, n
    if kind == "svd":
        return hl.svd_householder(V, s, V[:, ::-1]).__matmul__, n
    op = hl.cwy(V)
    return {"cwy": op, "cwy.T": op.T, "cwy.H": op.H}[kind].__matmul__, n


@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 8),
    B=st.integers(2, 6),
    kind=st.sampled_from(_OPERAND_KINDS),
    value=st.sampled_from([np.nan, np.inf, -np.inf]),
    complex_=st.booleans(),
    products=st.integers(1, 4),
    data=st.data(),
)
@examples(40)
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # as A @ h
def test_non_finite_operand_columns_propagate_on_every_path(
    seed, n, B, kind, value, complex_, products, data
):
    """docs/guarantees.rst, "Non-finite operands": a NaN or ±Inf anywhere in column j of h
    makes column j of the result non-finite and leaves the other columns as they are without
    it, for every operator kind, real and complex, over up to four products of one operator
    (the first by sequential reflections or LAPACK's panels, then the factors, then the dense
    Q or W = UT once the columns add up to N). Clean columns: against the same kind of
    operator applied to the clean columns alone, to 50·n·u·‖h‖ (another path's rounding)."""
    rng = np.random.default_rng(seed)
    L = n if kind in ("svd", "from_lapack") else data.draw(st.integers(0, n))
    if kind in ("tcwy", "tcwy.T"):
        L = max(L, 1)
    V = rng.standard_normal((n, L))
    if complex_:
        V = V + 1j * rng.standard_normal((n, L))
    s = rng.standard_normal(n)
    apply, rows = _operand_map(kind, V, s)
    ref_apply, _ = _operand_map(kind, V, s)
    bad = sorted(set(data.draw(st.lists(st.integers(0, B - 1), min_size=1, max_size=B - 1))))
    h = rng.standard_normal((rows, B)) + (1j * rng.standard_normal((rows, B)) if complex_ else 0)
    for j in bad:
        h[data.draw(st.integers(0, rows - 1)), j] = value
    good = [j for j in range(B) if j not in bad]
    ref = ref_apply(h[:, good])
    tol = 50 * max(n, 1) * EPS[np.float64] * np.max(np.abs(h[:, good]))
    for call in range(products):
        y = apply(h)
        for j in bad:
            assert not np.isfinite(y[:, j]).all(), (kind, call, j)
        np.testing.assert_allclose(y[:, good], ref, rtol=0, atol=tol, err_msg=f"{kind} {call}")


@given(
    seed=st.integers(0, 2**31 - 1),
    kind=st.sampled_from(["cwy", "cwy theta.T", "tcwy", "tcwy.T", "from_lapack", "svd"]),
    solver=st.sampled_from(["QR", "LU", "Auto", "Orthogonal"]),
)
@examples(12)
def test_complex_lineax_solves_equal_lineax_on_the_dense_matrix(seed, kind, solver):
    """hl.lineax.operator of a complex operator solves as lineax does on its dense matrix
    (complex128, N = 6: one shape, so JAX compiles once per kind and solver); 50·N·u·κ, as
    tests/test_lineax.py says why."""
    require("jax")
    lx = require("lineax")
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    N = 6
    rng = np.random.default_rng(seed)

    def c(*shape):
        return jnp.asarray(rng.standard_normal(shape) + 1j * rng.standard_normal(shape))

    theta = jnp.asarray(rng.uniform(-np.pi, np.pi, N))
    if kind == "cwy":
        op = hl.cwy(c(N, 3))
    elif kind == "cwy theta.T":
        op = hl.cwy(c(N, 3), theta=theta).T
    elif kind == "tcwy":
        op = hl.tcwy(c(N, 3), theta=theta[:3])
    elif kind == "tcwy.T":
        op = hl.tcwy(c(N, 3)).T
    elif kind == "from_lapack":
        a, tau = scipy.linalg.qr(np.asarray(c(N, N)), mode="raw")[0]
        op = hl.from_lapack(jnp.asarray(a), jnp.asarray(tau))
    else:
        op = hl.svd_householder(c(N, N), jnp.linspace(2.0, 1.0, N), c(N, N), theta=theta)
    M = jnp.asarray(op.matrix())
    m, n_ = M.shape
    A = hl.lineax.operator(op)
    assume(solver not in ("LU", "Auto") or m == n_)
    assume(solver != "Orthogonal" or hl.lineax.is_orthogonal(A))
    make = {
        "QR": lx.QR,
        "LU": lx.LU,
        "Auto": lambda: lx.AutoLinearSolver(well_posed=True),
        "Orthogonal": hl.lineax.Orthogonal,
    }[solver]
    b = c(m)
    dense = lx.MatrixLinearOperator(M)
    ref = lx.linear_solve(dense, b, lx.QR() if solver == "Orthogonal" else make()).value
    got = lx.linear_solve(A, b, make()).value
    kappa = np.linalg.cond(np.asarray(M))
    err = float(jnp.linalg.norm(got - ref) / jnp.linalg.norm(ref))
    assert err <= 50 * N * EPS[np.float64] * kappa, (kind, solver, err)


@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 10),
    data=st.data(),
    t_exp=st.integers(-300, 300),
    t_sign=st.sampled_from([1.0, -1.0]),
    complex_=st.booleans(),
)
@examples(60)
def test_cayley_at_random_column_scales_and_steps_stays_on_the_manifold(
    seed, n, data, t_exp, t_sign, complex_
):
    """cayley_retraction with the columns of Z at 10^k each (k ∈ [−300, 300], some zero) and
    t = ±10^j (j ∈ [−300, 300]): a finite point of the manifold to 70·M·u (the output check's
    64·√M·u·‖XᴴX‖_F and X's own error), no error and no warning; when every column has the
    same scale and t·‖Z‖ ≤ 1, the dense Cayley solve to 50·N·u·κ (κ ≤ √(1 + 1/4))."""
    import warnings

    M = data.draw(st.integers(1, n))
    exps = data.draw(st.lists(st.integers(-300, 300), min_size=M, max_size=M))
    zero = data.draw(st.lists(st.booleans(), min_size=M, max_size=M))
    rng = np.random.default_rng(seed)
    dt = np.complex128 if complex_ else np.float64
    A = rng.standard_normal((n, M)) + (1j * rng.standard_normal((n, M)) if complex_ else 0)
    X = np.linalg.qr(A)[0].astype(dt)
    G = rng.standard_normal((n, M)) + (1j * rng.standard_normal((n, M)) if complex_ else 0)
    Z0 = -hl.riemannian_gradient(X, G.astype(dt))
    scale = np.array([0.0 if z else 10.0**e for e, z in zip(exps, zero, strict=True)])
    with np.errstate(over="ignore", under="ignore"):
        Z = Z0 * scale  # (a subnormal or zero column is still a column of Z)
    t = t_sign * 10.0**t_exp
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Y = hl.cayley_retraction(X, Z, t)
    assert Y.dtype == dt and np.all(np.isfinite(Y))
    assert np.linalg.norm(Y.conj().T @ Y - np.eye(M)) <= 70 * M * EPS[np.float64]
    nz = scale[scale > 0]
    if nz.size == M and np.all(nz == nz[0]) and 1e-200 < nz[0] < 1e200:
        if t_exp + np.log10(nz[0]) + np.log10(max(np.linalg.norm(Z0), 1e-300)) <= 0:
            Zh = Z - 0.5 * X @ (X.conj().T @ Z)
            W = Zh @ X.conj().T - X @ Zh.conj().T
            eye = np.eye(n)
            ref = np.linalg.solve(eye - 0.5 * t * W, (eye + 0.5 * t * W) @ X)
            np.testing.assert_allclose(Y, ref, rtol=0, atol=50 * n * EPS[np.float64] * 1.2)
