"""``StiefelSGD`` / ``StiefelAdam`` as ``torch.optim.Optimizer`` subclasses (Kong, Wang & Tao, ICLR
2023 App. P).

The update itself is the functional one (tests/test_stiefel.py checks it against the
equations); here: the torch contract — mixed Stiefel/Euclidean groups, wide and batched and
square parameters, structure after every step, bit-identical checkpoint resume, closure,
no-grad semantics, bad inputs; complex parameters (Algorithms 1, 2 with Hermitian transposes,
driven by autograd's ``.grad`` = ∂L/∂Re + i ∂L/∂Im). Tolerances as in test_stiefel.py
(20·eps·M for XᴴX = I; XᴴU relative to ‖U‖ + ‖G‖ times eps·N per step).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from conftest import require
from helpers import brockett, crandn, hermitian, orth_error

torch = require("torch")

import householderla as hl  # noqa: E402
from householderla.torch._optim import StiefelAdam, StiefelSGD  # noqa: E402

EPS = {torch.float32: float(np.finfo(np.float32).eps), torch.float64: float(np.finfo(float).eps)}
OPTS = {
    "sgd": lambda params, **kw: StiefelSGD(params, lr=kw.pop("lr", 0.1), **kw),
    "adam": lambda params, **kw: StiefelAdam(params, lr=kw.pop("lr", 0.05), **kw),
}


def orth(W):
    """‖WᵀW − I‖_F (columns) or ‖WWᵀ − I‖_F (rows, wide W), max over the batch, float64."""
    W = W.detach().double()
    if W.shape[-2] < W.shape[-1]:
        W = W.mT
    E = W.mT @ W - torch.eye(W.shape[-1], dtype=W.dtype)
    return float(torch.linalg.matrix_norm(E).max())


def model(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = {"tall": (8, 3), "batched": (2, 6, 3), "square": (4, 4), "wide": (3, 7)}
    mats = {
        k: torch.nn.Parameter(torch.randn(s, generator=g, dtype=dtype)) for k, s in shapes.items()
    }
    bias = torch.nn.Parameter(torch.randn(3, generator=g, dtype=dtype))
    return mats, bias


def loss_fn(mats, bias, targets):
    """A smooth loss with a non-symmetric XᵀG (so Z ≠ 0) and a Euclidean parameter."""
    return (
        sum(
            ((W - T) ** 2).sum() + (W.sum(-1) ** 2).sum()
            for W, T in zip(mats.values(), targets, strict=True)
        )
        + ((bias - 1.0) ** 2).sum()
        + (bias * mats["tall"].sum(0)).sum()
    )


def targets(mats, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(W.shape, generator=g, dtype=W.dtype) for W in mats.values()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("algo", sorted(OPTS))
def test_structure_every_step_mixed_groups(algo, dtype):
    mats, bias = model(dtype)
    T = targets(mats)
    opt = OPTS[algo]([{"params": list(mats.values())}, {"params": [bias], "stiefel": False}])
    eps = EPS[dtype]
    bias0 = bias.detach().clone()
    for k in range(5):
        opt.zero_grad()
        loss_fn(mats, bias, T).backward()
        opt.step()
        for name, W in mats.items():
            M = min(W.shape[-2:])
            assert torch.isfinite(W).all()
            assert orth(W) <= 20 * eps * M, (name, orth(W))
            st = opt.state[W]
            Z, U = st["Z"].double(), st["U"].double()
            assert st["step"].item() == k + 1
            assert float(torch.linalg.matrix_norm(Z + Z.mT).max()) <= 4 * eps * float(Z.norm())
            X = W.detach().double()
            X = X.mT if W.shape[-2] < W.shape[-1] else X
            if name == "square":
                assert U.shape[-1] == 0
            else:
                xu = float(torch.linalg.matrix_norm(X.mT @ U).max())
                assert xu <= 30 * eps * X.shape[-2] * (k + 1) * (1 + float(U.norm()) + 100)
        assert set(opt.state[bias]) == ({"step", "v"} if algo == "sgd" else {"step", "m", "s"})
    assert not torch.equal(bias.detach(), bias0)  # the Euclidean group moved


def test_same_trajectory_as_functional_api():
    """A stiefel group runs exactly hl.stiefel.momentum_sgd (bit for bit on the path the
    optimizer takes: CPU tensors are stepped in NumPy through zero-copy views); a
    stiefel=False group is heavy-ball SGD, i.e. torch.optim.SGD(momentum) (to rounding:
    torch may fuse p − lr·buf into one FMA)."""
    mats, bias = model(torch.float64, seed=3)
    W, T = mats["tall"], targets(mats)[0]
    b_ref = torch.nn.Parameter(bias.detach().clone())
    opt = StiefelSGD([{"params": [W]}, {"params": [bias], "stiefel": False}], lr=0.2, momentum=0.8)
    ref = torch.optim.SGD([b_ref], lr=0.2, momentum=0.8)
    fn = hl.stiefel.momentum_sgd(lr=0.2, momentum=0.8)
    X = W.detach().numpy().copy()
    state = fn.init(X)
    for _ in range(6):
        G = 2 * (X - T.numpy())
        X, state = fn.update(X, G, state)
        opt.zero_grad()
        ref.zero_grad()
        (((W - T) ** 2).sum() + (3 * (bias - 1) ** 2).sum()).backward()
        (3 * (b_ref - 1) ** 2).sum().backward()
        opt.step()
        ref.step()
        assert np.array_equal(W.detach().numpy(), X)
        assert torch.allclose(bias, b_ref, rtol=1e-14, atol=1e-14)
    assert abs(float(bias.detach().abs().max())) < 10  # a converging run, not a blow-up


def test_euclidean_adam_group_formula():
    """stiefel=False in StiefelAdam: m⁺ = β₁m − (1−β₁)g, s⁺ = β₂s + (1−β₂)g², x⁺ = x +
    ηκ m⁺/(√s⁺ + ε), κ = √(1 − β₂ᵗ) (Algorithm 2's convention, no β₁ correction)."""
    x = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64))
    opt = StiefelAdam([x], lr=0.1, betas=(0.8, 0.9), eps=1e-6, stiefel=False)
    xr, m, s = (
        x.detach().clone(),
        torch.zeros(3, dtype=torch.float64),
        torch.zeros(3, dtype=torch.float64),
    )
    for t in range(1, 5):
        opt.zero_grad()
        (x**4).sum().backward()
        g = 4 * xr**3
        opt.step()
        m = 0.8 * m - 0.2 * g
        s = 0.9 * s + 0.1 * g * g
        xr = xr + 0.1 * np.sqrt(1 - 0.9**t) * m / (s.sqrt() + 1e-6)
        assert torch.allclose(x.detach(), xr, rtol=1e-14, atol=0)


@pytest.mark.parametrize("algo", sorted(OPTS))
def test_state_dict_resume_bit_identical(algo):
    mats, bias = model(torch.float32, seed=5)
    T = targets(mats)

    def make(mats, bias):
        return OPTS[algo]([{"params": list(mats.values())}, {"params": [bias], "stiefel": False}])

    def run(opt, mats, bias, k):
        for _ in range(k):
            opt.zero_grad()
            loss_fn(mats, bias, T).backward()
            opt.step()

    opt = make(mats, bias)
    run(opt, mats, bias, 3)
    saved_params = {k: W.detach().clone() for k, W in mats.items()}, bias.detach().clone()
    saved_state = copy.deepcopy(opt.state_dict())
    run(opt, mats, bias, 4)
    # fresh model and optimizer, restored from the checkpoint
    mats2 = {k: torch.nn.Parameter(v.clone()) for k, v in saved_params[0].items()}
    bias2 = torch.nn.Parameter(saved_params[1].clone())
    opt2 = make(mats2, bias2)
    opt2.load_state_dict(saved_state)
    run(opt2, mats2, bias2, 4)
    for k in mats:
        assert torch.equal(mats[k], mats2[k]), k
    assert torch.equal(bias, bias2)
    for p, p2 in zip([*mats.values(), bias], [*mats2.values(), bias2], strict=True):
        for key, val in opt.state[p].items():
            assert torch.equal(val, opt2.state[p2][key]), key


def test_closure_and_no_grad():
    mats, _ = model(torch.float64, seed=7)
    W, T = mats["tall"], targets(mats)[0]
    opt = StiefelSGD([W], lr=0.1)
    calls = []

    def closure():
        calls.append(torch.is_grad_enabled())
        opt.zero_grad()
        loss = ((W - T) ** 2).sum()
        loss.backward()
        return loss

    with torch.no_grad():  # like the built-in optimizers: step works inside no_grad
        loss = opt.step(closure)
    assert calls == [True] and isinstance(loss, torch.Tensor) and loss.requires_grad
    assert W.requires_grad and W.grad_fn is None and W.is_leaf
    assert orth(W) <= 20 * EPS[torch.float64] * 3
    assert opt.step() is None  # no closure: None


def test_large_steps_and_convergence():
    """App. Q (reduced: n = 60, m = 4) through autograd: lr = 0.3, μ = 0.9 stays on the
    manifold and reaches the sum of the top-4 eigenvalues (to 1e-10, float64)."""
    rng = np.random.default_rng(3)
    Xi = rng.standard_normal((60, 60))
    A = torch.asarray((Xi + Xi.T) / 2 / np.sqrt(60))
    target = float(torch.linalg.eigvalsh(A)[-4:].sum())
    W = torch.nn.Parameter(torch.asarray(rng.standard_normal((60, 4))))
    opt = StiefelSGD([W], lr=0.3, momentum=0.9)
    for _ in range(300):
        opt.zero_grad()
        (-torch.trace(W.T @ A @ W)).backward()
        opt.step()
        assert orth(W) <= 20 * EPS[torch.float64] * 4
    assert abs(float(torch.trace(W.T @ A @ W).detach()) - target) <= 1e-10


def test_lr_scheduler_changes_the_step():
    mats, _ = model(torch.float64, seed=9)
    W, T = mats["tall"], targets(mats)[0]
    opt = StiefelSGD([W], lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    fn_states = []
    X = W.detach().numpy().copy()  # CPU tensors are stepped in NumPy: the same path
    for lr in (0.1, 0.05, 0.025):
        fn = hl.stiefel.momentum_sgd(lr=lr)
        state = fn.init(X) if not fn_states else fn_states[-1]
        X, state = fn.update(X, 2 * (X - T.numpy()), state)
        fn_states.append(state)
        opt.zero_grad()
        ((W - T) ** 2).sum().backward()
        opt.step()
        sched.step()
        assert np.array_equal(W.detach().numpy(), X)


def test_bad_input():
    W = torch.nn.Parameter(torch.randn(5, 2, dtype=torch.float64))
    v = torch.nn.Parameter(torch.randn(5, dtype=torch.float64))
    with pytest.raises(ValueError, match="parameter 1 of a stiefel=True group"):
        StiefelSGD([W, v])
    for kwargs, name in [
        ({"lr": float("nan")}, "lr"),
        ({"momentum": 1.0}, "momentum"),
        ({"metric": 1.0}, "metric"),
    ]:
        with pytest.raises(ValueError, match=name):
            StiefelSGD([W], **kwargs)
    with pytest.raises(ValueError, match="expm_method"):
        StiefelSGD([W], expm_method="pade")
    with pytest.raises(ValueError, match="betas"):
        StiefelAdam([W], betas=(0.9,))
    with pytest.raises(ValueError, match="b2"):
        StiefelAdam([W], betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="stiefel must be"):
        StiefelSGD([{"params": [W], "stiefel": "yes"}])
    # sparse gradients: a clear error, whatever the group
    emb = torch.nn.Embedding(10, 3, sparse=True)
    for algo in OPTS:
        for manifold in (True, False):
            opt = OPTS[algo]([{"params": [emb.weight], "stiefel": manifold}])
            emb(torch.tensor([1, 2])).sum().backward()
            with pytest.raises(TypeError, match="sparse gradients"):
                opt.step()
            emb.zero_grad()
    # half precision: the library's dtype error names the argument
    H = torch.nn.Parameter(torch.randn(5, 2, dtype=torch.float16))
    opt = StiefelSGD([H])
    H.grad = torch.ones_like(H)
    with pytest.raises(TypeError, match="float16"):
        opt.step()


@pytest.mark.parametrize("cls", [hl.torch.StiefelSGD, hl.torch.StiefelAdam])
def test_a_non_finite_gradient_moves_nothing(cls):
    """A step is all or nothing (issue 12, class 4): every gradient of every group is checked
    before any parameter moves; the error names the bad gradient (not "X"); with
    nonfinite="skip" the whole step is skipped and counted."""
    torch.manual_seed(1)
    W = torch.nn.Parameter(torch.linalg.qr(torch.randn(6, 3, dtype=torch.float64))[0])
    b = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    groups = [{"params": [W]}, {"params": [b], "stiefel": False}]
    W0, b0 = W.detach().clone(), b.detach().clone()
    opt = cls(groups, lr=0.1)
    W.grad = torch.ones_like(W)
    b.grad = torch.tensor([1.0, float("nan"), 0.0], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"gradient of parameter 0 of group 1 \(shape \(3,\)\)"):
        opt.step()
    assert torch.equal(W.detach(), W0) and torch.equal(b.detach(), b0) and not opt.state
    skip = cls(groups, lr=0.1, nonfinite="skip")
    skip.step()
    assert skip.skipped_steps == 1 and torch.equal(W.detach(), W0) and not skip.state
    b.grad = torch.zeros_like(b)
    skip.step()  # a finite step still runs
    assert skip.skipped_steps == 1 and not torch.equal(W.detach(), W0)
    with pytest.raises(ValueError, match="nonfinite must be one of"):
        cls([W], nonfinite="ignore")


def test_large_steps_from_a_rank_deficient_start_do_not_stop():
    """The default options survive a rank-deficient start and huge steps (issue 12, class 4):
    the projection falls back to the SVD polar factor instead of raising."""
    W = torch.nn.Parameter(torch.ones(5, 2, dtype=torch.float64))  # rank 1
    opt = hl.torch.StiefelSGD([W], lr=50.0)
    for _ in range(3):
        W.grad = torch.randn(5, 2, dtype=torch.float64)
        opt.step()
    torch.testing.assert_close(W.T @ W, torch.eye(2, dtype=torch.float64), atol=1e-13, rtol=0)


@pytest.mark.parametrize("algo", sorted(OPTS))
def test_torch_path_equals_numpy_path(algo, monkeypatch):
    """CPU tensors are stepped in NumPy (zero-copy views); GPU tensors and torch.compile take
    the torch path. Both run the same functional update, so they agree to rounding (forced
    here on the CPU), state tensors included, for every parameter shape."""
    import householderla.torch._optim as TO

    runs = []
    for host in (True, False):
        monkeypatch.setattr(TO, "_on_host", lambda *t, host=host: host)
        mats, bias = model(torch.float64, seed=5)
        T = targets(mats)
        opt = OPTS[algo]([{"params": list(mats.values())}, {"params": [bias], "stiefel": False}])
        for _ in range(4):
            opt.zero_grad()
            loss_fn(mats, bias, T).backward()
            opt.step()
        runs.append((mats, bias, opt))
    (m1, b1, o1), (m2, b2, o2) = runs
    tol = 1e-12  # four steps of O(1) operations on O(1) entries, float64
    for name in m1:
        assert torch.allclose(m1[name], m2[name], rtol=0, atol=tol), name
        for key, val in o1.state[m1[name]].items():
            assert val.dtype == o2.state[m2[name]][key].dtype, (name, key)
            assert torch.allclose(val.double(), o2.state[m2[name]][key].double(), atol=tol)
    assert torch.allclose(b1, b2, rtol=0, atol=tol)


@pytest.mark.parametrize("amsgrad", [False, True])
def test_geoopts_stiefel_problem_converges_at_the_documented_step_sizes(amsgrad):
    """geoopt's RiemannianAdam test problem (20 x 10, f = ||X - X*||^2): StiefelAdam reaches
    ||X - X*|| < 1e-5 within 300 steps at lr = 0.2 (docs/theory/stiefel.rst, "Step size of the
    Adam variants": 256 steps measured; geoopt 246-296)."""
    gen = torch.Generator().manual_seed(42)
    X0 = torch.linalg.qr(torch.randn(20, 10, dtype=torch.float64, generator=gen)).Q
    Xs = torch.linalg.qr(torch.randn(20, 10, dtype=torch.float64, generator=gen)).Q
    X = torch.nn.Parameter(X0.clone())
    opt = hl.torch.StiefelAdam([X], lr=0.2, amsgrad=amsgrad)
    for _ in range(300):
        if float((X.detach() - Xs).norm()) < 1e-5:
            break
        opt.zero_grad()
        ((X - Xs) ** 2).sum().backward()
        opt.step()
    assert float((X.detach() - Xs).norm()) < 1e-5


# -- complex parameters (Hermitian transposes; autograd's .grad is ∂L/∂Re + i ∂L/∂Im) ------


@pytest.mark.parametrize("name", ["StiefelSGD", "StiefelAdam"])
def test_torch_optimizer_complex_parameters(name):
    """``hl.torch.StiefelSGD`` / ``StiefelAdam`` on complex ``nn.Parameter``s: a tall one
    (WᴴW = I), a wide one (rows orthonormal, W Wᴴ = I) and a complex Euclidean one in a
    ``stiefel=False`` group, all driven by autograd's ``.grad`` (∂L/∂Re + i ∂L/∂Im). The
    Brockett costs reach their minima and the Euclidean parameter its target."""
    rng = np.random.default_rng(2)
    A = hermitian(rng, 6)
    D = np.diag([2.0, 1.0])
    _, _, f_star = brockett(A, D)
    At, Dt = torch.asarray(A), torch.asarray(D, dtype=torch.complex128)
    tall = torch.nn.Parameter(torch.asarray(crandn(rng, 6, 2)))
    wide = torch.nn.Parameter(torch.asarray(crandn(rng, 2, 6)))
    target = torch.asarray(crandn(rng, 3))
    z = torch.nn.Parameter(torch.zeros(3, dtype=torch.complex128))
    groups = [{"params": [tall, wide]}, {"params": [z], "stiefel": False}]
    opt = StiefelSGD(groups, lr=0.1) if name == "StiefelSGD" else StiefelAdam(groups, lr=0.02)

    def cost(W):
        return -torch.real(torch.trace(W.mH @ At @ W @ Dt))

    for _ in range(1500):
        opt.zero_grad()
        loss = cost(tall) + cost(wide.mT) + torch.sum(torch.abs(z - target) ** 2)
        loss.backward()
        opt.step()
    eps = EPS[torch.float64]
    W, V = tall.detach().numpy(), wide.detach().numpy()
    assert tall.dtype == torch.complex128 and opt.state[tall]["Z"].dtype == torch.complex128
    assert orth_error(W) <= 20 * eps * 2 and orth_error(V.T) <= 20 * eps * 2
    for val in (cost(tall).item(), cost(wide.mT).item()):
        assert abs(val - f_star) <= 1e-8 * abs(f_star), (val, f_star)
    assert torch.max(torch.abs(z.detach() - target)).item() <= 1e-6


def test_torch_euclidean_complex_group_is_torch_sgd():
    """A complex ``stiefel=False`` group of StiefelSGD is ``torch.optim.SGD`` (complex heavy
    ball is linear, so both take the same steps to rounding: 10·eps·‖x‖)."""
    rng = np.random.default_rng(4)
    x0 = torch.asarray(crandn(rng, 5))
    target = torch.asarray(crandn(rng, 5))
    a, b = torch.nn.Parameter(x0.clone()), torch.nn.Parameter(x0.clone())
    ours = StiefelSGD([{"params": [a], "stiefel": False}], lr=0.05, momentum=0.8)
    ref = torch.optim.SGD([b], lr=0.05, momentum=0.8)
    for _ in range(20):
        for p, o in ((a, ours), (b, ref)):
            o.zero_grad()
            (torch.abs(p - target) ** 2 * torch.arange(1.0, 6.0)).sum().backward()
            o.step()
    tol = 10 * EPS[torch.float64] * float(torch.abs(b.detach()).max())
    assert torch.allclose(a.detach(), b.detach(), rtol=0, atol=tol)
