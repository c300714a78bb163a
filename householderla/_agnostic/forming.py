"""Forming the dense matrix H(v₁)…H(v_L) (or its first columns) straight from V.

Two routes without the normalised factors U, T of :mod:`.compact_wy`: :func:`structured_matrix`
for lower-trapezoidal V, blocked like LAPACK's orgqr (4N³/3 flops for L = N), and
:func:`dense_matrix` for any V, the one-shot I − V S⁻¹ Vᵀ with S = striu(VᵀV) + ½ diag(VᵀV)
(Mhammedi et al., ICML 2017, Proposition 1). Both need writeable arrays and run only where no
autodiff follows; complex V takes conjugate transposes.
"""

from __future__ import annotations

from typing import Any

import array_api_compat as aac

from .._lib.linalg import (
    eye_like,
    gram_upper,
    solve_upper_triangular,
    subtract_product,
    where0,
    workspace,
)
from .._lib.namespace import accumulation_dtype_for, device_of, is_complex, mH, real_dtype
from .._lib.tuning import STRUCTURED_BLOCK

__all__ = ["STRUCTURED_BLOCK", "dense_matrix", "structured_matrix"]


def _s_from_gram(G: Any, d: Any, xp: Any, coef: Any = 0.5) -> tuple[Any, Any]:
    """(S, nonzero): S = striu(G) + coef·diag(G) with S_kk = 1 where d_k = G_kk = 0."""
    L = G.shape[-1]
    eye = eye_like(xp, L, G.dtype, device_of(G))
    nonzero = d > 0
    diag = xp.where(nonzero, coef * d, xp.ones_like(coef * d))
    return xp.triu(G, k=1) + eye * diag[..., None, :], nonzero


def _quiet(gram: Any, V: Any, xp: Any) -> Any:
    """``gram(V, xp)`` without NumPy's over/underflow warnings: they are detected on the
    diagonal and handled by rescaling (:func:`_unnormalized_s`)."""
    if aac.is_numpy_namespace(xp):
        import numpy as np

        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            return gram(V, xp)
    return gram(V, xp)


def _gram_matmul(V: Any, xp: Any) -> Any:
    return mH(V, xp) @ V


def _solve_upper_same_blas(S: Any, W: Any, xp: Any) -> Any:
    """S⁻¹ W for small upper-triangular S inside a loop of NumPy GEMMs: NumPy's own LAPACK
    (``inv``: LU of a triangular matrix pivots nothing, so it is the triangular inverse),
    never SciPy's. NumPy and SciPy ship separate OpenBLAS builds with separate thread pools;
    alternating between them stalls at every switch (``benchmarks/results/tuning.md``)."""
    if aac.is_numpy_namespace(xp):
        return xp.linalg.inv(xp.triu(S)) @ W
    return solve_upper_triangular(S, W, xp)


def _norm_range(dtype: Any, xp: Any) -> tuple[float, float]:
    """Safe range of ‖v‖² for the unnormalised Gram: squares and their sums of up to 2^100
    terms stay normal and finite (float64: 2^±900; float32: 2^±100)."""
    e = 900.0 if real_dtype(xp, dtype) == xp.float64 else 100.0
    return 2.0**-e, 2.0**e


def _unnormalized_s(V: Any, xp: Any, syrk: bool = True, sdiag: Any = None) -> tuple[Any, Any]:
    """(V, S) with H(v₁)…H(v_L) = I − V S⁻¹ Vᵀ, S = striu(VᵀV) + ½ diag(VᵀV) (Mhammedi et al., ICML
    2017 Proposition 1): no normalisation, so no rounding of the given vectors. Zero columns get
    S_kk = 1 and are zeroed, giving H(0) = I. N·L² flops (syrk on a single NumPy matrix).

    ‖v_k‖² is read from the diagonal of the same Gram product as the off-diagonal entries:
    consistent rounding of τ_k and of the v_iᵀv_j keeps Q orthogonal (a separate sum(V*V)
    gave 1.07e-13 instead of 7.6e-14 at N = 1024). H(cv) = H(v) for c ≠ 0, so a column whose
    ‖v‖² would under- or overflow (‖v‖ outside ~2^±450 in float64) is first multiplied by a
    power of two, 2^−⌊log₂ max|v|⌋, which is exact; that costs one more pass and Gram, and
    only happens for such columns. Eager arrays only (the check is data dependent).
    ``syrk=False`` forms the Gram matrix with ``@`` (see :func:`structured_matrix`).
    ``sdiag`` (..., L) replaces the ½ of the diagonal (generalised reflectors,
    :mod:`householderla._operator.factors`): S_kk = sdiag_k ‖v_k‖², LAPACK's 1/τ_k.
    """
    gram = gram_upper if syrk else _gram_matmul
    G = _quiet(gram, V, xp)
    d = _real_diagonal(G, xp)  # (..., L)
    lo, hi = _norm_range(V.dtype, xp)
    in_range = (d >= lo) & (d <= hi)
    if not bool(xp.all(in_range)):
        colmax = xp.max(xp.abs(V), axis=-2, keepdims=True)  # (..., 1, L)
        bad = (colmax > 0) & ~in_range[..., None, :]
        if bool(xp.any(bad)):
            e = -xp.floor(xp.log2(xp.where(bad, colmax, xp.ones_like(colmax))))
            half = xp.floor(e / 2)  # two exact steps: 2^1074 (subnormal columns) overflows
            V = (V * 2.0**half) * 2.0 ** (e - half)
            G = _quiet(gram, V, xp)
            d = _real_diagonal(G, xp)
    if aac.is_numpy_namespace(xp) and G.ndim == 2 and bool(xp.all(d > 0)):
        # no zero column: S in place in the fresh Gram (no N×L or L×L copies); the strict
        # lower part is left as is — triangular solvers read the upper triangle only
        import numpy as np

        idx = np.arange(G.shape[-1])
        G[idx, idx] = 0.5 * d if sdiag is None else xp.astype(sdiag, G.dtype) * d
        return V, G
    S, nonzero = _s_from_gram(G, d, xp, 0.5 if sdiag is None else xp.astype(sdiag, G.dtype))
    return where0(xp, nonzero[..., None, :], V), S


def _real_diagonal(G: Any, xp: Any) -> Any:
    """The diagonal ‖v_k‖² of a Gram matrix, real (the imaginary part of vᴴv is zero)."""
    d = xp.linalg.diagonal(G)
    return xp.real(d) if is_complex(d.dtype) else d


def _identity(xp: Any, V: Any, ncols: int, dtype: Any) -> Any:
    N, batch = V.shape[-2], tuple(V.shape[:-2])
    eye = xp.eye(N, ncols, dtype=dtype, device=device_of(V))
    return xp.asarray(xp.broadcast_to(eye, (*batch, N, ncols)), copy=True)


def structured_matrix(
    V: Any, xp: Any, ncols: int | None = None, block: int = STRUCTURED_BLOCK, *, sdiag: Any = None
) -> Any:
    """First ``ncols`` (default N) columns of H(v₁)…H(v_L) for lower-trapezoidal V (..., N, L),
    like LAPACK's orgqr.

    Blocks of reflectors v_s … v_{e−1}, last block first, are applied to the trailing
    submatrix they act on (v_k is zero above row k): Q[s:, s:] ← Q[s:, s:] − V_b S_b⁻¹ V_bᵀ
    Q[s:, s:], with unnormalised factors. Before block b is applied, Q[s:, s:] is
    [[I, 0], [0, Q[e:, e:]]] (the later blocks touched only rows and columns ≥ e), so
    V_bᵀ Q[s:, s:] = [V_b[:e−s]ᵀ, V_b[e−s:]ᵀ Q[e:, e:]]: the GEMM only runs on the trailing
    block, as in orgqr's larfb. About 4N²L − 2(N+N)L² + 4L³/3 flops as orgqr (vs 2N²L + NL²
    for the one-shot formula), all in GEMMs and trsm; accumulated in float64 for float32
    input on CPU. Measured at N=1024 on LAPACK's reflectors: ‖QᵀQ − I‖_F 7.4e-14 (orgqr
    7.7e-14, one-shot CWY 1.35e-13) in float64. Requires a namespace with writeable arrays
    (NumPy, torch, CuPy).
    """
    acc = accumulation_dtype_for(xp, V)
    Va = V if V.dtype == acc else xp.astype(V, acc)
    L = V.shape[-1]
    ncols = V.shape[-2] if ncols is None else ncols
    Q = _identity(xp, V, ncols, acc)
    work = workspace(tuple(Q.shape[:-2]), Q.shape[-2], ncols, Q, xp)  # (subtract_product)
    for s in range(((L - 1) // block) * block, -1, -block):
        e = min(s + block, L)
        sb = None if sdiag is None else sdiag[..., s:e]
        Vb, Sb = _unnormalized_s(Va[..., s:, s:e], xp, syrk=False, sdiag=sb)
        head = max(min(e, ncols) - s, 0)  # identity columns s … min(e, ncols) − 1
        parts = [mH(Vb[..., :head, :], xp)] if head else []
        if ncols > e:
            parts.append(mH(Vb[..., e - s :, :], xp) @ Q[..., e:, e:])
        if not parts:
            continue
        W = parts[0] if len(parts) == 1 else xp.concat(parts, axis=-1)
        subtract_product(Q[..., s:, s:], Vb, _solve_upper_same_blas(Sb, W, xp), xp, work)
    return Q if acc == V.dtype else xp.astype(Q, V.dtype)


def dense_matrix(V: Any, xp: Any, ncols: int | None = None, *, sdiag: Any = None) -> Any:
    """First ``ncols`` (default N) columns of H(v₁)…H(v_L) = I − V S⁻¹ Vᵀ for any V (..., N, L)
    in one shot, with unnormalised factors (Mhammedi et al., ICML 2017, Proposition 1).

    G = VᵀV by syrk (N·L²), W = S⁻¹ V[:ncols]ᵀ by one triangular solve (L²·ncols), then
    Q = E − V W by one GEMM (2·N·L·ncols): 4·N³ flops for L = ncols = N, against
    2N²L + NL² + L³/3 + normalisation passes for the operator's (U, T) route, which also
    forms T explicitly (trtri) and multiplies by it. At N = L = 1024 float64 (2-core CPU)
    this is the route that beats a Cayley ``solve``. Accumulates in float64 for float32 input
    on CPU; needs writeable arrays (NumPy, torch, CuPy).
    """
    acc = accumulation_dtype_for(xp, V)
    Va = V if V.dtype == acc else xp.astype(V, acc)
    ncols = V.shape[-2] if ncols is None else ncols
    Vz, S = _unnormalized_s(Va, xp, sdiag=sdiag)
    if aac.is_numpy_namespace(xp) and Vz.ndim == 2 and not is_complex(Vz.dtype):
        Q = _dense_matrix_scipy_blas(Vz, S, ncols)
        return Q if acc == V.dtype else xp.astype(Q, V.dtype)
    W = solve_upper_triangular(S, mH(Vz[..., :ncols, :], xp), xp)
    Q = _identity(xp, V, ncols, acc)
    Q = Q - Vz @ W
    return Q if acc == V.dtype else xp.astype(Q, V.dtype)


def _dense_matrix_scipy_blas(V: Any, S: Any, ncols: int) -> Any:
    """E − V S⁻¹ V[:ncols]ᵀ for one NumPy matrix with SciPy's LAPACK/BLAS only (syrk already
    done by the caller through :func:`gram_upper`, which is SciPy's too): trtrs, then one
    dgemm that writes into E. Staying in one BLAS library avoids the NumPy↔SciPy thread-pool
    switch (``benchmarks/results/tuning.md``). Returns a C-ordered (N, ncols)
    array: Qᵀ is computed in Fortran order."""
    import numpy as np
    import scipy.linalg

    VT = np.asarray(V).T  # (L, N), Fortran-contiguous view when V is C-contiguous
    W = scipy.linalg.solve_triangular(S, VT[:, :ncols], lower=False, check_finite=False)
    (gemm,) = scipy.linalg.blas.get_blas_funcs(("gemm",), (VT, W))
    Qt = gemm(-1.0, W, VT, trans_a=1)  # −Wᵀ Vᵀ, (ncols, N) in Fortran order
    idx = np.arange(ncols)
    Qt[idx, idx] += 1.0  # + Eᵀ
    return Qt.T
