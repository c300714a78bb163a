"""``hl.from_lapack(a, tau)``: LAPACK's compact reflectors as operators (issue 15, item 3).

Oracles: ``scipy.linalg.lapack`` ``dgeqrf``/``sgeqrf``/``zgeqrf`` for (a, τ), ``dorgqr``/
``sorgqr``/``zungqr`` for the matrix and ``dormqr``/``sormqr``/``zunmqr`` for the products, on
both sides, in both transposes (conjugate transposes); torch's ``geqrf`` and
``householder_product`` for batches and gradients. LAPACK's complex τ is genuinely complex:
H(i) = I − τᵢvᵢvᵢᴴ is unitary, not Hermitian (|1 − τᵢ‖vᵢ‖²| = 1). Tolerances: the operator and
LAPACK apply the same reflections in a different order of operations, so entries (of order ‖C‖)
agree to a few eps·m; 30·m·eps·max(1, ‖C‖_max) has a margin of ~10.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import scipy.linalg
import scipy.linalg.lapack as la
from conftest import require, to_numpy
from helpers import EPS, jax_once_each, orth_error, stable_seed

import householderla as hl

SHAPES = [(7, 4), (5, 5), (4, 6), (1, 1)]
#: LAPACK's routine prefix by dtype (complex: ?ungqr / ?unmqr for ?orgqr / ?ormqr)
_PREFIX = {np.float32: "s", np.float64: "d", np.complex128: "z"}


def _routine(name: str, dtype) -> object:
    prefix = _PREFIX[np.dtype(dtype).type]
    return getattr(la, prefix + (name.replace("or", "un") if prefix == "z" else name))


def _geqrf(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    qr, tau, _, info = _routine("geqrf", A.dtype)(A)
    assert info == 0
    return qr, tau


def _orgqr_full(qr: np.ndarray, tau: np.ndarray) -> np.ndarray:
    """The m × m Q of ?orgqr (the reflectors padded with zero columns)."""
    m, n = qr.shape
    a = np.zeros((m, m), qr.dtype)
    a[:, : min(m, n)] = qr[:, : min(m, n)]
    Q, _, info = _routine("orgqr", qr.dtype)(a, tau, lwork=max(1, 64 * m))
    assert info == 0
    return Q


def _ormqr(side: str, trans: str, qr: np.ndarray, tau: np.ndarray, C: np.ndarray) -> np.ndarray:
    k = tau.shape[0]
    f = _routine("ormqr", qr.dtype)
    out, _, info = f(side, trans, np.ascontiguousarray(qr[:, :k]), tau, C.copy(), lwork=256)
    assert info == 0
    return out


def _tol(dtype, m: int, scale: float = 1.0) -> float:
    return 30 * EPS[dtype] * max(m, 1) * max(1.0, scale)


def _randn(rng: np.random.Generator, shape: tuple, dtype) -> np.ndarray:
    """Standard normal entries of ``dtype`` (complex: independent real and imaginary parts)."""
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def _fresh_products(a, t, c, cr, r):
    """Each product on a fresh operator (its first product), as a caller of LAPACK would."""
    return (
        hl.from_lapack(a, t) @ c,
        hl.from_lapack(a, t).H @ c,
        hl.from_lapack(a, t).T @ c,
        # array_api_strict's __matmul__ raises instead of deferring to ours
        hl.from_lapack(a, t).__rmatmul__(cr),
        hl.from_lapack(a, t, thin=True) @ r,
    )


def _case(shape: tuple, dtype, *marks) -> object:
    name = f"{shape[0]}x{shape[1]}-{np.dtype(dtype).name}"
    return pytest.param(shape, dtype, id=name, marks=marks)


#: (shape, dtype): the real shapes in double and single precision; complex ones, where zgeqrf's
#: τ is complex (H(i) = I − τᵢvᵢvᵢᴴ is unitary, not Hermitian)
LAPACK_CASES = [
    *(_case(s, np.float64) for s in SHAPES),
    # the same code in single precision; on JAX (compiles per dtype) in test-long only
    *(_case(s, np.float32, pytest.mark.jax_long("float32 compiles anew")) for s in SHAPES),
    # complex on JAX in `make test`: test_panel_products_and_matrix_equal_ormqr_and_orgqr
    *(
        _case(s, np.complex128, pytest.mark.jax_long("complex128 compiles anew"))
        for s in [(8, 8), (10, 4), (5, 9)]
    ),
]


@pytest.mark.parametrize(("shape", "dtype"), LAPACK_CASES)
def test_matrix_and_products_equal_orgqr_and_ormqr(bk, shape, dtype):
    """``.matrix()`` is ?orgqr (zungqr); ``op @ C``, ``op.H @ C``, ``C @ op`` are ?ormqr
    (zunmqr) (L, N), (L, T / C), (R, N), and ``op.T @ C`` is conj(Qᴴ C̄) (Qᵀ C for real); the
    thin operator is Q[:, :k], with A = Q[:, :k] R; Q is orthogonal (unitary) to 30·eps·m²,
    i.e. m times the matrices' bound. Products: the module docstring's 30·eps·m·max(1, ‖C‖_max)
    (complex: at most 40·eps·(m + k)); the matrices 30·eps·m; A = QR, entries of order ‖A‖,
    10 times that."""
    rng = np.random.default_rng(stable_seed("lapack", shape))
    cx = np.dtype(dtype).kind == "c"
    A = _randn(rng, shape, dtype)
    qr, tau = _geqrf(A)
    m, k = shape[0], tau.shape[0]
    if cx:
        assert np.max(np.abs(tau.imag)) > 0.01  # genuinely complex τ: not reflections
    C, Cr = _randn(rng, (m, 3), dtype), _randn(rng, (2, m), dtype)
    R = np.triu(qr)[:k]
    tol = _tol(dtype, m, np.abs(C).max())
    if cx:  # and the former complex test's 40·eps·(m + k), which is the tighter for complex C
        tol = min(tol, 40 * EPS[dtype] * (m + k))
    a_b, t_b = bk.param(qr, dtype), bk.param(tau, dtype)
    operands = (bk.asarray(v, dtype) for v in (C, Cr, R))
    y, yh, yt, yr, qr_back = map(to_numpy, bk.call(_fresh_products, a_b, t_b, *operands))
    tr = "C" if cx else "T"
    ref = {"y": _ormqr("L", "N", qr, tau, C), "yh": _ormqr("L", tr, qr, tau, C)}
    ref["yr"] = _ormqr("R", "N", qr, tau, Cr)
    np.testing.assert_allclose(y, ref["y"], rtol=0, atol=tol)
    np.testing.assert_allclose(yh, ref["yh"], rtol=0, atol=tol)
    np.testing.assert_allclose(yt, np.conj(_ormqr("L", tr, qr, tau, np.conj(C))), rtol=0, atol=tol)
    np.testing.assert_allclose(yr, ref["yr"], rtol=0, atol=tol)
    np.testing.assert_allclose(qr_back, A, rtol=0, atol=10 * _tol(dtype, m) * np.linalg.norm(A))
    if bk.operand_only:
        return  # .matrix() takes no operand
    Q, Qt = bk.call(
        lambda a, t: (hl.from_lapack(a, t).matrix(), hl.from_lapack(a, t, thin=True).matrix()),
        a_b,
        t_b,
    )
    Q, Qt = to_numpy(Q), to_numpy(Qt)
    full = _orgqr_full(qr, tau)
    np.testing.assert_allclose(Q, full, rtol=0, atol=_tol(dtype, m))
    np.testing.assert_allclose(Qt, full[:, :k], rtol=0, atol=_tol(dtype, m))
    assert Q.dtype == dtype
    assert orth_error(Q) <= m * _tol(dtype, m)
    if bk.name == "numpy":  # one operator, formed first and reused; NumPy's @ defers to it
        op = hl.from_lapack(qr, tau)
        np.testing.assert_allclose(op.matrix(), full, rtol=0, atol=_tol(dtype, m))
        np.testing.assert_allclose(op @ C, ref["y"], rtol=0, atol=tol)
        np.testing.assert_allclose(op.H @ C, ref["yh"], rtol=0, atol=tol)
        np.testing.assert_allclose(Cr @ op, ref["yr"], rtol=0, atol=tol)


@pytest.mark.no_dask("builds and forms operators only")
def test_tau_zero_columns_and_the_upper_part_are_ignored(bk):
    """A column already zero below the diagonal gets τ = 0 from geqrf (H = I, whatever a
    holds: LAPACK keeps the implicit unit diagonal); the diagonal and upper part of a (R)
    never enter — the two traps of passing a to hl.cwy directly (errors 4.6 and 5.6)."""
    rng = np.random.default_rng(3)
    A = rng.standard_normal((6, 4))
    A[1:, 1] = 0.0  # column 1 reduced already... after the first reflection it is not:
    A = np.linalg.qr(rng.standard_normal((6, 6)))[0] @ np.triu(rng.standard_normal((6, 4)))
    A[:, 2] = A[:, 0] * 2.0  # rank deficient: one τ is 0 or the column is tiny
    qr, tau = _geqrf(np.triu(rng.standard_normal((6, 4))))  # upper triangular: every τ = 0
    assert np.all(tau == 0)
    Q = to_numpy(
        bk.call(lambda a, t: hl.from_lapack(a, t).matrix(), bk.asarray(qr), bk.asarray(tau))
    )
    np.testing.assert_allclose(Q, np.eye(6), atol=_tol(np.float64, 6))
    qr, tau = _geqrf(A)
    junk = qr + np.triu(rng.standard_normal(qr.shape))  # another R, same reflectors
    Q = to_numpy(
        bk.call(lambda a, t: hl.from_lapack(a, t).matrix(), bk.asarray(junk), bk.asarray(tau))
    )
    np.testing.assert_allclose(Q, _orgqr_full(qr, tau), atol=_tol(np.float64, 6))
    # H(i) = I for τᵢ = 0 whatever column i holds: NaN below its diagonal gives the Q of a
    # zero column, single and batched (the two NumPy routes that zero it). (dorgqr would
    # spread it: its dorg2r scales the column by −τᵢ = 0, and 0·NaN = NaN.)
    qr, tau = _geqrf(np.linalg.qr(rng.standard_normal((6, 6)))[0][:, :4])
    tau[2] = 0.0
    ref = _orgqr_full(qr, tau)
    qr[4, 2] = np.nan
    for a, t in ((qr, tau), (np.stack([qr, qr]), np.stack([tau, tau]))):
        Q = to_numpy(
            bk.call(lambda a, t: hl.from_lapack(a, t).matrix(), bk.asarray(a), bk.asarray(t))
        )
        np.testing.assert_allclose(Q, np.broadcast_to(ref, Q.shape), atol=_tol(np.float64, 6))


@pytest.mark.no_dask("builds and forms operators only")
def test_batched_equals_a_loop_of_lapack_calls(bk):
    rng = np.random.default_rng(4)
    A = rng.standard_normal((2, 3, 6, 4))
    pairs = [_geqrf(x) for x in A.reshape(-1, 6, 4)]
    qr = np.stack([p[0] for p in pairs]).reshape(2, 3, 6, 4)
    tau = np.stack([p[1] for p in pairs]).reshape(2, 3, 4)
    C = rng.standard_normal((6, 2))
    y = to_numpy(bk.call(lambda a, t, c: hl.from_lapack(a, t) @ c, *map(bk.asarray, (qr, tau, C))))
    ref = np.stack([_ormqr("L", "N", q, t, C) for q, t in pairs]).reshape(2, 3, 6, 2)
    np.testing.assert_allclose(y, ref, atol=_tol(np.float64, 6, np.abs(C).max()))


def test_torch_and_jax_geqrf_outputs_feed_back():
    rng = np.random.default_rng(5)
    A = rng.standard_normal((7, 4))
    torch = require("torch")
    a, tau = torch.geqrf(torch.from_numpy(A))
    Q = hl.from_lapack(a, tau, thin=True)
    np.testing.assert_allclose((Q.matrix() @ torch.triu(a[:4])).numpy(), A, atol=1e-13)
    jax = require("jax")
    # geqrf is not exported by jax.lax.linalg (jax 0.7+), only its private module
    from jax._src.lax.linalg import geqrf

    a, tau = geqrf(jax.numpy.asarray(A))
    Q = hl.from_lapack(a, tau, thin=True)
    np.testing.assert_allclose(np.asarray(Q.matrix() @ jax.numpy.triu(a[:4])), A, atol=1e-13)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_torch_gradient_equals_householder_product(dtype):
    """The gradient with respect to ``a`` holds each eigenvalue λᵢ = 1 − τᵢ‖vᵢ‖² of
    H(i) = I − τᵢvᵢvᵢᴴ fixed (λ = −1: our real τ is 2/‖vᵢ‖²; zgeqrf's complex τ gives |λ| = 1):
    it is that of torch.linalg.householder_product(a, τ(a)) with τ(a) = (1 − λ)/‖v(a)‖², the
    same dependence of τ on a, whether τ is passed fixed or as τ(a). gradcheck passes for that
    consistent τ (a fixed τ would fail the τ check at the perturbed a)."""
    torch = require("torch")
    rng = np.random.default_rng(6)
    a0, tau0 = torch.geqrf(torch.from_numpy(_randn(rng, (6, 4), dtype)))
    W = torch.from_numpy(_randn(rng, (6, 4), dtype))

    def vecs(a):
        return torch.tril(a, -1) + torch.eye(6, 4, dtype=a.dtype)

    lam = 1 - tau0 * (vecs(a0).abs() ** 2).sum(0)

    def tau_of(a):
        return (1 - lam) / (vecs(a).abs() ** 2).sum(0)

    def ours(a, tau):
        return (hl.from_lapack(a, tau, thin=True).matrix() * W.conj()).sum().real

    def theirs(a):
        return (torch.linalg.householder_product(a, tau_of(a)) * W.conj()).sum().real

    grads = []
    for loss in (lambda a: ours(a, tau0), lambda a: ours(a, tau_of(a)), theirs):
        a = a0.clone().requires_grad_(True)
        loss(a).backward()
        grads.append(torch.tril(a.grad, -1).numpy())
    np.testing.assert_allclose(grads[0], grads[2], atol=1e-12)  # τ passed fixed
    np.testing.assert_allclose(grads[1], grads[2], atol=1e-12)  # τ(a)
    a = a0.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a: ours(a, tau_of(a)), (a,))


# -- complex τ (zgeqrf, torch.geqrf): H(i) = I − τᵢvᵢvᵢᴴ is unitary, not Hermitian ------------


def test_from_lapack_complex_rejects_non_unitary_tau():
    rng = np.random.default_rng(18)
    (a, tau), _ = scipy.linalg.qr(_randn(rng, (5, 3), np.complex128), mode="raw")
    with pytest.raises(ValueError, match="unitary"):
        hl.from_lapack(a, 1.1 * tau)


def test_from_lapack_complex_batched_torch_geqrf():
    """torch.geqrf (batched, complex) and torch.linalg.householder_product as the oracle."""
    torch = require("torch")
    rng = np.random.default_rng(19)
    a, tau = torch.geqrf(torch.tensor(_randn(rng, (3, 6, 4), np.complex128)))
    ref = torch.linalg.householder_product(a, tau)
    np.testing.assert_allclose(
        to_numpy(hl.from_lapack(a, tau, thin=True).matrix()), ref.numpy(), rtol=0, atol=1e-13
    )


@pytest.mark.parametrize(
    ("a", "tau", "err", "match"),
    [
        (np.zeros(4), np.zeros(1), ValueError, "a must have shape"),
        (np.zeros((4, 3)), np.zeros(4), ValueError, r"k <= min\(m, n\) = 3"),
        (np.zeros((2, 4, 3)), np.zeros((3, 3)), ValueError, "batch shape"),
        (np.zeros((4, 3)), np.array([np.nan, 0.0]), ValueError, "tau contains NaN"),
        (np.full((4, 3), np.inf), np.ones(2), ValueError, r"a \(below the diagonal\)"),
        (np.zeros((4, 3)), np.array([1.5, 0.0]), ValueError, "not LAPACK's 2/"),
    ],
)
def test_bad_arguments_are_named(a, tau, err, match):
    with pytest.raises(err, match=match):
        hl.from_lapack(a, tau)


@pytest.mark.parametrize("layout", ["F", "C", "torch"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_tau_is_named_on_the_in_place_path(layout, bad):
    """One a with m > 64 rows is read in place (column-major NumPy, or a CPU tensor's NumPy
    view) after one Numba pass that reads τ: a NaN/Inf τ is named as τ's fault there too
    (the pass alone would blame a's column), whatever the layout."""
    a, tau, _, _ = la.dgeqrf(np.random.default_rng(3).standard_normal((100, 6)))
    tau = tau.copy()
    tau[2] = bad
    a = a if layout == "F" else np.ascontiguousarray(a)
    if layout == "torch":
        torch = require("torch")
        a, tau = torch.from_numpy(a.T.copy()).mT, torch.from_numpy(tau)  # torch.geqrf's layout
    with pytest.raises(ValueError, match="tau contains NaN or Inf"):
        hl.from_lapack(a, tau)


@pytest.mark.parametrize("m", [5, 100])  # the small-stack pass and the column-major pass
@pytest.mark.parametrize("layout", ["F", "C", "torch"])
def test_tau_upcast_from_single_precision_is_accepted(m, layout):
    """τ of ``sgeqrf`` upcast to float64 beside float32 ``a`` is checked within float32's
    rounding, the dtype it was computed in (issue 41, item 5: it was refused as "not LAPACK's"
    by float64's bound); the operator is float64 and equals ``sorgqr``'s Q to float32's
    accuracy. τ with float32-sized errors beside float64 ``a`` is still refused."""
    rng = np.random.default_rng(7)
    A = rng.standard_normal((m, 4)).astype(np.float32)
    qr, tau, _, _ = la.sgeqrf(A)
    q_ref = la.sorgqr(qr, tau)[0]
    tau64 = tau.astype(np.float64)
    a = qr if layout == "F" else np.ascontiguousarray(qr)
    if layout == "torch":
        torch = require("torch")
        a, tau64 = torch.from_numpy(a), torch.from_numpy(tau64)
    Q = hl.from_lapack(a, tau64, thin=True)
    assert str(Q.dtype).endswith("float64")
    np.testing.assert_allclose(to_numpy(Q.matrix()), q_ref, atol=50 * m * EPS[np.float32])
    with pytest.raises(ValueError, match="not LAPACK's 2/"):
        hl.from_lapack(np.asarray(qr, np.float64), np.asarray(tau, np.float64) * (1 + 3e-7))


def test_integer_arrays_are_promoted():
    """As everywhere in the library, integer input computes in float64."""
    Q = hl.from_lapack(np.zeros((4, 3), dtype=np.int64), np.zeros(2, dtype=np.int32))
    assert Q.dtype == np.float64
    np.testing.assert_array_equal(Q.matrix(), np.eye(4))


def test_thin_must_be_a_bool():
    with pytest.raises(TypeError, match="thin must be"):
        hl.from_lapack(np.zeros((3, 2)), np.zeros(2), thin="yes")


# -- LAPACK's panel algorithms (householderla._agnostic.lapack_panels) -------------------------
# A fresh operator's first product runs ?ormqr's panels and .matrix() ?orgqr's, from τ itself.
# Shapes cross the panel width (32): k = 45 (a full panel and a narrower one), k = 64 (two
# full ones), k < n (τ shorter than a's columns), k = 0; τ = 0 columns hold junk LAPACK skips.


def _zgeqrf_like(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    f = {np.float64: la.dgeqrf, np.complex128: la.zgeqrf}[A.dtype.type]
    qr, tau, _, info = f(A)
    assert info == 0
    return qr, tau


def _lapack(name: str, qr: np.ndarray, *args: object) -> np.ndarray:
    """d/z ormqr/orgqr on (qr, τ) (``unmqr``/``ungqr`` for complex)."""
    cx = np.iscomplexobj(qr)
    f = getattr(la, ("z" if cx else "d") + (name.replace("or", "un") if cx else name))
    out, _, info = f(*args, lwork=max(1, 64 * qr.shape[0]))
    assert info == 0
    return out


def _panel_case(seed: int, m: int, n: int, k: int, dtype: type) -> tuple:
    rng = np.random.default_rng(seed)
    cx = dtype is np.complex128
    A = rng.standard_normal((m, n)) + (1j * rng.standard_normal((m, n)) if cx else 0)
    qr, tau = _zgeqrf_like(A.astype(dtype))
    tau = tau[:k].copy()
    if k > 3:  # H(i) = I where τᵢ = 0, whatever column i of a holds
        tau[[1, k - 2]] = 0
        qr[2:, 1] = rng.standard_normal(m - 2)
    return qr, tau, rng


PANEL_SHAPES = [(70, 45, 45), (66, 64, 64), (50, 40, 37), (9, 5, 0)]


@pytest.mark.parametrize(
    ("mnk", "dtype"),
    # JAX: each shape once, float64 and complex128 alternating
    jax_once_each(
        PANEL_SHAPES,
        [np.float64, np.complex128],
        ["-".join(map(str, s)) for s in PANEL_SHAPES],
        ["float64", "complex128"],
    ),
)
def test_panel_products_and_matrix_equal_ormqr_and_orgqr(bk, monkeypatch, mnk, dtype):
    m, n, k = mnk
    # the first real NumPy product may otherwise run Numba's sequential reflections
    monkeypatch.setattr("householderla._operator.plan.sequential_is_faster", lambda *a: False)
    qr, tau, rng = _panel_case(stable_seed("panels", m, n, k), m, n, k, dtype)
    cx = dtype is np.complex128
    C, Cr = (rng.standard_normal(s).astype(dtype) for s in ((m, 5), (4, m)))
    if cx:
        C, Cr = C + 1j * rng.standard_normal(C.shape), Cr + 1j * rng.standard_normal(Cr.shape)
    x = C[:k]
    a_b, t_b = bk.param(qr, dtype), bk.param(tau, dtype)

    def products(a, t, c, cr, xk):
        op, thin = hl.from_lapack(a, t), hl.from_lapack(a, t, thin=True)
        return (op @ c, hl.from_lapack(a, t).H @ c, hl.from_lapack(a, t).T @ c,
                hl.from_lapack(a, t).__rmatmul__(cr), thin @ xk,
                hl.from_lapack(a, t, thin=True).H @ c)  # fmt: skip

    got = bk.call(products, a_b, t_b, *(bk.asarray(v, dtype) for v in (C, Cr, x)))
    y, yh, yt, yr, ythin, yproj = map(to_numpy, got)
    a = np.ascontiguousarray(qr[:, :k])

    def orm(side, trans, c):  # k = 0: Q = I (SciPy's wrappers reject an empty τ)
        return _lapack("ormqr", a, side, trans, a, tau, c.copy()) if k else c

    tr = "C" if cx else "T"
    # entries of order ‖C‖ computed in another order than LAPACK's: a few eps·m (module doc)
    tol = _tol(dtype, m, np.abs(C).max())
    np.testing.assert_allclose(y, orm("L", "N", C), atol=tol)
    np.testing.assert_allclose(yh, orm("L", tr, C), atol=tol)
    np.testing.assert_allclose(yt, np.conj(orm("L", tr, np.conj(C))), atol=tol)  # conj(Qᴴ C̄)
    np.testing.assert_allclose(yr, orm("R", "N", Cr), atol=tol)
    xpad = np.concatenate([x, np.zeros((m - k, 5), dtype)])
    np.testing.assert_allclose(ythin, orm("L", "N", xpad), atol=tol)
    np.testing.assert_allclose(yproj, orm("L", tr, C)[:k], atol=tol)
    assert y.dtype == dtype
    if bk.operand_only:
        return  # .matrix() takes no operand
    Q, Qthin = map(
        to_numpy,
        bk.call(lambda a, t: (hl.from_lapack(a, t).matrix(),
                              hl.from_lapack(a, t, thin=True).matrix()), a_b, t_b),
    )  # fmt: skip
    full = np.zeros((m, m), dtype)
    full[:, :k] = qr[:, :k]
    ref = _lapack("orgqr", full, full, tau) if k else np.eye(m, dtype=dtype)
    np.testing.assert_allclose(Q, ref, atol=_tol(dtype, m))
    np.testing.assert_allclose(Qthin, ref[:, :k], atol=_tol(dtype, m))


@pytest.mark.no_dask("builds and forms operators only")
def test_batched_panels_equal_a_loop_of_lapack_calls(bk):
    rng = np.random.default_rng(8)
    shape, k = (2, 3, 40, 36), 35  # a full panel and a narrower one in every matrix
    A = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    pairs = [_zgeqrf_like(x) for x in A.reshape(-1, *shape[-2:])]
    qr = np.stack([p[0] for p in pairs]).reshape(shape)
    tau = np.stack([p[1][:k] for p in pairs]).reshape(*shape[:-2], k)
    C = rng.standard_normal((40, 3)) + 1j * rng.standard_normal((40, 3))
    y, Q = bk.call(
        lambda a, t, c: (hl.from_lapack(a, t).H @ c, hl.from_lapack(a, t, thin=True).matrix()),
        *(bk.asarray(v, np.complex128) for v in (qr, tau, C)),
    )
    ref = [_lapack("ormqr", q, "L", "C", q[:, :k].copy(), t[:k], C.copy()) for q, t in pairs]
    refQ = [_lapack("orgqr", q, q[:, :k].copy(), t[:k]) for q, t in pairs]
    tol = _tol(np.complex128, 40, np.abs(C).max())
    np.testing.assert_allclose(to_numpy(y), np.stack(ref).reshape(2, 3, 40, 3), atol=tol)
    np.testing.assert_allclose(to_numpy(Q), np.stack(refQ).reshape(2, 3, 40, k), atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
def test_compiled_larft_equals_the_closed_form(dtype):
    """The panel T's of NumPy operators come from ?larft's column recurrence compiled by Numba
    (householderla._kernels.numba_larft); the other namespaces use the closed form
    T = (I + diag(τ) striu(G))⁻¹ diag(τ). On geqrf's reflectors (a stack of three panels of 32
    and a narrower one of 5; one τ = 0) both agree to rounding: T is well conditioned (its
    entries are O(τ) = O(1) and its 32 columns each add a few products), so 8·nb·eps·max|T|
    covers it; a wrong sign or a missing term is off by O(1)."""
    require("numba")
    from householderla._agnostic import lapack_panels as lp
    from householderla._agnostic.lapack import lapack_reflectors
    from householderla._kernels import numba as nk

    rng = np.random.default_rng(stable_seed("larft", np.dtype(dtype).name))
    cx = np.dtype(dtype).kind == "c"
    for nb in (32, 5):
        A = rng.standard_normal((3, 70, nb)) + (1j * rng.standard_normal((3, 70, nb)) if cx else 0)
        pairs = [_zgeqrf_like(x.astype(np.complex128 if cx else np.float64)) for x in A]
        a, tau = (np.stack([p[i] for p in pairs]).astype(dtype) for i in (0, 1))
        tau[1, nb // 2] = 0
        V = lapack_reflectors(a, tau)
        G = np.ascontiguousarray(np.conj(np.swapaxes(V, -1, -2)) @ V)
        T = np.full(G.shape, np.nan, dtype)  # the kernel writes every entry
        nk.larft_forward(G, np.ascontiguousarray(tau), T)
        ref = lp._t_of(G, tau, np)
        assert T.dtype == dtype
        assert np.all(np.tril(T, -1) == 0)
        tol = 8 * nb * EPS[np.dtype(dtype).type] * np.abs(ref).max()
        np.testing.assert_allclose(T, ref, rtol=0, atol=tol)
        # and Q = I − V T Vᴴ is the product H(1)…H(nb) of LAPACK's reflectors
        Q = np.eye(70, dtype=dtype) - V[0] @ T[0] @ np.conj(V[0].T)
        H = np.eye(70, dtype=dtype)
        for i in range(nb):
            v = V[0][:, i : i + 1]
            H = H @ (np.eye(70, dtype=dtype) - tau[0, i] * v @ np.conj(v.T))
        np.testing.assert_allclose(Q, H, rtol=0, atol=_tol(dtype, 70))


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_fresh_product_and_matrix_build_no_whole_factor(monkeypatch, dtype):
    """The first product and .matrix() of a fresh operator run the panels only: building the
    whole (U, T) (m·k² + k³/3 flops) or the blocked factors there is a regression. The second
    product builds and reuses factors, as any operator's."""
    import householderla._operator.factors as fac

    qr, tau, rng = _panel_case(9, 1024, 256, 256, dtype)  # the shape of benchmarks/lapack.py
    C = rng.standard_normal((1024, 64)).astype(dtype)
    ref = _lapack("ormqr", qr, "L", "N", qr, tau, C.copy())
    built = []
    for name in ("factors_of", "block_factors"):
        orig = getattr(fac, name)
        monkeypatch.setattr(
            fac, name, lambda *a, _o=orig, _n=name, **kw: built.append(_n) or _o(*a, **kw)
        )
    op = hl.from_lapack(qr, tau)
    y = op @ C
    Q = op.matrix()
    assert built == [], built
    assert op._factors.panels_used and op._factors.U is None and op._factors.blocks is None
    np.testing.assert_allclose(y, ref, atol=_tol(dtype, 1024, np.abs(C).max()))
    np.testing.assert_allclose(Q @ C, ref, atol=_tol(dtype, 1024, np.abs(C).max()))
    np.testing.assert_allclose(op @ C, ref, atol=_tol(dtype, 1024, np.abs(C).max()))
    assert built  # the second product built factors to reuse


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_formed_q_is_as_orthogonal_as_orgqr(dtype):
    """‖QᴴQ − I‖_F of the thin Q from the same (a, τ), against ?orgqr's. Measured at
    m = 1024, k = 256 over six seeds: 1.01–1.05× (float64), 0.87–0.90× (complex128); forming
    from 2/‖vᵢ‖² instead of τ gave 2.5–2.8×. 1.25× leaves room for other BLAS kernels' order
    of operations and catches that regression."""
    for seed in range(3):
        rng = np.random.default_rng(seed)
        A = rng.standard_normal((600, 200)) + (
            1j * rng.standard_normal((600, 200)) if dtype is np.complex128 else 0
        )
        qr, tau = _zgeqrf_like(A.astype(dtype))
        ours = hl.from_lapack(qr, tau, thin=True).matrix()
        theirs = _lapack("orgqr", qr, qr, tau)
        eye = np.eye(200)
        e_ours = np.linalg.norm(ours.conj().T @ ours - eye)
        e_lapack = np.linalg.norm(theirs.conj().T @ theirs - eye)
        assert e_ours <= 1.25 * e_lapack, (seed, e_ours, e_lapack)


def test_wide_panels_of_many_reflectors_equal_orgqr():
    """k ≥ 1024 reflectors are formed with wider panels (``form_panel_width``: 64 at k =
    1100, the last panel 12 wide): the square and thin Q equal dorgqr's and stay as
    orthogonal (1.25× as above). Tolerance as everywhere here: 30·eps·m."""
    from householderla._agnostic.lapack_panels import form_panel_width

    m, k = 1100, 1100
    assert form_panel_width(k) == 64 and k % 64
    A = np.random.default_rng(stable_seed("wide panels")).standard_normal((m, k))
    qr, tau = _zgeqrf_like(A)
    ref = _lapack("orgqr", qr, qr, tau)
    Q = hl.from_lapack(qr, tau).matrix()
    np.testing.assert_allclose(Q, ref, atol=_tol(np.float64, m))
    eye = np.eye(m)
    assert np.linalg.norm(Q.T @ Q - eye) <= 1.25 * np.linalg.norm(ref.T @ ref - eye)


@pytest.mark.parametrize("form", ["from_lapack", "cwy"])
@pytest.mark.parametrize("mk", [(300, 200), (1024, 64), (256, 256)])
def test_half_width_panels_of_small_q_equal_orgqr(form, mk):
    """A real Q of m·k ≤ 2¹⁶ formed by the compiled kernel takes panels of 16 reflectors
    (``form_panel_width(k, compiled_rows=m)``; k = 200 ends with a panel of 8), through
    ``from_lapack`` and through ``cwy`` of the unit lower-trapezoidal V: the thin and square
    Q equal dorgqr's (30·eps·m) and stay as orthogonal (1.25×, as above). The rule's edges:
    the Python loop over panels (no ``compiled_rows``) and m·k past 2¹⁶ keep 32."""
    from householderla._agnostic.lapack_panels import form_panel_width

    m, k = mk
    assert form_panel_width(k, compiled_rows=m) == 16
    past = (1 << 16) // k + 1  # the fewest rows past m·k ≤ 2¹⁶
    assert form_panel_width(k) == form_panel_width(k, compiled_rows=past) == 32
    A = np.random.default_rng(stable_seed("small panels", m, k)).standard_normal((m, k))
    qr, tau = _zgeqrf_like(A)
    full = np.zeros((m, m))
    full[:, :k] = qr
    ref = _lapack("orgqr", full, full, np.concatenate([tau, np.zeros(m - k)]))
    if form == "from_lapack":
        Q, thin = hl.from_lapack(qr, tau).matrix(), hl.from_lapack(qr, tau, thin=True).matrix()
    else:
        V = (np.tril(qr, -1) + np.eye(m, k)) * (tau != 0)  # τ = 0 (a square QR's last): H = I
        Q, thin = hl.cwy(V).matrix(), hl.tcwy(V).matrix()
    np.testing.assert_allclose(Q, ref, atol=_tol(np.float64, m))
    np.testing.assert_allclose(thin, ref[:, :k], atol=_tol(np.float64, m))
    eye = np.eye(m)
    assert np.linalg.norm(Q.T @ Q - eye) <= 1.25 * np.linalg.norm(ref.T @ ref - eye)


def _assert_bad_a_and_tau_raise(a, tau, inf_at: tuple[int, int], i: int, tau_match: str):
    """An Inf below the diagonal of column-major ``a`` (at ``inf_at``) and τᵢ scaled by 1.5
    each make ``from_lapack`` raise ValueError."""
    bad = a.copy(order="F")
    bad[inf_at] = np.inf
    with pytest.raises(ValueError, match=r"a \(below the diagonal\) contains NaN or Inf"):
        hl.from_lapack(bad, tau)
    wrong = tau.copy()
    wrong[i] *= 1.5
    with pytest.raises(ValueError, match=tau_match):
        hl.from_lapack(a, wrong)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_column_major_a_is_read_in_one_pass_as_the_numpy_route_reads_it(monkeypatch, dtype):
    """One column-major NumPy ``a`` (LAPACK's layout) is built and checked by one Numba pass
    over its columns (``lapack._column_major_reflectors``): V equals the NumPy route's
    tril(a, −1) + I with τ = 0 columns zeroed (NaN in such a column included), k < n and
    k = 0; NaN/Inf below the diagonal and a τ that is not 2/‖v‖² raise as there."""
    from householderla import lapack as hl_lapack

    pytest.importorskip("numba")
    rng = np.random.default_rng(11)
    qr, tau = _geqrf(rng.standard_normal((9, 6)).astype(dtype))
    assert qr.flags.f_contiguous and not qr.flags.c_contiguous
    tau = tau.astype(dtype)
    tau[3] = 0
    qr[5, 3] = np.nan  # below the diagonal of a τ = 0 column: never read
    cases = [(qr, tau), (qr, tau[:4]), (qr, tau[:0])]
    for a, t in cases:
        V = hl_lapack._column_major_reflectors(a, t, np)
        assert V is not None and V.shape == (9, t.shape[0]) and V.dtype == dtype
        with monkeypatch.context() as m:
            m.setenv("HL_DISABLE_NUMBA", "1")
            assert hl_lapack._column_major_reflectors(a, t, np) is None
            ref = hl.from_lapack(a, t)._factors.V
        np.testing.assert_array_equal(V, ref)
        np.testing.assert_array_equal(hl.from_lapack(a, t)._factors.V, ref)
    assert hl_lapack._column_major_reflectors(np.ascontiguousarray(qr), tau, np) is None
    _assert_bad_a_and_tau_raise(qr, tau, (7, 1), 0, "not LAPACK's 2/")


@pytest.mark.parametrize("cblas", [True, False], ids=["compiled loop", "python loop"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
def test_one_column_major_a_is_read_in_place_until_v_is_needed(monkeypatch, dtype, cblas):
    """One column-major NumPy ``a`` with m > 64 rows (``?geqrf``'s layout) is checked by one
    read-only Numba pass, and its ``.matrix()`` and first product run the panels on ``a``
    itself (``householderla.lapack.LapackColumns``): V is built only when a later product needs
    it. Every variant equals LAPACK's routine on the same (a, τ): Q, Qᴴ, Qᵀ, conj(Q), C Q,
    a vector, the thin Q's embed and project, and the formed Q (square, thin, transposed),
    with τ = 0 columns whose storage holds junk and NaN (never read), k < n and a narrower
    last panel (k = 45), and a read-only ``a``. Both loops: the compiled one
    (``numba_panels``, calling NumPy's CBLAS; it must be the one that ran) and the Python
    one (``HL_DISABLE_CBLAS``). Tolerance as in this module, 30·eps·m·max|C|."""
    from householderla import lapack as hl_lapack
    from householderla._agnostic import lapack_panels
    from householderla._lib.blas import gemm_available

    require("numba")
    monkeypatch.setenv("HL_DISABLE_CBLAS", "0" if cblas else "1")
    if cblas and not gemm_available(dtype):
        pytest.skip("NumPy's CBLAS is not reachable here")
    compiled = []

    def spy(f):
        def run(self, *args):
            out = f(self, *args)
            compiled.append(out is not None)
            return out

        return run

    for name in ("compiled_apply", "compiled_form"):
        monkeypatch.setattr(
            lapack_panels.LapackPanels, name, spy(getattr(lapack_panels.LapackPanels, name))
        )
    built = []
    orig = hl_lapack._reflectors_of_columns
    monkeypatch.setattr(
        hl_lapack, "_reflectors_of_columns", lambda a, t, **kw: built.append(1) or orig(a, t, **kw)
    )
    cx = np.dtype(dtype).kind == "c"
    wide = np.complex128 if cx else np.float64
    m, n, k = 150, 50, 45
    qr, tau, rng = _panel_case(stable_seed("in place", np.dtype(dtype).name), m, n, k, wide)
    qr[3:, k - 2] = np.nan  # a τ = 0 column: LAPACK never reads it, neither may we
    a, tau = np.asfortranarray(qr.astype(dtype)), tau.astype(dtype)
    assert a.flags.f_contiguous and not a.flags.c_contiguous
    C = rng.standard_normal((m, 7)) + (1j * rng.standard_normal((m, 7)) if cx else 0)
    C = C.astype(dtype)
    full = np.zeros((m, m), wide)
    full[:, :k] = a[:, :k]
    full[:, k - 2] = 0  # (what LAPACK reads there is irrelevant: τ = 0)
    Q = _lapack("orgqr", full, full, tau.astype(wide))  # H(1)…H(k), formed by LAPACK
    tol = _tol(dtype, m, np.abs(C).max())

    def fresh(thin=False):
        op = hl.from_lapack(a, tau, thin=thin)
        assert type(op).__name__.startswith("LapackColumns")  # the in-place operator
        return op

    cases = [
        (lambda: fresh() @ C, Q @ C),
        (lambda: fresh().H @ C, Q.conj().T @ C),
        (lambda: fresh().T @ C, Q.T @ C),
        (lambda: fresh().conj() @ C, Q.conj() @ C),
        (lambda: C.T @ fresh(), C.T @ Q),
        (lambda: fresh() @ C[:, 0], Q @ C[:, 0]),
        (lambda: fresh(True) @ C[:k], Q[:, :k] @ C[:k]),
        (lambda: fresh(True).H @ C, Q[:, :k].conj().T @ C),
        (lambda: fresh().matrix(), Q),
        (lambda: fresh(True).matrix(), Q[:, :k]),
        (lambda: fresh(True).T.matrix(), Q[:, :k].T),
        (lambda: fresh().H.matrix(), Q.conj().T),
    ]
    for i, (got, ref) in enumerate(cases):
        y = got()
        assert y.dtype == dtype and y.shape == ref.shape, i
        np.testing.assert_allclose(y, ref, atol=tol, err_msg=f"case {i}")
    assert len(compiled) == len(cases) and set(compiled) == {cblas}  # the loop named ran
    ro = a.copy(order="F")
    ro.setflags(write=False)
    np.testing.assert_allclose(hl.from_lapack(ro, tau) @ C, Q @ C, atol=tol)
    np.testing.assert_allclose(hl.from_lapack(ro, tau).matrix(), Q, atol=tol)
    assert built == []  # no V so far
    op = fresh()
    np.testing.assert_allclose(op @ C, Q @ C, atol=tol)
    np.testing.assert_allclose(op.H @ C, Q.conj().T @ C, atol=tol)  # V built here, once
    np.testing.assert_allclose(op @ C, Q @ C, atol=tol)
    assert built == [1] and op.V.shape == (m, k)
    assert repr(fresh(True).H).startswith(f"TCWY(shape=({k}, {m})")
    Qh = hl.from_lapack(a, tau).H
    np.testing.assert_allclose(pickle.loads(pickle.dumps(Qh)) @ C, Q.conj().T @ C, atol=tol)
    # the one read-only pass checks what it reads
    _assert_bad_a_and_tau_raise(a, tau, (100, 7), 5, "unitary" if cx else "not LAPACK's 2/")


@pytest.mark.parametrize("layout", ["F", "C"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
def test_a_plain_cpu_tensor_is_read_in_place_as_numpy_is(dtype, layout):
    """A plain CPU torch ``a`` (``torch.geqrf``'s column-major layout, or a row-major copy of
    it) with m > 64 rows takes the in-place operator of a NumPy ``a`` through its NumPy view
    (issue 44, item 4: ``.matrix()`` was 1.02–1.29× ``torch.linalg.householder_product``
    where the NumPy route was 0.80–0.87×): ``LapackColumns``, every result a CPU tensor of
    ``a``'s dtype equal to ``torch.linalg.householder_product`` / the NumPy operator's, V a
    tensor once built; ``a`` or τ that require grad keep the general path and its gradient.
    Tolerance 30·eps·m·max|C|, as in this module."""
    torch = require("torch")
    require("numba")
    cx = np.dtype(dtype).kind == "c"
    m, n, k = 150, 50, 45
    qr, tau, rng = _panel_case(stable_seed("torch in place", np.dtype(dtype).name), m, n, k,
                               np.complex128 if cx else np.float64)  # fmt: skip
    a_np, tau_np = np.asfortranarray(qr.astype(dtype)), tau.astype(dtype)
    a = torch.from_numpy(a_np if layout == "F" else np.ascontiguousarray(a_np))
    t = torch.from_numpy(tau_np)
    assert a.mT.is_contiguous() == (layout == "F")
    C = (rng.standard_normal((m, 7)) + (1j * rng.standard_normal((m, 7)) if cx else 0)).astype(
        dtype
    )
    Ct = torch.from_numpy(C)
    ref_op = hl.from_lapack(a_np, tau_np)
    Q = ref_op.matrix()
    tol = _tol(dtype, m, np.abs(C).max())

    def fresh(thin=False):
        op = hl.from_lapack(a, t, thin=thin)
        assert type(op).__name__.startswith("LapackColumns")
        return op

    cases = [
        (lambda: fresh() @ Ct, Q @ C),
        (lambda: fresh().H @ Ct, Q.conj().T @ C),
        (lambda: fresh().conj() @ Ct, Q.conj() @ C),
        (lambda: Ct.mT @ fresh(), C.T @ Q),
        (lambda: fresh() @ Ct[:, 0], Q @ C[:, 0]),
        (lambda: fresh(True).H @ Ct, Q[:, :k].conj().T @ C),
        (lambda: fresh().matrix(), Q),
        (lambda: fresh(True).T.matrix(), Q[:, :k].T),
    ]
    for i, (got, ref) in enumerate(cases):
        y = got()
        assert type(y) is torch.Tensor and y.dtype == a.dtype and y.device.type == "cpu", i
        np.testing.assert_allclose(y.numpy(), ref, atol=tol, err_msg=f"case {i}")
    full = torch.zeros(m, k, dtype=a.dtype)
    full[:, :k] = a[:, :k]
    hp = torch.linalg.householder_product(full, t)  # LAPACK's own Q[:, :k]
    np.testing.assert_allclose(fresh(True).matrix().numpy(), hp.numpy(), atol=tol)
    op = fresh()
    op @ Ct  # the in-place first product (no V); the second builds V from the tensors
    assert "op" not in op._state and op._state.get("used")
    np.testing.assert_allclose((op @ Ct).numpy(), Q @ C, atol=tol)
    assert type(op.V) is torch.Tensor and op.V.dtype == a.dtype and op.V.shape == (m, k)
    with pytest.raises(ValueError, match="unitary" if cx else "not LAPACK's 2/"):
        hl.from_lapack(a, t * 1.5)
    # autograd: the general operator, and its gradient
    ag = a.clone().requires_grad_(True)
    op = hl.from_lapack(ag, t)
    assert not type(op).__name__.startswith("LapackColumns")
    y = op @ Ct
    y.real.sum().backward() if cx else y.sum().backward()
    assert ag.grad is not None and bool(torch.isfinite(ag.grad).all())
    np.testing.assert_allclose(y.detach().numpy(), Q @ C, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_plain_cpu_tensor_stack_is_read_in_place_as_numpy_is(dtype):
    """A stack of small real (a, τ) as plain CPU tensors (``torch.geqrf``'s column-major
    matrices: ``.matrix()`` reads them in place, the first product a C-order copy made
    once) takes NumPy's in-place stack operator
    (``LapackStack``) through the views: ``.matrix()`` and the first product are CPU tensors
    equal to ``torch.linalg.householder_product`` and its products; V, once built, a tensor;
    a stack that requires grad keeps the general path. (Issue 44, item 4: a torch stack of
    8192 (16, 16) ran 2× slower than ``householder_product`` on the general path.)
    Tolerance 30·eps·m, as in this module."""
    torch = require("torch")
    from householderla._kernels import numba_enabled

    require("numba")
    nk = numba_enabled()
    P, m = max(nk.BATCH_MIN, 8), 12
    g = torch.Generator().manual_seed(stable_seed("torch stack", np.dtype(dtype).name))
    A = torch.randn(P, m, m, generator=g, dtype=torch.float64)
    a64, t64 = torch.geqrf(A)
    a, t = (
        a64.to(getattr(torch, np.dtype(dtype).name)),
        t64.to(getattr(torch, np.dtype(dtype).name)),
    )
    a = a.mT.contiguous().mT  # geqrf's column-major matrices in the target dtype
    assert not a.is_contiguous()
    Q = torch.linalg.householder_product(a64, t64).numpy()
    C = torch.randn(P, m, 3, generator=g, dtype=a.dtype)
    tol = _tol(dtype, m)
    op = hl.from_lapack(a, t)
    assert type(op).__name__ == "LapackStack"
    M = op.matrix()
    assert type(M) is torch.Tensor and M.dtype == a.dtype
    np.testing.assert_allclose(M.numpy(), Q, atol=tol)
    y = hl.from_lapack(a, t) @ C
    assert type(y) is torch.Tensor and y.dtype == a.dtype
    np.testing.assert_allclose(y.numpy(), Q @ C.double().numpy(), atol=tol * 10)
    op = hl.from_lapack(a, t)
    op @ C
    np.testing.assert_allclose(
        (op.H @ C).numpy(), Q.transpose(0, 2, 1) @ C.double().numpy(), atol=tol * 10
    )
    assert type(op.V) is torch.Tensor and op.V.shape == (P, m, m)
    ag = a.clone().requires_grad_(True)
    assert type(hl.from_lapack(ag, t)).__name__ != "LapackStack"
