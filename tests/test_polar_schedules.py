"""The fixed-step mode of ``hl.polar`` (``schedule=``): the schedules' coefficients, the
certified intervals, and the iteration on every backend.

Oracles: the interval of a schedule is the image of [ℓ/s, 1/s] under its polynomials, so
the singular values of a result computed in float64 from an X whose singular values are
known (X = U diag(σ) Vᵀ, σ/‖X‖_F ∈ [ℓ, 1]) must lie in ``interval_exact`` up to float64
rounding (``interval``, the rounding model's, is within ~1e-12 of it in float64; ± 30·√m·eps,
≳ the ~1e-14 of a few products, ≪ any wrong coefficient's effect); the same for complex X,
whose singular values are real too (30·√m·eps of complex64 for complex64); in half precision
they must lie in ``interval`` and below ``upper``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import require, to_numpy
from helpers import stable_seed
from registry import randn

import householderla as hl
from householderla._agnostic import polar_schedules as PS

pytestmark = pytest.mark.no_dask("polar takes no Dask arrays")

SCHEDULES = ("newton_schulz", "muon", "polar_express", "certified")


def jax_long_unless(keep: bool, why: str) -> tuple:
    """The marks of a case that runs on JAX in `make test` only if ``keep`` (each JAX case
    compiles anew; the other backends run every case): ``jax_long(why)`` otherwise."""
    return () if keep else (pytest.mark.jax_long(why),)


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


def torch_muon() -> tuple:
    """torch and its Muon module (torch.optim.Muon is in recent torch only: the package
    admits older torch, where the comparisons with it are skipped, saying so)."""
    torch = require("torch")
    if not hasattr(torch.optim, "Muon"):
        pytest.skip(f"torch {torch.__version__} has no torch.optim.Muon")
    from torch.optim import _muon

    return torch, _muon


def test_muon_coefficients_are_torch_optim_muon_defaults():
    _, _muon = torch_muon()
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


FIXED_SHAPES = [(12, 40), (40, 12), (2, 9, 9)]
FIXED_CASES = [
    # float64: X of known spectrum (σ/‖X‖_F ∈ [ℓ, 1], min_sv = ℓ) in three shapes
    *(
        pytest.param(
            shape,
            name,
            np.float64,
            id=f"float64-shape{i}-{name}",
            # JAX: each schedule at one shape, each shape at least once
            marks=jax_long_unless(j % 3 == i, "each schedule at one of the shapes on JAX"),
        )
        for i, shape in enumerate(FIXED_SHAPES)
        for j, name in enumerate(SCHEDULES)
    ),
    # complex: a Gaussian 9 × 4 X (min_sv = 1e-3, the default) in complex128 and complex64
    *(
        pytest.param(
            (9, 4),
            name,
            dtype,
            id=f"{np.dtype(dtype).name}-9x4-{name}",
            # JAX: each schedule once, complex128 and complex64 alternating
            marks=jax_long_unless(b == a % 2, "each schedule once on JAX"),
        )
        for a, name in enumerate(SCHEDULES)
        for b, dtype in enumerate([np.complex128, np.complex64])
    ),
]


def herm_t(A):
    """Aᴴ over the last two axes (the plain transpose of a real array)."""
    At = np.swapaxes(A, -1, -2)
    return np.conj(At) if np.iscomplexobj(A) else At


@pytest.mark.parametrize(("shape", "name", "dtype"), FIXED_CASES)
def test_fixed_step_singular_values_in_exact_interval(bk, name, shape, dtype):
    """The schedules act on singular values, real for complex X too (A = XXᴴ): every output
    singular value (from σ ≥ min_sv·‖X‖_F: all of them here) lies in the certified interval
    ``interval`` (the rounding model's, which contains the exact-arithmetic image
    ``interval_exact`` and in float64 exceeds it by ≲ 1e-12) up to 30·√m·eps of the dtype
    (m = min(N, M): the rounding of the result and of its SVD; complex64 iterates in
    complex64, the GEMMs' precision the model is for), far below any wrong coefficient's
    effect (so the former float64 test's interval_exact ± 1e-9 is implied); the result equals
    NumPy's to the same slack. And the singular vectors are X's:
    Q = W p(Σ) Vᴴ, so XᴴQ = V Σ p(Σ) Vᴴ is Hermitian (to 100·slack·‖X‖_F; the former
    float64 bound 1e-9·max|XᴴQ| is looser) and positive semidefinite (to 1e-9·max|XᴴQ|), its
    m largest eigenvalues positive (p > 0 on the spectrum)."""
    if np.dtype(dtype).kind == "c":
        X = randn(np.random.default_rng(stable_seed("fixed", name)), True, *shape)
        ell = 1e-3
    else:
        rng = np.random.default_rng(len(shape) * 7 + shape[-1])
        X, ell = spectrum_matrix(rng, shape, 0.05)
    Xd = X.astype(dtype)
    Q = to_numpy(bk.call(lambda x: hl.polar(x, schedule=name, min_sv=ell), bk.asarray(X, dtype)))
    Qn, info = hl.polar(Xd, schedule=name, min_sv=ell, return_info=True)  # Python floats
    assert Q.dtype == dtype and tuple(Q.shape) == shape
    m = min(shape[-2:])
    slack = 30 * math.sqrt(m) * float(np.finfo(dtype).eps)
    np.testing.assert_allclose(Q, Qn, rtol=0, atol=slack)
    Qw = Q.astype(X.dtype)  # float64 or complex128, as X
    s = np.linalg.svd(Qw, compute_uv=False)
    lo, hi = info["interval"]
    assert np.all(s >= lo - slack) and np.all(s <= hi + slack), (s.min(), s.max(), lo, hi)
    S = herm_t(X) @ Qw
    assert np.max(np.abs(S - herm_t(S))) <= 100 * slack * np.linalg.norm(X)
    ev = np.linalg.eigvalsh(0.5 * (S + herm_t(S)))
    assert np.min(ev) >= -1e-9 * np.max(np.abs(S))
    assert np.min(ev[..., -m:]) > 0


@pytest.mark.parametrize(
    ("dtype", "name"),
    [
        pytest.param(
            dtype,
            name,
            id=f"{dtype}-{name}",
            # JAX: each schedule in one half format, each format for two schedules
            marks=jax_long_unless(i == j % 2, "the other half format of the schedule on JAX"),
        )
        for i, dtype in enumerate(["bfloat16", "float16"])
        for j, name in enumerate(SCHEDULES)
    ],
)
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
    torch, _muon = torch_muon()

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


# -- issue 41: scale invariance and the normalising norm's rounding ---------------------------


def exact_matrix(rng, shape):
    """Entries that are small integers times 2⁻³ (5 significant bits): 2^k·X is exact for
    every k that keeps the smallest nonzero entry ≥ 2⁻¹⁰⁷⁴ and the largest below the range."""
    return rng.integers(-16, 17, shape).astype(np.float64) / 8.0 + 1.0 / 8.0


def scale_exps(bk, dtype):
    """k for 2^k·X over the dtype's whole finite range, subnormals included (not on JAX, whose
    XLA flushes subnormal numbers to zero)."""
    fi = np.finfo(dtype)
    lo = int(np.log2(fi.smallest_subnormal)) + 8  # the 2⁻³ entries stay representable
    if bk.name.startswith("jax"):
        lo = int(np.log2(fi.smallest_normal)) + 4
    hi = int(np.log2(fi.max)) - 6  # max |X| ≤ 2.2
    return sorted({lo, lo + 3, lo + 30, -(hi // 2), -7, 0, 9, hi // 2, hi - 20, hi})


def pow2(X, k):
    """2^k·X by ``ldexp`` (no 2^k that overflows or underflows)."""
    if np.iscomplexobj(X):
        return pow2(X.real, k) + 1j * pow2(X.imag, k)
    return np.ldexp(X, k).astype(X.dtype)


@pytest.mark.parametrize(
    ("dtype", "name"),
    [
        pytest.param(
            dtype,
            name,
            id=f"{dtype.__name__}-{name}",
            # JAX: the schedules in float64, schedule=None (eager vs jit) in every dtype
            marks=jax_long_unless(
                name is None or dtype == np.float64, "the schedules in float64 only on JAX"
            ),
        )
        for dtype in [np.float64, np.float32, np.complex128]
        for name in [*SCHEDULES, None]
    ],
)
def test_polar_of_power_of_two_multiples_is_bit_for_bit_the_same(bk, name, dtype):
    """polar(2^k X, schedule=…) == polar(X) bit for bit over the whole finite range (the
    normalisation scales by an exact power of two before any norm); today float64 gave zeros
    at 1e200 and NaN at 1e-200. schedule=None: the Newton–Schulz polar likewise on eager
    arrays; under jax.jit (a fixed iteration count for every X) to rounding, as the
    guarantees page says of it."""
    rng = np.random.default_rng(41)
    X = exact_matrix(rng, (9, 5))
    if dtype == np.complex128:
        X = X + 1j * exact_matrix(rng, (9, 5))
    real = np.float32 if dtype == np.float32 else np.float64
    ref = to_numpy(bk.call(lambda x: hl.polar(x, schedule=name), bk.asarray(X, dtype)))
    assert np.all(np.isfinite(ref))
    for k in scale_exps(bk, real):
        Xk = pow2(np.asarray(X, dtype), k)
        assert np.array_equal(pow2(Xk, -k), np.asarray(X, dtype))  # 2^k·X is exact
        got = to_numpy(bk.call(lambda x: hl.polar(x, schedule=name), bk.asarray(Xk, dtype)))
        if name is None and not bk.eager:
            tol = 50 * float(np.finfo(real).eps)  # a few roundings of entries of order 1
            np.testing.assert_allclose(got, ref, rtol=0, atol=tol, err_msg=str(k))
            continue
        assert np.array_equal(got, ref), (k, np.max(np.abs(got - ref)))


@pytest.mark.parametrize(
    "dtype",
    [
        # JAX: float16 (on jax_jit), the same exact scaling as bfloat16's (on torch: both)
        pytest.param("bfloat16", marks=pytest.mark.jax_long("float16 is the half format on JAX")),
        "float16",
    ],
)
def test_half_precision_near_the_largest_finite_numbers(bk, dtype):
    """bfloat16 entries ~3e37 (and float16 near 65504): the Newton–Schulz polar crashed in
    ``numpy.linalg.eigvalsh`` (its float32 Gram overflowed); now the answer is polar of the
    same matrix scaled down exactly, for every path."""
    if not (bk.name.startswith("torch") or bk.name.startswith("jax")):
        pytest.skip("bfloat16/float16: torch and JAX")
    rng = np.random.default_rng(5)
    X = rng.uniform(-1.0, 1.0, (8, 6)) + np.eye(8, 6)
    X = 1.9 * X / np.max(np.abs(X))
    top = 2.0**125 if dtype == "bfloat16" else 2.0**15  # max|X| = 1.9 → 8e37 / 62272
    Xh = bk.xp.astype(bk.asarray(X, np.float32), getattr(bk.xp, dtype))
    for name in [None, *SCHEDULES]:
        small = f64(bk.call(lambda x, name=name: hl.polar(x, schedule=name), Xh))
        big = f64(bk.call(lambda x, name=name: hl.polar(x * top, schedule=name), Xh))
        assert np.all(np.isfinite(big)) and np.array_equal(big, small), name


def low_rank_inputs(rng, N, M, cplx, scales=(1.0, 7e5)):
    """Rank 1, rank 2, nearly rank 1 (one singular value and ones 1e-4 / 1e-7 of it), each
    at ``scales``: the inputs whose σ_max/‖X‖_F is 1 (or within 1e-8 of it)."""

    def g(*shape):
        return rng.standard_normal(shape) + (1j * rng.standard_normal(shape) if cplx else 0)

    u, v = g(N, 1), g(1, M)
    out = [u @ v, g(N, 2) @ g(2, M)]
    for t in (1e-4, 1e-7):
        out.append(u @ v + t * np.linalg.norm(u) * np.linalg.norm(v) * g(N, M) / np.sqrt(N * M))
    return [X * s for X in out for s in scales]


@pytest.mark.parametrize("dtype", ["float32", "complex64", "bfloat16"])
def test_certified_upper_holds_for_nearly_rank_one_inputs(bk, dtype):
    """Every output singular value is ≤ the reported ``upper``, and those from σ ≥ min_sv‖X‖_F
    lie in ``interval`` (computed in float64 of the output). Today torch's float32 Frobenius
    norm came out low by ~6e-7, X₀ had σ = 1 + 6e-7 > 1 + u, and the certified steps (slope
    ~3e4 there) took it past ``upper``."""
    if dtype == "bfloat16" and not (bk.name.startswith("torch") or bk.name.startswith("jax")):
        pytest.skip("bfloat16: torch and JAX")
    rng = np.random.default_rng(7)
    worst = 0.0
    for N, M in [(139, 291)]:  # torch's float32 norm of the rank-1 matrix: low by 6e-7
        for X in low_rank_inputs(rng, N, M, dtype == "complex64"):
            if dtype == "bfloat16":
                Xb = bk.xp.astype(bk.asarray(X, np.float32), bk.xp.bfloat16)
            else:
                Xb = bk.asarray(X, np.complex64 if dtype == "complex64" else np.float32)
            if bk.eager:
                Q, info = hl.polar(Xb, schedule="certified", return_info=True)
            else:
                Q = bk.call(lambda x: hl.polar(x, schedule="certified"), Xb)
                info = hl.polar(Xb, schedule="certified", return_info=True)[1]
            wide = (lambda a: to_numpy(a).astype(np.complex128)) if dtype == "complex64" else f64
            s = np.linalg.svd(wide(Q), compute_uv=False)
            x_sv = np.linalg.svd(wide(Xb), compute_uv=False)
            lo, hi = info["interval"]
            big = x_sv >= info["min_sv"] * np.sqrt(np.sum(x_sv**2))
            assert s.max() <= info["upper"], (N, M, s.max(), info["upper"])
            assert np.all(s[big] >= lo) and np.all(s[big] <= hi), (s[big], lo, hi)
            worst = max(worst, s.max() / info["upper"])
    assert worst > 0.5  # the outputs are not trivially small


def test_norm_slack_covers_any_summation_order():
    """The divisor fl(s(1 + κ)‖X‖ˆ) ≥ s‖X‖_F for the worst reduction order: sums of squares
    in float32, one order rounding every addition down (the computed norm as low as it can
    get, by the bound norm_slack states), still leave ‖X₀‖_F ≤ 1."""
    rng = np.random.default_rng(0)
    u = 2.0**-24
    for m, n in [(1, 64), (16, 300), (64, 64)]:
        x = rng.standard_normal((m, n)).astype(np.float32)
        exact = math.sqrt(float(np.sum(x.astype(np.float64) ** 2)))
        acc = np.float32(0.0)
        for row in x:  # sequential float32 sums, each rounded toward zero
            r = np.float32(0.0)
            for v in row:
                r = np.nextafter(np.float32(r + v * v), np.float32(0))
            acc = np.nextafter(np.float32(acc + r), np.float32(0))
        low = float(np.nextafter(np.sqrt(acc), np.float32(0)))
        assert low < exact
        assert low * (1.0 + PS.norm_slack(m, n, u)) * (1 - u) ** 2 >= exact


def test_muon_float32_update_within_the_certificate():
    """hl.torch.Muon(ns_dtype=torch.float32) with the certified schedule: the update of a
    rank-1 (and nearly rank-1) gradient has σ ≤ the certificate's ``upper``."""
    torch = require("torch")
    rng = np.random.default_rng(11)
    N, M = 139, 291
    sch = PS.schedule("certified", 5, 1e-3, 2.0**-24, N)
    for G in low_rank_inputs(rng, N, M, False, scales=(1.0,)):
        p = torch.nn.Parameter(torch.zeros(N, M))
        opt = hl.torch.Muon([p], lr=1.0, weight_decay=0.0, momentum=0.0, nesterov=False,
                            ns_dtype=torch.float32, schedule="certified")  # fmt: skip
        p.grad = torch.as_tensor(G, dtype=torch.float32)
        opt.step()
        s = svals(-p.detach().double().numpy() / math.sqrt(max(1.0, N / M)))
        assert s.max() <= sch.upper, s.max()
