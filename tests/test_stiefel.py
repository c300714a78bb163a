"""Momentum Stiefel optimizers (Kong, Wang & Tao, ICLR 2023, Algorithms 1, 2, 4, 5) on every
backend.

Structure (Theorems 4–7): after every step XᵀX = I, Z + Zᵀ = 0 and XᵀU = 0 up to rounding.

Oracle. ``reference_step`` below writes one step with the plain formulas in float64 NumPy —
X½ = X·E(ηZ⁺) with E from SciPy's ``expm`` / a dense Cayley solve, S = X½ᵀX½ formed
directly, the polar factor by SVD, U⁺ rescaled by a norm ratio — so it checks the
implementation's shortcuts (S = RᵀR, the fused products, the 'expm' by eigh).

Tolerances. X is the output of ``polar``: ‖XᵀX − I‖_F ≤ 20·eps·M as in test_retractions.
Z is updated by μZ − c(A − Aᵀ) and (Adam) divided element-wise by a symmetric p, so it is
skew to the last bit on eager backends; 4·eps·‖Z‖_F leaves room for a compiler that
re-associates under jit. XᵀU = 0 is exact only in exact arithmetic: each step adds the
rounding of a few N×M by M×M products, of size eps·N·(‖U‖ + ‖G‖) (the projections g = G −
X(XᵀG) and Ũ leave eps·‖G‖ behind), and the error is damped by μ < 1 but accumulates over
the steps, hence 30·eps·N·steps·(1 + ‖U‖_F + ‖G‖_F) — a wrong formula (e.g. U½ not
projected, or S misplaced in φ̄₃) gives O(η‖U‖²) ≫ that.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from conftest import LONG, require, to_numpy
from helpers import EPS, examples, few_shapes, orth_error, stable_seed
from hypothesis import given
from hypothesis import strategies as st

import householderla as hl
from householderla.stiefel import EXPM_METHODS, expm_skew

pytestmark = pytest.mark.no_dask("the optimizers take no Dask arrays")

ALGOS = {
    "sgd": lambda a, **kw: hl.stiefel.momentum_sgd(lr=0.1, momentum=0.9, metric=a, **kw),
    "adam": lambda a, **kw: hl.stiefel.adam(lr=0.05, metric=a, **kw),
}
# Definition 1 allows every a < 1: Euclidean (0), canonical (0.5), and a = −1 beyond both.
METRICS = (0.0, 0.5, -1.0)


def stiefel(rng, shape):
    Q, R = np.linalg.qr(rng.standard_normal(shape))
    return Q * np.sign(np.diagonal(R, axis1=-2, axis2=-1))[..., None, :]


def fro(x):
    x = np.asarray(x, dtype=np.float64)
    return float(np.max(np.sqrt(np.sum(x * x, axis=(-2, -1))))) if x.size else 0.0


def check_structure(X, state, G_norm, steps, dtype):
    X, U, Z = (to_numpy(a).astype(np.float64) for a in (X, state.U, state.Z))
    eps = EPS[np.dtype(dtype).type]
    N, M = X.shape[-2:]
    assert np.all(np.isfinite(X)) and np.all(np.isfinite(U)) and np.all(np.isfinite(Z))
    assert orth_error(X) <= 20 * eps * M
    assert fro(Z + np.swapaxes(Z, -1, -2)) <= 4 * eps * max(fro(Z), 1e-300)
    if U.shape[-1]:
        xu = fro(np.swapaxes(X, -1, -2) @ U)
        assert xu <= 30 * eps * N * steps * (1 + fro(U) + G_norm), xu
    else:
        assert M == N  # SO(n): no normal component


# -- the oracle -------------------------------------------------------------------------------


def _rot(W, method):
    eye = np.eye(W.shape[-1])
    if method == "euler":
        return eye + W
    if method == "cayley":
        return np.linalg.solve(eye - W / 2, eye + W / 2)
    return scipy.linalg.expm(W)


def _svd_polar(Y):
    u, _, vt = np.linalg.svd(Y, full_matrices=False)
    return u @ vt


def reference_step(X, G, state, algo, lr, a, method="euler", transport="energy", hyper=None):
    """One step of Algorithm 1 / 2 with the plain formulas (single matrix, float64, X ∈ St)."""
    c, d = 0.5 / (1 - a), (3 * a - 2) / 2
    N, M = X.shape
    A = X.T @ G
    f = c * (A - A.T)
    g = G - X @ (X.T @ G)
    if algo == "sgd":
        mu, w, kappa = 0.9, 1.0, 1.0
    else:
        mu, b2, eps = hyper
        w = 1 - mu
        kappa = np.sqrt(1 - b2 ** (int(state.count) + 1))
        p = b2 * state.p + (1 - b2) * f * f
    Z = mu * state.Z - w * f
    Zs = Z if algo == "sgd" else kappa * Z / (np.sqrt(p) + eps)
    X_half = X @ _rot(lr * Zs, method)
    L = (
        mu * np.eye(M) + d * lr * state.Z
        if method == "euler"
        else mu * _rot(d * lr * state.Z, method)
    )
    if M == N:
        return _svd_polar(X_half), Z, None
    U_half = state.U @ L - w * g
    if algo == "sgd":
        Ut = U_half
    else:
        q = b2 * state.q + (1 - b2) * g * g
        Wq = U_half / (np.sqrt(q) + eps)
        Ut = kappa * (Wq - X @ (X.T @ Wq))
    S = X_half.T @ X_half
    X_next = _svd_polar(X_half + lr * Ut)
    U_next = U_half - lr * X_half @ np.linalg.solve(S, Ut.T @ U_half)
    if transport == "energy" and np.any(U_next):
        U_next = U_next * (np.linalg.norm(U_half) / np.linalg.norm(U_next))
    return X_next, Z, U_next


# -- structure, every backend ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("algo", sorted(ALGOS))
@pytest.mark.parametrize(
    "metric",
    [
        pytest.param(a, marks=() if a == 0.5 else pytest.mark.jax_long("a scales two constants"))
        for a in METRICS
    ],
)
@pytest.mark.jax_both("split by dtype below: eager float64, jit float32")
def test_structure_preserved_every_step(bk, algo, metric, dtype):
    if bk.compiles and not LONG and (bk.name == "jax_jit") == (dtype == np.float64):
        # JAX compiles every op per dtype: eager JAX runs float64 here and jit float32 (the
        # same code in the other precision), both dtypes on each in `make test-long`
        pytest.skip("the other dtype on this JAX backend runs in `make test-long`")
    rng = np.random.default_rng(stable_seed(algo, metric))
    opt = ALGOS[algo](metric)
    update = (lambda X, G, s: opt.update(X, G, s)) if bk.jit is None else bk.jit(opt.update)
    for shape in [(2, 6, 3), (4, 4)]:
        # a non-orthonormal start: the first update projects it (App. P.1)
        X = bk.asarray(rng.standard_normal(shape), dtype)
        state = opt.init(X)
        assert (
            to_numpy(state.Z).dtype == dtype
            and tuple(state.Z.shape) == shape[:-2] + (shape[-1],) * 2
        )
        for k in range(3):
            G = rng.standard_normal(shape)
            X, state = update(X, bk.asarray(G, dtype), state)
            check_structure(X, state, fro(G), k + 1, dtype)
        assert int(to_numpy(state.count)) == 3
        assert to_numpy(X).dtype == dtype and tuple(X.shape) == shape


@given(
    spec=st.fixed_dictionaries(
        {
            "batch": st.sampled_from([(), (2,), (1, 2)]),
            "N": st.integers(1, 9),
            "Mfrac": st.floats(0.0, 1.0),
            "algo": st.sampled_from(sorted(ALGOS)),
            "metric": st.sampled_from(METRICS),
            "method": st.sampled_from(EXPM_METHODS),
            "dtype": st.sampled_from([np.float32, np.float64]),
            "lr": st.sampled_from([0.01, 0.3, 1.0]),
            "seed": st.integers(0, 2**31 - 1),
        }
    )
)
@examples(15)
def test_structure_property(bk_eager, spec):
    """Theorems 4–7 for random shapes (M ≤ N, including M = N), metrics, both algorithms,
    every M.2 option and large steps, after each of four steps."""
    rng = np.random.default_rng(spec["seed"])
    N = spec["N"]
    M = max(1, round(spec["Mfrac"] * N))
    # eager JAX compiles every op per new shape and dtype: three fixed (shape, dtype) there
    few = [((2, 6, 3), np.float32), ((4, 4), np.float64), ((5, 3), np.float64)]
    shape, dtype = few_shapes(bk_eager, (spec["batch"] + (N, M), spec["dtype"]), few, spec["seed"])
    lr = spec["lr"] if spec["algo"] == "sgd" else spec["lr"] / 10
    make = hl.stiefel.momentum_sgd if spec["algo"] == "sgd" else hl.stiefel.adam
    opt = make(lr=lr, metric=spec["metric"], expm_method=spec["method"])
    X = bk_eager.asarray(stiefel(rng, shape), dtype)
    state = opt.init(X)
    for k in range(4):
        G = rng.standard_normal(shape)
        X, state = opt.update(X, bk_eager.asarray(G, dtype), state)
        check_structure(X, state, fro(G), k + 1, dtype)


@pytest.mark.parametrize("method", EXPM_METHODS)
def test_expm_skew(bk, method):
    """The three M.2 approximations of expm(W): I + W, Cayley (orthogonal, second order) and
    the exponential (against SciPy's Padé expm, to rounding: ≤ 50·eps·(1 + ‖W‖²))."""
    rng = np.random.default_rng(7)
    B = rng.standard_normal((2, 5, 5))
    W = 0.7 * (B - np.swapaxes(B, -1, -2))
    R = to_numpy(bk.call(lambda W: expm_skew(W, method, bk.xp), bk.asarray(W)))
    for w, r in zip(W, R, strict=True):
        np.testing.assert_allclose(
            r, _rot(w, method), atol=50 * EPS[np.float64] * (1 + fro(w) ** 2)
        )
    if method != "euler":
        assert orth_error(R) <= 50 * EPS[np.float64]
    R0 = to_numpy(bk.call(lambda W: expm_skew(W, method, bk.xp), bk.asarray(np.zeros((3, 3)))))
    np.testing.assert_array_equal(R0, np.eye(3))


# -- the equations ---------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["energy", "euler"])
@pytest.mark.parametrize("method", EXPM_METHODS)
@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_step_matches_reference(algo, method, transport):
    """Three steps from a moving state against ``reference_step`` (the plain formulas)."""
    rng = np.random.default_rng(11)
    a = -1.0  # c = 1/4, d = −5/2: every constant differs from the canonical case
    hyper = (0.9, 0.999, 1e-8)
    opt = ALGOS[algo](a, expm_method=method, transport=transport)
    for shape in [(9, 4), (4, 4)]:
        X = stiefel(rng, shape)
        state = opt.init(X)
        for _ in range(3):  # build momentum: U, Z, p, q ≠ 0
            X, state = opt.update(X, rng.standard_normal(shape), state)
        for _ in range(3):
            G = rng.standard_normal(shape)
            X_ref, Z_ref, U_ref = reference_step(
                X, G, state, algo, 0.1 if algo == "sgd" else 0.05, a, method, transport, hyper
            )
            X, state = opt.update(X, G, state)
            # float64; the step's M×M solves and polar factors are well conditioned here
            np.testing.assert_allclose(X, X_ref, atol=1e-12)
            np.testing.assert_allclose(state.Z, Z_ref, atol=1e-13)
            if U_ref is not None:
                np.testing.assert_allclose(state.U, U_ref, atol=1e-12)


@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_gaussian_start_projected_in_one_step(algo):
    rng = np.random.default_rng(1)
    X0 = rng.standard_normal((3, 8, 5))  # batch of three manifolds
    opt = ALGOS[algo](0.5)
    X, state = opt.update(X0, 0.1 * rng.standard_normal(X0.shape), opt.init(X0))
    assert orth_error(X0) > 1
    assert orth_error(X) <= 20 * EPS[np.float64] * 5
    check_structure(X, state, 1.0, 1, np.float64)


@pytest.mark.parametrize("method", EXPM_METHODS)
@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_zero_gradient(algo, method):
    """From rest, G = 0 leaves X put and the momenta at 0. From a moving state Z decays by
    exactly μ (β₁) per step (line 4 with f = 0); U, X follow φ̄₂, φ̄₃ (checked against the
    oracle); with the orthogonal M.2 options ‖U‖_F decays by exactly μ too (φ̄₂ is μ times a
    rotation, φ̄₃ keeps ‖U‖_F); nothing becomes NaN."""
    rng = np.random.default_rng(2)
    X0 = stiefel(rng, (8, 3))
    opt = ALGOS[algo](0.5, expm_method=method)
    X, state = opt.update(X0, np.zeros_like(X0), opt.init(X0))
    assert np.max(np.abs(X - X0)) <= 10 * EPS[np.float64]
    assert not np.any(state.U) and not np.any(state.Z)
    for _ in range(3):
        X, state = opt.update(X, 0.3 * rng.standard_normal(X.shape), state)
    mu, Z_start = 0.9, state.Z
    for k in range(30):
        Z_prev, U_prev = state.Z, state.U
        if k == 0 and algo == "sgd":
            X_ref, _, U_ref = reference_step(X, np.zeros_like(X), state, algo, 0.1, 0.5, method)
        X, state = opt.update(X, np.zeros_like(X), state)
        assert np.all(np.isfinite(X)) and np.all(np.isfinite(state.U))
        np.testing.assert_allclose(state.Z, mu * Z_prev, rtol=4 * EPS[np.float64], atol=0)
        if k == 0 and algo == "sgd":
            np.testing.assert_allclose(X, X_ref, atol=1e-13)
            np.testing.assert_allclose(state.U, U_ref, atol=1e-13)
        if method != "euler":  # relative: 30 steps of a few roundings each
            assert abs(fro(state.U) - mu * fro(U_prev)) <= 1e-14 * fro(U_prev)
    np.testing.assert_allclose(fro(state.Z), mu**30 * fro(Z_start), rtol=1e-13)
    check_structure(X, state, 0.0, 34, np.float64)


# -- App. Q: convergence and large steps ------------------------------------------------------


def eigen_problem(n=20, m=3, seed=3):
    """App. Q: A = (Ξ + Ξᵀ)/2/√n; f(X) = −tr(XᵀAX), G = −2AX."""
    rng = np.random.default_rng(seed)
    Xi = rng.standard_normal((n, n))
    A = (Xi + Xi.T) / 2 / np.sqrt(n)
    ev = np.linalg.eigvalsh(A)
    return A, ev[-m:].sum(), ev[-m] - ev[-m - 1], stiefel(rng, (n, m))


@pytest.mark.parametrize(
    ("algo", "opt"),
    [
        # Kong, Wang & Tao, ICLR 2023, Table 5
        ("sgd", hl.stiefel.momentum_sgd(lr=0.1, momentum=0.9)),
        ("sgd-euclidean", hl.stiefel.momentum_sgd(lr=0.1, momentum=0.9, metric=0.0)),
        ("sgd-cayley", hl.stiefel.momentum_sgd(lr=0.1, expm_method="cayley")),
        ("sgd-paper-transport", hl.stiefel.momentum_sgd(lr=0.1, transport="euler")),
        ("adam", hl.stiefel.adam(lr=0.05)),
    ],
)
def test_leading_eigenvalues_converge(algo, opt):
    A, target, gap, X = eigen_problem()
    assert gap > 0.05  # a clear gap: the maximiser's subspace is well defined
    state = opt.init(X)
    for _ in range(300):
        X, state = opt.update(X, -2 * A @ X, state)
    # measured: ≤ 1e-13 after 300 steps (f64); 1e-9 leaves room for platform BLAS differences
    assert target - np.trace(X.T @ A @ X) <= 1e-9
    assert orth_error(X) <= 20 * EPS[np.float64] * 3


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_large_step_stays_on_manifold(algo, dtype):
    """lr = 0.3, μ = 0.9 on a reduced App. Q problem (n = 60, m = 4). Momentum SGD converges
    (measured: f* − f < 1e-12 after ~200 steps in float64); Adam's normalised steps stay
    bounded but do not settle at this lr. Every iterate is finite and on the manifold."""
    A, target, _, X = eigen_problem(n=60, m=4, seed=5)
    make = hl.stiefel.momentum_sgd if algo == "sgd" else hl.stiefel.adam
    opt = make(lr=0.3)
    eps = EPS[np.dtype(dtype).type]
    X, A32 = X.astype(dtype), A.astype(dtype)
    state = opt.init(X)
    for _ in range(300):
        X, state = opt.update(X, -2 * A32 @ X, state)
        assert np.all(np.isfinite(X)) and orth_error(X) <= 20 * eps * 4
        if dtype == np.float64:
            check_structure(X, state, 0.0, 1, dtype)
    gap = target - np.trace(X.T.astype(np.float64) @ A @ X.astype(np.float64))
    if algo == "sgd":
        assert gap <= 1e3 * eps  # f32: the rounding of X limits f to ~eps·‖A‖·m
    else:
        assert gap < 2.0  # bounded, not converged (measured ~0.5)


@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_printed_transport_diverges_at_large_steps(algo):
    """The finding behind ``transport="energy"``: with the printed forward-Euler U-update
    (k = 1) the same lr = 0.3 run blows up within ~20 steps (‖U⁺‖² = ‖U½‖² + η²‖…‖² grows
    once η‖U‖ is O(1)); the eager step then raises, naming the momentum about to overflow,
    instead of returning garbage."""
    A, _, _, X = eigen_problem(n=60, m=4, seed=5)
    make = hl.stiefel.momentum_sgd if algo == "sgd" else hl.stiefel.adam
    opt = make(lr=0.3, transport="euler")
    state = opt.init(X)
    with np.errstate(all="ignore"), pytest.raises(ValueError, match=r"the momentum U has entries"):
        for _ in range(200):
            X, state = opt.update(X, -2 * A @ X, state)
            assert orth_error(X) <= 20 * EPS[np.float64] * 4  # on the manifold until it fails


def test_product_count():
    """N×M×M products per step (App. C; the issue's budget is 8 for Algorithm 1), counted by
    intercepting torch's matmul: every product with an operand dimension N, in units of
    N·M·M multiply-adds. Small steps (no restart in the polar step)."""
    torch = require("torch")
    from torch.overrides import TorchFunctionMode

    N, M = 64, 4

    class Count(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.units = 0.0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            if name in ("matmul", "__matmul__", "__rmatmul__", "mm", "bmm"):
                a, b = (args[1], args[0]) if name == "__rmatmul__" else (args[0], args[1])
                dims = (a.shape[-2], a.shape[-1], b.shape[-1])
                if N in dims:
                    self.units += dims[0] * dims[1] * dims[2] / (N * M * M)
            return func(*args, **(kwargs or {}))

    rng = np.random.default_rng(0)
    X = torch.asarray(stiefel(rng, (N, M)))
    G = torch.asarray(rng.standard_normal((N, M)))
    for make, want in [(hl.stiefel.momentum_sgd, 8), (hl.stiefel.adam, 10)]:
        for method in EXPM_METHODS:
            opt = make(lr=0.01, expm_method=method)
            X1, state = opt.update(X, G, opt.init(X))
            with Count() as count:
                opt.update(X1, 0.01 * G, state)
            assert count.units == want, (make.__name__, method, count.units)


def test_checkpoint_resume_identical():
    A, _, _, X0 = eigen_problem(n=10, m=3, seed=4)
    for algo in sorted(ALGOS):
        opt = ALGOS[algo](0.5)

        def run(X, state, k, opt=opt):
            for _ in range(k):
                X, state = opt.update(X, -2 * A @ X, state)
            return X, state

        X, state = run(X0, opt.init(X0), 5)
        saved = (X.copy(), type(state)(*(np.array(a, copy=True) for a in state)))
        X_a, state_a = run(X, state, 7)
        X_b, state_b = run(saved[0], saved[1], 7)
        assert np.array_equal(X_a, X_b)
        for a, b in zip(state_a, state_b, strict=True):
            assert np.array_equal(a, b)


def test_bad_input():
    rng = np.random.default_rng(5)
    opt = hl.stiefel.momentum_sgd()
    with pytest.raises(ValueError, match="X must have shape"):
        opt.init(rng.standard_normal((3, 5)))
    X = stiefel(rng, (6, 3))
    state = opt.init(X)
    with pytest.raises(ValueError, match="G must have the shape"):
        opt.update(X, rng.standard_normal((6, 2)), state)
    with pytest.raises(ValueError, match="X must have shape"):
        opt.update(rng.standard_normal((3, 5)), rng.standard_normal((3, 5)), state)
    with pytest.raises(ValueError, match=r"state\.U"):
        opt.update(stiefel(rng, (7, 3)), rng.standard_normal((7, 3)), state)
    with pytest.raises(TypeError, match="G has complex dtype"):
        opt.update(X, np.ones((6, 3), dtype=complex), state)
    for bad in ("riemannian", 1.0, 2, float("nan"), None, True):
        with pytest.raises(ValueError, match="metric"):
            hl.stiefel.momentum_sgd(metric=bad)
        with pytest.raises(ValueError, match="metric"):
            hl.stiefel.adam(metric=bad)
    for kwargs, name in [
        ({"lr": float("nan")}, "lr"),
        ({"lr": -1.0}, "lr"),
        ({"momentum": 1.0}, "momentum"),
        ({"momentum": -0.1}, "momentum"),
        ({"expm_method": "pade"}, "expm_method"),
        ({"transport": "parallel"}, "transport"),
    ]:
        with pytest.raises(ValueError, match=name):
            hl.stiefel.momentum_sgd(**kwargs)
    for kwargs, name in [({"b1": 1.0}, "b1"), ({"b2": -0.5}, "b2"), ({"eps": 0.0}, "eps")]:
        with pytest.raises(ValueError, match=name):
            hl.stiefel.adam(**kwargs)
    # named metrics are the a of Definition 1
    assert hl.stiefel.momentum_sgd(metric="euclidean") is not None
