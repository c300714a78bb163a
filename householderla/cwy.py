"""Compact WY (CWY) and truncated CWY (T-CWY) operators.

``cwy(V)`` is Q = H(v₁)…H(v_L) = I − U S⁻¹ Uᵀ with S = ½I + striu(UᵀU) (Likhosherstov et al.,
AISTATS 2021, Theorem 2; Mhammedi et al., ICML 2017, Proposition 1); ``tcwy(V)`` is Ω = γ_{N,M}(V) =
[I; 0] − U S⁻¹ U₁ᵀ, the first M columns of H(v₁)…H(v_M) (Likhosherstov et al., AISTATS 2021, Theorem
3). Both are operators: the factors U and T = S⁻¹ are computed once, on the operator's first product
(N·L² + L³/3 flops), and every ``@`` costs two GEMMs and one small L×L product; the N×N (or N×M)
matrix is formed only by ``.matrix()``.

Lower-trapezoidal V (column j zero above row j: LAPACK's and oRNN's layout, Mhammedi et al., ICML
2017 eq. 9) is exploited by ``.matrix()`` (orgqr-style blocking) and by ``@`` (blocked products that
skip the zeros, :mod:`householderla._agnostic.trapezoidal`); ``structure=`` declares, detects or
disables it.

With torch tensors that require grad, and always with JAX arrays, building and applying the
operator goes through :mod:`householderla.vjp`'s explicit backward passes (lazily imported
adapters, never autodiff through our internals).

Complex V gives unitary operators (H(v) = I − 2vvᴴ/‖v‖²); ``theta=`` adds the right phase factor
diag(e^{iθ}) without which Hermitian reflections do not reach all of U(N) (Mhammedi et al., ICML
2017, §4.3, Corollary 1; ``docs/theory/complex.rst``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._interop.dask import is_dask_array
from ._lib.checks import (
    broadcast_batch,
    check_finite,
    check_finite_columns,
    check_reflectors,
    check_structure,
    finite_reflectors,
)
from ._lib.namespace import complex_dtype, is_complex, real_dtype, resolve
from ._lib.tracing import is_eager
from ._operator.core import CompactWYOperator
from ._operator.factors import scan_reflectors
from ._operator.tall import TallCWY, TallTCWY, tall_operator

__all__ = ["CWY", "TCWY", "TallCWY", "TallTCWY", "cwy", "tcwy"]


class CWY(CompactWYOperator):
    """Q = H(v₁)…H(v_L) = I − U T Uᵀ as an operator; build it with :func:`cwy`."""


class TCWY(CompactWYOperator):
    """Ω = γ_{N,M}(V) ∈ St(N, M) as an operator; build it with :func:`tcwy`."""

    _mode_forward = "embed"
    _mode_transpose = "project"


def cwy(V: Any, *, theta: Any = None, structure: str = "auto", xp: Any = None) -> CWY:
    """The orthogonal (unitary) operator Q = H(v₁)…H(v_L) in compact WY form.

    Parameters
    ----------
    V : array, shape (..., N, L), L ≤ N
        Reflection vectors as columns; H(0) = I (Zhang, Lei & Dhillon, ICML 2018 eq. 1). Integer
        input is promoted to the namespace's default float (float64 for NumPy, float32 for torch).
        Complex V (complex64/complex128) gives the unitary Q, H(v) = I − 2vvᴴ/‖v‖².
    theta : real array, shape (..., N), optional
        Phases of a right factor: Q = H(v₁)…H(v_L) diag(e^{iθ}) (Mhammedi et al., ICML 2017,
        §4.3, Corollary 1), a complex operator (also for real V). With N − 1 reflectors every
        unitary matrix is reached; :func:`householder_vectors` with ``return_phases=True``
        returns (V, θ) for a given one. Batch axes broadcast with V's; differentiable.
    structure : {"auto", "trapezoidal", "dense"}, default "auto"
        Whether V is lower trapezoidal (V[i, j] = 0 for i < j, Mhammedi et al., ICML 2017 eq. 9),
        which ``.matrix()`` and ``@`` exploit. "auto" detects it on eager arrays (one N·L
        comparison, once per operator; never on JAX tracers or other lazy arrays, which are then
        treated as dense). "trapezoidal" declares it: on eager arrays V must then be lower
        trapezoidal (ValueError otherwise, one N·L comparison); under ``jax.jit`` and on lazy
        arrays it is not checked and the entries above the diagonal are ignored (the operator is
        built from tril(V)). "dense" never uses the structure.
    xp : namespace, optional
        Array namespace to use instead of the one inferred from ``V``.

    Returns
    -------
    CWY
        Operator with ``@`` (matmul semantics), ``.T`` (transpose), ``.H`` (conjugate
        transpose = inverse; ``.T`` for real V), ``.conj()``, ``.matrix()``, ``.mv``, ``.shape``
        (..., N, N), ``.dtype`` and ``.device`` of ``V`` (complex with ``theta``).

    Notes
    -----
    Q = I − U S⁻¹ Uᵀ, U = [v₁/‖v₁‖ … v_L/‖v_L‖], S = ½I + striu(UᵀU) (Likhosherstov et al., AISTATS
    2021, Theorem 2).
    Building costs N·L² + L³/3 flops (Gram matrix, triangular inverse; accumulated in float64
    for float32 input on CPU); ``Q @ h`` for h (N, B) costs 4·N·L·B + L²·B. T stays
    bounded for any reflectors (diagonal 2, off-diagonal entries
    T_ij = −4 u_iᵀ H(u_{i+1})…H(u_{j−1}) u_j of modulus ≤ 4).

    For lower-trapezoidal V, ``Q @ h`` skips the zeros by blocked GEMMs, 4·N·L·B − L²·B + 3·L²·B/k
    flops with k ≤ 8 column blocks (Mhammedi et al., ICML 2017, Table 2: (4n − m)m per vector),
    where measured faster (L ≥ 256 and L ≥ N/2; for B < 16 right-hand sides L ≥ 3N/4 and L ≥ 512),
    on the paths without autodiff wiring (NumPy, array-api-strict, CuPy, torch without grad); JAX
    and torch with grad use the dense products, with the same values. ``.matrix()`` is blocked like
    LAPACK orgqr (4N³/3 flops for L = N) on NumPy, CuPy and torch without grad.

    Examples
    --------
    >>> import numpy as np, householderla as hl
    >>> rng = np.random.default_rng(0)
    >>> V = rng.standard_normal((6, 3))
    >>> Q = hl.cwy(V)
    >>> h = rng.standard_normal(6)
    >>> bool(np.allclose(Q @ h, hl.householder_apply(V, h)))
    True
    >>> bool(np.allclose(Q.T @ (Q @ h), h))
    True
    """
    if is_dask_array(V):  # tall, row-chunked V: householderla._operator.tall (docs/dask.rst)
        if theta is not None:
            raise TypeError("theta is not supported for a row-chunked Dask V")
        return tall_operator(V, "square")  # type: ignore[return-value]
    V, xp, structure, theta, lower = _prepare(V, structure, xp, theta, -2)
    return CWY(V, xp, False, None, structure, theta=theta, trapezoidal=lower)


def _prepare(
    V: Any, structure: Any, xp: Any, theta: Any, axis: int
) -> tuple[Any, Any, str, Any, bool | None]:
    """Resolved, validated V (tril(V) for "trapezoidal"), namespace, structure, phases θ
    (None, or real of V's precision with V complex and both broadcast to one batch shape;
    ``axis`` -2 for θ of length N, -1 for length L) and whether V is lower trapezoidal where
    one pass of :func:`~householderla._operator.factors.scan_reflectors` checked it (else None)."""
    if theta is None:
        xp, _, _, (V,) = resolve([("V", V)], xp, complex_ok=True, half=True)
    else:
        dt = getattr(theta, "dtype", None)
        if is_complex(dt) if dt is not None else np.iscomplexobj(theta):
            raise TypeError("theta must be real: the phases θ of diag(e^{iθ})")
        named = [("V", V), ("theta", theta)]
        xp, _, dtype, (V, theta) = resolve(named, xp, complex_ok=True, half=True)
        V = V if is_complex(V.dtype) else xp.astype(V, complex_dtype(xp, dtype))
        rdtype = real_dtype(xp, V.dtype)
        theta = xp.real(theta) if is_complex(theta.dtype) else theta  # exact: θ was real
        theta = theta if theta.dtype == rdtype else xp.astype(theta, rdtype)
        check_finite(theta, xp, "theta")
    check_reflectors(V)
    if theta is not None:
        K = V.shape[axis]
        if theta.ndim < 1 or theta.shape[-1] != K:
            raise ValueError(
                f"theta must have shape (..., {K}) (one phase per "
                f"{'row' if axis == -2 else 'column'} of V); got shape {tuple(theta.shape)}"
            )
        batch = broadcast_batch([("V", V.shape[:-2]), ("theta", theta.shape[:-1])])
        if tuple(V.shape[:-2]) != batch:
            V = xp.broadcast_to(V, (*batch, *V.shape[-2:]))
        if tuple(theta.shape[:-1]) != batch:
            theta = xp.broadcast_to(theta, (*batch, K))
    structure = check_structure(structure)
    # a stack of NumPy / CPU torch floats: the value and structure checks in one pass
    scan = scan_reflectors(V) if theta is None else None
    lower = None if scan is None else scan[1]
    if structure == "trapezoidal":
        Vt = V if lower else xp.tril(V)  # (scanned: V itself; unscanned lazy V: upper ignored)
        if lower is False or (
            lower is None
            and is_eager(V)
            and math.prod(V.shape)
            and bool(xp.any(xp.triu(V, k=1) != 0))  # (V != tril(V) is True at a NaN below)
        ):
            raise ValueError(
                'structure="trapezoidal" declares V lower trapezoidal, but V has nonzero '
                "entries above its diagonal; pass tril(V) (for LAPACK's (a, tau) the reflectors "
                "are tril(a, -1) + I scaled by tau != 0), or structure='auto'"
            )
        V = Vt
    if scan is None:
        V = finite_reflectors(V, xp)  # NaN/Inf raise when the operator is built (eager V)
    elif not scan[0]:
        check_finite_columns(V, xp)  # raises, naming the columns
    return V, xp, structure, theta, lower


def tcwy(V: Any, *, theta: Any = None, structure: str = "auto", xp: Any = None) -> TCWY:
    """The Stiefel matrix Ω = γ_{N,M}(V) (truncated CWY) as an operator.

    Parameters
    ----------
    V : array, shape (..., N, M), M ≤ N
        Reflection vectors as columns (complex: a point of the complex Stiefel manifold).
    theta : real array, shape (..., M), optional
        Phases of a right factor: Ω = γ_{N,M}(V) diag(e^{iθ}), complex; with it every complex
        Stiefel matrix is reached (:func:`tcwy_vectors` with ``return_phases=True``).
    structure : {"auto", "trapezoidal", "dense"}, default "auto"
        Whether V is lower trapezoidal (V[i, j] = 0 for i < j, Mhammedi et al., ICML 2017 eq. 9),
        which ``.matrix()`` and ``@`` exploit. "auto" detects it on eager arrays (one N·L
        comparison, once per operator; never on JAX tracers or other lazy arrays, which are then
        treated as dense). "trapezoidal" declares it: on eager arrays V must then be lower
        trapezoidal (ValueError otherwise, one N·L comparison); under ``jax.jit`` and on lazy
        arrays it is not checked and the entries above the diagonal are ignored (the operator is
        built from tril(V)). "dense" never uses the structure.
    xp : namespace, optional
        Array namespace to use instead of the one inferred from ``V``.

    Returns
    -------
    TCWY
        Operator of shape (..., N, M): ``Ω @ x`` for x (M,) or (..., M, B), ``Ω.T @ y`` (and
        ``Ω.H @ y``, the same for real V) for y (N,) or (..., N, B), ``Ω.matrix()`` (N×M, never
        N×N).

    Notes
    -----
    Ω = [I_M; 0] − U S⁻¹ U₁ᵀ with U₁ the top M×M block of U: the first M columns of H(v₁)…H(v_M), a
    surjection onto St(N, M) (Likhosherstov et al., AISTATS 2021, Theorem 3). Building costs N·M² +
    M³/3 flops, ``Ω @ x`` 2·M²·B + 2·N·M·B + M²·B, ``.matrix()`` 2·N·M². Lower-trapezoidal V (what
    :func:`tcwy_vectors` returns) uses the blocked products of
    :func:`cwy` for ``@`` under the same conditions (U₁ is then lower triangular).

    Examples
    --------
    >>> import numpy as np, householderla as hl
    >>> Om = hl.tcwy(np.random.default_rng(0).standard_normal((5, 2))).matrix()
    >>> bool(np.allclose(Om.T @ Om, np.eye(2)))
    True
    """
    if is_dask_array(V):  # tall, row-chunked V: householderla._operator.tall (docs/dask.rst)
        if theta is not None:
            raise TypeError("theta is not supported for a row-chunked Dask V")
        return tall_operator(V, "embed")  # type: ignore[return-value]
    V, xp, structure, theta, lower = _prepare(V, structure, xp, theta, -1)
    return TCWY(V, xp, False, None, structure, theta=theta, trapezoidal=lower)


def __dir__() -> list[str]:
    """Only the public names: the imports above stay attributes but are not listed."""
    return sorted(__all__)
