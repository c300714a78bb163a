"""Every explicit VJP by the dot-product test against central differences, on every backend:
one test over the registry of differentiable maps (tests/registry.py: CWY, T-CWY, the
Householder products, the phased unitary maps, oRNN, SVD-Householder, bounded σ and the
retractions, each in float64 and, where it takes them, complex128), the forward-mode JVPs
against them; then the torch and JAX wiring through the operators, for real, complex and
phased (``theta=``) maps and the retractions.

Dot-product test: for random directions δ and cotangent g, the central difference
(⟨g, f(x + εδ)⟩ − ⟨g, f(x − εδ)⟩)/2ε equals ⟨vjp(g), δ⟩ up to O(ε²)·|f'''| + O(eps/ε).
With ε = 1e-6 both are ≲ 1e-9 relative; the tolerance is 1e-7 relative. A wrong sign,
a missing striu or a missing normalisation term changes the value by O(1).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FRAMEWORKS, LONG, get_backend, require, to_numpy
from helpers import (
    EPS_FD,
    assert_jax_grad_matches_real_and_imaginary_differences,
    assert_vjp_matches_central_differences,
    crandn,
    stable_seed,
)
from registry import COMPLEX, ENTRIES, REAL, randn

import householderla as hl

pytestmark = pytest.mark.no_dask("the VJPs take no Dask arrays")


#: (entry, kind) pairs of the registry: every differentiable map in each dtype kind it takes
CASES = [pytest.param(e, kind, id=f"{e.name}-{kind}") for e in ENTRIES.values() for kind in e.kinds]


def _framework(backend: str) -> str:
    return next((top for top, names in FRAMEWORKS.items() if backend in names), backend)


@pytest.mark.jax_split  # FD checks compile per case on JAX: each on one JAX backend
@pytest.mark.parametrize(("entry", "kind"), CASES)
def test_dot_product_against_central_differences(bk, entry, kind, monkeypatch):
    """Re⟨ḡ, J δ⟩ by central differences = Re⟨J*ḡ, δ⟩ (the module docstring; complex inputs
    get complex directions and cotangents, tests/helpers.py), then the cotangents the entry
    fixes exactly (a zero reflector's is 0)."""
    if _framework(bk.name) in entry.not_on:
        pytest.skip(f"{entry.name}: its path does not exist on {_framework(bk.name)}")
    if entry.neutral and not LONG and bk.name != "numpy":
        pytest.skip("a batch-shape variant of backend-neutral code: NumPy here, all in test-long")
    if entry.patch is not None:
        entry.patch(monkeypatch)
    rng = np.random.default_rng(stable_seed(entry.name, kind))
    f, vjp = entry.make(bk)
    inputs = entry.draw(rng, kind == COMPLEX)
    grads = assert_vjp_matches_central_differences(bk, f, vjp, inputs, rng, entry.freeze)
    if entry.check is not None:
        entry.check(grads)


@pytest.mark.parametrize(
    "entry", [e for e in ENTRIES.values() if REAL in e.kinds], ids=lambda e: e.name
)
def test_support_columns_hold(entry, monkeypatch):
    """What the registry says each VJP supports: bfloat16 inputs give bfloat16 cotangents
    (``half``) or the TypeError that lists the maps taking half precision; a Dask operand is
    refused (``dask``) with the error naming the mixed namespaces (torch and NumPy eager: the
    check is argument handling, the same on every backend)."""
    torch = require("torch")
    if entry.patch is not None:
        entry.patch(monkeypatch)
    rng = np.random.default_rng(stable_seed("support", entry.name))
    inputs = entry.draw(rng, False)

    class _Torch:
        xp = torch

        @staticmethod
        def asarray(a, dtype=None):
            return torch.asarray(np.asarray(a)).to(torch.bfloat16)

    f, vjp = entry.make(_Torch)
    args = [_Torch.asarray(a) for a in inputs]
    if entry.half:
        y = f(*args)
        out = vjp(*args, torch.ones_like(y))
        out = out if isinstance(out, tuple) else (out,)
        assert [o.dtype for o in out] == [torch.bfloat16] * len(args)
    else:
        with pytest.raises(TypeError, match="half precision is supported by"):
            vjp(*args, torch.ones_like(f(*[a.double() for a in args])).bfloat16())
    da = require("dask.array")
    f, vjp = entry.make(get_backend("numpy"))
    if not entry.dask:
        y = f(*inputs)
        with pytest.raises(TypeError, match="different array libraries"):
            vjp(da.from_array(inputs[0]), *inputs[1:], np.ones_like(y))


# -- forward mode: the JVPs (torch) -------------------------------------------------------------


def _draw_pair(entry, kind, seed):
    """An entry's inputs and directions (NumPy; the entry's fixed directions zeroed)."""
    rng = np.random.default_rng(seed)
    inputs = entry.draw(rng, kind == COMPLEX)
    dirs = [_direction(rng, a) for a in inputs]
    if entry.freeze is not None:
        entry.freeze(dirs)
    return inputs, dirs


def _torch_pair(entry, kind, seed):
    torch = require("torch")
    inputs, dirs = _draw_pair(entry, kind, seed)
    return [torch.asarray(a) for a in inputs], [torch.asarray(d) for d in dirs]


def _direction(rng, a):
    a = np.asarray(a)
    d = rng.standard_normal(a.shape)
    return d + 1j * rng.standard_normal(a.shape) if np.iscomplexobj(a) else d


def _rdot(a, b):
    return float(np.real(np.vdot(np.asarray(a), np.asarray(b))))


@pytest.mark.parametrize(("entry", "kind"), CASES)
def test_forward_mode_jvp_is_the_adjoint_of_the_vjp(entry, kind, monkeypatch):
    """``torch.func.jvp`` through every map: Re⟨ḡ, J δ⟩ (the hand-derived JVP) equals
    Re⟨J*ḡ, δ⟩ (the explicit VJP, itself checked against central differences above) to
    1e-10 relative — both are exact-arithmetic formulas evaluated in float64/complex128, so
    they agree to rounding (~1e-14); a wrong term in either is off by O(1). Maps without a
    JVP (``forward=False``) raise torch's NotImplementedError instead of a wrong tangent."""
    torch = require("torch")
    if entry.neutral and not LONG:
        pytest.skip("a batch-shape variant of backend-neutral code: in test-long")
    if entry.patch is not None:
        entry.patch(monkeypatch)
    f, vjp = entry.make(get_backend("torch"))
    inputs, dirs = _torch_pair(entry, kind, stable_seed("jvp", entry.name, kind))
    if not entry.forward:
        with pytest.raises(NotImplementedError, match="jvp"):
            torch.func.jvp(f, tuple(inputs), tuple(dirs))
        return
    y, t = torch.func.jvp(f, tuple(inputs), tuple(dirs))
    torch.testing.assert_close(y, f(*inputs), rtol=0, atol=1e-12)
    rng = np.random.default_rng(stable_seed("jvp-g", entry.name))
    g = torch.asarray(_direction(rng, y))
    _assert_adjoint(g, t, vjp(*inputs, g), dirs)


def _assert_adjoint(g, t, grads, dirs):
    """Re⟨ḡ, J δ⟩ = Re⟨J*ḡ, δ⟩ to 1e-10 relative (``grads`` = J*ḡ, one per input)."""
    grads = grads if isinstance(grads, tuple) else (grads,)
    lhs = _rdot(g, t)
    rhs = sum(_rdot(gr, d) for gr, d in zip(grads, dirs, strict=True))
    norm = np.linalg.norm
    scale = norm(np.asarray(g)) * norm(np.asarray(t)) + sum(
        norm(np.asarray(gr)) * norm(np.asarray(d)) for gr, d in zip(grads, dirs, strict=True)
    )
    assert abs(lhs - rhs) <= 1e-10 * max(scale, 1.0), (lhs, rhs)


#: one registry entry per JAX rule (factors and low-rank apply in each role, the dense matrix,
#: the sequential product, phases, the three retractions): the wiring is per rule and the
#: formulas are the torch test's, so the other entries (each compiling anew) run in test-long
JAX_FORWARD = {
    "cwy_apply",
    "cwy_adjoint_apply",
    "cwy_matrix",
    "tcwy_apply",
    "tcwy_adjoint_apply",
    "tcwy_matrix",
    "householder_apply",
    "cwy_matrix_theta",
    "polar",
    "cayley_retraction",
    "qr_retraction",
}
JAX_CASES = [
    pytest.param(
        e,
        kind,
        id=f"{e.name}-{kind}",
        marks=() if e.name in JAX_FORWARD else pytest.mark.long,
    )
    for e in ENTRIES.values()
    for kind in e.kinds
    if "jax" not in e.not_on
]


@pytest.mark.parametrize(("entry", "kind"), JAX_CASES)
def test_jax_forward_mode_jvp_is_the_adjoint_of_the_vjp(entry, kind, monkeypatch):
    """``jax.jvp`` through every map (the ``custom_jvp`` rules' hand-derived JVPs), against
    the explicit VJP by the identity of the torch test above, on the same registry (one
    entry per rule here, every entry in test-long)."""
    jax = _jax()
    if entry.patch is not None:
        entry.patch(monkeypatch)
    f, vjp = entry.make(get_backend("jax"))
    inputs, dirs = _draw_pair(entry, kind, stable_seed("jvp", entry.name, kind))
    inputs = [jax.numpy.asarray(a) for a in inputs]
    if not entry.forward:
        with pytest.raises(TypeError, match="jvp"):
            jax.jvp(f, tuple(inputs), tuple(map(jax.numpy.asarray, dirs)))
        return
    y, t = jax.jvp(f, tuple(inputs), tuple(map(jax.numpy.asarray, dirs)))
    np.testing.assert_allclose(np.asarray(y), np.asarray(f(*inputs)), rtol=0, atol=1e-12)
    rng = np.random.default_rng(stable_seed("jvp-g", entry.name))
    g = jax.numpy.asarray(_direction(rng, y))
    _assert_adjoint(g, t, vjp(*inputs, g), dirs)


@pytest.mark.parametrize("cx", [False, True], ids=["real", "complex"])
def test_cayley_jvp_against_central_differences(cx):
    """The Cayley JVP (``retraction.cayley_along_jvp``) of the SMW map along (dX, dZ, dt),
    off the manifold, for a step per matrix and a 0-d step: central differences with
    ε = 1e-6 agree to O(ε²) + O(u/ε) ≈ 1e-10 relative (bound 1e-8)."""
    import array_api_compat.numpy as xp

    from householderla._agnostic import retraction as RK

    rng = np.random.default_rng(stable_seed("cayley-jvp", cx))
    for batch, tshape in (((2,), (2, 1, 1)), ((), ())):
        X = np.linalg.qr(randn(rng, cx, *batch, 6, 3))[0] + 0.2 * randn(rng, cx, *batch, 6, 3)
        Z, dX, dZ = (randn(rng, cx, *X.shape) for _ in range(3))
        t, dt = rng.uniform(0.2, 0.8, tshape), rng.standard_normal(tshape)

        def f(e, X=X, Z=Z, dX=dX, dZ=dZ, t=t, dt=dt):
            return RK.cayley_along(X + e * dX, Z + e * dZ, t + e * dt, xp)[0]

        fd = (f(EPS_FD) - f(-EPS_FD)) / (2 * EPS_FD)
        jvp = RK.cayley_along_jvp(X, Z, t, dX, dZ, dt, xp)
        assert np.linalg.norm(jvp - fd) <= 1e-8 * np.linalg.norm(fd)


def test_jax_forward_mode_transforms_and_grad_runs_the_explicit_vjp(monkeypatch):
    """The JAX rules are ``custom_jvp``s whose tangent is the explicit JVP and whose
    transpose is the explicit VJP: ``jax.grad`` calls our VJP and never the JVP (counted),
    ``jax.jvp`` the JVP; ``jacfwd`` equals ``jacrev``; ``vmap`` of ``jvp`` (batched
    tangents, then batched points under ``jit``) equals one-at-a-time calls; forward-over-
    reverse gives the Hessian-vector product of a loss through CWY and the sequential
    product (against central differences of the gradient, as the torch test below). Grad of
    grad: ``test_jax_check_grads``. Shapes no other test uses, so no trace is cached."""
    jax = _jax()
    jnp = jax.numpy

    from householderla._agnostic import compact_wy as K
    from householderla._agnostic import compact_wy_jvp as KJ

    calls = {"vjp": 0, "jvp": 0}

    def counted(name, fn):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(K, "lowrank_vjp", counted("vjp", K.lowrank_vjp))
    monkeypatch.setattr(KJ, "lowrank_jvp", counted("jvp", KJ.lowrank_jvp))
    rng = np.random.default_rng(22)
    V, h, dV = (jnp.asarray(rng.standard_normal(s)) for s in ((9, 5), (9, 2), (9, 5)))

    def loss(V):
        return jnp.sum(jnp.sin(hl.cwy(V) @ h))

    gV = jax.grad(loss)(V)
    assert calls["vjp"] >= 1 and calls["jvp"] == 0, calls
    _, t = jax.jvp(loss, (V,), (dV,))
    assert calls["jvp"] >= 1
    assert abs(float(t - jnp.sum(gV * dV))) <= 1e-12 * float(
        jnp.linalg.norm(gV) * jnp.linalg.norm(dV)
    )
    mat = lambda V: hl.cwy(V).matrix()  # noqa: E731
    np.testing.assert_allclose(jax.jacfwd(mat)(V), jax.jacrev(mat)(V), rtol=0, atol=1e-12)
    dVs = jnp.asarray(rng.standard_normal((3, 9, 5)))
    one = lambda V, dV: jax.jvp(loss, (V,), (dV,))[1]  # noqa: E731
    want = jnp.stack([one(V, d) for d in dVs])
    np.testing.assert_allclose(jax.vmap(one, (None, 0))(V, dVs), want, rtol=1e-12)
    np.testing.assert_allclose(jax.jit(jax.vmap(one))(V + 0 * dVs, dVs), want, rtol=1e-12)

    def loss2(V):
        return loss(V) + jnp.sum(jnp.cos(hl.householder_apply(V, h)))

    grad = jax.grad(loss2)
    _, hvp = jax.jvp(grad, (V,), (dV,))
    eps = 1e-5
    fd = (grad(V + eps * dV) - grad(V - eps * dV)) / (2 * eps)
    assert jnp.linalg.norm(hvp - fd) <= 1e-7 * jnp.linalg.norm(fd)


def test_forward_mode_duals_jacfwd_and_hessian_vector_products():
    """Forward-AD dual tensors take the differentiable path (a tangent, never a silently
    dropped one), ``jacfwd`` equals ``jacrev``, and forward-over-reverse gives the Hessian-
    vector product of a loss through CWY (against central differences of the gradient: ε =
    1e-5, error O(ε²) ≈ 1e-10 + O(eps/ε) ≈ 1e-11, bound 1e-7 relative)."""
    torch = require("torch")
    import torch.autograd.forward_ad as fwAD

    rng = np.random.default_rng(21)
    V, h = (torch.asarray(rng.standard_normal(s)) for s in ((7, 4), (7, 3)))
    dV = torch.asarray(rng.standard_normal((7, 4)))
    Z = h[:, :1].expand(7, 4)
    maps = (
        lambda V: hl.cwy(V) @ h,
        lambda V: hl.householder_apply(V, h),
        lambda V: hl.polar(V),
        lambda V: hl.qr_retraction(V, Z, 0.1),
        lambda V: hl.cayley_retraction(V, Z, 0.1, drift_tol=float("inf")),  # a Python step
    )
    for f in maps:
        with fwAD.dual_level():
            out = fwAD.unpack_dual(f(fwAD.make_dual(V, dV)))
        assert out.tangent is not None
        _, t = torch.func.jvp(f, (V,), (dV,))
        torch.testing.assert_close(out.tangent, t, rtol=1e-12, atol=1e-12)
    mat = lambda V: hl.cwy(V).matrix()  # noqa: E731
    torch.testing.assert_close(torch.func.jacfwd(mat)(V), torch.func.jacrev(mat)(V))

    def loss(V):
        return torch.sum(torch.sin(hl.cwy(V) @ h))

    grad = torch.func.grad(loss)
    _, hvp = torch.func.jvp(grad, (V,), (dV,))
    eps = 1e-5
    fd = (grad(V + eps * dV) - grad(V - eps * dV)) / (2 * eps)
    assert torch.linalg.norm(hvp - fd) <= 1e-7 * torch.linalg.norm(fd)


def test_factors_vjp(bk):
    """V ↦ (U, T = S⁻¹), the rule the autodiff wiring composes."""
    rng = np.random.default_rng(7)
    V = rng.standard_normal((2, 5, 3))
    Ub, Tb = rng.standard_normal((2, 5, 3)), np.triu(rng.standard_normal((2, 3, 3)))

    def f(V):
        Q = hl.cwy(V)
        return Q.U, Q.T_factor

    Vbar = to_numpy(bk.call(hl.vjp.cwy_factors, bk.asarray(V), bk.asarray(Ub), bk.asarray(Tb)))
    d = rng.standard_normal(V.shape)

    def phi(x):
        U, T = bk.call(f, bk.asarray(x))
        return np.sum(Ub * to_numpy(U)) + np.sum(Tb * to_numpy(T))

    fd = (phi(V + EPS_FD * d) - phi(V - EPS_FD * d)) / (2 * EPS_FD)
    assert abs(fd - np.sum(Vbar * d)) <= 1e-7 * max(np.linalg.norm(Vbar) * np.linalg.norm(d), 1)


def test_vjp_rejects_wrong_cotangent_shape():
    V, h = np.ones((4, 2)), np.ones((4, 3))
    with pytest.raises(ValueError, match="g must have the shape"):
        hl.vjp.cwy_apply(V, h, np.ones((4, 2)))
    with pytest.raises(ValueError, match="G must have the shape"):
        hl.vjp.cwy_matrix(V, np.ones((4, 2)))


# -- torch autograd wiring -------------------------------------------------------------------

torch_maps = {
    "apply": lambda V, h: hl.cwy(V) @ h,
    "transpose_apply": lambda V, h: hl.cwy(V).T @ h,
    "two_applies_one_operator": lambda V, h: (lambda Q: Q.T @ (Q @ h) + Q @ h)(hl.cwy(V)),
    "matrix": lambda V, h: hl.cwy(V).matrix() @ h,
    "tcwy_apply": lambda V, h: hl.tcwy(V) @ h[..., :3, :],
    "tcwy_transpose_apply": lambda V, h: hl.tcwy(V).T @ h,
    "tcwy_matrix": lambda V, h: hl.tcwy(V).matrix(),
}


@pytest.mark.parametrize("name", list(torch_maps))
def test_torch_gradcheck_and_gradgradcheck(name):
    torch = require("torch")
    rng = np.random.default_rng(8)
    V = torch.asarray(rng.standard_normal((2, 6, 3)), requires_grad=True)
    h = torch.asarray(rng.standard_normal((6, 2)), requires_grad=True)
    f = torch_maps[name]
    assert torch.autograd.gradcheck(f, (V, h))
    assert torch.autograd.gradgradcheck(f, (V, h), fast_mode=True)


def test_torch_autograd_uses_explicit_vjp_and_matches_hl_vjp():
    torch = require("torch")
    rng = np.random.default_rng(9)
    V = torch.asarray(rng.standard_normal((7, 4)), requires_grad=True)
    h = torch.asarray(rng.standard_normal((7, 3)), requires_grad=True)
    y = hl.cwy(V) @ h
    assert "LowRankApply" in type(y.grad_fn).__name__
    g = torch.asarray(rng.standard_normal((7, 3)))
    y.backward(g)
    Vb, hb = hl.vjp.cwy_apply(V.detach(), h.detach(), g)
    torch.testing.assert_close(V.grad, Vb, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h.grad, hb, rtol=1e-12, atol=1e-12)
    # zero column: zero gradient, never NaN
    V0 = V.detach().clone()
    V0[:, 2] = 0
    V0.requires_grad_(True)
    (hl.cwy(V0) @ h.detach()).sum().backward()
    assert torch.all(V0.grad[:, 2] == 0) and torch.all(torch.isfinite(V0.grad))


def test_torch_float32_grad_and_no_grad_path():
    torch = require("torch")
    V = torch.randn(5, 3, dtype=torch.float32, requires_grad=True)
    h = torch.randn(5, dtype=torch.float32)
    y = hl.cwy(V) @ h
    assert y.dtype == torch.float32
    y.sum().backward()
    assert V.grad.dtype == torch.float32
    with torch.no_grad():
        z = hl.cwy(V) @ h
    assert z.grad_fn is None and not z.requires_grad


# -- JAX custom_vjp wiring -------------------------------------------------------------------


@pytest.mark.parametrize("name", list(torch_maps))
def test_jax_check_grads(name):
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)
    from jax.test_util import check_grads

    rng = np.random.default_rng(10)
    V = jax.numpy.asarray(rng.standard_normal((2, 6, 3)))
    h = jax.numpy.asarray(rng.standard_normal((6, 2)))
    check_grads(torch_maps[name], (V, h), order=2, modes=["rev"])


def test_jax_grad_jit_vmap_match_hl_vjp():
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    rng = np.random.default_rng(11)
    V = jnp.asarray(rng.standard_normal((7, 4)))
    h = jnp.asarray(rng.standard_normal((7, 3)))
    g = jnp.asarray(rng.standard_normal((7, 3)))

    def loss(V, h):
        return jnp.sum(g * (hl.cwy(V) @ h))

    Vb, hb = hl.vjp.cwy_apply(V, h, g)
    for fn in (jax.grad(loss, argnums=(0, 1)), jax.jit(jax.grad(loss, argnums=(0, 1)))):
        gV, gh = fn(V, h)
        np.testing.assert_allclose(np.asarray(gV), np.asarray(Vb), atol=1e-12)
        np.testing.assert_allclose(np.asarray(gh), np.asarray(hb), atol=1e-12)
    Vs = jnp.stack([V, 2 * V])
    gv = jax.jit(jax.vmap(jax.grad(loss), in_axes=(0, None)))(Vs, h)
    np.testing.assert_allclose(np.asarray(gv[0]), np.asarray(Vb), atol=1e-12)
    np.testing.assert_allclose(np.asarray(gv[1]), np.asarray(Vb) / 2, atol=1e-12)


def test_jax_closures_over_concrete_and_numpy_operands():
    """``jax.grad(lambda V: (hl.cwy(V) @ h).sum())`` with h a concrete jax or NumPy array."""
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(16)
    V = jax.numpy.asarray(rng.standard_normal((5, 3)))
    h_np = rng.standard_normal((5, 2))
    Vref, _ = hl.vjp.cwy_apply(np.asarray(V), h_np, np.ones((5, 2)))
    for h in (jax.numpy.asarray(h_np), h_np):
        for tf in (lambda f: f, jax.jit):
            gV = tf(jax.grad(lambda V, h=h: (hl.cwy(V) @ h).sum()))(V)
            np.testing.assert_allclose(np.asarray(gV), Vref, atol=1e-12)


# == complex maps: the theorems their gradients obey, and each framework's convention ============
# hl.vjp and torch use the cotangent ḡ = ∂L/∂Re + i ∂L/∂Im, so dL = Re⟨ḡ, dz⟩ = Re Σ conj(ḡ)·dz;
# JAX's cotangent is its conjugate, dL = Re Σ g_jax·dz (docs/theory/complex.rst). Central
# differences with ε = 1e-6 in complex128 are accurate to ~1e-9 relative; the bounds are 1e-7
# relative, while a missing conjugate flips the sign of the imaginary-direction derivative.

C128 = np.complex128


C128 = np.complex128


def _complex_maps():
    """name -> (forward f(V, *others), hl.vjp function, shapes of the others for (N, L))."""
    return {
        "cwy_apply": (lambda V, h: hl.cwy(V) @ h, hl.vjp.cwy_apply, lambda N, L: [(N, 3)]),
        "cwy_apply_vector": (lambda V, h: hl.cwy(V) @ h, hl.vjp.cwy_apply, lambda N, L: [(N,)]),
        "cwy_transpose_apply": (
            lambda V, h: hl.cwy(V).H @ h,
            hl.vjp.cwy_transpose_apply,
            lambda N, L: [(N, 2)],
        ),
        "cwy_matrix": (lambda V: hl.cwy(V).matrix(), hl.vjp.cwy_matrix, lambda N, L: []),
        "tcwy_apply": (lambda V, x: hl.tcwy(V) @ x, hl.vjp.tcwy_apply, lambda N, L: [(L, 2)]),
        "tcwy_transpose_apply": (
            lambda V, y: hl.tcwy(V).H @ y,
            hl.vjp.tcwy_transpose_apply,
            lambda N, L: [(N, 3)],
        ),
        "tcwy_matrix": (lambda V: hl.tcwy(V).matrix(), hl.vjp.tcwy_matrix, lambda N, L: []),
        "householder_apply": (
            hl.householder_apply,
            hl.vjp.householder_apply,
            lambda N, L: [(N, 2)],
        ),
        "householder_product": (
            hl.householder_product,
            hl.vjp.householder_product,
            lambda N, L: [],
        ),
    }


@pytest.mark.parametrize("name", ["cwy_apply", "cwy_matrix", "tcwy_transpose_apply"])
def test_cotangent_is_orthogonal_to_v_and_iv(bk_eager, name):
    """H(cv) = H(v) for every complex c ≠ 0, so the loss is constant along v ↦ (1 + t)v and
    v ↦ e^{it}v: Re⟨v̄_k, v_k⟩ = 0 and Re⟨v̄_k, i v_k⟩ = 0 for every column (to rounding,
    ~eps·‖v̄‖‖v‖)."""
    bk = bk_eager
    f, vjp, other_shapes = _complex_maps()[name]
    rng = np.random.default_rng(stable_seed("phase", name))
    V = crandn(rng, 7, 4)
    others = [crandn(rng, *s) for s in other_shapes(7, 4)]
    g = crandn(rng, *np.shape(to_numpy(f(*(bk.asarray(a, C128) for a in [V, *others])))))
    out = vjp(*(bk.asarray(a, C128) for a in [V, *others, g]))
    Vb = to_numpy(out[0] if isinstance(out, tuple) else out)
    scale = np.linalg.norm(Vb, axis=0) * np.linalg.norm(V, axis=0)
    for c in (1.0, 1.0j):
        radial = np.sum(np.real(np.conj(Vb) * (c * V)), axis=0)
        assert np.all(np.abs(radial) <= 1e-13 * scale), (c, radial)
    assert np.max(np.abs(Vb)) > 0.1  # not vacuous


def test_real_inputs_get_real_cotangents():
    """V real, h complex: V̄ is real and equals the real part of V̄ at the same (complex-typed)
    point, since only real perturbations of V are allowed."""
    rng = np.random.default_rng(1)
    V, h, g = rng.standard_normal((6, 3)), crandn(rng, 6, 2), crandn(rng, 6, 2)
    Vb, hb = hl.vjp.cwy_apply(V, h, g)
    Vb_c, hb_c = hl.vjp.cwy_apply(V.astype(C128), h, g)
    assert Vb.dtype == np.float64 and hb.dtype == C128
    np.testing.assert_allclose(Vb, Vb_c.real, atol=1e-14)
    np.testing.assert_allclose(hb, hb_c, atol=1e-14)
    Gb = hl.vjp.householder_product(V, crandn(rng, 6, 6))
    assert Gb.dtype == np.float64


# -- torch: conjugate Wirtinger derivatives ------------------------------------------------


def _complex_torch_maps():
    return {
        "cwy_apply": (lambda V, h: hl.cwy(V) @ h, "h"),
        "cwy_H_apply": (lambda V, h: hl.cwy(V).H @ h, "h"),
        "cwy_T_apply": (lambda V, h: hl.cwy(V).T @ h, "h"),
        "cwy_matrix": (lambda V: hl.cwy(V).matrix(), None),
        "tcwy_apply": (lambda V, x: hl.tcwy(V) @ x, "x"),
        "tcwy_H_apply": (lambda V, h: hl.tcwy(V).H @ h, "h"),
        "tcwy_matrix": (lambda V: hl.tcwy(V).matrix(), None),
        "householder_apply": (hl.householder_apply, "h"),
    }


@pytest.mark.parametrize("name", list(_complex_torch_maps()))
def test_complex_torch_gradcheck_and_gradgradcheck(name):
    torch = require("torch")
    f, other = _complex_torch_maps()[name]
    rng = np.random.default_rng(stable_seed("torch", name))
    N, L = 5, 3
    args = [torch.tensor(crandn(rng, N, L), requires_grad=True)]
    if other is not None:
        shape = (L, 2) if other == "x" else (N, 2)
        args.append(torch.tensor(crandn(rng, *shape), requires_grad=True))
    assert torch.autograd.gradcheck(f, tuple(args))
    if LONG or name in ("cwy_apply", "cwy_matrix", "tcwy_apply", "householder_apply"):
        # second order for the maps issue 15 names; the transposed variants (same Functions,
        # 7-12 s each) in `make test-long`
        assert torch.autograd.gradgradcheck(f, tuple(args))


def test_complex_torch_grad_is_the_plain_vjp():
    """``.grad`` after ``backward(g)`` is ``hl.vjp``'s cotangent: one convention for both."""
    torch = require("torch")
    rng = np.random.default_rng(2)
    V, h, g = crandn(rng, 6, 4), crandn(rng, 6, 2), crandn(rng, 6, 2)
    Vt, ht = (torch.tensor(a, requires_grad=True) for a in (V, h))
    (hl.cwy(Vt) @ ht).backward(torch.tensor(g))
    Vb, hb = hl.vjp.cwy_apply(V, h, g)
    np.testing.assert_allclose(Vt.grad.numpy(), Vb, atol=1e-13)
    np.testing.assert_allclose(ht.grad.numpy(), hb, atol=1e-13)


# -- JAX: the conjugate convention ----------------------------------------------------------


def _jax():
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)  # as the jax backends of conftest do
    return jax


def _loss(f, W):
    """A real loss of a complex output that is not holomorphic in it (Re⟨W, y⟩ + 0.3‖y‖²)."""
    jnp = _jax().numpy

    def loss(*args):
        y = f(*args)
        return jnp.sum(jnp.real(jnp.conj(W) * y)) + 0.3 * jnp.sum(jnp.abs(y) ** 2)

    return loss


@pytest.mark.parametrize("name", ["cwy_apply", "cwy_matrix", "tcwy_transpose_apply"])
@pytest.mark.parametrize("jit", [False, True])
def test_jax_grad_against_real_and_imaginary_differences(name, jit):
    """``jax.grad`` of a real loss is ∂L/∂Re − i ∂L/∂Im (JAX's convention): its pairing
    Re Σ grad·δ with a real δ and with an imaginary iδ must equal the central differences
    along each. A rule that skipped the conjugation passes the real direction and fails the
    imaginary one by a sign."""
    jax = _jax()
    jnp = jax.numpy
    f, _, other_shapes = _complex_maps()[name]
    rng = np.random.default_rng(stable_seed("jax", name))
    N, L = 5, 3
    args = [crandn(rng, N, L), *(crandn(rng, *s) for s in other_shapes(N, L))]
    W = jnp.asarray(crandn(rng, *np.shape(f(*args))))
    loss = _loss(f, W)
    grad = jax.grad(loss, argnums=tuple(range(len(args))))
    grads = (jax.jit(grad) if jit else grad)(*map(jnp.asarray, args))
    assert_jax_grad_matches_real_and_imaginary_differences(loss, args, grads, rng)


def test_jax_grad_is_the_conjugate_of_the_plain_vjp():
    jax = _jax()
    jnp = jax.numpy
    rng = np.random.default_rng(3)
    V, h, g = crandn(rng, 6, 4), crandn(rng, 6, 2), crandn(rng, 6, 2)
    _, pullback = jax.vjp(lambda V, h: hl.cwy(V) @ h, jnp.asarray(V), jnp.asarray(h))
    Vj, hj = pullback(jnp.asarray(np.conj(g)))
    Vb, hb = hl.vjp.cwy_apply(V, h, g)
    np.testing.assert_allclose(np.asarray(Vj), np.conj(Vb), atol=1e-13)
    np.testing.assert_allclose(np.asarray(hj), np.conj(hb), atol=1e-13)


@pytest.mark.parametrize("name", ["cwy_apply", "tcwy_matrix", "householder_apply"])
def test_jax_check_grads_order_2(name):
    """``jax.test_util.check_grads``: reverse mode against numerical derivatives, and the
    reverse of the reverse (the backward rules are written in jnp, so differentiable)."""
    jax = _jax()
    from jax.test_util import check_grads

    f, _, other_shapes = _complex_maps()[name]
    rng = np.random.default_rng(stable_seed("check_grads", name))
    args = [crandn(rng, 5, 3), *(crandn(rng, *s) for s in other_shapes(5, 3))]
    check_grads(f, tuple(map(jax.numpy.asarray, args)), order=2, modes=["rev"])


# == the phased unitary maps (theta=): torch's gradcheck through the operators, jax.grad ==========
# θ̄ is real: a formula that returned Re instead of −Im (or dropped the sign of the adjoint phase)
# is off by O(1) along θ's direction; tolerances as for the complex maps.


PN, PL, PB = 6, 4, 2  # the phased maps' sizes


def test_phase_gradient_is_zero_for_a_phase_invariant_loss():
    """‖cwy(V, theta=θ) h‖² does not depend on θ (or V): every cotangent is 0 to rounding,
    while Re⟨w, Q h⟩ does, along θ."""
    rng = np.random.default_rng(1)
    V, h, theta = crandn(rng, PN, PL), crandn(rng, PN, PB), rng.standard_normal(PN)
    y = hl.cwy(V, theta=theta) @ h
    Vb, hb, tb = hl.vjp.cwy_apply(V, h, 2 * y, theta=theta)  # ∂‖y‖²: ȳ = 2y
    np.testing.assert_allclose(tb, 0, atol=1e-12)
    np.testing.assert_allclose(Vb, 0, atol=1e-12)
    np.testing.assert_allclose(hb, 2 * h, atol=1e-12)


@pytest.mark.parametrize(
    "name", ["cwy_apply", "cwy_H_apply", "tcwy_matrix", "ornn_apply", "svd_apply"]
)
def test_phased_torch_gradcheck_and_gradgradcheck(name):
    """Through the operators: the CWY rules with the phase factor differentiated natively
    (gradgradcheck for cwy_apply here, all of them in ``make test-long``)."""
    torch = require("torch")
    rng = np.random.default_rng(stable_seed("torch-theta", name))
    t = lambda a: torch.tensor(a, requires_grad=True)  # noqa: E731
    V, h, th_N, th_L = (
        t(crandn(rng, 5, 3)),
        t(crandn(rng, 5, 2)),
        t(rng.random(5)),
        t(rng.random(3)),
    )
    cases = {
        "cwy_apply": (lambda V, h, t: hl.cwy(V, theta=t) @ h, (V, h, th_N)),
        "cwy_H_apply": (lambda V, h, t: hl.cwy(V, theta=t).H @ h, (V, h, th_N)),
        "tcwy_matrix": (lambda V, t: hl.tcwy(V, theta=t).matrix(), (V, th_L)),
        "ornn_apply": (
            lambda U, h, t: hl.ornn(U, theta=t) @ h,
            (t(np.tril(crandn(rng, 5, 4))), h, th_N),
        ),
        "svd_apply": (
            lambda U, s, W, x, t: hl.svd_householder(U, s, W, theta=t) @ x,
            (V, t(rng.random(3)), t(crandn(rng, 3, 2)), t(crandn(rng, 3, 2)), th_L),
        ),
    }
    f, args = cases[name]
    assert torch.autograd.gradcheck(f, args)
    if name == "cwy_apply" or LONG:  # second order through the phase; the others (5-40 s
        assert torch.autograd.gradgradcheck(f, args)  # each) in `make test-long`


def test_phased_jax_grad_matches_the_plain_vjp():
    """``jax.vjp`` with the conjugated cotangent returns the conjugates of ``hl.vjp``'s
    complex cotangents and the same real θ̄ (eager and under ``jax.jit``)."""
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)  # as the jax backends of conftest do
    jnp = jax.numpy
    rng = np.random.default_rng(2)
    V, h, theta, g = (
        crandn(rng, PN, PL),
        crandn(rng, PN, PB),
        rng.standard_normal(PN),
        crandn(rng, PN, PB),
    )
    ref = hl.vjp.cwy_transpose_apply(V, h, g, theta=theta)
    fwd = lambda V, h, t: hl.cwy(V, theta=t).H @ h  # noqa: E731
    for wrap in (lambda f: f, jax.jit):
        _, pull = jax.vjp(wrap(fwd), *map(jnp.asarray, (V, h, theta)))
        Vj, hj, tj = pull(jnp.asarray(np.conj(g)))
        np.testing.assert_allclose(np.asarray(Vj), np.conj(ref[0]), atol=1e-12)
        np.testing.assert_allclose(np.asarray(hj), np.conj(ref[1]), atol=1e-12)
        np.testing.assert_allclose(np.asarray(tj), ref[2], atol=1e-12)


# == the retractions: steps, float32, bad input, memory, and autodiff through the plain maps ======
# Cayley is differentiated without its drift guard (drift_tol=inf): perturbed X leave the manifold
# by ε, and the VJP is that of the SMW map itself.

INF = float("inf")


def test_retraction_vjps_take_python_float_steps_and_float32():
    rng = np.random.default_rng(20)
    X = np.linalg.qr(rng.standard_normal((5, 2)))[0].astype(np.float32)
    Z = rng.standard_normal((5, 2)).astype(np.float32)
    g = rng.standard_normal((5, 2)).astype(np.float32)
    for vjp in (hl.vjp.cayley_retraction, hl.vjp.qr_retraction, hl.vjp.polar_retraction):
        Xb, Zb, tb = vjp(X, Z, 0.3, g)
        assert Xb.dtype == Zb.dtype == tb.dtype == np.float32 and tb.shape == ()
        Xb64, _, tb64 = vjp(X.astype(np.float64), Z.astype(np.float64), 0.3, g.astype(np.float64))
        np.testing.assert_allclose(Xb, Xb64, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(tb, tb64, rtol=1e-5, atol=1e-5)


def test_retraction_vjps_bad_input():
    X, g = np.eye(4, 2), np.ones((4, 2))
    with pytest.raises(ValueError, match="Ybar must have the shape"):
        hl.vjp.cayley_retraction(X, X, 0.1, np.ones((4, 3)))
    with pytest.raises(ValueError, match="G must have the shape"):
        hl.vjp.polar(X, np.ones((2, 4)))
    with pytest.raises(ValueError, match="Z must have the shape"):
        hl.vjp.cayley_retraction(X, np.ones((4, 3)), 0.1, g)
    with pytest.raises(ValueError, match="rank deficient"):
        hl.vjp.polar(np.zeros((4, 2)), g)


def test_no_n_by_n_intermediate_in_cayley_vjp():
    """Memory: the VJP at N = 4096, M = 4 stays O(N·M) (an N×N float64 would be 134 MB)."""
    import tracemalloc

    rng = np.random.default_rng(21)
    N, M = 4096, 4
    X = np.linalg.qr(rng.standard_normal((N, M)))[0]
    G, g = rng.standard_normal((N, M)), rng.standard_normal((N, M))
    tracemalloc.start()
    hl.vjp.cayley_retraction(X, G, 0.1, g)
    hl.vjp.polar(X, g)
    hl.vjp.qr_retraction(X, G, 0.1, g)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 40 * N * M * 8, peak


def test_retraction_plain_autodiff_agrees_with_explicit_vjps():
    """Until the adapters wire these VJPs (torch.autograd.Function / jax.custom_vjp), torch
    and JAX differentiate through the array operations; both agree with hl.vjp, warning-free."""
    torch = require("torch")
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(22)
    X = np.linalg.qr(rng.standard_normal((7, 3)))[0]
    G, g = rng.standard_normal((7, 3)), rng.standard_normal((7, 3))
    ref_p = hl.vjp.polar(X + 0.3 * G, g)
    Xt = torch.tensor(X + 0.3 * G, requires_grad=True)
    (hl.polar(Xt) * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(Xt.grad.numpy(), ref_p, atol=1e-12)
    gj = jax.grad(lambda x: (hl.polar(x) * g).sum())(jax.numpy.asarray(X + 0.3 * G))
    np.testing.assert_allclose(np.asarray(gj), ref_p, atol=1e-12)
    ref_c = hl.vjp.cayley_retraction(X, G, 0.3, g)
    Xt, Gt = (torch.tensor(a, requires_grad=True) for a in (X, G))
    Y = hl.cayley_retraction(Xt, Gt, 0.3, drift_tol=INF)
    (Y * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(Xt.grad.numpy(), ref_c[0], atol=1e-12)
    np.testing.assert_allclose(Gt.grad.numpy(), ref_c[1], atol=1e-12)


@pytest.mark.parametrize("case", ["plain", "zero column", "float32", "tiny column", "torch"])
def test_blocked_cwy_apply_vjp_equals_the_single_pair_rule(case, monkeypatch):
    """``hl.vjp.cwy_apply`` with L ≥ ``VJP_BLOCKS_MIN_L`` runs the blocked rule of unnormalised
    reflectors (``_blocked_apply_vjp``; issue 44, item 4: the single pair's VJP cost 2.24× its
    forward); it equals the single factor pair's rule (the path with the threshold raised
    past L) to a few hundred eps (two rounding paths of O(N·L) sums), a zero column gets a
    zero cotangent, and a column whose ‖v‖² leaves (~1e-292, ~1e292) keeps the single pair.
    Also the dot-product identity ⟨ȳ, J[dV, dh]⟩ = ⟨V̄, dV⟩ + ⟨h̄, dh⟩ against a central
    difference (step 1e-6: error O(1e-12) relative in float64)."""
    import householderla.vjp as hv

    N, L, B = 160, 136, 5
    rng = np.random.default_rng(44)
    V, h, g = (rng.standard_normal(s) for s in ((N, L), (N, B), (N, B)))
    dtype = np.float32 if case == "float32" else np.float64
    if case == "zero column":
        V[:, 3] = 0.0
    if case == "tiny column":
        V[:, 3] *= 1e-160
    V, h, g = (a.astype(dtype) for a in (V, h, g))
    calls = []  # whether the blocked rule served each call
    orig = hv._blocked_apply_vjp

    def spy(*a):
        out = orig(*a)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(hv, "_blocked_apply_vjp", spy)
    args = (V, h, g)
    if case == "torch":
        torch = require("torch")
        args = tuple(torch.from_numpy(a) for a in args)
    Vb, hb = (to_numpy(a) for a in hl.vjp.cwy_apply(*args))
    assert calls == [case != "tiny column"]
    monkeypatch.setattr(hv, "VJP_BLOCKS_MIN_L", L + 1)  # the single pair's rule
    Vr, hr = (to_numpy(a) for a in hl.vjp.cwy_apply(*args))
    assert Vb.dtype == Vr.dtype == dtype and hb.shape == (N, B)
    tol = 300 * np.finfo(dtype).eps
    np.testing.assert_allclose(Vb, Vr, atol=tol * np.abs(Vr).max())
    np.testing.assert_allclose(hb, hr, atol=tol * np.abs(hr).max())
    if case == "zero column":
        assert not np.any(Vb[:, 3])
    if dtype == np.float64 and case != "tiny column":
        dV, dh = rng.standard_normal((N, L)), rng.standard_normal((N, B))
        dV[:, ~V.any(axis=0)] = 0  # (H(v) is not continuous at v = 0)
        eps = 1e-6
        plus = hl.cwy(V + eps * dV) @ (h + eps * dh)
        minus = hl.cwy(V - eps * dV) @ (h - eps * dh)
        lhs = np.sum(g * (plus - minus)) / (2 * eps)
        rhs = np.sum(Vb * dV) + np.sum(hb * dh)
        assert abs(lhs - rhs) <= 1e-7 * abs(rhs)
