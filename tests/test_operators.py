"""Operators behave like operators: composition, pickling, shape errors (issue 18, item 3).

Oracles are dense products of the definition H(v) = I − 2vvᵀ/‖v‖² (``product_of_reflections``)
in float64 NumPy; tolerances are 50·eps·N (a product of two orthogonal factors, each accurate
to a few eps·N in the entries).
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from conftest import to_numpy
from helpers import product_of_reflections

import householderla as hl
from householderla._operator.compose import OperatorProduct

N = 6
TOL = 50 * np.finfo(np.float64).eps * N


def _vs(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


@pytest.mark.no_dask("composition builds operators only; no operand")
def test_cwy_composition_concatenates_reflectors(bk):
    """H(V₁)H(V₂) = cwy([V₁ V₂]) when L₁ + L₂ ≤ N; a transposed factor contributes its columns
    reversed. The result is one CWY operator, equal to the dense product."""
    V1, V2 = _vs(0, N, 2), _vs(1, N, 3)
    Q1, Q2 = product_of_reflections(V1), product_of_reflections(V2)
    a, b = hl.cwy(bk.asarray(V1)), hl.cwy(bk.asarray(V2))
    for op, ref in ((a @ b, Q1 @ Q2), (a.T @ b, Q1.T @ Q2), (a @ b.T, Q1 @ Q2.T)):
        assert isinstance(op, hl.CWY) and op.shape == (N, N)
        np.testing.assert_allclose(to_numpy(op.matrix()), ref, atol=TOL)
        assert op.shape[-1] == 6


def test_composition_beyond_n_reflectors_and_other_operators(bk):
    """Too many reflectors, T-CWY and SVD-Householder give an OperatorProduct that applies its
    factors right to left; .T, .mv, @ h, h @ and .matrix() agree with the dense product."""
    Va, Vb, Vt = _vs(2, N, 5), _vs(3, N, 4), _vs(4, N, 2)
    Qa, Qb = product_of_reflections(Va), product_of_reflections(Vb)
    Om = product_of_reflections(Vt)[:, :2]
    a, b, t = (hl.cwy(bk.param(Va)), hl.cwy(bk.param(Vb)), hl.tcwy(bk.param(Vt)))
    h = _vs(5, N, 3)
    for op, ref in ((a @ b, Qa @ Qb), (a @ t, Qa @ Om), (t.T @ a, Om.T @ Qa)):
        assert isinstance(op, OperatorProduct) and op.shape == ref.shape
        np.testing.assert_allclose(to_numpy(op.matrix()), ref, atol=TOL)
        np.testing.assert_allclose(to_numpy(op.T.matrix()), ref.T, atol=TOL)
        x = h[: ref.shape[1]]
        np.testing.assert_allclose(to_numpy(op @ bk.asarray(x)), ref @ x, atol=TOL)
        np.testing.assert_allclose(to_numpy(op.mv(bk.asarray(x.T))), (ref @ x).T, atol=TOL)
    sv = bk.param([2.0, 1.0, 0.5, 0.25])
    s = hl.svd_householder(bk.param(Va[:, :3]), sv, bk.param(Vb[:4, :2]))  # W: 6 × 4
    W = to_numpy(s.matrix())
    for op, ref in ((a @ s, Qa @ W), (s.T @ b, W.T @ Qb)):
        np.testing.assert_allclose(to_numpy(op.matrix()), ref, atol=TOL)


def test_composition_shape_mismatch_names_both_shapes():
    a, t = hl.cwy(_vs(6, N, 2)), hl.tcwy(_vs(7, N, 2))
    with pytest.raises(ValueError, match=r"inner dimensions 2 and 6 differ"):
        t @ a


@pytest.mark.parametrize("build", ["cwy", "cwy_T", "tcwy", "svd", "product"])
def test_pickle_and_deepcopy_round_trip(bk_eager, build):
    """Operators pickle and deep-copy (they hold no module after __getstate__); the copy is
    the same matrix (to rounding: a first product may run the sequential kernel, later ones
    the factors, which the copy inherits)."""
    V = bk_eager.asarray(_vs(8, N, 3))
    ops = {
        "cwy": lambda: hl.cwy(V),
        "cwy_T": lambda: hl.cwy(V).T,
        "tcwy": lambda: hl.tcwy(V),
        "svd": lambda: hl.svd_householder(V, bk_eager.asarray([1.0, 2.0, 3.0]), V[:3, :2]),
        "product": lambda: hl.cwy(V) @ hl.cwy(V[:, :2]).T @ hl.tcwy(V),
    }
    op = ops[build]()
    ref = to_numpy(op.matrix())
    for clone in (pickle.loads(pickle.dumps(op)), copy.deepcopy(op)):
        assert type(clone) is type(op) and clone.shape == op.shape
        np.testing.assert_allclose(to_numpy(clone.matrix()), ref, atol=TOL)


@pytest.mark.parametrize(
    ("now", "before"),
    [
        ("householderla._operator.factors", "householderla._factors"),
        ("householderla._operator.compose", "householderla._compose"),
        ("householderla.lapack", "householderla._lapack_stack"),
    ],
)
def test_pickles_naming_the_old_module_paths_still_load(now, before):
    """Pickles written before the operator machinery moved into ``_operator/`` (and the
    in-place LAPACK operators into ``lapack``) name the old modules; they still load."""
    from scipy.linalg import lapack

    V = _vs(11, N, 3)
    a, tau = lapack.dgeqrf(_vs(12, N, N))[:2]  # a stack of 16: the in-place operator
    op = {
        "householderla._operator.factors": lambda: hl.cwy(V),
        "householderla._operator.compose": lambda: hl.cwy(V) @ hl.tcwy(V),
        "householderla.lapack": lambda: hl.from_lapack(
            np.ascontiguousarray(np.stack([a] * 16)), np.stack([tau] * 16)
        ),
    }[now]()
    old = pickle.dumps(op, protocol=0)  # text: "c<module>\n<name>\n" opcodes
    assert f"c{now}\n".encode() in old
    old = old.replace(f"c{now}\n".encode(), f"c{before}\n".encode())
    np.testing.assert_allclose(pickle.loads(old).matrix(), op.matrix(), atol=TOL)


def test_mv_names_the_shape_the_caller_passed():
    op = hl.cwy(_vs(9, N, 2))
    with pytest.raises(ValueError, match=r"h must have shape \(\.\.\., 6\).*got shape \(5,\)"):
        op.mv(np.ones(5))
    s = hl.svd_householder(_vs(9, N, 2), np.ones(4), _vs(10, 4, 2))
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 4\).*got shape \(3, 6\)"):
        s.mv(np.ones((3, 6)))


def test_batch_mismatch_is_our_error(bk_eager):
    """Batch axes that do not broadcast raise ValueError naming both, before any kernel runs
    (the first NumPy product goes to the Numba kernel, which used to report NumPy's error)."""
    op = hl.cwy(bk_eager.asarray(_vs(11, 2, N, 2)))
    with pytest.raises(ValueError, match=r"batch shapes do not broadcast: the operator \(2,\), h"):
        op @ bk_eager.asarray(_vs(12, 3, N, 4))
