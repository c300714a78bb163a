"""Shared oracles and tolerances for the tests (NumPy float64 references)."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pytest
from conftest import LONG, to_numpy
from hypothesis import settings
from hypothesis import strategies as st

EPS = {np.float32: float(np.finfo(np.float32).eps), np.float64: float(np.finfo(np.float64).eps)}
EPS[np.complex64], EPS[np.complex128] = EPS[np.float32], EPS[np.float64]


def _wide(a: Any) -> np.ndarray:
    """``a`` in float64, or complex128 for complex input (the oracles' precision)."""
    a = np.asarray(a)
    return a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)


def stable_seed(*key: Any) -> int:
    """A seed from ``key`` that is the same in every process (``hash`` of a string is salted
    per process, so ``hash(name)`` seeds made tests draw other data on every run)."""
    return zlib.crc32(repr(key).encode())


def eps_of(x: Any) -> float:
    a = to_numpy(x)
    return EPS[a.dtype.type]


def reflection(v: np.ndarray) -> np.ndarray:
    """H(v) = I − 2vvᴴ/‖v‖² (vᵀ for real v), H(0) = I, built densely in float64 or complex128
    (the definition)."""
    v = _wide(v)
    n = v.shape[0]
    nv = np.vdot(v, v).real
    eye = np.eye(n, dtype=v.dtype)
    return eye if nv == 0 else eye - 2.0 * np.outer(v, v.conj()) / nv


def product_of_reflections(V: np.ndarray) -> np.ndarray:
    """H(v₁)…H(v_L) by the definition, batched over leading axes: Q ← Q·H(v_k) for k = 1…L
    from Q = I, each as the rank-one update Q − 2(Q v_k)v_kᴴ/‖v_k‖² (the dense product
    Q @ reflection(v_k) term for term, at N² instead of N³ flops per reflection)."""
    V = _wide(V)
    if V.ndim > 2:
        return np.stack([product_of_reflections(v) for v in V])
    Q = np.eye(V.shape[0], dtype=V.dtype)
    for k in range(V.shape[1]):
        v = V[:, k]
        nv = np.vdot(v, v).real
        if nv != 0:  # H(0) = I
            Q = Q - (2.0 / nv) * np.outer(Q @ v, v.conj())
    return Q


def batch_case(P: int, N: int, L: int, B: int, dtype: Any, trapezoidal: bool) -> tuple:
    """A stack of P reflector matrices V (P, N, L) (lower trapezoidal with unit diagonal on
    request, LAPACK's layout) and operands H (P, N, B), seeded by the shape: the batched
    Numba kernels' test case."""
    rng = np.random.default_rng(P + N + L)
    V = rng.standard_normal((P, N, L)).astype(dtype)
    if trapezoidal:
        V = np.tril(V, -1) + np.eye(N, L, dtype=dtype)
    return V, rng.standard_normal((P, N, B)).astype(dtype)


def per_matrix_hprod(V: np.ndarray, h: np.ndarray, **kw: Any) -> np.ndarray:
    """``hprod`` one matrix at a time (h shared when 2-D): the per-matrix Numba kernel, the
    reference for the batched ones."""
    from householderla._kernels import numba as nk

    return np.stack([nk.hprod(V[p], h if h.ndim == 2 else h[p], **kw) for p in range(len(V))])


def haar_orthogonal(rng: np.random.Generator, n: int, det: int = 1) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    q = q * np.sign(np.diag(r))
    if np.sign(np.linalg.det(q)) != det:
        q[:, 0] = -q[:, 0]
    return q


def haar_stack(n: int, dets: list, dtype: Any, seed: Any) -> np.ndarray:
    """One Haar sample per entry of ``dets``, stacked (len(dets), n, n): of O(n)
    (:func:`haar_orthogonal`: det ±1, a random one for None) or, for a complex ``dtype``, of
    U(n) (``scipy.stats.unitary_group``; its first column rescaled to the entry's determinant
    unless None). ``seed``: an int or a Generator (drawn from in place; an int seeds SciPy's
    legacy RandomState for U(n), as ``random_state`` does)."""
    if np.dtype(dtype).kind != "c":
        rng = np.random.default_rng(seed)
        return np.stack([haar_orthogonal(rng, n, d) for d in dets])
    from scipy.stats import unitary_group

    if n == 1:
        Q = np.exp(2j * np.pi * np.random.default_rng(seed).random((len(dets), 1, 1)))
    else:
        Q = unitary_group.rvs(n, size=len(dets), random_state=seed).reshape(-1, n, n)
    scale = [1.0 if d is None else d / np.linalg.det(q) for d, q in zip(dets, Q, strict=True)]
    Q[:, :, 0] *= np.asarray(scale)[:, None]
    return Q


def orth_error(Q: np.ndarray) -> float:
    """‖QᴴQ − I‖_F (max over batch), computed in float64 (complex128). Real Q takes the
    plain transpose view: a conjugated copy changes BLAS's summation order, and at ~1e-15
    that rounding is of the size of the error measured."""
    Q = _wide(Q)
    if np.iscomplexobj(Q):
        E = np.conj(np.swapaxes(Q, -1, -2)) @ Q - np.eye(Q.shape[-1])
        return float(np.max(np.sqrt(np.sum(np.abs(E) ** 2, axis=(-2, -1)))))
    E = np.swapaxes(Q, -1, -2) @ Q - np.eye(Q.shape[-1])
    return float(np.max(np.sqrt(np.sum(E * E, axis=(-2, -1)))))


def growth(V: np.ndarray) -> float:
    """‖T‖₂ for T = S⁻¹ of V (float64/complex128): the conditioning that CWY errors scale with."""
    V = _wide(V)
    nrm = np.linalg.norm(V, axis=-2, keepdims=True)
    U = np.divide(V, nrm, out=np.zeros_like(V), where=nrm > 0)
    L = V.shape[-1]
    S = 0.5 * np.eye(L) + np.triu(np.conj(np.swapaxes(U, -1, -2)) @ U, 1)
    return float(np.max(np.linalg.norm(np.linalg.inv(S), ord=2, axis=(-2, -1))))


def tol(dtype: Any, n: int, scale: float = 1.0) -> float:
    """Backward-error style tolerance: c·eps·n·scale with c = 10 (GEMM error ~ eps·n)."""
    return 10.0 * EPS[np.dtype(dtype).type] * max(n, 1) * max(scale, 1.0)


@st.composite
def reflector_shapes(draw: Any, max_n: int = 9, square: bool = False) -> dict:
    """(batch, N, L) with L ≤ N, a seed, and a mask of zero columns."""
    n = draw(st.integers(1, max_n))
    L = n if square else draw(st.integers(1, n))
    batch = draw(st.sampled_from([(), (2,), (2, 1)]))
    seed = draw(st.integers(0, 2**31 - 1))
    zeros = draw(st.lists(st.booleans(), min_size=L, max_size=L))
    return {"batch": batch, "n": n, "L": L, "seed": seed, "zeros": zeros}


def examples(n: int) -> settings:
    """``settings(max_examples=n)``, four times more under ``make test-long`` (as its profile),
    and the profile's own count under ``make fuzz`` (thousands)."""
    if settings.default.max_examples > 4 * n:  # the fuzz profile is loaded
        return settings(max_examples=settings.default.max_examples)
    return settings(max_examples=4 * n if LONG else n)


def ci_examples(n: int) -> settings:
    """``settings(max_examples=n)`` under ``make test`` (the "ci" profile, whose default is
    25): for a property test whose drawn cases repeat one path, on every backend (JAX then
    runs ``conftest.jax_examples(n)`` of them); the loaded profile's own count otherwise
    (``make test-long``'s 100, ``make fuzz``'s thousands), as without it."""
    current = settings.default.max_examples
    if LONG or current != settings.get_profile("ci").max_examples:
        return settings(max_examples=current)
    return settings(max_examples=n)


def few_shapes(bk: Any, drawn: Any, few: list, seed: int) -> Any:
    """The shape a property test runs on ``bk``: as drawn, except on a backend that compiles
    every new shape (JAX; not under ``make test-long``), where it is one of the ``few`` fixed
    shapes, picked by ``seed``: the compilations are then shared by the examples (and by the
    tests that use the same shapes) instead of paid again for each example."""
    return few[seed % len(few)] if bk.compiles and not LONG else drawn


#: (batch, n, L) for reflector specs on JAX: L = n = 1, tall, square with two batch axes
FEW_REFLECTOR_SHAPES = [((), 1, 1), ((), 6, 4), ((2, 1), 5, 5)]


def fit_reflector_spec(bk: Any, spec: dict) -> dict:
    """A :func:`reflector_shapes` spec as backend ``bk`` runs it: shapes from
    ``FEW_REFLECTOR_SHAPES`` on JAX (:func:`few_shapes`, with a zero-column mask from the seed),
    unbatched on dask (a Dask operand is never broadcast against a batched operator)."""
    spec = dict(spec)
    batch, n, L = few_shapes(
        bk, (spec["batch"], spec["n"], spec["L"]), FEW_REFLECTOR_SHAPES, spec["seed"]
    )
    if L != spec["L"]:
        spec["zeros"] = [bool((spec["seed"] >> (k + 3)) & 1) for k in range(L)]
    spec.update(batch=() if bk.operand_only else batch, n=n, L=L)
    return spec


def make_V(spec: dict, with_zeros: bool = True) -> np.ndarray:
    rng = np.random.default_rng(spec["seed"])
    V = rng.standard_normal(spec["batch"] + (spec["n"], spec["L"]))
    if with_zeros:
        V[..., np.asarray(spec["zeros"], dtype=bool)] = 0.0
    return V


EPS_FD = 1e-6


def _draw(rng: np.random.Generator, shape: tuple, complex_: bool) -> np.ndarray:
    """Standard normal draws, complex (independent real and imaginary parts) on request."""
    x = rng.standard_normal(shape)
    return x + 1j * rng.standard_normal(shape) if complex_ else x


def _rdot(a: np.ndarray, b: np.ndarray) -> float:
    """Re Σ conj(a)·b: the real inner product (Σ a·b for real arrays)."""
    return float(np.sum(np.real(np.conj(a) * b)))


def assert_vjp_matches_central_differences(bk, f, vjp, inputs, rng, freeze=None):
    """The dot-product test of a VJP, on backend ``bk``, in float64; returns the gradients.

    For a random cotangent g and random directions δ (``freeze(dirs)`` may zero entries that
    must stay fixed, e.g. a zero reflector), (⟨g, f(x + εδ)⟩ − ⟨g, f(x − εδ)⟩)/2ε must equal
    Σ⟨vjp(g), δ⟩. With ε = 1e-6 the truncation O(ε²) and rounding O(eps/ε) errors are ≲ 1e-9
    relative to Σ‖vjp‖‖δ‖; the bound is 1e-7, while a wrong term is off by O(1).

    Complex inputs (complex128) get complex directions, and complex outputs a complex
    cotangent; every pairing is then the real inner product Re Σ conj(a)·b, for which the
    library's VJPs are adjoints (cotangent ∂L/∂Re + i ∂L/∂Im, docs/theory/complex.rst).
    """
    dt = [np.complex128 if np.iscomplexobj(a) else np.float64 for a in inputs]
    args = [bk.asarray(a, t) for a, t in zip(inputs, dt, strict=True)]
    y = to_numpy(bk.call(f, *args))
    g = _draw(rng, y.shape, np.iscomplexobj(y))
    out = bk.call(vjp, *args, bk.asarray(g, g.dtype))
    grads = [to_numpy(a) for a in (out if isinstance(out, tuple) else (out,))]
    assert len(grads) == len(inputs)
    for gr, a in zip(grads, inputs, strict=True):
        assert gr.shape == np.shape(a) and np.all(np.isfinite(gr))
        assert np.iscomplexobj(gr) == np.iscomplexobj(a), "the cotangent has its input's kind"
    dirs = [_draw(rng, np.shape(a), t == np.complex128) for a, t in zip(inputs, dt, strict=True)]
    if freeze is not None:
        freeze(dirs)
    plus = [bk.asarray(a + EPS_FD * d, t) for a, d, t in zip(inputs, dirs, dt, strict=True)]
    minus = [bk.asarray(a - EPS_FD * d, t) for a, d, t in zip(inputs, dirs, dt, strict=True)]
    fp, fm = to_numpy(bk.call(f, *plus)), to_numpy(bk.call(f, *minus))
    fd = (_rdot(g, fp) - _rdot(g, fm)) / (2 * EPS_FD)
    pairs = list(zip(grads, dirs, strict=True))
    an = sum(_rdot(gr, d) for gr, d in pairs)
    scale = sum(float(np.linalg.norm(gr) * np.linalg.norm(d)) for gr, d in pairs)
    assert abs(fd - an) <= 1e-7 * max(scale, 1.0), (fd, an)
    return grads


def assert_jax_grad_matches_real_and_imaginary_differences(loss, args, grads, rng):
    """``grads`` (``jax.grad`` of the real ``loss`` at the complex ``args``) is JAX's
    ∂L/∂Re − i ∂L/∂Im: its pairing Re Σ grad·δ with a real δ and with an imaginary iδ must
    equal the central differences of ``loss`` along each. ε = 1e-6 in complex128: accurate to
    ~1e-9 relative; the bound is 1e-7, while a missing conjugation flips the sign of the
    imaginary-direction derivative (an O(1) error)."""
    import jax.numpy as jnp

    for i, a in enumerate(args):
        d = rng.standard_normal(np.shape(a))
        for direction in (d + 0j, 1j * d):
            plus, minus = list(args), list(args)
            plus[i], minus[i] = a + EPS_FD * direction, a - EPS_FD * direction
            fd = float(loss(*map(jnp.asarray, plus))) - float(loss(*map(jnp.asarray, minus)))
            fd /= 2 * EPS_FD
            an = float(np.real(np.sum(np.asarray(grads[i]) * direction)))
            scale = np.linalg.norm(np.asarray(grads[i])) * np.linalg.norm(d)
            assert abs(fd - an) <= 1e-7 * max(scale, 1.0), (i, direction.dtype, fd, an)


def jax_once_each(outer: list, inner: list, outer_ids: list[str], inner_ids: list[str]) -> list:
    """Every case (o, i) of two parameters, as ``pytest.param(o, i, id="<o>-<i>")``. On JAX
    (each case compiles anew) `make test` runs one case per value of ``outer``, with ``inner``
    cycling through its values (so every value of both runs there); the other cases are
    marked ``jax_long``. The other backends run every case."""
    return [
        pytest.param(
            o,
            i,
            id=f"{oid}-{iid}",
            marks=() if b == a % len(inner) else pytest.mark.jax_long("each value once on JAX"),
        )
        for a, (o, oid) in enumerate(zip(outer, outer_ids, strict=True))
        for b, (i, iid) in enumerate(zip(inner, inner_ids, strict=True))
    ]


# -- half precision (bfloat16, float16): the dtypes, exact values, one rounding ---------------

HALF = ("bfloat16", "float16")
EPS_HALF = {"bfloat16": 2.0**-7, "float16": 2.0**-10}


def half_dtype(bk, name):
    """The backend's dtype called ``name``, or a skip naming why there is none."""
    if bk.name == "array_api_strict":
        pytest.skip("array-api-strict has no half-precision dtype")
    if bk.name.startswith("numpy") and name == "bfloat16":
        pytest.skip("NumPy has no bfloat16")
    dtype = getattr(bk.xp, name, None)
    if dtype is None:  # CuPy: no cupy.bfloat16 (CuPy 14 reads ml_dtypes.bfloat16 arrays only)
        pytest.skip(f"{bk.name} has no {name} dtype in its namespace")
    return dtype


def as_half(bk, a, name):
    """``a`` (float64 NumPy) rounded to the half dtype ``name`` as a ``bk`` array."""
    if name == "float16":
        return bk.asarray(a, np.float16)
    return bk.xp.astype(bk.asarray(a, np.float32), half_dtype(bk, name))


def f64(x):
    """The exact values of an array of any dtype (bfloat16 included) as float64 NumPy."""
    if hasattr(x, "detach"):
        return x.detach().double().cpu().numpy()  # exact for every real dtype
    return np.asarray(to_numpy(x.astype("float32") if "bfloat16" in str(x.dtype) else x), float)


def round_like(bk, a, name):
    """float64 ``a`` rounded to the half dtype (once, to nearest), back in float64."""
    return f64(bk.xp.astype(bk.asarray(a), half_dtype(bk, name)))


def orth(Q):
    """‖QᵀQ − I‖_F, or ‖QQᵀ − I‖_F for a wide Q."""
    return orth_error(np.swapaxes(Q, -1, -2) if Q.shape[-1] > Q.shape[-2] else Q)


# -- complex draws and the complex Brockett cost (shared by the complex tests) ---------------


def crandn(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Complex standard normal entries: real and imaginary parts each N(0, 1), drawn in turn."""
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


def cstiefel(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """A point of the complex Stiefel manifold: the Q of a complex normal matrix's QR."""
    return np.linalg.qr(crandn(rng, *shape))[0]


def hermitian(rng: np.random.Generator, n: int) -> np.ndarray:
    """A random Hermitian n × n matrix (B + Bᴴ)/(2√n), B complex normal."""
    B = crandn(rng, n, n)
    return (B + B.conj().T) / (2 * np.sqrt(n))


def brockett(A: np.ndarray, D: np.ndarray) -> tuple:
    """f(X) = −Re tr(XᴴAXD) and its gradient G = ∂f/∂Re X + i ∂f/∂Im X = −2AXD (A Hermitian,
    D real diagonal), with the optimum −Σ dᵢλᵢ."""
    lam = np.linalg.eigvalsh(A)[::-1][: D.shape[0]]

    def f(X):
        return float(-np.trace(X.conj().swapaxes(-1, -2) @ A @ X @ D).real)

    return f, (lambda X: -2 * A @ X @ D), float(-lam @ np.diag(D))
