"""Fixed-step polar factors for update directions: odd-polynomial schedules and the interval
their singular values land in.

A schedule applies odd quintics p_k(x) = a_k x + b_k x³ + c_k x⁵ to X₀ = X / (s‖X‖_F) through
the smaller Gram matrix; on singular values it is the scalar map σ ↦ p_k(σ), so the output
interval is the exact image of [ℓ/s, 1/s]. Schedules: ``"newton_schulz"`` (Higham 2008,
eq. 8.20), ``"muon"`` (Jordan et al.), ``"polar_express"`` (Amsel, Persson, Musco & Gower,
ICLR 2026) and ``"certified"`` (ours: greedy minimax steps that widen each interval by a
rounding model first). Certificates ``exact``, ``interval``, ``upper``, ``certified_min_sv``
(``docs/theory/lowprec.rst``). Schedules are Python floats; :func:`fixed_polar` runs over ``xp``.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

from .._lib.linalg import abs2, pow2_normalise
from .._lib.mixed import addmm
from .._lib.namespace import accumulation_dtype_for, is_complex, mH, real_dtype

__all__ = [
    "MUON_COEFFS",
    "SCHEDULES",
    "Schedule",
    "divisor_slack",
    "fixed_polar",
    "image",
    "minimax_quintic",
    "norm_slack",
    "rounding_gamma",
    "schedule",
    "schedule_of",
    "work_dtype",
]

#: Muon's quintic (Jordan et al., Muon, 2024; ``torch.optim.Muon``'s default).
MUON_COEFFS = (3.4445, -4.7750, 2.0315)
#: The classical Newton–Schulz cubic (3x − x³)/2 as (a, b, c).
CUBIC_COEFFS = (1.5, -0.5, 0.0)
SCHEDULES = ("newton_schulz", "muon", "polar_express", "certified")
#: Polar Express's constants: initial lower bound, cushion, safety factor.
PE_L0, PE_CUSHION, PE_SAFETY = 1e-3, 0.02, 1.01
#: Cushion of the certified design: smaller first-step coefficients (|a| + |b| + |c| = 39 in
#: bfloat16 against Polar Express's 48), hence less rounding where it is amplified most.
CERT_CUSHION = 0.1


def rounding_gamma(m: int) -> float:
    """γ of the rounding model of one step on an M × N matrix (M ≤ N) in unit roundoff u:
    ‖fl(p(X)) − p(X)‖₂ ≤ γ·u·(|a|h + |b|h³ + |c|h⁵) for ‖X‖₂ ≤ h. γ = 1 + log₂(M)/10: about
    twice the largest ratio measured in bfloat16 and float16 (0.73 / 0.84 / 1.04 at
    M = 64 / 256 / 1024, random, log-spaced and low-rank spectra; ``benchmarks/lowprec.py``
    re-measures it). A model, not a proof: the worst case grows like √M."""
    return 1.0 + math.log2(max(m, 1)) / 10.0


class Schedule(NamedTuple):
    """A fixed-step schedule: ``coeffs`` [(a, b, c), ...], the normalisation ``scale`` s
    (X₀ = X/(s‖X‖_F)), and the certificate: ``interval`` (lo, hi) ∋ every output singular
    value from σ(X) ≥ ``min_sv``·‖X‖_F under the rounding model (:func:`rounding_gamma`),
    ``exact`` the same in exact arithmetic, ``upper`` ≥ every output singular value (rounding
    model; ``inf`` where the model cannot bound them), ``certified_min_sv`` the smallest ℓ
    whose model interval starts at ½ or above (None if there is none)."""

    name: str
    coeffs: tuple[tuple[float, float, float], ...]
    scale: float
    min_sv: float
    interval: tuple[float, float]
    exact: tuple[float, float]
    upper: float
    certified_min_sv: float | None


def _p(c: tuple[float, float, float], x: float) -> float:
    a, b, cc = c
    x2 = x * x
    return x * (a + x2 * (b + cc * x2))


def _critical_points(c: tuple[float, float, float]) -> list[float]:
    """The positive x with p'(x) = a + 3b x² + 5c x⁴ = 0."""
    a, b, cc = c
    if cc == 0.0:
        roots = [-a / (3.0 * b)] if b != 0.0 else []
    else:
        disc = 9.0 * b * b - 20.0 * a * cc
        if disc < 0.0:
            return []
        r = math.sqrt(disc)
        roots = [(-3.0 * b - r) / (10.0 * cc), (-3.0 * b + r) / (10.0 * cc)]
    return [math.sqrt(t) for t in roots if t > 0.0]


#: Past this the model's interval is reported as unbounded (p grows like x⁵).
_DIVERGED = 1e3


def image(c: tuple[float, float, float], lo: float, hi: float) -> tuple[float, float]:
    """p([lo, hi]) for 0 ≤ lo ≤ hi, exactly: p at the endpoints and the critical points."""
    if hi >= _DIVERGED:
        return -math.inf, math.inf
    xs = [lo, hi] + [x for x in _critical_points(c) if lo < x < hi]
    vals = [_p(c, x) for x in xs]
    return min(vals), max(vals)


def _step_bound(c: tuple[float, float, float], h: float) -> float:
    """|a|h + |b|h³ + |c|h⁵: the size of the terms one step adds (rounding model)."""
    a, b, cc = c
    return abs(a) * h + abs(b) * h**3 + abs(cc) * h**5


@functools.cache
def minimax_quintic(lo: float, hi: float) -> tuple[float, float, float]:
    """The odd quintic p minimising max_{x∈[lo, hi]} |1 − p(x)| (0 < lo < hi).

    Chebyshev's alternation theorem for the 3-dimensional space span{x, x³, x⁵} (a Haar
    space on (0, ∞)): the best p equioscillates at 4 points lo < q < r < hi, 1 − p = ±E
    with alternating signs, q and r the interior extrema of p. Remez exchange: solve the
    4 × 4 linear system for (a, b, c, E) at the current points, move q, r to the critical
    points of the new p, repeat. Scale-invariant: solved on [lo/hi, 1] and rescaled.
    """
    ell = lo / hi
    if ell >= 1.0 - 5e-6:  # the interval is a point: the limit is (15, −10, 3)/8 of x/hi
        return (15 / 8) / hi, (-10 / 8) / hi**3, (3 / 8) / hi**5
    q, r = (3 * ell + 1) / 4, (ell + 3) / 4
    E_old = math.inf
    for _ in range(100):
        rows = [(x, x**3, x**5, s) for x, s in ((ell, 1.0), (q, -1.0), (r, 1.0), (1.0, -1.0))]
        a, b, c, E = _solve4(rows, [1.0, 1.0, 1.0, 1.0])
        crit = _critical_points((a, b, c))
        if len(crit) == 2:
            q, r = crit
        if abs(E - E_old) <= 1e-15:
            break
        E_old = E
    return a / hi, b / hi**3, c / hi**5


def _solve4(rows: list[tuple[float, ...]], rhs: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (a 4 × 4 system in Python floats)."""
    m = [list(r) + [v] for r, v in zip(rows, rhs, strict=True)]
    n = len(m)
    for i in range(n):
        piv = max(range(i, n), key=lambda k: abs(m[k][i]))
        m[i], m[piv] = m[piv], m[i]
        for k in range(i + 1, n):
            f = m[k][i] / m[i][i]
            m[k] = [x - f * y for x, y in zip(m[k], m[i], strict=True)]
    out = [0.0] * n
    for i in reversed(range(n)):
        out[i] = (m[i][n] - sum(m[i][j] * out[j] for j in range(i + 1, n))) / m[i][i]
    return out


def _greedy_step(lo: float, hi: float, cushion: float) -> tuple[float, float, float]:
    """Polar Express's step: the minimax quintic on [max(lo, cushion·hi), hi], scaled so
    that p(lo) and p(hi) straddle 1 symmetrically when the cushion was used."""
    c = minimax_quintic(max(lo, cushion * hi), hi)
    if cushion * hi > lo:
        k = 2.0 / (_p(c, lo) + _p(c, hi))
        c = (c[0] * k, c[1] * k, c[2] * k)
    return c


def _polar_express(steps: int) -> list[tuple[float, float, float]]:
    """The Polar Express coefficients for ℓ₀ = 10⁻³, cushion 0.02, safety 1.01; past the
    designed steps the last polynomial repeats."""
    lo, hi, out = PE_L0, 1.0, []
    for k in range(steps):
        c = _greedy_step(lo, hi, PE_CUSHION)
        if k < steps - 1:
            s = PE_SAFETY
            c = (c[0] / s, c[1] / s**3, c[2] / s**5)
        out.append(c)
        lo = _p(c, lo)
        hi = 2.0 - lo
        lo = min(lo, hi)
    return out


def _propagate(
    coeffs: list[tuple[float, float, float]], lo: float, top: float, u: float, gamma: float
) -> tuple[float, float, float]:
    """(lo, hi, upper) after the steps: the images of [lo, top] and [0, top], each widened
    by the rounding model δ = γu(|a|h + |b|h³ + |c|h⁵), h the bound before the step (Weyl:
    a perturbation E moves every singular value by at most ‖E‖₂)."""
    hi = top
    for c in coeffs:
        d = gamma * u * _step_bound(c, top)
        lo, hi = image(c, lo, hi)
        top = image(c, 0.0, top)[1]
        if not math.isfinite(top):
            return max(lo, 0.0), math.inf, math.inf
        lo, hi, top = max(lo - d, 0.0), hi + d, top + d
    return lo, hi, max(top, hi)


def _certified(steps: int, ell: float, u: float, gamma: float) -> list[tuple[float, ...]]:
    """Greedy minimax steps from [ℓ, 1 + u] whose upper ends carry the rounding model."""
    lo, top = ell, 1.0 + u  # X₀ = fl(X/‖X‖_F): ‖fl(X₀) − X₀‖₂ ≤ u‖X₀‖_F = u
    hi, out = top, []
    for _ in range(steps):
        c = _greedy_step(lo, hi, CERT_CUSHION)
        out.append(c)
        d = gamma * u * _step_bound(c, top)
        lo, hi = image(c, lo, hi)
        top = image(c, 0.0, top)[1] + d
        hi = max(hi + d, top)
    return out


def _lower_threshold(
    coeffs: list, s: float, u: float, gamma: float, margin: float = 0.0
) -> float | None:
    """The smallest ℓ ∈ [10⁻⁶, 1] whose model interval starts at ½ or above (bisection on
    log ℓ; the lower end is nondecreasing in ℓ on that range for these schedules), None if
    even ℓ = 1 does not."""

    def ok(ell: float) -> bool:
        start = (ell * (1.0 - u) / (1.0 + margin) - u) / s
        return _propagate(coeffs, start, (1.0 + u) / s, u, gamma)[0] >= 0.5

    if not ok(1.0):
        return None
    a, b = math.log(1e-6), 0.0
    if ok(math.exp(a)):
        return 1e-6
    for _ in range(30):
        mid = 0.5 * (a + b)
        a, b = (a, mid) if ok(math.exp(mid)) else (mid, b)
    return math.exp(b)


@functools.cache
def schedule(
    name: str, steps: int, min_sv: float, u: float, m: int, margin: float = 0.0
) -> Schedule:
    """The schedule ``name`` for ``steps`` iterations in a precision of unit roundoff ``u``
    on M × N matrices (M = ``m`` ≤ N), with its certificate for σ(X) ≥ ``min_sv``·‖X‖_F:
    the interval propagated through the polynomials, in exact arithmetic and under the
    rounding model (the normalisation rounds X₀ by at most u·‖X₀‖_F = u/s; ``margin``:
    X₀'s divisor is at most (1 + margin)·s‖X‖_F, :func:`norm_slack`)."""
    gamma = rounding_gamma(m)
    if name == "newton_schulz":
        coeffs, s = [CUBIC_COEFFS] * steps, 1.0
    elif name == "muon":
        coeffs, s = [MUON_COEFFS] * steps, 1.0
    elif name == "polar_express":
        base = _polar_express(10)
        coeffs = (base + [base[-1]] * steps)[:steps]
        s = PE_SAFETY
    elif name == "certified":
        # designed for σ ≥ max(ℓ, u)·‖X‖_F: below u a singular value is at the level of the
        # rounding of X₀ itself, and designing for it only inflates coefficients and rounding
        coeffs, s = _certified(steps, max(min_sv, u), u, gamma), 1.0
    else:  # pragma: no cover - the public function validated the name
        raise ValueError(name)
    return schedule_of(name, tuple(coeffs), s, min_sv, u, m, margin)


@functools.cache
def schedule_of(
    name: str, coeffs: tuple[tuple[float, float, float], ...], s: float, min_sv: float,
    u: float, m: int, margin: float = 0.0,
) -> Schedule:  # fmt: skip
    """A :class:`Schedule` of given coefficients and scale, with its certificate (``margin``
    as in :func:`schedule`: it lowers the start of the interval, never its upper end)."""
    gamma = rounding_gamma(m)
    e_lo, e_hi, _ = _propagate(list(coeffs), min_sv / s, 1.0 / s, 0.0, gamma)
    start = (min_sv * (1.0 - u) / (1.0 + margin) - u) / s
    lo, hi, top = _propagate(list(coeffs), start, (1.0 + u) / s, u, gamma)
    ell = _lower_threshold(list(coeffs), s, u, gamma, margin)
    return Schedule(name, tuple(coeffs), s, min_sv, (lo, hi), (e_lo, e_hi), top, ell)


def work_dtype(xp: Any, dtype: Any) -> Any:
    """The dtype of X₀ = X/(s‖X‖_F): X's for complex and float64 X, else float32."""
    if is_complex(dtype) or dtype == xp.float64:
        return dtype
    return xp.float32


def norm_slack(m: int, n: int, u: float) -> float:
    """κ such that κ ≥ 2μ + 4u, μ the relative error bound of the Frobenius norm of an m × n
    matrix (n counted twice for complex entries, |x|² = Re² + Im²) computed in unit roundoff
    u as the square root of a sum of row sums of squares, in any summation order: each of
    the m·n squares reaches the total through at most n + m − 1 rounded additions and one
    rounded product, so the sum is Σx²(1 + θ), |θ| ≤ γ_{n+m} = (n + m)u/(1 − (n + m)u)
    (Higham 2002, *Accuracy and Stability of Numerical Algorithms*, SIAM, Lemma 3.1 and
    §4.2), and the rounded square root adds u: μ = γ_{n+m+2} + u bounds |‖X‖ˆ − ‖X‖|/‖X‖.
    Dividing by fl(s(1 + κ)·‖X‖ˆ) ≥ s‖X‖_F then holds for every backend's reduction order,
    and the divisor is at most s(1 + 2κ)‖X‖_F (the certificate's ``margin`` = 2κ)."""
    k = n + m + 2
    if k * u >= 0.25:  # pragma: no cover - 2²² × 2²² float32 entries and beyond
        return 1.0
    mu = k * u / (1.0 - k * u) + u
    return 2.0 * mu + 4.0 * u


def divisor_slack(xp: Any, X: Any) -> float:
    """κ of :func:`fixed_polar` for X (..., M, N) (either orientation): :func:`norm_slack` in
    the precision the norm is summed in (the accumulation dtype: float64 for float32 and
    complex64 X on CPU backends, float32 for half X and on accelerators), plus 2u of the
    working dtype for the divisor's rounding into it."""
    u_n = float(xp.finfo(real_dtype(xp, accumulation_dtype_for(xp, X))).eps) / 2
    u_w = float(xp.finfo(real_dtype(xp, work_dtype(xp, X.dtype))).eps) / 2
    rows, cols = sorted(X.shape[-2:])
    return norm_slack(rows, cols * (2 if is_complex(X.dtype) else 1), u_n) + 2.0 * u_w


def fixed_polar(X: Any, xp: Any, sched: Schedule, eps: float = 0.0) -> Any:
    """The iteration of ``sched`` on wide X (..., M, N), M ≤ N, in X's dtype (GEMMs in the
    input precision, as Muon runs them), from X₀ = X/(s(1 + κ)·‖X‖_F) (κ of
    :func:`divisor_slack`: the computed norm's rounding, so ‖X₀‖₂ ≤ 1/s for every X); the norm
    of the exactly prescaled 2^{-e}X (:func:`~householderla._lib.linalg.pow2_normalise`),
    so X₀ is the same for every power-of-two multiple of X and exists for every finite X,
    subnormal included; ‖X‖_F clamped below at ``eps`` (Muon's). X = 0 gives 0. Complex X:
    A = XXᴴ, the same map on the singular values."""
    if math.prod(X.shape) == 0:
        return X
    work = work_dtype(xp, X.dtype)
    Xw = X if X.dtype == work else xp.astype(X, work)
    Xs, e = pow2_normalise(Xw, xp)
    acc = accumulation_dtype_for(xp, X)  # float32 for half X, as divisor_slack says
    Xa = Xs if Xs.dtype == acc else xp.astype(Xs, acc)
    # row sums, then their sum: the error bound of norm_slack, whatever the backend's order
    nrm = xp.sqrt(xp.sum(xp.sum(abs2(Xa, xp), axis=-1, keepdims=True), axis=-2, keepdims=True))
    # eps in the units of 2^{-e}X (inf past the range: then X₀ = X/eps is 0 to rounding);
    # a nonzero 2^{-e}X has ‖·‖_F ≥ 1, so the floor 1 only turns X = 0 into 0 (not 0/0)
    h = xp.floor(0.5 * e)
    floor = xp.clip((eps * 2.0 ** (-h)) * 2.0 ** (h - e), min=1.0)
    floor = floor if floor.dtype == nrm.dtype else xp.astype(floor, nrm.dtype)
    d = (sched.scale * (1.0 + divisor_slack(xp, X))) * xp.maximum(nrm, floor)
    wr = real_dtype(xp, work)
    X0 = Xs / (d if d.dtype == wr else xp.astype(d, wr))
    X = X0 if X0.dtype == X.dtype else xp.astype(X0, X.dtype)
    for a, b, c in sched.coeffs:
        A = X @ mH(X, xp)
        B = addmm(xp, A, A, A, b, c) if c != 0.0 else b * A
        X = addmm(xp, X, B, X, a, 1.0)
    return X
