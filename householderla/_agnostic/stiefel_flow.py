"""The M×M parts of the momentum Stiefel optimizers (Kong, Wang & Tao, ICLR 2023): the
optimizer and state types, argument and state checks, and the matrix exponentials of App. M.2.
Backend-neutral (``xp`` explicit); the N×M steps, which need the polar retraction, are in
:mod:`householderla.stiefel`. Real and complex: every transpose is the conjugate transpose
``mH`` (``mT`` on real arrays) and every inner product Re tr(AᴴB) (``docs/theory/stiefel.rst``,
"Complex Stiefel manifold and U(n)").
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from .._lib.checks import check_finite, check_stiefel_shape
from .._lib.linalg import eye_like
from .._lib.namespace import device_of, is_complex, mH, real_dtype, resolve
from .._lib.rows import LOCAL, Rows

__all__ = [
    "AMSGradState",
    "AdamState",
    "MomentumState",
    "StiefelOptimizer",
    "cast",
    "expm_skew",
    "herm",
    "init_arrays",
    "inner_re",
    "metric_a",
    "momentum_rotation",
    "prepare",
]

_NAMED_METRICS = {"canonical": 0.5, "euclidean": 0.0}


class StiefelOptimizer(NamedTuple):
    """A pair of pure functions, like optax's ``GradientTransformation``.

    ``init(X) -> state`` and ``update(X, G, state) -> (X_next, state_next)``; note that
    ``update`` returns the next *point*, not an increment (a retraction is not additive;
    :func:`householderla.jax.stiefel_sgd` gives the optax convention).
    """

    init: Any
    update: Any


class MomentumState(NamedTuple):
    """State of :func:`momentum_sgd`: ``count`` (int32, steps taken), ``U`` (..., N, M) with
    XᵀU = 0 and ``Z`` (..., M, M) skew. For M = N (SO(n), Kong, Wang & Tao, ICLR 2023 App. O) ``U``
    is an empty
    (..., N, 0) array: there is no normal component."""

    count: Any
    U: Any
    Z: Any


class AdamState(NamedTuple):
    """State of :func:`adam`: as :class:`MomentumState` plus the second moments ``p``
    (..., M, M, symmetric) of the Z-'gradient' and ``q`` (..., N, M; (..., N, 0) for M = N)
    of the U-'gradient'."""

    count: Any
    U: Any
    Z: Any
    p: Any
    q: Any


class AMSGradState(NamedTuple):
    """State of :func:`adam` with ``amsgrad=True``: :class:`AdamState` plus the running
    maxima ``p_max``, ``q_max`` of the second moments."""

    count: Any
    U: Any
    Z: Any
    p: Any
    q: Any
    p_max: Any
    q_max: Any


def herm(A: Any, xp: Any) -> Any:
    """The Hermitian part ½(A + Aᴴ) (the symmetric part ½(A + Aᵀ) of a real A)."""
    return 0.5 * (A + mH(A, xp))


def inner_re(A: Any, B: Any, xp: Any) -> Any:
    """Re tr(AᴴB) per matrix (..., ): the real inner product of ℂ^{N×M} as ℝ^{2NM}; Σ AB
    elementwise for real A, B."""
    if is_complex(A.dtype) or is_complex(B.dtype):
        return xp.sum(xp.real(xp.conj(A) * B), axis=(-2, -1))
    return xp.sum(A * B, axis=(-2, -1))


def metric_a(metric: Any) -> float:
    """The a of Definition 1 from a number (a < 1) or 'canonical' / 'euclidean'."""
    if isinstance(metric, str):
        if metric not in _NAMED_METRICS:
            raise ValueError(
                f"metric must be a number a < 1, 'canonical' or 'euclidean'; got {metric!r}"
            )
        return _NAMED_METRICS[metric]
    if isinstance(metric, bool) or not isinstance(metric, (int, float)):
        raise ValueError(f"metric must be a number a < 1 or a name; got {metric!r}")
    a = float(metric)
    if not (math.isfinite(a) and a < 1.0):
        raise ValueError(
            f"metric a must be finite and < 1 (Kong, Wang & Tao, ICLR 2023, Definition 1); got {a}"
        )
    return a


def cast(xp: Any, dtype: Any, *arrays: Any) -> list[Any]:
    """The arrays in ``dtype``; for complex ``dtype`` the real ones (Adam's p, q) in its real
    dtype of the same precision."""
    rdtype = real_dtype(xp, dtype)
    out = []
    for a in arrays:
        want = dtype if is_complex(a.dtype) or not is_complex(dtype) else rdtype
        out.append(a if a.dtype == want else xp.astype(a, want))
    return out


def _stiefel_shape(X: Any, rows: Rows) -> tuple[int, int]:
    """(N, M) of the whole X (checked) from this row block of it."""
    if not rows.sharded:
        return check_stiefel_shape(X)
    N, M = rows.total(X.shape[-2]), X.shape[-1]
    if X.ndim < 2 or M > N:
        raise ValueError(
            f"X must have shape (..., N, M) with M <= N; got a row-sharded X of {N} rows and "
            f"{M} columns"
        )
    return N, M


def prepare(X: Any, G: Any, state: Any, xp: Any, rows: Rows = LOCAL) -> tuple[Any, Any, Any, Any]:
    """X and G in X's namespace and dtype (G never promotes X), shapes and kinds checked: a
    complex G for a real X, or a real G for a complex X, is a ``TypeError`` naming G. A
    row-sharded X (``rows``) is this process's block: its G is checked for NaN/Inf by the
    step, with the maxima it reduces anyway (a check here would raise on one process only)."""
    xp, _, dtype, (X,) = resolve([("X", X)], xp, complex_ok=True)
    N, M = _stiefel_shape(X, rows)
    _, _, _, (G,) = resolve([("G", G)], xp, complex_ok=True)
    if tuple(G.shape) != tuple(X.shape):
        raise ValueError(f"G must have the shape of X {tuple(X.shape)}; got {tuple(G.shape)}")
    if is_complex(G.dtype) != is_complex(dtype):
        raise TypeError(
            f"G has {'complex' if is_complex(G.dtype) else 'real'} dtype {G.dtype} but X has "
            f"dtype {dtype}: the gradient of a {'complex' if is_complex(dtype) else 'real'} X "
            "must be "
            + (
                "complex (∂L/∂Re X + i ∂L/∂Im X, as torch's .grad; conjugate jax.grad's)"
                if is_complex(dtype)
                else "real (a real X cannot follow an imaginary part)"
            )
        )
    if G.dtype != dtype:
        G = xp.astype(G, dtype)
    if not rows.sharded:
        check_finite(G, xp, "G")
    U_cols = 0 if M == N else M
    for name in state._fields:
        arr = getattr(state, name)
        want = {
            "count": (),
            "U": X.shape[:-1] + (U_cols,),
            "q": X.shape[:-1] + (U_cols,),
            "q_max": X.shape[:-1] + (U_cols,),
            "Z": X.shape[:-2] + (M, M),
            "p": X.shape[:-2] + (M, M),
            "p_max": X.shape[:-2] + (M, M),
        }[name]
        if tuple(arr.shape) != tuple(want):
            raise ValueError(
                f"state.{name} has shape {tuple(arr.shape)} but X {tuple(X.shape)} needs "
                f"{tuple(want)}; was the state made by init() for this X?"
            )
    return xp, X, G, dtype


def init_arrays(X: Any, xp: Any, adam: bool, amsgrad: bool = False, rows: Rows = LOCAL) -> Any:
    """The zero state for X: U (..., N, M) and Z (..., M, M) in X's dtype (complex for
    complex X: Z ∈ u(M)), Adam's p, q in its real dtype (|f|², |g|² are real); for M = N U
    and q are (..., N, 0). Row-sharded X: U and q are this block's rows."""
    xp, device, dtype, (X,) = resolve([("X", X)], xp, complex_ok=True)
    N, M = _stiefel_shape(X, rows)
    u_shape = X.shape[:-1] + (0 if M == N else M,)
    z_shape = X.shape[:-2] + (M, M)
    count = xp.asarray(0, dtype=xp.int32, device=device)
    U = xp.zeros(u_shape, dtype=dtype, device=device)
    Z = xp.zeros(z_shape, dtype=dtype, device=device)
    if not adam:
        return MomentumState(count, U, Z)
    rdtype = real_dtype(xp, dtype)
    p = xp.zeros(z_shape, dtype=rdtype, device=device)
    q = xp.zeros(u_shape, dtype=rdtype, device=device)
    if amsgrad:
        return AMSGradState(count, U, Z, p, q, xp.zeros_like(p), xp.zeros_like(q))
    return AdamState(count, U, Z, p, q)


def expm_skew(W: Any, method: str, xp: Any) -> Any:
    """An approximation of expm(W) for skew W (..., M, M) (Kong, Wang & Tao, ICLR 2023 App. M.2),
    or skew-Hermitian W (Wᴴ = −W) for complex W.

    ``"euler"``: I + W (first order, not orthogonal: (I + W)ᴴ(I + W) = I − W²);
    ``"cayley"``: (I − W/2)⁻¹(I + W/2) (eq. 32, orthogonal / unitary, second order);
    ``"expm"``: the exponential itself, cos(Θ) + W·sinc(Θ) with Θ = (WᴴW)^{1/2} (for skew(-
    Hermitian) W, W² = −WᴴW commutes with W), from one Hermitian eigendecomposition. O(M³).
    """
    eye = eye_like(xp, W.shape[-1], W.dtype, device_of(W))
    if method == "euler":
        return eye + W
    if method == "cayley":
        return xp.linalg.solve(eye - 0.5 * W, eye + 0.5 * W)
    lam, Q = xp.linalg.eigh(herm(mH(W, xp) @ W, xp))
    th = xp.sqrt(xp.maximum(lam, xp.zeros_like(lam)))
    small = th < 1e-4  # sinc(θ) = 1 − θ²/6 + O(θ⁴): exact to rounding below 1e-4
    one = xp.ones_like(th)
    sinc = xp.where(small, one - th * th / 6.0, xp.sin(th) / xp.where(small, one, th))
    Qh = mH(Q, xp)
    cos_part = (Q * xp.cos(th)[..., None, :]) @ Qh
    sinc_part = (Q * sinc[..., None, :]) @ Qh
    return cos_part + W @ sinc_part


def momentum_rotation(Z: Any, damping: float, d_lr: float, method: str, xp: Any) -> Any:
    """L with U½ = U L − (gradient term): φ̄₂ without the gradient, i.e. the flow of
    V̇ = −γV + dVY over one step (eq. 30, rescaled): μI + dηZ (eq. 34, ``"euler"``) or
    μ·R(dηZ) with R the orthogonal (unitary) Cayley / exponential (eq. 33, ``"cayley"`` /
    ``"expm"``)."""
    if method == "euler":
        eye = eye_like(xp, Z.shape[-1], Z.dtype, device_of(Z))
        return damping * eye + d_lr * Z
    return damping * expm_skew(d_lr * Z, method, xp)
