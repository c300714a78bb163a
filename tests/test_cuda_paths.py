"""The CUDA-only branches, run on CPU tensors under ``emulate_device("cuda")``.

On a CUDA tensor the half-precision products take ``torch.mm(..., out_dtype=float32)``
(:mod:`householderla._lib.mixed`): half operands, float32 accumulation and result, and the
float32 operand of ``matmul_split`` cut into two half-precision parts B_hi + B_lo. CI has no
GPU: under ``emulate_device("cuda")`` CPU tensors take that branch, with the ``out_dtype``
product (CUDA-only in torch) replaced by the product of exact float32 copies, the same
numbers up to the order of float32 additions. So the branch's arithmetic (the split, the
rounding once), its autograd Function (``mm``/``bmm`` with ``out_dtype`` have no derivative in
torch) and its dtypes are tested here; the same half-precision tests as on the GPU
(the half-precision sections of ``test_retractions`` and ``test_cwy``, which run on
``torch_cuda`` there) are run on this
branch, with their bounds (one rounding of a float32 result: see those modules).
"""

from __future__ import annotations

import numpy as np
import pytest
import test_cwy as CW
import test_retractions as RT
from conftest import get_backend, require, torch_below

torch = require("torch")

from householderla._lib import mixed  # noqa: E402
from householderla._lib.device import device_kind, emulate_device  # noqa: E402

pytestmark = pytest.mark.no_dask("torch tensors only")

HALF = {"bfloat16": torch.bfloat16, "float16": torch.float16}
EPS32 = 2.0**-23


@pytest.fixture
def wide_calls(monkeypatch):
    """Counts the wide (``out_dtype``) products: the CUDA branch really ran."""
    calls = []
    real = mixed._torch_wide_matmul

    def spy(a, b, acc):
        calls.append((a.dtype, b.dtype, acc))
        return real(a, b, acc)

    monkeypatch.setattr(mixed, "_torch_wide_matmul", spy)
    return calls


@pytest.fixture
def cuda_bk(wide_calls):
    """The torch (CPU) backend with CUDA's paths; every wide product that ran read half
    operands into a float32 result."""
    with emulate_device("cuda"):
        yield get_backend("torch")
    assert all(acc == torch.float32 and a in HALF.values() for a, _, acc in wide_calls)


def test_the_branch_is_chosen_by_device_kind():
    import array_api_compat as aac

    x = torch.ones(2, 2, dtype=torch.bfloat16)
    xp = aac.array_namespace(x)
    assert device_kind(x) == "cpu" and not mixed.has_wide_matmul(xp, x)
    with emulate_device("cuda"):
        assert device_kind(x) == "cuda" and mixed.has_wide_matmul(xp, x)
        # NumPy has no CUDA branch, emulated or not
        a = np.ones((2, 2), np.float16)
        assert not mixed.has_wide_matmul(aac.array_namespace(a), a)
    assert not mixed.has_wide_matmul(xp, x)


@pytest.mark.parametrize("name", HALF)
@pytest.mark.parametrize("batch", [(), (3,)])
def test_wide_product_is_float32_and_differentiable(name, batch, wide_calls):
    """matmul_acc: a float32 result of exact products; its gradients are the float64
    gradients rounded once to the half dtype (|Ā − Ā₆₄| ≤ u|Ā₆₄| + k·ε₃₂·max|Ā₆₄|: the float32
    backward's error, k = 8 ≥ the 5-term sums here), where torch's own out_dtype product has
    no derivative at all; a double backward runs too."""
    import array_api_compat as aac

    rng = np.random.default_rng(0)
    dt = HALF[name]
    a = torch.from_numpy(rng.standard_normal((*batch, 4, 5))).to(dt).requires_grad_()
    b = torch.from_numpy(rng.standard_normal((5, 3))).to(dt).requires_grad_()
    W = torch.from_numpy(rng.standard_normal((*batch, 4, 3)))
    xp = aac.array_namespace(a)
    with emulate_device("cuda"):
        out = mixed.matmul_acc(xp, a, b, torch.float32)
    assert out.dtype == torch.float32 and wide_calls
    A, B = a.detach().double(), b.detach().double()
    exact = A @ B
    assert torch.all((out.double() - exact).abs() <= 8 * EPS32 * (A.abs() @ B.abs()))
    ga, gb = torch.autograd.grad((out * W.float()).sum(), (a, b), create_graph=True)
    assert ga.dtype == dt and gb.dtype == dt
    u = float(torch.finfo(dt).eps) / 2
    for g, r in ((ga, W @ B.mT), (gb, (A.mT @ W).sum(0) if batch else A.mT @ W)):
        tol = u * r.abs() + 8 * EPS32 * r.abs().max()
        assert torch.all((g.double() - r).abs() <= tol), (g.double() - r).abs().max()
    # double backward: d/db of sum(Ā) through the backward's own (differentiable) ops
    (ggb,) = torch.autograd.grad(ga.float().sum(), (b,))
    Wsum = W.reshape(-1, 3).sum(0, keepdim=True)  # Σ over the batch and the rows of W
    ref = Wsum.expand(5, 3)
    assert ggb.dtype == dt
    assert torch.all((ggb.double() - ref).abs() <= u * ref.abs() + 8 * EPS32 * ref.abs().max())


@pytest.mark.parametrize("name", HALF)
def test_split_product_is_the_float32_product(name, wide_calls):
    """matmul_split: a @ B for float32 B as a @ B_hi + a @ B_lo (two wide products), within
    the split's relative error (2⁻¹⁶ for bfloat16's 8 + 8 bits, 2⁻²² for float16) of the
    float64 product, far below one rounding to the half dtype."""
    import array_api_compat as aac

    rng = np.random.default_rng(1)
    dt = HALF[name]
    a = torch.from_numpy(rng.standard_normal((6, 7))).to(dt)
    B = torch.from_numpy(rng.standard_normal((7, 2))).float()
    with emulate_device("cuda"):
        y = mixed.matmul_split(aac.array_namespace(a), a, B)
    assert y.dtype == torch.float32 and len(wide_calls) == 2
    split = 2.0**-16 if name == "bfloat16" else 2.0**-22
    ref = a.double() @ B.double()
    bound = (split + 8 * EPS32) * (a.double().abs() @ B.double().abs())
    assert torch.all((y.double() - ref).abs() <= bound)


# -- the GPU's half-precision tests, on the CUDA branch -----------------------------------


@pytest.mark.parametrize("name", HALF)
@pytest.mark.parametrize("shape", [(40, 8), (2, 30, 6), (16, 16)])
def test_polar_half_on_the_cuda_branch(cuda_bk, wide_calls, name, shape):
    RT.test_polar_half_is_the_rounded_polar_factor(cuda_bk, name, shape)
    assert wide_calls  # the Newton–Schulz products took the CUDA branch


@pytest.mark.parametrize("name", HALF)
@pytest.mark.parametrize("which", ["polar", "qr", "cayley"])
def test_retraction_gradients_half_on_the_cuda_branch(cuda_bk, name, which):
    """(The retractions' steps and backward passes run in float32: whether a wide product
    runs depends on the map; the gradients must hold either way.)"""
    RT.test_framework_gradients_half(cuda_bk, name, which)


@pytest.mark.parametrize("name", HALF)
@pytest.mark.parametrize("batch", [(), (2,)])
def test_products_half_on_the_cuda_branch(cuda_bk, wide_calls, name, batch):
    CW.test_products_read_half_and_round_once(cuda_bk, name, batch)
    assert wide_calls  # Uᵀh read h through the split


@pytest.mark.parametrize("name", HALF)
@pytest.mark.parametrize("what", ["apply", "matrix", "tcwy", "sequential"])
def test_cwy_gradients_half_on_the_cuda_branch(name, what, wide_calls):
    """loss.backward() through the compact WY maps on the CUDA branch (the products of half
    h take the split); ``matrix`` and ``sequential`` run no half-precision product, so only
    the gradients are checked there."""
    with emulate_device("cuda"):
        CW.test_framework_gradients_half(get_backend("torch"), name, what)
    if what in ("apply", "tcwy"):
        assert wide_calls


# -- the other branches a CUDA tensor takes ----------------------------------------------------


def test_cuda_gates_under_emulation():
    """What a CUDA tensor is refused, a CPU tensor is refused under emulation too: float64
    accumulation for float32 (float32 itself on a GPU), the Numba kernels, the NumPy value
    checks and the NumPy step of the Stiefel optimizers."""
    import array_api_compat as aac

    from householderla._kernels import numba_enabled, numba_for_torch
    from householderla._lib import checks
    from householderla._lib.namespace import accumulation_dtype_for
    from householderla.torch import _optim

    x = torch.ones(3, 2)
    xp = aac.array_namespace(x)
    cpu = (
        accumulation_dtype_for(xp, x),
        numba_for_torch(x) is not None,
        checks._numpy_view(x) is not None,
        _optim._on_host(x),
    )
    assert cpu == (torch.float64, numba_enabled() is not None, True, True)
    with emulate_device("cuda"):
        assert accumulation_dtype_for(xp, x) == torch.float32
        assert accumulation_dtype_for(xp, x.to(torch.complex64)) == torch.complex64
        assert numba_for_torch(x) is None
        assert checks._numpy_view(x) is None
        assert not _optim._on_host(x)


def test_float32_cwy_on_the_cuda_branch():
    """float32 factors accumulated in float32 (the GPU's choice): the matrix is still
    orthogonal to float32's level, ‖QᵀQ − I‖_F ≤ 4·N·ε₃₂ (measured ~N·ε₃₂/4 here; a
    half-precision rounding anywhere would give ~N·2⁻⁹), and V with NaN is still named."""
    import householderla as hl

    gen = torch.Generator().manual_seed(3)
    V = torch.randn(64, 40, generator=gen)
    with emulate_device("cuda"):
        Q = hl.cwy(V).matrix()
        assert Q.dtype == torch.float32
        err = torch.linalg.matrix_norm(
            Q.double().mT @ Q.double() - torch.eye(64, dtype=torch.float64)
        )
        assert err <= 4 * 64 * EPS32, err
        V[3, 1] = float("nan")
        with pytest.raises(ValueError, match="NaN or Inf"):
            hl.cwy(V)


@pytest.mark.filterwarnings("ignore:Dynamo detected a call to a `functools.lru_cache`:UserWarning")
@pytest.mark.filterwarnings(
    "ignore:<class 'torch.autograd.function.Function'> should not be instantiated"
    ":DeprecationWarning"
)
def test_wide_product_under_torch_func_and_compile(wide_calls):
    """The wide product's Function under torch.func.grad, torch.func.vmap (its generated
    vmap rule) and torch.compile(fullgraph=True) with its backward: the same numbers as eager
    (the compiled graph runs the same operations: equal to the last bit), half-precision
    gradients."""
    import array_api_compat as aac

    gen = torch.Generator().manual_seed(4)
    a = torch.randn(4, 5, generator=gen).bfloat16()
    b = torch.randn(5, 3, generator=gen).bfloat16()
    xp = aac.array_namespace(a)

    def prod(a, b):
        return mixed.matmul_acc(xp, a, b, torch.float32)

    with emulate_device("cuda"):
        eager = prod(a, b)
        g = torch.func.grad(lambda a: prod(a, b).square().sum())(a)
        aa = a.clone().requires_grad_()
        prod(aa, b).square().sum().backward()
        assert g.dtype == torch.bfloat16 and torch.equal(g, aa.grad)
        stack = torch.stack([a, 2 * a, -a])
        v = torch.func.vmap(lambda x: prod(x, b))(stack)
        assert v.dtype == torch.float32 and torch.equal(v[0], eager)
        assert torch.equal(v[1], 2 * eager) and torch.equal(v[2], -eager)  # exact scalings
        # torch.compile as test_torch_compile.py tests it, from its floor (conftest.TORCH_FLOORS)
        if not torch_below("compile"):
            torch._dynamo.reset()
            compiled = torch.compile(prod, fullgraph=True, backend="aot_eager")
            ac = a.clone().requires_grad_()
            out = compiled(ac, b)
            out.square().sum().backward()
            assert torch.equal(out, eager) and torch.equal(ac.grad, aa.grad)
    assert wide_calls


@pytest.mark.parametrize("opt_name", ["StiefelSGD", "StiefelAdam"])
def test_stiefel_optimizer_step_on_the_cuda_branch(opt_name, monkeypatch):
    """A CUDA parameter is stepped in torch (no NumPy views): under emulation the torch step
    runs on the CPU, the NumPy step never does, and float64 trajectories agree with the CPU
    path to rounding (6 steps; 1e-12 ≫ the ~1e-15 per-step reassociation, ≪ any formula
    difference) and stay on the manifold."""
    from householderla.torch import _optim

    host_steps = []
    real = _optim._on_host
    monkeypatch.setattr(_optim, "_on_host", lambda *t: host_steps.append(real(*t)) or real(*t))
    g = torch.Generator().manual_seed(5)
    X0 = torch.linalg.qr(torch.randn(9, 3, generator=g, dtype=torch.float64)).Q
    T = torch.randn(9, 3, generator=g, dtype=torch.float64)
    out = {}
    for kind in ("cpu", "cuda"):
        W = torch.nn.Parameter(X0.clone())
        opt = getattr(_optim, opt_name)([W], lr=0.1)
        with emulate_device(kind):
            for _ in range(6):
                opt.zero_grad()
                ((W - T) ** 2).sum().backward()
                opt.step()
        out[kind] = W.detach()
    assert True in host_steps and False in host_steps  # both branches ran
    torch.testing.assert_close(out["cuda"], out["cpu"], rtol=1e-12, atol=1e-12)
    eye = torch.eye(3, dtype=torch.float64)
    torch.testing.assert_close(out["cuda"].mT @ out["cuda"], eye, rtol=0, atol=1e-13)
