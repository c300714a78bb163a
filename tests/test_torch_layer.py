"""``hl.torch.OrthogonalLinear``: a linear layer with an orthogonal / Stiefel weight, applied to
small batches without forming it (issue 19, item 3).

Oracles: ``x Wᵀ + b`` with the formed weight (``layer.weight``, the map of
``hl.torch.orthogonal``), and torch autograd through that formed weight for the gradients.
Both paths run the same reflections in another grouping: float64 results agree to
100·eps·N (N reflections of a few ulps each on O(1) entries); a missing transpose, a
wrong block order or a lost bias is off by O(1).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require
from helpers import EPS

torch = require("torch")

import householderla as hl  # noqa: E402
from householderla._operator import blocked as _blocked  # noqa: E402
from householderla.torch import _layer as _torch_layer  # noqa: E402

TOL = 100 * EPS[np.float64]
SHAPES = [(16, 16, "cwy"), (12, 8, "cwy"), (8, 12, "tcwy"), (12, 8, "tcwy"), (10, 6, "svd"),
          (6, 10, "svd")]  # fmt: skip


def _pair(in_f, out_f, map_, bias=True):
    """Two identical layers (same parameters)."""
    a = hl.torch.OrthogonalLinear(
        in_f, out_f, bias, map_, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    b = hl.torch.OrthogonalLinear(
        in_f, out_f, bias, map_, generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )
    return a, b


@pytest.mark.parametrize(("in_f", "out_f", "map_"), SHAPES)
def test_operator_path_equals_the_formed_weight(in_f, out_f, map_, monkeypatch):
    """Forward and gradients (to the vectors, the bias and x) of the operator path equal those
    through the formed weight, for square, tall and wide weights of every map, with leading
    batch axes; the weight is orthonormal."""
    monkeypatch.setattr(_blocked, "BLOCK", 4)  # several blocks at these sizes
    monkeypatch.setattr(_blocked, "MIN_L", 8)
    op_layer, w_layer = _pair(in_f, out_f, map_)
    x = torch.randn(2, 3, in_f, dtype=torch.float64, requires_grad=True)
    G = torch.randn(2, 3, out_f, dtype=torch.float64)
    assert op_layer.uses_operator(6)
    y = op_layer(x)
    gx = torch.autograd.grad((y * G).sum(), x, retain_graph=True)[0]
    (y * G).sum().backward()
    monkeypatch.setattr(_torch_layer, "OPERATOR_MAX_ROWS", 0.0)  # forms W
    assert not w_layer.uses_operator(6)
    y_ref = w_layer(x)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=TOL * max(in_f, out_f))
    torch.testing.assert_close(y_ref, x @ w_layer.weight.T + w_layer.bias, rtol=0, atol=TOL)
    gx_ref = torch.autograd.grad((y_ref * G).sum(), x, retain_graph=True)[0]
    (y_ref * G).sum().backward()
    torch.testing.assert_close(gx, gx_ref, rtol=0, atol=TOL * max(in_f, out_f))
    for p, q in zip(op_layer.parameters(), w_layer.parameters(), strict=True):
        assert p.grad is not None and float(p.grad.abs().max()) > 0
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e3 * TOL)
    W = op_layer.weight.detach()
    M = W.T @ W if out_f >= in_f else W @ W.T
    torch.testing.assert_close(M, torch.eye(min(in_f, out_f), dtype=W.dtype), rtol=0, atol=TOL)


def test_training_keeps_the_weight_orthogonal_and_learns():
    """SGD on a regression towards an orthogonal target: the loss falls and W stays
    orthogonal to rounding (float32: 50·eps·N, the float64-accumulated map rounded once)."""
    torch.manual_seed(0)
    N = 24
    target = torch.linalg.qr(torch.randn(N, N))[0]
    layer = hl.torch.OrthogonalLinear(N, N, bias=False, generator=torch.Generator().manual_seed(2))
    opt = torch.optim.SGD(layer.parameters(), lr=0.05)
    x = torch.randn(8, N)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = ((layer(x) - x @ target.T) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]
    W = layer.weight.detach().double()
    err = float((W.T @ W - torch.eye(N, dtype=W.dtype)).abs().max())
    assert err <= 50 * EPS[np.float32] * N


def test_weight_assignment_and_identity_init():
    """``layer.weight = Q`` sets the vectors by the constructive inverse (Q comes back);
    ``init="identity"`` starts at I with trainable (nonzero) vectors."""
    layer = hl.torch.OrthogonalLinear(7, 7, bias=False, dtype=torch.float64)
    Q = torch.linalg.qr(torch.randn(7, 7, dtype=torch.float64))[0]
    layer.weight = Q
    torch.testing.assert_close(layer.weight.detach(), Q, rtol=0, atol=TOL * 7)
    ident = hl.torch.OrthogonalLinear(5, 5, init="identity", dtype=torch.float64)
    torch.testing.assert_close(ident.weight.detach(), torch.eye(5, dtype=torch.float64),
                               rtol=0, atol=TOL)  # fmt: skip
    assert float(ident.vectors[0].detach().abs().sum()) > 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="in_features"):
        hl.torch.OrthogonalLinear(0, 3)
    with pytest.raises(ValueError, match="map"):
        hl.torch.OrthogonalLinear(3, 3, map="expm")
    with pytest.raises(ValueError, match="init"):
        hl.torch.OrthogonalLinear(3, 3, init="keep")
    with pytest.raises(TypeError, match="dtype"):
        hl.torch.OrthogonalLinear(3, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match="structure must be one of"):
        hl.torch.OrthogonalLinear(3, 3, structure="upper")
    for args in ((4, 3, True, "cwy"), (3, 3, True, "tcwy"), (3, 3, True, "svd")):
        with pytest.raises(ValueError, match="structure='trapezoidal' applies to a square"):
            hl.torch.OrthogonalLinear(*args, structure="trapezoidal")
    layer = hl.torch.OrthogonalLinear(4, 3)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 4\)"):
        layer(torch.randn(2, 5))
    assert "in_features=4, out_features=3" in repr(layer)


@pytest.mark.parametrize("rows", [5, 30])  # the operator path (B ≤ N), the formed one (B > N)
def test_trapezoidal_reflectors_and_their_gradients(rows, monkeypatch):
    """A square "cwy" layer reads its reflectors from the lower trapezoid of V by default:
    V starts lower trapezoidal (Haar init by Householder QR), the entries above the diagonal
    get zero gradients and stay zero under SGD, and the gradients of the others equal those
    through ``layer.weight`` (the single factor pair of tril(V), an independent oracle) on the
    blocked operator path and on the formed one (blocks applied to I). ``structure="dense"``
    trains every entry."""
    monkeypatch.setattr(_blocked, "BLOCK", 4)
    monkeypatch.setattr(_blocked, "MIN_L_GRAPH", 8)
    N = 12
    layer = hl.torch.OrthogonalLinear(N, N, generator=torch.Generator().manual_seed(3),
                                      dtype=torch.float64)  # fmt: skip
    assert layer.structure == "trapezoidal" and "structure='trapezoidal'" in repr(layer)
    V = layer.vectors[0]
    upper = torch.triu(torch.ones(N, N, dtype=torch.bool), diagonal=1)
    assert not bool(V.detach()[upper].any())
    x = torch.randn(rows, N, dtype=torch.float64)
    G = torch.randn(rows, N, dtype=torch.float64)
    assert layer.uses_operator(rows) == (rows <= N)
    (layer(x) * G).sum().backward()
    g_path = V.grad.clone()
    V.grad = None
    ((x @ layer.weight.T + layer.bias) * G).sum().backward()
    assert not bool(g_path[upper].any()) and float(g_path.abs().max()) > 0
    torch.testing.assert_close(g_path, V.grad, rtol=0, atol=1e3 * TOL * rows)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    opt.step()
    assert not bool(V.detach()[upper].any())
    W = layer.weight.detach()
    torch.testing.assert_close(W.T @ W, torch.eye(N, dtype=W.dtype), rtol=0, atol=TOL * N)
    dense = hl.torch.OrthogonalLinear(N, N, structure="dense", dtype=torch.float64)
    (dense(x) * G).sum().backward()
    assert float(dense.vectors[0].grad[upper].abs().max()) > 0


def test_trapezoidal_assignment_reaches_both_determinants_and_trains():
    """Assigning Q (det +1 and det −1) gives back Q with lower-trapezoidal vectors; assigning
    I (all-zero Householder vectors) and ``init="identity"`` give I by pairs that the mask
    keeps (column j reads rows ≥ j), which train: one SGD step moves W, and W stays
    orthogonal."""
    N = 7
    upper = torch.triu(torch.ones(N, N, dtype=torch.bool), diagonal=1)
    layer = hl.torch.OrthogonalLinear(N, N, bias=False, dtype=torch.float64)
    Q = torch.linalg.qr(torch.randn(N, N, dtype=torch.float64))[0]
    for sign in (1.0, -1.0):
        Qs = Q.clone()
        Qs[:, 0] *= sign * torch.sign(torch.linalg.det(Q))
        layer.weight = Qs
        assert not bool(layer.vectors[0].detach()[upper].any())
        torch.testing.assert_close(layer.weight.detach(), Qs, rtol=0, atol=TOL * N)
    eye = torch.eye(N, dtype=torch.float64)
    layer.weight = eye
    ident = hl.torch.OrthogonalLinear(N, N, bias=False, init="identity", dtype=torch.float64)
    for lay in (layer, ident):
        V = lay.vectors[0].detach()
        assert not bool(V[upper].any()) and float(V.abs().sum()) > 0
        torch.testing.assert_close(lay.weight.detach(), eye, rtol=0, atol=TOL * N)
        x = torch.randn(4, N, dtype=torch.float64)
        (lay(x) * torch.randn(4, N, dtype=torch.float64)).sum().backward()
        torch.optim.SGD(lay.parameters(), lr=0.1).step()
        W = lay.weight.detach()
        assert float((W - eye).abs().max()) > 1e-3
        torch.testing.assert_close(W.T @ W, eye, rtol=0, atol=TOL * N)


def _graph_nodes(y: torch.Tensor) -> set[str]:
    """Names of the autograd nodes behind y."""
    seen, todo = set(), [y.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and type(node).__name__ not in seen:
            seen.add(type(node).__name__)
            todo += [n for n, _ in node.next_functions]
    return seen


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    ("rows", "single"),  # the operator path (B ≤ N); the formed one (B > N), one block or blocks
    [(5, False), (30, True), (30, False)],
)
@pytest.mark.parametrize("structure", ["trapezoidal", "dense"])
def test_one_node_equals_the_composed_nodes(structure, rows, single, dtype, monkeypatch):
    """A square CWY layer trains through one ``CWYLinear`` node (the unnormalised form in
    blocks, ``_agnostic.cwy_rows``); its output and the gradients of V, the bias and x equal
    those of the composed nodes (unit columns, blocks of 4; forced by ``ONE_NODE = False``).
    N = 12 in blocks of 4: three blocks of trapezoidal rows 0…, 4…, 8… (or full rows), the
    formed W from one block (``SINGLE_BLOCK_MAX_N`` ≥ N) or from the blocks applied to I.
    Both run N reflections in another grouping: 100·eps·N of the entries' size in float64;
    in float32 both accumulate the Gram in float64 and round each product once, 50·eps·N.
    A missing transpose, a wrong block order or a lost term is off by O(1). x is left as
    it was (the node updates its own copy in place)."""
    monkeypatch.setattr(_blocked, "BLOCK", 4)
    monkeypatch.setattr(_blocked, "MIN_L_GRAPH", 8)
    monkeypatch.setattr(_torch_layer, "SINGLE_BLOCK_MAX_N", 12 if single else 0)
    monkeypatch.setattr(_torch_layer, "FORMED_BLOCK", 4)
    monkeypatch.setattr(_torch_layer, "THREADED_SINGLE_BLOCK_MAX_N", 0)  # any thread count
    N = 12

    def make():
        gen = torch.Generator().manual_seed(5)
        return hl.torch.OrthogonalLinear(N, N, structure=structure, dtype=dtype, generator=gen)

    one, composed = make(), make()
    eps = EPS[np.float64 if dtype == torch.float64 else np.float32]
    tol = (100 if dtype == torch.float64 else 50) * eps * N
    x = torch.randn(1, rows, N, dtype=dtype, requires_grad=True)  # a leading batch axis
    x0 = x.detach().clone()
    G = torch.randn(1, rows, N, dtype=dtype)
    results = []
    for layer, node in ((one, True), (composed, False)):
        monkeypatch.setattr(_torch_layer, "ONE_NODE", node)
        assert layer._one_node(x.reshape(-1, N)) == node
        y = layer(x)
        assert ("CWYLinearBackward" in _graph_nodes(y)) == node
        gx = torch.autograd.grad((y * G).sum(), x, retain_graph=True)[0]
        (y * G).sum().backward()
        results.append((y.detach(), gx, [layer.vectors[0].grad, layer.bias.grad]))
    assert torch.equal(x.detach(), x0)
    (y1, gx1, g1), (y0, gx0, g0) = results
    torch.testing.assert_close(y1, y0, rtol=0, atol=tol * float(y0.abs().max()))
    torch.testing.assert_close(gx1, gx0, rtol=0, atol=tol * float(gx0.abs().max()))
    for a, b in zip(g1, g0, strict=True):
        assert float(b.abs().max()) > 0
        torch.testing.assert_close(a, b, rtol=0, atol=tol * float(b.abs().max()))
    if structure == "trapezoidal":
        upper = torch.triu(torch.ones(N, N, dtype=torch.bool), diagonal=1)
        assert not bool(g1[0][upper].any())


@pytest.mark.parametrize("block", [5, 2])  # one block; blocks of 2 (the last one of 1)
@pytest.mark.parametrize("formed", [False, True])
@pytest.mark.parametrize("trapezoidal", [False, True])
def test_one_node_first_and_second_derivatives(trapezoidal, formed, block):
    """``gradcheck`` and ``gradgradcheck`` of the one-node product (V, x) ↦ x Qᵀ, in one
    block and in blocks of 2 (N = 5: blocks [0, 2), [2, 4), [4, 5)): the first derivatives
    come from the in-place backward, the second ones (a gradient penalty's) from the same
    operations recomputed out of place under grad mode in the backward, which autograd
    records."""
    from householderla._autodiff.torch import CWYLinear

    gen = torch.Generator().manual_seed(6)
    V = torch.randn(5, 5, dtype=torch.float64, generator=gen).requires_grad_(True)
    x = torch.randn(8 if formed else 3, 5, dtype=torch.float64, generator=gen)
    x.requires_grad_(True)

    def f(V_, x_):
        return CWYLinear.apply(V_, x_, trapezoidal, formed, block)

    assert torch.autograd.gradcheck(f, (V, x))
    assert torch.autograd.gradgradcheck(f, (V, x))


@pytest.mark.parametrize("need_x", [True, False])
@pytest.mark.parametrize("masked", [True, False])  # cached masks; triu (MASKED_MAX_N = 0)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(("formed", "block"), [(False, 9), (False, 4), (True, 9), (True, 4)])
@pytest.mark.parametrize("trapezoidal", [False, True])
def test_one_node_equals_the_agnostic_rule(
    trapezoidal, formed, block, dtype, masked, need_x, monkeypatch
):
    """The node's torch calls (``_autodiff.torch._node_forward`` / ``_node_vjp``: S = G ∘ H
    from a cached mask, E(M) by one ``where``, solves in place) give the output and the
    gradients of V and x of the namespace-generic rule they transcribe
    (``_agnostic.cwy_rows.layer_forward`` / ``layer_vjp``, the node's former body), one
    block (9) and blocks of 4 (three, the last of 1), applied and formed, with the
    masks and with the ``triu`` fallback above ``MASKED_MAX_N``. V has a zero column
    (H(0) = I: ``_factor`` sets S_jj := 1), whose gradient is exactly 0. The formed
    blocks read only their trailing rows (``identity``). Same dtypes and operations, in
    another association (the solves from the left or right, in place or not, fewer zero
    rows; without x̄ the cotangent's update skips the columns no later block reads): 20·eps·N
    of the largest entry; a transposed solve or a lost term is off by O(1)."""
    import array_api_compat

    from householderla._agnostic import cwy_rows as R
    from householderla._autodiff import torch as _autodiff_torch

    if not masked:
        monkeypatch.setattr(_autodiff_torch, "MASKED_MAX_N", 0)
    xp = array_api_compat.array_namespace(torch.empty(0))
    N = 9
    gen = torch.Generator().manual_seed(7)
    V = torch.randn(N, N, dtype=dtype, generator=gen)
    V[:, 3] = 0
    x = torch.randn(12 if formed else 5, N, dtype=dtype, generator=gen)
    g = torch.randn(x.shape, dtype=dtype, generator=gen)
    Vr, xr = V.clone().requires_grad_(True), x.clone().requires_grad_(need_x)
    y = _autodiff_torch.CWYLinear.apply(Vr, xr, trapezoidal, formed, block)
    V_bar, *x_bar = torch.autograd.grad(y, (Vr, xr) if need_x else (Vr,), g)
    Vt = V.tril() if trapezoidal else V
    blocks = R.column_blocks(N, block, trapezoidal)
    y0, state = R.layer_forward(Vt, x, xp, blocks, formed)
    V_bar0, x_bar0 = R.layer_vjp(Vt, x, g, state, xp, blocks, formed, True)
    V_bar0 = V_bar0.tril() if trapezoidal else V_bar0
    tol = 20 * torch.finfo(dtype).eps * N
    pairs = ((y, y0), (V_bar, V_bar0), *(((x_bar[0], x_bar0),) if need_x else ()))
    for a, b in pairs:
        assert float(b.abs().max()) > 0
        torch.testing.assert_close(a.detach(), b, rtol=0, atol=tol * float(b.abs().max()))
    assert not bool(V_bar[:, 3].any())


def test_one_node_dispatch(monkeypatch):
    """The one node runs for a training forward only: not without grad, not for x of another
    dtype, not with ``ONE_NODE = False``, not under ``torch.func`` (whose gradient, through
    the composed rules, equals the one node's), never for the other maps; it gets blocks of
    ``_blocked.BLOCK`` for the operator path above N = ``SINGLE_BLOCK_APPLIED_MAX_N`` and one
    block below, and one block for a formed W with N ≤ ``SINGLE_BLOCK_MAX_N``; NaN in V
    raises as on the composed path."""
    from householderla._autodiff.torch import CWYLinear

    layer = hl.torch.OrthogonalLinear(6, 6, dtype=torch.float64)
    x = torch.randn(3, 6, dtype=torch.float64)
    assert layer._one_node(x)
    with torch.no_grad():
        assert not layer._one_node(x)
    assert not layer._one_node(x.float())
    monkeypatch.setattr(_torch_layer, "ONE_NODE", False)
    assert not layer._one_node(x)
    monkeypatch.undo()
    monkeypatch.setattr(_torch_layer, "THREADED_SINGLE_BLOCK_MAX_N", 0)  # any thread count
    assert not hl.torch.OrthogonalLinear(6, 6, map="tcwy", dtype=torch.float64)._one_node(x)
    calls = []

    class Spy:
        @staticmethod
        def apply(*args):
            calls.append((tuple(args[1].shape), args[3], args[4]))
            return CWYLinear.apply(*args)

    monkeypatch.setattr(_torch_layer, "CWYLinear", Spy)
    G = torch.randn(3, 6, dtype=torch.float64)
    layer(torch.randn(7, 6, dtype=torch.float64))  # B > N: W formed, from one block
    (layer(x) * G).sum().backward()
    assert calls == [((7, 6), True, 6), ((3, 6), False, 6)]  # N ≤ SINGLE_BLOCK_APPLIED_MAX_N
    calls.clear()
    wide = hl.torch.OrthogonalLinear(200, 200, dtype=torch.float64)
    wide(torch.randn(3, 200, dtype=torch.float64)).sum().backward()
    assert calls == [((3, 200), False, _blocked.BLOCK)]  # the operator path's blocks
    calls.clear()
    params = dict(layer.named_parameters())

    def loss(p):
        return (torch.func.functional_call(layer, p, (x,)) * G).sum()

    grads = torch.func.grad(loss)({k: v.detach() for k, v in params.items()})
    assert calls == []  # the transform took the composed rules
    for k, v in params.items():
        torch.testing.assert_close(grads[k], v.grad, rtol=0, atol=1e3 * TOL)
    with torch.no_grad():
        layer.vectors[0][4, 1] = float("nan")
    with pytest.raises(ValueError, match=r"V contains NaN or Inf \(in column\(s\) \[1\]\)"):
        layer(x)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("rows", [6, 30])  # applied (B ≤ N), W formed (B > N)
@pytest.mark.parametrize("structure", ["trapezoidal", "dense"])
def test_unrecorded_forward_is_the_training_forward(structure, rows, dtype, monkeypatch):
    """A forward nothing records (``no_grad``, ``inference_mode``, vectors that do not require
    grad) runs the training node's forward without the node (``node_forward``): the same
    blocks, so the same bits as the recorded forward; it equals x Wᵀ + b with the formed
    weight (100·eps·N in float64; 50·eps·N in float32, where both round each product once
    from a float64 Gram) and leaves x as it was. Blocks of 4 at N = 12 (three blocks of
    trapezoidal rows 0…, 4…, 8…; the formed W from the blocks applied to I). A frozen layer
    whose input requires grad keeps the recorded operator, and x's gradient flows."""
    monkeypatch.setattr(_blocked, "BLOCK", 4)
    monkeypatch.setattr(_torch_layer, "SINGLE_BLOCK_MAX_N", 0)
    monkeypatch.setattr(_torch_layer, "SINGLE_BLOCK_APPLIED_MAX_N", 0)
    monkeypatch.setattr(_torch_layer, "FORMED_BLOCK", 4)
    monkeypatch.setattr(_torch_layer, "THREADED_SINGLE_BLOCK_MAX_N", 0)  # any thread count
    N = 12
    gen = torch.Generator().manual_seed(7)
    layer = hl.torch.OrthogonalLinear(N, N, structure=structure, dtype=dtype, generator=gen)
    eps = EPS[np.float64 if dtype == torch.float64 else np.float32]
    tol = (100 if dtype == torch.float64 else 50) * eps * N
    x = torch.randn(2, rows // 2, N, dtype=dtype)  # a leading batch axis
    x2 = x.reshape(-1, N)
    x0 = x.clone()
    trained = layer(x)  # recorded: the one node
    assert "CWYLinearBackward" in _graph_nodes(trained)
    path = _torch_layer.plan_layer(layer._layer_facts(x2))
    assert path.name.startswith("one_node")
    outs = []
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            facts = layer._layer_facts(x2)
            assert facts.node_inference and not facts.one_node
            inferred = _torch_layer.plan_layer(facts)
            assert inferred.name == path.name.replace("one_node", "node_forward")
            assert inferred.block == path.block == 4
            outs.append(layer(x))
    for p in layer.parameters():
        p.requires_grad_(False)
    outs.append(layer(x))
    assert torch.equal(x, x0)
    W = layer.weight.detach()
    for y in outs:
        assert y.grad_fn is None and y.shape == (*x.shape[:-1], N)
        assert torch.equal(y, trained.detach())
    ref = x @ W.T + layer.bias
    torch.testing.assert_close(outs[0], ref, rtol=0, atol=tol * float(ref.abs().max()))
    xg = x.clone().requires_grad_(True)
    assert not layer._layer_facts(xg.reshape(-1, N)).node_inference
    y = layer(xg)
    (gx,) = torch.autograd.grad((y * y).sum(), xg)
    torch.testing.assert_close(gx, 2 * y.detach() @ W, rtol=0, atol=tol * float(gx.abs().max()))


def test_inference_mode_first_then_double_backward():
    """A layer's first forward under ``torch.inference_mode`` (the node's masks are cached
    then) leaves a later training step's double backward working: the cached masks are
    normal tensors, not inference tensors (which autograd refuses to save). The second
    derivative equals the composed nodes' (``ONE_NODE = False``) to 1e3·eps of its size."""
    from householderla._autodiff import torch as node

    node._masks.cache_clear()
    N = 11  # one block of 11: the masks of n = 11 are made by the inference-mode call
    layer = hl.torch.OrthogonalLinear(N, N, dtype=torch.float64)
    x = torch.randn(4, N, dtype=torch.float64)
    with torch.inference_mode():
        layer(x)
    assert not node._masks(N, torch.float64, x.device)[0].is_inference()
    V = layer.vectors[0]
    out = []
    for one in (True, False):
        _torch_layer.ONE_NODE, saved = one, _torch_layer.ONE_NODE
        try:
            y = layer(x)
            (g,) = torch.autograd.grad((y * y.roll(1, 1)).sum(), V, create_graph=True)
            out.append(torch.autograd.grad((g * g).sum(), V)[0])
        finally:
            _torch_layer.ONE_NODE = saved
    assert float(out[1].abs().max()) > 0
    torch.testing.assert_close(out[0], out[1], rtol=0, atol=1e3 * TOL * float(out[1].abs().max()))


def test_unrecorded_forward_dispatch_and_bad_vectors():
    """``node_forward`` runs for a square CWY layer only (not T-CWY or SVD, not x of another
    dtype, not with ``ONE_NODE = False``), and NaN in V raises there as on the recorded
    paths."""
    layer = hl.torch.OrthogonalLinear(6, 6, dtype=torch.float64)
    x = torch.randn(3, 6, dtype=torch.float64)
    with torch.no_grad():
        assert layer._layer_facts(x).node_inference
        assert not layer._layer_facts(x.float()).node_inference
        for map_, out in (("tcwy", 4), ("svd", 6)):
            other = hl.torch.OrthogonalLinear(6, out, map=map_, dtype=torch.float64)
            assert not other._layer_facts(x).node_inference
        layer.vectors[0][4, 1] = float("nan")
        with pytest.raises(ValueError, match=r"V contains NaN or Inf \(in column\(s\) \[1\]\)"):
            layer(x)


@pytest.mark.parametrize("map_", ["cwy", "tcwy"])
def test_output_is_not_a_view(map_):
    """Without a bias the output is a new tensor, not a view, for rows of any shape (one node
    and the operator path): ``fully_shard`` hooks a module's outputs for its backward, and
    an in-place op on a view would drop the hook (FSDP2 warns of such an output); the 3-D
    output and its gradients equal the 2-D ones."""
    layer = hl.torch.OrthogonalLinear(6, 6 if map_ == "cwy" else 4, False, map_,
                                      dtype=torch.float64)  # fmt: skip
    x = torch.randn(2, 3, 6, dtype=torch.float64)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            y2, y3 = layer(x.reshape(6, 6)), layer(x)
        assert y2._base is None and y3._base is None, (map_, grad)
        assert torch.equal(y3.reshape(6, -1), y2)
    G = torch.randn(6, layer.out_features, dtype=torch.float64)
    grads = []
    for y in (layer(x.reshape(6, 6)), layer(x).reshape(6, -1)):
        grads.append(torch.autograd.grad((y * G).sum(), layer.vectors[0])[0])
    assert torch.equal(grads[0], grads[1])
