"""Blocked compact WY (``householderla._operator.blocked``): Q = Q₁ ⋯ Q_m with Q_b the CWY of
the b-th block of reflectors, used by ``hl.cwy(V) @ h`` when L is large and h has few columns.

The oracle is the dense product of the definition H(v) = I − 2vvᵀ/‖v‖²
(``product_of_reflections``) in float64 NumPy. Tolerance 20·eps·L·‖h‖: each of the L reflections
adds a few ulps, whichever grouping applies them; a wrong block order, a missing block or a
transposed factor is off by O(1). The block size is shrunk (BLOCK = 4, MIN_L = 8) so that small
shapes run several blocks, including a partial last block.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require, to_numpy
from helpers import EPS, product_of_reflections

import householderla as hl
from householderla._operator import blocked as _blocked


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(_blocked, "BLOCK", 4)
    monkeypatch.setattr(_blocked, "MIN_L", 8)


def _data(seed, N, L, B, batch=()):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((*batch, N, L)), rng.standard_normal((*batch, N, B))


@pytest.mark.parametrize(
    ("N", "L", "B", "batch"), [(12, 10, 2, ()), (9, 9, 1, ()), (8, 8, 2, (3,))]
)
def test_blocked_product_equals_the_dense_product(bk, small_blocks, N, L, B, batch):
    """Q h and Qᵀ h of a fresh operator (blocks built: L ≥ MIN_L, 4B ≤ L) and of the same
    operator again (blocks reused), against the dense product; one-vector operands too."""
    V, h = _data(N + L, N, L, B, batch)
    Q = product_of_reflections(V)
    tol = 20 * EPS[np.float64] * L * np.abs(h).max()

    def twice(v, x):  # a fresh operator's product (blocks built), then again (reused), and Qᵀ
        op = hl.cwy(v)
        return op @ x, op @ x, op.T @ x

    y, y2, yt = bk.call(twice, bk.param(V), bk.asarray(h))
    np.testing.assert_allclose(to_numpy(y), Q @ h, rtol=0, atol=tol)
    np.testing.assert_allclose(to_numpy(y2), Q @ h, rtol=0, atol=tol)
    np.testing.assert_allclose(to_numpy(yt), np.swapaxes(Q, -1, -2) @ h, rtol=0, atol=tol)
    if not batch:
        y1 = bk.call(lambda v, x: hl.cwy(v) @ x, bk.param(V), bk.asarray(h[:, 0]))
        np.testing.assert_allclose(to_numpy(y1), Q @ h[:, 0], rtol=0, atol=tol)


@pytest.mark.no_dask("the rule check builds operators from NumPy only")
def test_blocks_are_used_only_where_they_pay(small_blocks, monkeypatch):
    """Blocks for the first product when L ≥ MIN_L and 4B ≤ L (and the sequential Numba
    kernel does not take it, as it does for N ≤ 512 on NumPy); never for T-CWY, for wide
    operands, or once the single factor pair is built (the ``.U`` property)."""
    monkeypatch.setenv("HL_DISABLE_NUMBA", "1")
    V, h = _data(1, 12, 12, 2)
    op = hl.cwy(V)
    op @ h
    assert op._factors.blocks is not None and op._factors.U is None
    wide = hl.cwy(V)
    wide @ np.ones((12, 4))  # 4B = 16 > L
    assert wide._factors.blocks is None
    built = hl.cwy(V)
    built.U  # noqa: B018 - builds the single pair
    built @ h
    assert built._factors.blocks is None
    t = hl.tcwy(V[:, :9])
    t @ np.ones((9, 2))
    assert t._factors.blocks is None


def test_torch_gradients_through_blocks_equal_the_single_block(small_blocks):
    """The backward of the blocked product (the blocks' explicit VJPs in reverse order, each
    reusing its forward's factors) equals the single block's, and gradcheck / gradgradcheck
    pass through it (float64)."""
    torch = require("torch")
    V, h = _data(3, 8, 8, 2)  # two blocks of 4
    Vt = torch.tensor(V, requires_grad=True)
    ht = torch.tensor(h, requires_grad=True)
    G = torch.tensor(np.random.default_rng(4).standard_normal((8, 2)))
    gb = torch.autograd.grad(((hl.cwy(Vt) @ ht) * G).sum(), (Vt, ht))
    single = hl.cwy(Vt)
    single.U  # noqa: B018 - the single factor pair: no blocks
    gs = torch.autograd.grad(((single @ ht) * G).sum(), (Vt, ht))
    for a, b in zip(gb, gs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=100 * EPS[np.float64])
    f = lambda v, x: hl.cwy(v) @ x  # noqa: E731
    assert torch.autograd.gradcheck(f, (Vt, ht))
    assert torch.autograd.gradgradcheck(f, (Vt, ht))


@pytest.mark.parametrize("B", [2, 20])  # blocks (B < L), the single pair's sequential paths
def test_zeros_of_a_recorded_v_are_not_its_structure(small_blocks, monkeypatch, B):
    """``structure="auto"`` on a lower-triangular V that autograd records: the zeros above the
    diagonal are values, so their derivatives are kept (the gradient equals that of
    ``structure="dense"``, nonzero above the diagonal). Detecting the structure there made the
    blocks skip rows < s and return 0 for those entries (a dense-V layer at its triangular
    Haar init then trained as a trapezoidal one)."""
    torch = require("torch")
    monkeypatch.setattr(_blocked, "MIN_L_GRAPH", 8)
    V, h = _data(5, 12, 12, B)
    Vt = torch.tensor(np.tril(V), requires_grad=True)
    G = torch.tensor(np.random.default_rng(6).standard_normal((12, B)))
    grads = [
        torch.autograd.grad(((hl.cwy(Vt, structure=s) @ torch.tensor(h)) * G).sum(), Vt)[0]
        for s in ("auto", "dense")
    ]
    upper = torch.triu(torch.ones(12, 12, dtype=torch.bool), diagonal=1)
    assert float(grads[1][upper].abs().max()) > 1e-3
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=100 * EPS[np.float64] * 12)


def test_jax_gradients_through_blocks(small_blocks):
    """jax.grad through the blocked product (each block's custom_vjp rules), eager and under
    jit, equals the single block's gradient."""
    jax = require("jax")
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)  # as the bk fixture does: float64 tolerances
    V, h = _data(5, 10, 10, 2)
    G = np.random.default_rng(6).standard_normal((10, 2))

    def loss(v, x):
        return jnp.sum((hl.cwy(v) @ x) * G)

    def loss_single(v, x):
        op = hl.cwy(v)
        op.U  # noqa: B018
        return jnp.sum((op @ x) * G)

    ref = jax.grad(loss_single, argnums=(0, 1))(jnp.asarray(V), jnp.asarray(h))
    for fn in (jax.grad(loss, argnums=(0, 1)), jax.jit(jax.grad(loss, argnums=(0, 1)))):
        got = fn(jnp.asarray(V), jnp.asarray(h))
        for a, b in zip(got, ref, strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-12)


@pytest.mark.no_dask("the row-offset check builds operators from NumPy only")
def test_trapezoidal_blocks_touch_only_their_rows(small_blocks, monkeypatch):
    """For lower-trapezoidal V (LAPACK / oRNN layout) block b's factors start at its first
    column's row: the product equals the dense one, the factors have N − s rows, and a
    product leaves the rows above a block's first row to the earlier blocks."""
    monkeypatch.setenv("HL_DISABLE_NUMBA", "1")
    rng = np.random.default_rng(8)
    N, L = 13, 12
    V = np.tril(rng.standard_normal((N, L)))
    h = rng.standard_normal((N, 3))
    op = hl.cwy(V)
    y = op @ h
    starts = [s for s, _, _ in op._factors.blocks]
    assert starts == [0, 4, 8]
    assert [U.shape for _, U, _ in op._factors.blocks] == [(13, 4), (9, 4), (5, 4)]
    Q = product_of_reflections(V)
    tol = 20 * EPS[np.float64] * L * np.abs(h).max()
    np.testing.assert_allclose(y, Q @ h, rtol=0, atol=tol)
    np.testing.assert_allclose(op.T @ h, Q.T @ h, rtol=0, atol=tol)


def test_jax_orthogonal_linear(small_blocks):
    """hl.jax.orthogonal_linear: x Wᵀ for square (blocked operator), tall and wide Stiefel
    weights, small and large batches (the formed W), under jit, with gradients equal to those
    through the formed weight; a mismatched x raises naming its shape."""
    jax = require("jax")
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)  # as the bk fixture does: float64 tolerances
    rng = np.random.default_rng(9)
    for N, L, k in ((10, 10, 10), (10, 6, 6), (10, 6, 10)):
        V = jnp.asarray(rng.standard_normal((N, L)))
        W = hl.cwy(V).matrix() if L == N else hl.tcwy(V).matrix()
        W = W if k == L else W.T  # (out, in)
        for rows in (3, 40):
            x = jnp.asarray(rng.standard_normal((rows, k)))
            y = jax.jit(hl.jax.orthogonal_linear)(V, x)
            np.testing.assert_allclose(np.asarray(y), np.asarray(x @ W.T), rtol=0, atol=1e-13)

            def loss(v, x=x):
                return jnp.sum(hl.jax.orthogonal_linear(v, x) ** 3)

            def loss_ref(v, x=x, L=L, N=N, k=k):
                w = hl.cwy(v).matrix() if L == N else hl.tcwy(v).matrix()
                return jnp.sum((x @ (w if k == L else w.T).T) ** 3)

            np.testing.assert_allclose(
                np.asarray(jax.grad(loss)(V)), np.asarray(jax.grad(loss_ref)(V)), atol=1e-11
            )
    with pytest.raises(ValueError, match=r"x must have shape"):
        hl.jax.orthogonal_linear(jnp.ones((5, 3)), jnp.ones((2, 4)))


@pytest.mark.no_dask("complex blocks are checked on the eager backends")
def test_complex_blocks_with_phases(bk_eager, small_blocks, monkeypatch):
    """Complex reflectors in blocks: Q h, Qᴴ h (``.H``) and the right phase factor
    diag(e^{iθ}) of ``theta=`` agree with the dense product of the Hermitian reflections."""
    bk = bk_eager
    if bk.name == "array_api_strict":  # complex there is covered by tests/test_cwy.py
        pytest.skip("complex blocks are checked on numpy, torch and jax")
    monkeypatch.setenv("HL_DISABLE_NUMBA", "1")
    rng = np.random.default_rng(10)
    N = L = 10
    V = rng.standard_normal((N, L)) + 1j * rng.standard_normal((N, L))
    h = rng.standard_normal((N, 2)) + 1j * rng.standard_normal((N, 2))
    theta = rng.uniform(-np.pi, np.pi, N)
    Q = product_of_reflections(V) * np.exp(1j * theta)[None, :]
    tol = 20 * EPS[np.float64] * L * np.abs(h).max()
    op = hl.cwy(bk.asarray(V, np.complex128), theta=bk.asarray(theta))
    y = to_numpy(op @ bk.asarray(h, np.complex128))
    np.testing.assert_allclose(y, Q @ h, rtol=0, atol=tol)
    assert op._factors.blocks is not None
    yh = to_numpy(op.H @ bk.asarray(h, np.complex128))
    np.testing.assert_allclose(yh, Q.conj().T @ h, rtol=0, atol=tol)


def test_torch_autodiff_uses_blocks_at_every_width(monkeypatch):
    """With autograd recording (torch), the first product builds blocks from L ≥ MIN_L_GRAPH
    on, whatever the width B (``use_blocks(graph=True)``; without a graph 4B ≤ L and
    L ≥ MIN_L still decide), and its gradients equal the sequential reflections' (an
    independent oracle: ``householder_apply``'s own backward); wide and column-major
    operands (a layer's ``x.mT``) included."""
    torch = require("torch")
    monkeypatch.setattr(_blocked, "BLOCK", 4)
    monkeypatch.setattr(_blocked, "MIN_L_GRAPH", 8)
    assert _blocked.use_blocks(8, 100, graph=True) and not _blocked.use_blocks(4, 1, graph=True)
    assert not _blocked.use_blocks(8, 100) and not _blocked.use_blocks(300, 100)
    V, _ = _data(5, 9, 9, 1)
    x = np.random.default_rng(6).standard_normal((20, 9))  # B = 20 > L: wide
    G = torch.tensor(np.random.default_rng(7).standard_normal((9, 20)))
    Vt = torch.tensor(V, requires_grad=True)
    xt = torch.tensor(x, requires_grad=True)
    op = hl.cwy(Vt)
    y = op @ xt.mT  # column-major operand
    assert op._factors.blocks is not None and op._factors.U is None
    gb = torch.autograd.grad((y * G).sum(), (Vt, xt))
    y_ref = hl.torch.householder_apply(Vt, xt.mT)
    g_ref = torch.autograd.grad((y_ref * G).sum(), (Vt, xt))
    tol = 100 * EPS[np.float64] * 9
    torch.testing.assert_close(y, y_ref, rtol=0, atol=tol)
    for a, b in zip(gb, g_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=tol * float(G.abs().max()) * 20)
    with torch.no_grad():  # no graph: the plain rule (4B > L: the single pair)
        plain = hl.cwy(Vt)
        plain @ xt.mT
        assert plain._factors.blocks is None


def test_lowrank_vjp_options_give_the_same_cotangents():
    """``lowrank_vjp`` with h and g concatenated (B ≤ FUSE_MAX_COLUMNS) or not, with the
    forward's (a, b) passed in (``parts``) and with h̄ and S̄ skipped (``need_h=False``,
    ``need_s=False``) returns the
    same Ū, T̄, S̄ (and h̄ where asked) as the plain unfused call; and S̄ = −Tᵀ T̄ Tᵀ."""
    from householderla._agnostic import compact_wy as K

    rng = np.random.default_rng(8)
    N, L = 10, 6
    U, T, _ = K.cwy_factors(rng.standard_normal((N, L)), np)
    for B in (3, K.FUSE_MAX_COLUMNS + 5):
        h, g = rng.standard_normal((N, B)), rng.standard_normal((N, B))
        for transpose in (False, True):
            kw = {"transpose": transpose, "mode": "square"}
            ref = K.lowrank_vjp(U, T, h, g, np, fuse=False, **kw)
            _, a, b = K.lowrank_apply_parts(U, T, h, np, **kw)
            for out in (
                K.lowrank_vjp(U, T, h, g, np, **kw),
                K.lowrank_vjp(U, T, h, g, np, parts=(a, b), **kw),
            ):
                for x, y in zip(out, ref, strict=True):
                    np.testing.assert_allclose(x, y, rtol=0, atol=1e3 * EPS[np.float64])
            skipped = K.lowrank_vjp(U, T, h, g, np, need_h=False, need_s=False, **kw)
            assert skipped[1] is None and skipped[3] is None
            np.testing.assert_allclose(skipped[2], ref[2], rtol=0, atol=1e3 * EPS[np.float64])
            np.testing.assert_allclose(skipped[0], ref[0], rtol=0, atol=1e3 * EPS[np.float64])
            np.testing.assert_allclose(
                K.s_bar_from_t_bar(T, ref[2], np), ref[3], rtol=0, atol=1e3 * EPS[np.float64]
            )
