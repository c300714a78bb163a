"""The fixed-step mode of ``hl.polar`` (``schedule=``): the schedules' coefficients, the
certified intervals, and the iteration on every backend.

Oracles: the interval of a schedule is the image of [ℓ/s, 1/s] under its polynomials, so
the singular values of a result computed in float64 from an X whose singular values are
known (X = U diag(σ) Vᵀ, σ/‖X‖_F ∈ [ℓ, 1]) must lie in ``interval_exact`` up to float64
rounding (1e-9 ≫ the ~1e-14 of a few products, ≪ any wrong coefficient's effect); in half
precision they must lie in ``interval`` (the rounding model) and below ``upper``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import require, to_numpy

import householderla as hl
from householderla._agnostic import polar_schedules as PS

pytestmark = pytest.mark.no_dask("polar takes no Dask arrays")

SCHEDULES = ("newton_schulz", "muon", "polar_express", "certified")


def spectrum_matrix(rng, shape, ell):
    """(X, ℓ'): X of ``shape`` (..., N, M) whose singular values σ have σ/‖X‖_F spread over
    [ℓ', 1], ℓ' ≥ ``ell`` the smallest ratio attained (the certificate's lower end)."""
    *batch, N, M = shape
    k = min(N, M)
    U = np.linalg.qr(rng.standard_normal((*batch, N, k)))[0]
    V = np.linalg.qr(rng.standard_normal((*batch, M, k)))[0]
    s = np.exp(rng.uniform(math.log(ell), 0.0, (*batch, k)))
    s[..., 0] = 1.0
    s[..., -1] = ell
    r = s / np.sqrt(np.sum(s * s, axis=-1, keepdims=True))
    return (U * s[..., None, :]) @ np.swapaxes(V, -1, -2), float(np.min(r)) * (1 - 1e-9)


def svals(Q):
    a = np.asarray(Q, dtype=np.float64)
    return np.linalg.svd(a, compute_uv=False)


def f64(x):
    if hasattr(x, "detach"):
        return x.detach().float().cpu().numpy().astype(np.float64)
    if "bfloat16" in str(x.dtype):
        x = x.astype("float32")
    return np.asarray(to_numpy(x), dtype=np.float64)


# -- the coefficients ------------------------------------------------------------------------


@pytest.mark.parametrize(("lo", "hi"), [(1e-3, 1.0), (0.02, 1.0), (0.3, 1.7), (0.9, 1.1)])
def test_minimax_quintic_equioscillates(lo, hi):
    """Chebyshev alternation: |1 − p| reaches its maximum E at lo, at the two interior
    extrema and at hi, with alternating signs, and nowhere exceeds it."""
    c = PS.minimax_quintic(lo, hi)
    x = np.linspace(lo, hi, 200001)
    err = 1.0 - (c[0] * x + c[1] * x**3 + c[2] * x**5)
    E = float(np.max(np.abs(err)))
    pts = [lo, *PS._critical_points(c), hi]
    assert len(pts) == 4
    vals = [1.0 - PS._p(c, t) for t in pts]
    assert np.allclose(vals, [E, -E, E, -E], rtol=1e-8, atol=1e-12)


def test_image_is_exact():
    rng = np.random.default_rng(0)
    for _ in range(20):
        c = tuple(rng.uniform(-5, 5, 3))
        lo, hi = sorted(rng.uniform(0, 1.5, 2))
        x = np.linspace(lo, hi, 100001)
        p = c[0] * x + c[1] * x**3 + c[2] * x**5
        a, b = PS.image(c, lo, hi)
        # the exact extremes bound the sampled ones and are attained up to grid spacing
        assert a <= p.min() + 1e-12 and b >= p.max() - 1e-12
        assert p.min() - a <= 1e-6 * (1 + abs(a)) and b - p.max() <= 1e-6 * (1 + abs(b))


def test_muon_coefficients_are_torch_optim_muon_defaults():
    require("torch")
    from torch.optim import _muon

    assert PS.MUON_COEFFS == (_muon.DEFAULT_A, _muon.DEFAULT_B, _muon.DEFAULT_C)


def test_polar_express_construction():
    """The greedy construction: the first step is the minimax quintic on [0.02, 1] (the
    cushion) re-centred for [10⁻³, 1] and divided by the safety factor; later steps tend to
    the fixed point (15, −10, 3)/8 of an interval around 1; the exact-arithmetic interval
    after 5 steps is the paper's ~[0.86, 1.13] for ℓ = 10⁻³."""
    co = PS.schedule("polar_express", 10, 1e-3, 0.0, 64).coeffs
    c = PS.minimax_quintic(0.02, 1.0)
    k = 2.0 / (PS._p(c, 1e-3) + PS._p(c, 1.0))
    want = (c[0] * k / 1.01, c[1] * k / 1.01**3, c[2] * k / 1.01**5)
    assert np.allclose(co[0], want, rtol=1e-12)
    assert np.allclose(co[-1], (15 / 8, -10 / 8, 3 / 8), atol=5e-3)
    lo, hi = PS.schedule("polar_express", 5, 1e-3, 0.0, 64).exact
    assert 0.85 < lo < 0.86 and 1.13 < hi < 1.14


def test_certified_upper_bound_is_finite_in_half_precision():
    """Under the rounding model Muon's and Polar Express's bfloat16 bounds diverge (their
    large first-step coefficients amplify rounding past the region where later steps
    contract); the certified design keeps every singular value bounded."""
    u = 2.0**-8
    assert math.isinf(PS.schedule("muon", 5, 1e-3, u, 256).upper)
    assert math.isinf(PS.schedule("polar_express", 5, 1e-3, u, 256).upper)
    cert = PS.schedule("certified", 5, 1e-3, u, 256)
    assert cert.upper < 1.1 and cert.certified_min_sv < 0.1
    # in float64 the model's widening is negligible: the intervals agree with exact ones
    for name in SCHEDULES:
        s = PS.schedule(name, 5, 1e-3, 2.0**-53, 256)
        assert np.allclose(s.interval, s.exact, atol=1e-12)


# -- the iteration ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("shape", [(12, 40), (40, 12), (2, 9, 9)])
def test_fixed_step_singular_values_in_exact_interval(bk, name, shape):
    rng = np.random.default_rng(len(shape) * 7 + shape[-1])
    X, ell = spectrum_matrix(rng, shape, 0.05)
    Q = bk.call(lambda x: hl.polar(x, schedule=name, min_sv=ell), bk.asarray(X))
    info = hl.polar(X, schedule=name, min_sv=ell, return_info=True)[1]  # Python floats
    assert tuple(Q.shape) == shape
    lo, hi = info["interval_exact"]
    s = svals(to_numpy(Q))
    assert np.all(s >= lo - 1e-9) and np.all(s <= hi + 1e-9), (s.min(), s.max(), lo, hi)
    # and X's singular vectors: Q = U p(Σ) Vᵀ, so XᵀQ = V Σ p(Σ) Vᵀ is symmetric and
    # positive semidefinite (p > 0 on the spectrum)
    S = np.swapaxes(X, -1, -2) @ to_numpy(Q)
    scale = np.max(np.abs(S))
    assert np.max(np.abs(S - np.swapaxes(S, -1, -2))) <= 1e-9 * scale
    assert np.min(np.linalg.eigvalsh(0.5 * (S + np.swapaxes(S, -1, -2)))) >= -1e-9 * scale


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fixed_step_half_precision_within_model_interval(bk, name, dtype):
    if not (bk.name.startswith("torch") or bk.name.startswith("jax")):
        pytest.skip("bfloat16/float16 GEMMs: torch and JAX")
    rng = np.random.default_rng(3)
    X, ell = spectrum_matrix(rng, (48, 96), 0.1)
    Xh = bk.xp.astype(bk.asarray(X, np.float32), getattr(bk.xp, dtype))
    Q = bk.call(lambda x: hl.polar(x, schedule=name, min_sv=ell), Xh)
    info = hl.polar(Xh, schedule=name, min_sv=ell, return_info=True)[1]
    assert str(Q.dtype).endswith(dtype)
    s = svals(f64(Q))
    lo, hi = info["interval"]
    assert np.all(s >= lo) and np.all(s <= hi) and np.all(s <= info["upper"])
    if name in ("polar_express", "certified"):
        # what the model certifies also holds by a margin in practice: within 0.3 of 1
        assert np.all(np.abs(s - 1.0) <= 0.3)


def test_fixed_step_muon_matches_torch_optim_muon():
    """schedule="muon" in bfloat16 is torch.optim.Muon's orthogonalisation (the same
    polynomial on the same normalised matrix; ours normalises in float32, torch in
    bfloat16, so the results differ by the rounding of X₀ amplified by 5 steps)."""
    torch = require("torch")
    from torch.optim import _muon

    g = torch.randn(64, 160, generator=torch.Generator().manual_seed(0))
    for G in (g, g.T):
        ref = _muon._zeropower_via_newtonschulz(G, PS.MUON_COEFFS, 5, 1e-7)
        ours = hl.polar(G.bfloat16(), schedule="muon", steps=5)
        d = (ours.float() - ref.float()).norm() / ref.float().norm()
        assert d < 0.05, float(d)
        sv_ref = torch.linalg.svdvals(ref.float())
        sv = torch.linalg.svdvals(ours.float())
        assert abs(float(sv.max() - sv_ref.max())) < 0.05
        assert abs(float(sv.min() - sv_ref.min())) < 0.05


def test_fixed_step_float64_against_numpy_formula(bk_eager):
    """The iteration is X ← aX + (bA + cA²)X on X₀ = X/(s‖X‖_F): a direct NumPy loop."""
    bk = bk_eager
    rng = np.random.default_rng(1)
    X = rng.standard_normal((7, 11))
    for name in SCHEDULES:
        sch = PS.schedule(name, 4, 1e-3, 2.0**-53, 7)
        Y = X / (sch.scale * np.linalg.norm(X))
        for a, b, c in sch.coeffs:
            A = Y @ Y.T
            Y = a * Y + (b * A + c * A @ A) @ Y
        out = to_numpy(hl.polar(bk.asarray(X), schedule=name, steps=4))
        assert np.allclose(out, Y, rtol=1e-12, atol=1e-13)
        outT = to_numpy(hl.polar(bk.asarray(X.T), schedule=name, steps=4))
        assert np.allclose(outT, Y.T, rtol=1e-12, atol=1e-13)


def test_fixed_step_edge_cases_and_errors():
    Z = np.zeros((5, 3))
    assert np.array_equal(hl.polar(Z, schedule="muon"), Z)  # 0 ↦ 0, no NaN
    E = np.zeros((0, 3))
    assert hl.polar(E, schedule="muon").shape == (0, 3)
    X = np.ones((4, 2))
    with pytest.raises(ValueError, match="schedule must be one of"):
        hl.polar(X, schedule="bogus")
    with pytest.raises(ValueError, match="steps must be an integer"):
        hl.polar(X, schedule="muon", steps=0)
    with pytest.raises(ValueError, match="min_sv must be a number in"):
        hl.polar(X, schedule="muon", min_sv=0.0)
    with pytest.raises(ValueError, match="apply to schedule=None"):
        hl.polar(X, schedule="muon", num_iters=3)
    with pytest.raises(ValueError, match="steps applies to the fixed-step mode"):
        hl.polar(X, steps=3)
    with pytest.raises(ValueError, match="X contains NaN"):
        hl.polar(np.full((4, 2), np.nan), schedule="muon")
    _, info = hl.polar(X, schedule="certified", steps=3, return_info=True)
    assert set(info) == {
        "method",
        "schedule",
        "iterations",
        "interval",
        "interval_exact",
        "upper",
        "min_sv",
        "certified_min_sv",
    }
    assert info["iterations"] == 3 and info["method"] == "fixed-step"
