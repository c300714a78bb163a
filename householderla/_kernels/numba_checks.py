"""One-pass Numba scans of reflector stacks that NumPy needs several full-size temporaries for.

For batches of small matrices (8192 of 16 × 16 is 16 MB) the value checks around a kernel
cost as much as the kernel itself when done with NumPy expressions: ``np.triu(V) == 0``
allocates two copies of V, and building LAPACK's unit lower trapezoid, its column norms and
the τ check took five passes (figures: ``benchmarks/results/tuning.md``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .numba_loops import HAVE_NUMBA, njit

__all__ = [
    "finite_lower",
    "lapack_check",
    "lapack_check_columns",
    "lapack_check_transposed",
    "lapack_unit_lower",
    "lapack_unit_lower_columns",
    "unit_reflectors",
    "upper_is_zero",
]

#: A hash of the sibling kernel modules this one imports: Numba's on-disk cache keys a
#: compiled function on its own file only, so changing this line when one of them changes
#: makes the cache recompile (tests/test_numba_kernels.py checks it).
KERNEL_DEPS = "b0a0beb634880961"


def _sigs(kind: str) -> Any:
    if not HAVE_NUMBA:
        return None
    from numba import types as nt

    out = []  # C order (the callers copy other layouts): direct indexing, loops vectorise
    for f in (nt.float32, nt.float64):
        if kind == "upper":
            out.append(nt.boolean(nt.Array(f, 3, "C", readonly=True)))
        elif kind == "lapack_check":
            ro3, ro2 = nt.Array(f, 3, "C", readonly=True), nt.Array(f, 2, "C", readonly=True)
            out.append(nt.Tuple((nt.float64, nt.int64))(ro3, ro2))
        elif kind == "columns":
            ro2, ro1 = nt.Array(f, 2, "C", readonly=True), nt.Array(f, 1, "C", readonly=True)
            out.append(nt.Tuple((nt.float64, nt.int64))(ro2, ro1, nt.Array(f, 2, "C")))
        elif kind == "check_columns":
            ro2, t1 = (
                nt.Array(f, 2, "C", readonly=True),
                nt.Array(nt.complex128, 1, "C", readonly=True),
            )
            out.append(nt.Tuple((nt.float64, nt.int64))(ro2, t1, nt.int64, nt.boolean))
        elif kind == "scan":
            out.append(nt.Tuple((nt.boolean, nt.boolean))(nt.Array(f, 3, "C", readonly=True)))
        else:
            ro3, ro2 = nt.Array(f, 3, "C", readonly=True), nt.Array(f, 2, "C", readonly=True)
            out.append(nt.Tuple((nt.float64, nt.int64))(ro3, ro2, nt.Array(f, 3, "C")))
    return out


@njit(_sigs("upper"))
def upper_is_zero(V: Any) -> bool:
    """Whether every V[p, i, k] with k > i is 0 (lower trapezoidal; NaN counts as nonzero),
    for V (P, N, L) C-contiguous: one read of the strict upper part, stopping at the first
    nonzero entry (an integer OR of the bits per matrix, branch-free, was 2.5× slower at
    N = 64)."""
    P, N, L = V.shape
    for p in range(P):
        for i in range(min(N, L)):
            for k in range(i + 1, L):
                if not V[p, i, k] == 0:
                    return False
    return True


@njit(_sigs("scan"))
def finite_lower(V: Any) -> Any:
    """(every entry of V finite, every V[p, i, k] with k > i zero (NaN counts as nonzero))
    for V (P, N, L) C-contiguous: the value check and the structure check of a reflector
    stack in one read of V, branch-free, so both ORs vectorise over each flattened matrix.
    About three times faster than ``np.isfinite(V).all()`` and :func:`upper_is_zero` in turn
    (``benchmarks/results/tuning.md``)."""
    P, N, L = V.shape
    n = N * L
    upper = np.zeros(n, np.bool_)  # the positions k > i of a row-major N × L matrix
    for i in range(min(N, L)):
        upper[i * L + i + 1 : (i + 1) * L] = True
    flat = V.reshape((P, n))
    bad = False
    nonzero = False
    for p in range(P):
        row = flat[p]
        for q in range(n):  # x·0 is NaN exactly for NaN and ±Inf; ORs, which vectorise
            x = row[q]
            t = x * 0
            bad |= t != t
            nonzero |= upper[q] & (x != 0)
    return not bad, not nonzero


@njit(inline="always")
def unit_reflectors(a: Any, tau: Any, V: Any) -> None:
    """V (N, L) ← LAPACK's reflectors of one ``a`` (N, ≥ L) with τ (L,), as ``?orgqr`` reads
    them: column k is 0 where τ_k = 0 (H = I), else e_k + the entries of ``a`` below the
    diagonal (the unit diagonal implied, nothing above it read)."""
    N, L = V.shape
    for i in range(N):
        for k in range(L):
            x = a[i, k] if i > k else (1 if i == k else 0)
            V[i, k] = x if tau[k] != 0 else 0


@njit(inline="always")
def _unit_lower(ap: Any, Vp: Any, ss: Any, wide: bool) -> None:
    """Vp ← tril(ap[:, :k], −1) + I (k = Vp.shape[1]), ss ← its column norms² (float64)."""
    m, k = Vp.shape
    ss[:k] = 1  # the unit diagonal
    for r in range(m):
        ar = ap[r]
        Vr = Vp[r]
        lim = min(r, k)
        if wide:  # a whole-row slice copy, then the sums: 1.6× faster at k = 64
            Vr[:] = ar[:k]
            for i in range(lim):
                ss[i] += np.float64(ar[i]) * np.float64(ar[i])
        else:  # one loop: 2.5× faster at k = 8
            for i in range(lim):
                x = ar[i]
                Vr[i] = x
                ss[i] += np.float64(x) * np.float64(x)
        if r < k:
            Vr[r] = 1
            for i in range(r + 1, k):
                Vr[i] = 0


@njit(inline="always")
def _tau_check(a: Any, tau: Any, p: int, ss: Any, V: Any) -> Any:
    """(max over τ_i ≠ 0 of |τ_i ‖v_i‖²/2 − 1|, the number of non-finite entries below the
    diagonal of those columns) for ``a[p]`` (m, n) with τ[p] (k,) and ss the ‖v_i‖²; zeroes
    the columns with τ_i = 0 of V (m, k), unless V has no columns (nothing built)."""
    worst = 0.0
    nonfinite = 0
    for i in range(tau.shape[1]):
        t = np.float64(tau[p, i])
        if t == 0:  # H(i) = I whatever the column holds
            if V.shape[1]:
                V[:, i] = 0
            continue
        err = abs(t * ss[i] / 2 - 1)
        if not err <= 1.7976931348623157e308:  # ‖v‖² overflowed, or NaN/Inf in a
            nonfinite += _nonfinite_below(a, p, i)
            err = np.inf
        worst = max(worst, err)
    return worst, nonfinite


@njit(inline="always")
def _nonfinite_below(a: Any, p: int, i: int) -> int:
    """The number of NaN/Inf entries below the diagonal of column i of ``a[p]`` (``a``
    indexed whole: a view per matrix cost the k ≤ 4 check a third of its time)."""
    nonfinite = 0
    for r in range(i + 1, a.shape[1]):
        if not abs(np.float64(a[p, r, i])) <= 1.7976931348623157e308:
            nonfinite += 1
    return nonfinite


@njit(_sigs("lapack_check"))
def lapack_check(a: Any, tau: Any) -> Any:
    """:func:`lapack_unit_lower`'s checks without building V: one read of the entries below
    the diagonal of ``a`` (P, m, n) C-contiguous, τ (P, k). For the batched kernels that read
    ``a`` in place (:func:`householderla._kernels.numba_lanes.apply_lanes` with ``unit``)."""
    P, m, _ = a.shape
    k = tau.shape[1]
    ss = np.empty(max(k, 1), np.float64)
    none = np.empty((m, 0), a.dtype)
    worst = 0.0
    nonfinite = 0
    if k <= 4:  # few columns: each ‖v_i‖² and its check in registers (faster at N = 3)
        for p in range(P):
            for i in range(k):
                t = np.float64(tau[p, i])
                if t == 0:
                    continue
                x = 1.0
                for r in range(i + 1, m):
                    y = np.float64(a[p, r, i])
                    x += y * y
                err = abs(t * x / 2 - 1)
                if err <= 1.7976931348623157e308:
                    worst = max(worst, err)
                else:  # ‖v‖² overflowed, or NaN/Inf in a (as _tau_check)
                    nonfinite += _nonfinite_below(a, p, i)
                    worst = np.inf
        return worst, nonfinite
    for p in range(P):
        ss[:k] = 1
        for r in range(m):
            for i in range(min(r, k)):
                x = np.float64(a[p, r, i])
                ss[i] += x * x
        w, bad = _tau_check(a, tau, p, ss, none)
        worst = max(worst, w)
        nonfinite += bad
    return worst, nonfinite


@njit(_sigs("lapack"))
def lapack_unit_lower(a: Any, tau: Any, V: Any) -> Any:
    """V[p] ← LAPACK's reflectors of ``a[p]`` (P, m, n), τ (P, k): column i is
    e_i + tril(a[p], −1)[:, i] where τ_i ≠ 0, else 0, for V (P, m, k) C-contiguous.

    Returns (max over τ_i ≠ 0 of |τ_i ‖v_i‖²/2 − 1| in float64 — inf where ‖v_i‖² overflows
    —, the number of non-finite entries below the diagonal of the columns with τ_i ≠ 0),
    from the same pass (a second one over a column only where its ‖v_i‖² is not finite)."""
    P, m, _ = a.shape
    k = tau.shape[1]
    ss = np.empty(max(k, 1), np.float64)
    worst = 0.0
    nonfinite = 0
    for p in range(P):
        if k >= 32:
            _unit_lower(a[p], V[p], ss, True)
        else:  # direct indexing: row views cost more than the copy at k ≤ 8
            ss[:k] = 1
            for r in range(m):
                for i in range(min(r, k)):
                    x = a[p, r, i]
                    V[p, r, i] = x
                    ss[i] += np.float64(x) * np.float64(x)
                if r < k:
                    V[p, r, r] = 1
                    for i in range(r + 1, k):
                        V[p, r, i] = 0
        w, bad = _tau_check(a, tau, p, ss, V[p])
        worst = max(worst, w)
        nonfinite += bad
    return worst, nonfinite


@njit(inline="always")
def _squares_from(src: Any, r: int) -> float:
    """Σ src[r:]² in float64, in four independent partial sums (one sum's add latency would
    bound the loop)."""
    n = src.shape[0]
    s0 = s1 = s2 = s3 = 0.0
    while r + 4 <= n:
        x0, x1 = np.float64(src[r]), np.float64(src[r + 1])
        x2, x3 = np.float64(src[r + 2]), np.float64(src[r + 3])
        s0 += x0 * x0
        s1 += x1 * x1
        s2 += x2 * x2
        s3 += x3 * x3
        r += 4
    while r < n:
        x0 = np.float64(src[r])
        s0 += x0 * x0
        r += 1
    return (s0 + s1) + (s2 + s3)


@njit(inline="always")
def _nonfinite_from(src: Any, r: int) -> int:
    """The number of NaN/Inf entries of src[r:] (the error path only)."""
    nonfinite = 0
    for j in range(r, src.shape[0]):
        if not abs(np.float64(src[j])) <= 1.7976931348623157e308:
            nonfinite += 1
    return nonfinite


@njit(_sigs("columns"))
def lapack_unit_lower_columns(at: Any, tau: Any, Vt: Any) -> Any:
    """:func:`lapack_unit_lower` for one column-major ``a`` (m, n), LAPACK's own layout,
    given as its transpose ``at`` (n, m) C-contiguous (row i is column i of ``a``), τ (k,),
    into Vt (k, m) C-contiguous (V in column-major order). Each column is one contiguous
    row here: zeros, the unit diagonal, a copy of the entries below it, and their squares
    summed in float64 in four independent partial sums (one sum's add latency would bound
    the loop). No copy of ``a`` to C order, which the batched kernel needs. Memory-bound
    once V leaves the caches (about twice a plain copy of ``a``).

    Returns (max over τ_i ≠ 0 of |τ_i ‖v_i‖²/2 − 1|, inf where ‖v_i‖² overflows; the number
    of non-finite entries below the diagonal of those columns)."""
    k = tau.shape[0]
    worst = 0.0
    nonfinite = 0
    for i in range(k):
        row = Vt[i]
        t = np.float64(tau[i])
        if t == 0:  # H(i) = I whatever the column holds
            row[:] = 0
            continue
        row[:i] = 0
        row[i] = 1
        src = at[i]
        row[i + 1 :] = src[i + 1 :]
        err = abs(t * (1.0 + _squares_from(src, i + 1)) / 2 - 1)
        if not err <= 1.7976931348623157e308:  # ‖v‖² overflowed, or NaN/Inf in a
            nonfinite += _nonfinite_from(src, i + 1)
            err = np.inf
        worst = max(worst, err)
    return worst, nonfinite


@njit(_sigs("check_columns"))
def lapack_check_columns(at: Any, tau: Any, f: int, cx: bool) -> Any:
    """:func:`lapack_unit_lower_columns`' checks without building V, for real or complex
    column-major ``a`` (m, n): ``at`` is aᵀ (n, m·f) C-contiguous read as reals (f = 2 for
    complex ``a``: row i holds column i's real and imaginary parts interleaved), τ (k,) as
    complex128. Column i with τᵢ ≠ 0: ‖vᵢ‖² = 1 + Σ of the squares past its diagonal (four
    float64 partial sums), against τ: |τᵢ‖vᵢ‖²/2 − 1| (real) or ||1 − τᵢ‖vᵢ‖²| − 1| (complex,
    ``cx``: H(i) unitary). One read of the lower trapezoid, nothing written. Returns (the
    worst mismatch, inf where ‖vᵢ‖² is not finite; the number of non-finite reals below the
    diagonal of those columns)."""
    k = tau.shape[0]
    worst = 0.0
    nonfinite = 0
    for i in range(k):
        t = tau[i]
        if t == 0:  # H(i) = I whatever the column holds
            continue
        src = at[i]
        ss = 1.0 + _squares_from(src, (i + 1) * f)
        err = abs(abs(1 - t * ss) - 1) if cx else abs(t.real * ss / 2 - 1)
        if not err <= 1.7976931348623157e308:  # ‖v‖² overflowed, or NaN/Inf in a
            nonfinite += _nonfinite_from(src, (i + 1) * f)
            err = np.inf
        worst = max(worst, err)
    return worst, nonfinite


@njit(_sigs("lapack_check"))
def lapack_check_transposed(at: Any, tau: Any) -> Any:
    """:func:`lapack_check` for a stack of column-major ``a`` (P, m, n) given as its C-contiguous
    transpose ``at`` (P, n, m): row i of ``at[p]`` is column i of ``a[p]`` (``torch.geqrf``'s
    and LAPACK's layout), read in place. Each ‖v_i‖² = 1 + Σ_{r > i} a_ri² is summed in
    float64 in row order, as :func:`lapack_check` sums it, eight columns at a time (eight
    independent sums in registers, where one would wait on its adder), so the result is the
    row-major copy's bit for bit. Nothing on or above the diagonal is read."""
    P, _, m = at.shape
    k = tau.shape[1]
    acc = np.empty(8, np.float64)
    worst = 0.0
    nonfinite = 0
    for p in range(P):
        for i0 in range(0, k, 8):
            nb = min(8, k - i0)
            acc[:] = 1.0  # the unit diagonal
            r8 = min(i0 + 8, m) if nb == 8 else m
            for r in range(i0 + 1, r8):  # the triangle: the columns i0 + j < r
                for j in range(min(nb, r - i0)):
                    x = np.float64(at[p, i0 + j, r])
                    acc[j] += x * x
            if r8 < m:  # the rectangle below: all eight columns, each sum in a register
                a0, a1, a2, a3, a4, a5, a6, a7 = (
                    acc[0],
                    acc[1],
                    acc[2],
                    acc[3],
                    acc[4],
                    acc[5],
                    acc[6],
                    acc[7],
                )
                for r in range(r8, m):
                    x0, x1 = np.float64(at[p, i0, r]), np.float64(at[p, i0 + 1, r])
                    x2, x3 = np.float64(at[p, i0 + 2, r]), np.float64(at[p, i0 + 3, r])
                    x4, x5 = np.float64(at[p, i0 + 4, r]), np.float64(at[p, i0 + 5, r])
                    x6, x7 = np.float64(at[p, i0 + 6, r]), np.float64(at[p, i0 + 7, r])
                    a0 += x0 * x0
                    a1 += x1 * x1
                    a2 += x2 * x2
                    a3 += x3 * x3
                    a4 += x4 * x4
                    a5 += x5 * x5
                    a6 += x6 * x6
                    a7 += x7 * x7
                acc[0], acc[1], acc[2], acc[3] = a0, a1, a2, a3
                acc[4], acc[5], acc[6], acc[7] = a4, a5, a6, a7
            for j in range(nb):
                t = np.float64(tau[p, i0 + j])
                if t == 0:  # H(i) = I whatever the column holds
                    continue
                err = abs(t * acc[j] / 2 - 1)
                if not err <= 1.7976931348623157e308:  # ‖v‖² overflowed, or NaN/Inf in a
                    nonfinite += _nonfinite_from(at[p, i0 + j], i0 + j + 1)
                    err = np.inf
                worst = max(worst, err)
    return worst, nonfinite
