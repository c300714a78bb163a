"""Explicit vector–Jacobian products of every differentiable map, in the Array API.

Each function takes the forward inputs and the cotangent of the output and returns the
cotangents of the inputs, in the inputs' namespace, device and dtype. The derivations are in
``docs/theory/vjp.rst``. Apply-type VJPs need O(N·L + L·B) memory (no N×N intermediate) and
at most about twice the forward's flops; zero reflection vectors get a zero gradient.

=========================================  ===============================================
function                                   map
=========================================  ===============================================
``cwy_apply(V, h, g)``                     (V, h) ↦ cwy(V) @ h
``cwy_transpose_apply(V, h, g)``           (V, h) ↦ cwy(V).T @ h
``cwy_matrix(V, G)``                       V ↦ cwy(V).matrix()
``tcwy_apply(V, x, g)``                    (V, x) ↦ tcwy(V) @ x
``tcwy_transpose_apply(V, y, g)``          (V, y) ↦ tcwy(V).T @ y
``tcwy_matrix(V, G)``                      V ↦ tcwy(V).matrix()
``householder_apply(V, h, g)``             (V, h) ↦ householder_apply(V, h)
``householder_product(V, G)``              V ↦ householder_product(V)
``cwy_factors(V, U_bar, T_bar)``           V ↦ (U, T = S⁻¹), the factors every operator holds
``ornn_apply(U, sign, h, g)``              (U, h) ↦ ornn(U, sign) @ h (U: lower trapezoid)
``ornn_matrix(U, sign, G)``                U ↦ ornn(U, sign).matrix()
``svd_householder_apply(Uv, s, Vv, x, g)`` (Uv, s, Vv, x) ↦ svd_householder(Uv, s, Vv) @ x
``svd_householder_matrix(Uv, s, Vv, G)``   (Uv, s, Vv) ↦ svd_householder(Uv, s, Vv).matrix()
``bounded_sigma(s_hat, c, r, g)``          ŝ ↦ 2r(sigmoid(ŝ) − ½) + c
``polar(X, G)``                            X ↦ polar(X) = X (XᵀX)^{-1/2}
``polar_retraction(X, Z, step, Ybar)``     (X, Z, step) ↦ polar(X + step·Z)
``cayley_retraction(X, G, step, Ybar)``    (X, G, step) ↦ Cayley(step·A) X (SMW; ``metric=``)
``qr_retraction(X, Z, step, Ybar)``        (X, Z, step) ↦ qf(X + step·Z)
=========================================  ===============================================

The retraction VJPs (last four rows) are derived in ``docs/theory/retractions.rst``; they
cost at most about 2.2× their forward and never form an N×N matrix.

Complex input (the CWY, T-CWY and Householder rows): every function here is the adjoint of the
map's derivative for the real inner product ⟨A, B⟩ = Re tr(AᴴB). For a real loss L, the
cotangent of a complex array z is ∂L/∂Re z + i ∂L/∂Im z — what ``torch``'s ``.grad`` holds,
and the conjugate of JAX's convention — and the returned cotangents are of the same kind. A
real input mixed with complex ones gets a real cotangent (the real part: its perturbations are
real). Derivation: ``docs/theory/complex.rst``.
"""

from __future__ import annotations

from typing import Any

import array_api_compat as aac
import numpy as np

from . import retractions as R
from ._agnostic import compact_wy as K
from ._agnostic import cwy_rows as CR
from ._agnostic import phases as P
from ._agnostic import retraction as RK
from ._agnostic.svd_vjp import bounded_sigma_vjp as bounded_sigma
from ._agnostic.svd_vjp import svd_householder_apply_vjp as svd_householder_apply
from ._agnostic.svd_vjp import svd_householder_matrix_vjp as svd_householder_matrix
from ._lib.checks import (
    as_matrix_operand,
    broadcast_batch,
    check_cotangent,
    check_like,
    check_reflectors,
    check_stiefel_shape,
)
from ._lib.jit import jit_for
from ._lib.linalg import eye_like, sum_to_shape
from ._lib.mixed import widen
from ._lib.namespace import (
    accumulation_dtype_for,
    complex_dtype,
    is_complex,
    is_half,
    mT,
    real_dtype,
    resolve,
)
from ._lib.tracing import is_eager
from ._lib.tuning import VJP_BLOCK, VJP_BLOCKS_MIN_L
from .householder import householder_apply_vjp
from .ornn import ornn_apply_vjp as ornn_apply
from .ornn import ornn_matrix_vjp as ornn_matrix

__all__ = [
    "bounded_sigma",
    "cayley_retraction",
    "cwy_apply",
    "cwy_factors",
    "cwy_matrix",
    "cwy_transpose_apply",
    "householder_apply",
    "householder_product",
    "ornn_apply",
    "ornn_matrix",
    "polar",
    "polar_retraction",
    "qr_retraction",
    "svd_householder_apply",
    "svd_householder_matrix",
    "tcwy_apply",
    "tcwy_matrix",
    "tcwy_transpose_apply",
]


def _real_inputs(*values: Any) -> list[bool]:
    """Which inputs are real (a complex cotangent of a real input keeps its real part)."""
    out = []
    for a in values:
        dtype = getattr(a, "dtype", None)
        out.append(not is_complex(dtype) if dtype is not None else not np.iscomplexobj(a))
    return out


def _as_inputs(real: list[bool], xp: Any, *bars: Any) -> tuple[Any, ...]:
    """The cotangents ``bars`` with the real part taken where the input was real."""
    return tuple(
        xp.real(b) if (r and b is not None and is_complex(b.dtype)) else b
        for r, b in zip(real, bars, strict=True)
    )


def _phases(theta: Any, V: Any, xp: Any, K: int) -> tuple[Any, Any, Any]:
    """(θ, e^{iθ}, V as complex) for the ``theta=`` argument of the VJPs (θ real, (..., K))."""
    _, _, _, (theta,) = resolve([("theta", theta)], xp)
    if theta.ndim < 1 or theta.shape[-1] != K:
        raise ValueError(f"theta must have shape (..., {K}); got shape {tuple(theta.shape)}")
    V = V if is_complex(V.dtype) else xp.astype(V, complex_dtype(xp, V.dtype))
    return theta, P.phase_factor(xp.astype(theta, real_dtype(xp, V.dtype)), xp), V


def _apply_vjp(
    V: Any, h: Any, g: Any, xp: Any, theta: Any, *, transpose: bool, mode: str, hname: str
) -> tuple[Any, ...]:
    real = _real_inputs(V, h)
    named = [("V", V), (hname, h), ("g", g)]
    xp, _, dtype, (V, h, g) = resolve(named, xp, complex_ok=True, half=True)
    N, L = check_reflectors(V)
    if is_half(xp, dtype):  # in float32 (exact copies), each cotangent rounded once
        V, h, g = (widen(a, xp) for a in (V, h, g))
        out = _apply_vjp(V, h, g, xp, theta, transpose=transpose, mode=mode, hname=hname)
        return _back(dtype, xp, *out[:2]) + tuple(out[2:])
    n_in = {"square": N, "embed": L, "project": N}[mode]
    n_out = {"square": N, "embed": N, "project": L}[mode]
    hm, vector = as_matrix_operand(h, n_in, hname)
    batches = [("V", V.shape[:-2]), (hname, hm.shape[:-2])]
    if theta is not None:
        theta, p, V = _phases(theta, V, xp, N if mode == "square" else L)
        batches.append(("theta", theta.shape[:-1]))
    out_shape = broadcast_batch(batches) + (n_out, hm.shape[-1])
    check_cotangent(g, out_shape[:-1] if vector else out_shape, "g")
    gm = g[..., None] if vector else g
    blocked = None
    if _blocked_vjp_serves(V, hm, xp, theta, transpose, mode):
        blocked = _blocked_apply_vjp(V, hm, gm, xp)
    if blocked is not None:
        V_bar, x_bar = blocked
        return _as_inputs(real, xp, V_bar, x_bar[..., 0] if vector else x_bar)
    if theta is not None:
        hm = hm if is_complex(hm.dtype) else xp.astype(hm, V.dtype)
        V_bar, h_bar, t_bar = jit_for(xp, _phased_apply_core, (0, 6, 7))(
            xp, V, p, hm, gm, theta, transpose, mode
        )
        return (*_as_inputs(real, xp, V_bar, h_bar[..., 0] if vector else h_bar), t_bar)
    V_bar, h_bar = jit_for(xp, _apply_core, (0, 4, 5))(xp, V, hm, gm, transpose, mode)
    return _as_inputs(real, xp, V_bar, h_bar[..., 0] if vector else h_bar)


def _apply_core(xp: Any, V: Any, hm: Any, gm: Any, transpose: bool, mode: str) -> Any:
    """(V̄, h̄) of the single factor pair (checked inputs; one compiled program on JAX)."""
    U, T, r = K.cwy_factors(V, xp)
    U_bar, h_bar, _, S_bar = K.lowrank_vjp(U, T, hm, gm, xp, transpose=transpose, mode=mode)
    return K.factors_vjp(U, r, U_bar, S_bar, xp), h_bar


def _phased_apply_core(
    xp: Any, V: Any, p: Any, hm: Any, gm: Any, theta: Any, transpose: bool, mode: str
) -> Any:
    """(V̄, h̄, θ̄) of :func:`_apply_core` with the phases e^{iθ} (``p``)."""
    U, T, r = K.cwy_factors(V, xp)
    V_bar, h_bar, t_bar = P.apply_vjp(U, T, r, p, hm, gm, xp, transpose=transpose, mode=mode)
    return V_bar, h_bar, xp.astype(sum_to_shape(t_bar, tuple(theta.shape), xp), theta.dtype)


def _blocked_vjp_serves(V: Any, hm: Any, xp: Any, theta: Any, transpose: bool, mode: str) -> bool:
    """Whether (V, h) ↦ Q h's VJP may run in blocks of unnormalised reflectors
    (:func:`_blocked_apply_vjp`, which also checks the column norms): real eager V (N, L)
    with L ≥ ``VJP_BLOCKS_MIN_L``, a 2-D h, no phases, Q itself (not Qᵀ, not T-CWY)."""
    if theta is not None or transpose or mode != "square" or V.ndim != 2 or hm.ndim != 2:
        return False
    if V.shape[-1] < VJP_BLOCKS_MIN_L or is_complex(V.dtype) or is_complex(hm.dtype):
        return False
    return is_eager(V)


def _blocked_apply_vjp(V: Any, hm: Any, gm: Any, xp: Any) -> tuple[Any, Any] | None:
    """(V̄, h̄) of y = Q h by the blocked rule of :mod:`householderla._agnostic.cwy_rows` on
    the rows x = hᵀ (y ᵀ = x Qᵀ): the forward's blocks again, then each block's VJP, first
    block first (Likhosherstov et al., AISTATS 2021, Theorem 2 for the blocks). Blocks of
    ``VJP_BLOCK`` unnormalised reflectors: 12·N·L·B + 4·N·L·nb flops against the single
    pair's 8·N·L·B + 4·N·L² (its Gram and its Ū's U(P + Pᵀ)).

    None unless every ‖v‖² (in the accumulation dtype, read off the blocks' Grams) is zero
    or inside (tiny/eps, max·eps), ~(1e-292, 1e292) in float64, where the unnormalised Grams
    are exact to rounding (else the unit columns take it: NaN, Inf and extreme scales). On
    NumPy the updates accumulate inside the GEMMs on copies of h and g (β = 1,
    :func:`~householderla._lib.linalg.subtract_product`), with no temporaries."""
    blocks = CR.column_blocks(V.shape[-1], VJP_BLOCK, False)
    x = mT(hm)
    if V.dtype != x.dtype:  # (promoted as the forward promotes)
        V = xp.astype(V, x.dtype)
    grams = [CR.rows_gram(V[..., row:, s:e], xp) for row, s, e in blocks]
    fi = xp.finfo(grams[0].dtype)
    lo, hi = float(fi.smallest_normal) / float(fi.eps), float(fi.max) * float(fi.eps)
    for G in grams:
        ss = xp.linalg.diagonal(G)
        if not bool(xp.all((ss == 0) | ((ss > lo) & (ss < hi)))):  # (False for NaN, Inf)
            return None
    pairs = zip(blocks, grams, strict=True)
    Ss = [CR.rows_factor(V[..., row:, s:e], xp, G) for (row, s, e), G in pairs]
    inplace = aac.is_numpy_namespace(xp)
    _, kept = CR.blocks_product(V, Ss, x, xp, blocks, inplace, need_y=False)
    V_bar, x_bar = CR.blocks_vjp(V, Ss, mT(gm), kept, xp, blocks, True, inplace)
    return V_bar, mT(x_bar)


def _matrix_vjp(V: Any, G: Any, xp: Any, theta: Any, *, mode: str) -> Any:
    (real,) = _real_inputs(V)
    xp, _, dtype, (V, G) = resolve([("V", V), ("G", G)], xp, complex_ok=True, half=True)
    N, L = check_reflectors(V)
    if is_half(xp, dtype):  # in float32 (exact copies), V̄ rounded once
        out = _matrix_vjp(widen(V, xp), widen(G, xp), xp, theta, mode=mode)
        if theta is not None:
            return (*_back(dtype, xp, out[0]), out[1])
        return _back(dtype, xp, out)[0]
    batches = [("V", V.shape[:-2])]
    if theta is not None:
        theta, p, V = _phases(theta, V, xp, N if mode == "square" else L)
        batches.append(("theta", theta.shape[:-1]))
    shape = broadcast_batch(batches) + ((N, N) if mode == "square" else (N, L))
    check_cotangent(G, shape, "G")
    if theta is not None:
        V_bar, t_bar = jit_for(xp, _phased_matrix_core, (0, 5))(xp, V, p, G, theta, mode)
        return _as_inputs([real], xp, V_bar)[0], t_bar
    return _as_inputs([real], xp, jit_for(xp, _matrix_core, (0, 3))(xp, V, G, mode))[0]


def _matrix_core(xp: Any, V: Any, G: Any, mode: str) -> Any:
    """V̄ of the formed matrix (checked inputs; one compiled program on JAX)."""
    U, T, r = K.cwy_factors(V, xp)
    U_bar, _, _, S_bar = K.lowrank_vjp(U, T, None, G, xp, transpose=False, mode=mode)
    return K.factors_vjp(U, r, U_bar, S_bar, xp)


def _phased_matrix_core(xp: Any, V: Any, p: Any, G: Any, theta: Any, mode: str) -> Any:
    """(V̄, θ̄) of :func:`_matrix_core` with the phases e^{iθ} (``p``)."""
    U, T, r = K.cwy_factors(V, xp)
    V_bar, t_bar = P.matrix_vjp(U, T, r, p, G, xp, mode=mode)
    V_bar = sum_to_shape(V_bar, tuple(V.shape), xp)
    return V_bar, xp.astype(sum_to_shape(t_bar, tuple(theta.shape), xp), theta.dtype)


def cwy_apply(V: Any, h: Any, g: Any, *, theta: Any = None, xp: Any = None) -> tuple[Any, ...]:
    """VJP of (V, h) ↦ cwy(V) @ h (of (V, h, θ) ↦ cwy(V, theta=θ) @ h with ``theta``).

    Parameters
    ----------
    V : array, shape (..., N, L)
        Reflection vectors.
    h : array, shape (N,) or (..., N, B)
        The right operand of the forward.
    g : array
        Cotangent of the output ``cwy(V) @ h`` (its shape).
    theta : real array, shape (..., N), optional
        Phases of the forward's right factor diag(e^{iθ}); then θ̄ is returned too.
    xp : namespace, optional

    Returns
    -------
    V_bar : array, shape (..., N, L)
    h_bar : array, shape of h
    theta_bar : array, shape of theta (only with ``theta``)
        θ̄_k = −Σ_b Im(conj(z̄_kb) z_kb) for z = diag(e^{iθ}) h (``docs/theory/complex.rst``).

    Notes
    -----
    With a = Uᵀh, b = T a, c = Uᵀg, d = Tᵀc: h̄ = Qᵀg = g − U d,
    Ū = −g bᵀ − h dᵀ + U (P + Pᵀ) with P = striu(d bᵀ), then v̄ = (ū − u uᵀū)/‖v‖.
    8·N·L·B + 2·N·L² flops on top of building the factors. For complex input every ᵀ is ᴴ
    and uᵀū becomes Re(uᴴū) (cotangent convention: the module docstring). Real V with
    L ≥ 128 and a 2-D h (no θ) take the same cotangents in blocks of 128 unnormalised
    reflectors (``docs/theory/cwy.rst``, "One node for a layer"): the forward's blocks again,
    then each block's rule, 12·N·L·B + 4·N·L·nb flops with no L × L Gram.
    """
    return _apply_vjp(V, h, g, xp, theta, transpose=False, mode="square", hname="h")


def cwy_transpose_apply(
    V: Any, h: Any, g: Any, *, theta: Any = None, xp: Any = None
) -> tuple[Any, ...]:
    """VJP of (V, h) ↦ cwy(V).T @ h (for complex V: cwy(V).H @ h, the inverse; with
    ``theta``: cwy(V, theta=θ).H @ h, and θ̄ is returned too); as :func:`cwy_apply` with
    T ↔ Tᴴ and S̄ = b dᴴ."""
    return _apply_vjp(V, h, g, xp, theta, transpose=True, mode="square", hname="h")


def cwy_matrix(V: Any, G: Any, *, theta: Any = None, xp: Any = None) -> Any:
    """VJP of V ↦ cwy(V).matrix(); G has shape (..., N, N). With ``theta``: of
    (V, θ) ↦ cwy(V, theta=θ).matrix(), returning (V̄, θ̄).

    Ū = −G U Tᵀ − Gᵀ U T + U (P + Pᵀ), P = striu(Tᵀ Uᵀ G U Tᵀ); 4·N²·L + O(N·L²) flops.
    """
    return _matrix_vjp(V, G, xp, theta, mode="square")


def tcwy_apply(V: Any, x: Any, g: Any, *, theta: Any = None, xp: Any = None) -> tuple[Any, ...]:
    """VJP of (V, x) ↦ tcwy(V) @ x; x (M,) or (..., M, B), g (..., N[, B]).

    Returns (V_bar (..., N, M), x_bar shaped as x), and θ̄ (..., M) with ``theta`` (the
    forward tcwy(V, theta=θ) @ x). Equal to :func:`cwy_apply` with h = [x; 0] and
    x̄ = h̄[:M], without forming the padding.
    """
    return _apply_vjp(V, x, g, xp, theta, transpose=False, mode="embed", hname="x")


def tcwy_transpose_apply(
    V: Any, y: Any, g: Any, *, theta: Any = None, xp: Any = None
) -> tuple[Any, ...]:
    """VJP of (V, y) ↦ tcwy(V).T @ y (for complex V: tcwy(V).H @ y; with ``theta``:
    tcwy(V, theta=θ).H @ y, and θ̄ too); y (N,) or (..., N, B), g (..., M[, B])."""
    return _apply_vjp(V, y, g, xp, theta, transpose=True, mode="project", hname="y")


def tcwy_matrix(V: Any, G: Any, *, theta: Any = None, xp: Any = None) -> Any:
    """VJP of V ↦ tcwy(V).matrix(); G has shape (..., N, M). 6·N·M² + O(M³) flops. With
    ``theta``: of (V, θ) ↦ tcwy(V, theta=θ).matrix(), returning (V̄, θ̄)."""
    return _matrix_vjp(V, G, xp, theta, mode="embed")


def householder_apply(V: Any, h: Any, g: Any, *, xp: Any = None) -> tuple[Any, Any]:
    """VJP of (V, h) ↦ householder_apply(V, h), by sequential reflections (8·N·L·B flops,
    O(N·B) extra memory: each reflector's input is recovered from its output)."""
    real = _real_inputs(V, h)
    named = [("V", V), ("h", h), ("g", g)]
    xp, _, dtype, (V, h, g) = resolve(named, xp, complex_ok=True, half=True)
    N, _ = check_reflectors(V)
    hm, vector = as_matrix_operand(h, N)
    out = broadcast_batch([("V", V.shape[:-2]), ("h", hm.shape[:-2])]) + tuple(hm.shape[-2:])
    check_cotangent(g, out[:-1] if vector else out, "g")
    if is_half(xp, dtype):  # in float32 (exact copies), each cotangent rounded once
        V, h, g = (widen(a, xp) for a in (V, h, g))
        return _back(dtype, xp, *householder_apply_vjp(V, h, g, xp))
    return _as_inputs(real, xp, *householder_apply_vjp(V, h, g, xp))


def householder_product(V: Any, G: Any, *, xp: Any = None) -> Any:
    """VJP of V ↦ householder_product(V); G has shape (..., N, N)."""
    real = _real_inputs(V)
    xp, device, dtype, (V, G) = resolve([("V", V), ("G", G)], xp, complex_ok=True, half=True)
    N, _ = check_reflectors(V)
    check_cotangent(G, tuple(V.shape[:-2]) + (N, N), "G")
    Vw, Gw = widen(V, xp), widen(G, xp)  # half precision: in float32, V̄ rounded once
    V_bar, _ = householder_apply_vjp(Vw, eye_like(xp, N, Vw.dtype, device), Gw, xp)
    return _as_inputs(real, xp, *_back(dtype, xp, V_bar))[0]


def cwy_factors(V: Any, U_bar: Any, T_bar: Any, *, xp: Any = None) -> Any:
    """VJP of V ↦ (U, T): unit columns and T = S⁻¹ (what every CWY/T-CWY operator holds).

    S̄ = −Tᵀ T̄ Tᵀ, Ū += U (P + Pᵀ) with P = striu(S̄), then the normalisation backward.
    This is the rule the torch and JAX wiring use, so that several applies of one operator
    share one factor backward.
    """
    real = _real_inputs(V)
    named = [("V", V), ("U_bar", U_bar), ("T_bar", T_bar)]
    xp, _, dtype, (V, U_bar, T_bar) = resolve(named, xp, complex_ok=True, half=True)
    _, L = check_reflectors(V)
    check_cotangent(U_bar, tuple(V.shape), "U_bar")
    check_cotangent(T_bar, tuple(V.shape[:-2]) + (L, L), "T_bar")
    V, U_bar, T_bar = (widen(a, xp) for a in (V, U_bar, T_bar))  # half: float32 factors
    U, T, r = K.cwy_factors(V, xp)
    V_bar = K.factors_vjp(U, r, U_bar, K.s_bar_from_t_bar(T, T_bar, xp), xp)
    return _as_inputs(real, xp, *_back(dtype, xp, V_bar))[0]


# -- retractions (householderla.retractions) --------------------------------------------------


def _retraction_inputs(
    X: Any, Z: Any, step: Any, Ybar: Any, xp: Any, zname: str, complex_ok: bool = True
) -> tuple[Any, Any, Any, Any, Any, Any, Any]:
    named = [("X", X), (zname, Z), ("Ybar", Ybar)]
    xp, device, dtype, (X, Z, Ybar) = resolve(named, xp, half=True, complex_ok=complex_ok)
    check_stiefel_shape(X)
    check_like(Z, X, zname)
    check_cotangent(Ybar, tuple(X.shape), "Ybar")
    t = R.as_step(step, xp, R.step_dtype(xp, dtype), device, tuple(X.shape[:-2]))
    work = accumulation_dtype_for(xp, X)
    cast = [a if a.dtype == work else xp.astype(a, work) for a in (X, Z, Ybar)]
    wr = real_dtype(xp, work)  # the step stays real
    tw = t if isinstance(t, float) or t.dtype == wr else xp.astype(t, wr)
    return xp, dtype, t, tw, *cast


def _step_bar(per_matrix: Any, t: Any, dtype: Any, xp: Any) -> Any:
    """Cotangent of ``step`` (a float or a (..., 1, 1) array) from its per-matrix values
    (real: ``dtype`` is the real dtype of X's)."""
    dtype = real_dtype(xp, dtype)
    out = (
        xp.sum(per_matrix)
        if isinstance(t, float)
        else sum_to_shape(per_matrix, tuple(t.shape[:-2]), xp)
    )
    return out if out.dtype == dtype else xp.astype(out, dtype)


def _polar_vjp(xp: Any, X: Any, G: Any) -> tuple[Any, Any]:
    return RK.polar_vjp(X, G, xp)


def _cayley_vjp(xp: Any, X: Any, Z: Any, t: Any, Yb: Any) -> Any:
    return RK.cayley_along_vjp(X, Z, t, Yb, xp)


def _qr_vjp(xp: Any, Y: Any, Yb: Any) -> Any:
    return RK.qr_vjp(Y, Yb, xp)


def _back(dtype: Any, xp: Any, *arrays: Any) -> tuple[Any, ...]:
    return tuple(a if a.dtype == dtype else xp.astype(a, dtype) for a in arrays)


def polar(X: Any, G: Any, *, xp: Any = None) -> Any:
    """VJP of X ↦ polar(X) = X (XᴴX)^{-1/2}; X (..., N, M) of full rank, G of X's shape.

    X̄ = G P⁻¹ − 2XΩ with P = (XᴴX)^{1/2} and Ω the solution of the Sylvester equation
    PΩ + ΩP = herm(P⁻¹XᴴG P⁻¹), solved in the eigenbasis of XᴴX (``eigh`` of M × M);
    ᴴ = ᵀ for real X. Complex X and G: the cotangents of ``docs/theory/complex.rst``
    (X̄ = ∂L/∂Re X + i ∂L/∂Im X); real X with complex G gets the real part.
    8·N·M² + O(M³) flops, O(N·M) memory. Rank-deficient X raises ``ValueError`` (eager).
    """
    real = _real_inputs(X)
    xp, _, dtype, (X, G) = resolve([("X", X), ("G", G)], xp, half=True, complex_ok=True)
    check_stiefel_shape(X)
    check_cotangent(G, tuple(X.shape), "G")
    work = accumulation_dtype_for(xp, X)
    Xw, Gw = (a if a.dtype == work else xp.astype(a, work) for a in (X, G))
    Xbar, sig = jit_for(xp, _polar_vjp)(xp, Xw, Gw)
    if is_eager(sig) and sig.shape[-1] and not bool(xp.all(sig[..., 0] > 0)):
        raise ValueError("X is rank deficient: the polar factor is not differentiable")
    return _as_inputs(real, xp, *_back(dtype, xp, Xbar))[0]


def polar_retraction(
    X: Any, Z: Any, step: Any, Ybar: Any, *, xp: Any = None
) -> tuple[Any, Any, Any]:
    """VJP of (X, Z, step) ↦ polar(X + step·Z): (X̄, Z̄, step_bar) = (Ȳ', step·Ȳ', ⟨Ȳ', Z⟩)
    with Ȳ' the :func:`polar` VJP at X + step·Z (⟨A, B⟩ = Re tr(AᴴB) for complex X).
    ``step_bar`` has the shape of ``step``; a real X or Z gets the real part of its cotangent."""
    real = _real_inputs(X, Z)
    xp, dtype, t, tw, Xw, Zw, Yb = _retraction_inputs(X, Z, step, Ybar, xp, "Z")
    Ybar_in, _ = jit_for(xp, _polar_vjp)(xp, Xw + tw * Zw, Yb)
    sb = _step_bar(RK.inner(Ybar_in, Zw, xp), t, dtype, xp)
    return (*_as_inputs(real, xp, *_back(dtype, xp, Ybar_in, tw * Ybar_in)), sb)


def cayley_retraction(
    X: Any, Z: Any, step: Any, Ybar: Any, *, xp: Any = None
) -> tuple[Any, Any, Any]:
    """VJP of (X, Z, step) ↦ cayley_retraction(X, Z, step) (the SMW map, without the drift
    guard): (X̄, Z̄, step_bar), ``step_bar`` shaped as ``step``.

    Through G = −(I − ½XXᴴ)Z (the skew-Hermitian lift, :func:`householderla.cayley_retraction`):
    with K = I + ½CᴴB, Λ = K⁻ᴴBᴴȲ, D = ½CΛ − Ȳ, V = X + Y: X̄' = Ȳ − CΛ + ηs D W₂ᴴ − ½VΛ₁ᴴ,
    Ḡ = η D W₁ᴴ + ½VΛ₂ᴴ/s, step_bar = ⟨D, U⟩; then Z̄ = ½X(XᴴḠ) − Ḡ and
    X̄ = X̄' + ½(Ḡ ZᴴX + Z ḠᴴX) (ᴴ = ᵀ for real X; complex cotangents and ⟨A, B⟩ =
    Re tr(AᴴB) as in ``docs/theory/complex.rst``, a real X or Z gets the real part).
    26·N·M² + O(M³) flops (forward: 12·N·M²), no N × N matrix.
    """
    real = _real_inputs(X, Z)
    xp, dtype, t, tw, Xw, Zw, Yb = _retraction_inputs(X, Z, step, Ybar, xp, "Z")
    Xbar, Zbar, sb = jit_for(xp, _cayley_vjp)(xp, Xw, Zw, tw, Yb)
    return (*_as_inputs(real, xp, *_back(dtype, xp, Xbar, Zbar)), _step_bar(sb, t, dtype, xp))


def qr_retraction(X: Any, Z: Any, step: Any, Ybar: Any, *, xp: Any = None) -> tuple[Any, Any, Any]:
    """VJP of (X, Z, step) ↦ qr_retraction(X, Z, step): with Y = X + step·Z = QR,
    E = QᴴȲ and F = triu(E, 1) + diag(Re E) + tril(Eᴴ, −1): Ȳ' = (Ȳ − QF)R⁻ᴴ, X̄ = Ȳ',
    Z̄ = step·Ȳ', step_bar = ⟨Ȳ', Z⟩ (ᴴ = ᵀ and F = triu(E) + tril(Eᵀ, −1) for real Y).
    Full column rank required. ~6·N·M² flops after the QR."""
    real = _real_inputs(X, Z)
    xp, dtype, t, tw, Xw, Zw, Yb = _retraction_inputs(X, Z, step, Ybar, xp, "Z")
    Ybar_in = jit_for(xp, _qr_vjp)(xp, Xw + tw * Zw, Yb)
    sb = _step_bar(RK.inner(Ybar_in, Zw, xp), t, dtype, xp)
    return (*_as_inputs(real, xp, *_back(dtype, xp, Ybar_in, tw * Ybar_in)), sb)


def __dir__() -> list[str]:
    """Only the public names: the imports above stay attributes but are not listed."""
    return sorted(__all__)
