"""Sharded JAX checks, run in a subprocess by ``tests/test_sharding.py`` (issue 14, item 2).

JAX fixes its device count when it is first imported, so the four CPU devices
(``--xla_force_host_platform_device_count=4``) need a fresh process: ``main`` sets the flag,
imports JAX, runs the checks named on the command line and prints one JSON line
``{name: "ok" | traceback}``. This module imports no framework at module level (the test
module reads ``CHECKS`` from it).

Each check compiles a function under ``jax.jit`` with ``NamedSharding`` inputs over the four
devices and asserts (1) the result equals the same function on unsharded arrays (float64;
sharding may reorder a reduction over a sharded axis, so 1e-12 relative, ~ 5000 eps, where a
wrong block would be O(1) off), (2) the result keeps the batch sharding, and (3) the compiled
HLO has no collective except those listed: no all-gather, all-to-all or permute of the batch;
where a result sums over the sharded batch (a gradient of replicated reflectors) one
all-reduce of that sum, and in the optimizers' polar step scalar all-reduces (the "all
converged" flags of the Newton–Schulz guard). For a Stiefel parameter sharded by its rows
(issue 43, item 4) only M×M traffic: all-reduces of at most (2M)² numbers, the all-gather of
TSQR's stacked M×M R factors, nothing with a device's N/P rows (``small_collective``).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import traceback
from collections.abc import Callable
from typing import Any

DEVICES = 4
COLLECTIVES = ("all-gather", "all-to-all", "all-reduce", "reduce-scatter", "collective-permute")

#: name -> check; filled by the ``check`` decorator
CHECKS: dict[str, Callable[[Any], None]] = {}


def check(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    CHECKS[fn.__name__.removeprefix("check_")] = fn
    return fn


class Context:
    """JAX, the mesh and helpers, built after the device count is set."""

    def __init__(self) -> None:
        import jax
        import numpy as np

        jax.config.update("jax_enable_x64", True)
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        assert len(jax.devices()) == DEVICES, jax.devices()
        self.jax, self.np, self.P = jax, np, P
        self.mesh = Mesh(np.array(jax.devices()), ("d",))
        self.NamedSharding = NamedSharding
        self.rng = np.random.default_rng(0)

    def put(self, a: Any, *spec: Any) -> Any:
        return self.jax.device_put(a, self.NamedSharding(self.mesh, self.P(*spec)))

    def normal(self, *shape: int) -> Any:
        return self.rng.standard_normal(shape)

    def compiled_collectives(self, f: Callable, *args: Any) -> list[tuple[str, str]]:
        """(collective, result shape) of every collective in the compiled HLO of jit(f); a
        combined collective's shape is the tuple of its results, ``(f64[6,6]{1,0}, f64[])``."""
        text = self.jax.jit(f).lower(*args).compile().as_text()
        found = []
        for line in text.splitlines():
            m = re.search(r"= (\S+|\(.*?\)) (" + "|".join(COLLECTIVES) + r")(-start)?\(", line)
            if m:
                found.append((m.group(2), m.group(1)))
        return found

    def run(
        self,
        f: Callable,
        sharded: tuple[Any, ...],
        plain: tuple[Any, ...],
        allowed: Callable[[str, str], bool] = lambda kind, shape: False,
        out_spec: Any = None,
        reference: Callable | None = None,
    ) -> Any:
        """Check f on sharded against plain arguments; ``allowed(kind, shape)`` says which
        collectives may appear; ``out_spec`` is the sharding the (first) result must keep;
        ``reference`` computes the expected result from the plain arguments (default: f)."""
        jax, np = self.jax, self.np
        got = jax.jit(f)(*sharded)
        if reference is None:
            want = jax.jit(f)(*(jax.numpy.asarray(a) for a in plain))
        else:
            want = reference(*plain)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-12, atol=1e-12)
        if out_spec is not None:
            first = jax.tree.leaves(got)[0]
            want_sharding = self.NamedSharding(self.mesh, out_spec)
            assert first.sharding.is_equivalent_to(want_sharding, first.ndim), first.sharding
        bad = [c for c in self.compiled_collectives(f, *sharded) if not allowed(*c)]
        assert not bad, f"collectives in the compiled program: {bad}"
        return got


def scalar(kind: str, shape: str) -> bool:
    """An all-reduce of numbers one by one (a flag, a step size's gradient; combined ones
    too): no batch moves."""
    dims = ",".join(re.findall(r"\[([\d,]*)\]", shape))
    return kind == "all-reduce" and all(d == "1" for d in dims.split(",") if d)


# -- operators on a batch sharded over its columns, reflectors replicated ---------------------


@check
def check_cwy_columns(c: Context) -> None:
    import householderla as hl

    V, H = c.normal(64, 8), c.normal(64, 32)
    args = (c.put(V), c.put(H, None, "d"))
    P = c.P
    c.run(lambda V, H: hl.cwy(V) @ H, args, (V, H), out_spec=P(None, "d"))
    c.run(lambda V, H: hl.cwy(V).T @ H, args, (V, H), out_spec=P(None, "d"))
    c.run(lambda V, H: H @ hl.cwy(V), (args[0], c.put(H.T, "d")), (V, H.T), out_spec=P("d"))
    c.run(lambda V, H: hl.householder_apply(V, H), args, (V, H), out_spec=P(None, "d"))


@check
def check_tcwy_columns(c: Context) -> None:
    import householderla as hl

    V, X, Y = c.normal(64, 8), c.normal(8, 32), c.normal(64, 32)
    P = c.P
    c.run(
        lambda V, X: hl.tcwy(V) @ X, (c.put(V), c.put(X, None, "d")), (V, X), out_spec=P(None, "d")
    )
    c.run(
        lambda V, Y: hl.tcwy(V).T @ Y,
        (c.put(V), c.put(Y, None, "d")),
        (V, Y),
        out_spec=P(None, "d"),
    )


@check
def check_svd_householder_columns(c: Context) -> None:
    import householderla as hl

    Uv, s, Vv, X = c.normal(48, 6), c.normal(6), c.normal(6, 6), c.normal(6, 32)
    f = lambda Uv, s, Vv, X: hl.svd_householder(Uv, s, Vv) @ X  # noqa: E731
    c.run(
        f,
        (c.put(Uv), c.put(s), c.put(Vv), c.put(X, None, "d")),
        (Uv, s, Vv, X),
        out_spec=c.P(None, "d"),
    )


@check
def check_gradient_with_replicated_reflectors(c: Context) -> None:
    """V̄ sums over the sharded columns: one all-reduce of V̄'s shape, nothing else."""
    import householderla as hl

    jax = c.jax
    V, H = c.normal(64, 8), c.normal(64, 32)

    def loss(V: Any, H: Any) -> Any:
        return jax.numpy.sum((hl.cwy(V) @ H) ** 2 * H)

    def allowed(kind: str, shape: str) -> bool:
        return kind == "all-reduce" and "[64,8]" in shape

    c.run(jax.grad(loss, argnums=(0, 1)), (c.put(V), c.put(H, None, "d")), (V, H), allowed)


# -- stacks of reflectors sharded over the batch axis ------------------------------------------


@check
def check_stacked_operators(c: Context) -> None:
    import householderla as hl

    jax, P = c.jax, c.P
    V, H, X = c.normal(8, 64, 8), c.normal(8, 64, 5), c.normal(8, 8, 5)
    Vs, Hs, Xs = c.put(V, "d"), c.put(H, "d"), c.put(X, "d")
    c.run(lambda V, H: hl.cwy(V) @ H, (Vs, Hs), (V, H), out_spec=P("d"))
    c.run(lambda V, H: hl.cwy(V).T @ H, (Vs, Hs), (V, H), out_spec=P("d"))
    c.run(lambda V: hl.cwy(V).matrix(), (Vs,), (V,), out_spec=P("d"))
    c.run(lambda V, X: hl.tcwy(V) @ X, (Vs, Xs), (V, X), out_spec=P("d"))
    c.run(lambda V, H: hl.tcwy(V).T @ H, (Vs, Hs), (V, H), out_spec=P("d"))
    # one shared right-hand side, replicated: the result is sharded like the stack
    h = c.normal(64, 5)
    c.run(lambda V, h: hl.cwy(V) @ h, (Vs, c.put(h)), (V, h), out_spec=P("d"))

    def loss(V: Any, H: Any) -> Any:
        return jax.numpy.sum((hl.cwy(V) @ H) ** 2 * H)

    c.run(jax.grad(loss, argnums=(0, 1)), (Vs, Hs), (V, H), out_spec=P("d"))


@check
def check_stacked_retractions(c: Context) -> None:
    """polar, QR, Cayley retractions of a sharded stack: per-matrix work; the polar guard's
    "all converged" flag is a scalar all-reduce."""
    import householderla as hl

    np, P = c.np, c.P
    X = np.linalg.qr(c.normal(8, 64, 6))[0]
    Z = 0.1 * c.normal(8, 64, 6)
    args = (c.put(X, "d"), c.put(Z, "d"))

    c.run(lambda X, Z: hl.polar_retraction(X, Z, 0.5), args, (X, Z), scalar, P("d"))
    c.run(lambda X, Z: hl.qr_retraction(X, Z, 0.5), args, (X, Z), scalar, P("d"))
    c.run(lambda X, Z: hl.cayley_retraction(X, Z, 0.5), args, (X, Z), scalar, P("d"))


@check
def check_stiefel_optimizers(c: Context) -> None:
    """hl.jax.stiefel_sgd / stiefel_adam over a parameter stack sharded on its batch axis,
    three steps: equal to the same steps of ``hl.stiefel`` on whole NumPy arrays (the
    reference needs no second compilation), still sharded, no gather."""
    import householderla.jax as hlj
    import householderla.stiefel as S

    np, P = c.np, c.P
    X = np.linalg.qr(c.normal(8, 64, 6))[0]
    G = [c.normal(8, 64, 6) for _ in range(3)]

    cases = ((hlj.stiefel_sgd(0.1), S.momentum_sgd(0.1)), (hlj.stiefel_adam(0.01), S.adam(0.01)))
    for tx, opt in cases:

        def steps(X: Any, G0: Any, G1: Any, G2: Any, tx: Any = tx) -> Any:
            state = tx.init(X)
            for g in (G0, G1, G2):
                X, state = hlj.update_params(tx, g, state, X)
            return X, state

        sharded = (c.put(X, "d"), *(c.put(g, "d") for g in G))
        X3, _ = c.run(steps, sharded, (X, *G), scalar, P("d"), numpy_steps(opt))
        E = np.swapaxes(np.asarray(X3), -1, -2) @ np.asarray(X3) - np.eye(6)
        assert np.abs(E).max() < 1e-13  # still on the manifold


# -- Stiefel parameters sharded by rows (issue 43, item 4) --------------------------------------

#: Rows and columns of the row-sharded parameters: N/P = 32 rows a device, P·M = 24 < 32.
ROWS_N, ROWS_M = 128, 6


def small_collective(kind: str, shape: str) -> bool:
    """M×M traffic only: all-reduces of at most (2M)² numbers an operand (sums and maxima
    over rows, flags), all-gathers of TSQR's stacked M×M R factors (P·M × M); nothing with
    a dimension as long as a device's rows N/P (a gather of X or of a block of it)."""
    shapes = [[int(d) for d in m.split(",") if d] for m in re.findall(r"\[([\d,]*)\]", shape)]
    size = lambda dims: math.prod(dims)  # noqa: E731
    if any(d >= ROWS_N // DEVICES for dims in shapes for d in dims):
        return False
    if kind == "all-reduce":
        return all(size(dims) <= (2 * ROWS_M) ** 2 for dims in shapes)
    if kind == "all-gather":
        return all(size(dims) <= DEVICES * ROWS_M**2 for dims in shapes)
    return False


def row_sharded_steps(
    c: Context, tx: Any, n_steps: int = 2, cond: float | None = None
) -> tuple[Any, ...]:
    """``n_steps`` of the optax-style transformation ``tx`` from a point near St(N, M) (the
    first step projects it), as a function of (X, G_1, …); its arguments sharded by rows
    and plain. ``cond``: start instead from a full-rank X of that condition number, whose
    projection the jitted polar step's fixed count of iterations cannot certify: its QR
    fallback runs, by TSQR on the mesh."""
    import householderla.jax as hlj

    np = c.np
    X = np.linalg.qr(c.normal(ROWS_N, ROWS_M))[0] + 0.01 * c.normal(ROWS_N, ROWS_M)
    if cond is not None:
        V = np.linalg.qr(c.normal(ROWS_M, ROWS_M))[0]
        X = np.linalg.qr(X)[0] * np.geomspace(1.0, 1.0 / cond, ROWS_M) @ V
    G = [c.normal(ROWS_N, ROWS_M) for _ in range(n_steps)]

    def steps(X: Any, *G: Any) -> Any:
        state = tx.init(X)
        for g in G:
            X, state = hlj.update_params(tx, g, state, X)
        return X, state

    sharded = tuple(c.put(a, "d", None) for a in (X, *G))
    return steps, sharded, (X, *G)


def numpy_steps(opt: Any) -> Callable[..., Any]:
    """The same steps by the functional optimizer ``opt`` on whole NumPy arrays: the
    reference, computed without sharding (and without compiling)."""

    def steps(X: Any, *G: Any) -> Any:
        state = opt.init(X)
        for g in G:
            X, state = opt.update(X, g, state)
        return X, state

    return steps


@check
def check_stiefel_optimizers_row_sharded(c: Context) -> None:
    """stiefel_sgd / stiefel_adam with ``row_axis``: X (N×M, N ≫ M) sharded by rows, two
    steps (one where a second adds nothing new: Nesterov's look-ahead and the Euclidean
    metric act from the first, plain Adam is AMSGrad but its maxima; the Nesterov step from
    an ill-conditioned start, projected by the TSQR fallback). Each equals the same steps of
    ``hl.stiefel`` on whole NumPy arrays; X and U (Adam's q) stay sharded by rows, Z and p
    replicated; the compiled program has only M×M collectives (no gather of X, which the
    plain GSPMD step does in its polar step's QR fallback: ``check_row_gather_is_caught``)."""
    import householderla.jax as hlj
    import householderla.stiefel as S

    np, P = c.np, c.P
    kw = {"row_axis": "d", "mesh": c.mesh}
    cases = [
        (hlj.stiefel_sgd(0.1, **kw), S.momentum_sgd(0.1), 2, None),
        (
            hlj.stiefel_sgd(0.1, metric="euclidean", nesterov=True, **kw),
            S.momentum_sgd(0.1, metric="euclidean", nesterov=True),
            1,
            100.0,
        ),
        (hlj.stiefel_adam(0.01, amsgrad=True, **kw), S.adam(0.01, amsgrad=True), 2, None),
        (hlj.stiefel_adam(0.01, **kw), S.adam(0.01), 1, None),
    ]
    for tx, opt, n_steps, cond in cases:
        steps, sharded, plain = row_sharded_steps(c, tx, n_steps, cond)
        X2, state = c.run(steps, sharded, plain, small_collective, P("d", None), numpy_steps(opt))
        for name in state._fields:
            spec = P("d", None) if name in ("U", "q", "q_max") else P()
            leaf = getattr(state, name)
            assert leaf.sharding.is_equivalent_to(c.NamedSharding(c.mesh, spec), leaf.ndim), name
        E = np.asarray(X2).T @ np.asarray(X2) - np.eye(ROWS_M)
        assert np.abs(E).max() < 1e-13  # on the manifold


@check
def check_muon_row_sharded(c: Context) -> None:
    """hl.jax.muon on X sharded by rows (plain GSPMD, no option needed): equal to the
    unsharded step (float64 Newton–Schulz), sharded by rows, only M×M all-reduces."""
    import householderla.jax as hlj

    tx = hlj.muon(0.02, ns_dtype=c.jax.numpy.float64)

    def step(X: Any, G: Any) -> Any:
        state = tx.init(X)
        updates, state = tx.update(G, state, X)
        return hlj.apply_updates(X, updates), state

    X, G = c.normal(ROWS_N, ROWS_M), c.normal(ROWS_N, ROWS_M)
    sharded = (c.put(X, "d", None), c.put(G, "d", None))
    c.run(step, sharded, (X, G), small_collective, c.P("d", None))


@check
def check_row_gather_is_caught(c: Context) -> None:
    """The M×M rule can fail: without ``row_axis`` GSPMD partitions the Stiefel step itself
    and gathers X (N×M) for the QR fallback of its polar step."""
    import householderla.jax as hlj

    steps, sharded, _ = row_sharded_steps(c, hlj.stiefel_sgd(0.1), n_steps=1)
    found = c.compiled_collectives(steps, *sharded)
    bad = [col for col in found if not small_collective(*col)]
    whole = f"[{ROWS_N},{ROWS_M}]"
    assert any(kind == "all-gather" and whole in shape for kind, shape in bad), found


@check
def check_shard_map(c: Context) -> None:
    """The operators inside ``shard_map`` (each device applies V to its own block of columns,
    and a stack's blocks of matrices), with a gradient through it."""
    import householderla as hl

    jax, P = c.jax, c.P
    shard_map = jax.shard_map
    V, H = c.normal(64, 8), c.normal(64, 32)

    def apply(V: Any, H: Any) -> Any:
        return shard_map(
            lambda v, h: hl.cwy(v) @ h,
            mesh=c.mesh,
            in_specs=(P(), P(None, "d")),
            out_specs=P(None, "d"),
        )(V, H)

    # (references on NumPy arrays where the library computes them without JAX: no second
    # compilation of the unsharded program)
    numpy_apply = lambda V, H: hl.cwy(V) @ H  # noqa: E731
    c.run(
        apply, (c.put(V), c.put(H, None, "d")), (V, H), out_spec=P(None, "d"), reference=numpy_apply
    )

    def loss(V: Any, H: Any) -> Any:
        sequential = shard_map(
            hl.householder_apply, mesh=c.mesh, in_specs=(P(), P(None, "d")), out_specs=P(None, "d")
        )
        return jax.numpy.sum(apply(V, H) ** 2 * H + sequential(V, H) * H)

    def allowed(kind: str, shape: str) -> bool:
        return kind == "all-reduce" and "[64,8]" in shape  # V̄ summed over the devices

    c.run(jax.grad(loss), (c.put(V), c.put(H, None, "d")), (V, H), allowed)

    # a stack sharded over its batch axis, a retraction with a replicated step size
    X = c.np.linalg.qr(c.normal(8, 64, 6))[0]
    Z = 0.1 * c.normal(8, 64, 6)

    def retract(X: Any, Z: Any, t: Any) -> Any:
        f = lambda X, Z, t: hl.cayley_retraction(X, Z, t)  # noqa: E731
        return shard_map(f, mesh=c.mesh, in_specs=(P("d"), P("d"), P()), out_specs=P("d"))(X, Z, t)

    def loss2(X: Any, Z: Any, t: Any) -> Any:
        return jax.numpy.sum(retract(X, Z, t) * Z)

    t = c.np.asarray(0.5)
    c.run(
        retract,
        (c.put(X, "d"), c.put(Z, "d"), c.put(t)),
        (X, Z, t),
        out_spec=P("d"),
        reference=lambda X, Z, t: hl.cayley_retraction(X, Z, float(t)),
    )
    c.run(
        jax.grad(loss2, argnums=(0, 1, 2)),
        (c.put(X, "d"), c.put(Z, "d"), c.put(t)),
        (X, Z, t),
        scalar,  # the step's gradient sums over the stack
    )


@check
def check_a_gather_is_caught(c: Context) -> None:
    """The collective check can fail: replicating a column-sharded batch is an all-gather."""
    jax, P = c.jax, c.P
    H = c.normal(64, 32)
    replicate = c.NamedSharding(c.mesh, P())
    f = lambda H: jax.lax.with_sharding_constraint(H * 2.0, replicate)  # noqa: E731
    try:
        c.run(f, (c.put(H, None, "d"),), (H,))
    except AssertionError as exc:
        assert "all-gather" in str(exc), exc
    else:
        raise AssertionError("an all-gather went unnoticed")


def main(names: list[str]) -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    # first: XLA stops reading flags at a bare token such as the test runner's
    # "intra_op_parallelism_threads=1" (tests/conftest.py under pytest-xdist)
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES} {flags}".strip()
    results = {}
    context = Context()
    for name in names or list(CHECKS):
        try:
            CHECKS[name](context)
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc()
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])
