"""The JAX rule table: ``jax.custom_jvp`` rules (signatures in :mod:`householderla._autodiff`)
for ``cwy_factors``, ``lowrank_apply`` / ``lowrank_matrix``, ``householder_apply``, ``polar``,
``cayley_smw`` and ``qr_q``, static arguments in ``nondiff_argnums``. Each returns
(f(x), explicit_linear(jvp, vjp, residuals, ẋ)) (:mod:`._jax_linear`): ``jax.jvp`` runs the
hand-derived JVP, ``jax.grad`` the explicit VJP, and their derivatives are plain jnp, so every
order and ``vmap`` compose (why not ``custom_vjp`` or ``linear_call``: ``docs/theory/vjp.rst``,
"Forward mode"). Traced under ``jax.default_matmul_precision("highest")``. JAX's cotangent of
a complex value is the conjugate of ours: each VJP conjugates in and out (:func:`_jax_ct`).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from .._agnostic import compact_wy as K
from .._agnostic import compact_wy_jvp as KJ
from .._agnostic import retraction as RK
from .._agnostic.newton_schulz import polar_backward, polar_forward
from .._agnostic.reflections import householder_apply_vjp, reflect_all
from .._lib.linalg import sum_to_shape
from .._lib.namespace import accumulation_dtype_for, conj, real_dtype
from .._lib.tracing import is_eager
from ._jax_linear import explicit_linear

#: Matmul precision every rule is traced with (``jax.default_matmul_precision`` name).
PRECISION = "highest"


def _highest(fn: Any) -> Any:
    """``fn`` traced/run under full-precision matmuls (see the module docstring)."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with jax.default_matmul_precision(PRECISION):
            return fn(*args, **kwargs)

    return wrapped


def _j(*arrays: Any) -> Any:
    """JAX hands custom rules NumPy arrays and literals too: make them jax arrays."""
    return tuple(None if a is None else jnp.asarray(a) for a in arrays)


def _jax_ct(*cts: Any) -> tuple[Any, ...]:
    """Cotangents between JAX's convention and ours (torch's): complex conjugation, which is
    its own inverse; real and None cotangents pass unchanged (module docstring)."""
    return tuple(None if c is None else conj(c, jnp) for c in cts)


def _tangent(jvp: Any, vjp: Any, residuals: tuple, tangents: tuple, outputs: tuple) -> list:
    """The tangents of ``outputs``: ``jvp(*residuals, *tangents)``, transposed by ``vjp``."""
    avals = tuple(jax.typeof(o).update(weak_type=False) for o in outputs)
    return explicit_linear(jvp, vjp, residuals, _j(*tangents), avals)


# -- compact WY ---------------------------------------------------------------------------


@_highest
def _factors_jvp(U: Any, T: Any, r: Any, dV: Any) -> tuple[Any, Any, Any]:
    """(dU, dT, dr) along dV at the factors (U, T, r)."""
    return KJ.factor_tangents(U, T, r, dV, jnp)


@_highest
def _factors_vjp(U: Any, T: Any, r: Any, U_bar: Any, T_bar: Any, r_bar: Any) -> tuple[Any]:
    """V̄ from (Ū, T̄, r̄): r stays a residual (∂‖v‖/∂v = u) so that a second derivative
    sees how the 1/‖v‖ of the normalisation backward depends on V."""
    U_bar, T_bar, r_bar = _jax_ct(U_bar, T_bar, r_bar)
    V_bar = K.factors_vjp(U, r, U_bar, K.s_bar_from_t_bar(T, T_bar, jnp), jnp) + U * r_bar
    return _jax_ct(V_bar)


@jax.custom_jvp
@_highest
def _cwy_factors(V: Any) -> tuple[Any, Any, Any]:
    """V ↦ (U, T, r): unit columns, T = S⁻¹ and the column norms (∂‖v‖/∂v = u)."""
    return K.cwy_factors(*_j(V), jnp, check=False)


@_cwy_factors.defjvp
@_highest
def _cwy_factors_rule(primals: tuple, tangents: tuple) -> tuple[Any, Any]:
    out = _cwy_factors(*primals)
    return out, tuple(_tangent(_factors_jvp, _factors_vjp, out, tangents, out))


@jax.custom_jvp
@_highest
def _cwy_factors_diag(V: Any, sdiag: Any) -> tuple[Any, Any, Any]:
    """(V, sdiag) ↦ (U, T, r) with S = diag(sdiag) + striu(UᴴU); sdiag is a constant."""
    V, sdiag = _j(V, sdiag)
    return K.cwy_factors(V, jnp, check=False, sdiag=sdiag)


@_cwy_factors_diag.defjvp
@_highest
def _cwy_factors_diag_rule(primals: tuple, tangents: tuple) -> tuple[Any, Any]:
    out = _cwy_factors_diag(*primals)  # sdiag's tangent is dropped: only striu(UᴴU) moves
    return out, tuple(_tangent(_factors_jvp, _factors_vjp, out, tangents[:1], out))


@functools.cache
def _lowrank_pair(transpose: bool, mode: str, out: Any, apply: bool) -> tuple[Any, Any]:
    """(jvp, vjp) of the low-rank apply (``apply``: of h; else the dense matrix rounded to
    ``out``), one pair per static configuration so JAX reuses its traces."""

    @_highest
    def jvp(U: Any, T: Any, *rest: Any) -> tuple[Any]:
        h, dU, dT, dh = rest if apply else (None, *rest, None)
        dy = KJ.lowrank_jvp(U, T, h, dU, dT, dh, jnp, transpose=transpose, mode=mode)
        dtype = h.dtype if apply else (U.dtype if out is None else out)
        return (dy if dy.dtype == dtype else dy.astype(dtype),)

    @_highest
    def vjp(U: Any, T: Any, *rest: Any) -> tuple[Any, ...]:
        h, g = rest if apply else (None, *rest)
        (g,) = _jax_ct(g)
        # not fused: concatenating h and g along a sharded batch axis would move them between
        # devices (collective-permute) under jax.jit with NamedSharding
        U_bar, h_bar, T_bar, _ = K.lowrank_vjp(
            U, T, h, g, jnp, transpose=transpose, mode=mode, fuse=False
        )
        return _jax_ct(U_bar, T_bar, h_bar) if apply else _jax_ct(U_bar, T_bar)

    return jvp, vjp


@functools.partial(jax.custom_jvp, nondiff_argnums=(3, 4))
@_highest
def _lowrank_apply(U: Any, T: Any, h: Any, transpose: bool, mode: str) -> Any:
    """R(h) − U_out M U_inᵀ h."""
    U, T, h = _j(U, T, h)
    return K.lowrank_apply(U, T, h, jnp, transpose=transpose, mode=mode)


@_lowrank_apply.defjvp
@_highest
def _lowrank_apply_rule(transpose: bool, mode: str, primals: tuple, tangents: tuple) -> Any:
    primals = _j(*primals)
    y = _lowrank_apply(*primals, transpose, mode)
    jvp, vjp = _lowrank_pair(transpose, mode, None, True)
    return y, _tangent(jvp, vjp, primals, tangents, (y,))[0]


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4))
@_highest
def _lowrank_matrix(U: Any, T: Any, transpose: bool, mode: str, out: Any) -> Any:
    """The dense matrix R(I) − U_out M U_inᵀ (rounded once to ``out`` unless None)."""
    U, T = _j(U, T)
    return K.lowrank_apply(U, T, None, jnp, transpose=transpose, mode=mode, out=out)


@_lowrank_matrix.defjvp
@_highest
def _lowrank_matrix_rule(
    transpose: bool, mode: str, out: Any, primals: tuple, tangents: tuple
) -> Any:
    primals = _j(*primals)
    y = _lowrank_matrix(*primals, transpose, mode, out)
    jvp, vjp = _lowrank_pair(transpose, mode, out, False)
    return y, _tangent(jvp, vjp, primals, tangents, (y,))[0]


# -- sequential Householder products -----------------------------------------------------------


@_highest
def _householder_jvp(V: Any, h: Any, dV: Any, dh: Any) -> tuple[Any]:
    """The product is the compact WY map (Likhosherstov et al., AISTATS 2021, Theorem 2):
    the tangent of its factors and of the low-rank apply."""
    U, T, r = K.cwy_factors(V, jnp, check=False)
    dU, dT, _ = KJ.factor_tangents(U, T, r, dV, jnp)
    return (KJ.lowrank_jvp(U, T, h, dU, dT, dh, jnp, transpose=False, mode="square"),)


@_highest
def _householder_vjp(V: Any, h: Any, g: Any) -> tuple[Any, Any]:
    return _jax_ct(*householder_apply_vjp(V, h, *_jax_ct(g), jnp))


@jax.custom_jvp
@_highest
def _householder_apply(V: Any, h: Any) -> Any:
    """H(v₁)(H(v₂)(…H(v_L) h)) for h (..., N, B)."""
    V, h = _j(V, h)
    return reflect_all(K.normalize_columns(V, jnp)[0], h, jnp)


@_householder_apply.defjvp
@_highest
def _householder_apply_rule(primals: tuple, tangents: tuple) -> Any:
    primals = _j(*primals)
    y = _householder_apply(*primals)
    return y, _tangent(_householder_jvp, _householder_vjp, primals, tangents, (y,))[0]


# -- retractions -------------------------------------------------------------------------


class InfoBox:
    """Receives :func:`polar`'s Python-valued diagnostics (hashable by identity, so it can be
    a ``nondiff_argnums`` value); the traced ``certified`` flag is an output instead."""

    def __init__(self) -> None:
        self.info: dict[str, Any] = {}


@_highest
def _polar_jvp(X: Any, dX: Any) -> tuple[Any]:
    """dQ in the accumulation dtype (float64 for float32 on CPU, as the VJP)."""
    work = accumulation_dtype_for(jnp, X)
    dQ = RK.polar_jvp(X.astype(work), dX.astype(work), jnp)
    return (dQ.astype(X.dtype),)


@_highest
def _polar_vjp(X: Any, Qbar: Any) -> tuple[Any]:
    return _jax_ct(polar_backward(X, *_jax_ct(Qbar), jnp))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3))
@_highest
def polar(X: Any, num_iters: Any, restart: Any, box: Any) -> tuple[Any, Any]:
    """(polar(X), certified) by Newton–Schulz (eager path for concrete X); ``certified`` as
    1.0 or 0.0 in X's real dtype, whose tangent, zeros like it, varies over the mesh axes X
    varies over inside ``jax.shard_map`` (a bool's float0 tangent could not)."""
    (X,) = _j(X)
    Q, info = polar_forward(X, jnp, num_iters, restart)
    certified = info.pop("certified", True)
    if box is not None:
        box.info.update(info)
    return Q, jnp.asarray(certified, dtype=real_dtype(jnp, Q.dtype))


@polar.defjvp
@_highest
def _polar_tangent_rule(
    num_iters: Any, restart: Any, box: Any, primals: tuple, tangents: tuple
) -> Any:
    (X,) = _j(*primals)
    Q, certified = polar(X, num_iters, restart, box)  # concrete X: the eager path
    (dQ,) = _tangent(_polar_jvp, _polar_vjp, (X,), tangents, (Q,))
    return (Q, certified), (dQ, jnp.zeros_like(certified))  # the flag is not differentiated


@_highest
def _cayley_jvp(X: Any, Z: Any, step: Any, dX: Any, dZ: Any, dstep: Any) -> tuple[Any]:
    return (RK.cayley_along_jvp(X, Z, step, dX, dZ, dstep, jnp),)


@_highest
def _cayley_vjp(X: Any, Z: Any, step: Any, Ybar: Any) -> tuple[Any, Any, Any]:
    Xbar, Zbar, sb = RK.cayley_along_vjp(X, Z, step, *_jax_ct(Ybar), jnp)
    Xbar, Zbar = _jax_ct(Xbar, Zbar)
    batch = tuple(step.shape[:-2]) if step.ndim >= 2 else ()
    return Xbar, Zbar, jnp.reshape(sum_to_shape(sb, batch, jnp), step.shape)


@jax.custom_jvp
@_highest
def _cayley_smw(X: Any, Z: Any, step: Any) -> tuple[Any, Any]:
    """(Cayley(tW) X along Z by SMW, max ‖XᵀX − I‖_F); ``step`` 0-d or (..., 1, 1)."""
    X, Z, step = _j(X, Z, step)
    return RK.cayley_along(X, Z, step, jnp)


@_cayley_smw.defjvp
@_highest
def _cayley_smw_rule(primals: tuple, tangents: tuple) -> Any:
    primals = _j(*primals)
    Y, drift = _cayley_smw(*primals)
    (dY,) = _tangent(_cayley_jvp, _cayley_vjp, primals, tangents, (Y,))
    return (Y, drift), (dY, jnp.zeros_like(drift))  # the drift is not differentiated


@_highest
def _qr_jvp(Y: Any, dY: Any) -> tuple[Any]:
    return (RK.qr_jvp(Y, dY, jnp),)


@_highest
def _qr_vjp(Y: Any, Qbar: Any) -> tuple[Any]:
    return _jax_ct(RK.qr_vjp(Y, *_jax_ct(Qbar), jnp))


@jax.custom_jvp
@_highest
def _qr_q(Y: Any) -> Any:
    """qf(Y): Q of the thin QR with diag(R) ≥ 0."""
    return RK.qr_positive(*_j(Y), jnp)[0]


@_qr_q.defjvp
@_highest
def _qr_q_rule(primals: tuple, tangents: tuple) -> Any:
    primals = _j(*primals)
    Q = _qr_q(*primals)
    return Q, _tangent(_qr_jvp, _qr_vjp, primals, tangents, (Q,))[0]


# Compiled once per shape: eager calls then run one XLA executable instead of dispatching
# (and compiling) every operation; under an outer ``jax.jit`` these are inlined. ``polar`` is
# not wrapped: on concrete input it picks its iteration count from the values (eager path).
cwy_factors = jax.jit(_cwy_factors)
cwy_factors_diag = jax.jit(_cwy_factors_diag)
lowrank_apply = jax.jit(_lowrank_apply, static_argnums=(3, 4))
lowrank_matrix = jax.jit(_lowrank_matrix, static_argnums=(2, 3, 4))
householder_apply = jax.jit(_householder_apply)
cayley_smw = jax.jit(_cayley_smw)
qr_q = jax.jit(_qr_q)


# -- the rule table ---------------------------------------------------------------------------


def _polar_rule(xp: Any, X: Any, num_iters: Any, restart: Any) -> tuple[Any, dict[str, Any]]:
    box = InfoBox()
    Q, certified = polar(X, num_iters, restart, box)
    certified = certified > 0
    return Q, {**box.info, "certified": bool(certified) if is_eager(certified) else certified}


def _cayley_rule(xp: Any, X: Any, Z: Any, step: Any) -> tuple[Any, Any]:
    step = jnp.asarray(step, dtype=X.dtype) if isinstance(step, float) else step
    return cayley_smw(*same_vma(X, Z, step))


def _lowrank_rule(
    xp: Any, U: Any, T: Any, h: Any, transpose: bool, mode: str, out: Any = None
) -> Any:
    if h is None:
        return lowrank_matrix(U, T, transpose, mode, out)
    return lowrank_apply(*same_vma(U, T, h), transpose, mode)


def same_vma(*arrays: Any) -> tuple[Any, ...]:
    """The arrays cast to vary over the same manual mesh axes (inside ``jax.shard_map``).

    A replicated V applied to a per-device block h: V is invariant over the mesh axis and h
    varies, so the cotangent our backward returns for V varies too and a custom rule rejects
    it (its type differs from V's). Cast first, as JAX's own binary operations do: the
    transpose of the cast is the ``psum`` that makes V̄ the sum over the devices. Outside
    ``shard_map`` (and on JAX versions without varying-axis types) nothing changes.
    """
    if getattr(jax, "typeof", None) is None:  # pragma: no cover - JAX without manual axes
        return arrays
    vmas = [_varying_axes(a) for a in arrays]
    union = frozenset().union(*vmas)
    if all(v == union for v in vmas):
        return arrays
    cast = getattr(jax.lax, "pcast", None)
    out = []
    for a, v in zip(arrays, vmas, strict=True):
        missing = tuple(sorted(union - v))
        if missing:
            a = cast(a, missing, to="varying") if cast else jax.lax.pvary(a, missing)
        out.append(a)
    return tuple(out)


def _varying_axes(a: Any) -> frozenset[Any]:
    """The manual mesh axes ``a`` varies over (JAX ≥ 0.10: ``manual_axis_type.varying``;
    earlier: ``vma``)."""
    t = jax.typeof(a)
    mat = getattr(t, "manual_axis_type", None)
    return frozenset(mat.varying if mat is not None else getattr(t, "vma", ()))


RULES = {
    "cwy_factors": lambda xp, V, sdiag=None: (
        cwy_factors(V) if sdiag is None else cwy_factors_diag(V, sdiag)
    ),
    "lowrank": _lowrank_rule,
    "householder_apply": lambda xp, V, h: householder_apply(*same_vma(V, h)),
    "polar": _polar_rule,
    "cayley": _cayley_rule,
    "qr_q": lambda xp, Y: qr_q(Y),
}
