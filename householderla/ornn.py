"""The oRNN parametrisation: W = H_n(u_n)…H_{n−m+1}(u_{n−m+1}) · H_1 with u_k ∈ ℝᵏ.

Mhammedi et al. (ICML 2017), eq. 6–9: for 2 ≤ k ≤ n,

    H_k(u) = diag(I_{n−k}, I_k − 2uuᵀ/‖u‖²),   u ∈ ℝᵏ,        H_1(s) = diag(I_{n−1}, s),

and with m reflection vectors W = H_n(u_n)…H_{n−m+1}(u_{n−m+1}) (eq. 8). The parameter
matrix U = (u_n | … | u_{n−m+1}) ∈ ℝ^{n×m} holds u_{n−j+1} in column j below j − 1 zeros
(eq. 9): U is *lower trapezoidal*, and H_k(u_k) is the CWY reflector H([0; u_k]) of that
column. We append H_1(s), s ∈ {+1, −1}, as one more CWY column, 0 for s = +1 (H(0) = I) and
e_n for s = −1 (H(e_n) = diag(I, −1)); with m = n − 1 this is the paper's full map M₁, whose
image is all of O(n) (Theorem 1; :func:`ornn_params` is the constructive inverse).

The operator is :func:`householderla.cwy` of V = [tril(U), (1 − s)/2 · e_n] with the structure
declared ("trapezoidal"), so products skip the zeros where that is faster
(:mod:`householderla._agnostic.trapezoidal`; Mhammedi et al., ICML 2017, Table 2). Entries of U
above the diagonal are not parameters: they are masked out, and their gradient is exactly 0.

The explicit VJPs give the *full* gradient with respect to the unnormalised u_k (Zhang, Lei &
Dhillon, ICML 2018 eq. 15), not Mhammedi et al., ICML 2017 eq. 14, which treats ‖u_k‖ as fixed
(docs/theory/vjp.rst, docs/theory/ornn.rst).

The unitary case (Mhammedi et al., ICML 2017, §4.3, Corollary 1): complex u_k ∈ ℂᵏ and
Ĥ₁(θ) = diag(e^{iθ₁}, …, e^{iθ_n}) in place of the sign, ``ornn(U, theta=θ)``; with m = n − 1
its image is all of U(n), and :func:`ornn_params` of a complex Q returns (U, θ).
"""

from __future__ import annotations

from typing import Any

import array_api_compat as aac
import numpy as np

from ._agnostic import compact_wy as K
from ._agnostic import phases as P
from ._agnostic import trapezoidal as S
from ._lib.checks import (
    as_matrix_operand,
    broadcast_batch,
    check_cotangent,
    check_finite_norms,
    finite_reflectors,
)
from ._lib.linalg import sum_to_shape
from ._lib.namespace import complex_dtype, device_of, is_complex, real_dtype, resolve
from ._lib.tracing import is_eager
from .cwy import CWY, cwy
from .householder import householder_vectors

__all__ = ["ornn", "ornn_apply_vjp", "ornn_matrix_vjp", "ornn_params"]


def _check_trapezoid(U: Any) -> tuple[int, int]:
    if U.ndim < 2:
        raise ValueError(
            "U must have shape (..., n, m) with the reflection vectors u_n, …, u_{n−m+1} as "
            f"its lower-trapezoidal columns; got shape {tuple(U.shape)}"
        )
    n, m = U.shape[-2], U.shape[-1]
    if m > max(n - 1, 0):  # n = 0: the one element of O(0), no reflector and no sign
        raise ValueError(
            f"U has m={m} columns for n={n}; need m <= n - 1 (u_k ∈ ℝᵏ for k = n, …, n−m+1 "
            f"≥ 2; the last factor H_1 is the sign argument), got shape {tuple(U.shape)}"
        )
    return n, m


def _sign(sign: Any, xp: Any, dtype: Any, device: Any, batch: tuple[int, ...]) -> Any:
    """``sign`` as a float or an array of ``dtype`` whose shape broadcasts against ``batch``;
    eager values must be ±1 (under jit, s > 0 is read as +1 and anything else as −1, the
    projection Mhammedi et al., ICML 2017, §5 applies after each step)."""
    if isinstance(sign, bool) or (not aac.is_array_api_obj(sign) and isinstance(sign, complex)):
        raise TypeError(f"sign must be +1 or -1 (an int, float or array); got {sign!r}")
    if isinstance(sign, (int, float)):
        if sign not in (1, -1):
            raise ValueError(f"sign must be +1 or -1 (H_1 = diag(I, sign)); got {sign!r}")
        return float(sign)
    if aac.is_jax_namespace(xp) and aac.is_numpy_array(sign):
        sign = xp.asarray(sign)
    if aac.is_array_api_obj(sign) and aac.array_namespace(sign) is not xp:
        raise TypeError(
            f"sign is a {type(sign).__module__}.{type(sign).__name__} but U is an array of "
            f"{xp.__name__}; convert sign first"
        )
    _, sdev, _, (s,) = resolve([("sign", sign)], xp)
    if sdev is not None and device is not None and sdev != device:
        raise ValueError(f"sign is on device {sdev} but U is on {device}")
    if s.dtype != dtype:
        s = xp.astype(s, dtype)
    try:
        broadcast_batch([("sign", s.shape), ("U", batch)])
    except ValueError:
        raise ValueError(
            f"sign must have a shape that broadcasts against U's batch shape {batch}; "
            f"got shape {tuple(s.shape)}"
        ) from None
    ok = xp.all((s == 1) | (s == -1))  # checked only where it can be read (not under jit)
    if is_eager(ok) and not bool(ok):
        raise ValueError("sign must be +1 or -1 (H_1 = diag(I, sign)); got other values")
    return s


def _reflectors(U: Any, s: Any, xp: Any) -> Any:
    """V = [tril(U), c·e_n] (..., n, m + 1) with c = 0 for s = +1 and 1 for s = −1."""
    n, m = U.shape[-2], U.shape[-1]
    dtype, device = U.dtype, device_of(U)
    if n == 0:  # H_1 acts on ℝ⁰: V is U, broadcast against the sign's batch
        batch = (
            tuple(U.shape[:-2])
            if isinstance(s, float)
            else broadcast_batch([("U", U.shape[:-2]), ("sign", s.shape)])
        )
        return xp.broadcast_to(U, batch + (0, 0))
    e_n = xp.reshape(xp.astype(xp.arange(n, device=device) == n - 1, dtype), (n, 1))  # (n, 1)
    if isinstance(s, float):
        col = e_n if s < 0 else xp.zeros_like(e_n)
        batch = tuple(U.shape[:-2])
    else:
        one = xp.ones_like(s)
        c = xp.where(s > 0, xp.zeros_like(s), one)
        col = c[..., None, None] * e_n
        batch = broadcast_batch([("U", U.shape[:-2]), ("sign", s.shape)])
    L = xp.broadcast_to(xp.tril(U), batch + (n, m))
    return xp.concat([L, xp.broadcast_to(col, batch + (n, 1))], axis=-1)


def _prepare(U: Any, sign: Any, xp: Any, more: list[tuple[str, Any]] = ()) -> tuple:
    xp, device, dtype, values = resolve([("U", U), *more], xp, complex_ok=True)
    U = values[0]
    _check_trapezoid(U)
    s = _sign(sign, xp, real_dtype(xp, dtype), device, tuple(U.shape[:-2]))
    if is_eager(U) and U.shape[-2]:  # (n = 0: no entries, and no maximum over them)
        check_finite_norms(xp.max(xp.abs(xp.tril(U)), axis=-2, keepdims=True), xp, "U")
    return xp, U, _reflectors(U, s, xp), values[1:]


def ornn(U: Any, sign: Any = 1, *, theta: Any = None, xp: Any = None) -> CWY:
    """The oRNN transition matrix W = H_n(u_n)…H_{n−m+1}(u_{n−m+1}) · H_1(sign) as a CWY operator.

    Parameters
    ----------
    U : array, shape (..., n, m), m ≤ n − 1
        Column j (0-based) holds u_{n−j} ∈ ℝ^{n−j} in rows j, …, n − 1 (Mhammedi et al., ICML 2017
        eq. 9). The entries above the diagonal are not parameters: they are ignored (masked to
        zero), and their gradient is exactly zero. A zero column is the identity (H(0) = I).
        Complex U: u_k ∈ ℂᵏ, Ĥ_k with conjugate transposes (Mhammedi et al., §4.3).
    sign : {+1, −1} or array of shape (...), default +1
        H_1 = diag(I_{n−1}, sign) (Mhammedi et al., ICML 2017 eq. 7), applied last (rightmost). An
        int/float array broadcasts against U's batch shape; eager values must be ±1 (under
        ``jax.jit`` sign > 0 is read as +1, anything else as −1). Not differentiable (a discrete
        choice). For complex U, an array of shape ``U.shape[:-1]`` (the batch and n) here is
        θ, as :func:`ornn_params` returns it for a unitary Q, so ``ornn(*ornn_params(Q))``
        reproduces Q (pass ``theta=`` to be explicit).
    theta : real array, shape (..., n), optional
        The unitary H_1: Ĥ_1(θ) = diag(e^{iθ}) (Mhammedi et al., ICML 2017, §4.3, Corollary 1),
        in place of ``sign`` (which must then be left at +1); differentiable. The operator is
        complex: with m = n − 1, every unitary matrix is reached (:func:`ornn_params`).
    xp : namespace, optional
        Array namespace to use instead of the one inferred from ``U``.

    Returns
    -------
    CWY
        The operator of V = [tril(U), c·e_n] (c = 0 for sign +1, 1 for −1), shape
        (..., n, n), with ``@``, ``.T``, ``.matrix()``; its structure is "trapezoidal". With
        ``theta``: ``cwy(tril(U), theta=theta)``.

    Notes
    -----
    m = n − 1 with the sign is Mhammedi et al.'s M₁, onto O(n) (Theorem 1); without the sign factor
    (sign = +1) only matrices with (−1)^(number of nonzero u_k) = det W are reached (see
    docs/theory/ornn.rst for the 2 × 2 counterexample). Proposition 1 is the compact WY form
    I − U S̃⁻¹ Uᵀ with S̃ = striu(UᵀU) + ½ diag(UᵀU), equivalent to our normalised
    S = ½I + striu(ŨᵀŨ). Building costs n·(m+1)² + (m+1)³/3 flops; ``W @ h`` for h (n, B)
    4·n·L·B − L²·B (+ 3·L²·B/k for k column blocks, L = m + 1) where the blocked
    products are faster (L ≥ 256, L ≥ n/2; B < 16: L ≥ 3n/4, L ≥ 512), else
    4·n·L·B + 2·L²·B; Mhammedi et al., ICML 2017, Table 2 counts
    (4n − m + 2)·m per vector.

    Examples
    --------
    >>> import numpy as np, householderla as hl
    >>> from householderla.ornn import ornn, ornn_params
    >>> Q = np.linalg.qr(np.random.default_rng(0).standard_normal((4, 4)))[0]
    >>> U, sign = ornn_params(Q)
    >>> U.shape, bool(np.allclose(np.triu(U, 1), 0))
    ((4, 3), True)
    >>> bool(np.allclose(ornn(U, sign).matrix(), Q))
    True
    """
    if theta is None and _phases_given_as_sign(U, sign):
        theta, sign = sign, 1  # ornn(*ornn_params(Q)) for a unitary Q: (U, θ)
    if theta is not None:
        _no_sign_with_theta(sign)
        xp, U, _, _ = _prepare(U, 1, xp)
        return cwy(xp.tril(U), theta=theta, structure="trapezoidal", xp=xp)
    xp, _, V, _ = _prepare(U, sign, xp)
    return CWY(finite_reflectors(V, xp, "U"), xp, structure="trapezoidal")


def _phases_given_as_sign(U: Any, sign: Any) -> bool:
    """Whether ``sign`` is the θ (..., n) of a complex U (..., n, m), by shape alone."""
    if not (aac.is_array_api_obj(U) and aac.is_array_api_obj(sign)):
        return False
    return is_complex(U.dtype) and U.ndim >= 2 and tuple(sign.shape) == tuple(U.shape[:-1])


def _no_sign_with_theta(sign: Any) -> None:
    if not (isinstance(sign, (int, float)) and not isinstance(sign, bool) and sign == 1):
        raise ValueError(
            "pass sign or theta, not both: diag(e^{iθ}) is the unitary H_1 and contains the "
            "sign (θ_n = π for -1)"
        )


def ornn_params(Q: Any, *, xp: Any = None) -> tuple[Any, Any]:
    """Constructive inverse of :func:`ornn`: (U, sign) with ``ornn(U, sign).matrix() == Q``.

    Parameters
    ----------
    Q : array, shape (..., n, n)
        Orthogonal matrices, either determinant.

    Returns
    -------
    U : array, shape (..., n, n − 1)
        Lower trapezoidal (exact zeros above the diagonal), Q's dtype.
    sign : array, shape (...)
        +1 or −1 in Q's dtype: H_1 of Mhammedi et al., ICML 2017 eq. 7. For complex (unitary) Q
        this is θ (..., n) instead, real, with ``ornn(U, theta=θ).matrix() == Q``: Ĥ_1(θ) of
        Corollary 1 (its proof: Householder QR with Hermitian reflections leaves R =
        diag(e^{iθ}), :func:`householder_vectors` with ``return_phases=True``).

    Notes
    -----
    Householder QR with positive diagonal (Mhammedi et al., ICML 2017, Algorithm 2, via
    :func:`householderla.householder_vectors`), 4n³/3 flops: the first n − 1 reflectors are
    u_n, …, u_2; the n-th is 0 or −2e_n, i.e. sign = +1 or −1, whichever makes
    det Q = sign · (−1)^(number of nonzero u_k). This is the proof of Mhammedi et al., ICML 2017,
    Theorem 1:
    QR = Q with R upper triangular, positive diagonal and orthogonal, so R = I. For a
    non-orthogonal full-rank Q the result parametrises its orthogonal QR factor.
    """
    xp, _, _, (Q,) = resolve([("Q", Q)], xp, complex_ok=True)
    if is_complex(Q.dtype):
        V, theta = householder_vectors(Q, return_phases=True, xp=xp)
        return V[..., :, : V.shape[-1] - 1], theta  # the n-th reflector is 0
    V = householder_vectors(Q, xp=xp)
    n = V.shape[-1]
    if n == 0:  # O(0) = {the empty matrix}: no reflector, sign +1
        return V, xp.ones(V.shape[:-2], dtype=V.dtype, device=device_of(V))
    last = V[..., n - 1, n - 1]
    one = xp.ones_like(last)
    return V[..., :, : n - 1], xp.where(last != 0, -one, one)


# -- explicit VJPs -----------------------------------------------------------------------------


def _masked(V_bar: Any, m: int, shape: tuple[int, ...], xp: Any) -> Any:
    """Ū of the parameters: the first m columns of V̄, zero above the diagonal, summed over
    the batch axes that broadcasting against ``sign`` (or h) added."""
    return sum_to_shape(xp.tril(V_bar[..., :m]), shape, xp)


def _phased(U: Any, theta: Any, xp: Any) -> tuple[Any, Any, Any]:
    """(V = tril(U) as complex, e^{iθ}, θ real) for the VJPs with ``theta``."""
    if is_complex(theta.dtype):
        theta = xp.real(theta)  # resolved with U, h, g; checked real on entry
    n = U.shape[-2]
    if theta.ndim < 1 or theta.shape[-1] != n:
        raise ValueError(f"theta must have shape (..., {n}); got shape {tuple(theta.shape)}")
    V = xp.tril(U)
    V = V if is_complex(V.dtype) else xp.astype(V, complex_dtype(xp, V.dtype))
    theta = xp.astype(theta, real_dtype(xp, V.dtype))
    return V, P.phase_factor(theta, xp), theta


def _is_real(a: Any) -> bool:
    dt = getattr(a, "dtype", None)
    return not (is_complex(dt) if dt is not None else bool(np.iscomplexobj(a)))


def _check_real_theta(theta: Any) -> None:
    if not _is_real(theta):
        raise TypeError("theta must be real: the phases θ of Ĥ_1(θ) = diag(e^{iθ})")


def ornn_apply_vjp(
    U: Any, sign: Any, h: Any, g: Any, *, theta: Any = None, xp: Any = None
) -> tuple[Any, ...]:
    """VJP of (U, h) ↦ ornn(U, sign) @ h with respect to the trapezoid U and h.

    Parameters
    ----------
    U, sign : as for :func:`ornn` h : array, shape (n,) or (..., n, B) g : array, the shape of the
    output ``ornn(U, sign) @ h``

    Returns
    -------
    U_bar : array, shape of U
        Lower trapezoidal; exactly zero above the diagonal and for zero columns.
    h_bar : array, shape of h
        Wᵀ g.

    Notes
    -----
    The full gradient with respect to the unnormalised u_k (Zhang, Lei & Dhillon, ICML 2018 eq. 15;
    Mhammedi et al., ICML 2017 eq. 14 omits the radial term): the CWY backward of
    docs/theory/vjp.rst on V = [tril(U), c·e_n], then the mask. Where the blocked products are
    faster (L = m + 1 ≥ 256, L ≥ n/2) every product skips the zeros of U
    (:func:`householderla._agnostic.trapezoidal.apply_vjp`): 10·n·L·B − 3·L²·B + 2·n·L² − L³ flops
    plus the factors (n·L² + L³/3), against 10·n·L·B + 4·L²·B + 2·n·L² dense. Mhammedi et al., ICML
    2017, Table 2's BP, (7n − 2m + 3)·m per vector, stores the m + 1 intermediate vectors per
    right-hand side (and has no 2·n·L² term because it runs the reflections one by one).

    With ``theta`` (the forward ``ornn(U, theta=θ) @ h``), returns (Ū, h̄, θ̄), θ̄ of θ's
    shape and real (:func:`householderla._agnostic.phases.apply_vjp`).
    """
    if theta is not None:
        _no_sign_with_theta(sign)
        _check_real_theta(theta)
        real_U = _is_real(U)
        xp, U, _, (h, g, theta) = _prepare(U, 1, xp, [("h", h), ("g", g), ("theta", theta)])
        V, p, theta = _phased(U, theta, xp)
        hm, vector = as_matrix_operand(h, U.shape[-2])
        gm = g[..., None] if vector else g
        Un, T, r = K.cwy_factors(V, xp)
        hm = hm if is_complex(hm.dtype) else xp.astype(hm, V.dtype)
        V_bar, h_bar, t_bar = P.apply_vjp(Un, T, r, p, hm, gm, xp, transpose=False, mode="square")
        U_bar = _masked(V_bar, U.shape[-1], tuple(U.shape), xp)
        return (
            xp.real(U_bar) if real_U else U_bar,
            h_bar[..., 0] if vector else h_bar,
            sum_to_shape(t_bar, tuple(theta.shape), xp),
        )
    xp, U, V, (h, g) = _prepare(U, sign, xp, [("h", h), ("g", g)])
    n, m = U.shape[-2], U.shape[-1]
    hm, vector = as_matrix_operand(h, n)
    batch = broadcast_batch([("U", V.shape[:-2]), ("h", hm.shape[:-2])])
    out = batch + (n, hm.shape[-1])
    check_cotangent(g, out[:-1] if vector else out, "g")
    gm = g[..., None] if vector else g
    Un, T, r = K.cwy_factors(V, xp)
    if S.use_structured_vjp(n, m + 1):
        V_bar, h_bar = S.apply_vjp(Un, T, r, hm, gm, xp)
    else:
        Ub, h_bar, _, S_bar = K.lowrank_vjp(Un, T, hm, gm, xp, transpose=False, mode="square")
        V_bar = K.factors_vjp(Un, r, Ub, S_bar, xp)
    U_bar = _masked(V_bar, m, tuple(U.shape), xp)
    return U_bar, (h_bar[..., 0] if vector else h_bar)


def ornn_matrix_vjp(U: Any, sign: Any, G: Any, *, theta: Any = None, xp: Any = None) -> Any:
    """VJP of U ↦ ornn(U, sign).matrix(); G has shape (..., n, n) (the output's).

    Returns U_bar of U's shape, lower trapezoidal (exactly zero above the diagonal). The CWY
    matrix backward Ū = −G U Tᵀ − Gᵀ U T + U (P + Pᵀ), P = striu(Tᵀ Uᵀ G U Tᵀ), then the
    normalisation (full gradient, Zhang, Lei & Dhillon, ICML 2018 eq. 15) and the mask: 4·n²·L +
    O(n·L²) flops.

    With ``theta`` (the forward ``ornn(U, theta=θ).matrix()``) returns (Ū, θ̄).
    """
    if theta is not None:
        _no_sign_with_theta(sign)
        _check_real_theta(theta)
        real_U = _is_real(U)
        xp, U, _, (G, theta) = _prepare(U, 1, xp, [("G", G), ("theta", theta)])
        V, p, theta = _phased(U, theta, xp)
        Un, T, r = K.cwy_factors(V, xp)
        V_bar, t_bar = P.matrix_vjp(Un, T, r, p, G, xp, mode="square")
        U_bar = _masked(V_bar, U.shape[-1], tuple(U.shape), xp)
        return xp.real(U_bar) if real_U else U_bar, sum_to_shape(t_bar, tuple(theta.shape), xp)

    xp, U, V, (G,) = _prepare(U, sign, xp, [("G", G)])
    n, m = U.shape[-2], U.shape[-1]
    check_cotangent(G, tuple(V.shape[:-2]) + (n, n), "G")
    Un, T, r = K.cwy_factors(V, xp)
    Ub, _, _, S_bar = K.lowrank_vjp(Un, T, None, G, xp, transpose=False, mode="square")
    return _masked(K.factors_vjp(Un, r, Ub, S_bar, xp), m, tuple(U.shape), xp)


def __dir__() -> list[str]:
    """Only the public names: the imports above stay attributes but are not listed."""
    return sorted(__all__)
