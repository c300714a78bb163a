"""Numba kernels for the sequential Householder paths (NumPy, CPU), float32 and float64.

``hprod``: y = H(v₁)(H(v₂)(…H(v_L) h)) one reflection at a time, with H(v) = I − τ v vᵀ,
τ = 2/‖v‖² computed here from the *unnormalised* columns (τ = 0 for v = 0: H(0) = I). This is
the forward loop of seed 001 Algorithm 1 (lines 7–10) and seed 002 Algorithm 2 (Hprod):
per reflection and vector γ = vᵀy (2n flops) and y ← y − (τγ) v (2n flops). For one vector
the update of reflection k and the dot product of the next share one pass over y.

``hgrad``: the backward of seed 002 Algorithm 3 (Hgrad) / seed 001 Algorithm 1 (lines 11–15),
with the full gradient with respect to the unnormalised v (seed 002 eq. 15, the term oRNN
omits included). It sweeps the reflections in the order opposite to the forward and recovers
each reflection's input from its output (x = H(v) y, H an involution), so memory is O(N) per
vector rather than the O(N·L) tape of seed 001 Table 2. For y = H(v) x and cotangent g of y,
with γ = vᵀy and β = vᵀg, seed 002 eq. 15 (ū = −αg − βx + αβu, α = τ vᵀx, β' = τβ) reduces,
using vᵀx = −vᵀy and x = y − τγ v, to

    v̄ = τ (γ g − β y),        x̄ = H(v) g = g − (τβ) v,        x = y − (τγ) v,

7n flops for (v̄, x̄) plus 4n to recover x: 11n per reflection and vector (seed 002 Table 1
counts Hgrad + the recomputation as 3n + 10k).

``trapezoidal=True`` is oRNN's layout (seed 001 eq. 9): column k is taken to be zero above
row k, and only rows k…N−1 are read or written, which gives seed 001 Table 2's
(4n − m + 2)m forward flops; the entries above the diagonal are never read (LAPACK-style
packed storage works) and get no gradient (they are not parameters).

Numerics, chosen to stay within a few ulps of the Array API path
(:func:`householderla.householder.householder_apply`):

* everything is in the input dtype (float32 stays float32, like the NumPy path);
* every dot product uses four partial sums by row index mod 4 — a fixed order that does not
  depend on the batch width, the start row or the machine, so the result for one column of a
  block equals the result for that column alone, and trapezoidal mode equals dense mode on a
  lower-trapezoidal V, bit for bit; no ``fastmath`` (no reassociation, no FMA contraction);
* columns whose ‖v‖² leaves [2^−e, 2^e] (e = 500 for float64, 60 for float32) are rescaled
  by a power of two in a copy first (exact; H(cv) = H(v)); the gradient is scaled back
  (v̄ = c·v̄' since H is homogeneous of degree 0). Non-finite columns either raise
  (``check=True``, the forward's rule) or give τ = NaN, which propagates like the NumPy path.

V is read in place (C order, column k with stride L); batch axes are looped inside the
kernels (V and h may each be shared across the batch); outputs are allocated by the NumPy
wrappers and never alias the inputs. The entry kernels have explicit signatures with
read-only C-contiguous inputs, so writable and read-only arrays share one compiled version
(float32 and float64 each), compiled when this module is first imported (≈ 26 s of CPU
for all six, measured cold) and then loaded from Numba's on-disk cache (``cache=True``,
≈ 1 s). Without Numba the module still imports (``HAVE_NUMBA = False``) and callers use the
NumPy path.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

try:  # imported lazily by householder.py, so ``import householderla`` never imports numba
    import numba
    from numba import types as _nt

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only without numba
    numba = None
    HAVE_NUMBA = False

__all__ = ["HAVE_NUMBA", "hgrad", "hprod"]


def _jit(sigs: Any = None, inline: str = "never") -> Any:
    """``numba.njit(cache=True)`` (with ``sigs`` when given); identity without numba."""

    def deco(fn: Any) -> Any:
        if not HAVE_NUMBA:
            return fn
        if sigs is None:
            return numba.njit(cache=True, nogil=True, inline=inline)(fn)
        return numba.njit(sigs, cache=True, nogil=True)(fn)

    return deco


#: log2 of the safe range of ‖v‖² per dtype: inside it τ = 2/‖v‖², the products τ·γ and the
#: squares v_i² neither overflow nor lose precision to underflow.
SAFE_EXP = {np.dtype(np.float64): 500, np.dtype(np.float32): 60}


# -- inner loops (inlined into the entry kernels) --------------------------------------------
# V is (N, L) C-contiguous and read in place, column k with stride L: at the sizes where the
# sequential path wins, V stays in L1/L2 and this beat a transposed copy (N=128, L=16, one
# vector: 1.5 µs vs 3.4 µs; N=512, L=64: 49 µs vs 242 µs, CPU time on the 2-core VM).


@_jit(inline="always")
def _lane_add(r: int, p: Any, s0: Any, s1: Any, s2: Any, s3: Any) -> Any:
    if r == 0:
        return s0 + p, s1, s2, s3
    if r == 1:
        return s0, s1 + p, s2, s3
    if r == 2:
        return s0, s1, s2 + p, s3
    return s0, s1, s2, s3 + p


@_jit()
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


@_jit()
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
        a0, a1, a2, a3 = _lane_add(i & 3, v * y[i], a0, a1, a2, a3)
        b0, b1, b2, b3 = _lane_add(i & 3, v * g[i], b0, b1, b2, b3)
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
        a0, a1, a2, a3 = _lane_add(i & 3, v * y[i], a0, a1, a2, a3)
        b0, b1, b2, b3 = _lane_add(i & 3, v * g[i], b0, b1, b2, b3)
        i += 1
    return (a0 + a1) + (a2 + a3), (b0 + b1) + (b2 + b3)


@_jit()
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


@_jit()
def _taus(V: Any, trap: bool, safe_exp: int, tau: Any) -> Any:
    """τ_k = 2/‖v_k‖² into ``tau`` (L,); ‖v_k‖² row by row (vectorised over k) in
    :func:`_dot_col`'s order. Returns (non-finite columns: τ = NaN; nonzero columns whose
    ‖v‖² is outside [2^−safe_exp, 2^safe_exp]: τ = 0, the caller rescales them)."""
    n, L = V.shape
    two = V.dtype.type(2)
    lo = math.ldexp(1.0, -safe_exp)
    hi = math.ldexp(1.0, safe_exp)
    acc = np.zeros((4, L), V.dtype)
    for i in range(n):
        r = i & 3
        kmax = min(i + 1, L) if trap else L
        for k in range(kmax):
            x = V[i, k]
            acc[r, k] += x * x
    nonfinite = 0
    outside = 0
    for k in range(L):
        ss = (acc[0, k] + acc[1, k]) + (acc[2, k] + acc[3, k])
        if lo <= ss <= hi:
            tau[k] = two / ss
            continue
        m = 0.0
        bad = False
        for i in range(k if trap else 0, n):
            a = abs(np.float64(V[i, k]))
            if not (a <= 1.7976931348623157e308):  # NaN or Inf
                bad = True
            elif a > m:
                m = a
        tau[k] = 0  # H(0) = I for a zero column
        if bad:
            tau[k] = np.nan
            nonfinite += 1
        elif m > 0.0:
            outside += 1
    return nonfinite, outside


@_jit(inline="always")
def _fp_step(V: Any, k: int, t: Any, Y: Any, s: int, acc: Any, c: Any) -> None:
    """Y[s:] ← H(v_k) Y on rows s…N−1: γ = v_kᵀY, Y −= (τγ) v_k (seed 001 Alg. 1, lines 8–9)."""
    n, B = Y.shape
    if B == 1:
        y = Y.reshape((n,))
        ct = t * _dot_col(V, k, y, s)
        for i in range(s, n):
            y[i] -= ct * V[i, k]
    else:
        _dots_block(V, k, Y, s, acc, c, 0)
        for b in range(B):
            c[0, b] = t * c[0, b]
        for i in range(s, n):
            vi = V[i, k]
            for b in range(B):
                Y[i, b] -= c[0, b] * vi


@_jit(inline="always")
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


@_jit(inline="always")
def _axpy_dot(
    V: Any, k: int, ct: Any, kn: int, y: Any, s: int, s0: Any, s1: Any, s2: Any, s3: Any
) -> Any:
    """For i ≥ s: y_i ← y_i − ct·V[i, k] and accumulate V[i, kn]·y_i (the updated value) into
    the partial sums s0…s3 by i mod 4; returns ((s0 + s1) + (s2 + s3)). The reflection k and
    the next reflection's dot product share one pass over y (same operations and rounding
    as the two passes of :func:`_fp_step`)."""
    n = y.shape[0]
    i = s
    while i < n and (i & 3) != 0:
        yi = y[i] - ct * V[i, k]
        y[i] = yi
        s0, s1, s2, s3 = _lane_add(i & 3, V[i, kn] * yi, s0, s1, s2, s3)
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
        s0, s1, s2, s3 = _lane_add(i & 3, V[i, kn] * yi, s0, s1, s2, s3)
        i += 1
    return (s0 + s1) + (s2 + s3)


@_jit(inline="always")
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


@_jit()
def _apply_vec(V: Any, tau: Any, y: Any, trap: bool, transpose: bool) -> None:
    """y (N,) ← H(v₁)…H(v_L) y for one vector, each reflection's axpy fused with the next
    reflection's dot product (the dot is latency-bound; the axpy rides along for free)."""
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
                s0, s1, s2, s3 = _lane_add(i & 3, V[i, kn] * y[i], s0, s1, s2, s3)
            for i in range(k, kn):
                y[i] -= ct * V[i, k]
            d = _axpy_dot(V, k, ct, kn, y, max(k, kn), s0, s1, s2, s3)
        else:  # literal start row 0: LLVM specialises the loops (1.4 vs 2.3 µs at N=128, L=16)
            d = _axpy_dot(V, k, ct, kn, y, 0, z, z, z, z)
        ct = tau[kn] * d
        k = kn
    for i in range(k if trap else 0, n):
        y[i] -= ct * V[i, k]


@_jit()
def _apply_one(V: Any, tau: Any, Y: Any, trap: bool, transpose: bool, acc: Any, c: Any) -> None:
    """Y (N, B) ← H(v₁)…H(v_L) Y in place (H(v_L)…H(v₁) Y with ``transpose``)."""
    n, B = Y.shape
    if B == 1:
        _apply_vec(V, tau, Y.reshape((n,)), trap, transpose)
        return
    L = V.shape[1]
    for idx in range(L):
        k = idx if transpose else L - 1 - idx
        t = tau[k]
        if t == 0:
            continue
        if trap:
            _fp_step(V, k, t, Y, k, acc, c)
        else:  # literal start row 0, see _apply_vec
            _fp_step(V, k, t, Y, 0, acc, c)


@_jit()
def _grad_one(
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


@_jit()
def _all_taus(V: Any, trap: bool, safe_exp: int) -> Any:
    """τ (Pv, L) for every batch entry; status −1 if a column needs rescaling, else the
    number of non-finite columns."""
    Pv, _, L = V.shape
    tau = np.empty((Pv, L), V.dtype)
    nonfinite = 0
    outside = 0
    for p in range(Pv):
        a, b = _taus(V[p], trap, safe_exp, tau[p])
        nonfinite += a
        outside += b
    return tau, (-1 if outside else nonfinite)


# -- entry kernels (explicit signatures: read-only C inputs accept writable arrays too) -------


def _sigs(kind: str) -> Any:
    if not HAVE_NUMBA:
        return None
    out = []
    for f in (_nt.float32, _nt.float64):
        ro3 = _nt.Array(f, 3, "C", readonly=True)
        rw3 = _nt.Array(f, 3, "C")
        b, i = _nt.boolean, _nt.int64
        if kind == "fp":
            out.append(i(ro3, ro3, rw3, b, b, i))
        elif kind == "vec":
            ro2, ro1 = _nt.Array(f, 2, "C", readonly=True), _nt.Array(f, 1, "C", readonly=True)
            out.append(i(ro2, ro1, _nt.Array(f, 1, "C"), b, b, i))
        else:
            out.append(i(ro3, ro3, ro3, rw3, rw3, b, b, b, i))
    return out


@_jit(_sigs("fp"))
def _fp_kernel(V: Any, H: Any, Y: Any, trap: bool, transpose: bool, safe_exp: int) -> int:
    """Y (P, N, B) ← H(v₁)…H(v_L) H for V (Pv, N, L), H (Ph, N, B), Pv, Ph ∈ {1, P}.
    Returns −1 (nothing computed) if a column must be rescaled first, else the number of
    non-finite columns of V."""
    Pv = V.shape[0]
    Ph, _, B = H.shape
    P = Y.shape[0]
    tau, status = _all_taus(V, trap, safe_exp)
    if status < 0:
        return status
    acc = np.empty((4, B), V.dtype)
    c = np.empty((1, B), V.dtype)
    for p in range(P):
        Y[p] = H[p if Ph > 1 else 0]
        pv = p if Pv > 1 else 0
        _apply_one(V[pv], tau[pv], Y[p], trap, transpose, acc, c)
    return status


@_jit(_sigs("vec"))
def _fp_vec_kernel(V: Any, h: Any, y: Any, trap: bool, transpose: bool, safe_exp: int) -> int:
    """y (N,) ← H(v₁)…H(v_L) h for one V (N, L) and one vector: :func:`_fp_kernel` without
    the batch axes (the common tiny call, whose NumPy-side reshapes cost as much as
    the kernel's arithmetic at N = 128, L = 16)."""
    tau = np.empty(V.shape[1], V.dtype)
    nonfinite, outside = _taus(V, trap, safe_exp, tau)
    if outside:
        return -1
    y[:] = h
    _apply_vec(V, tau, y, trap, transpose)
    return nonfinite


@_jit(_sigs("bp"))
def _bp_kernel(
    V: Any,
    X: Any,
    G: Any,
    Vb: Any,
    Hb: Any,
    from_output: bool,
    trap: bool,
    transpose: bool,
    safe_exp: int,
) -> int:
    """V̄ → Vb (Pv, N, L) and H̄ → Hb (Ph, N, B) (summed over broadcast batch entries) for
    V (Pv, N, L), G (P, N, B), and X (Px, N, B) the input h (``from_output=False``: the
    output is recomputed first) or the output y. Status as :func:`_fp_kernel`."""
    Pv, n, _ = V.shape
    Px, _, B = X.shape
    P = G.shape[0]
    Ph = Hb.shape[0]
    tau, status = _all_taus(V, trap, safe_exp)
    if status < 0:
        return status
    Y = np.empty((n, B), V.dtype)
    Gw = np.empty((n, B), V.dtype)
    acc = np.empty((4, B), V.dtype)
    c = np.empty((2, B), V.dtype)
    Vb[:] = 0
    Hb[:] = 0
    for p in range(P):
        pv = p if Pv > 1 else 0
        Y[:] = X[p if Px > 1 else 0]
        if not from_output:
            _apply_one(V[pv], tau[pv], Y, trap, transpose, acc, c)
        Gw[:] = G[p]
        _grad_one(V[pv], tau[pv], Y, Gw, Vb[pv], trap, transpose, acc, c)
        Hb[p if Ph > 1 else 0] += Gw
    return status


# -- NumPy wrappers ---------------------------------------------------------------------------

_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


def _dtype_of(*arrays: np.ndarray) -> Any:
    """The common dtype, float32 or float64 (identity checks first: this runs per call)."""
    dt = arrays[0].dtype
    for a in arrays[1:]:
        if a.dtype is not dt:
            dt = np.result_type(*arrays)
            break
    if dt is _F64 or dt is _F32:
        return dt
    if dt == _F64 or dt == _F32:  # non-native byte order
        return _F64 if dt == _F64 else _F32
    raise TypeError(f"the Numba kernels take float32 or float64 arrays; got {dt}")


def _as3(a: np.ndarray, batch: tuple[int, ...], P: int, tail: tuple[int, ...], dtype: Any) -> Any:
    """``a`` (…, *tail) as a C-contiguous (P', *tail) with P' = 1 or P = prod(batch); copies
    only where the layout, dtype or a genuine broadcast needs it (never writes into ``a``)."""
    own = a.shape[: a.ndim - len(tail)]
    if own == batch:
        a3 = a.reshape((P, *tail))
    elif math.prod(own) == 1:
        a3 = a.reshape((1, *tail))
    else:
        a3 = np.broadcast_to(a, batch + tail).reshape((P, *tail))
    if a3.dtype is not dtype or not a3.flags.c_contiguous:
        a3 = np.ascontiguousarray(a3, dtype=dtype)
    return a3


def _shapes(V: np.ndarray, h: np.ndarray, name: str = "h") -> tuple:
    """N, L, the broadcast batch shape, whether h is a vector, and B."""
    if V.ndim < 2 or V.shape[-1] > V.shape[-2]:
        raise ValueError(f"V must have shape (..., N, L) with L <= N; got {tuple(V.shape)}")
    n = V.shape[-2]
    vector = h.ndim == 1
    if h.ndim == 0 or h.shape[-1 if vector else -2] != n:
        raise ValueError(f"{name} must have shape ({n},) or (..., {n}, B); got {tuple(h.shape)}")
    vb = V.shape[:-2]
    hb = () if vector else h.shape[:-2]
    if vb == hb or not hb:
        batch = vb
    elif not vb:
        batch = hb
    else:
        batch = tuple(np.broadcast_shapes(vb, hb))
    return n, V.shape[-1], batch, vector, 1 if vector else h.shape[-1]


def _operands(V: np.ndarray, x: np.ndarray, name: str) -> tuple:
    """(dtype, n, L, batch, P, vector, B, V3 (Pv, n, L), X3 (Px, n, B)) for the kernels.
    Unbatched contiguous inputs take a short path: this is most of a tiny call's overhead."""
    dtype = _dtype_of(V, x)
    if V.ndim == 2 and 1 <= x.ndim <= 2:
        n, L = V.shape
        if L > n:
            raise ValueError(f"V must have shape (..., N, L) with L <= N; got {V.shape}")
        if x.shape[0] != n:
            raise ValueError(f"{name} must have shape ({n},) or (..., {n}, B); got {x.shape}")
        B = 1 if x.ndim == 1 else x.shape[1]
        V3 = V[None]
        if V.dtype is not dtype or not V.flags.c_contiguous:
            V3 = np.ascontiguousarray(V3, dtype=dtype)
        X3 = x.reshape((1, n, B))
        if x.dtype is not dtype or not X3.flags.c_contiguous:
            X3 = np.ascontiguousarray(X3, dtype=dtype)
        return dtype, n, L, (), 1, x.ndim == 1, B, V3, X3
    n, L, batch, vector, B = _shapes(V, x, name)
    P = math.prod(batch)
    if P == 0:
        return dtype, n, L, batch, 0, vector, B, None, None
    V3 = _as3(V, batch, P, (n, L), dtype)
    X3 = _as3(x, batch, P, (n,), dtype) if vector else _as3(x, batch, P, (n, B), dtype)
    return dtype, n, L, batch, P, vector, B, V3, X3.reshape((X3.shape[0], n, B))


def _rescaled(V3: np.ndarray, trapezoidal: bool) -> tuple[np.ndarray, np.ndarray]:
    """V3 with each finite nonzero column multiplied by c = 2^−e, its max-abs entry m = f·2^e
    (f ∈ [½, 1)), computed in float64 (exact), and c (Pv, 1, L). H(c v) = H(v)."""
    W = np.tril(V3) if trapezoidal else V3
    m = np.max(np.abs(W), axis=-2, keepdims=True).astype(np.float64)
    ok = np.isfinite(m) & (m > 0)
    c = np.where(ok, np.ldexp(1.0, -np.frexp(np.where(ok, m, 1.0))[1]), 1.0)
    with np.errstate(over="ignore", invalid="ignore"):  # entries above a trapezoid: unused
        Vs = (V3.astype(np.float64) * c).astype(V3.dtype)
    return Vs, c


def _raise_nonfinite(V: Any, trapezoidal: bool) -> None:
    from ._compact_wy import check_finite_norms

    W = np.tril(V) if trapezoidal else V
    check_finite_norms(np.max(np.abs(W), axis=-2, keepdims=True), np)


def hprod(
    V: Any, h: Any, *, trapezoidal: bool = False, transpose: bool = False, check: bool = True
) -> np.ndarray:
    """y = H(v₁)(H(v₂)(…H(v_L) h)) (``transpose``: H(v_L)…H(v₁) h) by the Numba kernel.

    Parameters
    ----------
    V : ndarray, shape (..., N, L), L ≤ N
        Unnormalised reflection vectors; a zero column is the identity. Read, never written.
    h : ndarray, shape (N,) or (..., N, B)
        Right operand (``matmul`` rules; batch axes broadcast with V's).
    trapezoidal : bool
        Column k is zero above row k (oRNN layout); those entries are not read.
    transpose : bool
        Apply Qᵀ = H(v_L)…H(v₁) instead of Q.
    check : bool
        Raise ``ValueError`` for NaN/Inf in V (else they propagate as NaN).

    Returns
    -------
    ndarray, shape (..., N) or (..., N, B), dtype of the inputs (float32 or float64)
        Freshly allocated. 4·N·L·B flops (dense), (4N − L + 2)·L·B (trapezoidal, seed 001
        Table 2), plus 2·N·L for the ‖v_k‖².
    """
    V, h = np.asarray(V), np.asarray(h)
    dt = V.dtype
    if (  # one vector, one V, contiguous, same dtype: the short path of a tiny call
        V.ndim == 2
        and h.ndim == 1
        and h.dtype is dt
        and (dt is _F64 or dt is _F32)
        and V.shape[1] <= V.shape[0] == h.shape[0]
        and V.flags.c_contiguous
        and h.flags.c_contiguous
    ):
        y = np.empty_like(h)
        status = _fp_vec_kernel(V, h, y, trapezoidal, transpose, SAFE_EXP[dt])
        if status >= 0:
            if status and check:
                _raise_nonfinite(V, trapezoidal)
            return y
    dtype, n, _, batch, P, vector, B, V3, H3 = _operands(V, h, "h")
    Y = np.empty((*batch, n) if vector else (*batch, n, B), dtype)
    if P == 0:
        return Y
    Y3 = Y.reshape((P, n, B))
    status = _fp_kernel(V3, H3, Y3, trapezoidal, transpose, SAFE_EXP[dtype])
    if status < 0:  # some ‖v_k‖² outside the safe range: rescale those columns (exact)
        status = _fp_kernel(
            _rescaled(V3, trapezoidal)[0], H3, Y3, trapezoidal, transpose, SAFE_EXP[dtype]
        )
    if status and check:
        _raise_nonfinite(V, trapezoidal)
    return Y


def hgrad(
    V: Any,
    g: Any,
    *,
    h: Any = None,
    y: Any = None,
    trapezoidal: bool = False,
    transpose: bool = False,
    check: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Backward of :func:`hprod`: (V̄, h̄) for the cotangent ``g`` of y = hprod(V, h).

    Give the input ``h`` (the output is recomputed, 4·N·L·B more flops) or the output ``y``
    (seed 001 Algorithm 1's BP, which starts from C = y). Exactly one of them.

    Returns
    -------
    V_bar : ndarray, shape of V
        Full gradient with respect to the unnormalised columns (seed 002 eq. 15); zero
        columns get zero; with ``trapezoidal`` the entries above the diagonal get zero.
    h_bar : ndarray, shape of h (or of y)
        H(v_L)…H(v₁) g (seed 001 eq. 15), summed over the batch axes h was broadcast along.

    Notes
    -----
    11·N·L·B flops (dense; seed 002 Table 1: Hgrad 3n + 6k plus the 4k recomputation) with
    O(N·B) working memory: each reflection's input is recovered from its output. Non-finite
    V gives NaN (``check=False``, like the NumPy VJP) or raises (``check=True``).
    """
    if (h is None) == (y is None):
        raise ValueError("give exactly one of h (the input) or y (the output)")
    x_name = "h" if y is None else "y"
    V, x, g = np.asarray(V), np.asarray(h if y is None else y), np.asarray(g)
    dtype, n, _, batch, P, vector, B, V3, X3 = _operands(V, x, x_name)
    gshape = (*batch, n) if vector else (*batch, n, B)
    if g.shape != gshape:
        raise ValueError(f"g must have the shape of the output {gshape}; got {tuple(g.shape)}")
    if y is not None and x.shape != gshape:
        raise ValueError(f"y must have the shape of the output {gshape}; got {tuple(x.shape)}")
    if P == 0:
        return np.zeros(V.shape, dtype), np.zeros(x.shape, dtype)
    G3 = g.reshape((P, n, B))
    if g.dtype is not dtype or not G3.flags.c_contiguous:
        G3 = np.ascontiguousarray(G3, dtype=dtype)
    Vb = np.empty(V3.shape, dtype)
    Hb = np.empty(X3.shape, dtype)
    args = (y is not None, trapezoidal, transpose, SAFE_EXP[dtype])
    status = _bp_kernel(V3, X3, G3, Vb, Hb, *args)
    if status < 0:  # rescale the columns whose ‖v‖² is out of range; v̄ = c·v̄' (degree −1)
        Vs, c = _rescaled(V3, trapezoidal)
        status = _bp_kernel(Vs, X3, G3, Vb, Hb, *args)
        with np.errstate(over="ignore"):  # a gradient beyond the dtype's range is ±inf
            Vb = (Vb * c).astype(dtype)
    if status and check:
        _raise_nonfinite(V, trapezoidal)
    V_bar = _unbroadcast(Vb, tuple(V.shape), batch)
    h_bar = _unbroadcast(Hb, (*x.shape, 1) if vector else tuple(x.shape), batch)
    return V_bar, (h_bar.reshape(x.shape) if vector else h_bar)


def _unbroadcast(a3: np.ndarray, shape: tuple[int, ...], batch: tuple[int, ...]) -> np.ndarray:
    """The kernel's (P', *tail) gradient back to ``shape`` (sum over broadcast batch axes)."""
    if a3.shape[0] == 1 or a3.size == math.prod(shape):
        return a3.reshape(shape)
    from ._compact_wy import sum_to_shape

    return sum_to_shape(a3.reshape((*batch, *a3.shape[1:])), shape, np)
