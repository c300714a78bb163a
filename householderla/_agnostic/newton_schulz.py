"""Polar factor by the coupled Newton–Schulz iteration with an a priori iteration count.

Q = X (XᵀX)^{-1/2} for tall full-rank X (..., N, M). With A = s²XᵀX (s a scale chosen below)
the coupled iteration of Higham (1997, eq. 2.6; Kong, Wang & Tao, ICLR 2023, Algorithm 3)

    Y₀ = A,  Z₀ = I,  T_k = ½(3I − Z_k Y_k),  Y_{k+1} = Y_k T_k,  Z_{k+1} = T_k Z_k

is run in *delta form* (F = Y − I, D = Z − I, S = T − I), so that Q = sX + (sX)D never adds a
rounded identity, and stops after a count k fixed before the loop: on an eigenvalue λ of A
the residual r = 1 − λz² obeys r_{k+1} = φ(r_k) = ¾r_k² + ¼r_k³, so cheap O(M²) bounds
[a, b] ∋ spec(XᵀX) (Gershgorin ∩ [1 − δ, 1 + δ], δ = ‖XᵀX − I‖_F) certify the worst residual
after k steps. The derivation is in ``docs/theory/retractions.rst``. Every function takes
``xp`` explicitly; JAX compiles each stage once per shape (and static count).
"""

from __future__ import annotations

import functools
import math
from typing import Any

from .._lib.checks import check_finite_norms
from .._lib.jit import host, jit_for, kernel_namespace, select
from .._lib.linalg import eye_like
from .._lib.namespace import accumulation_dtype_for, device_of, mT
from .._lib.tracing import is_eager
from .retraction import gram, polar_vjp

#: More iterations than this and the eager path falls back to QR + SVD (κ(XᵀX) ≳ 60).
MAX_ITERS = 10
#: Fixed first-pass count when values cannot be inspected (under ``jax.jit``): enough for
#: max|1 − s²λ| ≤ 0.65 after centring in float64 (κ(XᵀX) ≲ 4.8), ≤ 0.8 for float32 input
#: computed in float64 (κ ≲ 9); the a posteriori residual check sends the rest to QR + SVD.
LAZY_ITERS = 6
#: Fixed restart count under ``jax.jit`` (certifies a restart from ‖QᵀQ − I‖ up to ~1e-4).
LAZY_RESTART_ITERS = 2
_NEVER = float(MAX_ITERS + 1)  # the count of an element that does not converge


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
    """Bounds lo ≤ λ_min(A), hi ≥ λ_max(A) for symmetric A (..., M, M), in O(M²), and a
    lower bound ρ₋ ≤ ρ(A − c₀I).

    Gershgorin's discs intersected with [c₀ − δ, c₀ + δ], δ = ‖A − c₀I‖_F ≥ ‖A − c₀I‖₂ (c₀ has
    the batch shape; c₀ = 1 for the unscaled XᵀX). The discs lie inside [c₀ − δ∞, c₀ + δ∞],
    δ∞ = ‖A − c₀I‖_∞, so both cheap norms of A − c₀I bound the spectral radius. Conversely
    ρ(E) ≥ max|e_ii| (Rayleigh quotients) and ρ(E) ≥ ‖E‖_F/√M.
    """
    eye = eye_like(xp, A.shape[-1], A.dtype, device_of(A))
    d = xp.sum(A * eye, axis=-1)
    radius = xp.sum(xp.abs(A), axis=-1) - xp.abs(d)
    En, m = _shifted(A, c0, xp)
    fro = xp.sqrt(xp.sum(En * En, axis=(-2, -1)))
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
    pc, qc = (xp.minimum(xp.maximum(r, -4.0), 1.0) for r in (p, q))  # no overflow in φ
    r1 = xp.where(ok, xp.maximum(phi(pc), phi(qc)), xp.ones_like(p))
    t = xp.asarray(_thresholds(tol), dtype=p.dtype, device=device_of(p))
    k = 1.0 + xp.sum(xp.astype(r1[..., None] > t, p.dtype), axis=-1)
    k = xp.where(ok, k, xp.full_like(p, _NEVER))
    return xp.where(r0 <= tol, xp.zeros_like(p), k)


def centre_scale(lo: Any, hi: Any, xp: Any) -> Any:
    """s with s²·(lo + hi)/2 ≈ 1, rounded to 8 significant bits so that s² is exact (then
    scaling X by s only rounds each entry: no systematic error in the 1/√c of the result)."""
    mid = 0.5 * (xp.maximum(lo, 0.0) + hi)
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
    cap = float(math.floor(math.log2(float(xp.finfo(X.dtype).max)) / 2) - 2)  # p² finite
    return 2.0 ** (-xp.minimum(xp.maximum(e, -cap), cap))


def _stage_bounds(xp: Any, Xw: Any) -> tuple[Any, Any, Any, Any, Any]:
    """A = Gram of the exactly prescaled p·X, its spectral bounds and ρ₋ (around c₀ = p²)."""
    p = power_of_two_scale(Xw, xp)
    A = gram(Xw * p[..., None, None])
    lo, hi, rho_lower = spectral_bounds(A, p * p, xp)
    return A, p, lo, hi, rho_lower


def _stage_power(xp: Any, A: Any, p: Any, lo: Any, hi: Any) -> tuple[Any, Any]:
    """[lo, hi] ∩ [c₀ − b, c₀ + b] with the power bound b around c₀ = p²."""
    c0 = p * p
    b = power_bound(A, c0, xp)
    return xp.maximum(lo, c0 - b), xp.minimum(hi, c0 + b)


def _stage_plan(xp: Any, lo: Any, hi: Any, p: Any, tol: float) -> tuple[Any, Any]:
    """Per element: the scale s of the prescaled X and the certified count. s = 1/p (X
    itself, "unscaled") unless centring, s²(lo + hi)/2 ≈ 1, saves iterations."""
    su = 1.0 / p
    sc = centre_scale(lo, hi, xp)
    ku = counts(lo, hi, su * su, tol, xp)
    kc = counts(lo, hi, sc * sc, tol, xp)
    unscaled = ku <= kc
    return xp.where(unscaled, su, sc), xp.where(unscaled, ku, kc)


def ns_delta(E: Any, k: int, xp: Any) -> Any:
    """D = Z_k − I of the coupled iteration on Y₀ = I + E (delta form), symmetrised.

    S = −½(D + F + DF), F ← F + S + FS, D ← D + S + SD; 3k − 3 matrix products (k ≥ 1).
    """
    if k == 0:
        return xp.zeros_like(E)
    S = -0.5 * E
    D, F = S, E
    if k > 1:
        F = E + S + E @ S
    for i in range(1, k):
        S = -0.5 * (D + F + D @ F)
        if i < k - 1:
            F = F + S + F @ S
        D = D + S + S @ D
    return 0.5 * (D + mT(D))


def _stage_apply(xp: Any, Xw: Any, A: Any, p: Any, s: Any, k: int) -> tuple[Any, Any]:
    """Q = X' + X'·D, X' = s·p·X, with D from k iterations on s²A (A = Gram of p·X), and the
    a posteriori residual ‖QᵀQ − I‖_F in exact arithmetic: (I + D)A'(I + D) − I =
    F + B + Bᵀ + DB with A' = s²A = I + F, B = A'D (two M × M products; a safety net under
    the a priori count, blind only to the rounding of the final N × M product)."""
    s2 = s[..., None, None]
    Xs = Xw * (s2 * p[..., None, None])
    eye = eye_like(xp, A.shape[-1], A.dtype, device_of(A))
    As = A * (s2 * s2)
    F = As - eye
    D = ns_delta(F, k, xp)
    B = As @ D
    R = F + B + mT(B) + D @ B
    return Xs + Xs @ D, xp.sqrt(xp.sum(R * R, axis=(-2, -1)))


def _stage_restart_bounds(xp: Any, Q: Any, tol: float) -> tuple[Any, Any]:
    A = gram(Q)
    one = xp.ones(A.shape[:-2], dtype=A.dtype, device=device_of(A))
    lo, hi, _ = spectral_bounds(A, one, xp)
    return A, counts(lo, hi, one, tol, xp)


def _stage_restart(xp: Any, Q: Any, A: Any, k: int) -> Any:
    eye = eye_like(xp, A.shape[-1], A.dtype, device_of(A))
    return Q + Q @ ns_delta(A - eye, k, xp)


def polar_qr_svd(Xw: Any, xp: Any) -> tuple[Any, Any]:
    """Fallback: X = QR, R = U Σ Vᵀ, polar(X) = Q (U Vᵀ); orthonormal for every X (full SVD
    bases), the polar factor when X has full rank. Returns (Q U Vᵀ, singular values)."""
    Q, R = xp.linalg.qr(Xw)
    U, sv, Vt = xp.linalg.svd(R, full_matrices=False)
    return Q @ (U @ Vt), sv


def _check_rank(sv: Any, xp: Any, N: int, eps: float) -> None:
    smax = xp.max(sv, axis=-1)
    ratio = host(xp.min(xp.min(sv, axis=-1) / xp.where(smax > 0, smax, xp.ones_like(smax))))
    if not ratio > max(N, sv.shape[-1]) * eps:
        raise ValueError(
            "X is rank deficient (smallest/largest singular value "
            f"{ratio:.1e}): its polar factor is not unique"
        )


def _eig_bounds(A: Any, lo: Any, hi: Any, xp: Any, eps: float) -> tuple[Any, Any]:
    """Tighten [lo, hi] with the eigenvalues of A (eager path, when the cheap bounds fail)."""
    ev = xp.linalg.eigvalsh(A)
    margin = A.shape[-1] * eps * xp.abs(ev[..., -1])
    return xp.maximum(lo, ev[..., 0] - margin), xp.minimum(hi, ev[..., -1] + margin)


def _tolerances(work: Any, out: Any, restart: bool, xp: Any) -> tuple[float, float]:
    """(first-pass tolerance, restart tolerance) on the per-eigenvalue residual."""
    eps_w = float(xp.finfo(work).eps)
    eps_o = float(xp.finfo(out).eps)
    if restart:
        return math.sqrt(eps_w) / 16.0, eps_w
    if eps_w < eps_o:  # float32 result computed in float64: rounding to float32 dominates
        return eps_o / 128.0, eps_w
    return eps_w, eps_w


#: Restart by default when the first pass's correction can exceed 1 (λ_min·s² < 1/4, i.e.
#: κ(XᵀX) ≳ 7 after centring): X' + X'D then carries ‖D‖ times the rounding of X'.
_FAR = 0.25


def polar_impl(
    X: Any, xp: Any, *, num_iters: int | None = None, restart: bool | None = None
) -> tuple[Any, dict[str, Any]]:
    """Polar factor of X (..., N, M), M ≤ N, and an info dict (see :func:`hl.polar`)."""
    xp = kernel_namespace(xp)
    out = X.dtype
    work = accumulation_dtype_for(xp, X)
    eager = is_eager(X)
    Xw = X if work == out else xp.astype(X, work)
    eps_w = float(xp.finfo(work).eps)
    plan = jit_for(xp, _stage_plan, (0, 4))
    A, p, lo, hi, rho_lower = jit_for(xp, _stage_bounds)(xp, Xw)
    strict = _tolerances(work, out, False, xp)[0]
    planned = None  # (s, counts) at the strict tolerance for the current bounds
    if eager and num_iters is None:
        planned = plan(xp, lo, hi, p, strict)
        kmax = host(xp.max(planned[1]))
        c0 = p * p
        if (
            kmax >= 3
            and host(xp.max(plan(xp, c0 - rho_lower, c0 + rho_lower, p, strict)[1])) < kmax
        ):
            # large M: the ∞/Frobenius norms overestimate ρ(XᵀX − I), and even the lower
            # bound ρ₋ would save iterations: pay three M × M products for ‖E⁸‖_∞^{1/8}
            lo, hi = jit_for(xp, _stage_power)(xp, A, p, lo, hi)
            planned = plan(xp, lo, hi, p, strict)
        if host(xp.max(planned[1])) == _NEVER:
            loose = _tolerances(work, out, True, xp)[0]
            if host(xp.max(plan(xp, lo, hi, p, loose)[1])) == _NEVER:
                # λ_min cannot be separated from 0 by the cheap bounds: eigenvalues (O(M³))
                lo, hi = _eig_bounds(A, lo, hi, xp, eps_w)
                planned = None
    if restart is None:
        restart = work == xp.float32
        if eager and not restart and work == out:
            lo_c = xp.maximum(lo, xp.zeros_like(lo)) * centre_scale(lo, hi, xp) ** 2
            restart = host(xp.min(lo_c)) < _FAR
    tol1, tol2 = _tolerances(work, out, restart, xp)
    s, kk = planned if (planned is not None and tol1 == strict) else plan(xp, lo, hi, p, tol1)
    if num_iters is not None:
        k = int(num_iters)
    elif eager:
        k = int(host(xp.max(kk)))
    else:
        k = LAZY_ITERS
    info: dict[str, Any] = {"method": "newton-schulz", "iterations": k, "restart_iterations": 0}

    def fallback() -> Any:
        Q, sv = polar_qr_svd(Xw, xp)
        if eager:
            _check_rank(sv, xp, X.shape[-2], eps_w)
        return Q

    # The count certifies ≤ tol1 per eigenvalue a priori (eager default). The certificate
    # of record is the residual actually reached, checked on the M × M matrices: √M·tol1 plus
    # rounding. Scaling by an upper bound keeps λs² < 3, so a small residual cannot come from
    # the wrong square root.
    certified: Any = False
    if k <= MAX_ITERS:
        Q_ns, resid = jit_for(xp, _stage_apply, (0, 5))(xp, Xw, A, p, s, k)
        check = 2.0 * math.sqrt(X.shape[-1]) * tol1 + 16.0 * X.shape[-1] * eps_w
        certified = host(xp.max(resid)) <= check if eager else xp.all(resid <= check)
    info["certified"] = certified
    if k > MAX_ITERS or (eager and not certified):
        info.update(method="qr-svd", iterations=None)
        Q = fallback()
        restart = False
    else:
        Q = select(xp, eager, certified, lambda: Q_ns, fallback)
    if restart:
        A1, kr = jit_for(xp, _stage_restart_bounds, (0, 2))(xp, Q, tol2)
        k2 = min(int(host(xp.max(kr))), MAX_ITERS) if eager else LAZY_RESTART_ITERS
        info["restart_iterations"] = k2
        if k2 > 0:
            Q = jit_for(xp, _stage_restart, (0, 3))(xp, Q, A1, k2)
    return (Q if Q.dtype == out else xp.astype(Q, out)), info


def polar_forward(X: Any, xp: Any, num_iters: Any, restart: Any) -> tuple[Any, dict[str, Any]]:
    """Validated :func:`polar_impl` (the primal of every autodiff rule of ``polar``): NaN/Inf
    raise on eager input."""
    if is_eager(X) and X.shape[-1] and X.shape[-2]:
        check_finite_norms(xp.max(xp.abs(X), axis=-2, keepdims=True), xp, "X")
    return polar_impl(X, xp, num_iters=num_iters, restart=restart)


def _polar_vjp_kernel(xp: Any, X: Any, G: Any) -> Any:
    return polar_vjp(X, G, xp)[0]


def polar_backward(X: Any, G: Any, xp: Any) -> Any:
    """X̄ of polar at X for the cotangent G, computed in the accumulation dtype (float64 for
    float32 on CPU) and returned in X's dtype; array operations only, so differentiable again.
    The forward already rejected rank-deficient eager X."""
    xp = kernel_namespace(xp)
    work = accumulation_dtype_for(xp, X)
    Xw, Gw = (a if a.dtype == work else xp.astype(a, work) for a in (X, G))
    Xbar = jit_for(xp, _polar_vjp_kernel)(xp, Xw, Gw)
    return Xbar if Xbar.dtype == X.dtype else xp.astype(Xbar, X.dtype)
