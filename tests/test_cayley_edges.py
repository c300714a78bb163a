"""``cayley_retraction`` at the edges (issue: the guarantees page holds).

Columns of Z at very different scales, huge steps t·‖Z‖ (M > N/2 made the 2M × 2M system
of the SMW formula singular: NumPy's LinAlgError), the t → ∞ limit, and the peak memory.
The bound on ‖YᴴY − I‖_F is the check of ``_agnostic.retraction.cayley_along``:
SMW_CHECK·√M·u·max(1, ‖XᴴX‖_F) ≈ 64·M·u for X on the manifold (the SMW result is kept
below it, the basis path is unitary to a few u), plus X's own ‖XᴴX − I‖ (≤ √M·u from QR):
BOUND = 70·M·u. Before the fix the results below were off by 1e-5 up to 3e6.
"""

from __future__ import annotations

import tracemalloc
import warnings

import numpy as np
import pytest
from conftest import require, to_numpy
from helpers import EPS, orth_error

import householderla as hl
from householderla._agnostic import retraction as RK


def _bound(dtype, M: int) -> float:
    return 70 * M * EPS[np.dtype(dtype).type]


def _point(rng, N: int, M: int, dtype=np.float64):
    A = rng.standard_normal((N, M))
    if np.dtype(dtype).kind == "c":
        A = A + 1j * rng.standard_normal((N, M))
    X = np.linalg.qr(A)[0].astype(dtype)
    G = rng.standard_normal((N, M)).astype(dtype)
    if np.dtype(dtype).kind == "c":
        G = G + 1j * rng.standard_normal((N, M))
    return X, -hl.riemannian_gradient(X, G)


def _dense(X, Z, t):
    """Cayley(tW)X from the dense N × N W = ẐXᴴ − XẐᴴ, Ẑ = (I − ½XXᴴ)Z (float64 solve)."""
    Zh = Z - 0.5 * X @ (X.conj().T @ Z)
    W = Zh @ X.conj().T - X @ Zh.conj().T
    eye = np.eye(X.shape[0])
    return np.linalg.solve(eye - 0.5 * t * W, (eye + 0.5 * t * W) @ X)


@pytest.mark.parametrize("ratio", [1e50, 1e155, 1e200, 1e290])
def test_columns_of_very_different_scales_stay_on_the_manifold(bk_eager, ratio):
    """One column of Z ``ratio`` × the others (and one 1/ratio ×): the SMW system is then
    ill-conditioned and small columns' Gram entries underflow; the result is on the manifold
    (before: ‖YᵀY − I‖ up to 3e6 with no error)."""
    rng = np.random.default_rng(0)
    for dtype in (np.float64, np.complex128) if bk_eager.name == "numpy" else (np.float64,):
        X, Z = _point(rng, 40, 5, dtype)
        Z[:, 0] *= ratio
        Z[:, 1] /= ratio
        xs, zs = bk_eager.asarray(X, dtype), bk_eager.asarray(Z, dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for t in (1e-3, 1.0, 1e3):
                Y = to_numpy(
                    bk_eager.call(lambda x, z: hl.cayley_retraction(x, z, t), xs, zs)  # noqa: B023
                )
                assert np.all(np.isfinite(Y))
                assert orth_error(Y) <= _bound(dtype, 5), (dtype, t)


@pytest.mark.parametrize(("N", "M"), [(3, 2), (3, 3), (4, 4), (5, 4), (10, 8), (40, 5)])
def test_huge_steps_never_raise_and_stay_on_the_manifold(bk_eager, N, M):
    """t‖Z‖ from 1e10 to 1e300 and t·(Z's scale) beyond the largest float (M > N/2 raised
    NumPy's LinAlgError, and t ~ 1e11 gave ‖YᵀY − I‖ ≈ 1e-5): no error, no warning, on the
    manifold."""
    rng = np.random.default_rng(N * 10 + M)
    X, Z = _point(rng, N, M)
    cases = [(Z, t) for t in (1e10, 1.5e11, 1e17, 1e125, 1e300)] + [(1e100 * Z, 1e300)]
    for Zc, t in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            Y = to_numpy(
                bk_eager.call(
                    lambda x, z: hl.cayley_retraction(x, z, t),  # noqa: B023
                    bk_eager.asarray(X),
                    bk_eager.asarray(Zc),
                )
            )
        assert np.all(np.isfinite(Y)), t
        assert orth_error(Y) <= _bound(np.float64, M), t


def test_huge_steps_under_jax_jit():
    """Under jax.jit the fallback is a lax.cond on the check: the same result."""
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(5)
    X, Z = _point(rng, 5, 4)
    f = jax.jit(hl.cayley_retraction)
    for t in (0.3, 1e17, 1e300):
        Y = np.asarray(f(jax.numpy.asarray(X), jax.numpy.asarray(Z), t))
        assert orth_error(Y) <= _bound(np.float64, 4), t
        np.testing.assert_allclose(Y, hl.cayley_retraction(X, Z, t), atol=100 * 5 * EPS[np.float64])


@pytest.mark.parametrize(("N", "M"), [(4, 3), (5, 3), (6, 2)])
def test_the_limit_of_a_huge_step_is_the_reflection_on_the_range_of_w(N, M):
    """Cayley(tW) = (I − tW/2)⁻¹(I + tW/2) has eigenvalue (1 + itλ/2)/(1 − itλ/2) → −1 on
    each eigenvector of W with λ ≠ 0 and 1 on its kernel: Cayley(tW)X → (I − 2Π)X, Π the
    orthogonal projector onto the range of W (docs/theory/retractions.rst). At t = 1e300 the
    result is that limit to rounding (the O(1/t) remainder is far below it); the projector
    comes from the dense W's SVD (its rank: 2M or N, whichever is smaller, for random Z)."""
    rng = np.random.default_rng(N + M)
    X, Z = _point(rng, N, M)
    Zh = Z - 0.5 * X @ (X.T @ Z)
    W = Zh @ X.T - X @ Zh.T
    Uw, sw, _ = np.linalg.svd(W)
    r = int(np.sum(sw > N * EPS[np.float64] * sw[0]))
    assert r == min(2 * M, N) - (min(2 * M, N) % 2)  # a real skew matrix has even rank
    Pi = Uw[:, :r] @ Uw[:, :r].T
    limit = X - 2 * Pi @ X
    tol = 100 * N * EPS[np.float64]
    np.testing.assert_allclose(hl.cayley_retraction(X, Z, 1e300), limit, atol=tol)
    # and t = 1e17, where the remainder is O(1/t) ≈ 1e-17: the limit too
    np.testing.assert_allclose(hl.cayley_retraction(X, Z, 1e17), limit, atol=tol)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_the_basis_path_equals_the_dense_cayley(dtype):
    """The fallback alone (``cayley_basis``), at ordinary steps, against the dense Cayley
    transform: κ(I − tW/2) ≤ √(1 + (t‖W‖/2)²) ≤ 3 here, so 100·N·u covers both."""
    rng = np.random.default_rng(9)
    for N, M in ((9, 3), (6, 4), (5, 5)):
        X, Z = _point(rng, N, M, dtype)
        for t in (0.05, 0.7):
            t = t / np.linalg.norm(Z)
            Y = RK.cayley_basis(X, Z, t, np)
            np.testing.assert_allclose(Y, _dense(X, Z, t), atol=100 * N * EPS[np.float64])
            assert orth_error(Y) <= _bound(dtype, M)


def test_peak_memory_at_most_two_times_x():
    """Peak memory of one call at N = 20000, M = 20 float64 (NumPy): the largest total of
    the allocations made during the call (tracemalloc, which tracks NumPy's), the result
    included and the inputs X, Z not, in units of 8·N·M bytes, the size of X (or of Z).
    The issue asks for ≤ 3; before this fix 5.0, now 2.02: the two N × M products X·a and
    Z·b (summed in place) and M × M matrices; 2.1 leaves room for the small ones only."""
    rng = np.random.default_rng(1)
    N, M = 20000, 20
    X, Z = _point(rng, N, M)
    hl.cayley_retraction(X, Z, 0.1)  # warm: imports, caches
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        Y = hl.cayley_retraction(X, Z, 0.1)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert orth_error(Y) <= _bound(np.float64, M)
    assert peak <= 2.1 * 8 * N * M, peak / (8 * N * M)
