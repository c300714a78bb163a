"""The JAX rule table: ``jax.custom_vjp`` rules wired to the explicit backward passes
(imported only for JAX input; signatures in :mod:`householderla._autodiff`).

The primitives of the torch table (``cwy_factors``, ``lowrank_apply`` / ``lowrank_matrix``,
``householder_apply``, ``polar``, ``cayley_smw``, ``qr_q``), static arguments in
``nondiff_argnums``, backward rules in ``jax.numpy`` (differentiable again). Everything runs
under ``jax.default_matmul_precision("highest")`` (no TF32 on GPU). JAX's cotangent of a complex
value is the conjugate of ours, so each backward conjugates complex cotangents in and out
(:func:`_jax_ct`).
"""

from __future__ import annotations

import functools
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from .._agnostic import compact_wy as K
from .._agnostic import retraction as RK
from .._agnostic.newton_schulz import polar_backward, polar_forward
from .._agnostic.reflections import householder_apply_vjp, reflect_all
from .._lib.linalg import sum_to_shape
from .._lib.namespace import conj
from .._lib.tracing import is_eager

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


# -- compact WY ---------------------------------------------------------------------------


@jax.custom_vjp
@_highest
def cwy_factors(V: Any) -> tuple[Any, Any, Any]:
    """V ↦ (U, T, r): unit columns, T = S⁻¹ and the column norms (∂‖v‖/∂v = u)."""
    return K.cwy_factors(*_j(V), jnp, check=False)


@_highest
def _factors_fwd(V: Any) -> tuple[tuple[Any, Any, Any], tuple[Any, Any, Any]]:
    U, T, r = K.cwy_factors(*_j(V), jnp, check=False)
    return (U, T, r), (U, T, r)


@_highest
def _factors_bwd(res: tuple[Any, Any, Any], cts: tuple[Any, Any, Any]) -> tuple[Any]:
    U, T, r = res
    U_bar, T_bar, r_bar = _jax_ct(*_j(*cts))
    V_bar = K.factors_vjp(U, r, U_bar, K.s_bar_from_t_bar(T, T_bar, jnp), jnp) + U * r_bar
    return _jax_ct(V_bar)


cwy_factors.defvjp(_factors_fwd, _factors_bwd)


@jax.custom_vjp
@_highest
def cwy_factors_diag(V: Any, sdiag: Any) -> tuple[Any, Any, Any]:
    """(V, sdiag) ↦ (U, T, r) with S = diag(sdiag) + striu(UᴴU); sdiag is a constant."""
    V, sdiag = _j(V, sdiag)
    return K.cwy_factors(V, jnp, check=False, sdiag=sdiag)


@_highest
def _factors_diag_fwd(V: Any, sdiag: Any) -> tuple[Any, Any]:
    V, sdiag = _j(V, sdiag)
    out = K.cwy_factors(V, jnp, check=False, sdiag=sdiag)
    return out, (*out, sdiag)


@_highest
def _factors_diag_bwd(res: Any, cts: tuple[Any, Any, Any]) -> tuple[Any, Any]:
    (V_bar,) = _factors_bwd(res[:3], cts)
    return V_bar, jnp.zeros_like(res[3])


cwy_factors_diag.defvjp(_factors_diag_fwd, _factors_diag_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
@_highest
def lowrank_apply(U: Any, T: Any, h: Any, transpose: bool, mode: str) -> Any:
    """R(h) − U_out M U_inᵀ h."""
    U, T, h = _j(U, T, h)
    return K.lowrank_apply(U, T, h, jnp, transpose=transpose, mode=mode)


@_highest
def _apply_fwd(U: Any, T: Any, h: Any, transpose: bool, mode: str) -> tuple[Any, Any]:
    U, T, h = _j(U, T, h)
    return K.lowrank_apply(U, T, h, jnp, transpose=transpose, mode=mode), (U, T, h)


@_highest
def _apply_bwd(transpose: bool, mode: str, res: Any, g: Any) -> tuple[Any, Any, Any]:
    U, T, h, g = _j(*res, g)
    # not fused: concatenating h and g along a sharded batch axis would move them between
    # devices (collective-permute) under jax.jit with NamedSharding
    (g,) = _jax_ct(g)
    U_bar, h_bar, T_bar, _ = K.lowrank_vjp(
        U, T, h, g, jnp, transpose=transpose, mode=mode, fuse=False
    )
    return _jax_ct(U_bar, T_bar, h_bar)


lowrank_apply.defvjp(_apply_fwd, _apply_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
@_highest
def lowrank_matrix(U: Any, T: Any, transpose: bool, mode: str, out: Any) -> Any:
    """The dense matrix R(I) − U_out M U_inᵀ (rounded once to ``out`` unless None)."""
    U, T = _j(U, T)
    return K.lowrank_apply(U, T, None, jnp, transpose=transpose, mode=mode, out=out)


@_highest
def _matrix_fwd(U: Any, T: Any, transpose: bool, mode: str, out: Any) -> tuple[Any, Any]:
    U, T = _j(U, T)
    return K.lowrank_apply(U, T, None, jnp, transpose=transpose, mode=mode, out=out), (U, T)


@_highest
def _matrix_bwd(transpose: bool, mode: str, out: Any, res: Any, G: Any) -> tuple[Any, Any]:
    U, T, G = _j(*res, G)
    (G,) = _jax_ct(G)
    U_bar, _, T_bar, _ = K.lowrank_vjp(U, T, None, G, jnp, transpose=transpose, mode=mode)
    return _jax_ct(U_bar, T_bar)


lowrank_matrix.defvjp(_matrix_fwd, _matrix_bwd)


# -- sequential Householder products -----------------------------------------------------------


@jax.custom_vjp
@_highest
def householder_apply(V: Any, h: Any) -> Any:
    """H(v₁)(H(v₂)(…H(v_L) h)) for h (..., N, B)."""
    V, h = _j(V, h)
    return reflect_all(K.normalize_columns(V, jnp)[0], h, jnp)


@_highest
def _householder_fwd(V: Any, h: Any) -> tuple[Any, Any]:
    V, h = _j(V, h)
    return reflect_all(K.normalize_columns(V, jnp)[0], h, jnp), (V, h)


@_highest
def _householder_bwd(res: Any, g: Any) -> tuple[Any, Any]:
    V, h, g = _j(*res, g)
    return _jax_ct(*householder_apply_vjp(V, h, *_jax_ct(g), jnp))


householder_apply.defvjp(_householder_fwd, _householder_bwd)


# -- retractions -------------------------------------------------------------------------


class InfoBox:
    """Receives :func:`polar`'s Python-valued diagnostics (hashable by identity, so it can be
    a ``nondiff_argnums`` value); the traced ``certified`` flag is an output instead."""

    def __init__(self) -> None:
        self.info: dict[str, Any] = {}


@_highest
def _polar(X: Any, num_iters: Any, restart: Any, box: Any) -> tuple[Any, Any]:
    """(polar(X), certified) by Newton–Schulz (eager path for concrete X)."""
    Q, info = polar_forward(*_j(X), jnp, num_iters, restart)
    certified = info.pop("certified", True)
    if box is not None:
        box.info.update(info)
    return Q, jnp.asarray(certified, dtype=bool)


@_highest
def _polar_fwd(X: Any, num_iters: Any, restart: Any, box: Any) -> tuple[Any, Any]:
    return _polar(X, num_iters, restart, box), _j(X)[0]


@_highest
def _polar_bwd(num_iters: Any, restart: Any, box: Any, X: Any, cts: tuple) -> tuple[Any]:
    return _jax_ct(polar_backward(X, *_jax_ct(*_j(cts[0])), jnp))


polar = jax.custom_vjp(_polar, nondiff_argnums=(1, 2, 3))
polar.defvjp(_polar_fwd, _polar_bwd)


@_highest
def _cayley(X: Any, Z: Any, step: Any) -> tuple[Any, Any]:
    """(Cayley(tW) X along Z by SMW, max ‖XᵀX − I‖_F); ``step`` 0-d or (..., 1, 1)."""
    X, Z, step = _j(X, Z, step)
    return RK.cayley_along(X, Z, step, jnp)


@_highest
def _cayley_fwd(X: Any, Z: Any, step: Any) -> tuple[Any, Any]:
    return _cayley(X, Z, step), _j(X, Z, step)


@_highest
def _cayley_bwd(res: Any, cts: tuple) -> tuple[Any, Any, Any]:
    X, Z, step = res
    Xbar, Zbar, sb = RK.cayley_along_vjp(X, Z, step, *_jax_ct(*_j(cts[0])), jnp)
    Xbar, Zbar = _jax_ct(Xbar, Zbar)
    batch = tuple(step.shape[:-2]) if step.ndim >= 2 else ()
    step_bar = jnp.reshape(sum_to_shape(sb, batch, jnp), step.shape)
    return Xbar, Zbar, step_bar


cayley_smw = jax.custom_vjp(_cayley)
cayley_smw.defvjp(_cayley_fwd, _cayley_bwd)


@jax.custom_vjp
@_highest
def qr_q(Y: Any) -> Any:
    """qf(Y): Q of the thin QR with diag(R) ≥ 0."""
    return RK.qr_positive(*_j(Y), jnp)[0]


@_highest
def _qr_fwd(Y: Any) -> tuple[Any, Any]:
    (Y,) = _j(Y)
    return RK.qr_positive(Y, jnp)[0], Y


@_highest
def _qr_bwd(Y: Any, Qbar: Any) -> tuple[Any]:
    return _jax_ct(RK.qr_vjp(Y, *_jax_ct(*_j(Qbar)), jnp))


qr_q.defvjp(_qr_fwd, _qr_bwd)

# Compiled once per shape: eager calls then run one XLA executable instead of dispatching
# (and compiling) every operation; under an outer ``jax.jit`` these are inlined. ``polar`` is
# not wrapped: on concrete input it picks its iteration count from the values (eager path).
cwy_factors = jax.jit(cwy_factors)
cwy_factors_diag = jax.jit(cwy_factors_diag)
lowrank_apply = jax.jit(lowrank_apply, static_argnums=(3, 4))
lowrank_matrix = jax.jit(lowrank_matrix, static_argnums=(2, 3, 4))
householder_apply = jax.jit(householder_apply)
cayley_smw = jax.jit(cayley_smw)
qr_q = jax.jit(qr_q)


# -- the rule table ---------------------------------------------------------------------------


def _polar_rule(xp: Any, X: Any, num_iters: Any, restart: Any) -> tuple[Any, dict[str, Any]]:
    box = InfoBox()
    Q, certified = polar(X, num_iters, restart, box)
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
    varies, so the cotangent our backward returns for V varies too and a ``custom_vjp`` rejects
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
