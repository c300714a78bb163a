"""Many small matrices at once (issue 14, item 4): the column-block kernel
(:mod:`householderla._kernels.numba_columns`), the one-pass checks around it
(:mod:`householderla._kernels.numba_checks`) and the operators that route batches there.

Tolerances. The column-block kernel applies the same reflections as the per-matrix kernel
(:func:`householderla._kernels.numba.hprod`) with each dot product summed row by row instead
of in four partial sums: every reflection differs by rounding, |Δγ| ≤ γ_N ‖v‖‖y‖ (Higham,
Accuracy and Stability, §3.1), so after L reflections |Δy| ≲ N·L·eps·‖h‖∞. The bound used is
2·eps·N·L·scale; a wrong sign, a skipped reflection or a misplaced column is off by O(1).
Against LAPACK (dorgqr / dormqr, τ from geqrf) the same bound holds with τ rounded once.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.linalg.lapack as la
from conftest import require
from helpers import EPS, batch_case, per_matrix_hprod

import householderla as hl

require("numba")
from householderla._kernels import numba as nk  # noqa: E402

DTYPES = [np.float32, np.float64]


def _tol(dtype, N, L, scale=1.0):
    return 2 * EPS[np.dtype(dtype).type] * N * max(L, 1) * max(scale, 1.0)


def _lapack_batch(rng, P, N, k=None):
    """geqrf of P random N × N matrices: (a, τ) stacked, in C order."""
    pairs = [la.dgeqrf(rng.standard_normal((N, N)))[:2] for _ in range(P)]
    a = np.ascontiguousarray(np.stack([p[0] for p in pairs]))
    tau = np.stack([p[1] for p in pairs])
    return a, (tau if k is None else tau[:, :k])


# B: 13 = 8 + 4 + 1 (every kind of block), 6 = 4 + 2, 3 (only the zero-padded rest)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("P", "N", "L", "B"),
    [(37, 8, 5, 2), (64, 16, 16, 1), (20, 12, 7, 13), (17, 24, 24, 6), (16, 60, 60, 33)],
)
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("trapezoidal", [False, True])
def test_batched_kernels_match_the_per_matrix_kernel(dtype, P, N, L, B, transpose, trapezoidal):
    """Batches of N > 3 (the SIMD lanes, which agree bit for bit with the column blocks,
    tests/test_numba_kernels.py): applied to operands and formed from [I; 0] (all columns
    and the first few), within the bound of the module docstring; P not a multiple of
    anything; N = 60 with B = 33 columns (an odd scratch row, a tail of one column)."""
    assert N > 3 and N <= nk.LANES_MAX_N
    V, H = batch_case(P, N, L, B, dtype, trapezoidal)
    kw = {"transpose": transpose, "trapezoidal": trapezoidal}
    y = nk.hprod(V, H, **kw)
    assert y.dtype == dtype and y.shape == (P, N, B)
    tol = _tol(dtype, N, L, np.abs(H).max())
    np.testing.assert_allclose(y, per_matrix_hprod(V, H, **kw), rtol=0, atol=tol)
    shared = per_matrix_hprod(V, H[0], **kw)  # one operand for the whole batch
    np.testing.assert_allclose(nk.hprod(V, H[0], **kw), shared, rtol=0, atol=tol)
    if not transpose:
        E = np.eye(N, dtype=dtype)
        Q = nk.hform(V, trapezoidal=trapezoidal)
        np.testing.assert_allclose(Q, per_matrix_hprod(V, E, trapezoidal=trapezoidal), atol=tol)
        for ncols in (1, 3, N - 1):  # a zero-padded rest block, skipping from column ncols-1
            assert np.array_equal(nk.hform(V, ncols, trapezoidal=trapezoidal), Q[..., :ncols])


def test_column_blocks_do_not_depend_on_the_batch():
    """Each matrix is computed alone: reversing the batch reverses the result bit for bit,
    and a matrix's columns come out the same whatever block they fall in (all columns vs
    the operand's first columns), or in the one sweep over many columns."""
    rng = np.random.default_rng(0)
    V = np.tril(rng.standard_normal((33, 16, 16)), -1) + np.eye(16)
    H = rng.standard_normal((33, 16, 9))
    y = nk.hprod(V, H, trapezoidal=True)
    assert np.array_equal(nk.hprod(V[::-1].copy(), H[::-1].copy(), trapezoidal=True), y[::-1])
    assert np.array_equal(nk.hprod(V, H[..., 8:].copy(), trapezoidal=True), y[..., 8:])
    H40 = np.concatenate([H] * 5, axis=-1)  # 45 columns: one sweep over all of them
    assert np.array_equal(nk.hprod(V, H40, trapezoidal=True)[..., :9], y)


@pytest.mark.parametrize(("N", "P"), [(4, 40), (8, 37), (16, 64), (64, 16)])
def test_operators_on_batches_equal_dorgqr_and_dormqr(N, P):
    """hl.cwy(V) and hl.from_lapack(a, τ) on a stack of geqrf outputs, forming and applying
    (Q and Qᵀ), against loops of LAPACK's dorgqr / dormqr; read-only inputs stay unwritten."""
    rng = np.random.default_rng(N)
    a, tau = _lapack_batch(rng, P, N)
    C = rng.standard_normal((P, N, 5))
    V = (np.tril(a, -1) + np.eye(N)) * (tau != 0)[:, None, :]  # geqrf's last τ is 0: H = I
    for x in (a, tau, C, V):
        x.setflags(write=False)
    Q_ref = np.stack([la.dorgqr(a[p], tau[p])[0] for p in range(P)])
    y_ref = np.stack([la.dormqr("L", "N", a[p], tau[p], C[p], 8 * N)[0] for p in range(P)])
    t_ref = np.stack([la.dormqr("L", "T", a[p], tau[p], C[p], 8 * N)[0] for p in range(P)])
    tol = _tol(np.float64, N, N)
    tolc = _tol(np.float64, N, N, np.abs(C).max())
    for op in (lambda: hl.cwy(V), lambda: hl.from_lapack(a, tau)):
        np.testing.assert_allclose(op().matrix(), Q_ref, rtol=0, atol=tol)
        np.testing.assert_allclose(op() @ C, y_ref, rtol=0, atol=tolc)
        np.testing.assert_allclose(op().T @ C, t_ref, rtol=0, atol=tolc)
    # Fortran-ordered a (scipy's) and thin Q through the same pass
    aF = np.asfortranarray(a[0])
    np.testing.assert_allclose(hl.from_lapack(aF, tau[0]).matrix(), Q_ref[0], atol=tol)
    Qt = hl.from_lapack(a, tau[:, : N // 2], thin=True).matrix()
    ref = np.stack([la.dorgqr(a[p][:, : N // 2], tau[p][: N // 2])[0] for p in range(P)])
    np.testing.assert_allclose(Qt, ref, rtol=0, atol=tol)


@pytest.mark.parametrize("N", [4, 8])  # k ≤ 4: the per-column check in registers
def test_from_lapack_one_pass_checks_name_the_bad_argument(monkeypatch, N):
    """The Numba pass of from_lapack keeps the Array API path's errors: NaN/Inf below the
    diagonal of a (one matrix of a stack), a τ that is not 2/‖v‖² (one entry of a stack), a
    ‖v‖² that overflows; NaN in a τ = 0 column, the diagonal or the upper part is ignored
    (H(i) = I whatever the column holds, R is not read)."""
    rng = np.random.default_rng(7)
    a, tau = _lapack_batch(rng, 20, N)
    Q = hl.from_lapack(a, tau).matrix()
    bad = a.copy()
    bad[13, N - 1, 2] = np.nan
    with pytest.raises(ValueError, match=r"a \(below the diagonal\) contains NaN or Inf"):
        hl.from_lapack(bad, tau)
    t = tau.copy()
    t[4, 1] *= 1.01
    with pytest.raises(ValueError, match="not LAPACK's 2/"):
        hl.from_lapack(a, t)
    big = a.copy()
    big[2, N - 2, 1] = 1e200  # ‖v‖² overflows: τ cannot match
    with pytest.raises(ValueError, match="not LAPACK's 2/"):
        hl.from_lapack(big, tau)
    junk = a.copy()
    junk[:, 0, 3] = np.nan  # above the diagonal (R)
    junk[:, 2, 2] = np.inf  # the diagonal
    t = tau.copy()
    t[9, 1] = 0
    junk[9, N - 1, 1] = np.nan  # below the diagonal of a τ = 0 column
    got = hl.from_lapack(junk, t).matrix()
    assert np.all(np.isfinite(got))
    with monkeypatch.context() as mp:  # the Array API path reads the same entries
        mp.setenv("HL_DISABLE_NUMBA", "1")
        np.testing.assert_allclose(
            hl.from_lapack(junk, t).matrix(), got, atol=_tol(np.float64, N, N)
        )
    np.testing.assert_allclose(got[:9], Q[:9], rtol=0, atol=0)
    V9 = (np.tril(a[9], -1) + np.eye(N)) * (t[9] != 0)  # column 1 and geqrf's last out
    np.testing.assert_allclose(got[9], hl.cwy(V9).matrix(), atol=_tol(np.float64, N, N))


def test_float32_stacks_stay_float32():
    rng = np.random.default_rng(2)
    a, tau = _lapack_batch(rng, 20, 8)
    a32, tau32 = a.astype(np.float32), tau.astype(np.float32)
    Q = hl.from_lapack(a32, tau32).matrix()
    assert Q.dtype == np.float32
    ref = np.stack([la.dorgqr(a[p], tau[p])[0] for p in range(20)])
    np.testing.assert_allclose(Q, ref, rtol=0, atol=_tol(np.float32, 8, 8))


def test_structure_detection_of_a_stack():
    """structure="auto" looks at every matrix of a stack (one Numba pass): one nonzero entry
    above the diagonal of one matrix makes V dense, and the products then read the upper
    part — a wrong "trapezoidal" would skip it and be off by O(1)."""
    rng = np.random.default_rng(9)
    V = np.tril(rng.standard_normal((24, 10, 10)), -1) + np.eye(10)
    H = rng.standard_normal((24, 10, 3))
    dense = V.copy()
    dense[17, 2, 6] = 0.5
    for W in (V, dense):
        ref = per_matrix_hprod(W, H)
        np.testing.assert_allclose(hl.cwy(W) @ H, ref, rtol=0, atol=_tol(np.float64, 10, 10, 3))
        Qref = per_matrix_hprod(W, np.eye(10))
        np.testing.assert_allclose(hl.cwy(W).matrix(), Qref, rtol=0, atol=_tol(np.float64, 10, 10))
    W = V.copy()
    W[3, 0, 9] = np.nan  # NaN above the diagonal: not trapezoidal, and the check names V
    with pytest.raises(ValueError, match="V contains NaN"):
        hl.cwy(W)
    torch = require("torch")
    Qt = hl.cwy(torch.from_numpy(dense)).matrix()
    np.testing.assert_allclose(Qt.numpy(), hl.cwy(dense).matrix(), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("P", "N", "L"), [(5, 3, 3), (7, 8, 5), (3, 16, 16), (2, 1, 1), (4, 6, 0)])
def test_one_pass_value_and_structure_scan(dtype, P, N, L):
    """``finite_lower`` (the scan a stacked V gets when an operator is built) must say what
    ``isfinite(V).all()`` and ``triu(V, 1) == 0`` say, for every position of a bad entry:
    the first, the last, on and below the diagonal (values only), above it (both; NaN above
    counts as nonzero, −0.0 as zero), in the last matrix of the stack."""
    from householderla._kernels.numba_checks import finite_lower

    rng = np.random.default_rng(N + L)
    V = np.tril(rng.standard_normal((P, N, L))).astype(dtype)

    def expect(W):
        return bool(np.isfinite(W).all()), bool(np.all(np.triu(W, 1) == 0))

    assert finite_lower(V) == expect(V) == (True, True)
    cells = [(p, i, k) for p in (0, P - 1) for i in range(N) for k in range(L)]
    for (p, i, k), x in itertools.product(cells, (np.nan, np.inf, -np.inf, 0.5, -0.0)):
        W = V.copy()
        W[p, i, k] = x
        assert finite_lower(W) == expect(W), (p, i, k, x)


def test_stacks_are_checked_once_at_construction():
    """A stacked NumPy V is scanned once when the operator is built: NaN/Inf raise there,
    naming the column, and the structure found is the one "auto" then uses (no second scan:
    an operator built from a trapezoidal V stays trapezoidal even if the caller writes into
    V afterwards, as with every other cached factor). A Fortran-ordered stack takes the
    NumPy checks and gets the same answers."""
    rng = np.random.default_rng(4)
    V = np.tril(rng.standard_normal((32, 8, 8)), -1) + np.eye(8)
    for W in (V, np.asfortranarray(V)):
        bad = W.copy(order="K")
        bad[30, 5, 2] = np.inf
        with pytest.raises(ValueError, match=r"V contains NaN or Inf .*column"):
            hl.cwy(bad)
        with pytest.raises(ValueError, match="nonzero entries above its diagonal"):
            up = W.copy(order="K")
            up[31, 0, 7] = 1e-300
            hl.cwy(up, structure="trapezoidal")
    op = hl.cwy(V)
    assert op._factors.trapezoidal() is True
    assert hl.cwy(np.asfortranarray(V))._factors.trapezoidal() is True
    dense = V.copy()
    dense[0, 0, 1] = 2.0
    assert hl.cwy(dense)._factors.trapezoidal() is False


def test_lapack_stack_reads_a_in_place_and_builds_v_on_demand():
    """A stack of small NumPy (a, τ) gives an operator that reads ``a`` in place for
    ``.matrix()`` and its first ``@`` (no V: a V built and freed with the result cost page
    faults on every call) and is CWY in every other respect: V = tril(a, −1) + I with τ = 0
    columns zeroed when asked for, the second product through the factors, transposes,
    ``C @ op``, pickling, repr; ``a`` is never written. A product that fails to read R as
    zero (here NaN) or to honour τ = 0 would give NaN or O(1) errors."""
    import pickle

    from householderla.cwy import CWY

    rng = np.random.default_rng(12)
    P, N = 40, 8
    a, tau = _lapack_batch(rng, P, N)
    a[:, np.arange(N), np.arange(N)] = np.nan  # R's diagonal: never read
    tau[3, 2] = 0  # H = I whatever the column holds
    a0 = a.copy()
    a.setflags(write=False)
    C = rng.standard_normal((P, N, 3))
    V = (np.tril(np.nan_to_num(a), -1) + np.eye(N)) * (tau != 0)[:, None, :]
    Q_ref = per_matrix_hprod(V, np.eye(N))
    tol = _tol(np.float64, N, N, np.abs(C).max())
    op = hl.from_lapack(a, tau)
    assert isinstance(op, CWY) and op.shape == (P, N, N) and op.dtype == np.float64
    assert repr(op) == f"CWY(shape={(P, N, N)}, dtype=float64)"
    assert "op" not in op._state  # nothing built by the constructor
    np.testing.assert_allclose(op.matrix(), Q_ref, rtol=0, atol=tol)
    np.testing.assert_allclose(op @ C, Q_ref @ C, rtol=0, atol=tol)  # first: in place
    assert "op" not in op._state
    np.testing.assert_allclose(op.T @ C, np.swapaxes(Q_ref, -1, -2) @ C, rtol=0, atol=tol)
    np.testing.assert_allclose(op @ C, Q_ref @ C, rtol=0, atol=tol)  # then: the factors
    Ct = np.swapaxes(C, -1, -2)
    np.testing.assert_allclose(Ct @ op, Ct @ Q_ref, rtol=0, atol=tol)
    np.testing.assert_array_equal(op.V, V)
    np.testing.assert_allclose(op.T.matrix(), np.swapaxes(Q_ref, -1, -2), rtol=0, atol=tol)
    back = pickle.loads(pickle.dumps(op.T))
    assert type(back) is CWY and back.transposed
    np.testing.assert_allclose(back @ C, np.swapaxes(Q_ref, -1, -2) @ C, rtol=0, atol=tol)
    np.testing.assert_array_equal(a, a0)
    fresh = hl.from_lapack(a, tau)  # its first product transposed, a vector shared
    h = rng.standard_normal(N)
    np.testing.assert_allclose(fresh.T @ h, np.swapaxes(Q_ref, -1, -2) @ h, rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("P", "N"), [(43, 16), (16, 13), (27, 5), (19, 24)])
def test_column_major_lapack_stack_is_read_in_place_with_the_row_major_bits(dtype, P, N):
    """A stack whose matrices are column-major (``torch.geqrf``'s and LAPACK's layout; issue
    44, item 4: copying 8192 of 16 × 16 to C order cost as much as forming Q) is checked
    and formed in place: ``.matrix()`` equals the row-major copy's bit for bit (the same
    kernel, sums and order: a transpose that mixed rows, columns or matrices, read R, or
    skipped the tail rows or the partial tile would not), with no C-order copy made; the
    first product, which reads C order, copies once and agrees too. The check pass sums
    each ‖vᵢ‖² in the row-major check's order, so its largest τ mismatch is the same
    number; NaN in τ raises before NaN below the diagonal, naming τ, as for C order."""
    rng = np.random.default_rng(P * N)
    a, tau = _lapack_batch(rng, P, N)
    a, tau = a.astype(dtype), tau.astype(dtype)
    a[:, np.arange(N), np.arange(N)] = np.nan  # R's diagonal and upper part: never read
    a[np.triu(np.ones((P, N, N), bool), 1)] = 1e30
    tau[3, N // 2] = 0  # H = I whatever the column holds
    af = np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)  # column-major
    assert not af.flags.c_contiguous and np.array_equal(af, a, equal_nan=True)
    op, ref = hl.from_lapack(af, tau), hl.from_lapack(a, tau)
    assert type(op).__name__ == "LapackStack"
    Q = op.matrix()
    assert "a_rows" not in op._state  # read in place
    assert Q.dtype == dtype and np.array_equal(Q, ref.matrix())
    at, t2 = np.swapaxes(af, -1, -2), tau.reshape(P, N)
    assert nk.lapack_check_transposed(at, t2) == nk.lapack_check(a, t2)
    C = rng.standard_normal((P, N, 3)).astype(dtype)
    assert np.array_equal(op @ C, ref @ C)  # the first product: C order, copied once
    assert "a_rows" in op._state
    np.testing.assert_array_equal(op.V, ref.V)
    bad_a, bad_tau = af.copy(order="K"), tau.copy()
    bad_a[1, N - 1, 0] = np.nan  # below the diagonal
    assert not bad_a.flags.c_contiguous
    with pytest.raises(ValueError, match="below the diagonal"):
        hl.from_lapack(bad_a, tau)
    bad_tau[2, 0] = np.inf
    with pytest.raises(ValueError, match="tau contains NaN or Inf"):
        hl.from_lapack(bad_a, bad_tau)


def test_column_major_lapack_check_counts_as_the_row_major_one():
    """:func:`~householderla._kernels.numba_checks.lapack_check_transposed` against
    ``lapack_check`` on the C-order copy, bit for bit: few columns (k ≤ 4), a last block of
    fewer than eight, m > k, τ that does not fit (the worst mismatch), τ = 0 columns (not
    checked, whatever they hold) and NaN/Inf below the diagonal (counted per entry, the
    mismatch then inf); R's entries (NaN) must not count."""
    rng = np.random.default_rng(44)
    for P, m, k in ((20, 3, 3), (9, 21, 13), (17, 16, 16), (5, 30, 9)):
        a = rng.standard_normal((P, m, k))
        a[:, np.arange(k), np.arange(k)] = np.nan
        tau = 2 / (1 + np.sum(np.tril(np.nan_to_num(a), -1) ** 2, axis=-2))
        at = np.ascontiguousarray(np.swapaxes(a, -1, -2))
        t2 = tau.copy()
        for p in range(P):  # matrix by matrix: each largest mismatch, not only the stack's
            s = slice(p, p + 1)
            assert nk.lapack_check_transposed(at[s], t2[s]) == nk.lapack_check(a[s], t2[s])
        t2[P - 1, k - 1] *= 1.5
        t2[0, 0] = 0
        assert nk.lapack_check_transposed(at, t2) == nk.lapack_check(a, t2)
        a[1, m - 1, 0] = np.inf
        a[P - 1, m - 1, k // 2] = np.nan
        a[P - 1, m - 2, k // 2] = np.nan
        at = np.ascontiguousarray(np.swapaxes(a, -1, -2))
        got = nk.lapack_check_transposed(at, t2)
        assert got == nk.lapack_check(a, t2) and got[0] == np.inf
        assert got[1] == (3 if m - 2 > k // 2 else 2)
