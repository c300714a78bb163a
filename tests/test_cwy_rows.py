"""The unnormalised compact WY product in rows (``_agnostic.cwy_rows``), the math of a small
orthogonal layer's one-node training path (issue 19, item 3), on every eager backend.

Oracles: the product of the dense reflections H(v₁)…H(v_L) built from their definition in
float64 (``helpers.product_of_reflections``), and central differences of the scalar
ℓ = ⟨G, x Qᵀ⟩ for the VJP (the dot-product test). Tolerances: the forward is N reflections of
a few ulps each on O(1) entries, 100·eps·N; the central difference of a smooth ℓ with
step ε = 1e-6 in float64 has error O(ε²·‖ℓ'''‖) + O(eps/ε) ≈ 1e-10 relative, so 1e-7 relative
separates it from a wrong term (O(1)).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import to_numpy
from helpers import EPS, product_of_reflections

from householderla._agnostic import cwy_rows as R

N = 7


def _data(zero_column: bool = False, trapezoidal: bool = False, seed: int = 0):
    rng = np.random.default_rng(seed)
    V = rng.standard_normal((N, N))
    if trapezoidal:
        V = np.tril(V)
    if zero_column:
        V[:, 3] = 0.0
    return V, rng.standard_normal((4, N))


@pytest.mark.parametrize("formed", [False, True])
@pytest.mark.parametrize("zero_column", [False, True])
def test_rows_product_is_the_product_of_reflections(bk_eager, formed, zero_column):
    """y = x Qᵀ with Q = H(v₁)…H(v_N) (H(0) = I for a zero column), by the operator path and
    the formed one; the formed W is Q itself."""
    V, x = _data(zero_column, trapezoidal=True)
    Q = product_of_reflections(V)
    xp = bk_eager.xp
    Vb, xb = bk_eager.asarray(V), bk_eager.asarray(x)
    y, kept = R.rows_product(Vb, R.rows_factor(Vb, xp), xb, xp, formed)
    np.testing.assert_allclose(to_numpy(y), x @ Q.T, rtol=0, atol=100 * EPS[np.float64] * N)
    if formed:
        np.testing.assert_allclose(to_numpy(kept[0]), Q, rtol=0, atol=100 * EPS[np.float64] * N)


@pytest.mark.parametrize("formed", [False, True])
def test_rows_vjp_dot_product_test(bk_eager, formed):
    """⟨V̄, δV⟩ + ⟨x̄, δx⟩ equals the central difference of ℓ = ⟨G, x Qᵀ⟩ along (δV, δx),
    with x̄ None when not asked for; a sign or transpose error in any term is O(1) off."""
    V, x = _data(seed=1)
    rng = np.random.default_rng(2)
    G, dV, dx = (
        rng.standard_normal(x.shape),
        rng.standard_normal(V.shape),
        rng.standard_normal(x.shape),
    )
    xp = bk_eager.xp

    def loss(V_, x_):
        Vb = bk_eager.asarray(V_)
        y, _ = R.rows_product(Vb, R.rows_factor(Vb, xp), bk_eager.asarray(x_), xp, formed)
        return float(np.sum(G * to_numpy(y)))

    Vb, xb = bk_eager.asarray(V), bk_eager.asarray(x)
    S = R.rows_factor(Vb, xp)
    _, kept = R.rows_product(Vb, S, xb, xp, formed)
    Gb = bk_eager.asarray(G)
    Vbar, xbar = R.rows_vjp(Vb, S, xb, Gb, kept, xp, formed, True)
    eps = 1e-6
    fd = (loss(V + eps * dV, x + eps * dx) - loss(V - eps * dV, x - eps * dx)) / (2 * eps)
    pairing = float(np.sum(to_numpy(Vbar) * dV) + np.sum(to_numpy(xbar) * dx))
    assert abs(pairing - fd) <= 1e-7 * max(1.0, abs(fd))
    Vbar2, none = R.rows_vjp(Vb, S, xb, Gb, kept, xp, formed, False)
    assert none is None
    np.testing.assert_allclose(to_numpy(Vbar2), to_numpy(Vbar), rtol=0, atol=0)


def test_zero_column_gets_a_zero_cotangent(bk_eager):
    """H(0) = I: a zero column's cotangent is 0 (never NaN), as the unit-column form defines
    it (``compact_wy.normalize_columns_vjp``), and the others stay finite."""
    V, x = _data(zero_column=True, seed=3)
    xp = bk_eager.xp
    Vb, xb = bk_eager.asarray(V), bk_eager.asarray(x)
    S = R.rows_factor(Vb, xp)
    for formed in (False, True):
        _, kept = R.rows_product(Vb, S, xb, xp, formed)
        Vbar, xbar = R.rows_vjp(Vb, S, xb, bk_eager.asarray(np.ones_like(x)), kept, xp, formed,
                                True)  # fmt: skip
        Vbar = to_numpy(Vbar)
        assert np.all(np.isfinite(Vbar)) and np.all(np.isfinite(to_numpy(xbar)))
        np.testing.assert_array_equal(Vbar[:, 3], 0.0)
        assert float(np.abs(Vbar).max()) > 0


@pytest.mark.parametrize("bad", [np.nan, -np.inf])
def test_non_finite_columns_raise(bk_eager, bad):
    """NaN and ±Inf raise, naming the column."""
    V, _ = _data(seed=4)
    V[2, 5] = bad
    with pytest.raises(ValueError, match=r"V contains NaN or Inf \(in column\(s\) \[5\]\)"):
        R.rows_factor(bk_eager.asarray(V), bk_eager.xp)


def test_overflowing_column_norms_raise(bk_eager):
    """A finite float64 column with ‖v‖² past 1.8e308 raises, naming it and the remedy
    (the unit-column form would take it; the squares here cannot)."""
    V, _ = _data(seed=4)
    V[2, 5] = 1e200
    with np.errstate(over="ignore"), pytest.raises(ValueError, match=r"column\(s\) \[5\] whose"):
        R.rows_factor(bk_eager.asarray(V), bk_eager.xp)


def test_float32_accumulates_the_gram_in_float64():
    """float32 V (NumPy): S is float64 (the Gram accumulated there, as ``cwy_factors`` does)
    and the product comes back in float32 within 50·eps₃₂·N of the float64 one."""
    V, x = _data(seed=5, trapezoidal=True)
    V32, x32 = V.astype(np.float32), x.astype(np.float32)
    S = R.rows_factor(V32, np)
    assert S.dtype == np.float64
    y, _ = R.rows_product(V32, S, x32, np, False)
    assert y.dtype == np.float32
    ref = x32.astype(np.float64) @ product_of_reflections(V32.astype(np.float64)).T
    np.testing.assert_allclose(y, ref, rtol=0, atol=50 * EPS[np.float32] * N)


# -- blocks (the one node of a layer of any size) -----------------------------------------------

#: N = 7 in blocks of 3: [0, 3), [3, 6), [6, 7), the last one narrower
BLOCKS = 3


def test_column_blocks():
    """(row, s, e) per block: rows from s for trapezoidal V, from 0 otherwise; nb ≥ L is the
    single block."""
    assert R.column_blocks(7, 3, True) == [(0, 0, 3), (3, 3, 6), (6, 6, 7)]
    assert R.column_blocks(7, 3, False) == [(0, 0, 3), (0, 3, 6), (0, 6, 7)]
    assert R.column_blocks(7, 64, True) == [(0, 0, 7)]


@pytest.mark.parametrize("formed", [False, True])
@pytest.mark.parametrize("trapezoidal", [False, True])
def test_blocks_are_the_product_of_reflections(bk_eager, trapezoidal, formed):
    """y = x Qᵀ by three blocks (the operator path, and the formed W = blocks applied to I),
    with a zero column in the middle block: the product of the N reflections (H(0) = I),
    100·eps·N as for the single block; a wrong block order or a block reading the rows above
    its trapezoid is O(1) off."""
    V, x = _data(zero_column=True, trapezoidal=trapezoidal, seed=7)
    Q = product_of_reflections(V)
    xp = bk_eager.xp
    blocks = R.column_blocks(N, BLOCKS, trapezoidal)
    y, (Ss, kept) = R.layer_forward(bk_eager.asarray(V), bk_eager.asarray(x), xp, blocks, formed)
    assert len(Ss) == 3
    np.testing.assert_allclose(to_numpy(y), x @ Q.T, rtol=0, atol=100 * EPS[np.float64] * N)
    if formed:  # P = Qᵀ
        np.testing.assert_allclose(to_numpy(kept[0]), Q.T, rtol=0, atol=100 * EPS[np.float64] * N)


@pytest.mark.parametrize("formed", [False, True])
@pytest.mark.parametrize("trapezoidal", [False, True])
def test_blocks_vjp_dot_product_test(bk_eager, trapezoidal, formed):
    """⟨V̄, δV⟩ + ⟨x̄, δx⟩ equals the central difference of ℓ = ⟨G, x Qᵀ⟩ for three blocks
    (tolerance as for the single block); x̄ is None when not asked for and V̄ the same. For
    trapezoidal blocks V̄ is zero above each block's first row (those entries are not read),
    and δV is lower trapezoidal there (the map of tril(V))."""
    V, x = _data(trapezoidal=trapezoidal, seed=8)
    rng = np.random.default_rng(9)
    G, dV, dx = (rng.standard_normal(x.shape), rng.standard_normal(V.shape),
                 rng.standard_normal(x.shape))  # fmt: skip
    if trapezoidal:
        dV = np.tril(dV)
    xp = bk_eager.xp
    blocks = R.column_blocks(N, BLOCKS, trapezoidal)

    def loss(V_, x_):
        y, _ = R.layer_forward(bk_eager.asarray(V_), bk_eager.asarray(x_), xp, blocks, formed)
        return float(np.sum(G * to_numpy(y)))

    Vb, xb, Gb = bk_eager.asarray(V), bk_eager.asarray(x), bk_eager.asarray(G)
    _, state = R.layer_forward(Vb, xb, xp, blocks, formed)
    Vbar, xbar = R.layer_vjp(Vb, xb, Gb, state, xp, blocks, formed, True)
    eps = 1e-6
    fd = (loss(V + eps * dV, x + eps * dx) - loss(V - eps * dV, x - eps * dx)) / (2 * eps)
    pairing = float(np.sum(to_numpy(Vbar) * dV) + np.sum(to_numpy(xbar) * dx))
    assert abs(pairing - fd) <= 1e-7 * max(1.0, abs(fd))
    if trapezoidal:
        for row, s, e in blocks:
            np.testing.assert_array_equal(to_numpy(Vbar)[:row, s:e], 0.0)
    Vbar2, none = R.layer_vjp(Vb, xb, Gb, state, xp, blocks, formed, False)
    assert none is None
    np.testing.assert_allclose(to_numpy(Vbar2), to_numpy(Vbar), rtol=0, atol=0)


@pytest.mark.parametrize("formed", [False, True])
def test_blocks_in_place_equal_out_of_place(bk_eager, formed):
    """``inplace`` (updates inside the GEMM on one copy of x and of g, each block's input
    copied for the backward) gives the out-of-place results to rounding (the GEMM may
    accumulate in another order: 10·eps of the largest entry), and leaves x and g as they
    were. Namespaces whose arrays cannot be written (JAX) and array-api-strict take the
    out-of-place path only."""
    if not bk_eager.name.startswith(("numpy", "torch")):
        pytest.skip("in place: NumPy and torch (the layer's node)")
    V, x = _data(trapezoidal=True, seed=10)
    G = np.random.default_rng(11).standard_normal(x.shape)
    xp = bk_eager.xp
    blocks = R.column_blocks(N, BLOCKS, True)
    Vb, xb, Gb = bk_eager.asarray(V), bk_eager.asarray(x), bk_eager.asarray(G)
    out = []
    for inplace in (False, True):
        y, state = R.layer_forward(Vb, xb, xp, blocks, formed, inplace)
        out.append((y, *R.layer_vjp(Vb, xb, Gb, state, xp, blocks, formed, True, inplace)))
    for a, b in zip(*out, strict=True):
        scale = max(1.0, float(np.max(np.abs(to_numpy(b)))))
        atol = 10 * EPS[np.float64] * scale
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), rtol=0, atol=atol)
    np.testing.assert_array_equal(to_numpy(xb), x)
    np.testing.assert_array_equal(to_numpy(Gb), G)


@pytest.mark.parametrize("nb", [BLOCKS, N])  # several blocks, one block
def test_blocks_product_without_y_keeps_what_the_vjp_reads(bk_eager, nb):
    """``need_y=False`` (``hl.vjp.cwy_apply``'s blocked rule, which reads ``kept`` only; issue
    44, item 4) skips the update of the block applied last: y is None and ``kept`` is that
    of the full product bit for bit, in place and out of place (same operations on the same
    inputs), and x is left as it was. A skipped update of any other block, or a kept input
    taken after its own update, would differ by O(1)."""
    V, x = _data(seed=12)
    xp = bk_eager.xp
    blocks = R.column_blocks(N, nb, False)
    Vb, xb = bk_eager.asarray(V), bk_eager.asarray(x)
    Ss = R.blocks_factor(Vb, xp, blocks)
    modes = (False, True) if bk_eager.name.startswith(("numpy", "torch")) else (False,)
    for inplace in modes:
        _, full = R.blocks_product(Vb, Ss, xb, xp, blocks, inplace)
        y, kept = R.blocks_product(Vb, Ss, xb, xp, blocks, inplace, need_y=False)
        assert y is None and len(kept) == len(full) == len(blocks)
        for (z1, b1), (z2, b2) in zip(full, kept, strict=True):
            np.testing.assert_array_equal(to_numpy(z2), to_numpy(z1))
            np.testing.assert_array_equal(to_numpy(b2), to_numpy(b1))
        np.testing.assert_array_equal(to_numpy(xb), x)
