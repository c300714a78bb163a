"""householderla.torch: autograd.Functions calling the explicit VJPs, torch.func, and the
``orthogonal`` parametrization.

gradcheck / gradgradcheck compare the backward (and the backward of the backward) with
central differences of the forward in float64 (torch's defaults: eps 1e-6, atol 1e-5,
rtol 1e-3 — a wrong term is off by O(1)). "Uses the explicit VJP" is asserted twice: the
graph node is our Function, and the gradient equals ``hl.vjp.<map>`` to 1e-12 (autodiff
through the Newton–Schulz iterations agrees only to the iteration's tolerance, and a
different formula to rounding, so 1e-12 on O(1) values identifies the formula's output up to
a few hundred ulps). Orthogonality tolerances are c·eps·n (GEMM rounding grows like eps·n).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require
from helpers import stable_seed

torch = require("torch")
from torch.nn.utils import parametrize  # noqa: E402

import householderla as hl  # noqa: E402
import householderla.torch as hlt  # noqa: E402
from householderla._lib.tracing import is_vmapped  # noqa: E402

INF = float("inf")
F64 = torch.float64
EPS32 = float(torch.finfo(torch.float32).eps)
EPS64 = float(torch.finfo(torch.float64).eps)


def _t(a, grad=False):
    return torch.tensor(np.asarray(a), dtype=F64, requires_grad=grad)


def _stiefel(rng, shape, off=0.2):
    X = np.linalg.qr(rng.standard_normal(shape))[0]
    return X + off * rng.standard_normal(X.shape)


# -- every map: gradcheck, gradgradcheck, Function node ----------------------------------------

# name -> (f(*inputs), input shapes, expected Function in the graph); products with an h of
# the factors' dtype keep Uᵀh and T Uᵀh for their backward (LowRankApplyKept)
MAPS = {
    "cwy_apply": (lambda V, h: hl.cwy(V) @ h, [(2, 6, 3), (6, 2)], "LowRankApplyKept"),
    "cwy_transpose_apply": (lambda V, h: hl.cwy(V).T @ h, [(6, 4), (2, 6, 2)], "LowRankApplyKept"),
    "cwy_matrix": (lambda V: hl.cwy(V).matrix(), [(2, 5, 5)], "LowRankApply"),
    "tcwy_apply": (lambda V, x: hl.tcwy(V) @ x, [(2, 6, 3), (3, 2)], "LowRankApplyKept"),
    "tcwy_transpose_apply": (lambda V, y: hl.tcwy(V).T @ y, [(6, 3), (6,)], "LowRankApplyKept"),
    "tcwy_matrix": (lambda V: hl.tcwy(V).matrix(), [(2, 6, 3)], "LowRankApply"),
    "householder_apply": (hlt.householder_apply, [(2, 6, 3), (6, 2)], "HouseholderApply"),
    "householder_product": (hlt.householder_product, [(5, 4)], "HouseholderApply"),
    "polar": (hl.polar, [(2, 6, 3)], "Polar"),
    "polar_retraction": (hl.polar_retraction, [(2, 6, 3), (2, 6, 3), (2, 1, 1)], "Polar"),
    "cayley_batched": (
        lambda X, Z, t: hl.cayley_retraction(X, Z, t, drift_tol=INF),
        [(2, 6, 3), (2, 6, 3), (2, 1, 1)],
        "CayleySMW",
    ),
    "cayley_scalar_step": (
        lambda X, Z, t: hl.cayley_retraction(X, Z, t, drift_tol=INF),
        [(6, 3), (6, 3), ()],
        "CayleySMW",
    ),
    "cayley_with_guard": (  # X off the manifold: the guard's polar runs after SMW
        lambda X, G: hl.cayley_retraction(X, G, 0.3),
        [(2, 6, 3), (2, 6, 3)],
        "Polar",
    ),
    "qr_retraction": (hl.qr_retraction, [(2, 6, 3), (2, 6, 3), (2, 1, 1)], "QRPositive"),
}


def _inputs(name, shapes, rng):
    out = []
    for i, s in enumerate(shapes):
        if s in ((), (2, 1, 1)):
            a = rng.uniform(0.2, 0.6, s)
            a = a.reshape(s[:-2]) if len(s) == 3 else a  # step: shape of the batch
        elif i == 0 and name.startswith(("polar", "cayley", "qr")):
            a = _stiefel(rng, s)
        else:
            a = rng.standard_normal(s)
        out.append(_t(a, grad=True))
    return out


#: gradgradcheck in `make test-long` only (the slowest: ~150 perturbed backward passes of a
#: polar's Newton–Schulz): the guard's composite of CayleySMW and Polar, whose double backwards
#: are each checked here (cayley_batched, cayley_scalar_step; polar, polar_retraction)
GRADGRAD_LONG = {"cayley_with_guard"}


@pytest.mark.parametrize(
    ("name", "second"),
    [
        pytest.param(
            name,
            second,
            id=f"{name}-{'gradgradcheck' if second else 'gradcheck'}",
            marks=pytest.mark.long if second and name in GRADGRAD_LONG else (),
        )
        for name in MAPS
        for second in (False, True)
    ],
)
def test_gradcheck_and_gradgradcheck(name, second):
    """The map's Function is in the graph; gradcheck, or gradgradcheck (the same inputs)."""
    f, shapes, node = MAPS[name]
    rng = np.random.default_rng(stable_seed(name))
    args = _inputs(name, shapes, rng)
    y = f(*args)
    names = []
    stack = [y.grad_fn]
    while stack:  # every node of the graph: the Function must be there
        fn = stack.pop()
        if fn is not None and type(fn).__name__ not in names:
            names.append(type(fn).__name__)
            stack.extend(nxt for nxt, _ in fn.next_functions)
    assert f"{node}Backward" in names, names
    if second:
        assert torch.autograd.gradgradcheck(f, tuple(args))
    else:
        assert torch.autograd.gradcheck(f, tuple(args))


def test_no_native_autodiff_through_newton_schulz():
    """The polar graph is one Polar node (plus the input): Newton–Schulz leaves no trace."""
    X = _t(_stiefel(np.random.default_rng(1), (7, 3)), grad=True)
    Q = hl.polar(X)
    assert type(Q.grad_fn).__name__ == "PolarBackward"
    assert [type(n).__name__ for n, _ in Q.grad_fn.next_functions] == ["AccumulateGrad"]


# -- the gradients are hl.vjp's -----------------------------------------------------------------


def test_gradients_equal_explicit_vjps():
    rng = np.random.default_rng(2)
    X, Z = _stiefel(rng, (7, 3)), rng.standard_normal((7, 3))
    g = rng.standard_normal((7, 3))
    cases = [
        (lambda X: hl.polar(X), (X + 0.3 * Z,), lambda: (hl.vjp.polar(X + 0.3 * Z, g),)),
        (
            lambda X, Z: hl.qr_retraction(X, Z, 0.3),
            (X, Z),
            lambda: hl.vjp.qr_retraction(X, Z, 0.3, g)[:2],
        ),
        (
            lambda X, Z: hl.cayley_retraction(X, Z, 0.3, drift_tol=INF),
            (X, Z),
            lambda: hl.vjp.cayley_retraction(X, Z, 0.3, g)[:2],
        ),
        (
            lambda X, Z: hl.polar_retraction(X, Z, 0.3),
            (X, Z),
            lambda: hl.vjp.polar_retraction(X, Z, 0.3, g)[:2],
        ),
        (
            lambda V, h: hlt.householder_apply(V, h),
            (Z, X),
            lambda: hl.vjp.householder_apply(Z, X, g),
        ),
    ]
    for f, inputs, ref in cases:
        args = [_t(a, grad=True) for a in inputs]
        f(*args).backward(_t(g))
        for a, r in zip(args, ref(), strict=True):
            np.testing.assert_allclose(a.grad.numpy(), r, rtol=1e-12, atol=1e-12)


def test_step_gradient_has_the_shape_of_step():
    rng = np.random.default_rng(3)
    X, G = _t(_stiefel(rng, (3, 6, 2))), _t(rng.standard_normal((3, 6, 2)))
    for f in (
        lambda t: hl.cayley_retraction(X, G, t, drift_tol=INF),
        lambda t: hl.qr_retraction(X, G, t),
        lambda t: hl.polar_retraction(X, G, t),
    ):
        for t in (_t(0.2, grad=True), _t([0.1, 0.2, 0.3], grad=True)):
            f(t).sum().backward()
            assert t.grad.shape == t.shape and torch.all(torch.isfinite(t.grad))


def test_float32_in_float32_out_and_no_grad_builds_no_graph():
    rng = np.random.default_rng(4)
    X = torch.tensor(_stiefel(rng, (6, 3)), dtype=torch.float32, requires_grad=True)
    G = torch.tensor(rng.standard_normal((6, 3)), dtype=torch.float32)
    for f in (
        hl.polar,
        lambda X: hl.cayley_retraction(X, G, 0.1),
        lambda X: hl.qr_retraction(X, G, 0.1),
        lambda X: hlt.householder_apply(X, G),
    ):
        X.grad = None
        y = f(X)
        assert y.dtype == torch.float32
        y.sum().backward()
        assert X.grad.dtype == torch.float32 and torch.all(torch.isfinite(X.grad))
        with torch.no_grad():
            z = f(X)
        assert z.grad_fn is None and not z.requires_grad


def test_return_info_through_the_function():
    X = _t(_stiefel(np.random.default_rng(5), (8, 3)), grad=True)
    Q, info = hl.polar(X, return_info=True)
    assert type(Q.grad_fn).__name__ == "PolarBackward"
    assert info["method"] == "newton-schulz" and info["certified"] is True
    assert 1 <= info["iterations"] <= 10


def test_nan_input_still_raises_under_autograd():
    X = _t(np.ones((5, 2)), grad=True)
    with torch.no_grad():
        X[0, 0] = float("nan")
    with pytest.raises(ValueError, match="X contains NaN"):
        hl.polar(X)
    with pytest.raises(ValueError, match="V contains NaN"):
        hlt.householder_apply(X, torch.ones(5, dtype=F64))


# -- the Numba kernel path (DLPack, once_differentiable) -----------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_numba_kernel_path_matches_torch_path(dtype):
    require("numba")
    rng = np.random.default_rng(9)
    V = torch.tensor(rng.standard_normal((2, 7, 4)), dtype=dtype, requires_grad=True)
    h = torch.tensor(rng.standard_normal((7, 3)), dtype=dtype, requires_grad=True)
    y_t = hlt.householder_apply(V, h)
    y_n = hlt.householder_apply(V, h, kernel="numba")
    assert type(y_n.grad_fn).__name__ == "HouseholderApplyNumbaBackward"
    assert y_n.dtype == dtype
    eps = float(torch.finfo(dtype).eps)
    # both paths round per reflection (4 reflections, N = 7): 10·eps·N·L relative to |h|
    tol_ = 10 * eps * 7 * 4 * float(h.detach().abs().max())
    torch.testing.assert_close(y_n, y_t, rtol=0, atol=tol_)
    g = torch.tensor(rng.standard_normal(tuple(y_t.shape)), dtype=dtype)
    for a, b in zip(
        torch.autograd.grad(y_n, (V, h), g), torch.autograd.grad(y_t, (V, h), g), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=10 * tol_ * float(g.abs().max()))
    v = hlt.householder_product(V[0].detach(), kernel="numba")
    torch.testing.assert_close(v, hlt.householder_product(V[0].detach()), rtol=0, atol=tol_)


def test_numba_kernel_path_is_once_differentiable():
    require("numba")
    rng = np.random.default_rng(10)
    V, h = _t(rng.standard_normal((6, 3)), grad=True), _t(rng.standard_normal((6, 2)), grad=True)

    def f(V, h):
        return hlt.householder_apply(V, h, kernel="numba")

    assert torch.autograd.gradcheck(f, (V, h))
    g = _t(rng.standard_normal((6, 2)), grad=True)
    (gV,) = torch.autograd.grad(f(V, h), V, g, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        gV.sum().backward()
    with pytest.raises(ValueError, match=r"cannot run under torch\.func"):
        torch.func.grad(lambda V: f(V, h.detach()).sum())(V.detach())
    with pytest.raises(ValueError, match="kernel must be one of"):
        hlt.householder_apply(V, h, kernel="cuda")


# -- torch.func ---------------------------------------------------------------------------------


def test_func_grad_equals_backward():
    rng = np.random.default_rng(6)
    X, G = _t(_stiefel(rng, (6, 3))), _t(rng.standard_normal((6, 3)))
    for f in (
        lambda X: (hl.polar(X) ** 3).sum(),
        lambda X: (hl.cayley_retraction(X, G, 0.2, drift_tol=INF) ** 3).sum(),
        lambda X: (hl.qr_retraction(X, G, 0.2) ** 3).sum(),
        lambda X: (hlt.householder_apply(X, G) ** 3).sum(),
        lambda X: (hl.tcwy(X).matrix() ** 3).sum(),
    ):
        g1 = torch.func.grad(f)(X)
        Xr = X.clone().requires_grad_(True)
        f(Xr).backward()
        torch.testing.assert_close(g1, Xr.grad, rtol=1e-13, atol=1e-13)


FUNC_MAPS = {
    "polar": lambda X, G: hl.polar(X),
    "cayley": lambda X, G: hl.cayley_retraction(X, G, 0.2),
    "qr_retraction": lambda X, G: hl.qr_retraction(X, G, 0.2),
    "polar_retraction": lambda X, G: hl.polar_retraction(X, G, 0.2),
    "householder_apply": lambda X, G: hlt.householder_apply(X, G),
}


@pytest.mark.parametrize("name", list(FUNC_MAPS))
def test_vmap_and_vmap_of_grad_equal_loops(name):
    f = FUNC_MAPS[name]
    rng = np.random.default_rng(7)
    X, G = _t(_stiefel(rng, (3, 6, 3))), _t(rng.standard_normal((3, 6, 3)))
    out = torch.func.vmap(f)(X, G)
    ref = torch.stack([f(x, g) for x, g in zip(X, G, strict=True)])
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)

    def loss(x, g):
        return (f(x, g) ** 3).sum()

    gv = torch.func.vmap(torch.func.grad(loss))(X, G)
    gl = torch.stack([torch.func.grad(loss)(x, g) for x, g in zip(X, G, strict=True)])
    torch.testing.assert_close(gv, gl, rtol=1e-12, atol=1e-12)
    J = torch.func.jacrev(lambda x: f(x, G[0]))(X[0])  # vmap over the backward
    assert J.shape == (6, 3, 6, 3) and torch.all(torch.isfinite(J))


def _cwy_vmap_supported() -> bool:
    """hl.cwy validates V's values when it can inspect them; under torch.func.vmap that
    needs ``is_eager`` to report vmapped tensors as lazy (a hook in _lib/namespace.py)."""
    from householderla._lib.tracing import is_eager

    return bool(torch.func.vmap(lambda x: torch.tensor(float(not is_eager(x))))(torch.ones(2))[0])


@pytest.mark.xfail(
    not _cwy_vmap_supported(),
    reason="needs _lib.namespace.is_eager to treat torch.func.vmap tensors as lazy",
    strict=True,
)
def test_vmap_through_cwy_operators():
    rng = np.random.default_rng(8)
    V, h = _t(rng.standard_normal((3, 6, 4))), _t(rng.standard_normal((6, 2)))
    out = torch.func.vmap(lambda V: hl.cwy(V) @ h)(V)
    torch.testing.assert_close(out, hl.cwy(V) @ h, rtol=1e-12, atol=1e-12)
    gv = torch.func.vmap(torch.func.grad(lambda V: (hl.tcwy(V).matrix() ** 3).sum()))(V)
    assert gv.shape == V.shape


def test_is_vmapped_detects_every_level():
    seen = []
    torch.func.vmap(lambda x: seen.append(is_vmapped(x)) or x)(torch.ones(2, 3))
    torch.func.vmap(torch.func.grad(lambda x: seen.append(is_vmapped(x)) or x.sum()))(
        torch.ones(2, 3)
    )
    torch.func.grad(lambda x: seen.append(is_vmapped(x)) or x.sum())(torch.ones(3))
    assert seen == [True, True, False] and not is_vmapped(torch.ones(2))


# -- hl.torch.orthogonal -------------------------------------------------------------------------


def _module(shape, dtype=torch.float32):
    m = torch.nn.Module()
    m.weight = torch.nn.Parameter(torch.randn(*shape, dtype=dtype))
    return m


def _orth_err(W):
    W = W.detach().double()
    G = W.mT @ W if W.shape[-2] >= W.shape[-1] else W @ W.mT
    return float(torch.linalg.matrix_norm(G - torch.eye(G.shape[-1], dtype=F64)).max())


def _haar(shape, det=None, seed=0):
    rng = np.random.default_rng(seed)
    n, k = shape[-2:]
    N, M = max(n, k), min(n, k)
    Q, R = np.linalg.qr(rng.standard_normal((*shape[:-2], N, N)))
    Q = Q * np.sign(np.diagonal(R, axis1=-2, axis2=-1))[..., None, :]
    if det is not None:
        flip = np.sign(np.linalg.det(Q)) != det
        Q[..., :, 0] *= np.where(flip, -1.0, 1.0)[..., None]
    Q = Q[..., :M]
    return torch.tensor(Q if n >= k else np.swapaxes(Q, -1, -2))


SHAPES = [(6, 6), (7, 3), (3, 7), (2, 4, 4), (2, 5, 2)]


@pytest.mark.parametrize("map", ["cwy", "tcwy"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("init", ["haar", "identity", "keep"])
def test_orthogonal_weight_is_orthogonal_and_trains(map, shape, init):
    torch.manual_seed(0)
    m = _module(shape)
    W0 = m.weight.detach().clone()
    hlt.orthogonal(m, map=map, init=init)
    W = m.weight
    assert W.shape == shape and W.dtype == torch.float32
    n = max(shape[-2:])
    assert _orth_err(W) <= 10 * EPS32 * n  # float64 accumulation, one float32 rounding
    if init == "identity":
        torch.testing.assert_close(W, torch.eye(*shape[-2:]).expand(shape), rtol=0, atol=EPS32)
    if init == "keep":  # the Q factor of the old weight (positive diagonal R), as torch does
        A = W0.double() if shape[-2] >= shape[-1] else W0.double().mT
        Q, R = torch.linalg.qr(A)
        Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)
        Q = Q if shape[-2] >= shape[-1] else Q.mT
        torch.testing.assert_close(W.double(), Q, rtol=0, atol=20 * EPS32 * n)
    V = m.parametrizations.weight.original
    N, M = max(shape[-2:]), min(shape[-2:])
    L = N if (map == "cwy" and shape[-1] == shape[-2]) else M
    assert V.shape == (*shape[:-2], N, L)
    (W * torch.randn(shape)).sum().backward()
    assert torch.all(torch.isfinite(V.grad)) and float(V.grad.abs().max()) > 0


@pytest.mark.parametrize("map", ["cwy", "tcwy"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("det", [1, -1])
def test_right_inverse_round_trip(map, shape, det):
    """Assigning Q sets the reflectors; reading back gives Q (both determinants when square)."""
    m = _module(shape, F64)
    hlt.orthogonal(m, map=map)
    Q = _haar(shape, det=det if shape[-1] == shape[-2] else None, seed=det + 5)
    V_before = m.parametrizations.weight.original
    m.weight = Q
    assert m.parametrizations.weight.original is V_before  # same Parameter (optimizers keep it)
    n = max(shape[-2:])
    torch.testing.assert_close(m.weight, Q, rtol=0, atol=20 * EPS64 * n)
    if shape[-1] == shape[-2]:
        assert torch.all(torch.sign(torch.linalg.det(m.weight)) == det)


def test_cached_computes_the_weight_once():
    m = _module((5, 5))
    hlt.orthogonal(m)
    calls = []
    m.parametrizations.weight[0].register_forward_hook(lambda *a: calls.append(1))
    with parametrize.cached():
        a, b = m.weight, m.weight
        assert a is b
    assert len(calls) == 1
    c = m.weight
    assert len(calls) == 2 and c is not a
    torch.testing.assert_close(a, c, rtol=0, atol=0)


def test_reflectors_below_full_count():
    m = _module((6, 6), F64)
    hlt.orthogonal(m, reflectors=3)
    assert m.parametrizations.weight.original.shape == (6, 3)
    assert _orth_err(m.weight) <= 10 * EPS64 * 6
    with pytest.raises(ValueError, match="reflectors=3 < 6"):
        m.weight = torch.eye(6, dtype=F64)
    m2 = _module((8, 3), F64)
    hlt.orthogonal(m2, reflectors=5, init="identity")  # 3 columns from 5 reflectors
    torch.testing.assert_close(m2.weight, torch.eye(8, 3, dtype=F64), rtol=0, atol=1e-15)
    Q = _haar((8, 3))
    m2.weight = Q  # tcwy_vectors + 2 fixing reflectors
    torch.testing.assert_close(m2.weight, Q, rtol=0, atol=1e-13)


def test_generator_makes_init_reproducible():
    ws = []
    for _ in range(2):
        m = _module((5, 3))
        hlt.orthogonal(m, map="tcwy", generator=torch.Generator().manual_seed(3))
        ws.append(m.weight.detach())
    torch.testing.assert_close(ws[0], ws[1], rtol=0, atol=0)


def test_state_dict_round_trip():
    a, b = _module((6, 4)), _module((6, 4))
    hlt.orthogonal(a, map="tcwy")
    hlt.orthogonal(b, map="tcwy")
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(a.weight, b.weight, rtol=0, atol=0)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("init", ["haar", "identity", "keep"])
def test_svd_map_is_orthogonal_and_round_trips(shape, init):
    """map="svd" with σ = 1: W = Q_U E Q_Vᵀ has orthonormal rows/columns; "keep" starts from
    the polar factor U Vᵀ of the old weight (its closest orthogonal matrix)."""
    torch.manual_seed(2)
    m = _module(shape)
    W0 = m.weight.detach().double().clone()
    hlt.orthogonal(m, map="svd", init=init)
    n, r = max(shape[-2:]), min(shape[-2:])
    W = m.weight
    assert W.shape == shape and _orth_err(W) <= 10 * EPS32 * n
    if init == "identity":
        torch.testing.assert_close(W, torch.eye(*shape[-2:]).expand(shape), rtol=0, atol=EPS32)
    if init == "keep":
        U, _, Vh = torch.linalg.svd(W0, full_matrices=False)
        torch.testing.assert_close(W.double(), U @ Vh, rtol=0, atol=20 * EPS32 * n)
    P = m.parametrizations.weight
    k1, k2 = (r - 1, r) if shape[-2] <= shape[-1] else (r, r - 1)
    assert P.original0.shape == (*shape[:-2], shape[-2], k1)
    assert P.original1.shape == (*shape[:-2], shape[-1], k2)
    (W * torch.randn(shape)).sum().backward()
    assert all(torch.all(torch.isfinite(p.grad)) for p in (P.original0, P.original1))
    Q = _haar(shape, seed=11).float()
    m.weight = Q
    torch.testing.assert_close(m.weight, Q, rtol=0, atol=20 * EPS32 * n)


def test_svd_sigma_radius_bounds_the_singular_values():
    """sigma_radius r: σ(W) ∈ [1 − r, 1 + r] at every step of training that pushes them out
    (the target is 3× the input), assignment clips, gradients reach ŝ."""
    torch.manual_seed(3)
    r = 0.25
    lin = hlt.orthogonal(torch.nn.Linear(6, 4, bias=False), map="svd", sigma_radius=r)
    P = lin.parametrizations.weight
    assert P.original1.shape == (4,)
    opt = torch.optim.Adam(lin.parameters(), lr=0.1)
    X = torch.randn(32, 6)
    for _ in range(20):
        opt.zero_grad()
        loss = torch.mean((lin(X) - 3.0 * X[:, :4]) ** 2)
        loss.backward()
        assert float(P.original1.grad.abs().max()) > 0
        opt.step()
        sv = torch.linalg.svdvals(lin.weight.detach().double())
        assert float(sv.min()) >= 1 - r - 1e-6 and float(sv.max()) <= 1 + r + 1e-6
    assert float(torch.linalg.svdvals(lin.weight.detach()).max()) > 1 + 0.5 * r  # pushed out
    lin.weight = 5.0 * torch.eye(4, 6)
    sv = torch.linalg.svdvals(lin.weight.detach().double())
    torch.testing.assert_close(sv, torch.full((4,), 1 + r, dtype=F64), rtol=0, atol=1e-5)


@pytest.mark.parametrize("map", ["cwy", "tcwy", "svd"])
def test_training_keeps_weight_orthogonal(map):
    """A tiny model (orthogonal layer + linear head) trained 30 Adam steps on a regression:
    the loss drops and the weight stays orthogonal to eps-scaled tolerance at every step."""
    torch.manual_seed(1)
    n, B = 8, 64
    model = torch.nn.Sequential(torch.nn.Linear(n, n, bias=False), torch.nn.Linear(n, 1))
    hlt.orthogonal(model[0], map=map)
    X = torch.randn(B, n)
    y = torch.sin(X @ torch.randn(n, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = torch.mean((model(X) - y) ** 2)
        loss.backward()
        opt.step()
        losses.append(loss.detach().item())
        assert _orth_err(model[0].weight) <= 10 * EPS32 * n
    assert losses[-1] < 0.7 * losses[0]


def test_orthogonal_bad_input():
    with pytest.raises(ValueError, match="has no parameter or buffer 'w'"):
        hlt.orthogonal(torch.nn.Linear(3, 3), name="w")
    m = torch.nn.Module()
    m.weight = torch.nn.Parameter(torch.ones(4))
    with pytest.raises(ValueError, match=r"weight must have shape \(\.\.\., n, k\)"):
        hlt.orthogonal(m)
    m.weight = torch.nn.Parameter(torch.ones(3, 3, dtype=torch.float16))
    with pytest.raises(TypeError, match="float16"):
        hlt.orthogonal(m)
    with pytest.raises(ValueError, match="map must be one of"):
        hlt.orthogonal(torch.nn.Linear(3, 3), map="expm")
    with pytest.raises(ValueError, match="init must be one of"):
        hlt.orthogonal(torch.nn.Linear(3, 3), init="zeros")
    with pytest.raises(ValueError, match="reflectors must be between 1 and max"):
        hlt.orthogonal(torch.nn.Linear(3, 3), reflectors=4)
    with pytest.raises(TypeError, match="reflectors must be an integer"):
        hlt.orthogonal(torch.nn.Linear(3, 3), reflectors=2.5)
    with pytest.raises(ValueError, match="exactly min"):
        hlt.orthogonal(torch.nn.Linear(3, 5), map="tcwy", reflectors=4)
    with pytest.raises(ValueError, match="map='svd' does not take reflectors"):
        hlt.orthogonal(torch.nn.Linear(3, 5), map="svd", reflectors=3)
    with pytest.raises(ValueError, match="sigma_radius applies to map='svd' only"):
        hlt.orthogonal(torch.nn.Linear(3, 5), sigma_radius=0.1)
    with pytest.raises(ValueError, match="sigma_radius must be a number >= 0"):
        hlt.orthogonal(torch.nn.Linear(3, 5), map="svd", sigma_radius=-1.0)
    lin = hlt.orthogonal(torch.nn.Linear(3, 3))
    with pytest.raises(ValueError, match=r"assigned weight must have shape \(3, 3\)"):
        lin.weight = torch.eye(4)


@pytest.mark.parametrize(
    ("n", "m", "map_"),
    [(4, 4, "cwy"), (5, 5, "cwy"), (3, 6, "cwy"), (6, 3, "tcwy"), (5, 5, "svd"), (6, 4, "svd")],
)
def test_assigning_the_identity_does_not_freeze_the_weight(n, m, map_):
    """``module.weight = I`` (whose constructive inverse is all zero vectors, zero gradient)
    must keep training, as torch's own Householder map does (issue 12, class 5): the
    assigned weight is exact, the gradient with respect to the parameters is nonzero, and
    SGD steps move the weight while it stays orthonormal."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(m, n, bias=False).double()
    hlt.orthogonal(lin, map=map_)
    eye = torch.eye(n, m, dtype=torch.float64)
    lin.weight = eye
    # "exact" up to the rounding of the n reflections that replace the zero vectors (pairs
    # H(w)H(w) = I, each pair a few ulps off): 4·n·eps; the rounding itself depends on the
    # CPU's BLAS kernels (1.1e-15 = 5 ulps for the svd map at n = 5 on an AMD EPYC)
    tol = 4 * max(n, m) * float(torch.finfo(torch.float64).eps)
    torch.testing.assert_close(lin.weight.detach(), eye, atol=tol, rtol=0)
    A = torch.randn(n, m, dtype=torch.float64)
    (-(lin.weight * A).sum()).backward()
    grads = [p.grad for p in lin.parameters() if p.grad is not None]
    assert sum(float(g.abs().sum()) for g in grads) > 1e-3
    opt = torch.optim.SGD(lin.parameters(), lr=0.05)
    for _ in range(5):
        opt.zero_grad()
        (-(lin.weight * A).sum()).backward()
        opt.step()
    W = lin.weight.detach()
    gram = W.T @ W if n >= m else W @ W.T
    assert float((W - eye).abs().max()) > 1e-2
    torch.testing.assert_close(gram, torch.eye(min(n, m), dtype=torch.float64), atol=1e-13, rtol=0)
