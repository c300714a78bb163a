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

import numpy as np
import pytest
import scipy.linalg
from conftest import to_numpy
from helpers import EPS, growth, product_of_reflections
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
