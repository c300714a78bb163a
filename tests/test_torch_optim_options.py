"""torch.optim parity of ``hl.torch.StiefelSGD`` / ``StiefelAdam``: ``nesterov``,
``dampening``, ``weight_decay``, ``maximize``, ``amsgrad``, parameter groups, schedulers,
``torch.compile`` of ``step()``, and clear errors for what is not implemented.

Oracles: a ``stiefel=False`` group of StiefelSGD is ``torch.optim.SGD`` (same formulas in
float64: equal to 1e-14); on the manifold the options are checked through identities that a
wrong implementation breaks: ``maximize`` is the step of −G, ``weight_decay`` is a no-op
(‖X‖²_F is constant on St(N, M)), the first Nesterov step is the plain step with
lr·(1 + μ), the first damped step is undamped (torch's buffer starts at the gradient), and
every option keeps XᵀX = I, XᵀU = 0 and Z skew (Theorems 4–7 of Kong, Wang & Tao, ICLR 2023).
Tolerances: 1e-12 for float64 identities that hold up to a few roundings.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require, torch_below

torch = require("torch")
import householderla as hl  # noqa: E402
from householderla.torch import _optim as _torch_optim  # noqa: E402

pytestmark = pytest.mark.no_dask("optimizers take no Dask arrays")
F64 = torch.float64


def point(n=10, m=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(n, m, dtype=F64, generator=g)).Q


def grads(shape, k, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, dtype=F64, generator=g) for _ in range(k)]


def run(cls, W0, gs, groups=None, **kw):
    W = torch.nn.Parameter(W0.clone())
    opt = cls(groups(W) if groups else [W], **kw)
    for g in gs:
        W.grad = g.clone()
        opt.step()
    return W.detach(), opt


@pytest.mark.parametrize(
    "kw",
    [
        {"momentum": 0.9},
        {"momentum": 0.9, "nesterov": True},
        {"momentum": 0.8, "dampening": 0.3},
        {"momentum": 0.9, "weight_decay": 0.05, "maximize": True},
        {"momentum": 0.0, "weight_decay": 0.1},
    ],
)
def test_euclidean_group_is_torch_sgd(kw):
    x0 = torch.randn(7, dtype=F64)
    gs = grads((7,), 5)
    ours, _ = run(
        hl.torch.StiefelSGD,
        x0,
        gs,
        groups=lambda W: [{"params": [W], "stiefel": False}],
        lr=0.1,
        **kw,
    )
    ref, _ = run(torch.optim.SGD, x0, gs, lr=0.1, **kw)
    torch.testing.assert_close(ours, ref, rtol=1e-14, atol=1e-14)


def structure(opt, _W=None):
    W = opt.param_groups[0]["params"][0]
    X = W.detach()
    st = opt.state[W]
    E = X.T @ X - torch.eye(X.shape[1], dtype=F64)
    out = [float(E.norm()), float((st["Z"] + st["Z"].T).norm())]
    if st["U"].shape[-1]:
        out.append(float((X.T @ st["U"]).norm()))
    return max(out)


@pytest.mark.parametrize("cls", [hl.torch.StiefelSGD, hl.torch.StiefelAdam])
def test_maximize_is_the_step_of_minus_g(cls):
    W0, gs = point(), grads((10, 3), 4)
    up, _ = run(cls, W0, gs, lr=0.05, maximize=True)
    neg, _ = run(cls, W0, [-g for g in gs], lr=0.05)
    torch.testing.assert_close(up, neg, rtol=0, atol=0)


@pytest.mark.parametrize("cls", [hl.torch.StiefelSGD, hl.torch.StiefelAdam])
def test_weight_decay_is_a_no_op_on_the_manifold(cls):
    W0, gs = point(seed=2), grads((10, 3), 4)
    a, _ = run(cls, W0, gs, lr=0.05, weight_decay=0.3)
    b, _ = run(cls, W0, gs, lr=0.05)
    torch.testing.assert_close(a, b, rtol=0, atol=0)  # skipped, not merely cancelled


@pytest.mark.parametrize("shape", [(10, 3), (5, 5)])
def test_first_nesterov_step_is_the_plain_step_with_lr_times_1_plus_mu(shape):
    W0 = point(*shape)
    (g,) = grads(shape, 1)
    nes, opt = run(hl.torch.StiefelSGD, W0, [g], lr=0.05, momentum=0.9, nesterov=True)
    plain, _ = run(hl.torch.StiefelSGD, W0, [g], lr=0.05 * 1.9, momentum=0.9)
    torch.testing.assert_close(nes, plain, rtol=1e-12, atol=1e-12)
    later, opt = run(hl.torch.StiefelSGD, W0, grads(shape, 6), lr=0.05, momentum=0.9, nesterov=True)
    assert structure(opt, later) < 1e-12


def test_dampening_first_step_undamped_then_damped():
    W0, gs = point(seed=3), grads((10, 3), 3)
    d1, _ = run(hl.torch.StiefelSGD, W0, gs[:1], lr=0.05, dampening=0.5)
    p1, _ = run(hl.torch.StiefelSGD, W0, gs[:1], lr=0.05)
    torch.testing.assert_close(d1, p1, rtol=0, atol=0)
    d3, opt = run(hl.torch.StiefelSGD, W0, gs, lr=0.05, dampening=0.5)
    p3, _ = run(hl.torch.StiefelSGD, W0, gs, lr=0.05)
    assert float((d3 - p3).norm()) > 1e-4 and structure(opt, d3) < 1e-12


def test_amsgrad_keeps_structure_and_running_maxima():
    W0 = point(seed=4)
    gs = [g * s for g, s in zip(grads((10, 3), 6), [4, 2, 1, 0.5, 0.25, 0.1], strict=True)]
    W, opt = run(hl.torch.StiefelAdam, W0, gs, lr=0.05, amsgrad=True)
    st = opt.state[opt.param_groups[0]["params"][0]]
    assert set(st) == {"step", "U", "Z", "p", "q", "p_max", "q_max"}
    assert bool((st["p_max"] >= st["p"]).all()) and bool((st["q_max"] >= st["q"]).all())
    assert bool((st["p_max"] > st["p"]).any())  # shrinking gradients: the maxima differ
    assert structure(opt, W) < 1e-12
    plain, _ = run(hl.torch.StiefelAdam, W0, gs, lr=0.05)
    assert float((W - plain).norm()) > 1e-6
    # the Euclidean group: torch's amsgrad denominator, the paper's bias correction
    x0 = torch.randn(4, dtype=F64)
    xs, _ = run(
        hl.torch.StiefelAdam,
        x0,
        [g[:4, 0] for g in gs],
        groups=lambda W: [{"params": [W], "stiefel": False}],
        lr=0.05,
        amsgrad=True,
    )
    x, m, s, smax = x0.numpy().copy(), 0.0, 0.0, 0.0
    for t, g in enumerate([g[:4, 0].numpy() for g in gs], 1):
        m = 0.9 * m - 0.1 * g
        s = 0.999 * s + 0.001 * g * g
        smax = np.maximum(smax, s)
        x = x + 0.05 * np.sqrt(1 - 0.999**t) * m / (np.sqrt(smax) + 1e-8)
    np.testing.assert_allclose(xs.numpy(), x, rtol=1e-13, atol=1e-14)


def test_groups_and_schedulers():
    W0, gs = point(seed=5), grads((10, 3), 2)
    W = torch.nn.Parameter(W0.clone())
    b = torch.nn.Parameter(torch.zeros(3, dtype=F64))
    opt = hl.torch.StiefelSGD(
        [{"params": [W], "nesterov": True}, {"params": [b], "stiefel": False, "lr": 0.5}], lr=0.05
    )
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    W.grad, b.grad = gs[0].clone(), torch.ones(3, dtype=F64)
    opt.step()
    sched.step()
    assert opt.param_groups[1]["lr"] == pytest.approx(0.05)
    b1 = b.detach().clone()
    W.grad, b.grad = gs[1].clone(), torch.ones(3, dtype=F64)
    opt.step()
    # heavy ball on b with the scheduled lr 0.05: v = 0.9·(−1) − 1, b += 0.05·v
    torch.testing.assert_close(b.detach(), b1 + 0.05 * (0.9 * -1.0 - 1.0), rtol=0, atol=1e-15)


@pytest.mark.parametrize("cls", ["StiefelSGD", "StiefelAdam"])
def test_a_scheduler_may_reach_lr_zero(cls):
    """CosineAnnealingLR with eta_min=0 ends at lr = 0, which torch's optimizers accept (ours
    refused it, issue 41 item 5): a step at lr = 0 leaves the point where it is (to the polar
    factor's rounding) and keeps it on the manifold; the functional optimizers take lr=0."""
    W = torch.nn.Parameter(point(seed=7))
    opt = getattr(hl.torch, cls)([W], lr=0.05)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2, eta_min=0.0)
    for G in grads((10, 3), 3, seed=8):
        before = W.detach().clone()
        W.grad = G.clone()
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05 * (1 + np.cos(np.pi * 3 / 2)) / 2)
    # the third step ran at lr = 0 (the scheduler reached it after the second)
    torch.testing.assert_close(W.detach(), before, rtol=0, atol=1e-14)
    Wd = W.detach()
    err = torch.linalg.matrix_norm(Wd.T @ Wd - torch.eye(3, dtype=F64))
    assert float(err) < 1e-14
    X = point(seed=9).numpy()
    for make in (hl.stiefel.momentum_sgd, hl.stiefel.adam):
        o = make(lr=0.0)
        Y, _ = o.update(X, np.ones_like(X), o.init(X))
        np.testing.assert_allclose(Y, X, rtol=0, atol=1e-14)


def test_unsupported_and_unknown_options():
    W = torch.nn.Parameter(point())
    for k in ("foreach", "fused", "differentiable", "capturable"):
        with pytest.raises(ValueError, match=f"does not implement {k}=True"):
            hl.torch.StiefelSGD([W], **{k: True})
        with pytest.raises(ValueError, match=f"does not implement {k}=True"):
            hl.torch.StiefelAdam([W], **{k: True})
    hl.torch.StiefelSGD([W], foreach=None, fused=False)  # torch's "not requested" values
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        hl.torch.StiefelSGD([W], bogus=1)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['betas'\]"):
        hl.torch.StiefelSGD([{"params": [W], "betas": (0.9, 0.99)}])
    with pytest.raises(ValueError, match="Nesterov momentum requires"):
        hl.torch.StiefelSGD([W], nesterov=True, dampening=0.1)
    with pytest.raises(ValueError, match="Nesterov momentum requires"):
        hl.torch.StiefelSGD([W], nesterov=True, momentum=0.0)
    with pytest.raises(ValueError, match="weight_decay must be"):
        hl.torch.StiefelAdam([W], weight_decay=-1.0)
    with pytest.raises(ValueError, match="maximize must be True or False"):
        hl.torch.StiefelAdam([W], maximize="yes")
    with pytest.raises(ValueError, match="dampening"):
        hl.torch.StiefelSGD([W], dampening=1.5)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(
    ("cls", "kw"),
    [
        (hl.torch.StiefelSGD, {"lr": 0.1, "nesterov": True, "weight_decay": 0.1}),
        pytest.param(hl.torch.StiefelAdam, {"lr": 0.01, "amsgrad": True}, marks=pytest.mark.long),
    ],
)
def test_compiled_step_takes_the_torch_path(cls, kw, monkeypatch):
    """torch.compile(opt.step) (dynamo, backend "eager") runs the torch path — the NumPy fast
    path's hand-over is made to fail — and matches the eager step (which takes that fast
    path on CPU float64) to a few ulps: the same formulas, other kernels."""
    if why := torch_below("compile"):
        pytest.skip(why)
    W0, gs = point(seed=6), grads((10, 3), 2)
    eager, _ = run(cls, W0, gs, **kw)

    def no_numpy(*args, **kwargs):
        raise AssertionError("the NumPy fast path ran under torch.compile")

    monkeypatch.setattr(_torch_optim, "to_numpy", no_numpy)
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    W = torch.nn.Parameter(W0.clone())
    opt = cls([W], **kw)
    step = torch.compile(opt.step, backend="eager")
    for g in gs:
        W.grad = g.clone()
        step()
    torch.testing.assert_close(W.detach(), eager, rtol=1e-13, atol=1e-13)
    # the step's only graph break is the finiteness check's bool (Tensor.item); a Python
    # scalar in the namespace's maximum/minimum broke it at every call (44 graphs, 21 s)
    breaks = {reason.split("\n")[0] for reason in counters["graph_break"]}
    assert all("Tensor.item()" in reason for reason in breaks), breaks
    assert counters["stats"]["unique_graphs"] <= 4, dict(counters["stats"])
