"""Backend-neutral kernels of the compact WY representation and their backward passes.

U = [v₁/‖v₁‖, …] (0 ↦ 0), S = ½I + striu(UᴴU), T = S⁻¹: Q = I − U T Uᴴ ("square"), its
first M columns Ω ("embed") and Ωᴴ ("project") (Likhosherstov et al., AISTATS 2021, Theorems
2 and 3). All three are y = R(h) − U_out M U_inᴴ h, M ∈ {T, Tᴴ}: one kernel and one backward
serve the six applies, h = None gives ``.matrix()``. Complex V takes conjugate transposes;
the backward passes are adjoint for Re tr(AᴴB) (``docs/theory/vjp.rst``,
``docs/theory/complex.rst``). Every function takes ``xp`` explicitly.
"""

from __future__ import annotations

from typing import Any

from .._lib.checks import check_finite_norms
from .._lib.linalg import (
    eye_like,
    gram_upper,
    inv_upper_triangular,
    own_numpy,
    real_dot,
    sum_to_shape,
    where0,
)
from .._lib.mixed import matmul_split
from .._lib.namespace import (
    accumulation_dtype_for,
    device_of,
    is_complex,
    is_half,
    mH,
    mT,
    real_dtype,
)
from .._lib.tracing import is_eager
from .._lib.tuning import FUSE_MAX_COLUMNS

MODES = ("square", "embed", "project")


def normalize_columns(V: Any, xp: Any, *, check: bool = False) -> tuple[Any, Any]:
    """Unit columns ``U`` and column norms ``r`` of ``V`` (..., N, L); zero columns stay 0.

    Scaled by the column's max-abs first, so no finite input overflows or underflows
    (‖v‖ = m ‖v/m‖). Returns ``U`` (..., N, L) in ``V``'s dtype and ``r`` (..., 1, L) in its
    real dtype. With ``check``, NaN/Inf columns raise (eager arrays) before anything divides
    by them.
    """
    if V.shape[-2] == 0:  # N = 0: no entries to normalise (max over an empty axis fails)
        shape = (*V.shape[:-2], 1, V.shape[-1])
        return V, xp.zeros(shape, dtype=real_dtype(xp, V.dtype), device=device_of(V))
    m = xp.max(xp.abs(V), axis=-2, keepdims=True)
    if check:
        check_finite_norms(m, xp)
    nonzero = m > 0
    one = xp.ones_like(m)
    if is_complex(V.dtype):
        # complex ÷ real promotes the divisor to complex, whose division forms 1/m first:
        # inf for a subnormal m. Scale by 2^-e instead (exact; two steps, as 2^1074 is not
        # a float64), e = ⌊log₂ m⌋, so that max |W| ∈ [1, 2).
        e = xp.floor(xp.log2(xp.where(nonzero, m, one)))
        half = xp.floor(e / 2)
        W = (V * 2.0**-half) * 2.0 ** (half - e)
        m = 2.0**e
    else:
        W = V / xp.where(nonzero, m, one)
    rs = xp.sqrt(real_dot(W, W, xp))
    rs_safe = xp.where(nonzero, rs, one)
    if own_numpy(W):  # U in W's memory: one N × L array (see own_numpy)
        import numpy as np

        return np.divide(W, rs_safe, out=W), m * rs
    return W / rs_safe, m * rs


def cwy_factors(V: Any, xp: Any, *, check: bool = True, sdiag: Any = None) -> tuple[Any, Any, Any]:
    """``U`` (..., N, L), ``T = S⁻¹`` (..., L, L) and norms ``r`` (..., 1, L, real) of ``V``.

    Gram matrix, norms and T are accumulated in float64 (complex128) for float32 (complex64)
    inputs on CPU backends (:func:`~householderla._lib.namespace.accumulation_dtype_for`) and
    rounded to ``V``'s dtype at the end. Cost: N·L² (Gram, syrk on NumPy) + L³/3 (triangular
    inverse) flops; 4× that in real flops for complex V.

    ``sdiag`` (..., L), a constant (no cotangent), replaces the diagonal ½ of S: column k is
    then the unitary map I − (1 − λ_k) u_k u_kᴴ, λ_k = 1 − 1/sdiag_k (LAPACK's complex
    reflectors, ``docs/theory/complex.rst``).
    """
    acc = accumulation_dtype_for(xp, V)
    Va = V if V.dtype == acc else xp.astype(V, acc)
    U, r = normalize_columns(Va, xp, check=check)
    L = V.shape[-1]
    # only the strict upper triangle of UᴴU is read: syrk (N·L²) on a single real NumPy matrix
    eye = eye_like(xp, L, acc, device_of(V))
    D = 0.5 * eye if sdiag is None else eye * xp.astype(sdiag, acc)[..., None, :]
    S = D + xp.triu(gram_upper(U, xp), k=1)
    T = inv_upper_triangular(S, xp)
    if acc != V.dtype:
        U, T = xp.astype(U, V.dtype), xp.astype(T, V.dtype)
        r = xp.astype(r, real_dtype(xp, V.dtype))
    return U, T, r


def roles(U: Any, T: Any, transpose: bool, mode: str, xp: Any) -> tuple[Any, Any, Any]:
    m = T.shape[-1]
    M = mH(T, xp) if transpose else T
    U_in = U[..., :m, :] if mode == "embed" else U
    U_out = U[..., :m, :] if mode == "project" else U
    return M, U_in, U_out


def lowrank_apply(
    U: Any, T: Any, h: Any, xp: Any, *, transpose: bool, mode: str, out: Any = None
) -> Any:
    """``R(h) − U_out M U_inᴴ h`` for ``h`` (..., K, B); ``h=None`` means the identity.
    ``transpose`` selects M = Tᴴ (the conjugate transpose; Tᵀ for real T).

    Half-precision ``h`` (bfloat16/float16) with float32 factors (those of half-precision V,
    ``docs/theory/lowprec.rst``): U_inᵀh reads h in its dtype with float32 accumulation
    (:func:`~householderla._lib.mixed.matmul_split`), the rest runs in float32 and the result
    is rounded once to h's dtype. ``out`` (with ``h=None`` only): the dtype of the dense
    matrix, formed in the factors' dtype and rounded once to ``out`` (None: the factors'
    dtype, formed in their accumulation dtype).

    Cost 2·N·L·B (Uᵀh) + L²·B (M·a) + 2·N·L·B (U·b): two GEMMs and a small one.
    """
    if h is None and out is None:
        acc = accumulation_dtype_for(xp, U)
        if acc != U.dtype:
            # the dense matrix of float32 factors, formed in float64 and rounded once: 4× below
            # LAPACK orgqr's ‖QᵀQ − I‖ at N=1024 (one-shot float32: 1.2× above it)
            Ua, Ta = xp.astype(U, acc), xp.astype(T, acc)
            return xp.astype(
                lowrank_apply(Ua, Ta, None, xp, transpose=transpose, mode=mode), U.dtype
            )
    if h is None and out is not None and out != U.dtype:
        y = lowrank_apply(U, T, None, xp, transpose=transpose, mode=mode, out=U.dtype)
        return xp.astype(y, out)
    if h is not None and h.dtype != U.dtype and is_half(xp, h.dtype):
        return _half_apply(U, T, h, xp, transpose=transpose, mode=mode)
    return lowrank_apply_parts(U, T, h, xp, transpose=transpose, mode=mode)[0]


def lowrank_apply_parts(
    U: Any, T: Any, h: Any, xp: Any, *, transpose: bool, mode: str
) -> tuple[Any, Any, Any]:
    """(y, a, b) with y = R(h) − U_out b, a = U_inᴴ h, b = M a: :func:`lowrank_apply` for
    factors and h of one dtype, with the two small products its backward reads again
    (:func:`lowrank_vjp`'s ``parts``: 2·N·L·B + 2·L²·B flops it then skips)."""
    M, U_in, U_out = roles(U, T, transpose, mode, xp)
    a = mH(U_in, xp) if h is None else mH(U_in, xp) @ h
    b = M @ a
    ub = U_out @ b
    n_out = U_out.shape[-2]
    if h is None:
        n_in = U_in.shape[-2]
        h = eye_like(xp, n_in, U.dtype, device_of(U))
    return residual(h, ub, n_out, mode, xp), a, b


def residual(h: Any, ub: Any, n_out: int, mode: str, xp: Any) -> Any:
    """R(h) − U b: h − Ub ("square"), [h; 0] − Ub ("embed"), h[:n_out] − Ub ("project")."""
    if mode == "square":
        return h - ub
    if mode == "embed":  # [h; 0] − U b
        m = h.shape[-2]
        return xp.concat([h - ub[..., :m, :], -ub[..., m:, :]], axis=-2)
    return h[..., :n_out, :] - ub  # project


def _half_apply(U: Any, T: Any, h: Any, xp: Any, *, transpose: bool, mode: str) -> Any:
    """:func:`lowrank_apply` for half-precision h and real float32 factors: a = U_inᵀh with
    h read in its dtype and float32 accumulation, b = M a and U_out b in float32, R(h) − U b
    in float32 (h's values are exact there), one rounding to h's dtype."""
    M, U_in, U_out = roles(U, T, transpose, mode, xp)
    a = mT(matmul_split(xp, mT(h), U_in))  # (hᵀ U_in)ᵀ: half operand, float32 result
    ub = U_out @ (M @ a)
    y = residual(xp.astype(h, U.dtype), ub, U_out.shape[-2], mode, xp)
    return xp.astype(y, h.dtype)


def _u_bar(Ubar_out: Any, Ubar_in: Any, m: int, mode: str, xp: Any) -> Any:
    """Ū from the output-side and input-side terms (U_in/U_out are row blocks of U)."""
    if mode == "square":
        if own_numpy(Ubar_out, Ubar_in):
            Ubar_out += Ubar_in
            return Ubar_out
        return Ubar_out + Ubar_in
    if mode == "embed":
        return xp.concat([Ubar_out[..., :m, :] + Ubar_in, Ubar_out[..., m:, :]], axis=-2)
    return xp.concat([Ubar_in[..., :m, :] + Ubar_out, Ubar_in[..., m:, :]], axis=-2)


def lowrank_vjp(
    U: Any,
    T: Any,
    h: Any,
    g: Any,
    xp: Any,
    *,
    transpose: bool,
    mode: str,
    fuse: bool = True,
    need_h: bool = True,
    need_s: bool = True,
    parts: tuple[Any, Any] | None = None,
) -> tuple[Any, Any, Any, Any]:
    """Backward of :func:`lowrank_apply` for the cotangent ``g`` of its output.

    Returns ``(U_bar, h_bar, T_bar, S_bar)``: ``U_bar`` is the gradient with respect to the
    unit columns U (before the normalisation backward), ``h_bar`` is ``None`` when ``h`` is
    the identity, ``T_bar`` is the gradient with respect to T and ``S_bar`` the gradient with
    respect to S = T⁻¹ (= −Tᴴ T̄ Tᴴ, obtained here as a rank-B outer product). With
    a = U_inᴴh, b = M a, c = U_outᴴ g, d = Mᴴ c:

        h̄ = Rᵀ(g) − U_in d,   Ū_out −= g bᴴ,   Ū_in −= h dᴴ,
        M̄ = −c aᴴ,           S̄ = d bᴴ (M = T)  or  b dᴴ (M = Tᴴ).

    (ᴴ is ᵀ for real arrays; complex cotangents follow torch's convention, see the module
    docstring.)

    Batch axes that broadcasting added are summed out so the results have the shapes of
    ``U``, ``h`` and ``T``. Cost: four GEMMs of the forward's shapes plus L²·B, one fewer
    with ``need_h=False`` (h̄ is then ``None``: h is a constant). ``fuse=False`` keeps h and
    g apart (no concatenation along the batch columns, which would move a batch sharded over
    its columns between devices); so does a batch wider than ``FUSE_MAX_COLUMNS``.
    ``need_s=False`` skips S̄ (``None``; a caller that takes T̄ instead, like torch's rule
    table, whose factor node receives the sum of its consumers' T̄).
    ``parts``: (a, b) as the forward computed them (:func:`lowrank_apply_parts`), not
    recomputed here (and no fusion: only c = U_outᴴ g is left to multiply).
    """
    h_dtype = None if h is None else h.dtype
    if is_half(xp, g.dtype) or (h is not None and is_half(xp, h.dtype)):
        # half-precision h / g with float32 factors: the backward runs in float32 (the
        # values are exact there) and h̄ is rounded once to h's dtype
        g = g if g.dtype == U.dtype else xp.astype(g, U.dtype)
        h = h if h is None or h.dtype == U.dtype else xp.astype(h, U.dtype)
    M, U_in, U_out = roles(U, T, transpose, mode, xp)
    fused = (
        fuse
        and parts is None
        and mode == "square"
        and h is not None
        and h.shape[-1] <= FUSE_MAX_COLUMNS
        and tuple(h.shape[:-1]) == tuple(g.shape[:-1])
    )
    if fused:
        # one GEMM Uᵀ[h g] and one [g h][b d]ᵀ instead of two each: same flops, half the
        # BLAS calls, and the 2B-wide products run closer to the GEMM rate for small B
        B = h.shape[-1]
        ac = mH(U, xp) @ xp.concat([h, g], axis=-1)
        a, c = ac[..., :B], ac[..., B:]
    elif parts is not None:
        a, b = parts
        c = mH(U_out, xp) @ g
    else:
        a = mH(U_in, xp) if h is None else mH(U_in, xp) @ h
        c = mH(U_out, xp) @ g
    if parts is None:
        b = M @ a
    d = mH(M, xp) @ c
    dT = mH(d, xp)
    m = T.shape[-1]
    # the signs on the small L-row factors, not on N × L products (one pass and array fewer)
    if fused:
        Ubar = xp.concat([g, h], axis=-1) @ mH(-xp.concat([b, d], axis=-1), xp)
    else:
        Ubar = _u_bar(g @ mH(-b, xp), -dT if h is None else h @ (-dT), m, mode, xp)
    h_bar = None
    if h is not None and need_h:
        Rg = g
        if mode == "embed":
            Rg = g[..., : h.shape[-2], :]
        elif mode == "project":
            pad = xp.zeros(
                tuple(g.shape[:-2]) + (h.shape[-2] - m, g.shape[-1]),
                dtype=g.dtype,
                device=device_of(g),
            )
            Rg = xp.concat([g, pad], axis=-2)
        h_bar = sum_to_shape(Rg - U_in @ d, tuple(h.shape), xp)
        h_bar = h_bar if h_bar.dtype == h_dtype else xp.astype(h_bar, h_dtype)
    Mbar = -(c @ mH(a, xp))
    T_bar = mH(Mbar, xp) if transpose else Mbar
    S_bar = None
    if need_s:
        S_bar = sum_to_shape(b @ dT if transpose else d @ mH(b, xp), tuple(T.shape), xp)
    return (
        sum_to_shape(Ubar, tuple(U.shape), xp),
        h_bar,
        sum_to_shape(T_bar, tuple(T.shape), xp),
        S_bar,
    )


def s_bar_from_t_bar(T: Any, T_bar: Any, xp: Any) -> Any:
    """S̄ = −Tᴴ T̄ Tᴴ (T = S⁻¹)."""
    Tt = mH(T, xp)
    return -(Tt @ (T_bar @ Tt))


def factors_vjp(U: Any, r: Any, U_bar: Any, S_bar: Any, xp: Any) -> Any:
    """V̄ from the cotangents of the unit columns ``U`` and of ``S = ½I + striu(UᴴU)``.

    Ū += U (P + Pᴴ) with P = striu(S̄) (only the strict upper part of S depends on U), then
    through u = v/‖v‖: v̄ = (ū − u Re(uᴴū)) / ‖v‖, and v̄ = 0 for zero columns (never NaN).
    Cost 2·N·L² + O(N·L).
    """
    P = xp.triu(S_bar, k=1)
    Y = U @ (P + mH(P, xp))
    if own_numpy(Y, U_bar):  # Y += Ū in place: no second N × L array
        import numpy as np

        return normalize_columns_vjp(U, r, np.add(Y, U_bar, out=Y), xp)
    return normalize_columns_vjp(U, r, U_bar + Y, xp)


def normalize_columns_vjp(U: Any, r: Any, U_bar: Any, xp: Any) -> Any:
    """Backward of :func:`normalize_columns`: v̄ = (ū − u Re(uᴴū)) / ‖v‖ per column, from
    du = (dv − u Re(uᴴdv)) / ‖v‖ (uᵀū for real columns; for complex ones only the real part
    of uᴴū is removed: d‖v‖ = Re(uᴴdv)); zero columns (r = 0) get v̄ = 0, never NaN. On
    NumPy the steps after u Re(uᴴū) write into that one new array
    (:func:`~householderla._lib.linalg.own_numpy`)."""
    proj = real_dot(U, U_bar, xp)
    nonzero = r > 0
    r_safe = xp.where(nonzero, r, xp.ones_like(r))
    out = U * proj
    if own_numpy(out, U_bar):
        import numpy as np

        np.subtract(U_bar, out, out=out)
        np.divide(out, r_safe, out=out)
        np.copyto(out, 0, where=~nonzero)
        return out
    return where0(xp, nonzero, (U_bar - out) / r_safe)


def is_lower_trapezoidal(V: Any, xp: Any) -> bool:
    """Whether V (..., N, L) has only zeros above its diagonal (LAPACK's and oRNN's layout);
    eager arrays only (one N·L comparison)."""
    return is_eager(V) and bool(xp.all(xp.triu(V, k=1) == 0))
