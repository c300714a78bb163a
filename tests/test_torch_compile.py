"""torch.compile: ``hl.torch.orthogonal`` modules compile with ``fullgraph=True`` (a graph
break raises), forward and backward, and give eager's numbers.

Backends: ``"aot_eager"`` (dynamo + AOTAutograd, which traces the backward too, then runs
the captured ATen graph with the eager kernels) and ``"eager"`` (dynamo only); neither
compiles C++, so the tests stay fast on a 2-core CI machine. ``"inductor"`` generates and
compiles C++ (≈ 25 s for the first map here) and runs only with ``HL_TEST_INDUCTOR=1``.

Tolerances. With grad enabled the compiled graph runs the same ATen operations in the same
order as eager (our ``torch.autograd.Function``s and their explicit backward passes), so the
outputs and gradients agree to the last bit; 8 ulps of slack (relative and absolute, on O(1)
values) allow a harmless reassociation by a future decomposition and still catch any
different formula or skipped step. Without grad, eager forms the matrix straight from V
(orgqr-style / one-shot I − V S⁻¹ Vᵀ, whose rescaling test is data dependent) while the
compiled graph takes the U, T route: two backward-stable formulas for one orthogonal matrix,
compared to 10·n·eps. Inductor fuses elementwise kernels (reassociation): 100·n·eps.

The suite turns warnings into errors; two that torch 2.13's dynamo itself emits are ignored
here: it warns once per call site that it traces through array-api-compat's
``functools.lru_cache`` helpers (pure functions of a type or a module, so the traced result
is the cached one), and its tracing of any ``torch.autograd.Function`` instantiates the
Function base class, which torch deprecates.
"""

from __future__ import annotations

import copy
import os

import pytest
from conftest import LONG, require, torch_below

torch = require("torch")

# torch.compile support is stated and tested for torch 2.11 and later (conftest.TORCH_FLOORS;
# run on 2.11.0 and CI's 2.13.0): dynamo's tracing of our autograd Functions, its warnings
# (filtered below) and its graph breaks change between releases; with torch 2.6 dynamo cannot
# trace array-api-compat's checks for a framework not imported. Older torch: skipped, saying
# so. (On the GPU run of benchmarks/results/gpu-failures.md, torch 2.11 there, every test here
# failed; with torch 2.11 on a CPU they pass.)
if why := torch_below("compile"):
    pytest.skip(why, allow_module_level=True)

from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402

import householderla as hl  # noqa: E402
import householderla.torch  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:Dynamo detected a call to a `functools.lru_cache`:UserWarning"
    ),
    # raised inside dynamo while it traces any torch.autograd.Function (torch 2.13)
    pytest.mark.filterwarnings(
        "ignore:<class 'torch.autograd.function.Function'> should not be instantiated"
        ":DeprecationWarning"
    ),
]

F64, F32 = torch.float64, torch.float32
#: (map, weight shape (out, in), extra keyword arguments of hl.torch.orthogonal)
CASES = [
    ("cwy", (8, 8), {}),
    ("cwy", (8, 4), {}),  # tall, not square: cwy(V) applied to [I; 0]
    ("tcwy", (8, 4), {}),
    ("tcwy", (4, 8), {}),  # wide: the transpose of a tall Stiefel matrix
    ("svd", (8, 8), {}),
    ("svd", (6, 4), {}),
    ("svd", (4, 6), {"sigma_radius": 0.5}),  # trainable, bounded singular values
]
IDS = [f"{m}-{s[0]}x{s[1]}{'-radius' if kw else ''}" for m, s, kw in CASES]
#: every case in both dtypes; `make test` runs each case in one of them, alternating (each
#: compiles the module anew, ~1.5 s), and `make test-long` the other half
CASES_DTYPES = [
    pytest.param(*case, dtype, id=f"{IDS[i]}-{name}", marks=pytest.mark.long if (i + j) % 2 else ())
    for i, case in enumerate(CASES)
    for j, (dtype, name) in enumerate(((F64, "f64"), (F32, "f32")))
]
#: Also in `make test-long` only: for inference_no_grad, svd-6x4 in float32 (svd's tall
#: split of the reflectors is compiled with grad in fullgraph_matches_eager; svd without grad
#: at 8x8 and 4x6, float32 without grad for cwy and tcwy: the same graph in another dtype); for
#: fullgraph_matches_eager, the float64 cases of the maps at the shapes of
#: test_one_graph_and_no_recompile_while_training (cwy-8x8, tcwy-8x4, svd-8x8), which makes
#: the same check on its first step.
NO_GRAD_LONG = {"svd-6x4-f32"}
TRAINED = {"cwy-8x8-f64", "tcwy-8x4-f64", "svd-8x8-f64"}


def _only(ids: set[str]) -> list:
    """CASES_DTYPES with the cases of ``ids`` marked ``long`` as well."""
    return [
        p if p.id not in ids else pytest.param(*p.values, id=p.id, marks=pytest.mark.long)
        for p in CASES_DTYPES
    ]


def _ulps(dtype: torch.dtype, k: float) -> float:
    return k * float(torch.finfo(dtype).eps)


def _module(map_: str, shape: tuple[int, int], kw: dict, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(0)
    m = torch.nn.Linear(shape[1], shape[0], bias=False, dtype=dtype)
    hl.torch.orthogonal(m, map=map_, generator=gen, **kw)
    x = torch.randn(5, shape[1], dtype=dtype, generator=gen)
    return m, x


def _step(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    y = m(x)
    (y.square().sum() + y.sum()).backward()
    return y


def _grads(m: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad for p in m.parameters()]


@pytest.mark.parametrize(("map_", "shape", "kw", "dtype"), _only(TRAINED))
def test_orthogonal_fullgraph_matches_eager(map_, shape, kw, dtype):
    m, x = _module(map_, shape, kw, dtype)
    mc = copy.deepcopy(m)
    y = _step(m, x)  # eager first: every rule table is loaded before tracing
    torch._dynamo.reset()
    cnt = CompileCounterWithBackend("aot_eager")
    yc = _step(torch.compile(mc, fullgraph=True, backend=cnt), x)
    tol = _ulps(dtype, 8)
    torch.testing.assert_close(yc, y, rtol=tol, atol=tol)
    for gc, g in zip(_grads(mc), _grads(m), strict=True):
        torch.testing.assert_close(gc, g, rtol=tol, atol=tol)
    assert cnt.frame_count == 1


@pytest.mark.parametrize(
    ("map_", "shape", "kw"),
    # tcwy-4x8 in `make test-long` only: tcwy's autograd Functions are cwy's (LowRankApply)
    [
        pytest.param(*CASES[i], id=IDS[i], marks=pytest.mark.long if i == 3 else ())
        for i in (1, 3, 6)
    ],
)
def test_orthogonal_dynamo_only_backend(map_, shape, kw):
    m, x = _module(map_, shape, kw, F64)
    mc = copy.deepcopy(m)
    y = _step(m, x)
    torch._dynamo.reset()
    yc = _step(torch.compile(mc, fullgraph=True, backend="eager"), x)
    tol = _ulps(F64, 8)
    torch.testing.assert_close(yc, y, rtol=tol, atol=tol)
    for gc, g in zip(_grads(mc), _grads(m), strict=True):
        torch.testing.assert_close(gc, g, rtol=tol, atol=tol)


@pytest.mark.parametrize(("shape", "map_"), [((16, 16), "cwy"), ((12, 6), "tcwy")])
def test_orthogonal_linear_fullgraph_matches_eager(shape, map_):
    """``hl.torch.OrthogonalLinear`` compiles to one graph, forward and backward. Eager runs
    a square CWY training step as one autograd node (``CWYLinear``: blocks, unnormalised
    reflectors), the compiled forward the operator's composed nodes of the same map (the one
    node is eager-only), so the two agree to rounding, not bitwise: 100·N·eps. (The planner
    read ``torch.get_num_threads()``, which dynamo cannot trace: every compile raised.)"""
    gen = torch.Generator().manual_seed(1)
    m = hl.torch.OrthogonalLinear(shape[1], shape[0], map=map_, generator=gen, dtype=F64)
    x = torch.randn(5, shape[1], dtype=F64, generator=gen)
    mc = copy.deepcopy(m)
    y = _step(m, x)
    torch._dynamo.reset()
    cnt = CompileCounterWithBackend("aot_eager")
    yc = _step(torch.compile(mc, fullgraph=True, backend=cnt), x)
    tol = 100 * max(shape) * torch.finfo(F64).eps
    torch.testing.assert_close(yc, y, rtol=tol, atol=tol)
    for gc, g in zip(_grads(mc), _grads(m), strict=True):
        torch.testing.assert_close(gc, g, rtol=tol, atol=tol)
    assert cnt.frame_count == 1


@pytest.mark.parametrize("map_", ["cwy", "tcwy", "svd"])
def test_one_graph_and_no_recompile_while_training(map_):
    """One graph, compiled once over optimizer steps that change the parameters in place and
    over fresh inputs; the weight stays orthogonal. The first step's output and gradients are
    eager's (test_orthogonal_fullgraph_matches_eager at these shapes in float64, folded in
    here: it would compile the same module again). ``fullgraph=True`` raises on a graph break
    and the one frame compiled is one graph; ``make test-long`` also asks dynamo's explain."""
    shape = (8, 4) if map_ == "tcwy" else (8, 8)
    m, x = _module(map_, shape, {}, F64)
    eager = copy.deepcopy(m)
    y = _step(eager, x)  # eager first: every rule table is loaded before tracing
    torch._dynamo.reset()

    def forward(x):  # a function calling the module (the fullgraph test compiles the module)
        return m(x)

    if LONG:
        explained = torch._dynamo.explain(forward)(x)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0)
        torch._dynamo.reset()
    cnt = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(forward, fullgraph=True, backend=cnt)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    tol = _ulps(F64, 8)
    for i in range(3):
        opt.zero_grad()
        if i == 0:
            torch.testing.assert_close(_step(compiled, x), y, rtol=tol, atol=tol)
            for gc, g in zip(_grads(m), _grads(eager), strict=True):
                torch.testing.assert_close(gc, g, rtol=tol, atol=tol)
        else:
            compiled(torch.randn(5, shape[1], dtype=F64, generator=gen)).square().sum().backward()
        opt.step()
    assert cnt.frame_count == 1
    W = m.weight.detach()
    eye = torch.eye(W.shape[-1], dtype=F64)
    torch.testing.assert_close(W.mT @ W, eye, rtol=0, atol=_ulps(F64, 100))


@pytest.mark.parametrize(("map_", "shape", "kw", "dtype"), _only(NO_GRAD_LONG))
def test_orthogonal_inference_no_grad(map_, shape, kw, dtype):
    m, x = _module(map_, shape, kw, dtype)
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        y, yc = m(x), compiled(x)
    tol = _ulps(dtype, 10 * max(shape))
    torch.testing.assert_close(yc, y, rtol=tol, atol=tol)


# -- the operators inside a compiled function --------------------------------------------------


def _vh(dtype=F64):
    gen = torch.Generator().manual_seed(2)
    V = torch.randn(7, 4, dtype=dtype, generator=gen).requires_grad_()
    h = torch.randn(7, 3, dtype=dtype, generator=gen)
    return V, h


def _products(V, h):
    Q = hl.cwy(V)
    # the method, not ``@``: see test_matmul_operator_breaks_the_graph
    return Q.__matmul__(h), Q.T.__matmul__(h), hl.tcwy(V).matrix(), Q.matrix() @ h


def test_operators_in_compiled_function():
    V, h = _vh()
    eager = _products(V, h)
    (g_eager,) = torch.autograd.grad(sum(o.square().sum() for o in eager), V)
    torch._dynamo.reset()
    compiled = torch.compile(_products, fullgraph=True, backend="aot_eager")(V, h)
    (g_comp,) = torch.autograd.grad(sum(o.square().sum() for o in compiled), V)
    tol = _ulps(F64, 8)
    for a, b in zip(compiled, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    torch.testing.assert_close(g_comp, g_eager, rtol=tol, atol=tol)


@pytest.mark.xfail(
    raises=torch._dynamo.exc.Unsupported,
    strict=True,
    reason="dynamo (torch 2.11, 2.13) inserts `object @ tensor` into the graph instead of calling "
    "the object's __matmul__ (pytorch/pytorch#189585); call Q.__matmul__(h) or use .matrix()",
)
def test_matmul_operator_breaks_the_graph():
    V, h = _vh()
    torch._dynamo.reset()
    torch.compile(lambda V, h: hl.cwy(V) @ h, fullgraph=True, backend="eager")(V, h)


def test_compiled_torch_func_grad():
    """compile(torch.func.grad(f)) traces; it equals eager torch.func.grad to rounding (inside
    a compiled transform part of the map may be differentiated by autograd through the
    forward rather than by the explicit VJP: a different formula, hence not bitwise)."""
    V, h = _vh()
    V = V.detach()

    def loss(V):
        return hl.cwy(V).__matmul__(h).square().sum() + hl.tcwy(V).matrix().sum()

    eager = torch.func.grad(loss)(V)
    torch._dynamo.reset()
    compiled = torch.compile(torch.func.grad(loss), fullgraph=True, backend="aot_eager")(V)
    torch.testing.assert_close(compiled, eager, rtol=1e-12, atol=1e-12)


def test_value_checks_are_skipped_under_compile():
    """As under jax.jit: NaN/Inf raise in eager, not in a compiled graph (no data-dependent
    Python); the NaN propagates instead."""
    V = torch.randn(6, 3, dtype=F64)
    V[2, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        hl.cwy(V).matrix()
    torch._dynamo.reset()
    out = torch.compile(lambda V: hl.cwy(V).matrix(), fullgraph=True, backend="eager")(V)
    assert torch.isnan(out).any()


@pytest.mark.skipif(
    os.environ.get("HL_TEST_INDUCTOR") != "1",
    reason="inductor compiles C++ (~25 s per graph on the 2-core CI); set HL_TEST_INDUCTOR=1",
)
# inductor itself still calls deprecated torch APIs (torch.jit.script_method, prims check)
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")
@pytest.mark.parametrize(("map_", "shape", "kw"), CASES[::2], ids=IDS[::2])
def test_orthogonal_inductor(map_, shape, kw):
    m, x = _module(map_, shape, kw, F64)
    mc = copy.deepcopy(m)
    y = _step(m, x)
    torch._dynamo.reset()
    yc = _step(torch.compile(mc, fullgraph=True, backend="inductor"), x)
    tol = _ulps(F64, 100 * max(shape))
    torch.testing.assert_close(yc, y, rtol=tol, atol=tol)
    for gc, g in zip(_grads(mc), _grads(m), strict=True):
        torch.testing.assert_close(gc, g, rtol=tol, atol=tol)
