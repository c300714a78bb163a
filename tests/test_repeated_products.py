"""Repeated products of one operator switch to cheaper factors (issue 19, item 2).

A plain product (no autodiff) of a built operator computes Q h = h − U (T (Uᴴ h)); once the
columns its products have multiplied add up to N, the operator keeps the dense Q (one GEMM)
when it has more than N/2 reflectors, else W = U T (Q h = h − W (Uᴴ h), Qᴴ h = h − U (Wᴴ h)) —
``LazyFactors.product_factor``. These tests check that the switch happens when (and only
when) it should and to which factor, that every product before and after it equals the dense
product of the reflections, and that products recorded for autodiff never take it.

Tolerance: 100·eps·N on entries of O(1) — the product of an orthogonal Q with a vector of
O(1) entries, each entry a sum of N products whose rounding errors add up to a few eps·N (the
dense Q = I − (U T) Uᴴ is accurate to the same order).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require, to_numpy
from helpers import product_of_reflections

import householderla as hl


def _vs(seed: int, *shape: int, complex_: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    return a + 1j * rng.standard_normal(shape) if complex_ else a


def _tol(N: int) -> float:
    return 100 * np.finfo(np.float64).eps * N


def _built(op):
    op.U  # noqa: B018 - the factors, as a user who reuses the operator has them
    return op


@pytest.mark.no_dask("the operator's own products; Dask operands go chunk by chunk")
@pytest.mark.parametrize(
    ("N", "L", "dense", "complex_"),
    [
        pytest.param(
            *shape,
            cx,
            id=f"{cx}-{'-'.join(map(str, shape))}",
            # JAX: each (N, L) once, real and complex alternating
            marks=() if cx == bool(i % 2) else pytest.mark.jax_long("each (N, L) once on JAX"),
        )
        for i, shape in enumerate([(12, 12, True), (12, 7, True), (12, 6, False)])
        for cx in (False, True)
    ],
)
def test_products_before_and_after_the_switch_equal_the_definition(bk, N, L, dense, complex_):
    """Products with 1, then 4 columns (two products of 4 reach N = 12 after the first): the
    first products use U, T, later ones the dense Q when L > N/2, else W = U T and Wᴴ;
    Q h, Qᴴ h, Qᵀ h and vectors equal the dense product of the reflections throughout."""
    dt = np.complex128 if complex_ else np.float64
    V = _vs(0, N, L, complex_=complex_)
    Q = product_of_reflections(V)
    op = _built(hl.cwy(bk.asarray(V, dt)))
    f = op._factors
    plain = f.direct_type is not None or bk.xp.__name__.endswith("array_api_strict")
    for step, B in enumerate([1, 4, 4, 4, 4]):
        h = _vs(10 + step, N, B, complex_=complex_)
        for A, ref in ((op, Q), (op.H, Q.conj().T), (op.T, Q.T)):
            y = to_numpy(A @ bk.asarray(h, dt))
            np.testing.assert_allclose(y, ref @ h, atol=_tol(N))
        v = h[:, 0]
        np.testing.assert_allclose(to_numpy(op @ bk.asarray(v, dt)), Q @ v, atol=_tol(N))
    if plain and not bk.name.startswith("jax"):
        # every product above was plain: the dense Q when L > N/2, else W for both directions
        kinds = {kind for kind, _ in f.shortcut.values()}
        assert kinds == ({"dense"} if dense else {"folded"})
        assert sorted(f.shortcut) == [False, True]
    if bk.name.startswith("jax"):
        assert f.shortcut is None  # JAX products go through their custom_vjp rules


@pytest.mark.no_dask("the operator's own products")
def test_no_shortcut_before_the_columns_add_up_to_n(bk):
    """Products whose columns add up to less than N keep U, T (Q would not have paid yet)."""
    if bk.name.startswith("jax"):
        pytest.skip("JAX products never take the shortcut (tested above)")
    N, L = 16, 16
    op = _built(hl.cwy(bk.asarray(_vs(1, N, L))))
    for _ in range(3):
        op @ bk.asarray(_vs(2, N, 5))
    assert op._factors.shortcut is None
    op @ bk.asarray(_vs(3, N, 1))  # 16 columns in all
    assert op._factors.shortcut is not None


@pytest.mark.no_dask("the operator's own products")
@pytest.mark.parametrize(
    ("L", "kind", "complex_"),
    [
        pytest.param(
            L,
            kind,
            cx,
            id=f"{cx}-{L}-{kind}",
            # JAX: each shortcut once, real and complex alternating
            marks=() if cx == bool(i % 2) else pytest.mark.jax_long("each shortcut once on JAX"),
        )
        for i, (L, kind) in enumerate([(300, "dense"), (256, "folded")])
        for cx in (False, True)
    ],
)
def test_shortcut_of_many_reflectors_is_served_without_the_general_path(
    bk, monkeypatch, L, kind, complex_
):
    """L ≥ ``MIN_COLUMNS`` (no ``direct`` factors): once the shortcut of a direction is built,
    a NumPy or plain torch product goes straight to it (no operand resolution: ``_operand``
    is not called), and Q h, Qᴴ h, Qᵀ h and vectors still equal the dense product."""
    if not bk.name.startswith(("numpy", "torch")):
        pytest.skip("direct products serve NumPy arrays and plain torch tensors only")
    N, dt = 512, np.complex128 if complex_ else np.float64
    V = _vs(11, N, L, complex_=complex_)
    Q = np.eye(N, dtype=dt)
    for v in V.T:  # Q H(v) = Q − 2 (Q v) vᴴ / ‖v‖²: rank-1 updates (product_of_reflections'
        Q -= np.outer(Q @ v, 2 * v.conj() / np.vdot(v, v).real)  # N³ per reflection is slow)
    op = _built(hl.cwy(bk.asarray(V, dt)))
    assert op._factors.direct is None  # too many reflectors for the small-operator path
    ops = ((op, Q), (op.H, Q.conj().T), (op.T, Q.T))
    for A, _ in ops:  # N columns in all for each direction: every shortcut is built
        for _ in range(2):
            A @ bk.asarray(_vs(12, N, N // 2, complex_=complex_), dt)
    assert {k for k, _ in op._factors.shortcut.values()} == {kind}
    resolved = []
    real_operand = type(op)._operand
    monkeypatch.setattr(
        type(op), "_operand", lambda self, h: resolved.append(h) or real_operand(self, h)
    )
    h = _vs(13, N, 5, complex_=complex_)
    for A, ref in ops:
        np.testing.assert_allclose(to_numpy(A @ bk.asarray(h, dt)), ref @ h, atol=_tol(N))
        v = h[:, 1]
        np.testing.assert_allclose(to_numpy(A @ bk.asarray(v, dt)), ref @ v, atol=_tol(N))
    conjugated = 1 if complex_ else 0  # Qᵀ of complex Q is conj(Qᴴ conj(h)): general path
    assert len(resolved) == 2 * conjugated


@pytest.mark.no_dask("the operator's own products")
@pytest.mark.parametrize("complex_", [False, True])
def test_folded_factors_share_u_and_keep_the_first_gemm_row_major(bk, complex_):
    """The folded factors (F, G) of Q h = h − F (G h): Q keeps F = W = U T and G = Uᴴ, Qᴴ
    keeps F = U itself (no copy) and G = Wᴴ; each G is a row-major L × N array (a view of
    the row-major U made the first GEMM a transposed one, 1.07–1.17× slower at N = 1024,
    L = 256, B = 64), and the factors equal their definitions."""
    if not bk.name.startswith(("numpy", "torch")):
        pytest.skip("the layout of the factors is NumPy's and torch's")
    N, L = 40, 12
    dt = np.complex128 if complex_ else np.float64
    V = _vs(14, N, L, complex_=complex_)
    op = _built(hl.cwy(bk.asarray(V, dt)))
    for A in (op, op.H):
        A @ bk.asarray(_vs(15, N, N, complex_=complex_), dt)  # N columns: the switch
    f = op._factors
    U, T = to_numpy(f.U), to_numpy(f.T)
    W = U @ T
    (kq, (Fq, Gq)), (kh, (Fh, Gh)) = f.shortcut[False], f.shortcut[True]
    assert kq == kh == "folded" and Fh is f.U
    tol = _tol(N)
    np.testing.assert_allclose(to_numpy(Fq), W, atol=tol)
    np.testing.assert_allclose(to_numpy(Gq), U.conj().T, atol=tol)
    np.testing.assert_allclose(to_numpy(Gh), W.conj().T, atol=tol)
    for G in (Gq, Gh):
        row_major = G.flags.c_contiguous if type(G) is np.ndarray else G.is_contiguous()
        assert row_major and G.shape == (L, N)


def test_a_pickled_folded_w_of_an_earlier_version_is_rebuilt():
    """A state pickled when the folded shortcut was W alone ("folded", W) drops it on load
    and builds (F, G) on the next product; products with Q and Qᴴ equal the reflections'."""
    import pickle

    N, L = 12, 4
    V, h = _vs(16, N, L), _vs(17, N, N)
    op = _built(hl.cwy(V))
    op @ h
    op.H @ h
    f = op._factors
    f.shortcut = {False: ("folded", f.U @ f.T), True: ("folded", f.U @ f.T.T)}  # earlier layout
    op2 = pickle.loads(pickle.dumps(op))
    assert op2._factors.shortcut == {}
    ref = product_of_reflections(V)
    np.testing.assert_allclose(op2 @ h, ref @ h, atol=_tol(N))
    np.testing.assert_allclose(op2.H @ h, ref.T @ h, atol=_tol(N))
    assert {k: P[0] for k, P in op2._factors.shortcut.items()} == {False: "folded", True: "folded"}


def test_autodiff_products_never_take_the_shortcut_and_keep_their_gradient():
    """torch: products recorded for autograd use U, T through the explicit VJPs even after
    the shortcut exists (it holds no graph); the gradient matches a dense autograd oracle."""
    torch = require("torch")
    N, L = 10, 10
    V = torch.tensor(_vs(4, N, L), requires_grad=True)
    op = hl.cwy(V)
    with torch.no_grad():
        for _ in range(4):
            op @ torch.tensor(_vs(5, N, 4))
    h = torch.tensor(_vs(6, N, 3))
    y = op @ h  # a graph is recorded: factors rebuilt with a graph, no shortcut
    assert y.requires_grad
    (y * torch.tensor(_vs(7, N, 3))).sum().backward()
    V2 = torch.tensor(_vs(4, N, L), requires_grad=True)
    Qd = torch.eye(N, dtype=torch.float64)
    for k in range(L):
        v = V2[:, k : k + 1]
        Qd = Qd @ (torch.eye(N, dtype=torch.float64) - 2 * v @ v.T / (v.T @ v))
    ((Qd @ h) * torch.tensor(_vs(7, N, 3))).sum().backward()
    np.testing.assert_allclose(V.grad.numpy(), V2.grad.numpy(), atol=_tol(N))


def test_shortcut_does_not_write_the_inputs():
    """Read-only V and h (NumPy): the switch builds new arrays only."""
    N = 8
    V, h = _vs(8, N, N), _vs(9, N, 8)
    V.setflags(write=False)
    h.setflags(write=False)
    op = _built(hl.cwy(V))
    for _ in range(3):
        y = op @ h
    np.testing.assert_allclose(y, product_of_reflections(V) @ h, atol=_tol(N))
    assert op._factors.shortcut is not None


def test_a_pickled_dense_pair_of_an_earlier_version_still_serves_products():
    """A state pickled before W = U T existed holds the shortcut as the pair (Q, Qᴴ); loading
    it converts the pair, and products with Q and Qᴴ still equal the reflections'."""
    import pickle

    N = 8
    V, h = _vs(10, N, N), _vs(11, N, 3)
    op = _built(hl.cwy(V))
    for _ in range(3):
        op @ h
    f = op._factors
    Q, Qh = f.shortcut[False][1], f.shortcut[True][1]
    f.shortcut = (Q, Qh)  # the earlier layout, as a pickle of it stores it
    op2 = pickle.loads(pickle.dumps(op))
    assert op2._factors.shortcut[True][0] == "dense"
    ref = product_of_reflections(V)
    np.testing.assert_allclose(op2 @ h, ref @ h, atol=_tol(N))
    np.testing.assert_allclose(op2.H @ h, ref.T @ h, atol=_tol(N))
