"""A square orthogonal layer's product in rows, x ↦ x Qᵀ, and its VJP, by the compact WY form
of unnormalised reflection vectors.

For V (N, L) real with columns v_j, Q = H(v₁)…H(v_L) = I − V S⁻¹ Vᵀ with

    S = ½ diag(δ) + striu(G),   G = VᵀV,   δ_j = ‖v_j‖²   (δ_j := 2 for v_j = 0, H(0) = I)

(Mhammedi, Hellicar, Rahman & Bailey, "Efficient orthogonal parametrisation of recurrent
neural networks using Householder reflections", ICML 2017, Proposition 1, eq. 12–13; the
"UT transform" of Joffrain, Low, Quintana-Ortí, van de Geijn & Van Zee, "Accumulating
Householder transformations, revisited", ACM TOMS 2006. Likhosherstov et al., AISTATS 2021,
Theorem 2 write it for unit columns U = V D⁻¹: their S_U = D⁻¹ S D⁻¹, the same Q). Without
the unit columns the map is a Gram matrix, two triangular solves and four GEMMs: nothing is
normalised, and T = S⁻¹ is never formed. A zero column gives a zero row and column of
striu(G), and a_j = v_jᵀh = 0, so b_j = 0 with the diagonal 1 set there: H(0) = I, and its
cotangent is 0 (the convention of :func:`.compact_wy.normalize_columns_vjp`).

Rows x (B, N), y = x Qᵀ (``householderla._torch_layer`` runs this as one autograd node):

    operator (B ≤ N):  a = x V,  b = a S⁻ᵀ,  y = x − b Vᵀ          4·N·L·B + 2·L²·B flops
    formed (B > N):    Z = S⁻¹ Vᵀ,  W = I − V Z,  y = x Wᵀ            3·N·L² + 2·N²·B flops

plus the Gram, N·L²·2 (in float64 for float32 V on CPU, as :func:`.compact_wy.cwy_factors`).

Backward, for the cotangent ḡ = ∂ℓ/∂y (B, N) — :func:`.compact_wy.lowrank_vjp` with M = S⁻¹,
h = xᵀ (or I), then the Gram's backward (``docs/theory/cwy.rst``, "One node for a small
layer"):

    c = ḡ V,  d = c S⁻¹           x̄ = ḡ − d Vᵀ
    S̄ = dᵀ b,  E = triu(S̄) + striu(S̄)ᵀ     (Ḡ = striu(S̄) + ½ diag(S̄), G symmetric)
    V̄ = V E − ḡᵀ b − xᵀ d

(for a zero column, E's diagonal entry multiplies the zero column, so the δ_j := 2 branch
needs no mask here; its b_j = d_j = 0 make the column's cotangent 0)

and for the formed path (W̄ = ḡᵀ x, x̄ = ḡ W): C = S⁻ᵀ Vᵀ W̄ (L, N), S̄ = C Zᵀ,
V̄ = V E − W̄ Zᵀ − Cᵀ. Every function takes ``xp``; real dtypes only.
"""

from __future__ import annotations

from typing import Any

from .._lib.checks import check_finite_norms
from .._lib.linalg import eye_like, solve_upper_triangular
from .._lib.namespace import accumulation_dtype_for, device_of
from .._lib.tracing import is_eager

__all__ = ["rows_factor", "rows_product", "rows_vjp"]


def _acc(x: Any, dtype: Any, xp: Any) -> Any:
    return x if x.dtype == dtype else xp.astype(x, dtype)


def rows_factor(V: Any, xp: Any) -> Any:
    """S = ½ diag(δ) + striu(VᵀV) (L, L) for V (N, L), in the accumulation dtype (float64
    for float32 on CPU), with δ_j := 2 for zero columns.

    NaN/Inf entries raise, naming the columns (eager arrays); so does a column whose ‖v‖²
    leaves the accumulation dtype's range (‖v‖ > 1e154 in float64), which the unit-column
    form (:func:`.compact_wy.normalize_columns`, scaled by max |v|) takes; a float64 column
    with ‖v‖ < 1e-154 counts as zero. float32 columns (squared in float64) have neither."""
    Va = _acc(V, accumulation_dtype_for(xp, V), xp)
    delta = xp.sum(Va * Va, axis=-2, keepdims=True)  # (1, L), the diagonal of VᵀV
    if is_eager(delta) and not bool(xp.all(xp.isfinite(delta))):
        check_finite_norms(xp.max(xp.abs(Va), axis=-2, keepdims=True), xp)  # NaN or Inf
        bad = [j for j in range(delta.shape[-1]) if not bool(xp.isfinite(delta[0, j]))]
        raise ValueError(
            f"V has column(s) {bad[:10]} whose squared norm overflows {Va.dtype}; "
            "rescale them (H(αv) = H(v))"
        )
    G = Va.mT @ Va
    L = G.shape[-1]
    half = xp.where(delta > 0, 0.5 * delta, xp.ones_like(delta))
    return xp.triu(G, k=1) + eye_like(xp, L, G.dtype, device_of(G)) * half


def rows_product(V: Any, S: Any, x: Any, xp: Any, formed: bool) -> tuple[Any, Any]:
    """(y, kept) with y = x Qᵀ for rows x (B, N); ``kept`` is what :func:`rows_vjp` reads:
    b = x V S⁻ᵀ (B, L), or with ``formed`` (W, Z) with Z = S⁻¹Vᵀ and W = I − V Z (N, N)."""
    if formed:
        Z = _acc(solve_upper_triangular(S, _acc(V.mT, S.dtype, xp), xp), V.dtype, xp)
        N = V.shape[-2]
        W = eye_like(xp, N, V.dtype, device_of(V)) - V @ Z
        return x @ W.mT, (W, Z)
    a = x @ V
    b = _acc(solve_upper_triangular(S, _acc(a.mT, S.dtype, xp), xp), V.dtype, xp).mT
    return x - b @ V.mT, b


def rows_vjp(
    V: Any, S: Any, x: Any, g: Any, kept: Any, xp: Any, formed: bool, need_x: bool
) -> tuple[Any, Any]:
    """(V̄, x̄) of :func:`rows_product` for the cotangent g (B, N) of y; x̄ is None unless
    ``need_x``. Cost: operator 6·N·L·B + 2·L²·B + 2·N·L², formed 2·N²·B (W̄) + 7·N·L²."""
    if formed:
        W, Z = kept
        Wbar = g.mT @ x
        C = _acc(solve_upper_triangular(S, _acc(V.mT @ Wbar, S.dtype, xp), xp, True), V.dtype, xp)
        Vbar = _gram_vjp(V, C @ Z.mT, xp) - Wbar @ Z.mT - C.mT
        return Vbar, (g @ W if need_x else None)
    b = kept
    c = g @ V
    d = _acc(solve_upper_triangular(S, _acc(c.mT, S.dtype, xp), xp, True), V.dtype, xp).mT
    Vbar = _gram_vjp(V, d.mT @ b, xp) - g.mT @ b - x.mT @ d
    return Vbar, (g - d @ V.mT if need_x else None)


def _gram_vjp(V: Any, Sbar: Any, xp: Any) -> Any:
    """V E, E = triu(S̄) + striu(S̄)ᵀ: the cotangent of V through S = ½ diag(δ) + striu(VᵀV)
    (dG = dVᵀV + VᵀdV with Ḡ = striu(S̄) + ½ diag(S̄) gives V (Ḡ + Ḡᵀ))."""
    return V @ (xp.triu(Sbar) + xp.triu(Sbar, k=1).mT)
