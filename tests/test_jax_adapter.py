"""householderla.jax: custom_jvp rules whose tangents are the explicit JVPs and whose
transposes are the explicit VJPs, composed with grad/jit/vmap.

``check_grads(..., modes=["rev"], order=2)`` compares reverse-mode derivatives (and the
derivative of the backward rule itself) with finite differences in float64 (JAX's default
tolerances for float64: atol = rtol = 1e-5 after its own eps scaling; a wrong term is off by
O(1)); forward mode: ``tests/test_vjp.py``. "Uses the explicit VJP" is asserted by the rule
appearing in the jaxpr (``custom_jvp_call``), by the gradient's jaxpr applying the VJP (the
transposed ``explicit_linear``) and by equality with ``hl.vjp`` to 1e-12. Compositions
(``jit(vmap(grad))``) are compared with a Python loop of eager grads.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import require
from helpers import stable_seed

jax = require("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import householderla as hl  # noqa: E402
import householderla.jax as hlj  # noqa: E402

INF = float("inf")


def _stiefel(rng, shape, off=0.2):
    X = np.linalg.qr(rng.standard_normal(shape))[0]
    return jnp.asarray(X + off * rng.standard_normal(X.shape))


def _normal(rng, shape):
    return jnp.asarray(rng.standard_normal(shape))


# name -> (f(X, G) with X a near-Stiefel point and G a direction/operand of X's shape)
MAPS = {
    "cwy_apply": lambda V, h: hl.cwy(V) @ h,
    "cwy_transpose_apply": lambda V, h: hl.cwy(V).T @ h,
    "cwy_matrix": lambda V, h: hl.cwy(V).matrix() @ h,
    "tcwy_apply": lambda V, h: hl.tcwy(V) @ h[..., :3, :],
    "tcwy_transpose_apply": lambda V, h: hl.tcwy(V).T @ h,
    "tcwy_matrix": lambda V, h: hl.tcwy(V).matrix() * h,
    "householder_apply": hlj.householder_apply,
    "householder_product": lambda V, h: hlj.householder_product(V) @ h,
    "polar": lambda X, G: hl.polar(X),
    "polar_retraction": lambda X, G: hl.polar_retraction(X, G, 0.3),
    "cayley_retraction": lambda X, Z: hl.cayley_retraction(X, Z, 0.3, drift_tol=INF),
    "cayley_with_guard": lambda X, G: hl.cayley_retraction(X, G, 0.3),
    "qr_retraction": lambda X, G: hl.qr_retraction(X, G, 0.3),
}
RULES = {  # the custom_jvp rule each map must go through (its primal's name in the jaxpr)
    "cwy": "_cwy_factors",
    "tcwy": "_cwy_factors",
    "householder": "_householder_apply",
    "polar": "polar",
    "cayley": "_cayley_smw",
    "qr": "_qr_q",
}


def _rule(name):
    return next(v for k, v in RULES.items() if name.startswith(k))


def _args(rng, batch=(2,)):
    return _stiefel(rng, (*batch, 6, 3)), _normal(rng, (*batch, 6, 3))


#: second order of each custom rule runs here once; these maps get first order here and
#: second order in test-long (the Cayley rule with its drift guard took ~15 s)
SECOND_ORDER_LONG = (
    "cayley_with_guard",
    # the same rule (cwy_factors, householder_apply, polar) as a map whose second order runs
    # here: first order here, second order in test-long
    "cwy_transpose_apply",
    "cwy_matrix",
    "tcwy_transpose_apply",
    "tcwy_matrix",
    "householder_product",
    "polar_retraction",
)


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.long if n in SECOND_ORDER_LONG else ()) for n in MAPS],
)
def test_check_grads_rev_order_2(name):
    f = MAPS[name]
    X, G = _args(np.random.default_rng(stable_seed(name)))
    check_grads(f, (X, G), order=2, modes=["rev"])


@pytest.mark.parametrize("name", SECOND_ORDER_LONG)
def test_check_grads_rev_order_1(name):
    f = MAPS[name]
    X, G = _args(np.random.default_rng(stable_seed(name)))
    check_grads(f, (X, G), order=1, modes=["rev"])


@pytest.mark.parametrize("name", list(MAPS))
def test_custom_rule_is_in_the_jaxpr_and_grad_applies_the_vjp(name):
    f = MAPS[name]
    X, G = _args(np.random.default_rng(1))
    jaxpr = str(jax.make_jaxpr(f)(X, G))
    assert re.search(rf"custom_jvp_call\[\s*name={_rule(name)}\b", jaxpr), jaxpr[:2000]
    grad = str(jax.make_jaxpr(jax.grad(lambda X, G: jnp.sum(f(X, G) ** 2)))(X, G))
    assert re.search(r"explicit_linear\[\s*fun=<function \S*vjp\b", grad), grad[:2000]
    assert not re.search(r"fun=<function \S*jvp\b", grad), grad[:2000]


@pytest.mark.parametrize(
    "name",
    # one map per custom rule here; the maps sharing a rule (SECOND_ORDER_LONG) in test-long
    [pytest.param(n, marks=pytest.mark.long if n in SECOND_ORDER_LONG else ()) for n in MAPS],
)
def test_jit_vmap_grad_equals_loop_of_eager_grads(name):
    f = MAPS[name]
    X, G = _args(np.random.default_rng(2), batch=(3,))

    def loss(x, g):
        return jnp.sum(f(x, g) ** 3)

    fast = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1))))(X, G)
    for i in range(3):
        ref = jax.grad(loss, argnums=(0, 1))(X[i], G[i])
        for a, b in zip(fast, ref, strict=True):
            np.testing.assert_allclose(np.asarray(a[i]), np.asarray(b), rtol=1e-10, atol=1e-10)
    # and the other orders of the transformations
    gv = jax.vmap(jax.jit(jax.grad(loss)))(X, G)
    np.testing.assert_allclose(np.asarray(gv), np.asarray(fast[0]), rtol=1e-10, atol=1e-10)


def test_gradients_equal_explicit_vjps():
    rng = np.random.default_rng(3)
    # (6, 3): the shape of the eager grads in test_jit_vmap_grad_equals_loop_of_eager_grads,
    # whose compiled rules this test then shares
    X, Z, g = _stiefel(rng, (6, 3)), _normal(rng, (6, 3)), _normal(rng, (6, 3))
    cases = [
        (hl.polar, (X,), lambda: (hl.vjp.polar(X, g),)),
        (
            lambda X, Z: hl.qr_retraction(X, Z, 0.3),
            (X, Z),
            lambda: hl.vjp.qr_retraction(X, Z, 0.3, g)[:2],
        ),
        (
            lambda X, Z: hl.cayley_retraction(X, Z, 0.3, drift_tol=INF),
            (X, Z),
            lambda: hl.vjp.cayley_retraction(X, Z, 0.3, g)[:2],
        ),
        (
            lambda X, Z: hl.polar_retraction(X, Z, 0.3),
            (X, Z),
            lambda: hl.vjp.polar_retraction(X, Z, 0.3, g)[:2],
        ),
        (hlj.householder_apply, (Z, X), lambda: hl.vjp.householder_apply(Z, X, g)),
    ]
    for f, inputs, ref in cases:
        _, pullback = jax.vjp(f, *inputs)
        for a, r in zip(pullback(g), ref(), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(r), rtol=1e-12, atol=1e-12)


def test_step_gradient_under_jit_has_the_shape_of_step():
    rng = np.random.default_rng(4)
    X, G = _stiefel(rng, (3, 6, 2)), _normal(rng, (3, 6, 2))
    for f in (
        lambda t: hl.cayley_retraction(X, G, t, drift_tol=INF),
        lambda t: hl.qr_retraction(X, G, t),
        lambda t: hl.polar_retraction(X, G, t),
    ):
        for t in (jnp.asarray(0.2), jnp.asarray([0.1, 0.2, 0.3])):
            gt = jax.jit(jax.grad(lambda t, f=f: jnp.sum(f(t) ** 2)))(t)
            assert gt.shape == t.shape and bool(jnp.all(jnp.isfinite(gt)))
            ref = jax.grad(lambda t, f=f: jnp.sum(f(t) ** 2))(t)
            np.testing.assert_allclose(np.asarray(gt), np.asarray(ref), rtol=1e-10, atol=1e-12)


def _dot_precisions(jaxpr):
    """Precision of every dot_general in a (closed) jaxpr, sub-jaxprs included, and in the
    functions an ``explicit_linear`` applies (traced at the avals of its operands, outside
    the rules' own precision context)."""
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            out.append(eqn.params["precision"])
        if eqn.primitive.name.endswith("explicit_linear"):
            avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars]
            out.extend(_dot_precisions(jax.make_jaxpr(eqn.params["fun"])(*avals).jaxpr))
        for p in eqn.params.values():
            subs = p if isinstance(p, (list, tuple)) else [p]
            for s in subs:
                inner = getattr(s, "jaxpr", None)
                if inner is not None:
                    out.extend(_dot_precisions(getattr(inner, "jaxpr", inner)))
    return out


@pytest.mark.parametrize("name", ["cwy_apply", "householder_apply", "polar", "cayley_retraction"])
def test_matmul_precision_is_pinned_to_highest(name):
    f = MAPS[name]
    X, G = _args(np.random.default_rng(5))
    X32, G32 = X.astype(jnp.float32), G.astype(jnp.float32)
    # JAX's own default (None), not the suite's pin (conftest): a dot the library leaves
    # unpinned must show as None here
    with jax.default_matmul_precision(None):
        closed = jax.make_jaxpr(jax.grad(lambda X, G: jnp.sum(f(X, G) ** 2)))(X32, G32)
    precs = _dot_precisions(closed.jaxpr)
    assert precs and all(
        p is not None and all(q == jax.lax.Precision.HIGHEST for q in p) for p in precs
    ), precs


@pytest.mark.parametrize(
    "name",
    [
        "cwy_apply",
        "tcwy_matrix",
        "householder_apply",
        "polar",
        "cayley_with_guard",
        "qr_retraction",
    ],
)
def test_float32_stays_float32(name):
    """One map per rule (float32 compiles a second version of each rule)."""
    f = MAPS[name]
    rng = np.random.default_rng(6)
    X, G = (a.astype(jnp.float32) for a in _args(rng))
    y = f(X, G)
    gX, gG = jax.grad(lambda X, G: jnp.sum(f(X, G) ** 2), argnums=(0, 1))(X, G)
    assert y.dtype == gX.dtype == gG.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(gX))) and bool(jnp.all(jnp.isfinite(gG)))


def test_polar_info_through_the_rule():
    X = _stiefel(np.random.default_rng(7), (8, 3))
    Q, info = hl.polar(X, return_info=True)
    assert info["method"] == "newton-schulz" and info["certified"] is True
    np.testing.assert_allclose(np.asarray(Q.T @ Q), np.eye(3), atol=1e-14)
    c = jax.jit(lambda X: hl.polar(X, return_info=True)[1]["certified"])(X)
    assert c.dtype == jnp.bool_


def test_nan_input_still_raises_eagerly():
    X = jnp.ones((5, 2)).at[0, 0].set(jnp.nan)
    with pytest.raises(ValueError, match="X contains NaN"):
        hl.polar(X)
    with pytest.raises(ValueError, match="V contains NaN"):
        hlj.householder_apply(X, jnp.ones(5))


def test_namespace_exports():
    for name in hlj.__all__:
        assert hasattr(hlj, name), name
    assert hlj.polar is hl.polar and hlj.cwy is hl.cwy
    assert hlj.householder_apply(jnp.ones((3, 1)), jnp.ones(3)).shape == (3,)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.complex128], ids=["real", "complex"])
def test_householder_vectors_compile_one_step_whatever_n(dtype):
    """The constructive inverse under jit is one loop of one column step (``fori``): the
    program does not grow with N (unrolled, it compiled N different steps: 227 s at N = 64
    with XLA's default flags), and equals the eager NumPy result to rounding."""

    def program(n):
        Q = jnp.eye(n, dtype=dtype)
        f = (
            (lambda Q: hl.householder_vectors(Q, return_phases=True))
            if dtype == jnp.complex128
            else hl.householder_vectors
        )
        return jax.make_jaxpr(f)(Q)

    def size(jaxpr):
        """Equations, counting those of every nested jaxpr (loop bodies, jit calls)."""
        jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
        subs = [
            v
            for e in jaxpr.eqns
            for p in e.params.values()
            for v in (p if isinstance(p, tuple | list) else (p,))
            if hasattr(v, "eqns") or hasattr(getattr(v, "jaxpr", None), "eqns")
        ]
        return len(jaxpr.eqns) + sum(size(v) for v in subs)

    assert size(program(24)) == size(program(6)), "the program grows with N"
    rng = np.random.default_rng(stable_seed("fixed_shape_reflectors"))
    A = rng.standard_normal((3, 9, 9))
    if dtype == jnp.complex128:
        A = A + 1j * rng.standard_normal(A.shape)
    Q = np.linalg.qr(A)[0]
    want = hl.householder_vectors(Q, return_phases=True)
    got = jax.jit(lambda Q: hl.householder_vectors(Q, return_phases=True))(jnp.asarray(Q))
    for g, w in zip(got, want, strict=True):
        # a few rounding errors per column step, 9 steps, relative to each entry (the heads
        # −ρ/(α + ‖x‖) reach ~20 here) and to the unit columns of Q
        tol = 9 * 8 * 2.2e-16
        np.testing.assert_allclose(np.asarray(g), w, rtol=tol, atol=tol)


class _Compiles:
    """Counts XLA compilations (JAX's backend-compile events) while entered."""

    def __enter__(self):
        self.n = 0
        self._on = True

        def listen(event, duration, **kw):
            if self._on and event == "/jax/core/compile/backend_compile_duration":
                self.n += 1

        jax.monitoring.register_event_duration_secs_listener(listen)
        return self

    def __exit__(self, *exc):
        self._on = False  # (JAX keeps listeners registered; this one stops counting)


@pytest.fixture
def fresh_programs(monkeypatch):
    """``eager_program``'s cache as in a fresh process (a program another test compiled
    would otherwise count or not count here)."""
    import collections

    from householderla._lib import jit

    monkeypatch.setattr(jit, "_PROGRAMS", collections.OrderedDict())
    return jit


def test_programs_kept_are_bounded(fresh_programs):
    """At most ``MAX_PROGRAMS`` programs are kept, the least recently used dropped first."""
    jit = fresh_programs
    calls = []
    f = lambda xp, x: x + 1  # noqa: E731
    for i in range(jit.MAX_PROGRAMS + 3):
        calls.append(jit.eager_program(("bounded", i), f, (0,), None, jnp.zeros(2)))
    assert len(jit._PROGRAMS) == jit.MAX_PROGRAMS
    assert ("bounded", 0) not in jit._PROGRAMS and ("bounded", 3) in jit._PROGRAMS
    jit.eager_program(("bounded", 3), f, (0,), None, jnp.zeros(2))  # used: kept
    jit.eager_program(("bounded", "new"), f, (0,), None, jnp.zeros(2))
    assert ("bounded", 3) in jit._PROGRAMS and ("bounded", 4) not in jit._PROGRAMS
    assert all(np.array_equal(np.asarray(c), [1.0, 1.0]) for c in calls)


@pytest.mark.parametrize("algo", ["sgd", "adam"])
def test_eager_step_is_one_compiled_program(algo, fresh_programs):
    """On eager JAX arrays a Stiefel step runs as one compiled program (``eager_program``):
    the first step compiles it and the few eager operations of the input checks, later steps
    compile nothing (not even for the first step's uncommitted arrays against the committed
    ones it returns), an optimizer with the same hyperparameters reuses the program, and the
    result equals the NumPy step to rounding. Op by op, the first step compiled every
    operation of the step (~200 programs) and later steps took ~10× longer."""
    make = {
        "sgd": lambda: hl.stiefel.momentum_sgd(0.1, nesterov=True),
        "adam": lambda: hl.stiefel.adam(0.05, amsgrad=True, expm_method="cayley"),
    }[algo]
    rng = np.random.default_rng(stable_seed("eager-program", algo))
    X0 = rng.standard_normal((7, 13, 3))  # an unusual shape: nothing compiled for it before
    Gs = [rng.standard_normal(X0.shape) for _ in range(3)]
    opt = make()
    X, state = jnp.asarray(X0), opt.init(jnp.asarray(X0))
    with _Compiles() as first:
        X, state = opt.update(X, jnp.asarray(Gs[0]), state)
    with _Compiles() as later:
        for G in Gs[1:]:
            X, state = opt.update(X, jnp.asarray(G), state)
    assert 1 <= first.n <= 12, first.n
    assert later.n == 0, later.n
    Xn, sn = X0, make().init(X0)
    for G in Gs:
        Xn, sn = make().update(Xn, G, sn)
    # 3 steps of O(M³ + N·M²) operations each, relative to entries of size ≤ 1
    np.testing.assert_allclose(np.asarray(X), Xn, atol=1e-12)
    for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(sn), strict=True):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-12)
    with _Compiles() as again:  # a new optimizer with the same hyperparameters
        opt2 = make()
        opt2.update(X, jnp.asarray(Gs[0]), opt2.init(X))
    assert again.n <= 2, again.n  # init's zeros at most


@pytest.mark.parametrize("algo", ["sgd", "adam"])
def test_new_float_hyperparameters_reuse_the_program(algo, fresh_programs):
    """An optimizer rebuilt with other float hyperparameters each step (a scheduled lr, and
    here momentum, dampening, betas and eps too) reuses the first step's program: the floats
    are the program's arguments, not its constants (with them in the key, every step compiled
    a program: seconds each). Every step still moves by its own values: equal to the same
    sequence of NumPy steps."""
    make = {
        "sgd": lambda k: hl.stiefel.momentum_sgd(0.2 / (k + 1), 0.9 - 0.1 * k, dampening=0.05 * k),
        "adam": lambda k: hl.stiefel.adam(
            0.05 / (k + 1), 0.9 - 0.1 * k, 0.99 - 0.01 * k, 1e-8 * 10**k
        ),
    }[algo]
    rng = np.random.default_rng(stable_seed("eager-hyper", algo))
    X0 = rng.standard_normal((9, 3))
    Gs = [rng.standard_normal(X0.shape) for _ in range(5)]
    # the first step of an undamped and of a damped sgd (dampening = 0 or not: two programs)
    X, state = jnp.asarray(X0), make(0).init(jnp.asarray(X0))
    X, state = make(0).update(X, jnp.asarray(Gs[0]), state)
    X, state = make(1).update(X, jnp.asarray(Gs[1]), state)
    with _Compiles() as later:
        for k, G in enumerate(Gs[2:], start=2):
            X, state = make(k).update(X, jnp.asarray(G), state)
    assert later.n == 0, later.n
    assert len(fresh_programs._PROGRAMS) == (2 if algo == "sgd" else 1)
    Xn, sn = X0, make(0).init(X0)
    for k, G in enumerate(Gs):
        Xn, sn = make(k).update(Xn, G, sn)
    # 5 steps of O(M³ + N·M²) operations each, relative to entries of size ≤ 1 (as above)
    np.testing.assert_allclose(np.asarray(X), Xn, atol=1e-12)
    for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(sn), strict=True):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-12)


def test_eager_step_checks_run_after_the_program():
    """The range checks an eager step makes (``check_step``, ``check_powers``) are deferred
    out of the compiled program and raise the same ValueError, and the state is untouched."""
    opt = hl.stiefel.momentum_sgd(1e9)
    X = jnp.asarray(np.linalg.qr(np.random.default_rng(0).standard_normal((6, 2)))[0])
    state = opt.init(X)
    G = jnp.asarray(np.random.default_rng(1).standard_normal((6, 2)))
    with pytest.raises(ValueError, match=r"rotation step lr·Z has entries up to .*1/sqrt\(eps\)"):
        opt.update(X, G, state)
    adam = hl.stiefel.adam()
    with pytest.raises(ValueError, match=r"the gradient G has entries up to .* overflow float64"):
        adam.update(X, jnp.full((6, 2), 1e307), adam.init(X))
