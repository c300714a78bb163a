"""Compact WY kernels for lower-trapezoidal reflectors (oRNN / LAPACK layout), by blocked GEMMs.

When column j of U is zero in rows < j (Mhammedi et al., ICML 2017, eq. 9) the apply of
:func:`householderla._agnostic.compact_wy.lowrank_apply` needs 4·N·L·B − L²·B flops (their
Table 2) instead of 4·N·L·B + 2·L²·B. The zeros are skipped by k column blocks, one GEMM each
on the rows (or columns) the block can reach: pure Array API, batched, jit-friendly, wasting
3·L²·B/k. Blocked GEMMs rather than BLAS ``trmm``: torch and JAX have none, and on NumPy they
were as fast (``benchmarks/results/tuning.md``). ``bounds`` are the (start, stop) column blocks.
"""

from __future__ import annotations

from typing import Any

from .._lib.linalg import sum_to_shape
from .._lib.namespace import device_of, mH
from .._lib.tuning import TRAPEZOIDAL_BLOCK as BLOCK
from .._lib.tuning import TRAPEZOIDAL_FEW_RHS as FEW_RHS
from .._lib.tuning import TRAPEZOIDAL_MAX_BLOCKS as MAX_BLOCKS
from .._lib.tuning import TRAPEZOIDAL_MIN_COLUMNS as MIN_COLUMNS
from .compact_wy import normalize_columns_vjp


def use_structured(N: int, L: int, B: int) -> bool:
    """Whether the blocked products beat the dense ones for an apply with V (N, L), h (N, B)."""
    if L < MIN_COLUMNS or 2 * L < N:
        return False
    return B >= FEW_RHS or (4 * L >= 3 * N and L >= 2 * MIN_COLUMNS)


def use_structured_vjp(N: int, L: int) -> bool:
    """Whether :func:`apply_vjp` beats the dense backward: L ≥ 256 and L ≥ N/2 (measured as
    above, float64: n = 1024, m = 1023: 1.50× (B = 1) / 1.48× (B = 64); m = 512: 1.25× /
    1.10×; n = 512, m = 511: 1.21× / 1.36×, m = 256: 1.46× / 0.96×; n = 1024, m = 256, B = 1:
    0.61×)."""
    return L >= MIN_COLUMNS and 2 * L >= N


def column_blocks(L: int) -> list[tuple[int, int]]:
    """k = clip(⌊L / BLOCK⌋, 1, MAX_BLOCKS) contiguous column ranges of nearly equal width
    (module constants read at call time, so tests can shrink them)."""
    k = max(1, min(MAX_BLOCKS, L // BLOCK))
    edges = [(i * L) // k for i in range(k + 1)]
    return [(edges[i], edges[i + 1]) for i in range(k) if edges[i + 1] > edges[i]]


def trapezoid_t_matmul(U: Any, h: Any, xp: Any, bounds: list[tuple[int, int]]) -> Any:
    """Uᴴh for lower-trapezoidal U (..., K, L) and h (..., K, B): block [s, e) of the result
    is U[s:, s:e]ᴴ h[s:] (rows < s of those columns are zero)."""
    return xp.concat([mH(U[..., s:, s:e], xp) @ h[..., s:, :] for s, e in bounds], axis=-2)


def trapezoid_matmul(U: Any, b: Any, xp: Any, bounds: list[tuple[int, int]]) -> Any:
    """U b for lower-trapezoidal U (..., K, L) and b (..., L, B): rows [s, e) of the result
    are U[s:e, :e] b[:e] (columns ≥ e are zero there); rows ≥ L are a full GEMM."""
    K, L = U.shape[-2], U.shape[-1]
    parts = [U[..., s:e, :e] @ b[..., :e, :] for s, e in bounds]
    if K > L:
        parts.append(U[..., L:, :] @ b)
    return xp.concat(parts, axis=-2)


def triu_matmul(T: Any, a: Any, xp: Any, bounds: list[tuple[int, int]], transpose: bool) -> Any:
    """T a (or Tᴴ a) for upper-triangular T (..., L, L) and a (..., L, B), blockwise:
    (T a)[s:e] = T[s:e, s:] a[s:],  (Tᴴ a)[s:e] = T[:e, s:e]ᴴ a[:e]."""
    if transpose:
        parts = [mH(T[..., :e, s:e], xp) @ a[..., :e, :] for s, e in bounds]
    else:
        parts = [T[..., s:e, s:] @ a[..., s:, :] for s, e in bounds]
    return xp.concat(parts, axis=-2)


def lowrank_apply(U: Any, T: Any, h: Any, xp: Any, *, transpose: bool, mode: str) -> Any:
    """:func:`householderla._agnostic.compact_wy.lowrank_apply` for lower-trapezoidal U and h given
    (not the identity): the same three maps and roles, 4·N·L·B − L²·B + 3·L²·B/k flops
    (square mode). U's entries above the diagonal are never read."""
    L = U.shape[-1]
    bounds = column_blocks(L)
    U_in = U[..., :L, :] if mode == "embed" else U
    U_out = U[..., :L, :] if mode == "project" else U
    a = trapezoid_t_matmul(U_in, h, xp, bounds)
    b = triu_matmul(T, a, xp, bounds, transpose)
    ub = trapezoid_matmul(U_out, b, xp, bounds)
    if mode == "square":
        return h - ub
    if mode == "embed":  # [h; 0] − U b
        return xp.concat([h - ub[..., :L, :], -ub[..., L:, :]], axis=-2)
    return h[..., :L, :] - ub  # project


def apply_vjp(U: Any, T: Any, r: Any, h: Any, g: Any, xp: Any) -> tuple[Any, Any]:
    """Backward of y = h − U T Uᵀ h through the factors, for lower-trapezoidal unit columns U
    (..., N, L) with norms r (..., 1, L): returns (V̄, h̄) with V̄ lower trapezoidal (exactly
    zero above the diagonal) and of U's shape, h̄ of h's shape.

    The formulas of :func:`~householderla._agnostic.compact_wy.lowrank_vjp` and
    :func:`~householderla._agnostic.compact_wy.factors_vjp` (docs/theory/vjp.rst), each product
    restricted to the blocks that can be nonzero: a = Uᵀh, b = Ta, c = Uᵀg, d = Tᵀc
    (trapezoidal and triangular), h̄ = g − U d, Ū = −g bᵀ − h dᵀ on the lower trapezoid only
    (one GEMM per column block with inner dimension 2B), Ū += U (P + Pᵀ), P = striu(d bᵀ), on
    the lower trapezoid only, then v̄ = (ū − u uᵀū)/‖v‖ and the mask. Flops
    10·N·L·B − 3·L²·B + 2·N·L² − L³ (+ O(L²·B/k)), against 10·N·L·B + 4·L²·B + 2·N·L²
    for the dense products.
    """
    N, L = U.shape[-2], U.shape[-1]
    bounds = column_blocks(L)
    a = trapezoid_t_matmul(U, h, xp, bounds)
    b = triu_matmul(T, a, xp, bounds, False)
    c = trapezoid_t_matmul(U, g, xp, bounds)
    d = triu_matmul(T, c, xp, bounds, True)
    h_bar = g - trapezoid_matmul(U, d, xp, bounds)
    # −[g h] [b d]ᵀ on the lower trapezoid: column block [s, e) from rows s on
    gh = xp.concat([g, xp.broadcast_to(h, tuple(g.shape))], axis=-1)
    bd = xp.concat([xp.broadcast_to(b, tuple(d.shape)), d], axis=-1)
    P = xp.triu(d @ mH(b, xp), k=1)
    # broadcasting may add batch axes (h, g batched against one U): sum them out first
    P = sum_to_shape(P, tuple(U.shape[:-2]) + (L, L), xp)
    W = P + mH(P, xp)
    blocks = []
    for s, e in bounds:
        shape = tuple(U.shape[:-2]) + (N - s, e - s)
        out = -sum_to_shape(gh[..., s:, :] @ mH(bd[..., s:e, :], xp), shape, xp)
        # + U (P + Pᵀ) on the same block: U[s:, :] is zero in columns > its row, and rows
        # s..e−1 only reach column e−1; rows ≥ e need every column up to L
        top = U[..., s:e, :e] @ W[..., :e, s:e]
        rest = U[..., e:, :] @ W[..., :, s:e]
        out = out + xp.concat([top, rest], axis=-2)
        pad = xp.zeros(tuple(out.shape[:-2]) + (s, e - s), dtype=out.dtype, device=device_of(U))
        blocks.append(xp.concat([pad, out], axis=-2) if s else out)
    U_bar = xp.concat(blocks, axis=-1)
    V_bar = xp.tril(normalize_columns_vjp(U, r, U_bar, xp))
    return V_bar, sum_to_shape(h_bar, tuple(h.shape), xp)
