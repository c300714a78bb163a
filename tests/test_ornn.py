"""The oRNN parametrisation (Mhammedi et al., ICML 2017) and the structured (lower-trapezoidal) CWY
paths.

Theorems as property tests on every backend: Mhammedi et al., ICML 2017, Theorem 1 through the
constructive inverse ``ornn_params`` (both determinants, batched) and its complex form (§4.3,
Corollary 1: every unitary matrix, with the phases θ of Ĥ_1(θ)), the 2 × 2 counterexample that
makes H_1 necessary, Zhang, Lei & Dhillon, ICML 2018, Theorem 3 (k₁ + k₂ ≤ n + 2 covers O(n)) by its
constructive proof and its sharpness, and Mhammedi et al., ICML 2017, Proposition 1. The structured
products must equal the dense ones and the sequential reflections; every VJP passes the dot-product
test in float64.

Tolerances. Rebuilding Q from QR reflectors is backward stable: ~eps·n per entry from the
GEMMs plus ~eps·n from the QR, so 10·eps·n² is generous but still far below the O(1) error of
a wrong sign or a missing factor. The round trip of ``ornn_params`` takes the smaller
10·eps·n·min(n, 4) of test_householder.py (a CWY product's error is ~eps·n·‖T‖, ‖T‖ ≤ 4 for
these lower-trapezoidal reflectors). Applies are compared with a float64 oracle at
10·eps·(n + L)·max(1, ‖T‖₂) (helpers.tol): a few GEMMs' rounding amplified by T = S⁻¹.
Structured and dense products sum the same nonzero terms in a different order: the same bound.
The 2 × 2 distances are exact identities (‖R − Q‖_F = 2 for every reflection R and rotation Q),
checked to 1e-6. Complex oracles: Haar unitary samples (``scipy.stats.unitary_group``) and cwy
of the same reflectors.

Backends: the structured products also run with Dask operands; the functions given to
``bk.call`` in property tests are module-level (or cached), so under jax_jit one compilation
serves every example of a shape, and JAX examples draw from a few fixed shapes
(``helpers.few_shapes``).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from conftest import require, to_numpy
from helpers import (
    FEW_REFLECTOR_SHAPES,
    assert_vjp_matches_central_differences,
    examples,
    few_shapes,
    growth,
    haar_orthogonal,
    haar_stack,
    product_of_reflections,
    tol,
)
from hypothesis import example, given
from hypothesis import strategies as st

import householderla as hl
from householderla._agnostic import trapezoidal as _structured
from householderla.ornn import ornn, ornn_apply_vjp, ornn_matrix_vjp, ornn_params

EPS64 = float(np.finfo(np.float64).eps)


def _force_blocked(mp: pytest.MonkeyPatch, block: int = 2) -> None:
    """Run the blocked kernels at test sizes: blocks of ``block`` columns, always on."""
    mp.setattr(_structured, "BLOCK", block)
    mp.setattr(_structured, "use_structured", lambda *shape: True)
    mp.setattr(_structured, "use_structured_vjp", lambda *shape: True)


def _ornn_reference(U: np.ndarray, sign) -> np.ndarray:
    """Mhammedi et al., ICML 2017, eq. 6–8 by dense products of H_k(u_k) =
    diag(I, I − 2uuᵀ/‖u‖²) and H_1."""
    U = np.asarray(U, dtype=np.float64)
    sign = np.broadcast_to(np.asarray(sign, dtype=np.float64), U.shape[:-2])
    if U.ndim > 2:
        return np.stack([_ornn_reference(u, s) for u, s in zip(U, sign, strict=True)])
    n, m = U.shape
    W = np.eye(n)
    for j in range(m):  # column j holds u_{n−j} ∈ ℝ^{n−j} in rows j … n − 1: H_{n−j}
        u = U[j:, j]
        H = np.eye(n)
        if np.any(u != 0):
            H[j:, j:] -= 2.0 * np.outer(u, u) / (u @ u)
        W = W @ H
    return W @ np.diag(np.r_[np.ones(n - 1), float(sign)])


# -- Theorem 1 (Mhammedi et al., ICML 2017): M₁ is onto O(n), through the constructive inverse
# ----------------------


def _roundtrip(Q):
    U, s = ornn_params(Q)
    return U, s, ornn(U, s).matrix()


# module-level: jax.jit caches a compilation per function object (and shapes)
def _ornn_matrix_plus(U):
    return ornn(U, 1).matrix()


def _ornn_matrix_minus(U):
    return ornn(U, -1).matrix()


_ORNN_MATRIX = {1: _ornn_matrix_plus, -1: _ornn_matrix_minus}


def _ornn_matrix(U, s):
    return ornn(U, s).matrix()


def _two_sided(A, B):
    return hl.cwy(A).matrix() @ hl.cwy(B).T.matrix()  # H_{k2}…H_n = cwy(VR)ᵀ


def _roundtrip_phases(Q):
    """Complex Q: (U, θ) and ornn(U, theta=θ), and ``ornn(*ornn_params(Q))``: the inverse's
    output feeds the map as is (issue 41 item 8), θ in sign's place."""
    U, theta = ornn_params(Q)
    return U, theta, ornn(U, theta=theta).matrix(), ornn(*ornn_params(Q)).matrix()


#: the dtype of each (field, precision) the round trip draws
ROUNDTRIP_DTYPES = {
    ("real", "single"): np.float32,
    ("real", "double"): np.float64,
    ("complex", "single"): np.complex64,
    ("complex", "double"): np.complex128,
}


@pytest.mark.no_dask("ornn_params and Q.matrix() take no Dask operand")
@pytest.mark.parametrize("field", ["real", "complex"])
@given(
    n=st.integers(1, 8),
    dets=st.sampled_from([(1,), (-1,), (1, -1, -1), (None, None)]),
    precision=st.sampled_from(["single", "double"]),
    seed=st.integers(0, 2**31 - 1),
)
# a batch of two Haar samples at these sizes (N = 1: the sign or phase alone), as well as the
# drawn ones
@example(n=1, dets=(None, None), precision="double", seed=301)
@example(n=2, dets=(None, None), precision="double", seed=302)
@example(n=6, dets=(None, None), precision="double", seed=306)
def test_theorem1_and_corollary1_ornn_params_reach_every_determinant(
    bk, field, n, dets, precision, seed
):
    """ornn_params(Q) = (U, H_1) with U lower trapezoidal n × (n − 1) and ornn(U, H_1) = Q,
    batched: Mhammedi et al., ICML 2017, Theorem 1 for every Q ∈ O(n) (H_1 = diag(I, sign),
    sign ±1) and §4.3, Corollary 1 for every Q ∈ U(n) (Ĥ_n(u_n)…Ĥ_2(u_2) Ĥ_1(θ), Ĥ_1(θ) =
    diag(e^{iθ}), ``theta=``). H_1 carries the determinant: det Q = det H_1 ·
    (−1)^(number of nonzero u_k)."""
    # JAX: n, the batch (one, two Haar or three determinants) and the dtype from a few cases
    few = [(1, (-1,), "double"), (3, (1, -1, -1), "single"), (6, (None, None), "double")]
    n, dets, precision = few_shapes(bk, (n, dets, precision), few, seed)
    dtype = ROUNDTRIP_DTYPES[field, precision]
    Q = haar_stack(n, dets, dtype, seed)
    if len(dets) == 1:
        Q = Q[0]
    if field == "complex":
        U, theta, W, W2 = map(to_numpy, bk.call(_roundtrip_phases, bk.asarray(Q, dtype)))
        assert theta.shape == Q.shape[:-1] and theta.dtype == np.finfo(dtype).dtype
        np.testing.assert_array_equal(W2, W)
        det_h1 = np.exp(1j * np.sum(theta.astype(np.float64), axis=-1))
    else:
        U, s, W = map(to_numpy, bk.call(_roundtrip, bk.asarray(Q, dtype)))
        assert s.shape == Q.shape[:-2] and s.dtype == dtype
        assert set(np.unique(s)) <= {-1.0, 1.0}
        det_h1 = s
    assert U.shape == Q.shape[:-1] + (n - 1,)
    assert U.dtype == dtype and W.dtype == dtype
    np.testing.assert_array_equal(np.triu(U, 1), 0.0)  # u_k ∈ ℝᵏ (ℂᵏ): lower trapezoidal
    # W = Q to rounding: 10·eps·N·min(N, 4) (the module docstring)
    N = max(n, 2)
    bound = 10 * float(np.finfo(dtype).eps) * N * min(N, 4)
    np.testing.assert_allclose(W, Q, rtol=0, atol=bound)
    # det Q = det H_1 · (−1)^(number of nonzero u_k): H_1 carries the determinant
    nonzero = np.sum(np.linalg.norm(U.astype(np.complex128), axis=-2) > 0, axis=-1)
    assert np.max(np.abs(det_h1 * (-1.0) ** nonzero - np.linalg.det(Q))) <= bound


@pytest.mark.no_dask("Q.matrix() has no operand")
@given(spec=st.fixed_dictionaries({"n": st.integers(2, 7), "seed": st.integers(0, 2**31 - 1)}))
def test_ornn_matches_definition_eq6_to_eq8(bk, spec):
    """ornn(U, sign) is H_n(u_n)…H_{n−m+1}(u_{n−m+1}) H_1(sign) built from eq. 6–7 directly,
    for every m ≤ n − 1, both signs, and entries above the diagonal that must be ignored."""
    n = few_shapes(bk, spec["n"], [2, 5], spec["seed"])
    rng = np.random.default_rng(spec["seed"])
    for m in range(n):
        U = np.tril(rng.standard_normal((n, m)))
        garbage = U + np.triu(rng.standard_normal((n, m)), 1)
        for sign in (1, -1):
            W = to_numpy(bk.call(_ORNN_MATRIX[sign], bk.asarray(garbage)))
            np.testing.assert_allclose(W, _ornn_reference(U, sign), atol=tol(np.float64, 2 * n))


# -- the 2 × 2 counterexample: why H_1 is needed -------------------------------------------------


def _rotation(theta: float) -> np.ndarray:
    c, s = np.cos(theta), np.sin(theta)
    return np.array([[c, -s], [s, c]])


@given(
    u=st.tuples(st.floats(-10, 10), st.floats(-10, 10)),
    theta=st.floats(0.1, 2 * np.pi - 0.1),
)
@examples(40)
def test_counterexample_2x2_without_h1(u, theta):
    """n = 2, m = n − 1 = 1, sign fixed to +1: W = H_2(u) is a reflection (det −1) or I
    (u = 0). A rotation Q ≠ I (det +1) is at Frobenius distance exactly 2 from every reflection
    and √(4 − 4 cos θ) > 0 from I: not reachable. With H_1 (sign = −1) it is."""
    Q = _rotation(theta)
    W = ornn(np.array([[u[0]], [u[1]]]), 1).matrix()
    dist = np.linalg.norm(W - Q)
    if u == (0.0, 0.0):
        np.testing.assert_array_equal(W, np.eye(2))
        assert dist >= np.sqrt(4 - 4 * np.cos(theta)) - 1e-12
    else:
        assert abs(np.linalg.det(W) + 1) <= 1e-12
        assert abs(dist - 2.0) <= 1e-6
    assert dist > 0.09  # ≥ min(2, √(4 − 4 cos 0.1)) ≈ 0.0999


@pytest.mark.parametrize("scale", [1e-200, 1e200])
def test_structured_matrix_extreme_norms(scale):
    """H(cv) = H(v) for every c ≠ 0: the structured dense path must not depend on the scale
    (‖v‖² under/overflows in the unnormalised Gram unless columns are rescaled by 2^k)."""
    V = np.tril(np.ones((3, 2))) * scale
    np.testing.assert_allclose(
        hl.cwy(V).matrix(), hl.cwy(V, structure="dense").matrix(), atol=1e-15
    )


@pytest.mark.no_dask("ornn_params and Q.matrix() take no Dask operand")
def test_counterexample_2x2_with_h1(bk):
    """With H_1 every rotation is reached: ornn_params returns sign = −1 and a nonzero u_2
    (the rotation is the reflection H_2(u_2) times diag(1, −1)). Mhammedi et al.'s own remark:
    diag(1, −1) is not a product of two nonzero Householder reflections (those have det +1,
    distance exactly 2), but it is M₁(u_2 = 0, u_1 = −1)."""
    for theta in (0.3, np.pi / 2, np.pi, 5.0):
        Q = _rotation(theta)
        U, s, W = bk.call(
            _roundtrip,
            bk.asarray(Q),
        )
        assert float(to_numpy(s)) == -1.0
        assert np.any(to_numpy(U) != 0)
        np.testing.assert_allclose(to_numpy(W), Q, atol=1e-14)
    D = np.diag([1.0, -1.0])
    rng = np.random.default_rng(0)
    for _ in range(20):
        two = hl.cwy(rng.standard_normal((2, 2))).matrix()  # H(v₁)H(v₂), both nonzero
        assert abs(np.linalg.norm(two - D) - 2.0) <= 1e-12
    W = to_numpy(bk.call(_ORNN_MATRIX[-1], bk.asarray(np.zeros((2, 1)))))
    np.testing.assert_array_equal(W, D)


# -- Theorem 3 (Zhang, Lei & Dhillon, ICML 2018): k₁ + k₂ ≤ n + 2 covers O(n)
# -----------------------------------------


def _theorem3_factors(Q: np.ndarray, k1: int, k2: int, branch: int) -> tuple[np.ndarray, ...]:
    """The constructive proof of Zhang, Lei & Dhillon, ICML 2018, Theorem 3 (its Appendix A.4), in
    our layout.

    M_{k1,k2}(u, v, 1) = H_n(u_n)…H_{k1}(u_{k1}) · H_{k2}(v_{k2})…H_n(v_n) = cwy(UL) cwy(VR)ᵀ,
    with UL (n, n − k1 + 1) and VR (n, n − k2 + 1) lower trapezoidal (slot k ↦ column n − k).
    Branch 0 (needs k2 ≥ k1 − 1): Q = H_n(a_n)…H_1(a_1) (Theorem 1), u_k = a_k for k ≥ k1 and
    the rest a_{k1−1}, …, a_1 in the slots v_{k2}, v_{k2+1}, … (a_k ∈ ℝᵏ zero-padded to the
    slot's length, which needs k2 + k1 − 2 ≤ n), other v zero. Branch 1 (k1 ≥ k2 − 1): the
    same with Qᵀ = H_n(b_n)…H_1(b_1), i.e. Q = H_1(b_1)…H_n(b_n), v_k = b_k, and b_{k2−1}, …,
    b_1 in u_{k1}, u_{k1+1}, …."""
    n = Q.shape[0]
    m1, m2 = n - k1 + 1, n - k2 + 1
    UL, VR = np.zeros((n, m1)), np.zeros((n, m2))
    if branch == 0:
        U, s = ornn_params(Q)
        A = np.concatenate([U, np.eye(n)[:, -1:] * (1 - s) / 2], axis=1)  # a_k: column n − k
        UL[:] = A[:, :m1]
        for j in range(k1 - 1):  # v_{k2+j} = a_{k1−1−j}
            VR[:, n - (k2 + j)] = A[:, n - (k1 - 1 - j)]
    else:
        U, s = ornn_params(Q.T)
        B = np.concatenate([U, np.eye(n)[:, -1:] * (1 - s) / 2], axis=1)
        VR[:] = B[:, :m2]
        for j in range(k2 - 1):  # u_{k1+j} = b_{k2−1−j}
            UL[:, n - (k1 + j)] = B[:, n - (k2 - 1 - j)]
    return UL, VR


@pytest.mark.no_dask("Q.matrix() has no operand")
@given(
    n=st.integers(1, 7),
    data=st.data(),
    det=st.sampled_from([1, -1]),
    seed=st.integers(0, 2**31 - 1),
)
@examples(30)
def test_theorem3_k1_plus_k2_at_most_n_plus_2_covers_O_n(bk, n, data, det, seed):
    k1 = data.draw(st.integers(1, n), label="k1")
    k2 = data.draw(st.integers(1, min(n, n + 2 - k1)), label="k2")
    # JAX: one of each branch alone, both branches, and n = 1
    n, k1, k2 = few_shapes(bk, (n, k1, k2), [(1, 1, 1), (4, 2, 4), (5, 4, 3), (6, 6, 1)], seed)
    Q = haar_orthogonal(np.random.default_rng(seed), n, det)
    branches = [b for b, ok in ((0, k2 >= k1 - 1), (1, k1 >= k2 - 1)) if ok]
    assert branches  # one of the two always holds
    for branch in branches:
        UL, VR = _theorem3_factors(Q, k1, k2, branch)
        np.testing.assert_array_equal(np.triu(UL, 1), 0.0)  # u_k ∈ ℝᵏ, v_k ∈ ℝᵏ
        np.testing.assert_array_equal(np.triu(VR, 1), 0.0)
        W = bk.call(_two_sided, bk.asarray(UL), bk.asarray(VR))
        np.testing.assert_allclose(to_numpy(W), Q, atol=10 * EPS64 * max(n, 2) ** 2)


@given(n=st.integers(3, 7), data=st.data(), seed=st.integers(0, 2**31 - 1))
@examples(30)
def test_theorem3_is_sharp(n, data, seed):
    """k₁ + k₂ = n + 3 leaves n − 1 reflections: their product fixes a nonzero vector (the
    intersection of n − 1 hyperplanes), so W has eigenvalue 1 and ‖W + I‖₂ ≥ 2: −I is never
    reached."""
    k1 = data.draw(st.integers(3, n))
    k2 = n + 3 - k1
    rng = np.random.default_rng(seed)
    UL = np.tril(rng.standard_normal((n, n - k1 + 1)))
    VR = np.tril(rng.standard_normal((n, n - k2 + 1)))
    W = hl.cwy(UL).matrix() @ hl.cwy(VR).matrix().T
    assert np.linalg.svd(W - np.eye(n), compute_uv=False)[-1] <= 1e-12
    assert np.linalg.norm(W + np.eye(n), 2) >= 2 - 1e-12


# -- Proposition 1 (Mhammedi et al., ICML 2017): unnormalised compact WY
# ------------------------------------------


@pytest.mark.no_dask("Q.matrix() has no operand")
def test_proposition1_unnormalised_compact_wy(bk):
    """I − U T̃⁻¹ Uᵀ with T̃ = striu(UᵀU) + ½ diag(UᵀU) (Mhammedi et al., ICML 2017 eq. 12–13) is
    ornn(U);
    T̃ = D S D with D = diag(‖u_k‖) and S = ½I + striu(ŨᵀŨ) of the unit columns."""
    rng = np.random.default_rng(3)
    n, m = 7, 6
    U = np.tril(rng.standard_normal((n, m)))
    G = U.T @ U
    Tt = np.triu(G, 1) + 0.5 * np.diag(np.diag(G))
    W_prop1 = np.eye(n) - U @ np.linalg.solve(Tt, U.T)
    W = to_numpy(bk.call(lambda U: ornn(U).matrix(), bk.asarray(U)))
    np.testing.assert_allclose(W, W_prop1, atol=1e-13)
    D = np.diag(np.linalg.norm(U, axis=0))
    Un = U / np.linalg.norm(U, axis=0)
    S = 0.5 * np.eye(m) + np.triu(Un.T @ Un, 1)
    np.testing.assert_allclose(Tt, D @ S @ D, atol=1e-13)
    op = ornn(U)
    np.testing.assert_allclose(op.T_factor[:m, :m], np.linalg.inv(S), atol=1e-12)


# -- structured == dense == sequential ---------------------------------------------------------


@st.composite
def _trapezoid_spec(draw):
    n = draw(st.integers(1, 9))
    L = draw(st.integers(1, n))
    return {
        "n": n,
        "L": L,
        "batch": draw(st.sampled_from([(), (2,), (2, 1)])),
        "seed": draw(st.integers(0, 2**31 - 1)),
        "zeros": draw(st.lists(st.booleans(), min_size=L, max_size=L)),
        "B": draw(st.sampled_from([None, 1, 3])),
        "block": draw(st.sampled_from([1, 2, 3])),
    }


@functools.cache
def _structured_products(structure, block):
    """One function per (structure, block): a jax_jit compilation is reused only for the same
    monkeypatched block size."""

    def products(V, h, x):
        return (
            hl.cwy(V, structure=structure) @ h,
            hl.cwy(V, structure=structure).T @ h,
            hl.tcwy(V, structure=structure) @ x,
            hl.tcwy(V, structure=structure).T @ h,
        )

    return products


@functools.cache
def _structured_matrix(structure, block):
    return lambda V: hl.cwy(V, structure=structure).matrix()


@given(spec=_trapezoid_spec(), structure=st.sampled_from(["auto", "trapezoidal", "dense"]))
@examples(30)
def test_structured_equals_dense_equals_sequential(bk, spec, structure):
    # JAX: few (batch, n, L, B), the block fixed (JAX never takes the blocked kernels, see
    # test_blocked_kernels_are_dispatched); dask: unbatched (no broadcasting of Dask operands)
    few = [(*s, B) for s, B in zip(FEW_REFLECTOR_SHAPES, (None, 3, 1), strict=True)]
    batch, n, L, B = few_shapes(
        bk, (spec["batch"], spec["n"], spec["L"], spec["B"]), few, spec["seed"]
    )
    block = few_shapes(bk, spec["block"], [2], 0)
    batch = () if bk.operand_only else batch
    rng = np.random.default_rng(spec["seed"])
    V = np.tril(rng.standard_normal(batch + (n, L)))
    zeros = spec["zeros"] if L == spec["L"] else rng.random(L) < 0.3
    V[..., np.asarray(zeros, dtype=bool)] = 0.0
    h = rng.standard_normal((n,) if B is None else (n, B))
    x = rng.standard_normal((L,) if B is None else (L, B))
    Qd = product_of_reflections(V)
    with pytest.MonkeyPatch.context() as mp:
        _force_blocked(mp, block)
        y, yT, Om_x, OmT_h = (
            to_numpy(o)
            for o in bk.call(
                _structured_products(structure, block),
                bk.param(V),
                bk.asarray(h),
                bk.asarray(x),
            )
        )
        # no Dask operand: on dask these run on the NumPy arrays
        Qm = to_numpy(bk.call(_structured_matrix(structure, block), bk.param(V)))
        y_seq = to_numpy(bk.call(hl.householder_apply, bk.param(V), bk.param(h)))
    b = tol(np.float64, n + L, growth(V))
    QdT = np.swapaxes(Qd, -1, -2)
    np.testing.assert_allclose(y, Qd @ h, atol=b)
    np.testing.assert_allclose(y_seq, Qd @ h, atol=b)
    np.testing.assert_allclose(yT, QdT @ h, atol=b)
    np.testing.assert_allclose(Qm, Qd, atol=b)
    np.testing.assert_allclose(Om_x, Qd[..., :, :L] @ x, atol=b)
    np.testing.assert_allclose(OmT_h, QdT[..., :L, :] @ h, atol=b)


@pytest.mark.no_dask(
    "dispatch of eager products: Dask chunks reuse the prebuilt factors (the direct product)"
)
def test_blocked_kernels_are_dispatched(bk, monkeypatch):
    """The blocked products really run where they should: NumPy, array-api-strict, torch
    (no grad; CPU and CUDA) and CuPy for "auto" (eager detection) and "trapezoidal"; never
    for "dense", nor on JAX (whose products go through the custom_vjp wiring) or for
    non-trapezoidal V. The Numba first-product shortcut of ``@`` is switched off so the CWY
    kernels run."""
    monkeypatch.setenv("HL_DISABLE_NUMBA", "1")
    _force_blocked(monkeypatch)
    calls = []
    real = _structured.lowrank_apply

    def spy(*a, **k):
        calls.append(k["mode"])
        return real(*a, **k)

    monkeypatch.setattr(_structured, "lowrank_apply", spy)
    rng = np.random.default_rng(1)
    V = np.tril(rng.standard_normal((6, 4)))
    h = rng.standard_normal((6, 2))
    # every eager backend but JAX, CUDA ones included: which blocks suit a GPU is the
    # planner's choice by device (householderla._lib.device); today it is the CPU's
    native = bk.name in (
        "numpy",
        "numpy_readonly",
        "array_api_strict",
        "torch",
        "torch_cuda",
        "cupy",
    )
    for structure, Vin, expect in (
        ("auto", V, native),
        ("trapezoidal", V, native),
        ("dense", V, False),
        ("auto", V + np.triu(np.ones_like(V), 1), False),
    ):
        calls.clear()
        y = to_numpy(
            bk.call(
                lambda V, h, st=structure: hl.cwy(V, structure=st) @ h,
                bk.asarray(Vin),
                bk.asarray(h),
            )
        )
        assert bool(calls) == expect, (structure, calls)
        Vref = V if structure == "trapezoidal" else Vin
        np.testing.assert_allclose(y, product_of_reflections(Vref) @ h, atol=1e-13)
    calls.clear()
    bk.call(lambda V, x: hl.tcwy(V, structure="trapezoidal") @ x, bk.asarray(V), bk.asarray(h[:4]))
    assert bool(calls) == native


@pytest.mark.no_dask("Q.matrix() has no operand")
def test_trapezoidal_checks_or_ignores_the_upper_part(bk):
    """structure="trapezoidal" on a V with entries above the diagonal: ValueError on eager
    arrays (issue 18: it used to give another matrix silently); under jax.jit, where values
    cannot be read, they are treated as zero (also NaN/Inf) for every product. "auto" and
    "dense" use them."""
    rng = np.random.default_rng(2)
    V = np.tril(rng.standard_normal((2, 7, 5)))
    G = V + np.triu(rng.standard_normal((2, 7, 5)), 1)
    G[0, 0, 3] = np.nan
    G[1, 1, 4] = np.inf
    h = rng.standard_normal((7, 3))
    if bk.eager:
        for f in (hl.cwy, hl.tcwy):
            with pytest.raises(ValueError, match="nonzero entries above its diagonal"):
                f(bk.asarray(G), structure="trapezoidal")
    Gt = np.tril(G) if bk.eager else G  # eager: the products below on a valid V
    y, Q, Om = bk.call(
        lambda G, h: (
            hl.cwy(G, structure="trapezoidal") @ h,
            hl.cwy(G, structure="trapezoidal").matrix(),
            hl.tcwy(G, structure="trapezoidal").matrix(),
        ),
        bk.asarray(Gt),
        bk.asarray(h),
    )
    ref = product_of_reflections(V)
    np.testing.assert_allclose(to_numpy(y), ref @ h, atol=1e-13)
    np.testing.assert_allclose(to_numpy(Q), ref, atol=1e-13)
    np.testing.assert_allclose(to_numpy(Om), ref[..., :5], atol=1e-13)
    G2 = np.where(np.isfinite(G), G, 1.0)
    for structure in ("auto", "dense"):  # the upper part is used: a different matrix
        Qa = to_numpy(
            bk.call(lambda G, st=structure: hl.cwy(G, structure=st).matrix(), bk.asarray(G2))
        )
        np.testing.assert_allclose(Qa, product_of_reflections(G2), atol=1e-13)
        assert np.max(np.abs(Qa - ref)) > 0.1
    assert hl.cwy(bk.asarray(V), structure="trapezoidal").structure == "trapezoidal"
    assert hl.cwy(bk.asarray(V)).T.structure == "auto"


def test_structured_large_shape_default_dispatch(monkeypatch):
    """At a shape where the rule picks the blocked products (L ≥ 256, L ≥ N/2, B ≥ 16), ``@``
    of an operator whose single factor pair is built (``.U``) runs them by default and agrees
    with the dense products; float32 as well (float64 T, float32 products: ~eps32·n relative
    error per entry, bound 2e-4 on entries of order 1). The Numba first-product shortcut of
    ``@`` is switched off so the CWY kernels run; a fresh operator's first product takes the
    blocked compact WY (``tests/test_blocked.py``)."""
    monkeypatch.setenv("HL_DISABLE_NUMBA", "1")
    assert _structured.use_structured(300, 299, 16) and not _structured.use_structured(300, 299, 15)
    assert not _structured.use_structured(1024, 256, 64)  # one block: nothing to gain
    assert _structured.use_structured(1024, 1024, 1) and not _structured.use_structured(
        1024, 512, 1
    )
    calls = []
    real = _structured.lowrank_apply
    monkeypatch.setattr(
        _structured, "lowrank_apply", lambda *a, **k: calls.append(k["mode"]) or real(*a, **k)
    )
    rng = np.random.default_rng(4)
    n, L = 300, 299
    V = np.tril(rng.standard_normal((n, L)))
    h = rng.standard_normal((n, 16))
    for dtype, atol in ((np.float64, 1e-12), (np.float32, 2e-4)):
        Vd, hd = V.astype(dtype), h.astype(dtype)
        calls.clear()
        op = hl.cwy(Vd)
        op.U  # noqa: B018 - the single factor pair, as a reused operator has it
        y = op @ hd
        yT = hl.tcwy(Vd).T @ hd
        assert calls == ["square", "project"]
        assert y.dtype == dtype
        np.testing.assert_allclose(y, hl.cwy(Vd, structure="dense") @ hd, atol=atol)
        np.testing.assert_allclose(yT, hl.tcwy(Vd, structure="dense").T @ hd, atol=atol)
        calls.clear()
        op @ hd[:, :1]  # B = 1 with L < 512: dense (memory bound, no gain measured)
        assert calls == []


@pytest.mark.no_dask("Q.matrix() has no operand")
def test_ornn_batched_sign_and_dtypes(bk):
    rng = np.random.default_rng(5)
    U = np.tril(rng.standard_normal((3, 5, 4)))
    sign = np.array([1, -1, -1])
    for dtype in (np.float32, np.float64):
        W = to_numpy(bk.call(_ornn_matrix, bk.asarray(U, dtype), bk.asarray(sign, np.int64)))
        assert W.dtype == dtype and W.shape == (3, 5, 5)
        np.testing.assert_allclose(W, _ornn_reference(U, sign), atol=tol(dtype, 10))
    # a sign batch broadcasts against one U
    W = to_numpy(bk.call(_ornn_matrix, bk.asarray(U[0]), bk.asarray(sign)))
    assert W.shape == (3, 5, 5)
    np.testing.assert_allclose(W, _ornn_reference(np.broadcast_to(U[0], U.shape), sign), atol=1e-13)
    op = ornn(bk.asarray(U))
    assert op.shape == (3, 5, 5) and op.structure == "trapezoidal"


# -- complex U (Mhammedi et al., ICML 2017, §4.3): Ĥ_k with conjugate transposes ----------------


def test_ornn_complex_sign_and_errors():
    """sign −1 with complex U is the last reflector −e_n (H_1 = diag(I, −1)), as for real U;
    sign and θ exclude each other, and θ must be real (also for the VJP)."""
    rng = np.random.default_rng(14)
    U = np.tril(rng.standard_normal((5, 3)) + 1j * rng.standard_normal((5, 3)))
    V = np.concatenate([U, np.eye(5)[:, 4:]], axis=1)
    np.testing.assert_allclose(ornn(U, -1).matrix(), hl.cwy(V).matrix(), rtol=0, atol=1e-13)
    with pytest.raises(ValueError, match="sign or theta, not both"):
        ornn(U, -1, theta=np.zeros(5))
    with pytest.raises(TypeError, match="theta must be real"):
        hl.vjp.ornn_apply(U, 1, np.ones(5), np.ones(5), theta=np.zeros(5, dtype=complex))


# -- VJPs ---------------------------------------------------------------------------------------


# the dot-product test of both VJPs, every sign, blocked or not: tests/test_vjp.py (registry)


@pytest.mark.no_dask("the VJPs take no Dask arrays")
def test_vjp_upper_part_has_zero_gradient_and_no_effect(bk):
    """Entries above the diagonal are not parameters: moving them changes nothing, and the
    VJP there is exactly 0 (also with a dense direction in the dot-product test)."""
    rng = np.random.default_rng(6)
    U = rng.standard_normal((5, 4))  # a full matrix: the upper part is masked
    h = rng.standard_normal((5, 2))
    grads = assert_vjp_matches_central_differences(
        bk,
        lambda U, h: ornn(U, -1) @ h,
        lambda U, h, g: ornn_apply_vjp(U, -1, h, g),
        [U, h],
        rng,
    )
    np.testing.assert_array_equal(np.triu(grads[0], 1), 0.0)
    assert np.all(grads[0][np.tril(np.ones_like(U)) > 0] != 0)  # the trapezoid does get one


def _algorithm1(U: np.ndarray, h: np.ndarray, g: np.ndarray, fixed_norm: bool = False):
    """Mhammedi et al., ICML 2017, Algorithm 1 / Figure 7 (MATLAB) for one right-hand side: (C, h̄,
    Ū). With ``fixed_norm`` line 14 uses g *before* line 13's update, i.e. drops the term h̃_k C̃_k
    u_k: the gradient with ‖u_k‖ held fixed that Zhang, Lei & Dhillon, ICML 2018,
    §4.1 describes."""
    n, m = U.shape
    G, H, N, ht = np.zeros((n, m)), np.zeros((n, m + 1)), np.zeros(m), np.zeros(m)
    H[:, m] = h
    for k in range(m - 1, -1, -1):  # local forward propagation
        N[k] = U[:, k] @ U[:, k]
        ht[k] = 2 / N[k] * U[:, k] @ H[:, k + 1]
        H[:, k] = H[:, k + 1] - ht[k] * U[:, k]
    for k in range(m):  # local backward propagation
        c = 2 * U[:, k] @ g / N[k]
        g_new = g - c * U[:, k]
        G[:, k] = -ht[k] * (g if fixed_norm else g_new) - c * H[:, k + 1]
        g = g_new
    return H[:, 0], g, G


def test_vjp_is_the_full_gradient_of_the_ornn_theorem2_and_algorithm1():
    """Our Ū is Zhang, Lei & Dhillon, ICML 2018 eq. 15 summed over the reflections, i.e. the full
    gradient with respect to the unnormalised u_k: orthogonal to every u_k (H(u) does not depend on
    ‖u‖). Mhammedi et al.'s printed Theorem 2 (eq. 14, masked to the trapezoid) and Algorithm 1 give
    the same Ū: T̃ = striu(UᵀU) + ½ diag(UᵀU) carries the dependence on ‖u_k‖, and line 14 of
    Algorithm 1 uses the updated g, which contains the term 4 (uᵀx)(uᵀḡ)/‖u‖⁴ u. The
    fixed-norm gradient (that term dropped) differs from ours by exactly its radial part."""
    rng = np.random.default_rng(7)
    n, m = 6, 5
    U = np.tril(rng.standard_normal((n, m)))
    h, g = rng.standard_normal((2, n, 3))
    Ub, hb = ornn_apply_vjp(U, 1, h, g)
    np.testing.assert_allclose(np.sum(Ub * U, axis=0), 0.0, atol=1e-12)
    # Mhammedi et al., ICML 2017, Theorem 2, eq. 14–15, with T̃ of eq. 12 and B = striu(J) + ½I
    G = U.T @ U
    Tt = np.triu(G, 1) + 0.5 * np.diag(np.diag(G))
    h_t = np.linalg.solve(Tt, U.T @ h)
    C_t = np.linalg.solve(Tt.T, U.T @ g)
    Bm = np.triu(np.ones((m, m)), 1) + 0.5 * np.eye(m)
    eq14 = U @ ((h_t @ C_t.T) * Bm.T + (C_t @ h_t.T) * Bm) - g @ h_t.T - h @ C_t.T
    np.testing.assert_allclose(Ub, np.tril(eq14), atol=1e-12)
    np.testing.assert_allclose(hb, g - U @ C_t, atol=1e-12)  # eq. 15
    runs = [_algorithm1(U, h[:, b], g[:, b]) for b in range(3)]
    np.testing.assert_allclose(np.stack([r[0] for r in runs], 1), ornn(U) @ h, atol=1e-13)
    np.testing.assert_allclose(np.stack([r[1] for r in runs], 1), hb, atol=1e-13)
    # Mhammedi et al., ICML 2017, §5: "the values in the upper triangular part are set to zero"
    np.testing.assert_allclose(np.tril(sum(r[2] for r in runs)), Ub, atol=1e-12)
    fixed = np.tril(sum(_algorithm1(U, h[:, b], g[:, b], fixed_norm=True)[2] for b in range(3)))
    radial = np.sum(fixed * U, axis=0)
    assert np.max(np.abs(radial)) > 1e-2  # a wrong gradient: it moves ‖u_k‖
    np.testing.assert_allclose(Ub, fixed - U * (radial / np.sum(U * U, axis=0)), atol=1e-12)


def test_torch_autograd_matches_explicit_vjps():
    torch = require("torch")
    rng = np.random.default_rng(8)
    U0 = rng.standard_normal((2, 6, 5))
    h0, g0 = rng.standard_normal((6, 3)), rng.standard_normal((2, 6, 3))  # h broadcasts
    G0 = rng.standard_normal((2, 6, 6))
    sign = torch.asarray([1.0, -1.0], dtype=torch.float64)
    U = torch.asarray(U0, requires_grad=True)
    h = torch.asarray(h0, requires_grad=True)
    (torch.sum(torch.asarray(g0) * (ornn(U, sign) @ h))).backward()
    Ub, hb = ornn_apply_vjp(U0, sign.numpy(), h0, g0)
    np.testing.assert_allclose(U.grad.numpy(), Ub, atol=1e-12)
    np.testing.assert_allclose(h.grad.numpy(), hb, atol=1e-12)
    assert torch.all(torch.triu(U.grad, 1) == 0)
    U.grad = None
    torch.sum(torch.asarray(G0) * ornn(U, sign).matrix()).backward()
    np.testing.assert_allclose(U.grad.numpy(), ornn_matrix_vjp(U0, sign.numpy(), G0), atol=1e-12)
    Ug = torch.asarray(np.tril(U0[0]), requires_grad=True)
    hg = torch.asarray(h0, requires_grad=True)
    assert torch.autograd.gradcheck(lambda U, h: ornn(U, -1) @ h, (Ug, hg))


def test_jax_grad_matches_explicit_vjps():
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    rng = np.random.default_rng(9)
    U0 = rng.standard_normal((2, 6, 5))
    h0, g0 = rng.standard_normal((6, 3)), rng.standard_normal((2, 6, 3))  # h broadcasts
    G0 = rng.standard_normal((2, 6, 6))
    sign = jnp.asarray([-1.0, 1.0])

    def loss(U, h):
        return jnp.sum(g0 * (ornn(U, sign) @ h))

    def loss_m(U):
        return jnp.sum(G0 * ornn(U, sign).matrix())

    Ub, hb = ornn_apply_vjp(jnp.asarray(U0), sign, jnp.asarray(h0), jnp.asarray(g0))
    Gb = ornn_matrix_vjp(jnp.asarray(U0), sign, jnp.asarray(G0))
    for grad in (jax.grad(loss, (0, 1)), jax.jit(jax.grad(loss, (0, 1)))):
        gU, gh = grad(jnp.asarray(U0), jnp.asarray(h0))
        np.testing.assert_allclose(np.asarray(gU), np.asarray(Ub), atol=1e-12)
        np.testing.assert_allclose(np.asarray(gh), np.asarray(hb), atol=1e-12)
        assert np.all(np.triu(np.asarray(gU), 1) == 0)
    for grad in (jax.grad(loss_m), jax.jit(jax.grad(loss_m))):
        np.testing.assert_allclose(np.asarray(grad(jnp.asarray(U0))), np.asarray(Gb), atol=1e-12)


# -- bad input ----------------------------------------------------------------------------------


def test_bad_reflector_shapes():
    with pytest.raises(ValueError, match=r"U must have shape \(\.\.\., n, m\)"):
        ornn(np.ones(3))
    with pytest.raises(ValueError, match="need m <= n - 1"):
        ornn(np.ones((3, 3)))
    with pytest.raises(ValueError, match="need m <= n - 1"):
        ornn(np.ones((3, 4)))
    with pytest.raises(ValueError, match=r"Q must have shape \(\.\.\., N, N\)"):
        ornn_params(np.ones((3, 2)))
    with pytest.raises(ValueError, match="g must have the shape"):
        ornn_apply_vjp(np.tril(np.ones((4, 2))), 1, np.ones((4, 3)), np.ones((4, 2)))
    with pytest.raises(ValueError, match="G must have the shape"):
        ornn_matrix_vjp(np.tril(np.ones((4, 2))), 1, np.ones((4, 3)))


@pytest.mark.parametrize("sign", [0, 2, 0.5, -1.5, float("nan")])
def test_sign_must_be_plus_or_minus_one(sign):
    U = np.tril(np.ones((4, 2)))
    with pytest.raises(ValueError, match=r"sign must be \+1 or -1"):
        ornn(U, sign)
    with pytest.raises(ValueError, match=r"sign must be \+1 or -1"):
        ornn(U[None], np.array([sign]))


def test_sign_type_and_shape_errors():
    U = np.tril(np.ones((2, 4, 2)))
    with pytest.raises(TypeError, match="sign must be"):
        ornn(U, True)
    with pytest.raises(TypeError, match="sign has boolean dtype"):
        ornn(U, np.array([True, False]))
    with pytest.raises(ValueError, match="sign must have a shape that broadcasts"):
        ornn(U, np.ones(3))
    torch = require("torch")
    with pytest.raises(TypeError, match=r"sign is a torch\.Tensor"):
        ornn(U, torch.ones(2))


@pytest.mark.parametrize("bad", ["triangular", "Dense", None, 1, ("auto",)])
def test_structure_must_be_known(bad):
    for fn in (hl.cwy, hl.tcwy):
        with pytest.raises(ValueError, match="structure must be one of"):
            fn(np.ones((3, 2)), structure=bad)


def test_nan_in_the_trapezoid_raises_and_above_is_ignored(bk_eager):
    bk = bk_eager
    U = np.tril(np.ones((4, 3)))
    U[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"U contains NaN or Inf \(in column\(s\) \[1\]\)"):
        ornn(bk.asarray(U))
    with pytest.raises(ValueError, match="NaN or Inf"):
        ornn_params(bk.asarray(np.full((3, 3), np.inf)))
    U = np.tril(np.ones((4, 3)))
    U[0, 2] = np.nan  # above the diagonal: not a parameter
    W = to_numpy(ornn(bk.asarray(U)).matrix())
    np.testing.assert_allclose(W, _ornn_reference(np.tril(np.ones((4, 3))), 1), atol=1e-14)


def test_nan_propagates_under_jit():
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)  # as the bk fixture does (float64 reference)
    U = np.tril(np.ones((4, 3)))
    U[3, 0] = np.nan
    out = jax.jit(lambda U: ornn(U, -1).matrix())(jax.numpy.asarray(U))
    assert np.isnan(np.asarray(out)).any()
    # under jit the sign is projected, not checked: s > 0 ↦ +1, else −1 (Mhammedi et al., ICML
    # 2017, §5)
    f = jax.jit(lambda U, s: ornn(U, s).matrix())
    U = np.tril(np.ones((4, 3)))
    np.testing.assert_allclose(
        np.asarray(f(U, jax.numpy.asarray(0.3))), _ornn_reference(U, 1), atol=1e-14
    )
    np.testing.assert_allclose(
        np.asarray(f(U, jax.numpy.asarray(-0.0))), _ornn_reference(U, -1), atol=1e-14
    )
