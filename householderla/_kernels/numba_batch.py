"""Many tiny Householder products at once: the batch in the SIMD lanes (NumPy, CPU).

For thousands of N × N products with N ≲ 6 the per-matrix loops of
:mod:`householderla._kernels.numba_loops` spend their time on loop overhead and scalar
arithmetic (a 3 × 3 reflection is 18 flops); above that the column-block kernel of
:mod:`householderla._kernels.numba_columns` is faster (the dispatch:
:func:`householderla._kernels.numba._forward`). Here a tile of ``TILE`` matrices is transposed
into (N, L, TILE) scratch, so that every scalar operation of the sequential algorithm becomes
one operation on ``TILE`` contiguous numbers, which LLVM vectorises (no reassociation is
needed: the lanes are independent matrices). Per reflection and tile: γ_j = v_kᵀ y_j and
y_j ← y_j − (τ_k γ_j) v_k, as in Mhammedi et al., ICML 2017, Algorithm 1 (lines 7–10).

Numerics: the same operations in the same order as the per-matrix kernels — τ = 2/‖v‖²
and every dot product from four partial sums by row index mod 4, combined as
((s₀ + s₁) + (s₂ + s₃)) — so each matrix of the result equals, bit for bit, what
:func:`householderla._kernels.numba.hprod` gives for it alone. Starting from [I; 0] with
lower-trapezoidal V (LAPACK's layout) the rows and columns < k, which H(v_k) leaves exactly
unchanged, are skipped: the 4N³/3 flops of LAPACK's orgqr instead of 4N³.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .numba_loops import HAVE_NUMBA, njit

__all__ = ["TILE", "apply_tiles"]

#: Matrices per tile (the SIMD lanes): measured on 3/8/16/64-sized products, 32 beat 8 and 16
#: by 10–30% and matched 64; the tile's scratch at N = 16 is 2·16·16·32·8 B = 128 KiB.
TILE = 32


@njit(inline="always")
def _dot_into(a: Any, v: Any, y: Any) -> None:
    """a += v ∘ y over the lanes (1-D views of one length)."""
    for w in range(a.shape[0]):
        a[w] += v[w] * y[w]


@njit(inline="always")
def _axpy(y: Any, c: Any, v: Any) -> None:
    """y −= c ∘ v over the lanes."""
    for w in range(y.shape[0]):
        y[w] -= c[w] * v[w]


@njit(inline="always")
def _axpy_dot(y: Any, c: Any, v: Any, vn: Any, a: Any) -> None:
    """y −= c ∘ v, then a += vn ∘ y (the next reflection's dot on the updated y, one pass)."""
    for w in range(y.shape[0]):
        yy = y[w] - c[w] * v[w]
        y[w] = yy
        a[w] += vn[w] * yy


@njit()
def _load(V: Any, p0: int, w_n: int, Vt: Any) -> None:
    """Vt[i, k, w] = V[p0 + w, i, k] for the tile's matrices, 0 in the unused lanes."""
    _, N, L = V.shape
    W = Vt.shape[2]
    for i in range(N):
        for k in range(L):
            for w in range(w_n):
                Vt[i, k, w] = V[p0 + w, i, k]
            for w in range(w_n, W):
                Vt[i, k, w] = 0


@njit()
def _taus(Vt: Any, trap: bool, lo: float, hi: float, tau: Any, acc: Any) -> int:
    """τ[k, w] = 2/‖v_k‖² (0 for v = 0, NaN for a non-finite column) in the order of
    :func:`householderla._kernels.numba_loops.taus`. Returns −1 if some nonzero ‖v‖² is
    outside [lo, hi] (the caller rescales), else the number of non-finite columns."""
    N, L, W = Vt.shape
    two = Vt.dtype.type(2)
    bad = 0
    for k in range(L):
        acc[:, 0, :] = 0
        for i in range(k if trap else 0, N):
            _dot_into(acc[i & 3, 0], Vt[i, k], Vt[i, k])
        for w in range(W):
            ss = (acc[0, 0, w] + acc[1, 0, w]) + (acc[2, 0, w] + acc[3, 0, w])
            if lo <= ss <= hi:
                tau[k, w] = two / ss
                continue
            finite = True
            nonzero = False
            for i in range(k if trap else 0, N):
                a = abs(np.float64(Vt[i, k, w]))
                if not (a <= 1.7976931348623157e308):  # NaN or Inf
                    finite = False
                elif a > 0.0:
                    nonzero = True
            if not finite:
                tau[k, w] = np.nan
                bad += 1
            elif nonzero:  # ‖v‖² under- or overflows: rescale first (exact, H(cv) = H(v))
                return -1
            else:
                tau[k, w] = 0  # H(0) = I
    return bad


@njit()
def _dots(Vt: Any, k: int, Yt: Any, s: int, js: int, acc: Any) -> None:
    """acc[i mod 4, j] = partial sums of v_kᵀ y_j over rows ≥ s, columns j ≥ js."""
    N, C, _ = Yt.shape
    acc[:, js:, :] = 0
    for i in range(s, N):
        for j in range(js, C):
            _dot_into(acc[i & 3, j], Vt[i, k], Yt[i, j])


@njit()
def _sweep(Vt: Any, tau: Any, Yt: Any, trap: bool, skip: bool, transpose: bool, acc: Any, c: Any):
    """Yt ← H(v₁)…H(v_L) Yt (H(v_L)…H(v₁) with ``transpose``) for every lane; each
    reflection's update shares its pass over Yt with the next reflection's dot products.
    ``trap``: rows < k of v_k are not read (and those rows of Yt are unchanged by H(v_k));
    ``skip``: also columns < k (Yt started as [I; 0], so they are still e_j there)."""
    N, L, _ = Vt.shape
    C = Yt.shape[1]
    k = 0 if transpose else L - 1
    s = k if trap else 0
    js = min(k, C) if skip else 0
    _dots(Vt, k, Yt, s, js, acc)
    for idx in range(L):
        for j in range(js, C):
            for w in range(c.shape[1]):
                cs = (acc[0, j, w] + acc[1, j, w]) + (acc[2, j, w] + acc[3, j, w])
                c[j, w] = tau[k, w] * cs
        if idx == L - 1:
            for i in range(s, N):
                for j in range(js, C):
                    _axpy(Yt[i, j], c[j], Vt[i, k])
            return
        kn = k + 1 if transpose else k - 1
        sn = kn if trap else 0
        jsn = min(kn, C) if skip else 0
        acc[:, min(js, jsn) :, :] = 0
        for i in range(min(s, sn), N):
            r = i & 3
            if i < s:  # rows only the next dot reads
                for j in range(jsn, C):
                    _dot_into(acc[r, j], Vt[i, kn], Yt[i, j])
                continue
            for j in range(jsn, js):  # columns only the next dot reads
                _dot_into(acc[r, j], Vt[i, kn], Yt[i, j])
            if i < sn:  # rows only this update writes
                for j in range(js, C):
                    _axpy(Yt[i, j], c[j], Vt[i, k])
            else:
                for j in range(js, C):
                    _axpy_dot(Yt[i, j], c[j], Vt[i, k], Vt[i, kn], acc[r, j])
        k, s, js = kn, sn, jsn


def _sigs() -> Any:
    if not HAVE_NUMBA:
        return None
    from numba import types as nt

    out = []
    for f in (nt.float32, nt.float64):
        ro3, rw3 = nt.Array(f, 3, "C", readonly=True), nt.Array(f, 3, "C")
        out.append(nt.int64(ro3, ro3, rw3, nt.boolean, nt.boolean, nt.boolean, nt.int64))
    return out


@njit(_sigs())
def apply_tiles(
    V: Any, H: Any, Y: Any, trap: bool, identity: bool, transpose: bool, safe_exp: int
) -> int:
    """Y[p] ← H(v₁)…H(v_L) X[p] for every p (H(v_L)…H(v₁) with ``transpose``), X = [I; 0]
    (``identity``) or H[p] (H[0] for a shared operand).

    V (P, N, L) and H (Ph, N, C) read-only, Y (P, N, C) written. Returns −1 (Y incomplete)
    if a column of V must be rescaled first, else the number of non-finite columns."""
    P, N, L = V.shape
    C = Y.shape[2]
    Ph = H.shape[0]
    dt = V.dtype
    lo = math.ldexp(1.0, -safe_exp)
    hi = math.ldexp(1.0, safe_exp)
    Vt = np.empty((N, L, TILE), dt)
    Yt = np.empty((N, C, TILE), dt)
    tau = np.empty((L, TILE), dt)
    acc = np.empty((4, max(C, 1), TILE), dt)
    c = np.empty((max(C, 1), TILE), dt)
    skip = trap and identity and not transpose  # columns < k of Y are still e_j
    bad = 0
    for p0 in range(0, P, TILE):
        w_n = min(TILE, P - p0)
        _load(V, p0, w_n, Vt)
        status = _taus(Vt, trap, lo, hi, tau, acc)
        if status < 0:
            return -1
        bad += status
        for i in range(N):
            for j in range(C):
                if identity:
                    e = dt.type(1) if i == j else dt.type(0)
                    for w in range(TILE):
                        Yt[i, j, w] = e
                else:
                    for w in range(w_n):
                        Yt[i, j, w] = H[p0 + w if Ph > 1 else 0, i, j]
                    for w in range(w_n, TILE):
                        Yt[i, j, w] = 0
        if L > 0 and C > 0:
            _sweep(Vt, tau, Yt, trap, skip, transpose, acc, c)
        for w in range(w_n):
            for i in range(N):
                for j in range(C):
                    Y[p0 + w, i, j] = Yt[i, j, w]
    return bad
