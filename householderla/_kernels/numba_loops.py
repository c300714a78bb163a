"""Compiled Numba loops of the sequential Householder paths (NumPy, CPU, float32/float64).

``hprod``: y = H(v₁)(…H(v_L) h), τ = 2/‖v‖² from the unnormalised columns, γ = vᵀy and
y ← y − (τγ)v fused with the next dot products (Mhammedi et al., ICML 2017, Algorithm 1; Zhang,
Lei & Dhillon, ICML 2018, Algorithm 2). ``hgrad``: their Algorithm 3 with the full gradient
(eq. 15), sweeping backwards and recovering each input as x = y − (τγ)v (O(N) memory):
v̄ = τ(γg − βy), x̄ = g − (τβ)v. ``trapezoidal=True`` reads rows k… only (oRNN's eq. 9).
Numerics: input dtype, four partial sums by row mod 4 (independent of batch width and start
row), no ``fastmath``; out-of-range ‖v‖² rescaled exactly by a power of two in a copy.
"""

from __future__ import annotations

from typing import Any

from .._lib.tuning import FUSED_ROW_BYTES

# imported lazily (householderla._kernels.load_numba): ``import householderla`` never imports numba
try:
    import numba

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only without numba
    numba = None
    HAVE_NUMBA = False

__all__ = [
    "HAVE_NUMBA",
    "apply_block",
    "apply_one",
    "apply_vec",
    "grad_one",
    "lane_add",
    "njit",
]

#: A hash of ``_lib/tuning.py``, whose ``FUSED_ROW_BYTES`` the loops compile in: Numba's
#: on-disk cache keys a compiled function on its own file only, so changing this line when
#: the thresholds change makes the cache recompile (tests/test_numba_kernels.py checks it).
KERNEL_DEPS = "3cfac64aae7e7bcb"


def njit(sigs: Any = None, inline: str = "never") -> Any:
    """``numba.njit(cache=True)`` (with ``sigs`` when given); identity without numba."""

    def deco(fn: Any) -> Any:
        if not HAVE_NUMBA:
            return fn
        if sigs is None:
            return numba.njit(cache=True, nogil=True, inline=inline)(fn)
        return numba.njit(sigs, cache=True, nogil=True)(fn)

    return deco


# -- inner loops (inlined into the entry kernels) --------------------------------------------
# V is (N, L) C-contiguous and read in place, column k with stride L: at the sizes where the
# sequential path wins, V stays in L1/L2 and this beat a transposed copy
# (``benchmarks/results/tuning.md``).


@njit(inline="always")
def lane_add(r: int, p: Any, s0: Any, s1: Any, s2: Any, s3: Any) -> Any:
    """The four partial sums (s0, s1, s2, s3) with p added to the one of row index r mod 4
    (``r`` in 0…3)."""
    if r == 0:
        return s0 + p, s1, s2, s3
    if r == 1:
        return s0, s1 + p, s2, s3
    if r == 2:
        return s0, s1, s2 + p, s3
    return s0, s1, s2, s3 + p


@njit()
def _dot_col(V: Any, k: int, y: Any, start: int) -> Any:
    """Σ_{i ≥ start} V[i, k] y_i in V's dtype: four partial sums by i mod 4, then
    ((s0 + s1) + (s2 + s3)). The grouping depends on the row index only, so neither the start
    row nor the batch width changes the rounding."""
    n = y.shape[0]
    z = V.dtype.type(0)
    s0 = z
    s1 = z
    s2 = z
    s3 = z
    i = start
    while i < n and (i & 3) != 0:
        p = V[i, k] * y[i]
        r = i & 3
        if r == 1:
            s1 += p
        elif r == 2:
            s2 += p
        else:
            s3 += p
        i += 1
    while i + 4 <= n:
        s0 += V[i, k] * y[i]
        s1 += V[i + 1, k] * y[i + 1]
        s2 += V[i + 2, k] * y[i + 2]
        s3 += V[i + 3, k] * y[i + 3]
        i += 4
    while i < n:
        p = V[i, k] * y[i]
        r = i & 3
        if r == 0:
            s0 += p
        elif r == 1:
            s1 += p
        else:
            s2 += p
        i += 1
    return (s0 + s1) + (s2 + s3)


@njit()
def _dot2_col(V: Any, k: int, y: Any, g: Any, start: int) -> Any:
    """(Σ V[i, k] y_i, Σ V[i, k] g_i) over i ≥ start in one pass, each in :func:`_dot_col`'s
    order (eight independent partial sums keep the adder busy)."""
    n = y.shape[0]
    z = V.dtype.type(0)
    a0, a1, a2, a3 = z, z, z, z
    b0, b1, b2, b3 = z, z, z, z
    i = start
    while i < n and (i & 3) != 0:
        v = V[i, k]
        a0, a1, a2, a3 = lane_add(i & 3, v * y[i], a0, a1, a2, a3)
        b0, b1, b2, b3 = lane_add(i & 3, v * g[i], b0, b1, b2, b3)
        i += 1
    while i + 4 <= n:
        v0, v1, v2, v3 = V[i, k], V[i + 1, k], V[i + 2, k], V[i + 3, k]
        a0 += v0 * y[i]
        a1 += v1 * y[i + 1]
        a2 += v2 * y[i + 2]
        a3 += v3 * y[i + 3]
        b0 += v0 * g[i]
        b1 += v1 * g[i + 1]
        b2 += v2 * g[i + 2]
        b3 += v3 * g[i + 3]
        i += 4
    while i < n:
        v = V[i, k]
        a0, a1, a2, a3 = lane_add(i & 3, v * y[i], a0, a1, a2, a3)
        b0, b1, b2, b3 = lane_add(i & 3, v * g[i], b0, b1, b2, b3)
        i += 1
    return (a0 + a1) + (a2 + a3), (b0 + b1) + (b2 + b3)


@njit()
def _dots_block(V: Any, k: int, Y: Any, start: int, acc: Any, out: Any, row: int) -> None:
    """out[row, b] = Σ_{i ≥ start} V[i, k] Y[i, b] for every b, in :func:`_dot_col`'s order."""
    n, B = Y.shape
    acc[:] = 0
    for i in range(start, n):
        r = i & 3
        vi = V[i, k]
        for b in range(B):
            acc[r, b] += vi * Y[i, b]
    for b in range(B):
        out[row, b] = (acc[0, b] + acc[1, b]) + (acc[2, b] + acc[3, b])


@njit(inline="always")
def _bp_step(V: Any, k: int, t: Any, Y: Any, G: Any, Vb: Any, s: int, acc: Any, c: Any) -> None:
    """One reflection of the backward sweep on rows s…N−1: with γ = v_kᵀy and β = v_kᵀg,
    v̄_k += τ(γ g − β y), then y ← H(v_k) y (the reflection's input) and g ← H(v_k) g."""
    n, B = Y.shape
    if B == 1:
        y = Y.reshape((n,))
        g = G.reshape((n,))
        gam, bet = _dot2_col(V, k, y, g, s)
        cg = t * gam
        cb = t * bet
        for i in range(s, n):
            vi = V[i, k]
            Vb[i, k] += g[i] * cg - y[i] * cb
            y[i] -= cg * vi
            g[i] -= cb * vi
        return
    _dots_block(V, k, Y, s, acc, c, 0)
    _dots_block(V, k, G, s, acc, c, 1)
    for b in range(B):
        c[0, b] = t * c[0, b]
        c[1, b] = t * c[1, b]
    z = V.dtype.type(0)
    for i in range(s, n):
        vi = V[i, k]
        w0 = z
        w1 = z
        w2 = z
        w3 = z
        b = 0
        while b + 4 <= B:
            w0 += G[i, b] * c[0, b] - Y[i, b] * c[1, b]
            w1 += G[i, b + 1] * c[0, b + 1] - Y[i, b + 1] * c[1, b + 1]
            w2 += G[i, b + 2] * c[0, b + 2] - Y[i, b + 2] * c[1, b + 2]
            w3 += G[i, b + 3] * c[0, b + 3] - Y[i, b + 3] * c[1, b + 3]
            b += 4
        while b < B:
            w0 += G[i, b] * c[0, b] - Y[i, b] * c[1, b]
            b += 1
        Vb[i, k] += (w0 + w1) + (w2 + w3)
        for b in range(B):
            Y[i, b] -= c[0, b] * vi
            G[i, b] -= c[1, b] * vi


@njit(inline="always")
def _axpy_dot(
    V: Any, k: int, ct: Any, kn: int, y: Any, s: int, s0: Any, s1: Any, s2: Any, s3: Any
) -> Any:
    """For i ≥ s: y_i ← y_i − ct·V[i, k] and accumulate V[i, kn]·y_i (the updated value) into
    the partial sums s0…s3 by i mod 4; returns ((s0 + s1) + (s2 + s3)). The reflection k and
    the next reflection's dot product share one pass over y (same operations and rounding
    as a dot pass after an update pass)."""
    n = y.shape[0]
    i = s
    while i < n and (i & 3) != 0:
        yi = y[i] - ct * V[i, k]
        y[i] = yi
        s0, s1, s2, s3 = lane_add(i & 3, V[i, kn] * yi, s0, s1, s2, s3)
        i += 1
    while i + 4 <= n:
        y0 = y[i] - ct * V[i, k]
        y1 = y[i + 1] - ct * V[i + 1, k]
        y2 = y[i + 2] - ct * V[i + 2, k]
        y3 = y[i + 3] - ct * V[i + 3, k]
        y[i] = y0
        y[i + 1] = y1
        y[i + 2] = y2
        y[i + 3] = y3
        s0 += V[i, kn] * y0
        s1 += V[i + 1, kn] * y1
        s2 += V[i + 2, kn] * y2
        s3 += V[i + 3, kn] * y3
        i += 4
    while i < n:
        yi = y[i] - ct * V[i, k]
        y[i] = yi
        s0, s1, s2, s3 = lane_add(i & 3, V[i, kn] * yi, s0, s1, s2, s3)
        i += 1
    return (s0 + s1) + (s2 + s3)


@njit(inline="always")
def _next_active(tau: Any, idx: int, transpose: bool) -> Any:
    """(k, idx + 1) for the first nonzero τ_k at or after position idx of the order
    (k = idx if transpose else L − 1 − idx); (−1, L) if none."""
    L = tau.shape[0]
    while idx < L:
        k = idx if transpose else L - 1 - idx
        if tau[k] != 0:
            return k, idx + 1
        idx += 1
    return -1, L


@njit()
def apply_vec(V: Any, tau: Any, y: Any, trap: bool, transpose: bool) -> None:
    """y (N,) ← H(v₁)…H(v_L) y for one vector with τ (L,) of :func:`numba_taus.taus`, each
    reflection's axpy fused with the next reflection's dot product: the scalar reference of
    :func:`householderla._kernels.numba_vec.fp_vec_kernel` (the one-vector entry kernel), which
    must equal it bit for bit (tests/test_numba_kernels.py)."""
    n = y.shape[0]
    z = V.dtype.type(0)
    k, idx = _next_active(tau, 0, transpose)
    if k < 0:
        return
    ct = tau[k] * (_dot_col(V, k, y, k) if trap else _dot_col(V, k, y, 0))
    while True:
        kn, idx = _next_active(tau, idx, transpose)
        if kn < 0:
            break
        if trap:  # rows only the next dot reads, or only this axpy writes, come first
            s0 = z
            s1 = z
            s2 = z
            s3 = z
            for i in range(kn, k):
                s0, s1, s2, s3 = lane_add(i & 3, V[i, kn] * y[i], s0, s1, s2, s3)
            for i in range(k, kn):
                y[i] -= ct * V[i, k]
            d = _axpy_dot(V, k, ct, kn, y, max(k, kn), s0, s1, s2, s3)
        else:  # literal start row 0: LLVM specialises the loops (faster at N=128, L=16)
            d = _axpy_dot(V, k, ct, kn, y, 0, z, z, z, z)
        ct = tau[kn] * d
        k = kn
    for i in range(k if trap else 0, n):
        y[i] -= ct * V[i, k]


@njit(inline="always")
def _axpy_dots_block(V: Any, k: int, kn: int, Y: Any, s: int, acc: Any, c: Any) -> None:
    """For i ≥ s and every column b: Y[i, b] ← Y[i, b] − c[0, b]·V[i, k], and accumulate
    V[i, kn]·Y[i, b] (the updated value) into acc[i mod 4, b]: reflection k's update and the
    next reflection's dot products in one pass over Y, with the operations and rounding of an
    update pass followed by a dot pass (:func:`_axpy_dot` for a block)."""
    n, B = Y.shape
    for i in range(s, n):
        r = i & 3
        vk = V[i, k]
        vn = V[i, kn]
        for b in range(B):
            yb = Y[i, b] - c[0, b] * vk
            Y[i, b] = yb
            acc[r, b] += vn * yb


@njit(inline="always")
def _update_rows(V: Any, k: int, Y: Any, s: int, e: int, c: Any) -> None:
    """Y[i, b] −= c[0, b]·V[i, k] for s ≤ i < e: an update pass."""
    for i in range(s, e):
        vk = V[i, k]
        for b in range(Y.shape[1]):
            Y[i, b] -= c[0, b] * vk


@njit(inline="always")
def _scaled_dots(t: Any, acc: Any, c: Any) -> None:
    """c[0, b] = t·((acc[0, b] + acc[1, b]) + (acc[2, b] + acc[3, b])): τγ of each column,
    the partial sums combined in :func:`_dot_col`'s order."""
    for b in range(acc.shape[1]):
        c[0, b] = t * ((acc[0, b] + acc[1, b]) + (acc[2, b] + acc[3, b]))


@njit()
def apply_block(V: Any, tau: Any, Y: Any, trap: bool, transpose: bool, acc: Any, c: Any) -> None:
    """Y (N, B) ← H(v₁)…H(v_L) Y in place, as :func:`apply_vec` for a block: each reflection's
    update (Y −= v_k (τγ)ᵀ) shares its pass over Y with the next reflection's dot products
    (v_{k'}ᵀY), so Y streams through the cache once per reflection rather than twice. The
    operations and their order are those of a dot pass and an update pass per reflection, so
    the result is the same bit for bit (and each column's equals :func:`apply_vec`'s). Median
    time against the two passes, interleaved, one thread on the 2-core EPYC VM, over 14
    shapes N = 64…1024, L = 16…1024, B = 4…128, float32 and float64: per shape the median of
    three runs' ratios 0.68–1.00× (median 0.93×; single runs 0.65–1.20×), e.g. 0.92× at
    N = L = 1024, B = 64 and 0.94× at N = 1024, L = 256, B = 64, float64. Rows longer
    than ``FUSED_ROW_BYTES`` get the two passes (the constant says why)."""
    n, B = Y.shape
    if B * Y.itemsize > FUSED_ROW_BYTES:
        for idx in range(V.shape[1]):
            k = idx if transpose else V.shape[1] - 1 - idx
            if tau[k] != 0:
                s = k if trap else 0
                _dots_block(V, k, Y, s, acc, c, 0)
                _scaled_dots(tau[k], acc, c)
                _update_rows(V, k, Y, s, n, c)
        return
    k, idx = _next_active(tau, 0, transpose)
    if k < 0:
        return
    _dots_block(V, k, Y, k if trap else 0, acc, c, 0)
    _scaled_dots(tau[k], acc, c)
    while True:
        kn, idx = _next_active(tau, idx, transpose)
        if kn < 0:
            break
        acc[:] = 0
        if trap:  # rows only the next dots read, or only this update writes, come first
            for i in range(kn, k):
                r = i & 3
                vn = V[i, kn]
                for b in range(B):
                    acc[r, b] += vn * Y[i, b]
            _update_rows(V, k, Y, k, kn, c)
            _axpy_dots_block(V, k, kn, Y, max(k, kn), acc, c)
        else:  # literal start row 0, see apply_vec
            _axpy_dots_block(V, k, kn, Y, 0, acc, c)
        _scaled_dots(tau[kn], acc, c)
        k = kn
    _update_rows(V, k, Y, k if trap else 0, n, c)


@njit()
def apply_one(V: Any, tau: Any, Y: Any, trap: bool, transpose: bool, acc: Any, c: Any) -> None:
    """Y (N, B) ← H(v₁)…H(v_L) Y in place (H(v_L)…H(v₁) Y with ``transpose``)."""
    n, B = Y.shape
    if B == 1:
        apply_vec(V, tau, Y.reshape((n,)), trap, transpose)
    else:
        apply_block(V, tau, Y, trap, transpose, acc, c)


@njit()
def grad_one(
    V: Any,
    tau: Any,
    Y: Any,
    G: Any,
    Vb: Any,
    trap: bool,
    transpose: bool,
    acc: Any,
    c: Any,
) -> None:
    """Backward sweep for one batch entry: Y (N, B) holds the output and ends as the input,
    G (N, B) holds the cotangent and ends as h̄, Vb (N, L) accumulates v̄."""
    L = V.shape[1]
    for idx in range(L):
        k = L - 1 - idx if transpose else idx  # the forward's order, reversed
        t = tau[k]
        if t == 0:
            continue
        if trap:
            _bp_step(V, k, t, Y, G, Vb, k, acc, c)
        else:
            _bp_step(V, k, t, Y, G, Vb, 0, acc, c)
