"""A square orthogonal layer's product in rows, x ↦ x Qᵀ, and its VJP, by the compact WY form
of unnormalised reflection vectors.

Q = I − V S⁻¹ Vᵀ, S = ½ diag(‖v_j‖²) + striu(VᵀV) (Mhammedi et al., ICML 2017, Proposition 1;
Joffrain et al., "Accumulating Householder transformations, revisited", ACM TOMS 2006): a Gram,
two triangular solves and four GEMMs, nothing normalised, T never formed; a zero column is
H(0) = I with cotangent 0. The layer (``householderla.torch._layer``) runs it as one autograd
node, applied (B ≤ N) or formed (B > N), in column blocks for any size; the backward is
``lowrank_vjp`` with M = S⁻¹ then the Gram's (``docs/theory/cwy.rst``, "One node for a
layer"). Every function takes ``xp``; real dtypes only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._lib.checks import check_finite_norms
from .._lib.linalg import (
    eye_like,
    row_major_copy,
    solve_upper_triangular,
    subtract_product,
    with_diagonal,
)
from .._lib.namespace import accumulation_dtype_for, device_of
from .._lib.tracing import is_eager

__all__ = [
    "blocks_factor",
    "blocks_product",
    "blocks_vjp",
    "column_blocks",
    "layer_forward",
    "layer_vjp",
    "rows_factor",
    "rows_gram",
    "rows_product",
    "rows_vjp",
]


def _acc(x: Any, dtype: Any, xp: Any) -> Any:
    return x if x.dtype == dtype else xp.astype(x, dtype)


def rows_gram(V: Any, xp: Any) -> Any:
    """G = VᵀV (L, L) for V (N, L) in the accumulation dtype (float64 for float32 on CPU):
    what :func:`rows_factor` reads, for a caller that checks its diagonal ‖v_j‖² first.
    2·N·L² flops."""
    Va = _acc(V, accumulation_dtype_for(xp, V), xp)
    return Va.mT @ Va


def rows_factor(V: Any, xp: Any, G: Any = None) -> Any:
    """S = ½ diag(δ) + striu(VᵀV) (L, L) for V (N, L), in the accumulation dtype (float64
    for float32 on CPU), with δ_j := 2 for zero columns; ``G``: VᵀV from :func:`rows_gram`
    (else computed here).

    NaN/Inf entries raise, naming the columns (eager arrays); so does a column whose ‖v‖²
    leaves the accumulation dtype's range (‖v‖ > 1e154 in float64), which the unit-column
    form (:func:`.compact_wy.normalize_columns`, scaled by max |v|) takes; a float64 column
    with ‖v‖ < 1e-154 counts as zero. float32 columns (squared in float64) have neither."""
    G = rows_gram(V, xp) if G is None else G
    delta = xp.linalg.diagonal(G)  # (..., L): ‖v_j‖²
    if is_eager(delta) and not bool(xp.all(xp.isfinite(delta))):
        Va = _acc(V, G.dtype, xp)
        check_finite_norms(xp.max(xp.abs(Va), axis=-2, keepdims=True), xp)  # NaN or Inf
        flat = xp.reshape(delta, (-1, delta.shape[-1]))
        bad = [j for j in range(flat.shape[-1]) if not bool(xp.all(xp.isfinite(flat[:, j])))]
        raise ValueError(
            f"V has column(s) {bad[:10]} whose squared norm overflows {Va.dtype}; "
            "rescale them (H(αv) = H(v))"
        )
    half = xp.where(delta > 0, 0.5 * delta, xp.ones_like(delta))
    return with_diagonal(xp.triu(G, k=1), half, xp)


def rows_product(V: Any, S: Any, x: Any, xp: Any, formed: bool) -> tuple[Any, Any]:
    """(y, kept) with y = x Qᵀ for rows x (B, N); ``kept`` is what :func:`rows_vjp` reads:
    b = x V S⁻ᵀ (B, L), or with ``formed`` (W, Z) with Z = S⁻¹Vᵀ and W = I − V Z (N, N)."""
    if formed:
        Z = _acc(solve_upper_triangular(S, _acc(V.mT, S.dtype, xp), xp), V.dtype, xp)
        N = V.shape[-2]
        W = eye_like(xp, N, V.dtype, device_of(V)) - V @ Z
        return x @ W.mT, (W, Z)
    y, kept = blocks_product(V, [S], x, xp, [(0, 0, V.shape[-1])])
    return y, kept[0][1]


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
    return blocks_vjp(V, [S], g, [(x, kept)], xp, [(0, 0, V.shape[-1])], need_x)


def column_blocks(L: int, nb: int, trapezoidal: bool) -> list[tuple[int, int, int]]:
    """(row, s, e) for the column blocks [s, e) of ``nb`` reflectors (first block first):
    block b holds reflectors s…e−1 and reads rows ``row``… of V (row = s for lower-trapezoidal
    V, whose block b is zero above row s, as LAPACK's ``?larfb`` skips; 0 otherwise).
    ``nb ≥ L`` gives the single block [(0, 0, L)]."""
    nb = max(1, min(nb, L)) if L else 1
    return [(s if trapezoidal else 0, s, min(s + nb, L)) for s in range(0, L, nb)] or [(0, 0, 0)]


def blocks_factor(V: Any, xp: Any, blocks: list[tuple[int, int, int]]) -> list[Any]:
    """[S_b] = :func:`rows_factor` of each block V[row:, s:e] (N·L·nb flops for the Grams in
    all, instead of the single block's N·L²)."""
    return [rows_factor(V[..., row:, s:e], xp) for row, s, e in blocks]


def _minus_tail(z: Any, row: int, b: Any, Vb: Any, xp: Any, inplace: bool) -> Any:
    """z with its columns row… replaced by z[:, row:] − b Vbᵀ: in place (torch's ``addmm_``,
    :func:`~householderla._lib.linalg.subtract_product`), or as a new array."""
    if inplace:
        subtract_product(z[..., row:], b, Vb.mT, xp)
        return z
    tail = z[..., row:] - b @ Vb.mT
    return xp.concat([z[..., :row], tail], axis=-1) if row else tail


def blocks_product(
    V: Any,
    Ss: list[Any],
    x: Any,
    xp: Any,
    blocks: list[tuple[int, int, int]],
    inplace: bool = False,
    need_y: bool = True,
) -> tuple[Any, list[tuple[Any, Any]]]:
    """(y, kept) with y = x Qᵀ for rows x (B, N) and Q = Q₁⋯Q_m, Q_b = I − V_b S_b⁻¹ V_bᵀ
    the blocks of :func:`column_blocks` (y = x Q_mᵀ ⋯ Q₁ᵀ: the last block first).

    Block b on the columns row… of z: a = z V_b, b = a S_b⁻ᵀ, z −= b V_bᵀ; 4·(N − row)·nb·B
    + 2·nb²·B flops. ``kept`` (backward order, block 1 first): each block's input columns
    z[:, row:] and its b, what :func:`blocks_vjp` reads. ``inplace`` (a mutable namespace,
    2-D x: torch, NumPy): the updates run inside the GEMM on one copy of x, and each block's
    input columns are copied for ``kept``; otherwise every update makes a new array.
    ``need_y=False`` (a VJP, which reads ``kept`` only): block 1, applied last, skips its
    update (2·(N − row)·nb·B flops, and in place the copy of its input) and y is None."""
    z = row_major_copy(x, xp) if inplace and (need_y or len(blocks) > 1) else x
    kept = []
    for i, ((row, s, e), S) in reversed(list(enumerate(zip(blocks, Ss, strict=True)))):
        Vb = V[..., row:, s:e]
        final = i == 0 and not need_y  # no update follows: z is this block's input as it is
        if not inplace or final:
            zin = z[..., row:]
        elif i == len(blocks) - 1:  # the first block applied reads x itself, unchanged
            zin = x[..., row:]
        else:
            zin = row_major_copy(z[..., row:], xp)
        a = z[..., row:] @ Vb
        b = _acc(solve_upper_triangular(S, _acc(a.mT, S.dtype, xp), xp), V.dtype, xp).mT
        if not final:
            z = _minus_tail(z, row, b, Vb, xp, inplace)
        kept.append((zin, b))
    return (z if need_y else None), kept[::-1]


def blocks_vjp(
    V: Any,
    Ss: list[Any],
    g: Any,
    kept: list[tuple[Any, Any]],
    xp: Any,
    blocks: list[tuple[int, int, int]],
    need_x: bool,
    inplace: bool = False,
) -> tuple[Any, Any]:
    """(V̄, x̄) of :func:`blocks_product` for the cotangent g (B, N) of y; x̄ is None unless
    ``need_x``. Block by block, first block first (the reverse of the forward), each the
    single block's rule (:func:`rows_vjp`) on its columns row… with the cotangent ḡ of its
    output: c = ḡ V_b, d = c S_b⁻¹, V̄_b = V_b E(dᵀb) − ḡᵀ b − zᵀ d, then ḡ −= d V_bᵀ (the
    cotangent of its input). 8·(N − row)·nb·B + 2·(N − row)·nb² flops a block."""
    gb = row_major_copy(g, xp) if inplace else g
    cols = []
    last = len(blocks) - 1
    # NumPy, in place, several blocks: each block's V̄ is written into its columns of one
    # array (matmul(out=), the GEMMs with β = 1), not concatenated from per-block arrays:
    # fresh memory costs a page fault per 4 KiB on every call once glibc has trimmed its heap
    # (2 MB fewer at N = 1024, L = 256)
    whole = None
    if inplace and last and type(V) is np.ndarray and V.ndim == 2:
        whole = np.empty(V.shape, dtype=V.dtype)
    for i, ((row, s, e), S, (z, b)) in enumerate(zip(blocks, Ss, kept, strict=True)):
        Vb = V[..., row:, s:e]
        gt = gb[..., row:]
        c = gt @ Vb
        d = _acc(solve_upper_triangular(S, _acc(c.mT, S.dtype, xp), xp, True), V.dtype, xp).mT
        if whole is not None:
            whole[:row, s:e] = 0
        Vbar = _gram_vjp(Vb, d.mT @ b, xp, out=None if whole is None else whole[row:, s:e])
        if inplace and Vbar.ndim == 2:  # (torch's addmm_, NumPy's ?gemm: no temporaries)
            subtract_product(Vbar, gt.mT, b, xp)
            subtract_product(Vbar, z.mT, d, xp)
        else:
            Vbar = Vbar - gt.mT @ b - z.mT @ d
        if whole is None:
            if row:
                shape = (*Vbar.shape[:-2], row, e - s)
                pad = xp.zeros(shape, dtype=Vbar.dtype, device=device_of(V))
                Vbar = xp.concat([pad, Vbar], axis=-2)
            cols.append(Vbar)
        if need_x or i < last:
            gb = _minus_tail(gb, row, d, Vb, xp, inplace)
    if whole is not None:
        Vbar = whole
    else:
        Vbar = cols[0] if len(cols) == 1 else xp.concat(cols, axis=-1)
    return Vbar, (gb if need_x else None)


def layer_forward(
    V: Any,
    x: Any,
    xp: Any,
    blocks: list[tuple[int, int, int]],
    formed: bool,
    inplace: bool = False,
) -> tuple[Any, tuple[list[Any], Any]]:
    """(y, state) with y = x Qᵀ for rows x (B, N) by :func:`blocks_product` (one block or
    several); a formed W from one block by :func:`rows_product` (W = I − V Z), from several
    by the blocks applied to the identity (P = Qᵀ), then x P. ``state`` is what
    :func:`layer_vjp` reads (the S_b and the kept products)."""
    Ss = blocks_factor(V, xp, blocks)
    if not formed:
        y, kept = blocks_product(V, Ss, x, xp, blocks, inplace)
        return y, (Ss, kept)
    if len(blocks) == 1:
        y, kept = rows_product(V, Ss[0], x, xp, True)
        return y, (Ss, kept)
    eye = eye_like(xp, V.shape[-2], V.dtype, device_of(V))
    P, kept = blocks_product(V, Ss, eye, xp, blocks, inplace)
    return x @ P, (Ss, (P, kept))


def layer_vjp(
    V: Any,
    x: Any,
    g: Any,
    state: tuple[list[Any], Any],
    xp: Any,
    blocks: list[tuple[int, int, int]],
    formed: bool,
    need_x: bool,
    inplace: bool = False,
) -> tuple[Any, Any]:
    """(V̄, x̄) of :func:`layer_forward` for the cotangent g (B, N) of y (x̄ None unless
    ``need_x``); the formed path of several blocks: P̄ = xᵀ g into :func:`blocks_vjp`,
    x̄ = g Pᵀ."""
    Ss, kept = state
    if not formed:
        return blocks_vjp(V, Ss, g, kept, xp, blocks, need_x, inplace)
    if len(blocks) == 1:
        return rows_vjp(V, Ss[0], x, g, kept, xp, True, need_x)
    P, kept = kept
    Vbar, _ = blocks_vjp(V, Ss, x.mT @ g, kept, xp, blocks, False, inplace)
    return Vbar, (g @ P.mT if need_x else None)


def _gram_vjp(V: Any, Sbar: Any, xp: Any, out: Any = None) -> Any:
    """V E, E = triu(S̄) + striu(S̄)ᵀ: the cotangent of V through S = ½ diag(δ) + striu(VᵀV)
    (dG = dVᵀV + VᵀdV with Ḡ = striu(S̄) + ½ diag(S̄) gives V (Ḡ + Ḡᵀ)); into ``out`` (a
    NumPy view) when given."""
    E = xp.triu(Sbar) + xp.triu(Sbar, k=1).mT
    if out is None:
        return V @ E
    np.matmul(V, E, out=out)
    return out
