"""The Numba kernels of the sequential Householder paths against the Array API (NumPy) path.

Tolerances. Both paths apply the same L reflections one at a time, but the kernels use τ = 2/‖v‖² on
the unnormalised columns (Zhang, Lei & Dhillon, ICML 2018, Algorithm 2) and dot products with four
partial sums, while the NumPy path normalises u = v/‖v‖ and applies y − 2u(uᵀy) with BLAS dot
products. Each reflection then differs by a few ulps (the dot products' rounding grows only like
√N·eps for random data), and the differences add over the L reflections. Measured on random data (N
≤ 512, both dtypes): max|Δy| ≤ 0.3·eps·L·‖h‖∞ and max|ΔV̄| ≤ 0.95·eps·L· max|V̄|; the bound is
5·eps·L·scale (5× the worst seen), while a wrong sign, a missing term or a skipped reflection is off
by O(1). Where the two sides run the *same* operations in the same order (a column of a block vs
that column alone, trapezoidal vs dense mode on a lower-trapezoidal V) the results are compared bit
for bit.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import get_backend, require
from helpers import (
    EPS,
    assert_vjp_matches_central_differences,
    batch_case,
    per_matrix_hprod,
    product_of_reflections,
)

import householderla as hl
from householderla import householder as hh
from householderla._kernels import numba_for

require("numba")
from householderla._kernels import numba as nk  # noqa: E402

assert nk.HAVE_NUMBA

DTYPES = [np.float32, np.float64]


@pytest.fixture
def numpy_path(monkeypatch):
    """Force householder_apply / householder_apply_vjp onto the pure NumPy path."""
    monkeypatch.setenv("HL_DISABLE_NUMBA", "1")


def _tol(dtype, N, L, scale):
    return 5 * EPS[np.dtype(dtype).type] * max(L, 1) * max(scale, 1e-300)


def _reference_apply(V, h, monkeypatch):
    with monkeypatch.context() as m:
        m.setenv("HL_DISABLE_NUMBA", "1")
        return hl.householder_apply(V, h)


def _reference_vjp(V, h, g, monkeypatch):
    with monkeypatch.context() as m:
        m.setenv("HL_DISABLE_NUMBA", "1")
        return hl.vjp.householder_apply(V, h, g)


CASES = [  # (V shape, h shape)
    ((16, 5), (16,)),
    ((16, 5), (16, 3)),
    ((33, 33), (33, 4)),
    ((3, 12, 4), (12, 2)),  # batched V, shared h
    ((12, 4), (3, 12, 2)),  # shared V, batched h
    ((2, 1, 9, 3), (1, 3, 9, 5)),  # genuine broadcasting of both
    ((3, 9, 3), (9,)),  # batched V, one vector
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("vshape", "hshape"), CASES)
def test_forward_matches_numpy_path(dtype, vshape, hshape, monkeypatch):
    rng = np.random.default_rng(1)
    V = rng.standard_normal(vshape).astype(dtype)
    V[..., 1] = 0.0  # a zero column is the identity
    h = rng.standard_normal(hshape).astype(dtype)
    y = nk.hprod(V, h)
    ref = _reference_apply(V, h, monkeypatch)
    assert y.dtype == dtype and y.shape == ref.shape
    N, L = vshape[-2:]
    assert np.max(np.abs(y - ref)) <= _tol(dtype, N, L, np.max(np.abs(h)))
    # the dispatch: householder_apply now runs the kernel, bit for bit
    np.testing.assert_array_equal(hl.householder_apply(V, h), y)
    # and it is the product of reflections (float64 oracle)
    if dtype == np.float64 and len(vshape) == 2:
        np.testing.assert_allclose(y, product_of_reflections(V) @ h, atol=1e-13)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("vshape", "hshape"), CASES)
def test_vjp_matches_numpy_path(dtype, vshape, hshape, monkeypatch):
    rng = np.random.default_rng(2)
    V = rng.standard_normal(vshape).astype(dtype)
    V[..., 1] = 0.0
    h = rng.standard_normal(hshape).astype(dtype)
    y = nk.hprod(V, h)
    g = rng.standard_normal(y.shape).astype(dtype)
    Vb, hb = nk.hgrad(V, g, h=h)
    Vr, hr = _reference_vjp(V, h, g, monkeypatch)
    assert Vb.shape == V.shape and hb.shape == h.shape
    assert Vb.dtype == dtype and hb.dtype == dtype
    N, L = vshape[-2:]
    # V̄ sums over the batch entries V was broadcast along: scale the bound by their number
    reps = y.size // (h.size if h.ndim > 1 else N) if len(vshape) == 2 else 1
    assert np.max(np.abs(Vb - Vr)) <= reps * _tol(dtype, N, L, np.max(np.abs(Vr)))
    assert np.max(np.abs(hb - hr)) <= reps * _tol(dtype, N, L, np.max(np.abs(hr)))
    np.testing.assert_array_equal(Vb[..., 1], 0.0)  # zero column: zero gradient, never NaN
    got = hl.vjp.householder_apply(V, h, g)  # the dispatch runs the kernel
    np.testing.assert_array_equal(got[0], Vb)
    np.testing.assert_array_equal(got[1], hb)


@pytest.mark.parametrize("dtype", DTYPES)
def test_vjp_from_output_equals_vjp_from_input(dtype):
    """Mhammedi et al., ICML 2017, Algorithm 1's BP starts from the output C = y; recomputing y
    from h first
    must give the same gradients (the forward replay is the same kernel)."""
    rng = np.random.default_rng(3)
    V = rng.standard_normal((20, 6)).astype(dtype)
    h = rng.standard_normal((20, 3)).astype(dtype)
    g = rng.standard_normal((20, 3)).astype(dtype)
    a = nk.hgrad(V, g, h=h)
    b = nk.hgrad(V, g, y=nk.hprod(V, h))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    with pytest.raises(ValueError, match="exactly one of h"):
        nk.hgrad(V, g)
    with pytest.raises(ValueError, match="g must have the shape"):
        nk.hgrad(V, g[:, :2], h=h)


@pytest.mark.parametrize("batch", [(), (2,)])
def test_vjp_dot_product_test(batch):
    """The dispatched VJP (Numba kernel) against central differences, float64."""
    bk = get_backend("numpy")
    rng = np.random.default_rng(4)
    V = rng.standard_normal((*batch, 7, 4))
    V[..., 2] = 0.0
    h = rng.standard_normal((7, 3))

    def freeze(dirs):
        dirs[0][..., 2] = 0.0

    grads = assert_vjp_matches_central_differences(
        bk, hl.householder_apply, hl.vjp.householder_apply, [V, h], rng, freeze
    )
    np.testing.assert_array_equal(grads[0][..., 2], 0.0)


def test_trapezoidal_vjp_dot_product_test():
    """Trapezoidal mode: the gradient with respect to the entries on and below the diagonal
    (the only parameters in oRNN's layout), by central differences along such directions."""
    rng = np.random.default_rng(5)
    V = np.tril(rng.standard_normal((8, 5)))
    h, g = rng.standard_normal(8), rng.standard_normal(8)
    Vb, hb = nk.hgrad(V, g, h=h, trapezoidal=True)
    np.testing.assert_array_equal(np.triu(Vb, 1), 0.0)
    dV, dh, eps = np.tril(rng.standard_normal(V.shape)), rng.standard_normal(8), 1e-6

    def f(V, h):
        return g @ nk.hprod(V, h, trapezoidal=True)

    fd = (f(V + eps * dV, h + eps * dh) - f(V - eps * dV, h - eps * dh)) / (2 * eps)
    an = np.sum(Vb * dV) + hb @ dh
    assert abs(fd - an) <= 1e-7 * (np.linalg.norm(Vb) * np.linalg.norm(dV) + 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transpose", [False, True])
def test_trapezoidal_equals_dense_and_columns_equal_blocks(dtype, transpose):
    """Same operations in the same order, bit for bit: trapezoidal mode skips only exact
    zeros, and every dot product groups rows by index mod 4 whatever the block width."""
    rng = np.random.default_rng(6)
    for n, L in [(9, 9), (13, 5), (17, 16)]:
        V = np.tril(rng.standard_normal((n, L))).astype(dtype)
        V[:, L // 2] = 0.0
        H = rng.standard_normal((n, 4)).astype(dtype)
        dense = nk.hprod(V, H, transpose=transpose)
        np.testing.assert_array_equal(nk.hprod(V, H, trapezoidal=True, transpose=transpose), dense)
        for j in range(4):
            np.testing.assert_array_equal(nk.hprod(V, H[:, j], transpose=transpose), dense[:, j])
        G = rng.standard_normal((n, 4)).astype(dtype)
        Vb, hb = nk.hgrad(V, G, h=H, transpose=transpose)
        Vt, ht = nk.hgrad(V, G, h=H, trapezoidal=True, transpose=transpose)
        np.testing.assert_array_equal(Vt, np.tril(Vb))
        np.testing.assert_array_equal(ht, hb)


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_vector_kernel_equals_its_scalar_reference_bit_for_bit(dtype):
    """The one-vector entry kernel (:mod:`householderla._kernels.numba_vec`: V transposed so its
    columns are contiguous, one pass per reflection for its update, the next dot product and
    the next ‖v‖², the four partial sums by row mod 4 packed in one vector) must give the bits
    of the scalar loops it replaced (``numba_taus.taus`` then ``numba_loops.apply_vec``) and
    of a column of the block kernel: N and L not multiples of 4 or 8 (scalar heads and tails,
    the transpose's leftovers), trapezoidal V with NaN above the diagonal (never read),
    either order, zero columns (skipped, a fresh dot pass after them), the status of a column
    to rescale (−1) and of a NaN column (counted, applied). A vector lane that summed the
    wrong rows, a norm taken from other rows, or a zero column not skipped would differ."""
    from householderla._kernels.numba_loops import apply_vec
    from householderla._kernels.numba_taus import SAFE_EXP, taus
    from householderla._kernels.numba_vec import fp_vec_kernel

    safe = SAFE_EXP[np.dtype(dtype)]
    rng = np.random.default_rng(40)
    cases = [(128, 16), (130, 17), (33, 20), (64, 64), (7, 7), (9, 3), (1, 1), (5, 0)]
    for (n, L), trap, transpose, zero in itertools.product(
        cases, (False, True), (False, True), (False, True)
    ):
        V = rng.standard_normal((n, L)).astype(dtype)
        if trap:
            V = np.tril(V)
            V[np.triu(np.ones((n, L), bool), 1)] = np.nan
        if zero and L > 2:
            V[:, [0, L // 2, L - 1]] = 0
        h = rng.standard_normal(n).astype(dtype)
        tau = np.empty(L, dtype)
        nonfinite, outside = taus(V, trap, safe, tau)
        assert (nonfinite, outside) == (0, 0)
        ref = h.copy()
        apply_vec(V, tau, ref, trap, transpose)
        y = h.copy()
        assert fp_vec_kernel(V, y, trap, transpose) == 0
        assert np.array_equal(y, ref), (n, L, trap, transpose, zero)
        if L:
            block = nk.hprod(V, np.stack([h, -h], 1), trapezoidal=trap, transpose=transpose)
            assert np.array_equal(block[:, 0], y)
    V = rng.standard_normal((10, 4)).astype(dtype)
    W = V.copy()
    W[:, 1] *= 2.0 ** (-safe)  # ‖v‖² below the safe range: rescale first
    assert fp_vec_kernel(W, np.ones(10, dtype), False, False) == -1
    W = V.copy()
    W[3, 2] = np.nan
    y = np.ones(10, dtype)
    assert fp_vec_kernel(W, y, False, False) == 1
    assert np.all(np.isnan(y))


def _unfused_passes(V, H, G, trap, transpose):
    """The block kernels' arithmetic as separate passes per reflection, in Python: forward, a
    dot pass (``_dots_block``'s ``py_func``) then an update pass; backward, a dot pass with y
    and one with g, then per row v̄ (partial sums by column mod 4, the tail in the first) and
    the updates of y and g. Returns (Q h, V̄, h̄)."""
    from householderla._kernels import numba_loops as nl
    from householderla._kernels import numba_taus as nt

    dots = nl._dots_block.py_func
    (n, L), B = V.shape, H.shape[1]
    tau, status = nt.all_taus(V[None], trap, nt.SAFE_EXP[V.dtype])
    assert status == 0
    tau = tau[0]
    acc, c = np.zeros((4, B), V.dtype), np.zeros((2, B), V.dtype)
    order = [k for k in (range(L) if transpose else range(L - 1, -1, -1)) if tau[k] != 0]
    Y = H.copy()
    for k in order:
        s = k if trap else 0
        dots(V, k, Y, s, acc, c, 0)
        c[0] *= tau[k]
        Y[s:] -= V[s:, k, None] * c[0]
    out, Gw, Vb = Y.copy(), G.copy(), np.zeros_like(V)
    lane = [b % 4 if b < B - B % 4 else 0 for b in range(B)]
    for k in order[::-1]:
        s = k if trap else 0
        dots(V, k, Y, s, acc, c, 0)
        dots(V, k, Gw, s, acc, c, 1)
        c *= tau[k]
        for i in range(s, n):
            w = [V.dtype.type(0)] * 4
            for b in range(B):
                w[lane[b]] += Gw[i, b] * c[0, b] - Y[i, b] * c[1, b]
            Vb[i, k] += (w[0] + w[1]) + (w[2] + w[3])
            Y[i] -= c[0] * V[i, k]
            Gw[i] -= c[1] * V[i, k]
    return out, Vb, Gw


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("trap", [False, True])
@pytest.mark.parametrize("B", [5, 520])
def test_block_kernels_equal_their_unfused_passes_bit_for_bit(dtype, transpose, trap, B):
    """``apply_block`` runs each reflection's update in the same pass over the block as the
    next reflection's dot products. The operations and their order are those of separate
    passes, so the result must agree bit for bit — also across a zero column (skipped: the
    next active reflection's dots ride along), with B = 5 (the partial sums' tail) and with
    B = 520 (float64 rows over ``FUSED_ROW_BYTES``: the two passes themselves); so must
    the backward (``grad_one``, one pass per reflection after its two dot passes). A fused
    pass that read a row before its update, or dotted the wrong column, is off by O(1)."""
    rng = np.random.default_rng(11)
    n, L = 13, 6
    V = rng.standard_normal((n, L)).astype(dtype)
    if trap:
        V = np.tril(V)
    V[:, 2] = 0.0
    H, G = (rng.standard_normal((n, B)).astype(dtype) for _ in range(2))
    out, Vb, hb = _unfused_passes(V, H, G, trap, transpose)
    kw = {"trapezoidal": trap, "transpose": transpose}
    np.testing.assert_array_equal(nk.hprod(V, H, **kw), out)
    got_Vb, got_hb = nk.hgrad(V, G, h=H, **kw)
    np.testing.assert_array_equal(got_Vb, Vb)
    np.testing.assert_array_equal(got_hb, hb)
    assert np.max(np.abs(out - H)) > 0.1  # the reflections did act


def test_trapezoidal_never_reads_above_the_diagonal():
    """LAPACK-style packed storage: whatever sits above the diagonal (here NaN) is ignored."""
    rng = np.random.default_rng(7)
    V = np.tril(rng.standard_normal((10, 6)))
    packed = V + np.triu(np.full(V.shape, np.nan), 1)
    h = rng.standard_normal((10, 2))
    np.testing.assert_array_equal(nk.hprod(packed, h, trapezoidal=True), nk.hprod(V, h))
    Vb, hb = nk.hgrad(packed, h, h=h, trapezoidal=True)
    assert np.all(np.isfinite(Vb)) and np.all(np.isfinite(hb))


def test_transpose_is_the_inverse_and_apply_sequential():
    rng = np.random.default_rng(8)
    V = rng.standard_normal((11, 7))
    h = rng.standard_normal((11, 2))
    Q = product_of_reflections(V)
    np.testing.assert_allclose(nk.hprod(V, h, transpose=True), Q.T @ h, atol=1e-13)
    np.testing.assert_allclose(hh.apply_sequential(V, h), Q @ h, atol=1e-13)
    np.testing.assert_allclose(hh.apply_sequential(V, h, transpose=True), Q.T @ h, atol=1e-13)


def test_apply_sequential_without_numba_uses_numpy(monkeypatch):
    rng = np.random.default_rng(9)
    V, h = rng.standard_normal((6, 3)), rng.standard_normal(6)
    fast = hh.apply_sequential(V, h, transpose=True)
    monkeypatch.setenv("HL_DISABLE_NUMBA", "1")
    assert not hh.sequential_is_faster(8, 2, 1, np.float64)
    np.testing.assert_allclose(hh.apply_sequential(V, h, transpose=True), fast, atol=1e-14)


def test_sequential_is_faster_rule():
    """The crossover constants: tiny shapes go sequential, large ones to CWY."""
    assert hh.sequential_is_faster(128, 16, 1, np.float64)
    assert not hh.sequential_is_faster(1024, 256, 64, np.float64)
    assert not hh.sequential_is_faster(512, 512, 64, np.float32, precomputed=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_readonly_noncontiguous_inputs_and_fresh_outputs(dtype):
    rng = np.random.default_rng(10)
    base = rng.standard_normal((6, 14)).astype(dtype)
    V = base.T[:, ::2]  # (14, 3), transposed and strided
    h = rng.standard_normal((3, 14)).astype(dtype).T  # (14, 3), F-ordered
    g = rng.standard_normal((14, 3)).astype(dtype)[:, ::-1]
    for a in (base, h, g):
        a.flags.writeable = False
    copies = [a.copy() for a in (V, h, g)]
    y = nk.hprod(V, h)
    Vb, hb = nk.hgrad(V, g, h=h)
    for a, c in zip((V, h, g), copies, strict=True):
        np.testing.assert_array_equal(a, c)  # inputs untouched
    for out in (y, Vb, hb):  # freshly allocated (possibly a reshaped view of a new buffer)
        assert out.flags.writeable
        assert not any(np.shares_memory(out, a) for a in (base, h, g))
    Vc, hc = np.ascontiguousarray(V), np.ascontiguousarray(h)
    np.testing.assert_array_equal(y, nk.hprod(Vc, hc))  # layout does not change the result
    y1 = hl.householder_apply(V, h[:, 0])
    assert y1.flags.writeable and not np.shares_memory(y1, h)


def test_mixed_dtypes_promote_like_numpy():
    rng = np.random.default_rng(11)
    V = rng.standard_normal((5, 2)).astype(np.float32)
    h = rng.standard_normal(5)
    y = hl.householder_apply(V, h)
    assert y.dtype == np.float64
    with pytest.raises(TypeError, match="float32 or float64"):
        nk.hprod(V.astype(np.float16), h.astype(np.float16))


def test_extreme_scales_are_rescaled_exactly():
    """H(cv) = H(v): columns whose ‖v‖² would overflow or underflow are rescaled by powers of
    two first; the gradient scales back as 1/c (H is homogeneous of degree 0)."""
    rng = np.random.default_rng(12)
    V, h = rng.standard_normal((9, 4)), rng.standard_normal((9, 2))
    g = rng.standard_normal((9, 2))
    y = nk.hprod(V, h)
    Vb, hb = nk.hgrad(V, g, h=h)
    for c in (1e-200, 1e-160, 1e160, 1e250):
        np.testing.assert_allclose(nk.hprod(c * V, h), y, atol=1e-14)
        Vc, hc = nk.hgrad(c * V, g, h=h)
        np.testing.assert_allclose(c * Vc, Vb, atol=1e-13)
        np.testing.assert_allclose(hc, hb, atol=1e-14)
    V32 = V.astype(np.float32)
    for c in (1e-25, 1e25):
        np.testing.assert_allclose(
            nk.hprod(np.float32(c) * V32, h.astype(np.float32)),
            nk.hprod(V32, h.astype(np.float32)),
            atol=1e-5,
        )


def test_nan_matches_numpy_path(monkeypatch):
    """Forward: NaN/Inf in V raise the NumPy path's ValueError; NaN in h propagates. VJP: NaN
    propagates (neither path checks there)."""
    rng = np.random.default_rng(13)
    V, h = rng.standard_normal((6, 3)), rng.standard_normal(6)
    Vn = V.copy()
    Vn[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"V contains NaN or Inf \(in column\(s\) \[1\]\)"):
        hl.householder_apply(Vn, h)
    with monkeypatch.context() as m:
        m.setenv("HL_DISABLE_NUMBA", "1")
        with pytest.raises(ValueError, match=r"V contains NaN or Inf \(in column\(s\) \[1\]\)"):
            hl.householder_apply(Vn, h)
    hn = h.copy()
    hn[0] = np.nan
    y = hl.householder_apply(V, hn)
    assert np.array_equal(np.isnan(y), np.isnan(_reference_apply(V, hn, monkeypatch)))
    Vb, hb = hl.vjp.householder_apply(Vn, h, h)
    Vr, hr = _reference_vjp(Vn, h, h, monkeypatch)
    assert np.isnan(Vb).any() and np.isnan(Vr).any()
    assert np.isnan(hb).all() == np.isnan(hr).all()
    with pytest.raises(ValueError, match="NaN or Inf"):
        nk.hgrad(Vn, h, h=h, check=True)


def test_empty_and_identity_shapes():
    V = np.zeros((4, 0))
    h = np.arange(4.0)
    np.testing.assert_array_equal(nk.hprod(V, h), h)
    np.testing.assert_array_equal(nk.hprod(np.zeros((4, 2)), h), h)  # H(0) = I
    Vb, hb = nk.hgrad(np.zeros((4, 2)), h, h=h)
    np.testing.assert_array_equal(Vb, 0.0)
    np.testing.assert_array_equal(hb, h)
    assert nk.hprod(np.ones((0, 4, 2)), np.ones((4, 3))).shape == (0, 4, 3)
    with pytest.raises(ValueError, match="L <= N"):
        nk.hprod(np.ones((2, 3)), np.ones(2))
    with pytest.raises(ValueError, match="h must have shape"):
        nk.hprod(np.ones((3, 2)), np.ones(4))


def test_disable_env_var_and_namespace_dispatch(monkeypatch):
    assert numba_for(np, np.ones(2)) is nk
    monkeypatch.setenv("HL_DISABLE_NUMBA", "1")
    assert numba_for(np, np.ones(2)) is None
    monkeypatch.setenv("HL_DISABLE_NUMBA", "0")
    assert numba_for(np, np.ones(2)) is nk
    xps = require("array_api_strict")
    assert numba_for(xps, xps.ones(2)) is None  # other namespaces: unchanged


# -- many small matrices: the batch-lane kernel ------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("P", "N", "L", "B"), [(16, 3, 3, 3), (37, 2, 2, 2), (40, 3, 2, 1)])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("trapezoidal", [False, True])
def test_batch_lanes_equal_per_matrix_kernel_bit_for_bit(dtype, P, N, L, B, transpose, trapezoidal):
    """P ≥ BATCH_MIN matrices of N ≤ 3 run in the SIMD lanes. Their dot products are one
    running sum, the per-matrix kernel's four partial sums by row mod 4: with three rows or
    fewer each partial sum holds one term and ((s₀ + s₁) + (s₂ + 0)) = ((s₀ + s₁) + s₂), so
    every matrix must agree bit for bit — applied to operands, formed from [I; 0] (``hform``,
    which skips the unchanged columns for trapezoidal V), and with a partial tile (P not a
    multiple of eight). Larger N: :func:`test_batch_lanes_equal_column_blocks_bit_for_bit`."""
    assert P >= nk.BATCH_MIN and N <= nk.LANES_MAX_N
    V, H = batch_case(P, N, L, B, dtype, trapezoidal)
    kw = {"transpose": transpose, "trapezoidal": trapezoidal}
    assert np.array_equal(nk.hprod(V, H, **kw), per_matrix_hprod(V, H, **kw))
    if not transpose:
        Q = nk.hform(V, trapezoidal=trapezoidal)
        assert np.array_equal(
            Q, per_matrix_hprod(V, np.eye(N, dtype=dtype), trapezoidal=trapezoidal)
        )
        assert np.array_equal(nk.hform(V, 2, trapezoidal=trapezoidal), Q[..., :2])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("P", "N", "L", "C"),
    [(37, 8, 5, 2), (64, 16, 16, 1), (20, 12, 7, 13), (17, 3, 3, 8), (9, 5, 2, 7),
     (8, 1, 1, 1), (30, 16, 16, 16), (11, 6, 0, 3), (13, 4, 4, 0), (24, 24, 24, 8),
     (11, 24, 20, 40), (9, 60, 60, 60), (3, 61, 57, 61)],  # the column kernel's wide sweep
)  # fmt: skip
@pytest.mark.parametrize("trapezoidal", [False, True])
def test_batch_lanes_equal_column_blocks_bit_for_bit(dtype, P, N, L, C, trapezoidal):
    """The lanes kernel (:mod:`householderla._kernels.numba_lanes`, compiled with LLVM's SLP
    vectoriser) does the column-block kernel's operations in its order, one matrix per lane,
    so the two must agree bit for bit in every mode: operands of their own or one shared,
    forming from [I; 0] (columns < k skipped with trapezoidal V), transposed; P not a
    multiple of the eight lanes, L = 0 and C = 0 included, and C ≥ ``WIDE_MIN_C`` (forming
    ≥ ``WIDE_MIN_C_FORM``), where the column kernel sweeps all columns at once, two rows per
    pass. A vectoriser that reordered a sum, mixed lanes or dropped the tail tile would
    differ."""
    from householderla._kernels.numba_columns import apply_columns
    from householderla._kernels.numba_lanes import apply_lanes

    V, H = batch_case(P, N, L, C, dtype, trapezoidal)
    safe = 500 if dtype == np.float64 else 60
    E = np.eye(N, C, dtype=dtype)[None]
    modes = [(H, False, False), (H, False, True), (H[:1].copy(), False, False),
             (E, True, False), (E, True, True)]  # fmt: skip
    plain = (np.empty((0, 0), dtype), False)  # (τ, unit): V itself, no LAPACK τ
    for X, identity, transpose in modes:
        Y1, Y2 = np.full((P, N, C), np.nan, dtype), np.full((P, N, C), np.nan, dtype)
        s1 = apply_lanes(V, X, Y1, trapezoidal, identity, transpose, safe, *plain, False)
        s2 = apply_columns(V, X, Y2, trapezoidal, identity, transpose, safe, *plain)
        assert s1 == s2 == 0
        assert np.array_equal(Y1, Y2), (identity, transpose)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("P", "N", "k"), [(19, 8, 8), (9, 16, 11), (17, 3, 3), (10, 40, 40), (11, 13, 13)]
)
def test_batch_kernels_read_lapack_reflectors_in_place(dtype, P, N, k):
    """``unit`` mode: both batched kernels read LAPACK's ``a`` as ``?orgqr`` does (the unit
    diagonal implied, nothing above it read, τ = 0 columns the identity) and must give the
    bits they give on the V built from it (``lapack_unit_lower``); ``a`` may be wider than
    τ is long. R's entries (here NaN and huge) must never be read. The lanes kernel also
    reads a column-major ``a`` in place (``columns``, given as the C-contiguous transpose:
    eight rows of a column per register transpose, N mod 8 rows one by one, the rows above
    the diagonal of a block zeroed), with the same bits: a transpose that mixed rows or
    lanes, or let R's entries in, would differ."""
    from householderla._kernels.numba_columns import apply_columns
    from householderla._kernels.numba_lanes import apply_lanes

    rng = np.random.default_rng(N + k)
    a = rng.standard_normal((P, N, N)).astype(dtype)
    a[:, np.arange(N), np.arange(N)] = np.nan  # the diagonal holds R's: never read
    a[np.triu(np.ones((P, N, N), bool), 1)] = 1e30
    v = np.tril(np.nan_to_num(a), -1)[..., :k] + np.eye(N, k, dtype=dtype)
    tau = (2 / np.sum(v.astype(np.float64) ** 2, axis=-2)).astype(dtype)
    tau[1, k // 2] = 0  # H = I whatever the column holds
    tau[P - 1, 0] = 0
    V = np.empty((P, N, k), dtype)
    nk.lapack_unit_lower(a[..., :k].copy(), tau, V)
    safe = 500 if dtype == np.float64 else 60
    C = rng.standard_normal((P, N, 5)).astype(dtype)
    E = np.eye(N, dtype=dtype)[None]
    none = np.empty((0, 0), dtype)
    kernels = [apply_columns] + ([apply_lanes] if N <= nk.LANES_MAX_N else [])
    for kernel in kernels:
        for X, identity, transpose in ((C, False, False), (C, False, True), (E, True, False)):
            Y1 = np.full((P, N, X.shape[2]), np.nan, dtype)
            Y2 = Y1.copy()
            rows = (False,) if kernel is apply_lanes else ()  # (a row-major)
            assert kernel(a, X, Y1, True, identity, transpose, safe, tau, True, *rows) == 0
            assert kernel(V, X, Y2, True, identity, transpose, safe, none, False, *rows) == 0
            assert np.array_equal(Y1, Y2), (kernel.__name__, identity, transpose)
            if kernel is apply_lanes:  # ``columns``: a column-major ``a`` as its transpose
                Y3 = np.full_like(Y1, np.nan)
                at = np.ascontiguousarray(np.swapaxes(a, 1, 2))
                assert kernel(at, X, Y3, True, identity, transpose, safe, tau, True, True) == 0
                assert np.array_equal(Y3, Y2), ("columns", identity, transpose)
    Q = nk.hform(a[..., :k] if k == N else a[..., :k].copy(), tau=tau)
    ref = per_matrix_hprod(V, np.eye(N, dtype=dtype))
    np.testing.assert_allclose(Q, ref, rtol=0, atol=32 * EPS[dtype] * N * k)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lanes_store_large_outputs_past_the_caches_with_the_same_bits(dtype):
    """An output of ``NT_MIN_BYTES`` or more, aligned (as ``hform`` allocates it), is stored
    by non-temporal 8 × 8 transposed blocks; misaligned by one element it takes the cached
    stores. Both must equal the column kernel bit for bit, tail tile and all (P = 8k + 3)."""
    from householderla._kernels.numba_batched import output
    from householderla._kernels.numba_columns import apply_columns
    from householderla._kernels.numba_lanes import NT_MIN_BYTES, apply_lanes

    N = 16
    P = 8 * (NT_MIN_BYTES // (N * N * np.dtype(dtype).itemsize) // 8 + 1) + 3
    V, _ = batch_case(P, N, N, 0, dtype, True)
    E = np.eye(N, dtype=dtype)[None]
    none = np.empty((0, 0), dtype)
    ref = np.empty((P, N, N), dtype)
    safe = 500 if dtype == np.float64 else 60
    apply_columns(V, E, ref, True, True, False, safe, none, False)
    aligned = output((P, N, N), dtype)
    assert aligned.ctypes.data % 64 == 0 and aligned.nbytes >= NT_MIN_BYTES
    shifted = np.empty(P * N * N + 1, dtype)[1:].reshape(P, N, N)
    for Y in (aligned, shifted):
        Y[:] = np.nan
        assert apply_lanes(V, E, Y, True, True, False, safe, none, False, False) == 0
        assert np.array_equal(Y, ref)


@pytest.mark.parametrize(
    ("N", "L", "ncols"),
    [(256, 256, None), (300, 200, None), (300, 200, 200), (1024, 64, None), (40, 33, 35),
     (17, 5, None), (1, 1, None), (513, 300, None)],
)  # fmt: skip
def test_orgqr_rows_is_orgqr_panels_of_the_lapack_copy_bit_for_bit(N, L, ncols):
    """``orgqr_rows`` (cwy(V).matrix()'s kernel for lower-trapezoidal float64 V) copies each
    panel straight out of V's rows, scaling column j by 1/v_jj and τⱼ = 2 v_jj²/‖vⱼ‖² with
    ‖vⱼ‖² summed in tiles of 16 rows (each tile in row order, then added to the running
    sum): its Q must be, bit for bit, ``orgqr_panels``' Q of that (a, τ) built here in NumPy
    in the same order, for panels of 16 and 32 (m·k below and above 2¹⁶), a narrower last
    panel, N not a multiple of 16, thin Q, non-unit diagonals and a zero column (τ = 0); and
    it declines v_jj² < 1e-16·‖vⱼ‖² and v_jj = 0 with vⱼ ≠ 0 (``None``)."""
    from householderla._agnostic.lapack_panels import (
        LapackPanels,
        form_from_rows,
        form_panel_width,
        form_panels,
    )

    rng = np.random.default_rng(N * 1000 + L)
    V = np.tril(rng.standard_normal((N, L)))
    V[np.arange(L), np.arange(L)] = rng.choice([1.0, -2.0, 0.5], L)
    if L > 40:
        V[:, 40] = 0.0
    d = V[np.arange(L), np.arange(L)]
    ss = np.zeros(L)
    for i0 in range(0, N, 16):  # (the zeros above the diagonal add exactly nothing)
        part = np.zeros(L)
        for i in range(i0, min(i0 + 16, N)):
            part += V[i] * V[i]
        ss += part
    inv = np.divide(1.0, d, out=np.zeros(L), where=d != 0)
    a = np.asfortranarray(np.tril(V * inv, -1) + np.eye(N, L))
    tau = np.divide(2.0 * d * d, ss, out=np.zeros(L), where=ss != 0)
    nb = form_panel_width(L, compiled_rows=N)
    want = form_panels(LapackPanels(a, tau, nb, nk), N if ncols is None else ncols, np)
    got = form_from_rows(V, nk, ncols)
    assert got.shape == want.shape and np.array_equal(got, want)
    for col, diag in ((0, 1e-9), (L - 1, 0.0)):
        bad = V.copy()
        bad[col, col] = diag
        assert (form_from_rows(bad, nk, ncols) is None) == (N > col + 1)


def test_kernel_modules_record_the_kernels_they_compile_from():
    """Numba's on-disk cache (``cache=True``) keys a compiled function on the source of its
    own file, not on the functions it inlines or calls from other files: a change to
    ``numba_simd`` alone would leave ``apply_lanes``'s cached machine code in use, stale.
    So each kernel module records a hash of the sibling kernel modules it imports
    (``KERNEL_DEPS``); changing one of them makes this test fail with the new value, and
    writing it changes the dependent's source, which invalidates its cache (in dependency
    order: the hash covers the siblings' own ``KERNEL_DEPS`` lines). ``_lib/tuning.py`` counts
    as a dependency of the kernel modules that import their thresholds from it."""
    import ast
    import hashlib
    import re
    from pathlib import Path

    pkg = Path(hl.__file__).parent / "_kernels"
    checked = 0
    for path in sorted(pkg.glob("numba*.py")):
        text = path.read_text(encoding="utf-8")
        deps = sorted(
            {
                n.module
                for n in ast.walk(ast.parse(text))
                if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module
                if n.module.startswith("numba")
            }
        )
        # the thresholds a kernel reads are frozen into its machine code too
        tuning = any(
            isinstance(n, ast.ImportFrom) and n.level == 2 and n.module == "_lib.tuning"
            for n in ast.walk(ast.parse(text))
        )
        if not deps and not tuning:
            continue
        sources = [(pkg / f"{d}.py").read_bytes() for d in deps]
        if tuning:
            sources.append((pkg.parent / "_lib" / "tuning.py").read_bytes())
        want = hashlib.sha256(b"".join(sources))
        got = re.search(r'^KERNEL_DEPS = "([0-9a-f]*)"', text, re.M)
        value = want.hexdigest()[:16]
        assert got and got.group(1) == value, f'{path.name}: set KERNEL_DEPS = "{value}"'
        checked += 1
    assert checked >= 7


def test_lanes_compile_leaves_numba_config_unchanged():
    """The lanes kernel turns Numba's SLP vectoriser on for its own compilation only: after
    the import the process-wide setting is the user's (the environment's) again."""
    import os

    from numba.core import config

    import householderla._kernels.numba_lanes  # noqa: F401

    assert config.SLP_VECTORIZE == int(os.environ.get("NUMBA_SLP_VECTORIZE", "0"))


def test_batch_lanes_rescale_zero_columns_and_nonfinite():
    """Columns whose ‖v‖² leaves the safe range (1e±200, 1e-300) make the lanes hand the
    batch back for an exact power-of-two rescale: same answer as the unscaled columns; zero
    columns are identity reflectors; NaN raises ValueError naming V."""
    rng = np.random.default_rng(5)
    V = rng.standard_normal((20, 6, 6))
    H = rng.standard_normal((20, 6, 2))
    ref = nk.hprod(V, H)
    for scale in (1e-200, 1e-300, 1e200):  # squares under- or overflow; entries stay normal
        W = V.copy()
        W[3, :, 2] *= scale
        got = nk.hprod(W, H)
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, ref, rtol=0, atol=64 * EPS[np.float64] * 6 * 6)
    W = V.copy()
    W[7, :, 4] = 0  # H(0) = I: the same as V without that column, bit for bit
    assert np.array_equal(nk.hprod(W, H)[7], nk.hprod(np.delete(W, 4, axis=-1), H)[7])
    W[11, 2, 1] = np.nan
    with pytest.raises(ValueError, match="V"):
        nk.hprod(W, H)
    with pytest.raises(ValueError, match="V"):
        nk.hform(W)


@pytest.mark.parametrize("N", [3, 16])
def test_many_small_matrices_through_the_operators(N):
    """hl.cwy(V).matrix() and hl.cwy(V) @ h of a batch of small matrices (the lanes, NumPy and
    CPU torch tensors) against torch.linalg.householder_product / torch.ormqr (LAPACK orgqr
    / ormqr) on the same reflectors in LAPACK's layout: to a few ulps per reflection."""
    torch = require("torch")
    rng = np.random.default_rng(N)
    a = np.tril(rng.standard_normal((64, N, N)), -1) + np.eye(N)
    tau = 2 / (a * a).sum(-2)
    h = rng.standard_normal((64, N, 3))
    Q_ref = torch.linalg.householder_product(torch.from_numpy(a), torch.from_numpy(tau)).numpy()
    y_ref = torch.ormqr(torch.from_numpy(a), torch.from_numpy(tau), torch.from_numpy(h)).numpy()
    tol = 8 * N * EPS[np.float64]  # N reflections of O(1) rounding each, entries of size ≤ 1
    np.testing.assert_allclose(hl.cwy(a).matrix(), Q_ref, rtol=0, atol=tol)
    Q_t = hl.cwy(torch.from_numpy(a)).matrix()
    assert isinstance(Q_t, torch.Tensor) and np.array_equal(Q_t.numpy(), hl.cwy(a).matrix())
    np.testing.assert_allclose(hl.cwy(a) @ h, y_ref, rtol=0, atol=tol * np.abs(h).max() * 4)
