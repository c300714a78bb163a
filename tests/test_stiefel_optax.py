"""optax-style ``stiefel_sgd`` / ``stiefel_adam`` over pytrees, under ``jax.jit``, without
optax installed (Kong, Wang & Tao, ICLR 2023, Algorithms 1, 2; App. P for the Euclidean leaves),
real and complex leaves (for complex ones ``jax.grad``'s cotangent, the conjugate gradient
∂L/∂Re − i ∂L/∂Im, is conjugated by default: ``complex_grads="jax"``).

Tolerances. A Stiefel leaf after ``apply_updates`` is fl(X + fl(X⁺ − X)): X⁺ (polar step,
‖X⁺ᵀX⁺ − I‖_F ≤ 20·eps·M as in test_stiefel.py) plus one rounding of size ≤ eps·(|X⁺| +
|X⁺ − X|) per entry, which adds ≤ 2·eps·(1 + ‖X⁺ − X‖)·M to the Gram error: 40·eps·M in all.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from conftest import require
from helpers import brockett, crandn, cstiefel, hermitian, orth_error

jax = require("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

import householderla as hl  # noqa: E402
from householderla.jax import _optax as O  # noqa: E402

EPS = {jnp.float32: float(np.finfo(np.float32).eps), jnp.float64: float(np.finfo(float).eps)}
MAKE = {
    "sgd": lambda **kw: O.stiefel_sgd(lr=0.1, **kw),
    "adam": lambda **kw: O.stiefel_adam(lr=0.05, **kw),
}


def orth(W):
    W = np.asarray(W, dtype=np.float64)
    if W.shape[-2] < W.shape[-1]:
        W = np.swapaxes(W, -1, -2)
    E = np.swapaxes(W, -1, -2) @ W - np.eye(W.shape[-1])
    return float(np.max(np.sqrt(np.sum(E * E, axis=(-2, -1)))))


def problem(dtype, seed=0):
    """Parameters (tall, batched, wide and square Stiefel leaves and a Euclidean one) and the
    targets T of ``loss``. The tall leaf has the shape of the wide one's transpose (which the
    optimizer updates): eager JAX compiles each op once per shape."""
    rng = np.random.default_rng(seed)
    shapes = {"tall": (6, 3), "batched": (2, 5, 2), "wide": (3, 6), "square": (3, 3)}
    params = {k: jnp.asarray(rng.standard_normal(s), dtype=dtype) for k, s in shapes.items()}
    params["bias"] = jnp.asarray(rng.standard_normal(3), dtype=dtype)
    T = {k: jnp.asarray(rng.standard_normal(v.shape), dtype=dtype) for k, v in params.items()}
    return params, T


def loss(p, T):
    """A smooth loss with a non-symmetric XᵀG (so Z ≠ 0)."""
    return sum(jnp.sum((p[k] - T[k]) ** 2) + jnp.sum(p[k].sum(-1) ** 2) for k in p)


grad = jax.grad(loss)

MASK = {"tall": True, "batched": True, "wide": True, "square": True, "bias": False}


@functools.cache
def jit_step(algo):
    """``(tx, step)`` with ``step(params, state, T)`` one jitted update + apply_updates: one
    function per algorithm, so the tests that take the same dtype share its compilation."""
    tx = MAKE[algo](stiefel=MASK)

    @jax.jit
    def step(params, state, T):
        updates, state = tx.update(grad(params, T), state, params)
        return O.apply_updates(params, updates), state

    return tx, step


def test_gradient_transformation_without_optax():
    tx = O.stiefel_sgd()
    assert tx._fields == ("init", "update")
    try:
        import optax
    except ImportError:
        assert type(tx) is O._GradientTransformation
    else:  # pragma: no cover - optax not installed here
        assert isinstance(tx, optax.GradientTransformation)


@pytest.mark.parametrize(
    ("algo", "dtype"),
    [
        pytest.param("adam", jnp.float32, id="adam-float32"),
        pytest.param("sgd", jnp.float64, id="sgd-float64"),
        # each compiles the whole step anew (~10 s): both dtypes of each algorithm in test-long
        pytest.param("adam", jnp.float64, id="adam-float64", marks=pytest.mark.long),
        pytest.param("sgd", jnp.float32, id="sgd-float32", marks=pytest.mark.long),
    ],
)
def test_jit_apply_updates_stays_on_manifold(algo, dtype):
    params, T = problem(dtype)
    tx, step = jit_step(algo)
    state = tx.init(params)
    eps = EPS[dtype]
    for k in range(4):
        params, state = step(params, state, T)
        for name in MASK:
            if MASK[name]:
                assert params[name].dtype == dtype
                M = min(params[name].shape[-2:])
                assert orth(params[name]) <= 40 * eps * M, (name, k, orth(params[name]))
                Z = np.asarray(state[name].Z, dtype=np.float64)
                assert np.max(np.abs(Z + np.swapaxes(Z, -1, -2))) <= 4 * eps * np.abs(Z).max()
        assert np.all(np.isfinite(np.asarray(params["bias"])))
    assert int(state["tall"].count) == 4 and int(state["bias"].count) == 4


@pytest.mark.parametrize("algo", sorted(MAKE))
def test_matches_functional_api(algo):
    """update_params returns exactly the functional optimizer's X⁺ (eager, same backend) and
    update returns X⁺ − X; the Euclidean leaf follows euclidean_sgd / euclidean_adam."""
    params, T = problem(jnp.float64, seed=2)
    tx = MAKE[algo](stiefel=MASK)
    if algo == "sgd":
        fm, fe = hl.stiefel.momentum_sgd(lr=0.1), hl.stiefel.euclidean_sgd(lr=0.1)
    else:
        fm, fe = hl.stiefel.adam(lr=0.05), hl.stiefel.euclidean_adam(lr=0.05)
    state = tx.init(params)
    ref = {k: params[k] for k in params}
    ref_state = {k: (fm if MASK[k] else fe).init(v.T if k == "wide" else v) for k, v in ref.items()}
    for _ in range(3):
        g = grad(params, T)
        updates, _ = tx.update(g, state, params)
        new, state = O.update_params(tx, g, state, params)
        for k in params:
            x, gk = (ref[k].T, g[k].T) if k == "wide" else (ref[k], g[k])
            x_new, ref_state[k] = (fm if MASK[k] else fe).update(x, gk, ref_state[k])
            ref[k] = x_new.T if k == "wide" else x_new
            assert np.array_equal(np.asarray(new[k]), np.asarray(ref[k])), k
            np.testing.assert_array_equal(np.asarray(updates[k]), np.asarray(new[k] - params[k]))
        params = new


def test_masks_callable_and_prefix():
    params, T = problem(jnp.float64)
    by_ndim = O.stiefel_sgd(stiefel=lambda p: jax.tree_util.tree_map(lambda x: x.ndim >= 2, p))
    nested = {"mats": {k: params[k] for k in MASK if MASK[k]}, "bias": params["bias"]}
    prefix = O.stiefel_sgd(stiefel={"mats": True, "bias": False})
    s1 = by_ndim.init(params)
    s2 = prefix.init(nested)
    assert isinstance(s1["tall"], hl.stiefel.MomentumState)
    assert isinstance(s1["bias"], hl.stiefel.EuclideanMomentumState)
    assert isinstance(s2["mats"]["wide"], hl.stiefel.MomentumState)
    assert s2["mats"]["wide"].U.shape == (6, 3)  # the transpose's normal component
    g = grad(params, T)
    gn = {"mats": {k: g[k] for k in MASK if MASK[k]}, "bias": g["bias"]}
    p1, _ = O.update_params(by_ndim, g, s1, params)
    p2, _ = O.update_params(prefix, gn, s2, nested)
    for k in nested["mats"]:
        np.testing.assert_array_equal(np.asarray(p1[k]), np.asarray(p2["mats"][k]))


def test_leading_eigenvalues_under_jit():
    """App. Q (n = 40, m = 3) with a jitted step: the sum of the top-3 eigenvalues to 1e-9
    (float64); lr = 0.3 (large steps) stays on the manifold and converges too."""
    rng = np.random.default_rng(3)
    Xi = rng.standard_normal((40, 40))
    A = jnp.asarray((Xi + Xi.T) / 2 / np.sqrt(40))
    target = float(np.linalg.eigvalsh(np.asarray(A))[-3:].sum())
    X0 = jnp.asarray(np.linalg.qr(rng.standard_normal((40, 3)))[0])
    for lr in (0.1, 0.3):
        tx = O.stiefel_sgd(lr=lr)
        params, state = {"X": X0}, tx.init({"X": X0})

        @jax.jit
        def step(params, state, tx=tx):
            grads = {"X": -2 * A @ params["X"]}
            return O.update_params(tx, grads, state, params)

        for _ in range(300):
            params, state = step(params, state)
        X = np.asarray(params["X"])
        assert np.all(np.isfinite(X)) and orth(X) <= 20 * EPS[jnp.float64] * 3
        assert target - np.trace(X.T @ np.asarray(A) @ X) <= 1e-9


def test_checkpoint_resume_identical():
    # the step (and dtype) of test_jit_apply_updates_stays_on_manifold[adam-float32]: one
    # compilation for both
    params, T = problem(jnp.float32, seed=4)
    tx, step = jit_step("adam")
    state = tx.init(params)
    for _ in range(3):
        params, state = step(params, state, T)
    saved = jax.tree_util.tree_map(lambda a: np.array(a, copy=True), (params, state))
    a = (params, state)
    for _ in range(4):
        a = step(*a, T)
    b = jax.tree_util.tree_map(jnp.asarray, saved)
    for _ in range(4):
        b = step(*b, T)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        assert np.array_equal(np.asarray(x), np.asarray(y))


def test_bad_input():
    params, T = problem(jnp.float64)
    with pytest.raises(ValueError, match="leaf 0 has shape"):
        O.stiefel_sgd().init({"a": params["bias"]})
    with pytest.raises(ValueError, match="Python bool"):
        O.stiefel_sgd(stiefel={k: 1 for k in params}).init(params)
    tx = O.stiefel_sgd(stiefel=MASK)
    state = tx.init(params)
    with pytest.raises(ValueError, match="params are required"):
        tx.update(grad(params, T), state)
    with pytest.raises(TypeError, match="stiefel_sgd/stiefel_adam"):
        O.update_params(O._GradientTransformation(None, None), grad(params, T), state, params)
    with pytest.raises(ValueError, match="lr"):
        O.stiefel_adam(lr=-1.0)
    for make in (O.stiefel_sgd, O.stiefel_adam):
        with pytest.raises(ValueError, match="complex_grads must be one of"):
            make(complex_grads="torch")


def test_torch_style_options_and_mesh_arguments():
    """nesterov / dampening / amsgrad reach both kinds of leaves (as hl.torch.StiefelSGD /
    StiefelAdam); ``row_axis`` names an axis of ``mesh`` (the row-sharded steps themselves run
    on four devices in tests/sharded_checks.py)."""
    params, _ = problem(jnp.float64)
    with pytest.raises(ValueError, match="Nesterov"):
        O.stiefel_sgd(momentum=0.0, nesterov=True)
    state = O.stiefel_adam(amsgrad=True, stiefel=MASK).init(params)
    assert isinstance(state["tall"], hl.stiefel.AMSGradState)
    assert isinstance(state["bias"], hl.stiefel.EuclideanAMSGradState)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
    with pytest.raises(ValueError, match="without row_axis"):
        O.stiefel_sgd(mesh=mesh)
    with pytest.raises(ValueError, match="not an axis of the mesh"):
        O.stiefel_adam(row_axis="y", mesh=mesh)


@pytest.mark.parametrize("make", [O.stiefel_sgd, O.stiefel_adam])
def test_nonfinite_gradients_raise_or_skip_under_jit(make):
    """issue 12, class 4, for the optax-style front end: "raise" names the leaf before any
    leaf moves (eager); "skip" keeps params and state and counts the step, inside jax.jit."""
    X = jnp.asarray(np.linalg.qr(np.random.default_rng(3).standard_normal((6, 2)))[0])
    params = {"W": X, "b": jnp.zeros(2)}
    mask = {"W": True, "b": False}
    bad = {"W": jnp.ones((6, 2)), "b": jnp.array([1.0, jnp.nan])}
    tx = make(0.1, stiefel=mask)
    with pytest.raises(ValueError, match=r"gradient of \['b'\] contains NaN or Inf"):
        O.update_params(tx, bad, tx.init(params), params)
    tx = make(0.1, stiefel=mask, nonfinite="skip")
    state = tx.init(params)
    updates, state = jax.jit(tx.update)(bad, state, params)
    assert int(state.skipped) == 1
    assert all(float(jnp.abs(u).max()) == 0.0 for u in jax.tree_util.tree_leaves(updates))
    good = {"W": jnp.ones((6, 2)), "b": jnp.ones(2)}
    updates, state = jax.jit(tx.update)(good, state, params)
    assert int(state.skipped) == 1 and float(jnp.abs(updates["W"]).max()) > 0
    with pytest.raises(ValueError, match="nonfinite must be one of"):
        make(0.1, nonfinite="ignore")


# -- complex leaves (jax.grad's cotangent is the conjugate gradient) -------------------------


@pytest.mark.parametrize("name", ["stiefel_sgd", "stiefel_adam"])
def test_optax_complex_under_jit_conjugates_jax_grad(name):
    """The optax transformations under ``jax.jit`` on complex leaves, fed ``jax.grad``'s output
    as it is (its cotangent is the conjugate ∂L/∂Re − i ∂L/∂Im): the Stiefel leaf takes
    exactly the steps of the functional optimizer given G = −2AXD (to 200·eps; Adam with
    ε = 10⁻², see test_stiefel.py::test_adam_commutes_with_column_phases), and the
    complex Euclidean leaf reaches its target. Fed the same grads with
    ``complex_grads="gradient"`` (no conjugation), the Euclidean leaf's imaginary part
    ascends: the test would fail if the conjugation were missing."""
    import householderla.jax as hlj

    assert complex(jax.grad(lambda z: jnp.abs(z) ** 2)(3.0 + 4.0j)) == 6 - 8j  # JAX's convention
    rng = np.random.default_rng(8)
    A = hermitian(rng, 6)
    D = np.diag([2.0, 1.0])
    _, grad, f_star = brockett(A, D)
    X0, target = cstiefel(rng, (6, 2)), crandn(rng, 3)
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
    assert np.max(np.abs(np.asarray(p3["W"]) - X)) <= 200 * EPS[jnp.float64]
    p = run("jax", 1500)
    W = np.asarray(p["W"])
    assert orth_error(W) <= 40 * EPS[jnp.float64] * 2
    assert abs(float(-np.trace(W.conj().T @ A @ W @ D).real) - f_star) <= 1e-8 * abs(f_star)
    assert np.max(np.abs(np.asarray(p["z"]) - target)) <= 1e-6
    wrong = run("gradient", 50)  # jax.grad's cotangent taken as the gradient: Im ascends
    assert np.max(np.abs(np.asarray(wrong["z"]).imag - target.imag)) > 1.0
