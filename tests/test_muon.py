"""Muon: ``hl.torch.Muon`` against ``torch.optim.Muon`` (torch 2.13, the anchor) and a NumPy
reference of its step, ``hl.jax.muon`` against ``hl.torch.Muon``.

Tolerances. With ``ns_dtype=float32`` the step is deterministic arithmetic in float32, so a
float64 NumPy reference of the same formulas (lerp momentum, Nesterov, decoupled decay,
adjusted lr, the schedule's polynomials on U/‖U‖_F) agrees to ~1e-5 relative after a few
steps; a wrong convention (momentum without the 1 − μ factor, decay scaled by the adjusted
lr, a missing √(A/B)) is off by ≥ 1e-2. In bfloat16, ours normalises U in float32 and
torch in bfloat16: the orthogonalised updates differ by the rounding of X₀ carried through 5
steps (measured ≤ 1.7e-2 relative to the parameters' movement after 5 steps; 3e-2 allowed).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from conftest import require

import householderla as hl
from householderla._agnostic import polar_schedules as PS

torch = require("torch")
#: the anchor: torch.optim.Muon is in recent torch only (the package admits torch >= 2.4)
needs_torch_muon = pytest.mark.skipif(
    not hasattr(torch.optim, "Muon"), reason=f"torch {torch.__version__} has no torch.optim.Muon"
)
pytestmark = pytest.mark.no_dask("optimizers take no Dask arrays")


def ref_steps(W, grads, *, lr, wd, mu, nesterov, adjust, schedule="muon", steps=5):
    """torch.optim.Muon's step in float64 NumPy (its source, with our schedules)."""
    W = W.astype(np.float64).copy()
    B = np.zeros_like(W)
    A_, B_ = W.shape[-2:]
    ratio = (
        math.sqrt(max(1.0, A_ / B_))
        if adjust in (None, "original")
        else 0.2 * math.sqrt(max(A_, B_))
    )
    sched = PS.schedule(schedule, steps, 1e-3, 2.0**-24, min(W.shape))
    for G in grads:
        B = B + (1 - mu) * (G - B)
        U = G + mu * (B - G) if nesterov else B
        X = U.T if U.shape[0] > U.shape[1] else U
        X = X / (sched.scale * np.linalg.norm(X))
        for a, b, c in sched.coeffs:
            A = X @ X.T
            X = a * X + (b * A + c * A @ A) @ X
        O = X.T if U.shape[0] > U.shape[1] else X
        W = W * (1 - lr * wd) - lr * ratio * O
    return W


def run(opt_cls, W0, grads, **kw):
    p = torch.nn.Parameter(torch.as_tensor(W0, dtype=torch.float32).clone())
    opt = opt_cls([p], **kw)
    for G in grads:
        p.grad = torch.as_tensor(G, dtype=torch.float32).clone()
        opt.step()
    return p.detach().double().numpy(), opt


@pytest.mark.parametrize("shape", [(24, 40), (40, 24)])
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"nesterov": False, "weight_decay": 0.0},
        {"adjust_lr_fn": "match_rms_adamw", "momentum": 0.9, "weight_decay": 0.3},
    ],
)
@pytest.mark.parametrize("schedule", ["muon", "polar_express", "certified"])
def test_conventions_against_a_float32_reference(shape, kw, schedule):
    rng = np.random.default_rng(0)
    W0 = rng.standard_normal(shape)
    grads = [rng.standard_normal(shape) for _ in range(4)]
    got, _ = run(hl.torch.Muon, W0, grads, lr=0.05, schedule=schedule, ns_dtype=torch.float32, **kw)
    ref = ref_steps(
        W0, grads, lr=0.05, wd=kw.get("weight_decay", 0.1), mu=kw.get("momentum", 0.95),
        nesterov=kw.get("nesterov", True), adjust=kw.get("adjust_lr_fn"), schedule=schedule,
    )  # fmt: skip
    assert np.linalg.norm(got - ref) <= 2e-5 * np.linalg.norm(ref)


@pytest.mark.parametrize("shape", [(32, 48), (48, 32)])
@pytest.mark.parametrize(
    "kw", [{}, {"nesterov": False}, {"adjust_lr_fn": "match_rms_adamw", "weight_decay": 0.0}]
)
@needs_torch_muon
def test_matches_torch_optim_muon(shape, kw):
    """schedule="muon" (or ns_coefficients=) is torch.optim.Muon's step, in bfloat16."""
    rng = np.random.default_rng(1)
    W0 = rng.standard_normal(shape)
    grads = [rng.standard_normal(shape) for _ in range(5)]
    ref, _ = run(torch.optim.Muon, W0, grads, lr=0.02, **kw)
    for extra in ({"schedule": "muon"}, {"ns_coefficients": PS.MUON_COEFFS}):
        got, _ = run(hl.torch.Muon, W0, grads, lr=0.02, **kw, **extra)
        assert np.linalg.norm(got - ref) <= 3e-2 * np.linalg.norm(ref - W0)


def test_certified_update_within_its_certificate():
    """The applied update O = −Δ/η' (Δ after removing the decay) of the default schedule has
    singular values below the certificate's bound under bfloat16 rounding."""
    rng = np.random.default_rng(2)
    W0 = rng.standard_normal((32, 160))
    G = rng.standard_normal((32, 160))
    got, _ = run(hl.torch.Muon, W0, [G], lr=0.1, weight_decay=0.0, nesterov=False)
    O = (W0 - got) / (0.1 * math.sqrt(max(1, 32 / 160)))
    s = np.linalg.svd(O, compute_uv=False)
    sch = PS.schedule("certified", 5, 1e-3, 2.0**-8, 32)
    assert s.max() <= sch.upper
    # a Gaussian update's singular values are all above certified_min_sv·‖G‖_F here, and
    # the certificate puts them at ½ or above
    assert np.linalg.svd(G, compute_uv=False).min() / np.linalg.norm(G) > sch.certified_min_sv
    assert s.min() >= 0.5


def test_batched_parameter_is_a_stack_of_matrices():
    rng = np.random.default_rng(3)
    W0 = rng.standard_normal((3, 8, 12))
    grads = [rng.standard_normal((3, 8, 12)) for _ in range(2)]
    got, _ = run(hl.torch.Muon, W0, grads, lr=0.1, ns_dtype=torch.float32)
    for i in range(3):
        one, _ = run(hl.torch.Muon, W0[i], [g[i] for g in grads], lr=0.1, ns_dtype=torch.float32)
        assert np.allclose(got[i], one, rtol=1e-5, atol=1e-6)


def test_groups_schedulers_state_dict_and_closure():
    rng = np.random.default_rng(4)
    a = torch.nn.Parameter(torch.randn(6, 9, dtype=torch.float32))
    b = torch.nn.Parameter(torch.randn(9, 6, dtype=torch.float32))
    opt = hl.torch.Muon([{"params": [a]}, {"params": [b], "lr": 0.0}], lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    b0 = b.detach().clone()

    def closure():
        opt.zero_grad()
        loss = (a**2).sum() + (b**2).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert float(loss.detach()) > 0 and torch.equal(b.detach(), b0 * (1 - 0.0))  # lr 0 group: still
    sched.step()
    assert opt.param_groups[0]["lr"] == 0.05
    # resume from a state_dict: the next steps are bit-identical
    sd = copy.deepcopy(opt.state_dict())  # (state_dict() holds the live buffers)
    twin_a = torch.nn.Parameter(a.detach().clone())
    twin_b = torch.nn.Parameter(b.detach().clone())
    twin = hl.torch.Muon([{"params": [twin_a]}, {"params": [twin_b], "lr": 0.0}], lr=0.1)
    twin.load_state_dict(sd)
    g = torch.as_tensor(rng.standard_normal((6, 9)), dtype=torch.float32)
    for p, q in ((a, twin_a),):
        p.grad, q.grad = g.clone(), g.clone()
    b.grad = twin_b.grad = None
    opt.step()
    twin.step()
    assert torch.equal(a, twin_a)
    assert set(opt.state[a]) == {"momentum_buffer"}


def _trained(opt_cls, W0, grads, **kw):
    p = torch.nn.Parameter(torch.as_tensor(W0, dtype=torch.float32).clone())
    opt = opt_cls([p], lr=0.02, **kw)
    for G in grads:
        p.grad = torch.as_tensor(G, dtype=torch.float32).clone()
        opt.step()
    return p, opt


@needs_torch_muon
def test_checkpoints_cross_between_torch_muon_and_ours():
    """A torch.optim.Muon checkpoint loads into hl.torch.Muon (it raised KeyError 'ns_dtype',
    issue 41 item 5) and continues with torch's quintic in bfloat16: the next step moves the
    parameter as torch's own next step does (bfloat16 normalisation differs: 3e-2 of the
    movement, as in the module docstring). Ours built with ns_coefficients loads into
    torch's."""
    rng = np.random.default_rng(9)
    W0 = rng.standard_normal((12, 20))
    grads = [rng.standard_normal((12, 20)) for _ in range(3)]
    p_ref, ref = _trained(torch.optim.Muon, W0, grads[:2])
    sd = copy.deepcopy(ref.state_dict())
    q = torch.nn.Parameter(p_ref.detach().clone())
    ours = hl.torch.Muon([q], lr=0.02)
    ours.load_state_dict(sd)
    assert ours.param_groups[0]["schedule"] == "muon"
    assert ours.param_groups[0]["ns_dtype"] == torch.bfloat16
    torch.testing.assert_close(
        ours.state[q]["momentum_buffer"], ref.state[p_ref]["momentum_buffer"]
    )
    before = p_ref.detach().clone()
    for p, o in ((p_ref, ref), (q, ours)):
        p.grad = torch.as_tensor(grads[2], dtype=torch.float32).clone()
        o.step()
    moved = (p_ref.detach() - before).norm()
    assert float((q.detach() - p_ref.detach()).norm() / moved) < 3e-2
    # and back: ours with torch's coefficients into torch.optim.Muon
    p_ours, ours = _trained(hl.torch.Muon, W0, grads[:2], ns_coefficients=PS.MUON_COEFFS)
    r = torch.nn.Parameter(p_ours.detach().clone())
    theirs = torch.optim.Muon([r], lr=0.02)
    theirs.load_state_dict(copy.deepcopy(ours.state_dict()))
    r.grad = torch.as_tensor(grads[2], dtype=torch.float32).clone()
    theirs.step()
    assert torch.isfinite(r).all() and not torch.equal(r.detach(), p_ours.detach())


def test_bad_arguments():
    p = torch.nn.Parameter(torch.randn(4, 5))
    with pytest.raises(ValueError, match="optimises matrices"):
        hl.torch.Muon([torch.nn.Parameter(torch.randn(4))])
    with pytest.raises(ValueError, match="Adjust learning rate function"):
        hl.torch.Muon([p], adjust_lr_fn="bogus")
    with pytest.raises(ValueError, match="schedule must be one of"):
        hl.torch.Muon([p], schedule="bogus")
    with pytest.raises(ValueError, match="steps must be an integer"):
        hl.torch.Muon([p], ns_steps=0)
    with pytest.raises(ValueError, match="Learning rate should be"):
        hl.torch.Muon([p], lr=-1.0)
    with pytest.raises(ValueError, match="replaces the schedule"):
        hl.torch.Muon([p], ns_coefficients=(1.0, 0.0, 0.0), schedule="polar_express")
    with pytest.raises(RuntimeError, match="complex"):
        hl.torch.Muon([torch.nn.Parameter(torch.randn(3, 3, dtype=torch.complex64))])
    opt = hl.torch.Muon([p])
    p.grad = torch.randn(4, 5).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()


# -- JAX ---------------------------------------------------------------------------------------


def test_jax_muon_matches_torch_muon_and_the_reference():
    require("jax")
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(5)
    W0 = rng.standard_normal((20, 36))
    grads = [rng.standard_normal((20, 36)) for _ in range(4)]
    for ns_dtype, tol in ((jnp.float32, 2e-5), (jnp.bfloat16, 2e-3)):
        tx = hl.jax.muon(0.05, nesterov=True, ns_dtype=ns_dtype)
        params = {"W": jnp.asarray(W0, jnp.float32)}
        state = tx.init(params)
        update = jax.jit(tx.update)
        for G in grads:
            u, state = update({"W": jnp.asarray(G, jnp.float32)}, state, params)
            params = hl.jax.apply_updates(params, u)
        got = np.asarray(params["W"], np.float64)
        tdt = torch.float32 if ns_dtype == jnp.float32 else torch.bfloat16
        ref, _ = run(hl.torch.Muon, W0, grads, lr=0.05, ns_dtype=tdt)
        assert np.linalg.norm(got - ref) <= tol * np.linalg.norm(ref)
    assert int(state.count) == 4


def test_jax_muon_schedule_and_errors():
    require("jax")
    import jax.numpy as jnp

    calls = []

    def lr(count):
        calls.append(count)
        return 0.1 / (1 + count)

    tx = hl.jax.muon(lr, weight_decay=0.0, ns_dtype=jnp.float32)
    params = {"W": jnp.ones((3, 5)) + jnp.eye(3, 5)}
    state = tx.init(params)
    u1, state = tx.update({"W": jnp.ones((3, 5))}, state, params)
    u2, state = tx.update({"W": jnp.ones((3, 5))}, state, params)
    # same gradient and buffer direction: the second step is half as long (lr 0.1 → 0.05),
    # up to the float32 rounding of X₀ carried through 5 non-contracting steps at σ = 1
    r = float(jnp.linalg.norm(u2["W"]) / jnp.linalg.norm(u1["W"]))
    assert abs(r - 0.5) < 1e-2 and len(calls) == 2
    with pytest.raises(ValueError, match="optimises matrices"):
        tx.init({"b": jnp.zeros(3)})
    with pytest.raises(ValueError, match="needs params"):
        tx.update({"W": jnp.ones((3, 5))}, state)
    with pytest.raises(ValueError, match="schedule must be one of"):
        hl.jax.muon(schedule="bogus")


@pytest.mark.parametrize("ns_dtype", [torch.float32, torch.bfloat16])
def test_update_is_the_same_at_every_power_of_two_gradient_scale(ns_dtype):
    """Muon's update from 2^k·G is the update from G, bit for bit, wherever ‖2^k G‖_F ≥ eps
    (torch.optim.Muon's clamp), over float32's range: the norm is taken after an exact
    power-of-two scaling (issue 41: float32 failed around 1e±20…1e±30). With eps = 0,
    subnormal gradients too."""
    rng = np.random.default_rng(12)
    G = (rng.integers(-17, 18, (24, 40)) / 8.0).astype(np.float32)  # 2^k·G exact

    def update(k, eps):
        p = torch.nn.Parameter(torch.zeros(24, 40))
        opt = hl.torch.Muon([p], lr=1.0, momentum=0.0, nesterov=False, weight_decay=0.0,
                            eps=eps, ns_dtype=ns_dtype)  # fmt: skip
        p.grad = torch.as_tensor(np.ldexp(G, k).astype(np.float32))
        opt.step()
        return p.detach().numpy()

    ref = update(0, 1e-7)
    assert np.all(np.isfinite(ref)) and np.abs(ref).max() > 0.05
    for k in (-20, -60, 30, 90, 122):
        assert np.array_equal(update(k, 1e-7 if k > -30 else 0.0), ref), k
    # subnormal entries (bfloat16's spacing there is 2^-133, float32's 2^-149), eps = 0
    for k in (-129, -130) if ns_dtype == torch.bfloat16 else (-135, -140):
        assert np.array_equal(update(k, 0.0), ref), k


# -- the orthogonalisation as a plug-in (hl.torch.orthogonalize) and split_sizes ----------------

#: torch.optim.Muon's default quintic (Jordan et al.)
JORDAN = (3.4445, -4.7750, 2.0315)


@needs_torch_muon
@pytest.mark.parametrize("shape", [(16, 40), (40, 16)])
def test_orthogonalize_matches_torch_muons_own_function(shape):
    """``hl.torch.orthogonalize(G, eps, coefficients=...)`` computes torch.optim.Muon's
    ``_zeropower_via_newtonschulz`` (the function Dion-style ``newton_schulz_func(input,
    epsilon)`` hooks replace). Both iterate in bfloat16, whose roundings the quintic's slope
    of 3.4 at 0 amplifies (each is ~1.5% from the exact iteration here): ours must be no
    farther from the float64 iteration of the same coefficients than twice torch's own
    distance, while other coefficients or another normalisation are off by O(1)."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    G = torch.randn(*shape, generator=torch.Generator().manual_seed(3))
    ref = _zeropower_via_newtonschulz(G, JORDAN, 5, 1e-7).float()
    got = hl.torch.orthogonalize(G, 1e-7, coefficients=JORDAN)
    assert got.dtype == G.dtype and got.shape == G.shape
    exact = hl.torch.orthogonalize(G.double(), 1e-7, coefficients=JORDAN, dtype=torch.float64)
    torch_error = torch.linalg.norm(ref.double() - exact)
    assert torch.linalg.norm(got.double() - exact) <= 2 * torch_error
    assert torch_error <= 0.05 * torch.linalg.norm(exact)  # the same map: bfloat16 apart


def test_orthogonalize_is_muons_step_and_takes_per_step_coefficients():
    """Muon's update is −η·adjust·orthogonalize(U) bit for bit (from W = 0: one rounding of
    the product in float32); one triple equals that triple repeated per step (optax's
    ``ns_coeffs`` form); a batch is each matrix on its own."""
    G = torch.randn(3, 8, 12, generator=torch.Generator().manual_seed(4))
    p = torch.nn.Parameter(torch.zeros(3, 8, 12))
    opt = hl.torch.Muon([p], lr=0.5, weight_decay=0.0, momentum=0.0, nesterov=False)
    p.grad = G.clone()
    opt.step()
    O = hl.torch.orthogonalize(G)
    assert torch.equal(p.detach(), -0.5 * O.to(torch.bfloat16).float())
    one = hl.torch.orthogonalize(G, coefficients=JORDAN, dtype=torch.float32)
    per_step = hl.torch.orthogonalize(G, coefficients=[JORDAN] * 5, dtype=torch.float32)
    assert torch.equal(one, per_step)
    three = hl.torch.orthogonalize(G, coefficients=[JORDAN] * 3, dtype=torch.float32)
    assert not torch.equal(one, three)
    for i in range(3):
        assert torch.equal(hl.torch.orthogonalize(G[i], dtype=torch.float32),
                           hl.torch.orthogonalize(G, dtype=torch.float32)[i])  # fmt: skip


def test_orthogonalize_singular_values_and_errors():
    """The certified schedule in float64 lands every singular value in its interval; bad
    arguments are named."""
    G = torch.randn(24, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    _, info = hl.polar(G, schedule="certified", return_info=True)
    s = torch.linalg.svdvals(hl.torch.orthogonalize(G, dtype=torch.float64))
    lo, hi = info["interval"]
    assert lo <= float(s.min()) and float(s.max()) <= hi
    with pytest.raises(ValueError, match="G must have shape"):
        hl.torch.orthogonalize(torch.ones(4))
    with pytest.raises(TypeError, match="floating dtype"):
        hl.torch.orthogonalize(torch.ones(4, 4, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"G must be a torch\.Tensor"):
        hl.torch.orthogonalize(np.ones((4, 4)))
    with pytest.raises(ValueError, match="epsilon must be"):
        hl.torch.orthogonalize(torch.ones(4, 4), -1.0)
    with pytest.raises(ValueError, match="steps=3 but coefficients has 5"):
        hl.torch.orthogonalize(torch.ones(4, 4), coefficients=[JORDAN] * 5, steps=3)
    with pytest.raises(ValueError, match="coefficients must be"):
        hl.torch.orthogonalize(torch.ones(4, 4), coefficients=(1.0, 2.0))
    with pytest.raises(ValueError, match="schedule must be one of"):
        hl.torch.orthogonalize(torch.ones(4, 4), schedule="bogus")


def _split_reference(W0, G, sizes, lr):
    """W0 − η·adjust(a_i, B)·orthogonalize(G_i) per row block (float32 iteration)."""
    out, start = W0.clone(), 0
    for a in sizes:
        Gi = G[..., start : start + a, :]
        ratio = math.sqrt(max(1.0, a / G.shape[-1]))
        out[..., start : start + a, :] -= (
            lr * ratio * hl.torch.orthogonalize(Gi, dtype=torch.float32)
        )
        start += a
    return out


@pytest.mark.parametrize("sizes", [(4, 4, 4), (2, 6, 4), (12,)])
def test_split_sizes_orthogonalise_each_block_on_its_own(sizes):
    """A fused (12, 8) weight split into row blocks: each block's update is its own polar
    factor with its own learning-rate adjustment (equal blocks take one batched call, unequal
    ones a loop: both against the per-block reference). Batched and single GEMMs round in
    different orders; the five steps carry that rounding, growing it by up to p'(0) ≈ 3.4 per
    step (3.4⁵ ≈ 500): 500 float32 eps of the unit-scale update, times lr (measured 1.7e-6 on
    an AMD EPYC, torch's MKL; the whole matrix's polar factor instead is off by > 1e-2)."""
    gen = torch.Generator().manual_seed(6)
    W0, G = torch.randn(12, 8, generator=gen), torch.randn(12, 8, generator=gen)
    p = torch.nn.Parameter(W0.clone())
    opt = hl.torch.Muon(
        [p], lr=0.1, weight_decay=0.0, momentum=0.0, nesterov=False,
        ns_dtype=torch.float32, split_sizes=sizes,
    )  # fmt: skip
    p.grad = G.clone()
    opt.step()
    tol = 0.1 * 500 * torch.finfo(torch.float32).eps
    torch.testing.assert_close(p.detach(), _split_reference(W0, G, sizes, 0.1), rtol=0, atol=tol)
    if len(sizes) > 1:  # not the whole matrix's polar factor
        whole = W0 - 0.1 * math.sqrt(1.5) * hl.torch.orthogonalize(G, dtype=torch.float32)
        assert torch.linalg.norm(p.detach() - whole) > 1e-2


def test_split_sizes_errors_and_checkpoints():
    p = torch.nn.Parameter(torch.randn(12, 8))
    with pytest.raises(ValueError, match=r"split_sizes \(4, 4\) sum to 8, but parameter 0"):
        hl.torch.Muon([p], split_sizes=(4, 4))
    with pytest.raises(ValueError, match="split_sizes must be positive integers"):
        hl.torch.Muon([p], split_sizes=(12, 0))
    opt = hl.torch.Muon([p], split_sizes=[6, 6])
    assert opt.param_groups[0]["split_sizes"] == (6, 6)
    state = copy.deepcopy(opt.state_dict())
    again = hl.torch.Muon([p])
    again.load_state_dict(state)
    assert again.param_groups[0]["split_sizes"] == (6, 6)


def test_jax_muon_split_sizes_match_torch():
    """hl.jax.muon with ``split_sizes`` (one sequence, or a function of the leaf) makes the
    same step as the per-block reference (float32 iterations by XLA and torch: their
    roundings, amplified by 5 steps of slope ≤ 3.4, stay below 2e-5 on entries of size ~1)."""
    require("jax")
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(7)
    W0, G = rng.standard_normal((12, 8)), rng.standard_normal((12, 8))
    for sizes in ((4, 4, 4), (2, 6, 4)):
        tx = hl.jax.muon(0.1, weight_decay=0.0, momentum=0.0, nesterov=False,
                         ns_dtype=jnp.float32, split_sizes=sizes)  # fmt: skip
        params = {"qkv": jnp.asarray(W0, jnp.float32), "out": jnp.asarray(W0[:8], jnp.float32)}

        def choose(leaf, s=sizes):
            return s if leaf.shape[0] == 12 else None

        pick = hl.jax.muon(0.1, weight_decay=0.0, momentum=0.0, nesterov=False,
                           ns_dtype=jnp.float32, split_sizes=choose)  # fmt: skip
        state = pick.init(params)
        grads = {"qkv": jnp.asarray(G, jnp.float32), "out": jnp.asarray(G[:8], jnp.float32)}
        u, _ = jax.jit(pick.update)(grads, state, params)
        ref = _split_reference(torch.tensor(W0, dtype=torch.float32),
                               torch.tensor(G, dtype=torch.float32), sizes, 0.1)  # fmt: skip
        got = np.asarray(params["qkv"] + u["qkv"])
        np.testing.assert_allclose(got, ref.numpy(), rtol=0, atol=2e-5)
        whole = _split_reference(torch.tensor(W0[:8], dtype=torch.float32),
                                 torch.tensor(G[:8], dtype=torch.float32), (8,), 0.1)  # fmt: skip
        np.testing.assert_allclose(np.asarray(params["out"] + u["out"]), whole.numpy(), atol=2e-5)
        with pytest.raises(ValueError, match="do not split the 8 rows of leaf"):
            tx.init(params)
    with pytest.raises(ValueError, match="split_sizes must be positive integers"):
        hl.jax.muon(split_sizes=(0, 3))
