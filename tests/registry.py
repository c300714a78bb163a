"""The registry of the differentiable maps: one entry per map and per variant that takes its
own code path, with what it supports and the inputs a test draws for it.

Each :class:`Entry` names the public forward map, its explicit VJP (``hl.vjp`` or the
module's own), how to draw its inputs (real float64 or complex128, the precisions central
differences need), which directions a dot-product test must hold fixed (a zero reflector, the
part of a trapezoid that is not a parameter) and what the map supports (``kinds``, ``half``,
``dask``). ``tests/test_vjp.py`` runs the one dot-product test over every (entry, kind) pair
on every backend, and checks the support columns: half precision accepted (bfloat16
cotangents) or refused with the error that lists what takes it; Dask operands refused;
forward mode (the JVP against the VJP by the same dot-product identity) or its error.

``neutral`` marks a variant that differs from another entry only in its batch shape, on code
that does not depend on the backend (the batch axes are broadcast by the same Array API
expressions): it runs on NumPy in ``make test`` and on every backend in ``make test-long``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import householderla as hl
from householderla._agnostic import trapezoidal as _structured
from householderla._lib.linalg import sum_to_shape
from householderla.ornn import ornn, ornn_apply_vjp, ornn_matrix_vjp
from householderla.svd import (
    bounded_sigma,
    bounded_sigma_vjp,
    svd_householder,
    svd_householder_apply_vjp,
    svd_householder_matrix_vjp,
)

REAL, COMPLEX = "real", "complex"


@dataclass(frozen=True)
class Entry:
    """One differentiable map (or variant) and what it supports.

    ``make(bk)`` returns ``(forward, vjp)`` for backend ``bk``: ``vjp(*inputs, g)`` returns
    one cotangent per input. ``draw(rng, cx)`` returns the inputs as NumPy arrays (complex
    where ``cx`` and the input is complex for that kind). ``freeze(dirs)`` zeroes the entries
    of the directions that must stay fixed; ``check(grads)`` asserts what the cotangents
    must be exactly (0 for a zero reflector, say)."""

    name: str
    make: Callable[[Any], tuple[Callable, Callable]]
    draw: Callable[[np.random.Generator, bool], list[np.ndarray]]
    kinds: tuple[str, ...] = (REAL, COMPLEX)
    freeze: Callable[[list[np.ndarray]], None] | None = None
    check: Callable[[list[np.ndarray]], None] | None = None
    neutral: bool = False
    #: bfloat16/float16 inputs accepted (the VJP returns cotangents in that dtype)
    half: bool = True
    #: Dask operands accepted (no VJP takes them: they raise, naming the mixed namespaces)
    dask: bool = False
    #: forward mode (torch.func.jvp, jacfwd, forward-AD dual tensors; jax.jvp, jacfwd)
    forward: bool = True
    #: run under these test-time patches (a monkeypatch callable), e.g. the blocked kernels
    patch: Callable[[Any], None] | None = None
    #: frameworks ("jax", "torch", or a backend name) where the entry's path does not exist
    not_on: tuple[str, ...] = ()


def randn(rng: np.random.Generator, cx: bool, *shape: int) -> np.ndarray:
    """Standard normal entries, complex (real and imaginary parts each N(0, 1)) when ``cx``."""
    a = rng.standard_normal(shape)
    return a + 1j * rng.standard_normal(shape) if cx else a


def _fixed(f: Callable, vjp: Callable) -> Callable[[Any], tuple[Callable, Callable]]:
    return lambda bk: (f, vjp)


def _zero_column(j: int) -> tuple[Callable, Callable]:
    """A zero reflector in column ``j`` of the first input: held fixed (H(v) is not
    differentiable at v = 0, where H(0) = I by definition) and its cotangent exactly 0."""

    def freeze(dirs: list[np.ndarray]) -> None:
        dirs[0][..., j] = 0.0

    def check(grads: list[np.ndarray]) -> None:
        np.testing.assert_array_equal(grads[0][..., j], 0.0)

    return freeze, check


# -- compact WY, T-CWY and the Householder products (real and complex) ---------------------------

N, L = 6, 4


def _cwy_family() -> list[Entry]:
    freeze, check = _zero_column(1)
    maps = {
        "cwy_apply": (lambda V, h: hl.cwy(V) @ h, hl.vjp.cwy_apply, [(N, 3)]),
        "cwy_apply_vector": (lambda V, h: hl.cwy(V) @ h, hl.vjp.cwy_apply, [(N,)]),
        "cwy_adjoint_apply": (lambda V, h: hl.cwy(V).H @ h, hl.vjp.cwy_transpose_apply, [(N, 2)]),
        "cwy_matrix": (lambda V: hl.cwy(V).matrix(), hl.vjp.cwy_matrix, []),
        "tcwy_apply": (lambda V, x: hl.tcwy(V) @ x, hl.vjp.tcwy_apply, [(L, 2)]),
        "tcwy_adjoint_apply": (
            lambda V, y: hl.tcwy(V).H @ y,
            hl.vjp.tcwy_transpose_apply,
            [(N, 3)],
        ),
        "tcwy_matrix": (lambda V: hl.tcwy(V).matrix(), hl.vjp.tcwy_matrix, []),
        "householder_apply": (hl.householder_apply, hl.vjp.householder_apply, [(N, 2)]),
        "householder_product": (hl.householder_product, hl.vjp.householder_product, []),
    }
    out = []
    for name, (f, vjp, others) in maps.items():
        for batch in ((2,), ()):

            def draw(rng, cx, batch=batch, others=others):
                V = randn(rng, cx, *batch, N, L)
                V[..., 1] = 0.0
                return [V] + [randn(rng, cx, *s) for s in others]

            out.append(
                Entry(
                    name if batch else f"{name}_unbatched",
                    _fixed(f, vjp),
                    draw,
                    freeze=freeze,
                    check=check,
                    neutral=not batch,
                )
            )
    return out


# -- the phased unitary maps (theta=): complex V and operands, real θ ------------------------


def _phased() -> list[Entry]:
    c, r, B = True, False, 2
    maps = {
        "cwy_apply": (
            lambda V, h, t: hl.cwy(V, theta=t) @ h,
            lambda V, h, t, g: hl.vjp.cwy_apply(V, h, g, theta=t),
            [(c, (N, B)), (r, (N,))],
        ),
        "cwy_apply_batched_theta": (
            lambda V, h, t: hl.cwy(V, theta=t) @ h,
            lambda V, h, t, g: hl.vjp.cwy_apply(V, h, g, theta=t),
            [(c, (N, B)), (r, (3, N))],
        ),
        "cwy_adjoint_apply": (
            lambda V, h, t: hl.cwy(V, theta=t).H @ h,
            lambda V, h, t, g: hl.vjp.cwy_transpose_apply(V, h, g, theta=t),
            [(c, (N, B)), (r, (N,))],
        ),
        "cwy_matrix": (
            lambda V, t: hl.cwy(V, theta=t).matrix(),
            lambda V, t, g: hl.vjp.cwy_matrix(V, g, theta=t),
            [(r, (N,))],
        ),
        "tcwy_apply": (
            lambda V, x, t: hl.tcwy(V, theta=t) @ x,
            lambda V, x, t, g: hl.vjp.tcwy_apply(V, x, g, theta=t),
            [(c, (L, B)), (r, (L,))],
        ),
        "tcwy_adjoint_apply": (
            lambda V, y, t: hl.tcwy(V, theta=t).H @ y,
            lambda V, y, t, g: hl.vjp.tcwy_transpose_apply(V, y, g, theta=t),
            [(c, (N, B)), (r, (L,))],
        ),
        "tcwy_matrix": (
            lambda V, t: hl.tcwy(V, theta=t).matrix(),
            lambda V, t, g: hl.vjp.tcwy_matrix(V, g, theta=t),
            [(r, (L,))],
        ),
        "ornn_apply": (
            lambda U, h, t: hl.ornn(U, theta=t) @ h,
            lambda U, h, t, g: hl.vjp.ornn_apply(U, 1, h, g, theta=t),
            [(c, (N, B)), (r, (N,))],
        ),
        "ornn_matrix": (
            lambda U, t: hl.ornn(U, theta=t).matrix(),
            lambda U, t, g: hl.vjp.ornn_matrix(U, 1, g, theta=t),
            [(r, (N,))],
        ),
        "svd_apply": (
            lambda U, s, V, x, t: hl.svd_householder(U, s, V, theta=t) @ x,
            lambda U, s, V, x, t, g: hl.vjp.svd_householder_apply(U, s, V, x, g, theta=t),
            [(r, (L,)), (c, (L, 3)), (c, (L, B)), (r, (L,))],
        ),
        "svd_matrix": (
            lambda U, s, V, t: hl.svd_householder(U, s, V, theta=t).matrix(),
            lambda U, s, V, t, g: hl.vjp.svd_householder_matrix(U, s, V, g, theta=t),
            [(r, (L,)), (c, (L, 3)), (r, (L,))],
        ),
    }
    out = []
    for name, (f, vjp, others) in maps.items():
        trapezoid = name.startswith("ornn")

        def draw(rng, cx, others=others, trapezoid=trapezoid):
            V = np.tril(randn(rng, True, N, N - 1)) if trapezoid else randn(rng, True, N, L)
            return [V] + [randn(rng, cx and is_c, *s) for is_c, s in others]

        def freeze(dirs, trapezoid=trapezoid):
            if trapezoid:
                dirs[0] = np.tril(dirs[0])  # entries above the diagonal are not parameters

        def check(grads):
            assert np.max(np.abs(grads[-1])) > 1e-3, "θ̄ is not vacuous"

        out.append(
            Entry(
                f"{name}_theta",
                _fixed(f, vjp),
                draw,
                kinds=(COMPLEX,),
                freeze=freeze,
                check=check,
                half=False,
            )
        )
    return out


# -- oRNN's structured product (real; Mhammedi et al., ICML 2017, eq. 6-8) ------------------------


def _force_blocked(mp: Any, block: int = 2) -> None:
    """Run oRNN's blocked kernels at test sizes: blocks of ``block`` columns, always on."""
    mp.setattr(_structured, "BLOCK", block)
    mp.setattr(_structured, "use_structured", lambda *shape: True)
    mp.setattr(_structured, "use_structured_vjp", lambda *shape: True)


def _ornn() -> list[Entry]:
    n, m = 6, 5

    def freeze(dirs):
        dirs[0][..., 2] = 0.0
        dirs[0][...] = np.tril(dirs[0])  # with respect to the trapezoid only

    def check(grads):
        np.testing.assert_array_equal(grads[0][..., 2], 0.0)
        np.testing.assert_array_equal(np.triu(grads[0], 1), 0.0)

    def make(form, sign):
        def build(bk):
            s = bk.asarray(np.array([1.0, -1.0])) if sign == "array" else sign
            if form == "matrix":
                return lambda U: ornn(U, s).matrix(), lambda U, G: ornn_matrix_vjp(U, s, G)
            return lambda U, h: ornn(U, s) @ h, lambda U, h, g: ornn_apply_vjp(U, s, h, g)

        return build

    out = []
    for form, others in (("apply", [(n, 3)]), ("apply_vector", [(n,)]), ("matrix", [])):
        for sign in (1, -1, "array"):
            batch = (2,) if sign == "array" else ()

            def draw(rng, cx, batch=batch, others=others):
                U = np.tril(rng.standard_normal(batch + (n, m)))
                U[..., 2] = 0.0  # a zero reflector: held fixed, gradient exactly 0
                return [U] + [rng.standard_normal(s) for s in others]

            for blocked in (False, True):
                out.append(
                    Entry(
                        f"ornn_{form}_sign{sign}" + ("_blocked" if blocked else ""),
                        make(form, sign),
                        draw,
                        kinds=(REAL,),
                        freeze=freeze,
                        check=check,
                        patch=_force_blocked if blocked else None,
                        # JAX never takes the blocked kernels: there it is the unblocked case
                        not_on=("jax",) if blocked else (),
                        half=False,
                    )
                )
    return out


# -- SVD-Householder (real; Zhang, Lei and Dhillon, ICML 2018, eq. 15) ----------------------------

#: (m, n, k₁, k₂) covering every way a side is applied: square (r = N), T-CWY (k = r < N),
#: padded (k ≠ r < N, including k = N) and identity (k = 0)
SVD_SHAPES = [
    (4, 4, 4, 4),
    (4, 4, 3, 0),
    (5, 3, 3, 2),
    (5, 3, 2, 3),
    (5, 3, 5, 3),
    (3, 5, 3, 3),
    (3, 5, 2, 4),
    (3, 5, 0, 0),
]
SVD_CASES = [(s, f) for s in SVD_SHAPES for f in ("apply", "matrix")] + [
    ((5, 3, 3, 2), "apply_vector"),
    ((3, 5, 2, 4), "apply_vector"),
]


def _svd_matrix(U, s, V):
    return svd_householder(U, s, V).matrix()


def svd_vjp_inputs(m: int, n: int, k1: int, k2: int, rng: np.random.Generator) -> tuple:
    """(U, σ, V) of an SVD-Householder map (batch 2) with a zero reflector on each side that
    has one to spare (zero gradient, held fixed by the entry's ``freeze``)."""
    U = rng.standard_normal((2, m, k1))
    V = rng.standard_normal((2, n, k2))
    if k1 > 1:
        U[..., 1] = 0.0
    if k2 > 0:
        V[..., 0] = 0.0
    s = rng.standard_normal(min(m, n))  # broadcast against the batch of U and V
    return U, s, V


def _svd() -> list[Entry]:
    out = []
    for i, ((m, n, k1, k2), form) in enumerate(SVD_CASES):

        def draw(rng, cx, m=m, n=n, k1=k1, k2=k2, form=form):
            U, s, V = svd_vjp_inputs(m, n, k1, k2, rng)
            if form == "matrix":
                return [U, s, V]
            return [U, s, V, rng.standard_normal((n,) if form == "apply_vector" else (n, 3))]

        def freeze(dirs, k1=k1, k2=k2):
            if k1 > 1:
                dirs[0][..., 1] = 0.0
            if k2 > 0:
                dirs[2][..., 0] = 0.0

        def check(grads, k1=k1, k2=k2):
            if k1 > 1:
                np.testing.assert_array_equal(grads[0][..., 1], 0.0)
            if k2 > 0:
                np.testing.assert_array_equal(grads[2][..., 0], 0.0)

        if form == "matrix":
            fv = _fixed(_svd_matrix, svd_householder_matrix_vjp)
        else:
            fv = _fixed(lambda U, s, V, x: svd_householder(U, s, V) @ x, svd_householder_apply_vjp)
        out.append(
            Entry(
                f"svd_{form}_{m}x{n}_k{k1}_{k2}",
                fv,
                draw,
                kinds=(REAL,),
                freeze=freeze,
                check=check,
                # every shape in one form on NumPy only here: each shape's other form runs
                # on every backend (the side-application code is the same for both forms)
                neutral=bool(i % 2),
                half=False,
            )
        )
    return out


def _bounded_sigma() -> list[Entry]:
    def make_arrays(bk):
        def vjp(s, c, r, g):
            t = bk.xp.tanh(0.5 * s)
            return (
                bounded_sigma_vjp(s, c, r, g),
                sum_to_shape(g, tuple(c.shape), bk.xp),
                sum_to_shape(g * t, tuple(r.shape), bk.xp),
            )

        return bounded_sigma, vjp

    return [
        Entry(
            "bounded_sigma",
            _fixed(
                lambda s: bounded_sigma(s, 1.0, 0.2), lambda s, g: bounded_sigma_vjp(s, 1.0, 0.2, g)
            ),
            lambda rng, cx: [rng.standard_normal((2, 4)) * 3],
            kinds=(REAL,),
            half=False,
        ),
        # per-entry σ*, r broadcast against ŝ: the cotangents documented for them (Σ g and
        # Σ g·tanh(ŝ/2)) pass the same test
        Entry(
            "bounded_sigma_array_center_radius",
            make_arrays,
            lambda rng, cx: [
                rng.standard_normal((2, 4)) * 3,
                rng.uniform(0.5, 1.5, (4,)),
                rng.uniform(0.1, 0.5, (1, 4)),
            ],
            kinds=(REAL,),
            half=False,
        ),
    ]


# -- the retractions (real and complex; the step real) -------------------------------------------

#: a step per matrix of the batch (2,): its cotangent is real, one per matrix
STEPS = np.array([0.3, -0.2])


def _retractions() -> list[Entry]:
    maps = {
        "polar": (hl.polar, hl.vjp.polar),
        "polar_retraction": (hl.polar_retraction, hl.vjp.polar_retraction),
        # the VJP is of the SMW map: the drift guard (a cleanup off the manifold, where the
        # differences step) is switched off
        "cayley_retraction": (
            lambda X, Z, t: hl.cayley_retraction(X, Z, t, drift_tol=float("inf")),
            hl.vjp.cayley_retraction,
        ),
        "qr_retraction": (hl.qr_retraction, hl.vjp.qr_retraction),
    }
    out = []
    for name, (f, vjp) in maps.items():
        variants = [((2,), "array"), ((), "scalar"), ((2,), "scalar")]
        for batch, step in variants[:2] if name == "polar" else variants:

            def draw(rng, cx, name=name, batch=batch, step=step):
                N, M = 6, 3
                X = np.linalg.qr(randn(rng, cx, *batch, N, M))[0]
                # off the manifold: the maps are defined there
                X = X + 0.2 * randn(rng, cx, *X.shape)
                if name == "polar":
                    return [X]
                t = STEPS if step == "array" else rng.uniform(0.2, 0.8, ())
                return [X, randn(rng, cx, *X.shape), t]

            label = {"array": "", "scalar": "_scalar_step"}[step] if name != "polar" else ""
            unbatched = "" if batch else "_unbatched"
            out.append(
                Entry(
                    f"{name}{label}{unbatched}",
                    _fixed(f, vjp),
                    draw,
                    # the unbatched case and the batch with one step are the batched
                    # array-step case's code with other broadcasting: NumPy only here
                    neutral=not batch or (step == "scalar" and name != "polar"),
                    kinds=(REAL, COMPLEX) if batch else (REAL,),
                )
            )
    return out


ENTRIES: dict[str, Entry] = {
    e.name: e
    for e in _cwy_family() + _phased() + _ornn() + _svd() + _bounded_sigma() + _retractions()
}
