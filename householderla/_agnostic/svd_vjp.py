"""Bounded singular values (Zhang, Lei & Dhillon, ICML 2018, eq. 8), the parameter checks of
the SVD-Householder map, and its explicit VJPs; exported by :mod:`householderla.svd` and
:mod:`householderla.vjp`. The derivations are in ``docs/theory/svd.rst``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._lib.checks import (
    as_matrix_operand,
    broadcast_batch,
    check_cotangent,
    check_finite,
    check_reflectors,
)
from .._lib.jit import jit_for
from .._lib.linalg import sum_to_shape
from .._lib.namespace import is_complex, real_dtype, resolve
from .._lib.tracing import is_eager
from .phases import phase_factor
from .svd import apply_vjp_core, matrix_vjp_core

__all__ = [
    "bounded_sigma",
    "bounded_sigma_vjp",
    "check_params",
    "resolve_params",
    "svd_householder_apply_vjp",
    "svd_householder_matrix_vjp",
]


# -- validation ---------------------------------------------------------------------------------


def check_params(U_vecs: Any, sigma: Any, V_vecs: Any) -> tuple[int, int, int]:
    """(m, n, r) of the parameters, or a ValueError naming the bad one."""
    m, _ = check_reflectors(U_vecs, "U_vecs")
    n, _ = check_reflectors(V_vecs, "V_vecs")
    if m == 0 or n == 0:
        raise ValueError(f"W would be {m}×{n}; need m, n >= 1")
    r = min(m, n)
    if sigma.ndim < 1 or sigma.shape[-1] != r:
        raise ValueError(
            f"sigma must have shape (..., {r}) = (..., min(m, n)) for U_vecs of length m={m} "
            f"and V_vecs of length n={n}; got shape {tuple(sigma.shape)}"
        )
    broadcast_batch(
        [
            ("U_vecs", tuple(U_vecs.shape[:-2])),
            ("sigma", tuple(sigma.shape[:-1])),
            ("V_vecs", tuple(V_vecs.shape[:-2])),
        ]
    )
    return m, n, r


def _check_real(value: Any, name: str) -> None:
    dt = getattr(value, "dtype", None)
    if is_complex(dt) if dt is not None else bool(np.iscomplexobj(value)):
        raise TypeError(
            f"{name} must be real: W = Q_U diag(e^{{iθ}}) Σ Q_Vᴴ has real σ and phases θ"
        )


def resolve_params(
    U_vecs: Any,
    sigma: Any,
    V_vecs: Any,
    xp: Any,
    extra: list[tuple[str, Any]] = (),
    *,
    theta: Any = None,
) -> tuple[Any, list[Any], tuple[int, int, int]]:
    """(xp, [U_vecs, sigma, V_vecs, theta, *extra], (m, n, r)): one namespace and (complex)
    dtype for the arrays, sigma and theta (None if not given) real of its precision."""
    _check_real(sigma, "sigma")
    named = [("U_vecs", U_vecs), ("sigma", sigma), ("V_vecs", V_vecs), *extra]
    if theta is not None:
        _check_real(theta, "theta")
        named.append(("theta", theta))
    xp, _, dtype, vals = resolve(named, xp, complex_ok=True)
    theta = vals.pop() if theta is not None else None
    mnr = check_params(*vals[:3])
    rdtype = real_dtype(xp, dtype)
    reals = []
    for a in (vals[1], theta):  # exact: they were real
        a = xp.real(a) if a is not None and is_complex(a.dtype) else a
        reals.append(a if a is None or a.dtype == rdtype else xp.astype(a, rdtype))
    vals[1], theta = reals
    for name, a in zip(("U_vecs", "sigma", "V_vecs"), vals[:3], strict=True):
        check_finite(a, xp, name)
    if theta is not None:
        check_finite(theta, xp, "theta")
        if theta.ndim < 1 or theta.shape[-1] != mnr[2]:
            raise ValueError(
                f"theta must have shape (..., {mnr[2]}) = (..., min(m, n)); got shape "
                f"{tuple(theta.shape)}"
            )
    return xp, [*vals[:3], theta, *vals[3:]], mnr


# -- bounded singular values ----------------------------------------------------------------------


def _scalar_or_named(value: Any, name: str) -> tuple[float | None, list[tuple[str, Any]]]:
    """Python numbers stay Python floats (weak scalars keep s_hat's dtype); arrays are resolved."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a real number or array, got bool")
    if isinstance(value, (int, float)):
        return float(value), []
    return None, [(name, value)]


def _bounded_inputs(
    s_hat: Any, center: Any, radius: Any, xp: Any, extra: list[tuple[str, Any]] = ()
) -> tuple[Any, Any, Any, Any, list[Any]]:
    c0, c_arr = _scalar_or_named(center, "center")
    r0, r_arr = _scalar_or_named(radius, "radius")
    xp, _, _, vals = resolve([("s_hat", s_hat), *c_arr, *r_arr, *extra], xp)
    it = iter(vals[1:])
    c = c0 if c0 is not None else next(it)
    rad = r0 if r0 is not None else next(it)
    rest = list(it)
    if isinstance(rad, float):
        if not rad >= 0:
            raise ValueError(f"radius must be >= 0; got {rad}")
    else:
        ok = xp.all(rad >= 0)
        if is_eager(ok) and not bool(ok):
            raise ValueError("radius must be >= 0 (and not NaN) everywhere")
    return xp, vals[0], c, rad, rest


def bounded_sigma(s_hat: Any, center: Any, radius: Any, *, xp: Any = None) -> Any:
    """Singular values confined to [σ* − r, σ* + r]: σ = 2r(sigmoid(ŝ) − ½) + σ* (Zhang, Lei &
    Dhillon, ICML 2018 eq. 8).

    Parameters
    ----------
    s_hat : array, shape (..., r)
        Unconstrained parameters ŝ.
    center : float or array broadcastable with s_hat
        σ* (usually 1).
    radius : float or array broadcastable with s_hat
        r ≥ 0 (usually ≪ 1); ValueError if negative or NaN (checked on eager arrays).

    Returns
    -------
    array
        σ, of the broadcast shape, in s_hat's namespace, device and floating dtype (Python
        numbers for center/radius do not change the dtype).

    Notes
    -----
    Computed as σ = r·tanh(ŝ/2) + σ*, which equals eq. 8 because sigmoid(x) − ½ = ½ tanh(x/2),
    never overflows, and keeps full relative accuracy of σ − σ* for small ŝ. In exact
    arithmetic σ ∈ (σ* − r, σ* + r); in floating point tanh saturates to ±1 for
    abs(ŝ) ≳ 2·atanh(1 − eps), so the closed interval is what is guaranteed. dσ/dŝ =
    r/(2 cosh²(ŝ/2)) ∈ (0, r/2]. Written in array operations, so torch autograd and JAX
    differentiate it natively; the explicit rule is :func:`bounded_sigma_vjp`. 4 flops and one
    tanh per entry.

    Examples
    --------
    >>> import numpy as np, householderla as hl
    >>> hl.bounded_sigma(np.array([-50.0, 0.0, 50.0]), 1.0, 0.1)
    array([0.9, 1. , 1.1])
    """
    xp, s_hat, c, rad, _ = _bounded_inputs(s_hat, center, radius, xp)
    return rad * xp.tanh(0.5 * s_hat) + c


def bounded_sigma_vjp(s_hat: Any, center: Any, radius: Any, g: Any, *, xp: Any = None) -> Any:
    """VJP of ŝ ↦ bounded_sigma(ŝ, center, radius) (exported as
    ``householderla.vjp.bounded_sigma``); g has the output's shape.

    ŝ̄ = g · 2r·f(ŝ)(1 − f(ŝ)) = g · 2r·e^{−abs(ŝ)}/(1 + e^{−abs(ŝ)})², f = sigmoid, summed over
    axes that broadcasting with center/radius added. ``center`` and ``radius`` are treated as
    constants (hyperparameters in Zhang, Lei & Dhillon, ICML 2018, §4); their cotangents, if wanted,
    are Σ g and Σ g·tanh(ŝ/2) (``docs/theory/svd.rst``), and torch/JAX autodiff of
    :func:`bounded_sigma` gives them. For large abs(ŝ) the factor underflows to the correct
    0, never NaN or a warning.
    """
    xp, s_hat, c, rad, (g,) = _bounded_inputs(s_hat, center, radius, xp, [("g", g)])
    out_shape = tuple((rad * xp.tanh(0.5 * s_hat) + c).shape)  # the forward's broadcast shape
    if tuple(g.shape) != out_shape:
        raise ValueError(
            f"g must have the shape of the forward output {out_shape}; got {tuple(g.shape)}"
        )
    e = xp.exp(-xp.abs(s_hat))  # sech²(ŝ/2)/4 = e/(1 + e)², underflows to 0, never overflows
    s_bar = g * (2.0 * rad) * (e / ((1.0 + e) * (1.0 + e)))
    return sum_to_shape(s_bar, tuple(s_hat.shape), xp)


# -- explicit VJPs of the SVD map -----------------------------------------------------------------


def _diag_and_back(
    xp: Any, U_vecs: Any, sigma: Any, V_vecs: Any, theta: Any, real: list[bool]
) -> tuple[Any, Any]:
    """The diagonal d of D(θ)Σ (σ, or σe^{iθ}), and the map from (Ū, d̄, V̄, …) to the
    returned cotangents: σ̄ = Re(d̄ e^{−iθ}), θ̄ = −Im(conj(d̄) d) (d = σe^{iθ}: dd = e^{iθ}dσ +
    i d dθ), real parts for real vector inputs."""
    p = None if theta is None else phase_factor(theta, xp)
    d = sigma if p is None else sigma * p

    def back(U_bar: Any, d_bar: Any, V_bar: Any, *rest: Any) -> tuple[Any, ...]:
        U_bar, V_bar = (
            xp.real(b) if r and is_complex(b.dtype) else b
            for b, r in zip((U_bar, V_bar), real, strict=True)
        )
        s_bar = d_bar if p is None else d_bar * xp.conj(p)
        s_bar = xp.real(s_bar) if is_complex(s_bar.dtype) else s_bar
        out = (U_bar, sum_to_shape(s_bar, tuple(sigma.shape), xp), V_bar, *rest)
        if theta is None:
            return out
        t_bar = -xp.imag(xp.conj(d_bar) * d)
        return (*out, sum_to_shape(t_bar, tuple(theta.shape), xp))

    return d, back


def _real_vectors(U_vecs: Any, V_vecs: Any) -> list[bool]:
    return [
        not (is_complex(a.dtype) if hasattr(a, "dtype") else bool(np.iscomplexobj(a)))
        for a in (U_vecs, V_vecs)
    ]


def svd_householder_apply_vjp(
    U_vecs: Any, sigma: Any, V_vecs: Any, x: Any, g: Any, *, theta: Any = None, xp: Any = None
) -> tuple[Any, ...]:
    """VJP of (U_vecs, sigma, V_vecs, x) ↦ svd_householder(U_vecs, sigma, V_vecs) @ x
    (exported as ``householderla.vjp.svd_householder_apply``).

    Parameters
    ----------
    U_vecs, sigma, V_vecs : arrays
        As in :func:`~householderla.svd_householder`: (..., m, k₁), (..., r), (..., n, k₂).
    x : array, shape (n,) or (..., n, B)
        The right operand of the forward.
    g : array
        Cotangent of the output W @ x (its shape: (..., m) or (..., m, B)).
    theta : real array, shape (..., r), optional
        The forward's phases (``svd_householder(..., theta=theta)``); θ̄ is returned last.
    xp : namespace, optional

    Returns
    -------
    U_bar, sigma_bar, V_bar, x_bar : arrays
        Shaped as the corresponding inputs (batch axes added by broadcasting summed out);
        then theta_bar with ``theta``. Complex: cotangents ∂L/∂Re + i∂L/∂Im (``hl.vjp``'s
        convention), σ̄ and θ̄ real.

    Notes
    -----
    Forward a = P_r Q_Vᵀ x, c = σ ⊙ a, y = Q_U E_r c. Backward, with the CWY apply rule of
    ``docs/theory/vjp.rst`` for each side: c̄ = P_r Q_Uᵀ g and Ū from (Q_U, h = E_r c, g); σ̄_i =
    Σ_b c̄_ib a_ib; ā = σ ⊙ c̄; x̄ = Q_V E_r ā and V̄ from (Q_Vᵀ, x, E_r ā). The reflection-vector
    cotangents go through the normalisation backward, so they are the full gradients of Zhang, Lei &
    Dhillon, ICML 2018 eq. 15 (not Mhammedi et al.'s fixed-norm eq. 14); zero vectors get exactly 0.
    About twice the forward's flops (8·N·k·B + 2·N·k² per side, on top of the factors), O(N·k + k·B
    + k²) memory per side.
    """
    real = _real_vectors(U_vecs, V_vecs)
    xp, (U_vecs, sigma, V_vecs, theta, x, g), (m, n, _) = resolve_params(
        U_vecs, sigma, V_vecs, xp, [("x", x), ("g", g)], theta=theta
    )
    d, back = _diag_and_back(xp, U_vecs, sigma, V_vecs, theta, real)
    xm, vector = as_matrix_operand(x, n, "x")
    batch = broadcast_batch(
        [
            ("U_vecs", tuple(U_vecs.shape[:-2])),
            ("sigma", tuple(sigma.shape[:-1])),
            ("V_vecs", tuple(V_vecs.shape[:-2])),
            ("x", tuple(xm.shape[:-2])),
            ("theta", () if theta is None else tuple(theta.shape[:-1])),
        ]
    )
    out = batch + ((m,) if vector else (m, xm.shape[-1]))
    check_cotangent(g, out, "g")
    gm = g[..., None] if vector else g
    U_bar, s_bar, V_bar, x_bar = jit_for(xp, apply_vjp_core)(xp, U_vecs, d, V_vecs, xm, gm)
    return back(U_bar, s_bar, V_bar, x_bar[..., 0] if vector else x_bar)


def svd_householder_matrix_vjp(
    U_vecs: Any, sigma: Any, V_vecs: Any, G: Any, *, theta: Any = None, xp: Any = None
) -> tuple[Any, ...]:
    """VJP of (U_vecs, sigma, V_vecs) ↦ svd_householder(U_vecs, sigma, V_vecs).matrix()
    (exported as ``householderla.vjp.svd_householder_matrix``); G has shape (..., m, n).

    With A = Q_U E_r (m×r), B = Q_V E_r (n×r), W = A diag(σ) Bᵀ:
    Ā = G B diag(σ), B̄ = Gᵀ A diag(σ), σ̄_i = (Aᵀ G B)_ii = Σ_j A_ji (G B)_ji, then the
    CWY/T-CWY matrix rule of ``docs/theory/vjp.rst`` takes Ā and B̄ to Ū and V̄ (full
    gradients, zero vectors get 0). Returns (U_bar, sigma_bar, V_bar) shaped as the inputs.
    4·m·n·r flops for Ā, B̄ plus the two side backward passes (4·N²·k + O(N·k²) each).
    Complex (W = A diag(d) Bᴴ, d = σ e^{iθ} with ``theta``): Ā = G B diag(conj d),
    B̄ = Gᴴ A diag(d), d̄_i = (Aᴴ G B)_ii, σ̄ = Re(d̄ e^{−iθ}), θ̄ = −Im(conj(d̄) d), returned
    last.
    """
    real = _real_vectors(U_vecs, V_vecs)
    xp, (U_vecs, sigma, V_vecs, theta, G), (m, n, _) = resolve_params(
        U_vecs, sigma, V_vecs, xp, [("G", G)], theta=theta
    )
    d, back = _diag_and_back(xp, U_vecs, sigma, V_vecs, theta, real)
    batch = broadcast_batch(
        [
            ("U_vecs", tuple(U_vecs.shape[:-2])),
            ("sigma", tuple(sigma.shape[:-1])),
            ("V_vecs", tuple(V_vecs.shape[:-2])),
        ]
    )
    if theta is not None:
        batch = broadcast_batch([("W", batch), ("theta", tuple(theta.shape[:-1]))])
    check_cotangent(G, batch + (m, n), "G")
    return back(*jit_for(xp, matrix_vjp_core)(xp, U_vecs, d, V_vecs, G))
