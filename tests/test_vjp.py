"""Every explicit VJP by the dot-product test against central differences, on every backend:
one test over the registry of differentiable maps (tests/registry.py: CWY, T-CWY, the
Householder products, the phased unitary maps, oRNN, SVD-Householder, bounded σ and the
retractions, each in float64 and, where it takes them, complex128); then the torch and JAX
wiring through the operators.

Dot-product test: for random directions δ and cotangent g, the central difference
(⟨g, f(x + εδ)⟩ − ⟨g, f(x − εδ)⟩)/2ε equals ⟨vjp(g), δ⟩ up to O(ε²)·|f'''| + O(eps/ε).
With ε = 1e-6 both are ≲ 1e-9 relative; the tolerance is 1e-7 relative. A wrong sign,
a missing striu or a missing normalisation term changes the value by O(1).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FRAMEWORKS, LONG, get_backend, require, to_numpy
from helpers import EPS_FD, assert_vjp_matches_central_differences, stable_seed
from registry import COMPLEX, ENTRIES, REAL

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


def _torch_pair(entry, kind, seed):
    torch = require("torch")
    rng = np.random.default_rng(seed)
    inputs = [torch.asarray(a) for a in entry.draw(rng, kind == COMPLEX)]
    dirs = [torch.asarray(_direction(rng, a)) for a in inputs]
    if entry.freeze is not None:
        d = [t.numpy().copy() for t in dirs]
        entry.freeze(d)
        dirs = [torch.asarray(a) for a in d]
    return inputs, dirs


def _direction(rng, a):
    a = a.numpy()
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
    grads = vjp(*inputs, g)
    grads = grads if isinstance(grads, tuple) else (grads,)
    lhs = _rdot(g, t)
    rhs = sum(_rdot(gr, d) for gr, d in zip(grads, dirs, strict=True))
    scale = float(torch.linalg.norm(g)) * float(torch.linalg.norm(t)) + sum(
        float(torch.linalg.norm(gr)) * float(torch.linalg.norm(d))
        for gr, d in zip(grads, dirs, strict=True)
    )
    assert abs(lhs - rhs) <= 1e-10 * max(scale, 1.0), (lhs, rhs)


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
