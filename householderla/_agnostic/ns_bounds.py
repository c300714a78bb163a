"""The a priori iteration count of the Newton–Schulz polar iteration.

On an eigenvalue λ of A = s²XᵀX the residual r = 1 − λz² of the coupled iteration obeys
r_{k+1} = φ(r_k) = ¾r_k² + ¼r_k³, so bounds [a, b] ∋ spec(XᵀX) give the worst residual after
k steps before the loop runs. This module has the bounds (Gershgorin ∩ Frobenius, the power
bound ‖E⁸‖_∞^{1/8}, eigenvalues as the last resort), the exact power-of-two and centring
scales, and the plan (scale and count per matrix), on arrays of any namespace and, for one
matrix, in Python floats. The derivation is in ``docs/theory/retractions.rst``.
"""

from __future__ import annotations

import bisect
import functools
import math
from typing import Any

from .._lib.linalg import abs2, eye_like
from .._lib.namespace import device_of, is_complex, real_dtype

__all__ = [
    "LAZY_ITERS",
    "LAZY_RESTART_ITERS",
    "MAX_ITERS",
    "NEVER",
    "centre_scale",
    "count_float",
    "counts",
    "eig_bounds",
    "phi",
    "plan_float",
    "power_bound",
    "power_of_two_scale",
    "scale_cap",
    "spectral_bounds",
    "stage_plan",
]


#: More iterations than this and the eager path falls back to QR + SVD (κ(XᵀX) ≳ 60).
MAX_ITERS = 10
#: Fixed first-pass count when values cannot be inspected (under ``jax.jit``): enough for
#: max|1 − s²λ| ≤ 0.65 after centring in float64 (κ(XᵀX) ≲ 4.8), ≤ 0.8 for float32 input
#: computed in float64 (κ ≲ 9); the a posteriori residual check sends the rest to QR + SVD.
LAZY_ITERS = 6
#: Fixed restart count under ``jax.jit`` (certifies a restart from ‖QᵀQ − I‖ up to ~1e-4).
LAZY_RESTART_ITERS = 2
#: The count of an element that does not converge.
NEVER = float(MAX_ITERS + 1)


def phi(r: Any) -> Any:
    """One Newton–Schulz step on the scalar residual: r ↦ ¾r² + ¼r³."""
    return 0.75 * r * r + 0.25 * r * r * r


def _shifted(A: Any, c0: Any, xp: Any) -> tuple[Any, Any]:
    """(E/m, m) for E = A − c₀I and m = max|E| per matrix (1 where E = 0): norms and powers
    of E/m cannot overflow, whatever c₀."""
    eye = eye_like(xp, A.shape[-1], A.dtype, device_of(A))
    E = A - c0[..., None, None] * eye
    m = xp.max(xp.abs(E), axis=(-2, -1))
    m = xp.where(m > 0, m, xp.ones_like(m))
    return E / m[..., None, None], m


def spectral_bounds(A: Any, c0: Any, xp: Any) -> tuple[Any, Any, Any]:
    """Bounds lo ≤ λ_min(A), hi ≥ λ_max(A) for symmetric (complex: Hermitian) A (..., M, M),
    in O(M²), and a lower bound ρ₋ ≤ ρ(A − c₀I), all real.

    Gershgorin's discs intersected with [c₀ − δ, c₀ + δ], δ = ‖A − c₀I‖_F ≥ ‖A − c₀I‖₂ (c₀ has
    the batch shape; c₀ = 1 for the unscaled XᵀX). The discs lie inside [c₀ − δ∞, c₀ + δ∞],
    δ∞ = ‖A − c₀I‖_∞, so both cheap norms of A − c₀I bound the spectral radius. Conversely
    ρ(E) ≥ max|e_ii| (Rayleigh quotients) and ρ(E) ≥ ‖E‖_F/√M.
    """
    eye = eye_like(xp, A.shape[-1], A.dtype, device_of(A))
    d = xp.sum(A * eye, axis=-1)
    d = xp.real(d) if is_complex(d.dtype) else d  # a Hermitian diagonal is real
    radius = xp.sum(xp.abs(A), axis=-1) - xp.abs(d)
    En, m = _shifted(A, c0, xp)
    fro = xp.sqrt(xp.sum(abs2(En, xp), axis=(-2, -1)))
    delta = m * fro
    lo = xp.maximum(xp.min(d - radius, axis=-1), c0 - delta)
    hi = xp.minimum(xp.max(d + radius, axis=-1), c0 + delta)
    diag = xp.max(xp.abs(xp.sum(En * eye, axis=-1)), axis=-1)
    return lo, hi, m * xp.maximum(diag, fro / math.sqrt(A.shape[-1]))


def power_bound(A: Any, c0: Any, xp: Any) -> Any:
    """b ≥ ρ(A − c₀I) from ρ(E) ≤ ‖E^{2^j}‖_∞^{1/2^j}, j = 1, 2, 3 (three M × M products,
    one Newton–Schulz iteration's worth): for tangent steps at M = 256…1024 the ∞- and
    Frobenius norms of E overestimate ρ(E) 3–7×, ‖E⁸‖_∞^{1/8} by 1.2× (measured)."""
    En, m = _shifted(A, c0, xp)
    bounds = []
    P = En
    for j in range(1, 4):
        P = P @ P
        bounds.append(xp.max(xp.sum(xp.abs(P), axis=-1), axis=-1) ** (0.5**j))
    return m * xp.minimum(xp.minimum(bounds[0], bounds[1]), bounds[2])


@functools.cache
def _thresholds(tol: float) -> tuple[float, ...]:
    """t_j = φ^{-j}(tol), j = 0..MAX_ITERS − 1: φ^j(ρ) ≤ tol ⟺ ρ ≤ t_j (φ increasing on
    [0, 1)), so the count is a vector comparison. φ^{-1} by bisection on [0, 1]."""
    out = [tol]
    for _ in range(MAX_ITERS - 1):
        y, a, b = out[-1], 0.0, 1.0
        for _ in range(80):
            m = 0.5 * (a + b)
            a, b = (m, b) if phi(m) <= y else (a, m)
        out.append(a)
    return tuple(out)


def counts(lo: Any, hi: Any, sq: Any, tol: float, xp: Any) -> Any:
    """Newton–Schulz steps that certify residual ≤ ``tol`` on spec(A) ⊂ [lo, hi] after scaling
    by ``sq`` (= s²), per batch element, as a float array (MAX_ITERS + 1 = never).

    r₀ ∈ [1 − hi·s², 1 − lo·s²]; φ is increasing in |r| on each side of 0, so the worst first
    residual is ρ₁ = max(φ(1 − lo·s²), φ(1 − hi·s²)), valid when −2 < r₀ < 1 (λ·s² ∈ (0, 3));
    then k = 1 + #{j : ρ₁ > φ^{-j}(tol)}.
    """
    p, q = 1.0 - lo * sq, 1.0 - hi * sq
    r0 = xp.maximum(xp.abs(p), xp.abs(q))
    ok = (lo > 0) & (q > -2.0)
    pc, qc = (xp.clip(r, -4.0, 1.0) for r in (p, q))  # no overflow in φ
    r1 = xp.where(ok, xp.maximum(phi(pc), phi(qc)), xp.ones_like(p))
    t = xp.asarray(_thresholds(tol), dtype=p.dtype, device=device_of(p))
    k = 1.0 + xp.sum(xp.astype(r1[..., None] > t, p.dtype), axis=-1)
    k = xp.where(ok, k, xp.full_like(p, NEVER))
    return xp.where(r0 <= tol, xp.zeros_like(p), k)


def centre_scale(lo: Any, hi: Any, xp: Any) -> Any:
    """s with s²·(lo + hi)/2 ≈ 1, rounded to 8 significant bits so that s² is exact (then
    scaling X by s only rounds each entry: no systematic error in the 1/√c of the result)."""
    mid = 0.5 * (xp.clip(lo, 0.0, None) + hi)
    mid = xp.where(mid > 0, mid, xp.ones_like(mid))
    s = 1.0 / xp.sqrt(mid)
    e = xp.floor(xp.log2(s))
    return xp.round(s * 2.0 ** (8.0 - e)) * 2.0 ** (e - 8.0)


def power_of_two_scale(X: Any, xp: Any) -> Any:
    """p = 2^{-e} per matrix, e = ⌊log₂ max|X|⌋ (1 for X = 0; |e| capped so that p² is
    finite): scaling by it is exact, and after it |x_ij| < 2, so XᵀX neither overflows nor
    underflows. Shape (...)."""
    m = xp.max(xp.abs(X), axis=(-2, -1))
    e = xp.floor(xp.log2(xp.where(m > 0, m, xp.ones_like(m))))
    cap = scale_cap(xp, real_dtype(xp, X.dtype))
    return 2.0 ** (-xp.clip(e, -cap, cap))


def scale_cap(xp: Any, dtype: Any) -> float:
    """The largest |e| :func:`power_of_two_scale` applies in ``dtype`` (p² stays finite):
    509 in float64, 61 in float32; larger X is prescaled into it first."""
    return float(math.floor(math.log2(float(xp.finfo(dtype).max)) / 2) - 2)


def stage_plan(xp: Any, lo: Any, hi: Any, p: Any, tol: float) -> tuple[Any, Any]:
    """Per element: the scale s of the prescaled X and the certified count. s = 1/p (X
    itself, "unscaled") unless centring, s²(lo + hi)/2 ≈ 1, saves iterations."""
    su = 1.0 / p
    sc = centre_scale(lo, hi, xp)
    # hi ≥ max diag(A) ≥ 1 (max|pX| ≥ 1), so any s² ≥ 3 certifies nothing: capping it at 4
    # keeps lo·s², hi·s² finite for X at 1e±160 and beyond without changing a count
    ku = counts(lo, hi, xp.clip(su * su, None, 4.0), tol, xp)
    kc = counts(lo, hi, sc * sc, tol, xp)
    unscaled = ku <= kc
    return xp.where(unscaled, su, sc), xp.where(unscaled, ku, kc)


def count_float(lo: float, hi: float, sq: float, tol: float) -> float:
    """:func:`counts` for one matrix, in Python floats."""
    p, q = 1.0 - lo * sq, 1.0 - hi * sq
    if max(abs(p), abs(q)) <= tol:
        return 0.0
    if not (lo > 0 and q > -2.0):
        return NEVER
    r1 = max(phi(min(max(p, -4.0), 1.0)), phi(min(max(q, -4.0), 1.0)))
    return 1.0 + bisect.bisect_left(_thresholds(tol), r1)  # #{j : t_j < r1}, t increasing


def _centre_scale_float(lo: float, hi: float) -> float:
    """:func:`centre_scale` for one matrix, in Python floats (``round`` is half-to-even in
    both)."""
    mid = 0.5 * (max(lo, 0.0) + hi)
    s = 1.0 / math.sqrt(mid if mid > 0 else 1.0)
    e = math.floor(math.log2(s))
    return round(s * 2.0 ** (8.0 - e)) * 2.0 ** (e - 8.0)


def plan_float(lo: float, hi: float, p: float, tol: float) -> tuple[float, float]:
    """:func:`_stage_plan` for one matrix in Python floats: the eager single-matrix call
    (an optimizer step) plans in Python floats, an order of magnitude faster than 0-d array
    operations."""
    su, sc = 1.0 / p, _centre_scale_float(lo, hi)
    ku, kc = count_float(lo, hi, min(su * su, 4.0), tol), count_float(lo, hi, sc * sc, tol)
    return (su, ku) if ku <= kc else (sc, kc)


def eig_bounds(A: Any, lo: Any, hi: Any, xp: Any, eps: float) -> tuple[Any, Any]:
    """Tighten [lo, hi] with the eigenvalues of A (eager path, when the cheap bounds fail)."""
    ev = xp.linalg.eigvalsh(A)
    margin = A.shape[-1] * eps * xp.abs(ev[..., -1])
    return xp.maximum(lo, ev[..., 0] - margin), xp.minimum(hi, ev[..., -1] + margin)
