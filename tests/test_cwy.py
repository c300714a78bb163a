"""Theorems 2 and 3 of the CWY paper (Likhosherstov et al., AISTATS 2021) as property tests, on
every backend.

Tolerances: each result is compared with a float64 NumPy oracle built from the definition
(dense products of H(v) = I − 2vvᵀ/‖v‖²). CWY's rounding error is a few GEMMs' worth,
~eps·N per entry, amplified by ‖T‖ (T = S⁻¹ grows for nearly parallel reflectors), so the
bound is 10·eps·(N+L)·max(1, ‖T‖₂) — see :func:`helpers.tol`. A wrong formula (missing striu,
T instead of Tᵀ, unnormalised U) is off by O(1).

Backends: every test on the operators' products runs on dask too (Dask operands, lazy results);
the functions passed to ``bk.call`` are module-level, so under jax_jit one compilation serves
every example of the same shape (JAX examples draw from ``helpers.FEW_REFLECTOR_SHAPES``).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require, to_numpy
from helpers import (
    ci_examples,
    fit_reflector_spec,
    growth,
    make_V,
    orth_error,
    product_of_reflections,
    reflector_shapes,
    tol,
)
from hypothesis import given
from hypothesis import strategies as st

import householderla as hl


def _cmp(actual, expected, bound):
    a = to_numpy(actual)
    err = float(np.max(np.abs(a - expected))) if a.size else 0.0
    assert err <= bound, f"max error {err:.3e} > {bound:.3e}"


# module-level: jax.jit caches a compilation per function object (and shapes)
def _matrix(V):
    return hl.cwy(V).matrix()


def _apply_and_transpose(V, h):
    return hl.cwy(V) @ h, hl.cwy(V).T @ h


def _there_and_back(V, h):
    return hl.cwy(V).T @ (hl.cwy(V) @ h)


def _tcwy_products(V, x, y):
    return hl.tcwy(V) @ x, hl.tcwy(V).T @ y


def _tcwy_matrix(V):
    return hl.tcwy(V).matrix()


@pytest.mark.no_dask("Q.matrix() has no operand")
@given(spec=reflector_shapes())
@ci_examples(12)
def test_theorem2_cwy_equals_product_of_reflections(bk, spec):
    spec = fit_reflector_spec(bk, spec)
    V = make_V(spec)
    Q = bk.call(_matrix, bk.asarray(V))
    n = spec["n"] + spec["L"]
    _cmp(Q, product_of_reflections(V), tol(np.float64, n, growth(V)))


@given(spec=reflector_shapes(), B=st.sampled_from([None, 1, 3]))
@ci_examples(12)
def test_apply_equals_dense_and_sequential(bk, spec, B):
    spec = fit_reflector_spec(bk, spec)
    V = make_V(spec)
    rng = np.random.default_rng(spec["seed"] + 1)
    h = rng.standard_normal((spec["n"],) if B is None else (spec["n"], B))
    Qd = product_of_reflections(V)
    y_cwy, yT = bk.call(_apply_and_transpose, bk.param(V), bk.asarray(h))
    # householder_apply takes no Dask operand: on dask it runs on the NumPy arrays
    y_seq = bk.call(hl.householder_apply, bk.param(V), bk.param(h))
    b = tol(np.float64, spec["n"] + spec["L"], growth(V))
    _cmp(y_cwy, Qd @ h, b)
    _cmp(y_seq, Qd @ h, b)
    _cmp(yT, np.swapaxes(Qd, -1, -2) @ h, b)


@given(spec=reflector_shapes())
@ci_examples(12)
def test_orthogonality_and_inverse(bk, spec):
    spec = fit_reflector_spec(bk, spec)
    V = make_V(spec)
    if not any(not z for z in spec["zeros"]):
        V[..., 0, 0] = 1.0  # at least one nonzero vector: "every nonzero V"
    h = np.random.default_rng(spec["seed"]).standard_normal((spec["n"], 2))
    Q = bk.call(_matrix, bk.param(V))
    back = bk.call(_there_and_back, bk.param(V), bk.asarray(h))
    b = tol(np.float64, spec["n"] + spec["L"], growth(V))
    assert orth_error(to_numpy(Q)) <= b * spec["n"]
    _cmp(back, np.broadcast_to(h, to_numpy(back).shape), b * 4)


@given(spec=reflector_shapes())
@ci_examples(12)
def test_theorem3_tcwy_is_first_columns(bk, spec):
    spec = fit_reflector_spec(bk, spec)
    V = make_V(spec)
    M = spec["L"]
    rng = np.random.default_rng(spec["seed"] + 2)
    x = rng.standard_normal((M, 2))
    y = rng.standard_normal((spec["n"], 3))
    Om = bk.call(_tcwy_matrix, bk.param(V))
    Omx, OmTy = bk.call(_tcwy_products, bk.param(V), bk.asarray(x), bk.asarray(y))
    ref = product_of_reflections(V)[..., :, :M]
    b = tol(np.float64, spec["n"] + M, growth(V))
    _cmp(Om, ref, b)
    _cmp(Omx, ref @ x, b)
    _cmp(OmTy, np.swapaxes(ref, -1, -2) @ y, b)
    assert orth_error(to_numpy(Om)) <= b * M


@pytest.mark.no_dask("Q.matrix() has no operand")
def test_zero_column_is_identity_reflector(bk):
    rng = np.random.default_rng(0)
    V = rng.standard_normal((6, 3))
    Vz = np.concatenate([V[:, :1], np.zeros((6, 1)), V[:, 1:]], axis=1)
    Q, Qz = (to_numpy(bk.call(lambda V: hl.cwy(V).matrix(), bk.asarray(a))) for a in (V, Vz))
    np.testing.assert_allclose(Qz, Q, atol=1e-14)
    I = to_numpy(bk.call(lambda V: hl.cwy(V).matrix(), bk.asarray(np.zeros((4, 2)))))
    np.testing.assert_array_equal(I, np.eye(4))


@pytest.mark.no_dask("a Dask operand is not broadcast against the operator's batch")
def test_batched_equals_loop(bk):
    rng = np.random.default_rng(1)
    V = rng.standard_normal((3, 2, 7, 4))
    h = rng.standard_normal((2, 7, 5))  # broadcasts against V's batch (3, 2)
    y = to_numpy(bk.call(lambda V, h: hl.cwy(V) @ h, bk.asarray(V), bk.asarray(h)))
    assert y.shape == (3, 2, 7, 5)
    for i in range(3):
        for j in range(2):
            yi = to_numpy(
                bk.call(lambda V, h: hl.cwy(V) @ h, bk.asarray(V[i, j]), bk.asarray(h[j]))
            )
            np.testing.assert_allclose(y[i, j], yi, atol=1e-13)


@pytest.mark.no_dask("broadcast operands and Q.mv take no Dask arrays")
def test_matmul_semantics_and_metadata(bk):
    """``Q @ h`` is ``Q.matrix() @ h`` for every operand ``matmul`` accepts."""
    rng = np.random.default_rng(2)
    V = rng.standard_normal((2, 5, 3))
    Vb = bk.asarray(V)
    Q = hl.cwy(Vb)
    Om = hl.tcwy(Vb)
    assert Q.shape == (2, 5, 5) and Q.T.shape == (2, 5, 5) and Q.ndim == 3
    assert Om.shape == (2, 5, 3) and Om.T.shape == (2, 3, 5)
    assert Q.dtype == Vb.dtype and Om.dtype == Vb.dtype
    assert "CWY" in repr(Q) and ".T" in repr(Q.T)
    Qd = product_of_reflections(V)
    for h in (rng.standard_normal(5), rng.standard_normal((5, 4)), rng.standard_normal((1, 5, 2))):
        out = Q @ bk.asarray(h)
        assert type(out) is type(Vb)
        np.testing.assert_allclose(to_numpy(out), Qd @ h, atol=1e-13)
    # row vectors from the left, and stacks of vectors along the last axis
    r = rng.standard_normal((2, 4, 5))
    if bk.name == "array_api_strict":  # its __matmul__ raises instead of deferring
        with pytest.raises(TypeError):
            bk.asarray(r) @ Q
    else:
        np.testing.assert_allclose(to_numpy(bk.asarray(r) @ Q), r @ Qd, atol=1e-13)
    np.testing.assert_allclose(to_numpy(Q.__rmatmul__(bk.asarray(r))), r @ Qd, atol=1e-13)
    hv = rng.standard_normal((2, 5))
    np.testing.assert_allclose(
        to_numpy(Q.mv(bk.asarray(hv))), np.einsum("bij,bj->bi", Qd, hv), atol=1e-13
    )
    np.testing.assert_allclose(to_numpy(Q.T.matrix()), np.swapaxes(Qd, -1, -2), atol=1e-13)
    np.testing.assert_allclose(
        to_numpy(Om.T.matrix()), np.swapaxes(Qd[..., :3], -1, -2), atol=1e-13
    )
    np.testing.assert_allclose(to_numpy(Om.T.T.matrix()), Qd[..., :3], atol=1e-13)


@pytest.mark.no_dask("householder_apply and the inverses take no Dask arrays")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_device_and_namespace_preserved(bk, dtype):
    rng = np.random.default_rng(3)
    V = bk.asarray(rng.standard_normal((6, 4)), dtype=dtype)
    h = bk.asarray(rng.standard_normal((6, 2)), dtype=dtype)
    outs = bk.call(
        lambda V, h: (
            hl.cwy(V) @ h,
            hl.cwy(V).matrix(),
            hl.tcwy(V).matrix(),
            hl.householder_apply(V, h),
            hl.householder_vectors(hl.cwy(V).matrix()),
            hl.tcwy_vectors(hl.tcwy(V).matrix()),
        ),
        V,
        h,
    )
    for out in outs:
        assert type(out) is type(V)
        assert out.dtype == V.dtype
        if bk.eager:
            import array_api_compat as aac

            assert aac.device(out) == aac.device(V)


@pytest.mark.no_dask("Q.matrix() has no operand")
def test_float32_accuracy_near_float32_floor(bk):
    """float32 orthogonality error stays at the rounding floor (Gram and T in float64 on
    CPU): ≤ 2·eps32·N, where rounding an exactly orthogonal matrix already gives ~eps·√N."""
    rng = np.random.default_rng(4)
    N = 64
    V = bk.asarray(rng.standard_normal((N, N)), dtype=np.float32)
    Q = to_numpy(bk.call(lambda V: hl.cwy(V).matrix(), V))
    assert Q.dtype == np.float32
    assert orth_error(Q) <= 2 * float(np.finfo(np.float32).eps) * N


def test_integer_input_promotes_to_default_float(bk_eager):
    bk = bk_eager
    V = bk.asarray([[1, 0], [1, 1], [0, 2]], dtype=np.int64)
    Q = hl.cwy(V)
    info = bk.xp.__array_namespace_info__()
    assert Q.dtype == info.default_dtypes()["real floating"]
    ref = product_of_reflections(np.array([[1, 0], [1, 1], [0, 2]], dtype=float))
    np.testing.assert_allclose(to_numpy(Q.matrix()), ref, atol=1e-6)


def test_lapack_oracle_householder_product():
    """On LAPACK-structured reflectors (unit diagonal, zeros above) CWY equals orgqr.

    LAPACK stores H = I − τ v vᵀ; for real Householder reflectors τ = 2/‖v‖², except τ = 0
    (the identity, e.g. the last reflector of a square QR), which is our zero column."""
    torch = require("torch")
    rng = np.random.default_rng(5)
    for n in (1, 7, 64, 200):
        A = torch.asarray(rng.standard_normal((n, n)))
        a, tau = torch.geqrf(A)
        Vl = (torch.tril(a, -1) + torch.eye(n, dtype=a.dtype)) * (tau != 0)
        ref = torch.linalg.householder_product(a, tau)
        Q = hl.cwy(Vl).matrix()
        assert float(torch.max(torch.abs(Q - ref))) <= 1e-12


def test_inputs_are_not_mutated(bk_eager):
    bk = bk_eager
    rng = np.random.default_rng(6)
    V0, h0 = rng.standard_normal((5, 3)), rng.standard_normal((5, 2))
    V, h = bk.asarray(V0), bk.asarray(h0)
    hl.cwy(V) @ h
    hl.tcwy(V).T @ h
    hl.householder_apply(V, h)
    hl.vjp.cwy_apply(V, h, h)
    hl.householder_vectors(hl.cwy(V).matrix())
    np.testing.assert_array_equal(to_numpy(V), V0)
    np.testing.assert_array_equal(to_numpy(h), h0)


@pytest.mark.no_dask("Q.matrix() has no operand")
@pytest.mark.parametrize(
    "block",
    [None, pytest.param(2, marks=pytest.mark.jax_long("the blocked path is NumPy/torch only"))],
)
def test_structured_dense_path_equals_definition(bk, block, monkeypatch):
    """Lower-trapezoidal V (LAPACK layout) takes the orgqr-style path on NumPy/torch; the
    result must be the same product of reflections, batched, with zero columns, for CWY and
    T-CWY, and for a block size that splits the reflectors unevenly."""
    from householderla._agnostic import forming as _compact_wy

    if block is not None:
        monkeypatch.setattr(_compact_wy.structured_matrix, "__defaults__", (None, block))
    rng = np.random.default_rng(17)
    V = np.tril(rng.standard_normal((2, 7, 5)))
    V[1, :, 3] = 0.0
    Q, Om, QT = bk.call(
        lambda V: (hl.cwy(V).matrix(), hl.tcwy(V).matrix(), hl.cwy(V).T.matrix()),
        bk.asarray(V),
    )
    ref = product_of_reflections(V)
    np.testing.assert_allclose(to_numpy(Q), ref, atol=1e-14)
    np.testing.assert_allclose(to_numpy(QT), np.swapaxes(ref, -1, -2), atol=1e-14)
    np.testing.assert_allclose(to_numpy(Om), ref[..., :5], atol=1e-14)


@pytest.mark.slow
def test_orthogonality_beats_lapack_orgqr():
    """Issue targets: float32 ‖QᵀQ − I‖_F no worse than LAPACK orgqr on the same reflectors
    (N = 256, 1024), float64 ≤ 1e-13 at N = 1024. Measured: float32 5.8e-7 / 1.1e-6 vs
    orgqr 8.4e-6 / 2.0e-5 (AMD EPYC); float64 7.6e-14 vs 7.7e-14 on AMD EPYC, but 8.7e-14 vs
    4.7e-14 on an Intel Xeon (torch's orgqr and NumPy's OpenBLAS pick other kernels there).
    So float64 is held to the absolute 1e-13 and to 2× orgqr; closing the gap to orgqr on
    every CPU is issue 19."""
    torch = require("torch")
    rng = np.random.default_rng(0)
    for dtype, n in ((np.float32, 256), (np.float32, 1024), (np.float64, 1024)):
        A = torch.asarray(rng.standard_normal((n, n)).astype(dtype))
        a, tau = torch.geqrf(A)
        Vl = (torch.tril(a, -1) + torch.eye(n, dtype=a.dtype)) * (tau != 0)
        ours = orth_error(hl.cwy(Vl.numpy()).matrix())
        lapack = orth_error(torch.linalg.householder_product(a, tau).numpy())
        assert ours <= lapack * (1.0 if dtype == np.float32 else 2.0), (dtype, n, ours, lapack)
        if dtype == np.float64:
            assert ours <= 1e-13


@pytest.mark.parametrize("ncols", [None, 4, 9])
def test_one_shot_and_structured_kernels_equal_definition(ncols):
    """The dense kernels behind ``.matrix()``: the one-shot I − V S⁻¹ Vᵀ (any V; syrk, trsm,
    one GEMM) and the orgqr-style blocked path (trapezoidal V; block 3 splits 9 reflectors
    unevenly and the identity-column shortcut is exercised for every ncols, including
    ncols < L). Batched, with a zero column; errors are a few ulps (atol 1e-14 ≈ 50 eps)."""
    from householderla._agnostic import forming as _compact_wy

    rng = np.random.default_rng(23)
    V = rng.standard_normal((2, 12, 9))
    V[1, :, 4] = 0.0
    ref = product_of_reflections(V)[..., : (ncols or 12)]
    np.testing.assert_allclose(_compact_wy.dense_matrix(V, np, ncols), ref, atol=1e-14)
    Vt = np.tril(V)
    ref_t = product_of_reflections(Vt)[..., : (ncols or 12)]
    got = _compact_wy.structured_matrix(Vt, np, ncols, 3)
    np.testing.assert_allclose(got, ref_t, atol=1e-14)
    for dt in (np.float32, np.float64):  # float32 accumulates in float64, returns float32
        assert _compact_wy.dense_matrix(V.astype(dt), np, ncols).dtype == dt
