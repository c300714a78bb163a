"""The linear-algebra shims and the namespace resolution."""

from __future__ import annotations

import array_api_compat as aac
import numpy as np
import pytest
from conftest import require, to_numpy

from householderla._agnostic.compact_wy import factors_vjp, normalize_columns
from householderla._agnostic.lapack import sq_norms
from householderla._lib import blas as blas_module
from householderla._lib.blas import gemm_subtract
from householderla._lib.linalg import (
    gram_upper,
    inv_upper_triangular,
    inv_upper_triangular_recursive,
    own_numpy,
    real_dot,
    row_major_copy,
    subtract_product,
)
from householderla._lib.namespace import resolve


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 33])
def test_triangular_inverse_native_and_recursive(bk_eager, n):
    bk = bk_eager
    rng = np.random.default_rng(n)
    S = np.triu(rng.standard_normal((2, n, n)), 1) + 0.5 * np.eye(n)
    ref = np.linalg.inv(S)
    for fn in (inv_upper_triangular, inv_upper_triangular_recursive):
        out = to_numpy(fn(bk.asarray(S), bk.xp))
        # error bound of a triangular inverse: eps·n·κ(S)
        kappa = np.linalg.cond(S).max()
        np.testing.assert_allclose(out, ref, atol=10 * 2.2e-16 * n * kappa)
        np.testing.assert_array_equal(np.tril(out, -1), 0.0)


@pytest.mark.parametrize("rows", [None, 64, 5, 3])
@pytest.mark.parametrize("cblas", [True, False])
def test_subtract_product_updates_a_view_in_place(rows, cblas, monkeypatch):
    """Y −= A @ B on a strided trailing block, with row-block workspaces (5 rows: 13 = 5 + 5
    + 3, a ragged last block; 3 divides nothing here either), on NumPy (one ``?gemm`` with
    β = 1, or with ``HL_DISABLE_CBLAS`` the workspace) and torch (addmm_); only Y's block
    changes, A and B are not written."""
    monkeypatch.setenv("HL_DISABLE_CBLAS", "0" if cblas else "1")
    rng = np.random.default_rng(3)
    M, A, B = (
        rng.standard_normal((20, 9)),
        rng.standard_normal((13, 4)),
        rng.standard_normal((4, 6)),
    )
    ref = M.copy()
    ref[7:, 3:] -= A @ B  # two GEMM roundings apart at most: 4 products of size O(1)
    cases = [("numpy", M.copy(), A, B)]
    torch = pytest.importorskip("torch")
    cases.append(("torch", torch.from_numpy(M.copy()), torch.from_numpy(A), torch.from_numpy(B)))
    for name, Y, a, b in cases:
        a0, b0 = to_numpy(a).copy(), to_numpy(b).copy()
        work = None if rows is None or name == "torch" else np.empty((rows, 9))
        subtract_product(Y[7:, 3:], a, b, aac.array_namespace(Y), work)
        np.testing.assert_allclose(to_numpy(Y), ref, rtol=0, atol=1e-13, err_msg=name)
        np.testing.assert_array_equal(to_numpy(Y)[:7], M[:7])  # outside the block: untouched
        np.testing.assert_array_equal(to_numpy(a), a0)
        np.testing.assert_array_equal(to_numpy(b), b0)


def _blas_operand(rng, shape, dtype, layout):
    """A (shape) array of the given layout: C, F, a strided view inside a larger C array,
    or the transpose of a C array (a view with unit stride along axis 0)."""
    cx = np.dtype(dtype).kind == "c"

    def draw(sh):
        x = rng.standard_normal(sh) + (1j * rng.standard_normal(sh) if cx else 0)
        return x.astype(dtype)

    r, c = shape
    if layout == "C":
        return np.ascontiguousarray(draw(shape))
    if layout == "F":
        return np.asfortranarray(draw(shape))
    if layout == "view":
        return draw((r + 5, c + 3))[2 : 2 + r, 1 : 1 + c]
    return np.ascontiguousarray(draw((c, r))).T


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("ly", ["C", "F", "view", "T"])
@pytest.mark.parametrize("la_lb", [("C", "C"), ("F", "view"), ("T", "F"), ("view", "T")])
def test_gemm_subtract_equals_the_numpy_expression(dtype, ly, la_lb):
    """One ``?gemm`` with α = −1, β = 1 in NumPy's own OpenBLAS, on every layout the callers
    hand it, equals Y − A @ B: the same products, summed in another order (a sum of 11
    products of size O(1): 11·eps·4 bounds it; a missing conjugate, a transposed operand or
    a wrong leading dimension is off by O(1))."""
    if not blas_module._gemms():
        pytest.skip("NumPy is not linked to scipy-openblas64 on this platform")
    rng = np.random.default_rng(6)
    Y = _blas_operand(rng, (9, 7), dtype, ly)
    A, B = (
        _blas_operand(rng, (9, 11), dtype, la_lb[0]),
        _blas_operand(rng, (11, 7), dtype, la_lb[1]),
    )
    ref = Y - A @ B
    a0, b0 = A.copy(), B.copy()
    assert gemm_subtract(Y, A, B) is True
    np.testing.assert_allclose(Y, ref, rtol=0, atol=44 * np.finfo(dtype).eps * 4)
    np.testing.assert_array_equal(A, a0)
    np.testing.assert_array_equal(B, b0)


def test_gemm_subtract_refuses_what_it_cannot_do_exactly(monkeypatch):
    """False and Y untouched: Y sharing memory with A, mixed dtypes, a read-only Y, no unit
    stride, a stack, integer arrays, a non-NumPy array, and everything under
    HL_DISABLE_CBLAS; an empty inner dimension is a done no-op."""
    if not blas_module._gemms():
        pytest.skip("NumPy is not linked to scipy-openblas64 on this platform")
    rng = np.random.default_rng(7)
    M = rng.standard_normal((12, 12))
    A, B = rng.standard_normal((6, 3)), rng.standard_normal((3, 6))
    ro = M.copy()
    ro.flags.writeable = False
    cases = [
        (M[:6, :6], M[:6, 3:6], B),  # A is part of Y
        (M[:6, :6], A.astype(np.float32), B),
        (ro[:6, :6], A, B),
        (M[::2, ::2], A, B),
        (np.zeros((2, 6, 6)), np.ones((2, 6, 3)), np.ones((2, 3, 6))),
        (np.zeros((6, 6), np.int64), A.astype(np.int64), B.astype(np.int64)),
        (M[:6, :6].tolist(), A, B),
    ]
    for Y, a, b in cases:
        before = np.array(Y, copy=True)
        assert gemm_subtract(Y, a, b) is False
        np.testing.assert_array_equal(np.asarray(Y), before)
    Y = np.ones((6, 6))
    assert gemm_subtract(Y, np.ones((6, 0)), np.ones((0, 6))) is True
    np.testing.assert_array_equal(Y, 1)
    monkeypatch.setenv("HL_DISABLE_CBLAS", "1")
    assert gemm_subtract(Y, A, B) is False
    np.testing.assert_array_equal(Y, 1)


@pytest.mark.parametrize("order", ["C", "F"])
def test_complex_squared_norms_without_copies_equal_the_definition(order):
    """‖vᵢ‖² of a complex batch (NumPy's real/imaginary views) equals Σ|v|², in V's dtype."""
    rng = np.random.default_rng(4)
    V = rng.standard_normal((2, 30, 7)) + 1j * rng.standard_normal((2, 30, 7))
    V = np.asarray(V, order=order).astype(np.complex64)
    ss = sq_norms(V)
    assert ss.dtype == np.complex64 and ss.shape == (2, 7)
    ref = (np.abs(V.astype(np.complex128)) ** 2).sum(axis=-2)
    # float32 sums of 60 squares: relative error ≤ 60·eps(float32) ≈ 7e-6
    np.testing.assert_allclose(ss.real, ref, rtol=1e-5)
    np.testing.assert_array_equal(ss.imag, 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("order", ["C", "F", "view"])
def test_gram_upper_is_the_upper_triangle_of_vh_v(dtype, order):
    """syrk / herk on a single NumPy matrix: the upper triangle of VᴴV (not of VᵀV, nor its
    conjugate, which herk on the Fortran view of a C-ordered Vᵀ gives), a real diagonal; the
    strict lower part is never read by the callers. Sums of 40 products: 40·eps·max|G|."""
    rng = np.random.default_rng(5)
    cx = np.dtype(dtype).kind == "c"
    W = rng.standard_normal((40, 9)) + (1j * rng.standard_normal((40, 9)) if cx else 0)
    W = W.astype(dtype)
    V = {"C": np.ascontiguousarray(W), "F": np.asfortranarray(W), "view": W[3:, 1:8]}[order]
    G = gram_upper(V, np)
    ref = np.conj(V.T) @ V
    tol = 40 * np.finfo(dtype).eps * np.abs(ref).max()
    np.testing.assert_allclose(np.triu(G), np.triu(ref), rtol=0, atol=tol)
    assert G.dtype == dtype
    if cx:
        np.testing.assert_array_equal(np.diagonal(G).imag, 0)


@pytest.mark.parametrize("complex_", [False, True])
def test_row_major_copy_of_a_transposed_view_is_row_major(complex_):
    """NumPy's ``asarray(copy=True)`` keeps a transposed view column-major; the copy must be
    row-major (the folded products' first GEMM relies on it), equal to the input and its
    own memory; a lazily conjugated torch view is conjugated in the copy."""
    rng = np.random.default_rng(6)
    A = rng.standard_normal((7, 4)) + (1j * rng.standard_normal((7, 4)) if complex_ else 0)
    for x in (A.T, np.conj(A.T), A[::2], A):
        y = row_major_copy(x, np)
        assert y.flags.c_contiguous and not np.shares_memory(x, y)
        np.testing.assert_array_equal(y, x)
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(A)
    for x in (t.mT, t.mH if complex_ else t.mT, t):
        y = row_major_copy(x, aac.array_namespace(x))
        assert y.is_contiguous() and not y.is_conj() and y.data_ptr() != t.data_ptr()
        np.testing.assert_array_equal(y.numpy(), to_numpy(x.resolve_conj()))


@pytest.mark.parametrize("shape", [(1200, 30), (2, 300, 60)])
@pytest.mark.parametrize("axis", [-2, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_real_dot_of_large_arrays_equals_the_sum_of_products(shape, axis, dtype):
    """Arrays of at least 128 KiB are summed by ``einsum`` without a product array; the sums
    equal Σ a·b along the axis (float64 reference) to n·eps relative to Σ|a·b|, for either
    axis and with a batch axis; small arrays and tuples of axes keep the plain sum."""
    rng = np.random.default_rng(7)
    a, b = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    assert a.nbytes >= 128 * 1024  # the einsum path
    out = real_dot(a, b, np, axis=axis)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = np.sum(a64 * b64, axis=axis, keepdims=True)
    bound = shape[axis] * np.finfo(dtype).eps * np.sum(np.abs(a64 * b64), axis=axis, keepdims=True)
    assert out.shape == ref.shape and out.dtype == dtype
    assert np.all(np.abs(out - ref) <= bound)
    both = real_dot(a, b, np, axis=(-2, -1))
    np.testing.assert_allclose(both[..., 0, 0], np.sum(a64 * b64, axis=(-2, -1)), rtol=1e-4)


def test_own_numpy_only_for_large_writeable_arrays_of_the_result_type():
    """In-place elementwise steps only into a writeable NumPy array of ≥ 128 KiB whose
    shape and dtype the operands share; never into a read-only array (an input)."""
    big = np.zeros((200, 100))
    assert own_numpy(big, np.ones((200, 100)))
    assert not own_numpy(np.zeros((10, 10)))  # small: plain expressions
    assert not own_numpy(big, np.ones((200, 100), dtype=np.float32))  # would downcast
    assert not own_numpy(big, np.ones((1, 100)))  # would broadcast
    ro = np.zeros((200, 100))
    ro.setflags(write=False)
    assert not own_numpy(ro)
    torch = pytest.importorskip("torch")
    assert not own_numpy(torch.zeros(200, 100, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_factors_vjp_in_place_steps_match_the_formula_and_leave_inputs(dtype):
    """V̄ = (ū' − u Re(uᴴū'))/‖v‖ with ū' = Ū + U(P + Pᴴ), P = striu(S̄), for an N × L
    large enough that the steps run in place (600 × 40 float64: 187 KiB): equal to the
    formula evaluated plainly, a zero column of V gets V̄ = 0 even with a NaN cotangent,
    and neither U nor Ū is written."""
    rng = np.random.default_rng(8)
    N, L = 600, 40
    cx = np.dtype(dtype).kind == "c"
    V = rng.standard_normal((N, L)) + (1j * rng.standard_normal((N, L)) if cx else 0)
    V[:, 3] = 0
    U, r = normalize_columns(V.astype(dtype), np)
    Ub = (rng.standard_normal((N, L)) + (1j * rng.standard_normal((N, L)) if cx else 0)).astype(
        dtype
    )
    Ub[:, 3] = np.nan
    Sb = rng.standard_normal((L, L)).astype(dtype)
    U0, Ub0 = U.copy(), Ub.copy()
    P = np.triu(Sb, 1)
    Ut = Ub + U @ (P + P.conj().T)
    proj = np.sum(np.real(U.conj() * Ut), axis=0, keepdims=True)
    ref = np.where(r > 0, (Ut - U * proj) / np.where(r > 0, r, 1), 0)
    out = factors_vjp(U, r, Ub, Sb, np)
    # a few roundings of O(L) products of O(1) entries per element
    np.testing.assert_allclose(out, ref, rtol=0, atol=100 * L * np.finfo(np.float64).eps)
    np.testing.assert_array_equal(out[:, 3], 0)
    np.testing.assert_array_equal(U, U0)
    np.testing.assert_array_equal(Ub, Ub0)
    np.testing.assert_allclose(np.linalg.norm(U[:, [0, 1, 5]], axis=0), 1, rtol=1e-14)


def test_resolve_promotes_and_names_arguments():
    _, _, dtype, (a, b) = resolve([("a", np.ones(2, dtype=np.int32)), ("b", [1.0, 2.0])])
    assert dtype == np.float64 and a.dtype == np.float64 and isinstance(b, np.ndarray)
    with pytest.raises(TypeError, match="x has dtype object"):
        resolve([("x", object())])
    same = np.ones(3)
    _, _, _, (c,) = resolve([("c", same)])
    assert c is same  # no copy when nothing needs converting


def test_resolve_numpy_constants_join_jax():
    """NumPy arrays mixed with JAX arrays (or tracers, under jax.grad over one argument)
    join JAX's namespace; other mixes still raise TypeError naming the arguments."""
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    def f(x):
        _, _, dtype, (a, b) = resolve([("a", np.ones(3)), ("b", x)], None)
        assert aac.is_jax_array(a) and dtype == jnp.float64
        return jnp.sum(a * b)

    np.testing.assert_array_equal(np.asarray(jax.grad(f)(jnp.arange(3.0))), np.ones(3))
    torch = require("torch")
    with pytest.raises(TypeError, match=r"different array libraries \(a: numpy"):
        resolve([("a", np.ones(3)), ("b", torch.ones(3))], None)
