"""Momentum SGD and Adam on the complex Stiefel manifold and U(n) (Kong, Wang & Tao, ICLR 2023,
Algorithms 1, 2, 4, 5 with Hermitian transposes; ``docs/theory/stiefel.rst``, "Complex Stiefel
manifold and U(n)").

Structure (Theorems 4–7 for complex X): after every step XᴴX = I, Z + Zᴴ = 0 and XᴴU = 0 up to
rounding, with the tolerances of tests/test_stiefel.py (same argument, same constants: X is a
polar factor, 20·eps·M; Z is skew-Hermitian to the last bit up to re-association, 4·eps·‖Z‖;
XᴴU accumulates the rounding of a few N×M×M products per step, 30·eps·N·steps·(1 + ‖U‖ + ‖G‖)).

Oracles. (1) The real representation ρ(X) = [[Re X, −Im X], [Im X, Re X]] commutes with every
operation of momentum SGD, so complex momentum SGD on (X, G) is real momentum SGD on
(ρX, ρG). (2) Adam's real moments |f|², |g|² make its step commute with X ↦ XD, G ↦ GD for a
diagonal unitary D (a Re/Im-separate second moment would not). (3) The complex Brockett cost
f(X) = −Re tr(XᴴAXD) has the minimum −Σ dᵢλᵢ(A) (λ₁ ≥ λ₂ ≥ …, d₁ > d₂ > … > 0).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require, to_numpy
from helpers import EPS, orth_error, stable_seed

import householderla as hl
from householderla.stiefel import EXPM_METHODS

pytestmark = pytest.mark.no_dask("the optimizers take no Dask arrays")

ALGOS = {
    "sgd": lambda **kw: hl.stiefel.momentum_sgd(lr=0.1, momentum=0.9, **kw),
    "adam": lambda **kw: hl.stiefel.adam(lr=0.02, **kw),
}
METRICS = (0.5, 0.0, -1.0)


def crandn(rng, shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


def cstiefel(rng, shape):
    return np.linalg.qr(crandn(rng, shape))[0]


def hermitian(rng, n):
    B = crandn(rng, (n, n))
    return (B + B.conj().T) / (2 * np.sqrt(n))


def brockett(A, D):
    """f(X) = −Re tr(XᴴAXD) and its gradient G = ∂f/∂Re X + i ∂f/∂Im X = −2AXD (A Hermitian,
    D real diagonal), with the optimum −Σ dᵢλᵢ."""
    lam = np.linalg.eigvalsh(A)[::-1][: D.shape[0]]

    def f(X):
        return float(-np.trace(X.conj().swapaxes(-1, -2) @ A @ X @ D).real)

    return f, (lambda X: -2 * A @ X @ D), float(-lam @ np.diag(D))


def fro(x):
    x = np.asarray(x)
    return float(np.max(np.sqrt(np.sum(np.abs(x) ** 2, axis=(-2, -1))))) if x.size else 0.0


def mH(x):
    return np.conj(np.swapaxes(x, -1, -2))


def check_structure(X, state, G_norm, steps, dtype):
    X, U, Z = (to_numpy(a).astype(np.complex128) for a in (X, state.U, state.Z))
    eps = EPS[np.dtype(dtype).type]
    N, M = X.shape[-2:]
    assert np.all(np.isfinite(X)) and np.all(np.isfinite(U)) and np.all(np.isfinite(Z))
    assert orth_error(X) <= 20 * eps * M, orth_error(X)
    assert fro(Z + mH(Z)) <= 4 * eps * max(fro(Z), 1e-300)
    if U.shape[-1]:
        xu = fro(mH(X) @ U)
        assert xu <= 30 * eps * N * steps * (1 + fro(U) + G_norm), xu
    else:
        assert M == N  # U(n): no normal component


def rho(X):
    X = np.asarray(X)
    top = np.concatenate([X.real, -X.imag], axis=-1)
    return np.concatenate([top, np.concatenate([X.imag, X.real], axis=-1)], axis=-2)


def unrho(R):
    """ρ⁻¹ of a matrix of the form ρ(X) (the average of its two copies of Re X and Im X)."""
    n, m = R.shape[-2] // 2, R.shape[-1] // 2
    re = (R[..., :n, :m] + R[..., n:, m:]) / 2
    return re + 1j * (R[..., n:, :m] - R[..., :n, m:]) / 2


# -- structure, every backend ------------------------------------------------------------------


@pytest.mark.parametrize("method", EXPM_METHODS)
@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_structure_preserved_every_step(bk, algo, method):
    """Theorems 4–7 with Hermitian transposes, on St_C(7, 3) (batched) and U(4), over 12
    steps of a complex Brockett problem (a Z ≠ 0 problem: XᴴG is not Hermitian), from a
    non-orthonormal start; the metric changes with the method (all three a of Definition 1)."""
    rng = np.random.default_rng(stable_seed("complex-structure", algo, method))
    opt = ALGOS[algo](metric=METRICS[EXPM_METHODS.index(method)], expm_method=method)
    update = opt.update if bk.jit is None else bk.jit(opt.update)
    for shape in [(2, 7, 3), (4, 4)]:
        A = hermitian(rng, shape[-2])
        _, grad, _ = brockett(A, np.diag(np.arange(shape[-1], 0, -1.0)))
        X = bk.asarray(crandn(rng, shape), np.complex128)
        state = opt.init(X)
        assert to_numpy(state.Z).dtype == np.complex128
        for k in range(12):
            G = grad(to_numpy(X))
            X, state = update(X, bk.asarray(G, np.complex128), state)
            check_structure(X, state, fro(G), k + 1, np.complex128)
        if algo == "adam":  # the second moments are real: |f|², |g|²
            assert to_numpy(state.p).dtype == np.float64 == to_numpy(state.q).dtype
            p = to_numpy(state.p)
            assert np.array_equal(p, np.swapaxes(p, -1, -2))  # exactly: |f_ij| = |f_ji|


def test_complex64_stays_complex64(bk):
    """complex64 in, complex64 out (X, U, Z; Adam's p, q float32), computed in complex128 on
    CPU backends and rounded once: the structure at float32's rounding level."""
    rng = np.random.default_rng(3)
    A = hermitian(rng, 6)
    _, grad, _ = brockett(A, np.diag([2.0, 1.0]))
    for algo, make in sorted(ALGOS.items()):
        opt = make()
        update = opt.update if bk.jit is None else bk.jit(opt.update)
        X = bk.asarray(cstiefel(rng, (6, 2)), np.complex64)
        state = opt.init(X)
        for k in range(5):
            G = grad(to_numpy(X).astype(np.complex128))
            X, state = update(X, bk.asarray(G, np.complex64), state)
            check_structure(X, state, fro(G), k + 1, np.complex64)
        assert to_numpy(X).dtype == np.complex64
        assert to_numpy(state.U).dtype == np.complex64 == to_numpy(state.Z).dtype
        if algo == "adam":
            assert to_numpy(state.p).dtype == np.float32 == to_numpy(state.q).dtype


# -- oracles -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"expm_method": m, "metric": a, **extra}
        for m, a in zip(EXPM_METHODS, METRICS, strict=True)
        for extra in ({}, {"nesterov": True}, {"dampening": 0.3})
    ],
    ids=str,
)
def test_sgd_is_real_sgd_on_the_real_representation(kw):
    """ρ(X) = [[Re X, −Im X], [Im X, Re X]] commutes with products, Hermitian transposes,
    solves, Cayley, expm, the polar factor and the energy ratio, so 40 complex steps equal 40
    real steps of the 2N×2M problem with gradient ρ(G(ρ⁻¹(ρX))), each run at its own point
    (driven by the other run's gradients, the momentum has no restoring force and Nesterov's
    forward-Euler variant lets rounding differences grow ×2 per step). Tolerance: both sides round
    differently (≈ eps per operation, damped by μ; measured ≤ 5e-15): 200·eps; a missing
    conjugate anywhere (Aᵀ for Aᴴ) gives differences of the size of η‖Z‖ ≈ 10⁻²."""
    rng = np.random.default_rng(stable_seed("rho", str(kw)))
    A = hermitian(rng, 8)
    _, grad, _ = brockett(A, np.diag([3.0, 2.0, 1.0]))
    opt = hl.stiefel.momentum_sgd(lr=0.1, momentum=0.9, **kw)
    X = cstiefel(rng, (8, 3))
    Xr = rho(X)
    state, state_r = opt.init(X), opt.init(Xr)
    for _ in range(40):
        G = grad(X)
        X, state = opt.update(X, G, state)
        Xr, state_r = opt.update(Xr, rho(grad(unrho(Xr))), state_r)
    for c, r in [(X, Xr), (state.U, state_r.U), (state.Z, state_r.Z)]:
        assert np.max(np.abs(rho(c) - r)) <= 200 * EPS[np.float64]
    assert np.max(np.abs(state.Z.imag)) > 1e-3  # the test exercises a complex Z


@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_commutes_with_column_phases(amsgrad):
    """With the real moments |f|², |g|², Adam's step commutes with X ↦ XD, G ↦ GD for D =
    diag(e^{iθ}) (the symmetry of the Brockett cost): f ↦ DᴴfD and g ↦ gD keep their moduli.
    A second moment that is not phase-invariant breaks it ((Re f)² for |f|²: off by 0.3).
    Tolerance: Adam's division is Lipschitz in f with constant ηκ/ε, and entries of f that
    vanish in exact arithmetic (its diagonal: diag(XᴴAXD) is real) are pure rounding, which
    it amplifies by η/ε per step: 10⁻¹¹ over 20 steps at the default ε = 10⁻⁸. With ε = 10⁻²
    (η/ε = 5) the two runs agree to 2000·eps."""
    rng = np.random.default_rng(11)
    A = hermitian(rng, 7)
    _, grad, _ = brockett(A, np.diag([3.0, 2.0, 1.0]))
    D = np.diag(np.exp(1j * rng.uniform(0, 2 * np.pi, 3)))
    opt = hl.stiefel.adam(lr=0.05, eps=1e-2, amsgrad=amsgrad)
    X = cstiefel(rng, (7, 3))
    Y = X @ D
    sx, sy = opt.init(X), opt.init(Y)
    for _ in range(20):
        X, sx = opt.update(X, grad(X), sx)
        Y, sy = opt.update(Y, grad(Y), sy)
    assert np.max(np.abs(Y - X @ D)) <= 2000 * EPS[np.float64]
    assert np.max(np.abs(sy.p - sx.p)) <= 2000 * EPS[np.float64] * np.max(sx.p)


@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_real_data_in_complex_dtype_is_the_real_path(algo):
    """A real X and G stored as complex128 take the same steps as the real path (for real f,
    |f|² = f∘f and every conjugate is the identity): the complex code adds nothing to real
    data, and the real path is the one tests/test_stiefel.py checks. Tolerance: 50·eps
    (Adam with ε = 10⁻²: see test_adam_commutes_with_column_phases for why, here f is
    rounding noise everywhere: XᵀAX is symmetric)."""
    rng = np.random.default_rng(5)
    B = rng.standard_normal((6, 6))
    A = (B + B.T) / 2
    opt = ALGOS[algo]() if algo == "sgd" else hl.stiefel.adam(lr=0.02, eps=1e-2)
    X = np.linalg.qr(rng.standard_normal((6, 2)))[0]
    Xc = X.astype(np.complex128)
    s, sc = opt.init(X), opt.init(Xc)
    for _ in range(15):
        X, s = opt.update(X, -2 * A @ X, s)
        Xc, sc = opt.update(Xc, (-2 * A @ Xc).real.astype(np.complex128), sc)
    assert np.max(np.abs(Xc - X)) <= 50 * EPS[np.float64]
    assert np.max(np.abs(Xc.imag)) == 0.0


# -- the complex Brockett problem ----------------------------------------------------------------


@pytest.mark.parametrize("shape", [(12, 4), (5, 5)], ids=["St_C(12,4)", "U(5)"])
def test_brockett_adam_5000_steps(shape):
    """Complex128 Adam on f(X) = −Re tr(XᴴAXD) (A Hermitian, D = diag(M, …, 1)): over 5000
    steps ‖XᴴX − I‖_F ≤ 1e-14 after every step (the issue's bound), and the cost reaches its
    minimum −Σ dᵢλᵢ to 1e-9 relative (Adam at lr 0.01 settles at the optimum; a wrong sign or
    conjugate stalls far from it)."""
    N, M = shape
    rng = np.random.default_rng(stable_seed("brockett", shape))
    A = hermitian(rng, N)
    f, grad, f_star = brockett(A, np.diag(np.arange(M, 0, -1.0)))
    opt = hl.stiefel.adam(lr=0.01)
    X = cstiefel(rng, shape)
    state = opt.init(X)
    f0, worst = f(X), 0.0
    for _ in range(5000):
        X, state = opt.update(X, grad(X), state)
        worst = max(worst, orth_error(X))
    assert worst <= 1e-14, worst
    assert f(X) < f0
    assert abs(f(X) - f_star) <= 1e-9 * abs(f_star), (f(X), f_star)


# -- front ends --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["StiefelSGD", "StiefelAdam"])
def test_torch_optimizer_complex_parameters(name):
    """``hl.torch.StiefelSGD`` / ``StiefelAdam`` on complex ``nn.Parameter``s: a tall one
    (WᴴW = I), a wide one (rows orthonormal, W Wᴴ = I) and a complex Euclidean one in a
    ``stiefel=False`` group, all driven by autograd's ``.grad`` (∂L/∂Re + i ∂L/∂Im). The
    Brockett costs reach their minima and the Euclidean parameter its target."""
    torch = require("torch")
    from householderla.torch import StiefelAdam, StiefelSGD

    rng = np.random.default_rng(2)
    A = hermitian(rng, 6)
    D = np.diag([2.0, 1.0])
    _, _, f_star = brockett(A, D)
    At, Dt = torch.asarray(A), torch.asarray(D, dtype=torch.complex128)
    tall = torch.nn.Parameter(torch.asarray(crandn(rng, (6, 2))))
    wide = torch.nn.Parameter(torch.asarray(crandn(rng, (2, 6))))
    target = torch.asarray(crandn(rng, (3,)))
    z = torch.nn.Parameter(torch.zeros(3, dtype=torch.complex128))
    groups = [{"params": [tall, wide]}, {"params": [z], "stiefel": False}]
    opt = StiefelSGD(groups, lr=0.1) if name == "StiefelSGD" else StiefelAdam(groups, lr=0.02)

    def cost(W):
        return -torch.real(torch.trace(W.mH @ At @ W @ Dt))

    for _ in range(1500):
        opt.zero_grad()
        loss = cost(tall) + cost(wide.mT) + torch.sum(torch.abs(z - target) ** 2)
        loss.backward()
        opt.step()
    eps = EPS[np.float64]
    W, V = tall.detach().numpy(), wide.detach().numpy()
    assert tall.dtype == torch.complex128 and opt.state[tall]["Z"].dtype == torch.complex128
    assert orth_error(W) <= 20 * eps * 2 and orth_error(V.T) <= 20 * eps * 2
    for val in (cost(tall).item(), cost(wide.mT).item()):
        assert abs(val - f_star) <= 1e-8 * abs(f_star), (val, f_star)
    assert torch.max(torch.abs(z.detach() - target)).item() <= 1e-6


def test_torch_euclidean_complex_group_is_torch_sgd():
    """A complex ``stiefel=False`` group of StiefelSGD is ``torch.optim.SGD`` (complex heavy
    ball is linear, so both take the same steps to rounding: 10·eps·‖x‖)."""
    torch = require("torch")
    from householderla.torch import StiefelSGD

    rng = np.random.default_rng(4)
    x0 = torch.asarray(crandn(rng, (5,)))
    target = torch.asarray(crandn(rng, (5,)))
    a, b = torch.nn.Parameter(x0.clone()), torch.nn.Parameter(x0.clone())
    ours = StiefelSGD([{"params": [a], "stiefel": False}], lr=0.05, momentum=0.8)
    ref = torch.optim.SGD([b], lr=0.05, momentum=0.8)
    for _ in range(20):
        for p, o in ((a, ours), (b, ref)):
            o.zero_grad()
            (torch.abs(p - target) ** 2 * torch.arange(1.0, 6.0)).sum().backward()
            o.step()
    tol = 10 * EPS[np.float64] * float(torch.abs(b.detach()).max())
    assert torch.allclose(a.detach(), b.detach(), rtol=0, atol=tol)


@pytest.mark.parametrize("name", ["stiefel_sgd", "stiefel_adam"])
def test_optax_complex_under_jit_conjugates_jax_grad(name):
    """The optax transformations under ``jax.jit`` on complex leaves, fed ``jax.grad``'s output
    as it is (its cotangent is the conjugate ∂L/∂Re − i ∂L/∂Im): the Stiefel leaf takes
    exactly the steps of the functional optimizer given G = −2AXD (to 200·eps; Adam with
    ε = 10⁻², see test_adam_commutes_with_column_phases), and the
    complex Euclidean leaf reaches its target. Fed the same grads with
    ``complex_grads="gradient"`` (no conjugation), the Euclidean leaf's imaginary part
    ascends: the test would fail if the conjugation were missing."""
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    import householderla.jax as hlj

    assert complex(jax.grad(lambda z: jnp.abs(z) ** 2)(3.0 + 4.0j)) == 6 - 8j  # JAX's convention
    rng = np.random.default_rng(8)
    A = hermitian(rng, 6)
    D = np.diag([2.0, 1.0])
    _, grad, f_star = brockett(A, D)
    X0, target = cstiefel(rng, (6, 2)), crandn(rng, (3,))
    lr = 0.1 if name == "stiefel_sgd" else 0.02
    kw = {} if name == "stiefel_sgd" else {"eps": 1e-2}

    def loss(params):
        W = params["W"]
        c = -jnp.real(jnp.trace(W.conj().T @ jnp.asarray(A) @ W @ jnp.asarray(D)))
        return c + jnp.sum(jnp.abs(params["z"] - target) ** 2)

    def run(complex_grads, steps):
        mask = {"W": True, "z": False}
        tx = getattr(hlj, name)(lr, stiefel=mask, complex_grads=complex_grads, **kw)
        params = {"W": jnp.asarray(X0), "z": jnp.zeros(3, dtype=jnp.complex128)}
        state = tx.init(params)

        @jax.jit
        def step(params, state):
            return hlj.update_params(tx, jax.grad(loss)(params), state, params)

        for _ in range(steps):
            params, state = step(params, state)
        return params

    ref = (hl.stiefel.momentum_sgd if name == "stiefel_sgd" else hl.stiefel.adam)(lr, **kw)
    X, s = X0, ref.init(X0)
    for _ in range(3):
        X, s = ref.update(X, grad(X), s)
    p3 = run("jax", 3)
    assert np.max(np.abs(np.asarray(p3["W"]) - X)) <= 200 * EPS[np.float64]
    p = run("jax", 1500)
    W = np.asarray(p["W"])
    assert orth_error(W) <= 40 * EPS[np.float64] * 2
    assert abs(float(-np.trace(W.conj().T @ A @ W @ D).real) - f_star) <= 1e-8 * abs(f_star)
    assert np.max(np.abs(np.asarray(p["z"]) - target)) <= 1e-6
    wrong = run("gradient", 50)  # jax.grad's cotangent taken as the gradient: Im ascends
    assert np.max(np.abs(np.asarray(wrong["z"]).imag - target.imag)) > 1.0


# -- bad input ---------------------------------------------------------------------------------


def test_bad_input():
    rng = np.random.default_rng(6)
    Xc, Xr = cstiefel(rng, (5, 2)), np.linalg.qr(rng.standard_normal((5, 2)))[0]
    for make in ALGOS.values():
        opt = make()
        with pytest.raises(TypeError, match="G has real dtype float64 but X has dtype complex"):
            opt.update(Xc, np.ones((5, 2)), opt.init(Xc))
        with pytest.raises(TypeError, match="G has complex dtype complex128 but X has dtype float"):
            opt.update(Xr, np.ones((5, 2), dtype=complex), opt.init(Xr))
        with pytest.raises(ValueError, match="G contains NaN"):
            opt.update(Xc, np.full((5, 2), np.nan + 0j), opt.init(Xc))
        with pytest.raises(ValueError, match="G must have the shape of X"):
            opt.update(Xc, np.ones((5, 3), dtype=complex), opt.init(Xc))
    with pytest.raises(TypeError, match="G has complex dtype"):
        hl.stiefel.euclidean_sgd().update(np.ones(3), np.ones(3, dtype=complex), None)


def test_optax_bad_complex_grads():
    require("jax")
    import householderla.jax as hlj

    for make in (hlj.stiefel_sgd, hlj.stiefel_adam):
        with pytest.raises(ValueError, match="complex_grads must be one of"):
            make(complex_grads="torch")
