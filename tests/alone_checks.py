"""A user's process with one framework: ``python tests/alone_checks.py torch|numpy|jax
[--compile]`` (``--compile``: also ``torch.compile`` the layer).

The suite's processes import every framework (the backends); a user's usually imports one.
Code that asks array-api-compat "is this a JAX array?" then meets a framework that was never
imported (a ``KeyError`` inside it, which torch 2.6's dynamo could not trace), and an import
the library makes by mistake goes unnoticed when the module is there anyway. Here the other
frameworks cannot be imported at all (an import hook refuses them and records the attempt),
and the library's common calls run: on torch tensors (products, gradients, the layer's
training step, the optimizers, Muon, ``torch.compile`` of the layer where supported), on NumPy
arrays, or on JAX arrays (eager and under ``jax.jit``). Prints ``ok`` and exits 0, or
raises. Run by ``tests/test_alone.py``.
"""

from __future__ import annotations

import importlib.abc
import sys

#: frameworks a torch user's or a NumPy user's process may lack (never imported here)
OTHERS = {
    "torch": ("jax", "jaxlib", "dask", "cupy", "array_api_strict", "lineax", "equinox"),
    "numpy": ("torch", "jax", "jaxlib", "dask", "cupy", "array_api_strict", "lineax"),
    "jax": ("torch", "dask", "cupy", "array_api_strict"),
}


class Refuse(importlib.abc.MetaPathFinder):
    """Refuses (ImportError) the top-level packages ``names`` and records every attempt."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names, self.attempts = set(names), []

    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        if fullname.split(".")[0] in self.names:
            self.attempts.append(fullname)
            raise ImportError(f"{fullname} is refused here (not installed for this user)")
        return None


def torch_user(compile_: bool) -> None:
    import numpy as np
    import torch

    import householderla as hl

    g = torch.Generator().manual_seed(0)
    V = torch.randn(12, 4, dtype=torch.float64, generator=g, requires_grad=True)
    h = torch.randn(12, 3, dtype=torch.float64, generator=g)
    y = hl.cwy(V) @ h
    y.square().sum().backward()
    assert V.grad is not None and torch.isfinite(V.grad).all()
    Q = hl.cwy(V.detach()).matrix()
    assert torch.allclose(Q.mT @ Q, torch.eye(12, dtype=torch.float64), atol=1e-12)
    X = torch.randn(12, 4, dtype=torch.float64, generator=g)
    P = hl.polar(X)
    assert torch.allclose(P.mT @ P, torch.eye(4, dtype=torch.float64), atol=1e-12)
    a, tau = torch.geqrf(torch.randn(10, 10, dtype=torch.float64, generator=g))
    assert torch.allclose(hl.from_lapack(a, tau).matrix(), torch.linalg.householder_product(a, tau))
    layer = hl.torch.OrthogonalLinear(16, 16)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        layer(torch.randn(8, 16, generator=g)).square().sum().backward()
        opt.step()
    W = layer.weight.detach()
    assert torch.allclose(W.mT @ W, torch.eye(16), atol=1e-5)
    for cls in (hl.torch.StiefelSGD, hl.torch.StiefelAdam, hl.torch.Muon):
        p = torch.nn.Parameter(torch.linalg.qr(torch.randn(10, 3, generator=g))[0])
        o = cls([p], lr=0.01)
        for _ in range(2):
            p.grad = torch.randn(10, 3, generator=g)
            o.step()
        assert torch.isfinite(p).all(), cls
    if compile_:  # at or above torch.compile's floor (tests/conftest.py, TORCH_FLOORS)
        # the layer in one graph (dynamo traces the namespace checks on the way; compiling
        # an optimizer step too took 11 s more here, and test_torch_optim_options does it)
        net = torch.compile(hl.torch.OrthogonalLinear(8, 8), backend="eager", fullgraph=True)
        net(torch.randn(4, 8, generator=g)).sum().backward()
    assert np.isfinite(W.numpy()).all()


def numpy_user(compile_: bool) -> None:
    import numpy as np

    import householderla as hl

    rng = np.random.default_rng(0)
    V, h = rng.standard_normal((12, 4)), rng.standard_normal((12, 3))
    Q = hl.cwy(V).matrix()
    assert np.allclose(hl.cwy(V) @ h, Q @ h, atol=1e-12)
    assert np.allclose(Q.T @ Q, np.eye(12), atol=1e-12)
    stack = hl.cwy(np.tril(rng.standard_normal((64, 8, 8)), -1) + np.eye(8)).matrix()
    assert np.allclose(stack.swapaxes(-1, -2) @ stack, np.eye(8), atol=1e-12)
    V_bar, h_bar = hl.vjp.cwy_apply(V, h, np.ones((12, 3)))
    assert V_bar.shape == V.shape and h_bar.shape == h.shape
    P = hl.polar(rng.standard_normal((12, 4)))
    assert np.allclose(P.T @ P, np.eye(4), atol=1e-12)
    W = hl.svd_householder(
        rng.standard_normal((6, 6)), rng.standard_normal(6), rng.standard_normal((6, 6))
    )
    assert W.matrix().shape == (6, 6)
    for opt in (hl.stiefel.momentum_sgd(0.1), hl.stiefel.adam(0.01)):
        X = np.linalg.qr(rng.standard_normal((10, 3)))[0]
        state = opt.init(X)
        for _ in range(2):
            X, state = opt.update(X, rng.standard_normal((10, 3)), state)
        assert np.allclose(X.T @ X, np.eye(3), atol=1e-12)


def jax_user(compile_: bool) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import householderla as hl

    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(0)
    V, h = jnp.asarray(rng.standard_normal((12, 4))), jnp.asarray(rng.standard_normal((12, 3)))
    loss = lambda V, h: jnp.sum((hl.cwy(V) @ h) ** 2)  # noqa: E731
    g_eager = jax.grad(loss)(V, h)
    g_jit = jax.jit(jax.grad(loss))(V, h)
    assert np.allclose(g_eager, g_jit, atol=1e-12)
    Q = hl.cwy(V).matrix()
    assert np.allclose(Q.T @ Q, np.eye(12), atol=1e-12)
    P = jax.jit(hl.polar)(jnp.asarray(rng.standard_normal((12, 4))))
    assert np.allclose(P.T @ P, np.eye(4), atol=1e-12)
    opt = hl.stiefel.momentum_sgd(0.1)
    X = jnp.asarray(np.linalg.qr(rng.standard_normal((10, 3)))[0])
    state = opt.init(X)
    for _ in range(2):
        X, state = opt.update(X, jnp.asarray(rng.standard_normal((10, 3))), state)
    assert np.allclose(X.T @ X, np.eye(3), atol=1e-12)
    W = jnp.asarray(rng.standard_normal((8, 8)))
    x = jnp.asarray(rng.standard_normal((5, 8)))
    y = jax.jit(hl.jax.orthogonal_linear)(W, x)
    assert np.allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x, axis=1), atol=1e-12)


def main(user: str, compile_: bool = False) -> None:
    refuse = Refuse(OTHERS[user])
    sys.meta_path.insert(0, refuse)
    {"torch": torch_user, "numpy": numpy_user, "jax": jax_user}[user](compile_)
    imported = sorted(n for n in sys.modules if n.split(".")[0] in refuse.names)
    assert not imported, imported
    # the library never tried to import a framework its caller had not imported
    assert not refuse.attempts, refuse.attempts
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1], "--compile" in sys.argv[2:])
