"""Complex Householder, CWY and T-CWY maps (complex64/complex128) on every backend, against
oracles that share no code with the library: dense products of the definition
H(v) = I − 2vvᴴ/‖v‖² (``helpers.reflection``) and LAPACK's ``zungqr`` / ``zunmqr``.

Tolerances: as in test_cwy.py, 10·eps·(N + L)·max(1, ‖T‖₂) (``helpers.tol``) per entry, with
eps of the input dtype (complex64 is accumulated in complex128 on CPU, so its results sit at
a few float32 ulps). A wrong formula (Uᵀ instead of Uᴴ, T instead of Tᴴ, a missing conjugate
in the plain transpose) is off by O(1): the imaginary parts are of the same size as the real
ones.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg.lapack as lapack
from conftest import require, to_numpy
from helpers import (
    ci_examples,
    fit_reflector_spec,
    growth,
    orth_error,
    product_of_reflections,
    reflector_shapes,
    tol,
)
from hypothesis import given
from hypothesis import strategies as st

import householderla as hl

C128 = np.complex128


def complex_V(spec: dict, dtype=C128) -> np.ndarray:
    """Complex reflection vectors of a ``reflector_shapes`` spec (its zero columns kept)."""
    rng = np.random.default_rng(spec["seed"])
    shape = spec["batch"] + (spec["n"], spec["L"])
    V = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    V[..., np.asarray(spec["zeros"], dtype=bool)] = 0.0
    return V.astype(dtype)


def crandn(rng, *shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


def _cmp(actual, expected, bound):
    a = to_numpy(actual)
    err = float(np.max(np.abs(a - expected))) if a.size else 0.0
    assert err <= bound, f"max error {err:.3e} > {bound:.3e}"


# module-level: jax.jit caches one compilation per function object (and shapes)
def _matrices(V):
    Q = hl.cwy(V)
    return Q.matrix(), Q.H.matrix(), Q.T.matrix(), Q.conj().matrix()


def _applies(V, h):
    Q = hl.cwy(V)
    return Q @ h, Q.H @ h, Q.T @ h, Q.conj() @ h


def _there_and_back(V, h):
    return hl.cwy(V).H @ (hl.cwy(V) @ h)


def _tcwy_all(V, x, y):
    Om = hl.tcwy(V)
    return Om.matrix(), Om @ x, Om.H @ y, Om.T @ y


@pytest.mark.no_dask("Q.matrix() has no operand")
@given(spec=reflector_shapes())
@ci_examples(12)
def test_cwy_is_the_product_of_complex_reflections(bk, spec):
    """Theorem 2 with conjugate transposes: I − U S⁻¹ Uᴴ, S = ½I + striu(UᴴU), equals
    H(v₁)…H(v_L); ``.H``, ``.T`` and ``.conj()`` are Qᴴ, Qᵀ and conj(Q)."""
    spec = fit_reflector_spec(bk, spec)
    V = complex_V(spec)
    Q, QH, QT, Qc = (to_numpy(a) for a in bk.call(_matrices, bk.asarray(V, C128)))
    ref = product_of_reflections(V)
    b = tol(C128, spec["n"] + spec["L"], growth(V))
    _cmp(Q, ref, b)
    _cmp(QH, np.conj(np.swapaxes(ref, -1, -2)), b)
    _cmp(QT, np.swapaxes(ref, -1, -2), b)
    _cmp(Qc, np.conj(ref), b)
    assert Q.dtype == C128


@given(spec=reflector_shapes(), B=st.sampled_from([None, 1, 3]))
@ci_examples(12)
def test_applies_equal_the_dense_oracle(bk, spec, B):
    spec = fit_reflector_spec(bk, spec)
    V = complex_V(spec)
    rng = np.random.default_rng(spec["seed"] + 1)
    h = crandn(rng, spec["n"]) if B is None else crandn(rng, spec["n"], B)
    ref = product_of_reflections(V)
    y, yH, yT, yc = bk.call(_applies, bk.param(V, C128), bk.asarray(h, C128))
    # householder_apply takes no Dask operand: on dask it runs on the NumPy arrays
    y_seq = bk.call(hl.householder_apply, bk.param(V, C128), bk.param(h, C128))
    b = tol(C128, spec["n"] + spec["L"], growth(V))
    RH = np.conj(np.swapaxes(ref, -1, -2))
    _cmp(y, ref @ h, b)
    _cmp(y_seq, ref @ h, b)
    _cmp(yH, RH @ h, b)
    _cmp(yT, np.swapaxes(ref, -1, -2) @ h, b)
    _cmp(yc, np.conj(ref) @ h, b)


@given(spec=reflector_shapes())
@ci_examples(12)
def test_unitary_for_every_nonzero_V(bk, spec):
    """‖QᴴQ − I‖_F ≤ c·N·eps and Qᴴ(Qh) = h, for every V with a nonzero column."""
    spec = fit_reflector_spec(bk, spec)
    V = complex_V(spec)
    if all(spec["zeros"]):
        V[..., 0, 0] = 1.0 + 1.0j
    h = crandn(np.random.default_rng(spec["seed"]), spec["n"], 2)
    Q = to_numpy(bk.call(lambda V: hl.cwy(V).matrix(), bk.param(V, C128)))
    back = bk.call(_there_and_back, bk.param(V, C128), bk.asarray(h, C128))
    b = tol(C128, spec["n"] + spec["L"], growth(V))
    assert orth_error(Q) <= b * spec["n"]
    _cmp(back, np.broadcast_to(h, to_numpy(back).shape), 4 * b)


@given(spec=reflector_shapes())
@ci_examples(12)
def test_tcwy_is_the_first_columns(bk, spec):
    """Theorem 3 with conjugate transposes: Ω = [I; 0] − U S⁻¹ U₁ᴴ, and ΩᴴΩ = I."""
    spec = fit_reflector_spec(bk, spec)
    V = complex_V(spec)
    M = spec["L"]
    rng = np.random.default_rng(spec["seed"] + 2)
    x, y = crandn(rng, M, 2), crandn(rng, spec["n"], 3)
    Om, Omx, OmHy, OmTy = bk.call(
        _tcwy_all, bk.param(V, C128), bk.asarray(x, C128), bk.asarray(y, C128)
    )
    ref = product_of_reflections(V)[..., :, :M]
    b = tol(C128, spec["n"] + M, growth(V))
    _cmp(Om, ref, b)
    _cmp(Omx, ref @ x, b)
    _cmp(OmHy, np.conj(np.swapaxes(ref, -1, -2)) @ y, b)
    _cmp(OmTy, np.swapaxes(ref, -1, -2) @ y, b)
    assert orth_error(to_numpy(Om)) <= b * M


@pytest.mark.no_dask("Q.matrix() has no operand")
def test_complex64_stays_complex64_at_float32_accuracy(bk):
    rng = np.random.default_rng(3)
    V = crandn(rng, 40, 24)
    h = crandn(rng, 40, 3)
    Q, y = bk.call(
        lambda V, h: (hl.cwy(V).matrix(), hl.cwy(V) @ h),
        bk.asarray(V, np.complex64),
        bk.asarray(h, np.complex64),
    )
    Q, y = to_numpy(Q), to_numpy(y)
    assert Q.dtype == np.complex64 and y.dtype == np.complex64
    ref = product_of_reflections(V.astype(np.complex64))
    b = tol(np.complex64, 64, growth(V))
    _cmp(Q, ref, b)
    _cmp(y, ref @ h.astype(np.complex64), 4 * b)
    assert orth_error(Q) <= 40 * b


@pytest.mark.no_dask("mixed operands of an eager operator")
def test_dtype_promotion_real_and_complex(bk):
    """A real operator applied to complex h, and a complex operator to real h, give the
    complex result of the dense product; real V stays a real operator (``.T`` is ``.H``)."""
    rng = np.random.default_rng(4)
    Vr, Vc = rng.standard_normal((6, 3)), crandn(rng, 6, 3)
    hr, hc = rng.standard_normal((6, 2)), crandn(rng, 6, 2)
    Rr, Rc = product_of_reflections(Vr), product_of_reflections(Vc)
    out = bk.call(
        lambda Vr, Vc, hr, hc: (hl.cwy(Vr) @ hc, hl.cwy(Vc) @ hr, hl.cwy(Vr).H @ hr),
        bk.asarray(Vr),
        bk.asarray(Vc, C128),
        bk.asarray(hr),
        bk.asarray(hc, C128),
    )
    y1, y2, y3 = (to_numpy(a) for a in out)
    assert y1.dtype == C128 and y2.dtype == C128 and y3.dtype == np.float64
    _cmp(y1, Rr @ hc, 1e-13)
    _cmp(y2, Rc @ hr, 1e-13)
    _cmp(y3, Rr.T @ hr, 1e-13)


@pytest.mark.no_dask("Q.matrix() has no operand")
def test_zero_column_is_the_identity(bk):
    rng = np.random.default_rng(5)
    V = crandn(rng, 6, 3)
    Vz = np.concatenate([V[:, :1], np.zeros((6, 1)), V[:, 1:]], axis=1)
    f = lambda V: hl.cwy(V).matrix()  # noqa: E731
    Q, Qz = (to_numpy(bk.call(f, bk.asarray(a, C128))) for a in (V, Vz))
    np.testing.assert_allclose(Qz, Q, atol=1e-14)
    eye = to_numpy(bk.call(f, bk.asarray(np.zeros((4, 2)), C128)))
    np.testing.assert_array_equal(eye, np.eye(4))


@pytest.mark.no_dask("Q.matrix() has no operand")
def test_extreme_scales_give_the_same_reflections(bk_eager):
    """H(cv) = H(v): columns at 1e±300 and subnormal ones (which XLA on the CPU flushes to
    zero unless rescaled on entry) reflect as at unit scale, to the precision the scaled
    entries still carry (a subnormal at 1e-310 keeps ~44 bits: 1e-12)."""
    bk = bk_eager
    rng = np.random.default_rng(10)
    V = crandn(rng, 5, 3)
    Q = product_of_reflections(V)
    for scale, bound in ((1e300, 1e-13), (1e-300, 1e-13), (1e-310, 1e-12)):
        got = to_numpy(bk.call(lambda V: hl.cwy(V).matrix(), bk.asarray(V * scale, C128)))
        _cmp(got, Q, bound)


@pytest.mark.no_dask("a Dask operand is not broadcast against the operator's batch")
def test_batched_and_rmatmul(bk):
    rng = np.random.default_rng(6)
    V = crandn(rng, 3, 7, 4)
    h = crandn(rng, 7, 5)
    w = crandn(rng, 2, 7)
    # array_api_strict's __matmul__ raises instead of deferring: call __rmatmul__ there
    y, z = bk.call(
        lambda V, h, w: (hl.cwy(V) @ h, hl.cwy(V).__rmatmul__(w)),
        *(bk.asarray(a, C128) for a in (V, h, w)),
    )
    ref = product_of_reflections(V)
    _cmp(y, ref @ h, 1e-13)
    _cmp(z, w @ ref, 1e-13)


def test_composition_and_linear_operator():
    """Products of complex operators (merged reflectors, .H reverses them) and SciPy's
    LinearOperator, whose rmatvec is the adjoint."""
    rng = np.random.default_rng(7)
    V1, V2 = crandn(rng, 8, 3), crandn(rng, 8, 4)
    Q1, Q2 = product_of_reflections(V1), product_of_reflections(V2)
    for op, ref in [
        (hl.cwy(V1) @ hl.cwy(V2), Q1 @ Q2),
        (hl.cwy(V1).H @ hl.cwy(V2), Q1.conj().T @ Q2),
        (hl.cwy(V1).T @ hl.cwy(V2).conj(), Q1.T @ Q2.conj()),
        (hl.cwy(V1) @ hl.tcwy(V2), Q1 @ Q2[:, :4]),
    ]:
        _cmp(op.matrix(), ref, 1e-13)
        _cmp(op.H.matrix(), ref.conj().T, 1e-13)
    assert isinstance(hl.cwy(V1).H @ hl.cwy(V2), hl.CWY)  # 7 reflectors ≤ 8 concatenate
    A = hl.cwy(V1).aslinearoperator()
    x = crandn(rng, 8)
    _cmp(A.matvec(x), Q1 @ x, 1e-13)
    _cmp(A.rmatvec(x), Q1.conj().T @ x, 1e-13)
    _cmp(A.H.matvec(x), Q1.conj().T @ x, 1e-13)


def _lapack_storage(V):
    """LAPACK's (a, τ) for lower-trapezoidal V with a nonzero diagonal: H(v) = H(v/v_kk),
    so ṽ = v/v_kk has the implicit unit diagonal and τ = 2/‖ṽ‖² is real."""
    N, L = V.shape
    a = np.zeros((N, L), dtype=C128)
    tau = np.zeros(L, dtype=C128)
    for k in range(L):
        vt = V[:, k] / V[k, k]
        a[k + 1 :, k] = vt[k + 1 :]
        tau[k] = 2.0 / np.vdot(vt, vt).real
    return a, tau


@pytest.mark.parametrize("shape", [(9, 9), (12, 5)])
def test_against_lapack_zungqr_and_zunmqr(shape):
    """The same reflectors in LAPACK's storage: ``zungqr`` forms Q, ``zunmqr`` applies Q and
    Qᴴ from the left and Q from the right; LAPACK shares no code with the library."""
    N, L = shape
    rng = np.random.default_rng(8)
    V = np.tril(crandn(rng, N, L))
    a, tau = _lapack_storage(V)
    full = np.concatenate([a, np.zeros((N, N - L), dtype=C128)], axis=1)
    Q_lapack, _, info = lapack.zungqr(full, tau, lwork=64 * N)
    assert info == 0
    Q = hl.cwy(V)
    _cmp(Q.matrix(), Q_lapack, tol(C128, N + L, growth(V)))
    C = crandn(rng, N, 6)
    for trans, op in ((b"N", Q), (b"C", Q.H)):
        ref, _, info = lapack.zunmqr(b"L", trans, a, tau, C, 64 * N)
        assert info == 0
        _cmp(op @ C, ref, tol(C128, N + L, growth(V)))
    ref, _, _ = lapack.zunmqr(b"R", b"N", a, tau, C.T.copy(), 64 * N)
    _cmp(C.T @ Q, ref, tol(C128, N + L, growth(V)))
    Om = hl.tcwy(V)  # the thin Q: zungqr with L columns
    thin, _, _ = lapack.zungqr(a, tau, lwork=64 * N)
    _cmp(Om.matrix(), thin, tol(C128, N + L, growth(V)))


def test_complex_torch_numpy_jax_agree():
    """The same complex map on the three eager namespaces, to rounding."""
    torch = require("torch")
    rng = np.random.default_rng(9)
    V, h = crandn(rng, 10, 6), crandn(rng, 10, 2)
    ref = hl.cwy(V) @ h
    got = hl.cwy(torch.asarray(V)) @ torch.asarray(h)
    assert got.dtype == torch.complex128
    _cmp(got, ref, 1e-13)
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)  # as the jax backends of conftest do
    jnp = jax.numpy
    got = hl.cwy(jnp.asarray(V)).H @ jnp.asarray(h)
    _cmp(got, hl.cwy(V).H @ h, 1e-13)
