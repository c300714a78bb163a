"""Retractions onto the Stiefel manifold St(N, M) = {X ∈ 𝔽^{N×M} : XᴴX = I}, 𝔽 = ℝ or ℂ.

``polar`` (Newton–Schulz with an a priori iteration count, Kong, Wang & Tao, ICLR 2023 eq. 13 and
Algorithm 3), ``polar_retraction`` (polar(X + tZ)), ``cayley_retraction`` (Cayley(ηA)X by
Sherman–Morrison–Woodbury, Likhosherstov et al., AISTATS 2021 App. B Lemma 1), ``qr_retraction``
(qf(X + tZ)) and ``riemannian_gradient`` (A X, Likhosherstov et al., AISTATS 2021, §2.2.2). All
batched over leading dimensions, float32 and float64, on every Array API namespace; float32 input is
computed in float64 on CPU backends and rounded once; bfloat16 and float16 input in float32
(``docs/theory/lowprec.rst``). All five take complex64/complex128 too (Hermitian transposes, a
real step; complex64 in complex128 on CPU, ``docs/theory/complex.rst``). The
mathematics is in ``docs/theory/retractions.rst``.

Autodiff: with torch tensors that need a graph (or are wrapped by ``torch.func``) and always
with JAX arrays, ``polar`` (hence ``polar_retraction`` and Cayley's drift guard), the SMW
Cayley map and the QR factor go through the hand-derived backward passes
(:mod:`householderla._autodiff.torch` / :mod:`householderla._autodiff.jax`), never through
the Newton–Schulz iterations; the step ``X + tZ`` and dtype casts around them are plain
array operations.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import array_api_compat as aac

from ._agnostic import retraction as RK
from ._agnostic.fixed_polar import fixed_step_polar
from ._agnostic.newton_schulz import polar_qr_svd
from ._autodiff import call, route
from ._interop.dask import is_dask_array
from ._interop.dask_tall import tsqr_retraction
from ._lib.checks import (
    RankDeficientError,
    check_finite,
    check_finite_columns,
    check_like,
    check_metric,
    check_stiefel_shape,
)
from ._lib.jit import jit_for, kernel_namespace, select
from ._lib.namespace import (
    accumulation_dtype,
    accumulation_dtype_for,
    is_half,
    mT,
    real_dtype,
    resolve,
)
from ._lib.tracing import is_eager

__all__ = [
    "cayley_retraction",
    "polar",
    "polar_retraction",
    "qr_retraction",
    "riemannian_gradient",
]

#: Cayley's drift guard: clean up when ‖XᵀX − I‖_F > DRIFT_FACTOR·√M·eps (input dtype).
DRIFT_FACTOR = 4.0


def as_step(step: Any, xp: Any, dtype: Any, device: Any, batch: tuple[int, ...]) -> Any:
    """``step`` as a Python float or an array of shape (..., 1, 1) broadcasting over ``batch``;
    its dtype never promotes the result (a float64 step with float32 X gives float32)."""
    if isinstance(step, bool):
        raise TypeError("step must be a real number or array; got bool")
    if isinstance(step, (int, float)):
        if not math.isfinite(step):
            raise ValueError(f"step must be finite; got {step!r}")
        return float(step)
    if aac.is_array_api_obj(step) and aac.array_namespace(step) is not xp:
        if not aac.is_numpy_array(step):
            raise TypeError(
                f"step is a {type(step).__module__}.{type(step).__name__} but X is not; "
                "convert step to X's namespace"
            )
        step = xp.asarray(step, device=device)
    _, _, _, (t,) = resolve([("step", step)], xp, half=True)
    if t.ndim > len(batch) or any(
        a != 1 and a != b for a, b in zip(t.shape[::-1], batch[::-1], strict=False)
    ):
        raise ValueError(
            f"step must be a scalar or broadcast to the batch shape {batch}; "
            f"got shape {tuple(t.shape)}"
        )
    check_finite(t, xp, "step")
    return (t if t.dtype == dtype else xp.astype(t, dtype))[..., None, None]


def step_dtype(xp: Any, dtype: Any) -> Any:
    """The dtype a step array takes: X's, its real dtype for complex X (the step is a real
    number), or float32 for half-precision X (a step rounded to bfloat16 would be off by up
    to 2⁻⁹)."""
    return accumulation_dtype(xp, dtype) if is_half(xp, dtype) else real_dtype(xp, dtype)


def _work(xp: Any, *arrays: Any) -> tuple[Any, list[Any]]:
    work = accumulation_dtype_for(xp, arrays[0])
    return work, [a if a.dtype == work else xp.astype(a, work) for a in arrays]


def _polar_routed(X: Any, xp: Any, num_iters: Any, restart: Any) -> tuple[Any, dict[str, Any]]:
    """polar through the autodiff rule table the input calls for."""
    return call(route(xp, X), "polar", xp, X, num_iters, restart)


def polar(
    X: Any,
    *,
    schedule: str | None = None,
    steps: int | None = None,
    min_sv: float = 1e-3,
    num_iters: int | None = None,
    restart: bool | None = None,
    rank_deficient: str = "raise",
    return_info: bool = False,
    xp: Any = None,
) -> Any:
    """Polar factor Q = X (XᴴX)^{-1/2} of tall full-rank X by Newton–Schulz.

    Parameters
    ----------
    X : array, shape (..., N, M)
        Full rank. A wide X (M > N) gives the factor with orthonormal rows,
        (XXᴴ)^{-1/2} X = polar(Xᵀ)ᵀ, as ``scipy.linalg.polar`` does. float32, float64,
        bfloat16 or float16 (half precision is computed in float32, rounded once), complex64
        or complex128 (the unitary factor: ᴴ is the conjugate transpose, XᴴX Hermitian
        positive definite with real eigenvalues, so the iteration, its bounds and its count are
        the real ones; complex64 is computed in complex128 on CPU and rounded once). Every
        option below applies to complex X.
    schedule : {None, "certified", "polar_express", "muon", "newton_schulz"}
        None (default): the polar factor to the accuracy of the dtype (below). A name: the
        *fixed-step mode* for update directions (Muon): ``steps`` odd-polynomial steps on
        X/(s‖X‖_F) in X's own dtype (bfloat16 GEMMs for bfloat16 X), any X (rank-deficient
        too), no fallback; ``return_info`` reports the interval the singular values land in.
        Schedules: the classical cubic, Muon's quintic, Polar Express (Amsel, Persson, Musco
        & Gower, ICLR 2026) and ours, designed for the rounding of the dtype
        (``docs/theory/lowprec.rst``).
    steps : int, optional
        Steps of the fixed-step mode (default 5).
    min_sv : float
        Fixed-step mode: the certificate covers the singular values σ ≥ ``min_sv``·‖X‖_F
        (default 10⁻³; "certified" raises it to what the dtype's rounding allows).
    num_iters : int, optional
        Newton–Schulz iterations of the first pass. Default: the smallest count that the
        bounds below certify (eager arrays), ``LAZY_ITERS`` = 6 when the values cannot be
        inspected (under ``jax.jit``). A count that the bounds or the a posteriori residual
        check do not certify falls back to QR + SVD instead of returning a non-orthonormal
        matrix.
    restart : bool, optional
        Run a second pass from the result's Gram matrix (Q ← Q + Q·D). Default (eager): when
        the working precision is float32 (float32 on GPU), or when the first pass starts far
        from orthonormal (κ(XᵀX) ≳ 7), where X + XD carries ‖D‖ > 1 times the rounding of X.
        float32 input on CPU is computed in float64 and rounded once: already at float32's
        rounding floor.
    rank_deficient : {"raise", "svd"}
        What a rank-deficient eager X gets: ``ValueError`` (default: its polar factor is not
        unique), or "svd": Q = W Vᵀ from the SVD X = W Σ Vᵀ (of the R factor of X = QR), one
        of the orthonormal matrices nearest to X, as ``scipy.linalg.polar`` returns.
    return_info : bool
        Also return ``{"method", "iterations", "restart_iterations", "certified"}``; in the
        fixed-step mode ``{"method", "schedule", "iterations", "interval", "interval_exact",
        "upper", "min_sv"}``: every output singular value from σ ≥ ``min_sv``·‖X‖_F lies in
        ``interval`` under the rounding model of the dtype (``interval_exact`` in exact
        arithmetic), every one is ≤ ``upper``.
    xp : namespace, optional

    Returns
    -------
    Q : array, shape (..., N, M)
        Orthonormal columns (rows when wide), the closest such matrix to X in every unitarily
        invariant norm. Empty X gives an empty Q of its shape.

    Notes
    -----
    Coupled Newton–Schulz on A = s²XᵀX (Higham 1997; Kong, Wang & Tao, ICLR 2023, Algorithm 3, App.
    M.1) in delta form (Q = X + XD). The count k is fixed before the loop from bounds [a, b] ∋
    spec(XᵀX): Gershgorin ∩ [1 − δ, 1 + δ], δ = ‖XᵀX − I‖_F (O(M²)), tightened for large M by ρ(E) ≤
    ‖E⁸‖_∞^{1/8}, E = XᵀX − I, when that can save iterations. On each eigenvalue the residual r = 1
    − λz² obeys r ← ¾r² + ¼r³, so k is the number of steps that takes the worst endpoint below the
    tolerance (eps of the dtype); the result is then checked on the M × M matrices, ‖(I + D)A(I + D)
    − I‖_F. X is scaled (s² ≈ 2/(a + b), exactly) only when that saves iterations. From a tangent
    step X + ξ: 2 iterations for ‖ξ‖₂ ≤ 0.01, 4 for ‖ξ‖₂ ≤ 0.3, 5–6 at 1.5 (up to M = 1024). When
    the cheap bounds cannot separate λ_min from 0 the eigenvalues of XᵀX are used (eager); more than
    ``MAX_ITERS`` = 10 iterations, or an uncertified count, falls back to QR + SVD of R.
    Rank-deficient X raises
    :class:`ValueError` on eager arrays unless ``rank_deficient="svd"``; under ``jax.jit`` it
    gets the (orthonormal) QR + SVD result. Cost:
    2·N·M² (Gram) + 2·M³·(3k − 1) + 2·N·M² flops (+ 4·N·M² for a restart).

    Examples
    --------
    >>> import numpy as np, householderla as hl
    >>> X = np.random.default_rng(0).standard_normal((6, 3))
    >>> Q = hl.polar(X)
    >>> bool(np.allclose(Q.T @ Q, np.eye(3)))
    True
    >>> Qc = hl.polar(X + 1j * np.random.default_rng(1).standard_normal((6, 3)))
    >>> bool(np.allclose(Qc.conj().T @ Qc, np.eye(3)))
    True
    >>> U, info = hl.polar(X, schedule="polar_express", return_info=True)
    >>> [round(v, 3) for v in info["interval_exact"]]
    [0.857, 1.131]
    """
    if schedule is not None:
        if (num_iters, restart, rank_deficient) != (None, None, "raise"):
            raise ValueError("num_iters, restart and rank_deficient apply to schedule=None")
        return fixed_step_polar(X, schedule, steps, min_sv, return_info, xp)
    if steps is not None:
        raise ValueError("steps applies to the fixed-step mode: pass schedule= too")
    if is_dask_array(X):  # tall, row-chunked X: Q·polar(R) by Dask's TSQR (docs/dask.rst)
        Q = tsqr_retraction(X, None, 0.0, partial(polar, rank_deficient=rank_deficient))
        return (Q, {"method": "tsqr"}) if return_info else Q
    xp, _, _, (X,) = resolve([("X", X)], xp, half=True, complex_ok=True)
    if X.ndim < 2:
        raise ValueError(f"X must have shape (..., N, M); got shape {tuple(X.shape)}")
    if num_iters is not None and (int(num_iters) != num_iters or num_iters < 0):
        raise ValueError(f"num_iters must be a non-negative integer; got {num_iters!r}")
    if rank_deficient not in ("raise", "svd"):
        raise ValueError(f"rank_deficient must be 'raise' or 'svd'; got {rank_deficient!r}")
    wide = X.shape[-1] > X.shape[-2]
    Xt = mT(X) if wide else X
    if math.prod(Xt.shape) == 0:
        Q, info = Xt, {"method": "empty", "iterations": 0, "restart_iterations": 0}
    else:
        try:
            Q, info = _polar_routed(Xt, xp, num_iters, restart)
        except RankDeficientError:
            if rank_deficient == "raise":
                raise
            Q, info = _polar_svd(Xt, xp), {"method": "svd", "iterations": None}
    Q = mT(Q) if wide else Q
    return (Q, info) if return_info else Q


def _polar_svd(X: Any, xp: Any) -> Any:
    """W Vᵀ of the SVD of X (through X = QR), in the accumulation dtype: an orthonormal
    nearest matrix for any X, rank-deficient included."""
    ks = kernel_namespace(xp)
    _, (Xw,) = _work(ks, X)
    Q = polar_qr_svd(Xw, ks)[0]
    return Q if Q.dtype == X.dtype else ks.astype(Q, X.dtype)


def polar_retraction(X: Any, Z: Any, step: Any = 1.0, *, xp: Any = None) -> Any:
    """Polar retraction R(X, tZ) = polar(X + tZ) = (X + tZ)((X + tZ)ᴴ(X + tZ))^{-1/2}.

    Parameters
    ----------
    X : array, shape (..., N, M), M ≤ N
        A point of St(N, M) (need not be exactly orthonormal: the result always is). Real
        (float32, float64, bfloat16, float16) or complex (complex64, complex128); a real X with
        a complex Z gives a complex result.
    Z : array, shape of X
        Direction (a tangent vector XᴴZ + ZᴴX = 0 for a retraction).
    step : float or array of shape broadcasting to X's batch shape
        Real (a complex step raises ``TypeError``).

    Returns
    -------
    array, shape (..., N, M)

    Notes
    -----
    Kong, Wang & Tao, ICLR 2023, eq. 13 (φ̄₃). The Gram matrix of Y = X + tZ is formed directly (one
    product), not by the shortcut I + t(XᵀZ + ZᵀX) + t²ZᵀZ: that needs two or three products, and
    its simplification I + t²ZᵀZ is exact only when XᵀX = I and XᵀZ + ZᵀX = 0 exactly, which
    rounding never gives; the direct form corrects a drifted X (Kong, Wang & Tao, ICLR 2023 App.
    M.1). R(X, tZ) = X + tZ + O(t²) for tangent Z. Cost: as :func:`polar`.
    """
    if is_dask_array(X):  # tall, row-chunked X: Q·polar(R) by Dask's TSQR (docs/dask.rst)
        return tsqr_retraction(X, Z, step, polar)
    xp, device, dtype, (X, Z) = resolve([("X", X), ("Z", Z)], xp, half=True, complex_ok=True)
    check_stiefel_shape(X)
    check_like(Z, X, "Z")
    t = as_step(step, xp, step_dtype(xp, dtype), device, tuple(X.shape[:-2]))
    check_finite_columns(X, xp, "X")
    check_finite_columns(Z, xp, "Z")
    Q = polar(RK.step_sum(xp, X, Z, t), xp=xp)
    return Q if Q.dtype == dtype else xp.astype(Q, dtype)


def cayley_retraction(
    X: Any,
    Z: Any,
    step: Any = 1.0,
    *,
    drift_tol: float | None = None,
    xp: Any = None,
) -> Any:
    """Cayley retraction along Z: Y = Cayley(tW) X = (I − tW/2)⁻¹(I + tW/2) X by
    Sherman–Morrison–Woodbury, with Y = X + tZ + O(t²) for tangent Z.

    The same kind of argument, in the same direction, as :func:`polar_retraction` and
    :func:`qr_retraction` (geoopt's ``retr(x, u, t)``): to descend a function ``f`` with
    Euclidean gradient G, pass ``Z = -riemannian_gradient(X, G, metric=...)``.

    Parameters
    ----------
    X : array, shape (..., N, M), M ≤ N
        A point of St(N, M): real (float32/64, bfloat16, float16) or complex (complex64/128).
    Z : array, shape of X
        The direction: a tangent vector at X (XᴴZ skew-Hermitian); a non-tangent Z moves along
        its tangent part (I − X herm(XᴴZ) part removed by the lift below).
    step : float or array broadcasting to X's batch shape
        t (default 1).
    drift_tol : float, optional
        Orthogonality guard: when ‖XᵀX − I‖_F exceeds it (default 4·√M·eps of the dtype) the
        result is replaced by its polar factor, Cayley(tW)·polar(X). ``0`` always cleans up,
        ``float('inf')`` never does. Under ``jax.jit`` the check is a ``lax.cond``.

    Returns
    -------
    array, shape (..., N, M)

    Notes
    -----
    W = ẐXᵀ − XẐᵀ with Ẑ = (I − ½XXᵀ)Z, the canonical skew lift: WX = Z for tangent Z and
    XᵀX = I (Wen & Yin 2013; Likhosherstov et al., AISTATS 2021, App. B). With G = −Ẑ the skew
    matrix A = GXᵀ − XGᵀ is −W, and App. B, Lemma 1 gives Cayley(tW)X = (I + tA/2)⁻¹(I − tA/2)X
    = X − B(I + ½CᵀB)⁻¹CᵀX with B = t[G, X], C = [X, −G] ∈ ℝ^{N×2M}. Only XᵀX, XᵀZ, ZᵀZ and a
    2M×2M solve are needed: 12·N·M² + O(M³) flops and O(N·M) memory; never an N×N matrix. For
    the Riemannian gradient of either metric, ``Z = -riemannian_gradient(X, G, metric=m)`` gives
    exactly the Cayley step of that metric (the canonical lift of its gradient is its own skew
    matrix). The map is orthogonal, so the result inherits XᵀX; the guard compares the already
    formed XᵀX (O(M²)) with I. The output is checked by one more Gram product (‖YᵀY − XᵀX‖_F
    ≤ 64·√M·eps·max(1, ‖XᵀX‖_F)); when it fails, and for abs(t)·‖Z‖ > eps^(-1/4), Y is
    recomputed in an orthonormal basis of [X, Ẑ] (a QR and the eigenvalues of a 2M × 2M skew
    matrix, about 20·N·M² flops), orthogonal to rounding for every t; t → ∞ gives the
    reflection (I − 2Π)X, Π the projector onto the range of W (``docs/theory/retractions.rst``,
    "Cayley at the edges"). Peak memory: two N × M arrays. Z = 0 or t = 0 returns X exactly.
    Complex X: ᴴ for ᵀ throughout (W skew-Hermitian, Cayley(tW) unitary, t real;
    ``docs/theory/complex.rst``).

    Examples
    --------
    >>> import numpy as np, householderla as hl
    >>> rng = np.random.default_rng(0)
    >>> X = np.linalg.qr(rng.standard_normal((8, 3)))[0]
    >>> Z = -hl.riemannian_gradient(X, rng.standard_normal((8, 3)))   # a descent direction
    >>> Y = hl.cayley_retraction(X, Z, 0.1)
    >>> bool(np.allclose(Y.T @ Y, np.eye(3)))
    True
    """
    xp, device, dtype, (X, Z) = resolve([("X", X), ("Z", Z)], xp, half=True, complex_ok=True)
    check_stiefel_shape(X)
    check_like(Z, X, "Z")
    t = as_step(step, xp, step_dtype(xp, dtype), device, tuple(X.shape[:-2]))
    if math.prod(X.shape) == 0:  # M = 0 or an empty batch: nothing moves
        return X
    for a, name in ((X, "X"), (Z, "Z")):
        check_finite_columns(a, xp, name)
    r = route(xp, X, Z, t)
    xp = kernel_namespace(xp)
    work, (Xw, Zw) = _work(xp, X, Z)
    wr = real_dtype(xp, work)  # the step is real
    tw = t if isinstance(t, float) or t.dtype == wr else xp.astype(t, wr)
    # tZ enters only as a product: Z/c and tc (c a power of two near max|Z|) give the same
    # map with Gram products of unit scale (Z at 1e±160 used to give NaN or 1e-4 errors);
    # Z within 2^(±emax/4) is used as it is (its Gram products cannot overflow or lose a
    # unit-scale Z to underflow), which saves the N × M copy Z/c. tc is capped at the
    # largest finite number (the map there is its t → ∞ limit to rounding)
    c = RK.power_of_two_max(Zw, xp)
    fin = xp.finfo(wr)
    lim = 2.0 ** (math.log2(fin.max) // 4)
    if not is_eager(c) or bool(xp.any(c > lim)) or bool(xp.any(c < 1 / lim)):
        at = abs(tw) if isinstance(tw, float) else xp.abs(tw)
        # (half the largest float: fin.max / |t| · |t| may round above fin.max)
        cap = 0.5 * fin.max / (max(at, 1.0) if isinstance(at, float) else xp.clip(at, 1.0, None))
        Zw, tw = Zw / c, tw * xp.minimum(c, cap)
    Y, drift = call(r, "cayley", xp, Xw, Zw, tw)
    if drift_tol is None:
        drift_tol = DRIFT_FACTOR * X.shape[-1] ** 0.5 * float(xp.finfo(real_dtype(xp, dtype)).eps)
    # a Python branch when the drift is concrete; lax.cond / where when any input is traced
    # or vmapped (a traced step alone makes it a tracer)
    guard = drift > drift_tol
    Y = select(xp, is_eager(drift), guard, lambda: _polar_routed(Y, xp, None, None)[0], lambda: Y)
    return Y if Y.dtype == dtype else xp.astype(Y, dtype)


def qr_retraction(X: Any, Z: Any, step: Any = 1.0, *, xp: Any = None) -> Any:
    """QR retraction qf(X + tZ): the Q factor of the thin QR with R's diagonal real positive.

    Parameters
    ----------
    X : array, shape (..., N, M), M ≤ N
        Real or complex (complex64/complex128).
    Z : array, shape of X
    step : float or array broadcasting to X's batch shape (real)

    Returns
    -------
    array, shape (..., N, M)
        Orthonormal columns; a zero diagonal entry of R (rank-deficient X + tZ) keeps sign +1.

    Notes
    -----
    Likhosherstov et al., AISTATS 2021, §2.2.2 (``g^QR``). Householder QR of the namespace
    (``linalg.qr``), then columns of Q (rows of R) with R_kk < 0 are negated (complex: Q ← Q
    diag(φ), φ_k the phase of r_kk), which makes the factorisation unique for full rank.
    4·M²(N − M/3) flops; float32 (complex64) is computed in float64 (complex128) on CPU.
    R(X, tZ) = X + tZ + O(t²) for tangent Z.
    """
    if is_dask_array(X):  # tall, row-chunked X: Dask's TSQR (docs/dask.rst)
        return tsqr_retraction(X, Z, step)
    xp, device, dtype, (X, Z) = resolve([("X", X), ("Z", Z)], xp, half=True, complex_ok=True)
    check_stiefel_shape(X)
    check_like(Z, X, "Z")
    t = as_step(step, xp, step_dtype(xp, dtype), device, tuple(X.shape[:-2]))
    check_finite_columns(X, xp, "X")
    check_finite_columns(Z, xp, "Z")
    Y = RK.step_sum(xp, X, Z, t)
    check_finite_columns(Y, xp, "X + step*Z")  # finite X, Z, step can still overflow
    if X.shape[-1] == 0:
        return Y
    r = route(xp, Y)
    xp = kernel_namespace(xp)
    _, (Yw,) = _work(xp, Y)
    Q = call(r, "qr_q", xp, Yw)
    return Q if Q.dtype == dtype else xp.astype(Q, dtype)


def _riemannian_gradient(xp: Any, X: Any, G: Any, euclidean: bool) -> Any:
    return RK.riemannian_gradient(X, G, euclidean, xp)


def riemannian_gradient(X: Any, G: Any, *, metric: str = "canonical", xp: Any = None) -> Any:
    """Riemannian gradient A X, A = Â − Âᵀ, of the Euclidean gradient G at X ∈ St(N, M).

    Parameters
    ----------
    X : array, shape (..., N, M)
        Real or complex (complex64/complex128; then ᴴ replaces ᵀ below).
    G : array, shape of X
    metric : {"canonical", "euclidean"}

    Returns
    -------
    array, shape (..., N, M)
        Canonical: Â = G Xᴴ, A X = G − X GᴴX; Euclidean: Â = G Xᴴ − ½ X Xᴴ G Xᴴ,
        A X = G − X herm(XᴴG), herm(B) = (B + Bᴴ)/2 (the tangent projection of G). Both for
        XᴴX = I; in general the exact A X (= G XᴴX − X GᴴX, ...) is returned, which is tangent
        (XᴴAX is skew-Hermitian).

    Notes
    -----
    Likhosherstov et al., AISTATS 2021, §2.2.2; the gradient for the inner products ⟨Z₁, Z₂⟩ =
    Re tr(Z₁ᴴ(I − ½XXᴴ)Z₂) (canonical) and Re tr(Z₁ᴴZ₂) (Euclidean). 8·N·M² flops, no N×N
    matrix.
    """
    euclidean = check_metric(metric)
    xp, _, dtype, (X, G) = resolve([("X", X), ("G", G)], xp, half=True, complex_ok=True)
    check_stiefel_shape(X)
    check_like(G, X, "G")
    check_finite_columns(X, xp, "X")
    check_finite_columns(G, xp, "G")
    xp = kernel_namespace(xp)
    _, (Xw, Gw) = _work(xp, X, G)
    out = jit_for(xp, _riemannian_gradient, (0, 3))(xp, Xw, Gw, euclidean)
    return out if out.dtype == dtype else xp.astype(out, dtype)


def __dir__() -> list[str]:
    """Only the public names: the imports above stay attributes but are not listed."""
    return sorted(__all__)
