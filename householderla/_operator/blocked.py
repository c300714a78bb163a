"""Blocked compact WY: Q = H(v₁)…H(v_L) applied as a product of small CWY blocks.

Blocks of ``nb`` reflectors give Q = Q₁⋯Q_m, Q_b = I − U_b T_b U_bᵀ (Likhosherstov et al.,
AISTATS 2021, Theorem 2; the blocking of LAPACK's ``?larft``/``?larfb`` and of FastH, Mathiasen
et al., NeurIPS 2020): factors N·L·nb + L·nb²/3 flops instead of N·L² + L³/3, apply
4·N·L·B + L·nb·B instead of 4·N·L·B + L²·B. So a first product with B ≪ L (a layer's forward, a
fresh ``hl.cwy(V) @ h``) costs a fraction of the single block. Each block runs through the rule
tables, so the backward is the blocks' VJPs in reverse order, each reusing its forward's factors.
"""

from __future__ import annotations

from typing import Any

import array_api_compat as aac

from .._autodiff import call, route
from .._lib.mixed import widen
from .._lib.namespace import device_of, is_half
from .._lib.tuning import CWY_BLOCK as BLOCK
from .._lib.tuning import CWY_BLOCKS_MIN_L as MIN_L
from .._lib.tuning import CWY_BLOCKS_MIN_L_GRAPH as MIN_L_GRAPH

__all__ = ["BLOCK", "MIN_L", "MIN_L_GRAPH", "apply_blocks", "block_factors", "use_blocks"]


def use_blocks(L: int, B: int, graph: bool = False) -> bool:
    """Whether the first product of a square operator with L reflectors and B columns should
    build blocks instead of the single factor pair: L ≥ MIN_L and B ≤ L/4 (beyond, the
    factor build is a small part of the single block's cost and its one GEMM pair wins).

    With a backward to follow (``graph``: torch autograd records the product) blocks win at
    every B once L ≥ MIN_L_GRAPH: the single pair's backward adds 2·N·L² (Ū's Gram term) and
    4·L³ (S̄ = −Tᵀ T̄ Tᵀ) to its forward's N·L² + L³/3, the blocks' 2·N·L·nb and 4·L·nb².
    Measured forward + backward against the single pair: ``benchmarks/results/tuning.md``."""
    if graph:
        return L >= MIN_L_GRAPH
    return L >= MIN_L and 4 * B <= L


def block_factors(
    V: Any, xp: Any, trapezoidal: bool = False, sdiag: Any = None
) -> list[tuple[int, Any, Any]]:
    """[(s, U_b, T_b)] for the column blocks [s, s + nb) of V (..., N, L), first block first,
    each through the ``cwy_factors`` rule of the call's route (with the block's slice of the
    diagonal ``sdiag`` of S for LAPACK's complex reflectors, ``_operator.factors``). For
    lower-trapezoidal V (LAPACK's and oRNN's layout) block b is zero in rows < s: its factors
    cover rows s… only and its products touch those rows only, as LAPACK's ``?larfb`` does
    (4·N·L·B − 2·L²·B flops for the apply instead of 4·N·L·B); s = 0 otherwise."""
    L = V.shape[-1]
    r = route(xp, V)
    V = widen(V, xp)  # half precision: float32 factors
    if aac.is_torch_namespace(xp) and L > BLOCK:
        return _stacked_block_factors(V, xp, r, trapezoidal, sdiag)
    out = []
    for s in range(0, L, BLOCK):
        row, e = (s if trapezoidal else 0), min(s + BLOCK, L)
        sd = None if sdiag is None else sdiag[..., s:e]
        U, T, _ = call(r, "cwy_factors", xp, V[..., row:, s:e], sd)
        out.append((row, U, T))
    return out


def _stacked_block_factors(
    V: Any, xp: Any, r: str, trapezoidal: bool, sdiag: Any
) -> list[tuple[int, Any, Any]]:
    """:func:`block_factors` by one call of the ``cwy_factors`` rule on the stack of all m
    blocks (..., m, N, nb) — one autograd node forward and backward instead of m, whose
    Python and dispatch outweigh a small block's GEMMs (``benchmarks/results/tuning.md``).
    The last
    block is padded with zero columns (H(0) = I: the leading w × w block of the padded
    T = S⁻¹ is the unpadded block's T, S being upper triangular), its sdiag with ½.
    Trapezoidal blocks are formed at full height (rows < s of tril(V)'s block b are zero, and
    so are U_b's) and sliced to rows s… after: the same factors for N·L·nb more Gram flops."""
    N, L = V.shape[-2], V.shape[-1]
    m = -(-L // BLOCK)
    pad = m * BLOCK - L
    if pad:
        zeros = xp.zeros((*V.shape[:-1], pad), dtype=V.dtype, device=device_of(V))
        V = xp.concat([V, zeros], axis=-1)
        if sdiag is not None:
            half = xp.full(
                (*sdiag.shape[:-1], pad), 0.5, dtype=sdiag.dtype, device=device_of(sdiag)
            )
            sdiag = xp.concat([sdiag, half], axis=-1)
    batch = tuple(V.shape[:-2])
    Vb = xp.moveaxis(xp.reshape(V, (*batch, N, m, BLOCK)), -2, -3)  # (..., m, N, nb)
    sd = None if sdiag is None else xp.reshape(sdiag, (*sdiag.shape[:-1], m, BLOCK))
    U, T, _ = call(r, "cwy_factors", xp, Vb, sd)
    out = []
    for b in range(m):
        s, w = b * BLOCK, min(BLOCK, L - b * BLOCK)
        row = s if trapezoidal else 0
        out.append((row, U[..., b, row:, :w], T[..., b, :w, :w]))
    return out


def apply_blocks(blocks: list[tuple[int, Any, Any]], h: Any, xp: Any, transpose: bool) -> Any:
    """Q h = Q₁(Q₂(⋯(Q_m h))) (``transpose``: Qᵀ h = Q_mᵀ(⋯(Q₁ᵀ h))) for h (..., N, B); a
    block whose factors start at row s > 0 leaves rows < s as they are."""
    order = blocks if transpose else blocks[::-1]
    dtype = h.dtype
    if is_half(xp, dtype):  # half-precision h: all blocks in float32, one rounding at the end
        h = xp.astype(h, blocks[0][1].dtype)
    for s, U, T in order:
        if U.dtype != h.dtype:
            U, T = xp.astype(U, h.dtype), xp.astype(T, h.dtype)
        x = h[..., s:, :] if s else h
        y = call(route(xp, U, T, x), "lowrank", xp, U, T, x, transpose, "square")
        h = xp.concat([h[..., :s, :], y], axis=-2) if s else y
    return h if h.dtype == dtype else xp.astype(h, dtype)
