"""Half precision (bfloat16, float16) in the compact WY maps: cwy, tcwy, the sequential
Householder products and their VJPs.

Policy under test (``docs/theory/lowprec.rst``, "Compact WY in half precision"): the factors
U, T = S⁻¹ of half-precision V are computed from a float32 copy of V and stay float32; the
products read h in its dtype with float32 accumulation and round once; ``.matrix()`` is formed
in float32 and rounded once. The reference is always the float64 answer for the very numbers
the call receives (the half-precision inputs, exactly representable in float64). Bounds, with
u the unit roundoff of the half dtype and ε₃₂ = 2⁻²³:

* ``.matrix()``: ‖Q̂ᵀQ̂ − I‖_F ≤ 2 ‖fl(Q)ᵀfl(Q) − I‖_F (issue 13's target) + N·ε₃₂ (the float32
  computation's own orthogonality error, ~10⁻⁵ at these sizes, ≪ the floor ~u·N/√3), and
  entrywise |Q̂ − Q| ≤ u|Q| + N·ε₃₂: one rounding of a float32 result. A Gram matrix or T
  rounded to half precision, or a second rounding, breaks both (tested below by doing so).
* ``Q @ h``: per column |ŷ − y| ≤ u|y| + 4(N + L)·ε₃₂·‖h‖₂ — one rounding of the float32
  product, whose error is normwise ≤ γ_{c(N+L)}‖h‖₂ (backward stability of applying
  Householder products, Higham, *Accuracy and Stability of Numerical Algorithms*, 2002,
  Lemma 19.3 and §19.5); a product with a half-precision intermediate errs by ~u‖h‖₂.
* VJPs: |V̄ − V̄₆₄| ≤ u|V̄₆₄| + N·L·ε₃₂·max|V̄₆₄| (one rounding of a float32 backward); through
  torch autograd / ``jax.grad`` the output cotangent is itself rounded to the half dtype,
  which adds u·max|V̄₆₄| (as ``tests/test_lowprec.py`` states for the retractions).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require
from helpers import jax_once_each
from test_lowprec import EPS_HALF, HALF, as_half, f64, half_dtype, orth, round_like

import householderla as hl
from householderla._agnostic import trapezoidal as TR
from householderla._operator import blocked as _blocked

pytestmark = pytest.mark.no_dask("operators are built from V; Dask V is the tall path")

EPS32 = 2.0**-23


def cols_close(got, ref, u, slack):
    """|got − ref| ≤ u|ref| + slack entrywise (slack: the float32 computation's error bound
    of the module docstring, already scaled by ‖h‖₂)."""
    return np.all(np.abs(got - ref) <= u * np.abs(ref) + slack)


def check_matrix(bk, name, M, exact):
    """``M`` is ``exact`` rounded once to ``name`` (orthogonality and entrywise bounds)."""
    assert str(M.dtype).endswith(name)
    u, N = EPS_HALF[name] / 2, exact.shape[-2]
    got = f64(M)
    assert np.all(np.abs(got - exact) <= u * np.abs(exact) + N * EPS32), np.max(
        np.abs(got - exact) - u * np.abs(exact)
    )
    floor = orth(round_like(bk, exact, name))
    assert orth(got) <= 2.0 * floor + N * EPS32
    return got


MATRIX_SHAPES = [(40, 12), (2, 24, 24), (48, 5)]


@pytest.mark.parametrize(
    ("shape", "name"),
    # JAX: each shape once, the half formats alternating
    jax_once_each(MATRIX_SHAPES, HALF, [f"shape{i}" for i in range(3)], HALF),
)
def test_cwy_matrix_is_the_rounded_product(bk, name, shape):
    half_dtype(bk, name)
    rng = np.random.default_rng(shape[-1])
    Vh = as_half(bk, rng.standard_normal(shape), name)
    exact = hl.cwy(f64(Vh)).matrix()  # the product of the half-precision reflectors
    check_matrix(bk, name, bk.call(lambda v: hl.cwy(v).matrix(), Vh), exact)
    check_matrix(bk, name, bk.call(lambda v: hl.cwy(v).T.matrix(), Vh), np.swapaxes(exact, -1, -2))
    Om = bk.call(lambda v: hl.tcwy(v).matrix(), Vh)
    check_matrix(bk, name, Om, hl.tcwy(f64(Vh)).matrix())
    P = bk.call(lambda v: hl.householder_product(v), Vh)
    check_matrix(bk, name, P, exact)


@pytest.mark.parametrize("name", HALF)
def test_trapezoidal_matrix_half(bk, name):
    """Lower-trapezoidal V (LAPACK's layout: the orgqr-style forming on NumPy/torch)."""
    half_dtype(bk, name)
    rng = np.random.default_rng(4)
    Vh = as_half(bk, np.tril(rng.standard_normal((36, 20))), name)
    exact = hl.cwy(f64(Vh)).matrix()
    check_matrix(bk, name, bk.call(lambda v: hl.cwy(v).matrix(), Vh), exact)
    check_matrix(bk, name, bk.call(lambda v: hl.tcwy(v).matrix(), Vh), exact[:, :20])


CASES = ("Q @ h", "Q.T @ h", "Q.H @ h", "h.T @ Q", "Q.mv", "tcwy @ x", "tcwy.T @ h")


def _apply_cases(V, h, x):
    Q, Om = hl.cwy(V), hl.tcwy(V)
    return (Q @ h, Q.T @ h, Q.H @ h, h.mT @ Q, Q.mv(h[..., 0]), Om @ x, Om.T @ h)


@pytest.mark.parametrize(
    ("batch", "name"),
    # JAX: unbatched in one half format, batched in the other
    jax_once_each([(), (2,)], HALF, ["batch0", "batch1"], HALF),
)
def test_products_read_half_and_round_once(bk, name, batch):
    half_dtype(bk, name)
    rng = np.random.default_rng(len(batch) + 7)
    N, L, B = 32, 10, 3
    Vh = as_half(bk, rng.standard_normal((*batch, N, L)), name)
    hh = as_half(bk, rng.standard_normal((*batch, N, B)), name)
    xh = as_half(bk, rng.standard_normal((*batch, L, B)), name)
    V, h, x = f64(Vh), f64(hh), f64(xh)

    got = bk.call(_apply_cases, Vh, hh, xh)
    ref = _apply_cases(V, h, x)
    u = EPS_HALF[name] / 2
    for g, r, label in zip(got, ref, CASES, strict=True):
        assert str(g.dtype).endswith(name), label
        slack = 4 * (N + L) * EPS32 * max(np.linalg.norm(h, axis=-2).max(), 1.0)
        assert cols_close(f64(g), r, u, slack), (label, np.max(np.abs(f64(g) - r)))


@pytest.mark.parametrize("name", HALF)
def test_householder_apply_half(bk, name):
    half_dtype(bk, name)
    rng = np.random.default_rng(9)
    Vh = as_half(bk, rng.standard_normal((20, 6)), name)
    hh = as_half(bk, rng.standard_normal((20, 2)), name)
    y = bk.call(hl.householder_apply, Vh, hh)
    assert str(y.dtype).endswith(name)
    ref = hl.householder_apply(f64(Vh), f64(hh))
    slack = 4 * 26 * EPS32 * np.linalg.norm(f64(hh), axis=0).max()
    assert cols_close(f64(y), ref, EPS_HALF[name] / 2, slack)


def test_float16_vector_and_readonly(bk_eager):
    """A float16 vector (NumPy, also read-only; CPU torch): the Numba fast paths are
    float32/float64 only, so the half-precision call must not reach them; nothing is
    written."""
    bk = bk_eager
    half_dtype(bk, "float16")
    rng = np.random.default_rng(3)
    Vh = bk.asarray(rng.standard_normal((12, 4)), np.float16)
    hh = bk.asarray(rng.standard_normal(12), np.float16)
    before = f64(Vh).copy(), f64(hh).copy()
    for y in (hl.householder_apply(Vh, hh), hl.cwy(Vh) @ hh, hl.cwy(Vh) @ hh):
        assert str(y.dtype).endswith("float16") and tuple(y.shape) == (12,)
        ref = hl.householder_apply(f64(Vh), f64(hh))
        assert cols_close(f64(y), ref, 2.0**-11, 64 * EPS32 * np.linalg.norm(ref))
    assert np.array_equal(f64(Vh), before[0]) and np.array_equal(f64(hh), before[1])


# -- the blocked and structured product paths -----------------------------------------------


@pytest.mark.parametrize("name", HALF)
def test_blocked_and_structured_paths_round_once(bk_eager, name, monkeypatch):
    """Many reflectors and few columns run blocks of CWY (``_blocked``); lower-trapezoidal V
    the blocked triangular products (``_agnostic.trapezoidal``). Shrunk thresholds put small
    shapes on those paths; with half h every block works in float32 and rounds once at the
    end (a rounding per block would err by ~u·√(blocks)·‖h‖)."""
    bk = bk_eager
    half_dtype(bk, name)
    monkeypatch.setattr(_blocked, "MIN_L", 8)
    monkeypatch.setattr(_blocked, "BLOCK", 4)
    monkeypatch.setattr(TR, "BLOCK", 4)
    monkeypatch.setattr(TR, "MIN_COLUMNS", 8)
    monkeypatch.setattr(TR, "FEW_RHS", 1)
    rng = np.random.default_rng(21)
    N, L = 24, 16
    u = EPS_HALF[name] / 2
    for V0 in (rng.standard_normal((N, L)), np.tril(rng.standard_normal((N, L)))):
        Vh = as_half(bk, V0, name)
        hh = as_half(bk, rng.standard_normal((N, 2)), name)
        Q = hl.cwy(Vh)
        ref = hl.cwy(f64(Vh))
        for _ in range(2):  # blocks on the first product; the second reuses them
            for got, r in ((Q @ hh, ref @ f64(hh)), (Q.T @ hh, ref.T @ f64(hh))):
                assert str(got.dtype).endswith(name)
                slack = 4 * (N + L) * EPS32 * np.linalg.norm(f64(hh), axis=0).max()
                assert cols_close(f64(got), r, u, slack)


# -- VJPs ------------------------------------------------------------------------------------


def _vjp_calls(V, h, x, G, Gm):
    vj = hl.vjp
    return {
        "cwy_apply": vj.cwy_apply(V, h, G),
        "cwy_transpose_apply": vj.cwy_transpose_apply(V, h, G),
        "cwy_matrix": (vj.cwy_matrix(V, Gm),),
        "tcwy_apply": vj.tcwy_apply(V, x, G),
        "tcwy_transpose_apply": vj.tcwy_transpose_apply(V, h, x),
        "tcwy_matrix": (vj.tcwy_matrix(V, Gm[..., : V.shape[-1]]),),
        "householder_apply": vj.householder_apply(V, h, G),
        "householder_product": (vj.householder_product(V, Gm),),
    }


@pytest.mark.parametrize("name", HALF)
def test_vjps_half(bk, name):
    half_dtype(bk, name)
    rng = np.random.default_rng(17)
    N, L, B = 18, 6, 2
    arrays = {
        "V": rng.standard_normal((N, L)),
        "h": rng.standard_normal((N, B)),
        "x": rng.standard_normal((L, B)),
        "G": rng.standard_normal((N, B)),
        "Gm": rng.standard_normal((N, N)),
    }
    hs = {k: as_half(bk, a, name) for k, a in arrays.items()}
    got = bk.call(lambda *a: tuple(_vjp_calls(*a).values()), *hs.values())
    ref = _vjp_calls(*(f64(a) for a in hs.values()))
    u = EPS_HALF[name] / 2
    for g_out, (label, r_out) in zip(got, ref.items(), strict=True):
        for g, r in zip(g_out, r_out, strict=True):
            assert str(g.dtype).endswith(name), label
            tol = u * np.abs(r) + N * L * EPS32 * np.max(np.abs(r))
            assert np.all(np.abs(f64(g) - r) <= tol), (label, np.max(np.abs(f64(g) - r)))
    # the factors' VJP (U_bar, T_bar cotangents of the float32 factors, given in half)
    Ub, Tb = as_half(bk, rng.standard_normal((N, L)), name), as_half(bk, np.eye(L), name)
    Vbar = bk.call(hl.vjp.cwy_factors, hs["V"], Ub, Tb)
    r = hl.vjp.cwy_factors(f64(hs["V"]), f64(Ub), f64(Tb))
    assert str(Vbar.dtype).endswith(name)
    assert np.all(np.abs(f64(Vbar) - r) <= u * np.abs(r) + N * L * EPS32 * np.max(np.abs(r)))


GRAD_WHATS = ["apply", "matrix", "tcwy", "sequential"]


@pytest.mark.parametrize(
    ("what", "name"),
    # JAX: each product once, the half formats alternating
    jax_once_each(GRAD_WHATS, HALF, GRAD_WHATS, HALF),
)
def test_framework_gradients_half(bk, name, what):
    """loss.backward() (torch) and jax.grad through ``hl.cwy(V) @ h`` (and ``.matrix()``,
    T-CWY, ``householder_apply``) in half precision: the float64 gradient of the same
    inputs, rounded."""
    if not (bk.name.startswith("torch") or bk.name.startswith("jax")):
        pytest.skip("autodiff frameworks only (torch, JAX)")
    half_dtype(bk, name)
    rng = np.random.default_rng(29)
    N, L = 16, 5
    Vh = as_half(bk, rng.standard_normal((N, L)), name)
    hh = as_half(bk, rng.standard_normal((L if what == "tcwy" else N, 3)), name)
    W = rng.standard_normal((N, N) if what == "matrix" else (N, 3))

    def f(v, h):
        if what == "matrix":
            return hl.cwy(v).matrix()
        if what == "sequential":
            return hl.householder_apply(v, h)
        return (hl.tcwy(v) if what == "tcwy" else hl.cwy(v)) @ h

    V, h = f64(Vh), f64(hh)
    if what == "matrix":
        ref = (hl.vjp.cwy_matrix(V, W), None)
    elif what == "sequential":
        ref = hl.vjp.householder_apply(V, h, W)
    else:
        ref = (hl.vjp.tcwy_apply if what == "tcwy" else hl.vjp.cwy_apply)(V, h, W)
    if bk.name.startswith("torch"):
        import torch

        v, hv = Vh.clone().requires_grad_(True), hh.clone().requires_grad_(True)
        w = torch.from_numpy(W).float().to(v.device)  # on the device of v (torch_cuda)
        (f(v, hv).float() * w).sum().backward()
        grads = (v.grad, hv.grad)
    else:
        import jax
        import jax.numpy as jnp

        def loss(v, h_):
            return jnp.sum(f(v, h_).astype(jnp.float32) * jnp.asarray(W, jnp.float32))

        grads = bk.call(jax.grad(loss, argnums=(0, 1)), Vh, hh)
    for g, r in zip(grads, ref, strict=True):
        if r is None:
            continue
        assert str(g.dtype).endswith(name)
        tol = EPS_HALF[name] * (np.abs(r) + np.max(np.abs(r))) + N * L * EPS32
        assert np.all(np.abs(f64(g) - r) <= tol), np.max(np.abs(f64(g) - r))


# -- what a wrong implementation would do: the tests above must catch it ---------------------


@pytest.mark.parametrize("name", HALF)
def test_half_precision_factors_would_fail_the_bound(bk_eager, name):
    """The same product with U and T rounded to the half dtype (what storing the factors in
    V's dtype would do) misses the orthogonality bound of ``check_matrix``: so that bound
    tests the policy, not just the dtype."""
    bk = bk_eager
    if not bk.name.startswith("torch"):
        pytest.skip("one backend suffices for the counter-example")
    half_dtype(bk, name)
    rng = np.random.default_rng(1)
    Vh = as_half(bk, rng.standard_normal((64, 64)), name)
    Q = hl.cwy(Vh)
    U, T = Q.U, Q.T_factor
    assert str(U.dtype) == "torch.float32" and str(T.dtype) == "torch.float32"
    dt = Vh.dtype
    Uh, Th = U.to(dt).double(), T.to(dt).double()
    bad = np.eye(64) - (Uh @ Th @ Uh.T).cpu().numpy()  # .cpu(): torch_cuda
    exact = hl.cwy(f64(Vh)).matrix()
    floor = orth(round_like(bk, exact, name))
    assert orth(round_like(bk, bad, name)) > 2.0 * floor + 64 * EPS32
    check_matrix(bk, name, Q.matrix(), exact)


# -- bad and mixed inputs --------------------------------------------------------------------


def test_nan_in_half_v_is_named(bk_eager):
    bk = bk_eager
    for name in HALF:
        if not hasattr(bk.xp, name):  # NumPy, CuPy: no bfloat16 (float16 still runs)
            continue
        half_dtype(bk, name)
        V = np.ones((6, 3))
        V[2, 1] = np.nan
        with pytest.raises(ValueError, match=r"V contains NaN or Inf \(in column\(s\) \[1\]"):
            hl.cwy(as_half(bk, V, name))
        with pytest.raises(ValueError, match="NaN or Inf"):
            hl.householder_apply(as_half(bk, V, name), as_half(bk, np.ones(6), name))


@pytest.mark.parametrize("name", HALF)
def test_mixed_dtypes_follow_result_type(bk_eager, name):
    """Mixed arguments take the namespace's ``result_type``: half with float64 gives float64
    (the half values are exact there), bfloat16 with float16 gives float32 (torch, JAX), and
    half V with float32 h float32. An operator's products use its factors, float32 for half
    V (as for float32 V), so ``cwy(V_half) @ h64`` is float64 with float32 accuracy:
    ≤ 4(N + L)ε₃₂‖h‖₂; the VJP functions promote every argument first (float64 accuracy)."""
    bk = bk_eager
    half_dtype(bk, name)
    rng = np.random.default_rng(5)
    Vh = as_half(bk, rng.standard_normal((10, 4)), name)
    h64 = bk.asarray(rng.standard_normal((10, 2)))
    h32 = bk.asarray(rng.standard_normal((10, 2)), np.float32)
    V = f64(Vh)
    y = hl.cwy(Vh) @ h64
    assert str(y.dtype).endswith("float64")
    bound = 4 * 14 * EPS32 * np.linalg.norm(f64(h64), axis=0).max()
    np.testing.assert_allclose(f64(y), hl.cwy(V) @ f64(h64), rtol=0, atol=bound)
    assert str((hl.cwy(Vh) @ h32).dtype).endswith("float32")
    Vbar, hbar = hl.vjp.cwy_apply(Vh, h64, h64)
    assert str(Vbar.dtype).endswith("float64") and str(hbar.dtype).endswith("float64")
    np.testing.assert_allclose(f64(Vbar), hl.vjp.cwy_apply(V, f64(h64), f64(h64))[0], atol=1e-12)
    other = "float16" if name == "bfloat16" else "bfloat16"
    if hasattr(bk.xp, other):  # NumPy and CuPy have one half dtype
        y = hl.cwy(Vh) @ as_half(bk, f64(h64), other)
        assert str(y.dtype).endswith("float32")


def test_half_with_phases_is_complex64():
    """cwy(V, theta=θ) is complex; there is no half-precision complex dtype, so half V with
    phases gives a complex64 operator (the narrowest complex dtype)."""
    torch = require("torch")
    rng = np.random.default_rng(2)
    V = torch.from_numpy(rng.standard_normal((6, 3))).bfloat16()
    theta = torch.from_numpy(rng.uniform(-3, 3, 6)).bfloat16()
    Q = hl.cwy(V, theta=theta)
    assert Q.dtype == torch.complex64
    M = Q.matrix()
    ref = hl.cwy(V.double().numpy(), theta=theta.double().numpy()).matrix()
    np.testing.assert_allclose(M.numpy(), ref, atol=1e-5)
