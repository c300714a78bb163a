"""Polar factor by the coupled Newton–Schulz iteration with an a priori iteration count.

Q = X (XᵀX)^{-1/2} for tall full-rank X. With A = s²XᵀX the coupled iteration (Higham 1997,
eq. 2.6; Kong, Wang & Tao, ICLR 2023, Algorithm 3) runs in delta form (F = Y − I, D = Z − I)
so Q = sX + (sX)D never adds a rounded identity. On an eigenvalue of A the residual obeys
r_{k+1} = ¾r_k² + ¼r_k³, so O(M²) spectral bounds fix the count k before the loop
(``docs/theory/retractions.rst``). Every function takes ``xp``; JAX compiles each stage once.
"""

from __future__ import annotations

import math
from typing import Any

import array_api_compat as aac
import numpy as np

from .._lib.checks import RankDeficientError, check_finite_columns
from .._lib.jit import host, jit_for, kernel_namespace, select
from .._lib.linalg import eye_like, max_abs_parts, pow2_normalise, pow2_scale
from .._lib.mixed import has_wide_matmul, matmul_acc, matmul_split
from .._lib.namespace import accumulation_dtype_for, device_of, is_half, mH, mT, real_dtype
from .._lib.rows import LOCAL, Rows, block_max, row_gram, row_sum
from .._lib.tracing import is_eager
from .._lib.tuning import EIG_BOUNDS_MAX_M
from .ns_bounds import (
    LAZY_ITERS,
    LAZY_RESTART_ITERS,
    MAX_ITERS,
    NEVER,
    centre_scale,
    count_float,
    counts,
    eig_bounds,
    phi,
    plan_float,
    power_bound,
    power_of_two_scale,
    scale_cap,
    spectral_bounds,
    stage_plan,
)
from .retraction import gram, polar_vjp, sq_norm

__all__ = [
    "LAZY_ITERS",
    "MAX_ITERS",
    "counts",
    "ns_delta",
    "phi",
    "polar_backward",
    "polar_forward",
    "polar_impl",
    "polar_maxima",
    "polar_qr_svd",
]


def _scale(xp: Any, Xw: Any, cm: Any = None) -> Any:
    """p of :func:`power_of_two_scale` in the (real) accumulation dtype, from max|X| per
    column (``cm``, when given: a row-sharded X's, reduced over its blocks)."""
    work = real_dtype(xp, accumulation_dtype_for(xp, Xw))
    m = xp.max(xp.abs(Xw), axis=-2, keepdims=True) if cm is None else cm
    return power_of_two_scale(m if m.dtype == work else xp.astype(m, work), xp)


def _narrow(xp: Any, dtype: Any) -> bool:
    """float16: too narrow a range to hold p·X for every p (p is applied in float32)."""
    return float(xp.finfo(dtype).max) < 1e6


def scaled_gram(xp: Any, Xw: Any, p: Any, rows: Rows = LOCAL) -> Any:
    """Gram (p·X)ᴴ(p·X) in the accumulation dtype (p of shape (...), a power of two), summed
    over the row blocks of a row-sharded X. Half X (bfloat16/float16, on a backend with
    native wide products): half-precision GEMMs with a float32 result
    (:func:`~householderla._lib.mixed.matmul_acc`); p multiplies X exactly in bfloat16, the
    float32 Gram for float16."""
    if not is_half(xp, Xw.dtype):
        if rows.sharded:
            return row_gram(rows, Xw * p[..., None, None], xp)
        return gram(Xw * p[..., None, None], xp)
    if _narrow(xp, Xw.dtype):
        A = matmul_acc(xp, mT(Xw), Xw, p.dtype) * (p * p)[..., None, None]
    else:
        Xh = Xw * xp.astype(p, Xw.dtype)[..., None, None]
        A = matmul_acc(xp, mT(Xh), Xh, p.dtype)
    A = row_sum(rows, A)
    return 0.5 * (A + mT(A))


def scaled_apply(xp: Any, Xw: Any, p: Any, s: Any, D: Any) -> Any:
    """Q = X' + X'D with X' = s·p·X, in D's dtype (the accumulation dtype); for half X the
    N × M product is :func:`~householderla._lib.mixed.matmul_split` (D not rounded)."""
    if Xw.dtype == D.dtype:
        Xs = Xw * (s * p)[..., None, None]
        return Xs + Xs @ D
    if _narrow(xp, Xw.dtype):
        Xh, c = Xw, s * p
    else:
        Xh, c = Xw * xp.astype(p, Xw.dtype)[..., None, None], s
    return c[..., None, None] * (xp.astype(Xh, D.dtype) + matmul_split(xp, Xh, D))


def _stage_gram(xp: Any, Xw: Any, rows: Rows = LOCAL, cm: Any = None) -> tuple[Any, Any]:
    """A = Gram of the exactly prescaled p·X, and p."""
    p = _scale(xp, Xw, cm)
    return scaled_gram(xp, Xw, p, rows), p


def _stage_bounds(
    xp: Any, Xw: Any, rows: Rows = LOCAL, cm: Any = None
) -> tuple[Any, Any, Any, Any, Any]:
    """A = Gram of the exactly prescaled p·X, its spectral bounds and ρ₋ (around c₀ = p²)."""
    A, p = _stage_gram(xp, Xw, rows, cm)
    lo, hi, rho_lower = spectral_bounds(A, p * p, xp)
    return A, p, lo, hi, rho_lower


def _stage_power(xp: Any, A: Any, p: Any, lo: Any, hi: Any) -> tuple[Any, Any]:
    """[lo, hi] ∩ [c₀ − b, c₀ + b] with the power bound b around c₀ = p²."""
    c0 = p * p
    b = power_bound(A, c0, xp)
    return xp.maximum(lo, c0 - b), xp.minimum(hi, c0 + b)


def ns_delta(E: Any, k: int, xp: Any) -> Any:
    """D = Z_k − I of the coupled iteration on Y₀ = I + E (delta form), symmetrised (Hermitian
    for complex E: every iterate is a polynomial in E).

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
    return 0.5 * (D + mH(D, xp))


def _stage_delta(xp: Any, A: Any, s: Any, k: int) -> tuple[Any, Any]:
    """D from k iterations on s²A (A = Gram of p·X), and the a posteriori residual
    ‖QᴴQ − I‖_F of Q = X' + X'D in exact arithmetic: (I + D)A'(I + D) − I = F + B + Bᴴ + DB
    with A' = s²A = I + F, B = A'D (two M × M products; a safety net under the a priori
    count, blind only to the rounding of the final N × M product). M × M work only."""
    s2 = s[..., None, None]
    eye = eye_like(xp, A.shape[-1], A.dtype, device_of(A))
    As = A * (s2 * s2)
    F = As - eye
    D = ns_delta(F, k, xp)
    B = As @ D
    R = F + B + mH(B, xp) + D @ B
    return D, xp.sqrt(sq_norm(R, xp))


def _stage_apply(xp: Any, Xw: Any, A: Any, p: Any, s: Any, k: int) -> tuple[Any, Any]:
    """Q = X' + X'·D, X' = s·p·X (:func:`_stage_delta`), and the residual."""
    D, resid = _stage_delta(xp, A, s, k)
    return scaled_apply(xp, Xw, p, s, D), resid


def _stage_restart_bounds(xp: Any, Q: Any, tol: float, rows: Rows = LOCAL) -> tuple[Any, Any]:
    A = row_gram(rows, Q, xp) if rows.sharded else gram(Q, xp)
    one = xp.ones(A.shape[:-2], dtype=real_dtype(xp, A.dtype), device=device_of(A))
    lo, hi, _ = spectral_bounds(A, one, xp)
    return A, counts(lo, hi, one, tol, xp)


class _Split:
    """Where the work of one ``polar`` call runs: the N × M products on the arrays' device,
    the M × M and batch-shaped work (spectral bounds, the plan, the Newton–Schulz iteration
    on the Gram matrix, the residual check) in ``small``.

    On eager torch tensors ``small`` is NumPy on the host: the M × M work is some 60
    operations on tiny arrays, several times cheaper in NumPy than as torch kernels (a step of the
    Stiefel optimizers at N = 200, M = 10 spent most of its time there); the device then
    runs two N × M × M products and syncs once for the (already host-side) count. Elsewhere
    ``small`` is the arrays' namespace and each stage is compiled once per shape on JAX.
    """

    def __init__(self, xp: Any, eager: bool) -> None:
        self.xp = xp
        self.host = eager and aac.is_torch_namespace(xp)
        self.small = np if self.host else xp

    def jit(self, fn: Any, static: tuple[int, ...] = (0,)) -> Any:
        return fn if self.host else jit_for(self.xp, fn, static)

    def down(self, a: Any) -> Any:
        """A device array as a ``small`` array."""
        return a.detach().cpu().numpy() if self.host else a

    def up(self, a: Any, like: Any) -> Any:
        """A ``small`` array on the device of ``like``."""
        return self.xp.asarray(a, dtype=like.dtype, device=device_of(like)) if self.host else a

    def max(self, a: Any) -> float:
        return float(np.max(a)) if self.host else host(self.xp.max(a))

    def min(self, a: Any) -> float:
        return float(np.min(a)) if self.host else host(self.xp.min(a))


def _plan_one(ms: Any, lo: Any, hi: Any, p: Any, tol: float) -> tuple[Any, float]:
    s, k = plan_float(float(lo), float(hi), float(p), tol)
    return np.asarray(s, dtype=np.asarray(p).dtype), k


def _stage_restart(xp: Any, Q: Any, A: Any, k: int) -> Any:
    eye = eye_like(xp, A.shape[-1], A.dtype, device_of(A))
    return Q + Q @ ns_delta(A - eye, k, xp)


def polar_qr_svd(Xw: Any, xp: Any, rows: Rows = LOCAL) -> tuple[Any, Any]:
    """Fallback: X = QR, R = U Σ Vᵀ, polar(X) = Q (U Vᵀ); orthonormal for every X (full SVD
    bases), the polar factor when X has full rank. Returns (Q U Vᵀ, singular values).
    Row-sharded X: Q and R by direct TSQR (:func:`_tsqr`)."""
    Q, R = _tsqr(Xw, xp, rows) if rows.sharded else xp.linalg.qr(Xw)
    U, sv, Vt = xp.linalg.svd(R, full_matrices=False)
    return Q @ (U @ Vt), sv


def _tsqr(Xw: Any, xp: Any, rows: Rows) -> tuple[Any, Any]:
    """This block's rows of Q, and R, of a row-sharded X = QR by direct TSQR (Benson, Gleich &
    Demmel, IEEE BigData 2013): X_k = q_k r_k per block (r_k padded with zero rows to M × M),
    [r_1; …; r_P] = q₂R on every process (the same stacked matrix, the same R), Q_k = q_k q₂,k."""
    K, M = Xw.shape[-2], Xw.shape[-1]
    if K:
        q, r = xp.linalg.qr(Xw)
    else:  # a block without rows
        q = xp.zeros(Xw.shape[:-1] + (0,), dtype=Xw.dtype, device=device_of(Xw))
        r = xp.zeros(Xw.shape[:-2] + (0, M), dtype=Xw.dtype, device=device_of(Xw))
    k = r.shape[-2]
    if k < M:
        pad = xp.zeros(r.shape[:-2] + (M - k, M), dtype=r.dtype, device=device_of(r))
        r = xp.concat([r, pad], axis=-2)
    q2, R = xp.linalg.qr(rows.stack(r))
    return q @ rows.own(q2, M, k), R


def polar_maxima(X: Any, xp: Any) -> list[Any]:
    """This block's part of the maxima ``polar_impl`` needs of a row-sharded X: max |x| per
    column (..., 1, M) and the max of :func:`~householderla._lib.linalg.pow2_normalise`
    (..., 1, 1); reduce them (``rows.reduce(maxes=...)``) and pass them as ``maxima``."""
    if 0 in X.shape:
        return [block_max(X, xp, -2), block_max(X, xp, (-2, -1))]
    return [xp.max(xp.abs(X), axis=-2, keepdims=True), max_abs_parts(X, xp, (-2, -1))]


def _check_rank(sv: Any, xp: Any, N: int, eps: float) -> None:
    smax = xp.max(sv, axis=-1)
    ratio = host(xp.min(xp.min(sv, axis=-1) / xp.where(smax > 0, smax, xp.ones_like(smax))))
    if not ratio > max(N, sv.shape[-1]) * eps:
        raise RankDeficientError(
            "X is rank deficient (smallest/largest singular value "
            f"{ratio:.1e}): its polar factor is not unique"
        )


def _tolerances(work: Any, out: Any, restart: bool, xp: Any) -> tuple[float, float]:
    """(first-pass tolerance, restart tolerance) on the per-eigenvalue residual."""
    eps_w = float(xp.finfo(real_dtype(xp, work)).eps)
    eps_o = float(xp.finfo(real_dtype(xp, out)).eps)
    if restart:
        return math.sqrt(eps_w) / 16.0, eps_w
    if eps_w < eps_o:  # float32 result computed in float64: rounding to float32 dominates
        return eps_o / 128.0, eps_w
    return eps_w, eps_w


#: Restart by default when the first pass's correction can exceed 1 (λ_min·s² < 1/4, i.e.
#: κ(XᵀX) ≳ 7 after centring): X' + X'D then carries ‖D‖ times the rounding of X'.
_FAR = 0.25


def polar_impl(
    X: Any,
    xp: Any,
    *,
    num_iters: int | None = None,
    restart: bool | None = None,
    rows: Rows = LOCAL,
    maxima: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """Polar factor of X (..., N, M), M ≤ N, and an info dict (see :func:`hl.polar`).

    ``rows``: X is this process's row block of a row-sharded matrix (eager NumPy or torch,
    traced JAX under ``jax.shard_map``; ``docs/distributed.rst``): the maxima over rows and
    the Gram matrices are reduced over the blocks, everything else is the same M × M work on
    every process; ``maxima`` are the reduced :func:`polar_maxima` when the caller reduced
    them with its own (else one round here)."""
    xp = kernel_namespace(xp)
    # X beyond the range p of power_of_two_scale covers (subnormal, or half X near its
    # largest number: p² must be finite in the work dtype) is first scaled into it exactly;
    # X inside it is untouched (its own scale is the "unscaled" candidate of stage_plan)
    wr0 = real_dtype(xp, accumulation_dtype_for(xp, X))
    cm = None  # a row-sharded X's max |x| per column, after the prescaling
    if rows.sharded:
        if maxima is None:
            maxima = rows.reduce(maxes=polar_maxima(X, xp))[1]
        X, e = pow2_normalise(X, xp, keep=scale_cap(xp, wr0), m=maxima[1])
        cm = pow2_scale(maxima[0], e, xp)  # exact (max commutes with a monotone rounding)
    else:
        X = pow2_normalise(X, xp, keep=scale_cap(xp, wr0))[0]
    out = X.dtype
    work = accumulation_dtype_for(xp, X)
    eager = is_eager(X)
    # half precision: its N × M products in half precision with float32 results where the
    # backend has them (JAX, torch on CUDA), else on a float32 copy
    native = is_half(xp, out) and has_wide_matmul(xp, X)
    Xw = X if (work == out or native) else xp.astype(X, work)
    eps_w = float(xp.finfo(real_dtype(xp, work)).eps)
    split = _Split(xp, eager)
    # half X on the host path: split.up(a, like_w) puts a host array on X's device in the
    # work dtype (float X: like X itself, as before)
    like_w = Xw if Xw.dtype == work else xp.empty(0, dtype=work, device=device_of(X))
    # the real scales p, s go to the device in the real work dtype (complex X: a new array)
    wr = real_dtype(xp, work)
    p_like = Xw if Xw.dtype == wr else xp.empty(0, dtype=wr, device=device_of(X))
    ms = split.small  # the namespace of the M × M work
    plan = split.jit(stage_plan, (0, 4))
    if eager and ms is np and Xw.ndim == 2:
        plan = _plan_one  # one matrix, NumPy or host: plan in Python floats
    # small M on NumPy / the host: exact bounds from the eigenvalues (cheaper than the O(M²)
    # bounds there, and the count they give is the smallest one)
    exact = eager and ms is np and X.shape[-1] <= EIG_BOUNDS_MAX_M
    if split.host:
        # p from the host copy of max|X| (a few NumPy operations on one number per matrix)
        m = xp.max(xp.abs(Xw), axis=-2, keepdims=True) if cm is None else cm
        p = power_of_two_scale(
            split.down(m if m.dtype == p_like.dtype else xp.astype(m, p_like.dtype)), ms
        )
        if Xw.dtype == work:
            A = split.down(scaled_gram(xp, Xw, split.up(p, p_like), rows))
        else:
            A = split.down(scaled_gram(xp, Xw, split.up(p, like_w), rows))
    elif exact:
        A, p = _stage_gram(xp, Xw, rows, cm)
    elif rows.sharded:
        A, p, lo, hi, rho_lower = _stage_bounds(xp, Xw, rows, cm)
    else:
        A, p, lo, hi, rho_lower = jit_for(xp, _stage_bounds)(xp, Xw)
    if exact:
        lo, hi = eig_bounds(A, -math.inf, math.inf, ms, eps_w)
    elif split.host:
        lo, hi, rho_lower = spectral_bounds(A, p * p, ms)
    strict = _tolerances(work, out, False, xp)[0]
    planned = None  # (s, counts) at the strict tolerance for the current bounds
    if eager and num_iters is None:
        planned = plan(ms, lo, hi, p, strict)
        kmax = split.max(planned[1])
        c0 = p * p
        if (
            not exact
            and kmax >= 3
            and split.max(plan(ms, c0 - rho_lower, c0 + rho_lower, p, strict)[1]) < kmax
        ):
            # large M: the ∞/Frobenius norms overestimate ρ(XᵀX − I), and even the lower
            # bound ρ₋ would save iterations: pay three M × M products for ‖E⁸‖_∞^{1/8}
            lo, hi = split.jit(_stage_power)(ms, A, p, lo, hi)
            planned = plan(ms, lo, hi, p, strict)
        if not exact and split.max(planned[1]) == NEVER:
            loose = _tolerances(work, out, True, xp)[0]
            if split.max(plan(ms, lo, hi, p, loose)[1]) == NEVER:
                # λ_min cannot be separated from 0 by the cheap bounds: eigenvalues (O(M³))
                lo, hi = eig_bounds(A, lo, hi, ms, eps_w)
                planned = None
    if restart is None:
        # a float32 result needs float32's last bits; a half-precision result is rounded
        # far above the first pass's residual (eps_half / 128)
        restart = real_dtype(xp, work) == xp.float32 and out == work
        if eager and not restart and work == out:
            lo_c = ms.maximum(lo, ms.zeros_like(lo)) * centre_scale(lo, hi, ms) ** 2
            restart = split.min(lo_c) < _FAR
    tol1, tol2 = _tolerances(work, out, restart, xp)
    s, kk = planned if (planned is not None and tol1 == strict) else plan(ms, lo, hi, p, tol1)
    if num_iters is not None:
        k = int(num_iters)
    elif eager:
        k = int(split.max(kk))
    else:
        k = LAZY_ITERS
    info: dict[str, Any] = {"method": "newton-schulz", "iterations": k, "restart_iterations": 0}

    def fallback() -> Any:
        Q, sv = polar_qr_svd(Xw if Xw.dtype == work else xp.astype(Xw, work), xp, rows)
        if eager:
            _check_rank(sv, xp, rows.total(X.shape[-2]), eps_w)
        return Q

    # The count certifies ≤ tol1 per eigenvalue a priori (eager default). The certificate
    # of record is the residual actually reached, checked on the M × M matrices: √M·tol1 plus
    # rounding. Scaling by an upper bound keeps λs² < 3, so a small residual cannot come from
    # the wrong square root.
    certified: Any = False
    if k <= MAX_ITERS:
        check = 2.0 * math.sqrt(X.shape[-1]) * tol1 + 16.0 * X.shape[-1] * eps_w
        if split.host:
            D, resid = _stage_delta(ms, A, s, k)
            if Xw.dtype == work:
                Xs = Xw * split.up(s * p, p_like)[..., None, None]
                Q_ns = Xs + Xs @ split.up(D, Xw)
            else:
                Q_ns = scaled_apply(xp, Xw, *(split.up(a, like_w) for a in (p, s, D)))
        else:
            Q_ns, resid = jit_for(xp, _stage_apply, (0, 5))(xp, Xw, A, p, s, k)
        certified = split.max(resid) <= check if eager else xp.all(resid <= check)
    info["certified"] = certified
    if k > MAX_ITERS or (eager and not certified):
        info.update(method="qr-svd", iterations=None)
        Q = fallback()
        restart = False
    else:
        Q = select(xp, eager, certified, lambda: Q_ns, fallback)
    if restart and (split.host or exact):
        A1 = split.down(row_gram(rows, Q, xp) if rows.sharded else gram(Q, xp))
        if exact:
            lo1, hi1 = eig_bounds(A1, -math.inf, math.inf, ms, eps_w)
        else:
            lo1, hi1, _ = spectral_bounds(A1, np.ones(A1.shape[:-2], real_dtype(np, A1.dtype)), ms)
        if A1.ndim == 2:
            k2 = count_float(float(lo1), float(hi1), 1.0, tol2)
        else:
            k2 = split.max(counts(lo1, hi1, np.ones_like(lo1), tol2, ms))
        k2 = min(int(k2), MAX_ITERS)
        info["restart_iterations"] = k2
        if k2 > 0:
            eye = np.eye(A1.shape[-1], dtype=A1.dtype)
            Q = Q + Q @ split.up(ns_delta(A1 - eye, k2, ms), Q)
    elif restart:
        if rows.sharded:
            A1, kr = _stage_restart_bounds(xp, Q, tol2, rows)
        else:
            A1, kr = jit_for(xp, _stage_restart_bounds, (0, 2))(xp, Q, tol2)
        k2 = min(int(host(xp.max(kr))), MAX_ITERS) if eager else LAZY_RESTART_ITERS
        info["restart_iterations"] = k2
        if k2 > 0:
            Q = jit_for(xp, _stage_restart, (0, 3))(xp, Q, A1, k2)
    return (Q if Q.dtype == out else xp.astype(Q, out)), info


def polar_forward(X: Any, xp: Any, num_iters: Any, restart: Any) -> tuple[Any, dict[str, Any]]:
    """Validated :func:`polar_impl` (the primal of every autodiff rule of ``polar``): NaN/Inf
    raise on eager input."""
    check_finite_columns(X, xp, "X")
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
