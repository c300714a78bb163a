"""Compact WY (CWY) and truncated CWY (T-CWY) operators.

``cwy(V)`` is Q = H(v₁)…H(v_L) = I − U S⁻¹ Uᵀ with S = ½I + striu(UᵀU) (seed 000 Theorem 2;
seed 001 Proposition 1); ``tcwy(V)`` is Ω = γ_{N,M}(V) = [I; 0] − U S⁻¹ U₁ᵀ, the first M
columns of H(v₁)…H(v_M) (seed 000 Theorem 3). Both are operators: the factors U and T = S⁻¹
are computed once, on the operator's first product (N·L² + L³/3 flops), and every ``@``
costs two GEMMs and one small L×L product; the N×N (or N×M) matrix is formed only by ``.matrix()``.

With torch tensors that require grad, and always with JAX arrays, building and applying the
operator goes through :mod:`householderla.vjp`'s explicit backward passes (lazily imported
adapters, never autodiff through our internals).
"""

from __future__ import annotations

from typing import Any

import array_api_compat as aac

from . import _compact_wy as K
from ._lib.namespace import device_of, is_eager, mT, resolve
from .householder import _check_reflectors, as_matrix_operand

__all__ = ["CWY", "TCWY", "cwy", "tcwy"]


def _torch_needs_grad(*tensors: Any) -> bool:
    import torch

    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _check_finite(V: Any, xp: Any) -> None:
    """NaN/Inf in V raise when the operator is built (eager arrays; one N·L max-abs pass)."""
    if is_eager(V):
        K.check_finite_norms(xp.max(xp.abs(V), axis=-2, keepdims=True), xp)


def _factors(V: Any, xp: Any) -> tuple[Any, Any]:
    """U and T of ``V``, through the explicit VJP when autodiff may follow."""
    if aac.is_jax_namespace(xp):
        from ._autodiff_jax import cwy_factors

        U, T, _ = cwy_factors(V)
    elif aac.is_torch_namespace(xp) and _torch_needs_grad(V):
        from ._autodiff_torch import CWYFactors

        U, T, _ = CWYFactors.apply(V)
    else:
        U, T, _ = K.cwy_factors(V, xp, check=False)
    return U, T


def _lowrank(U: Any, T: Any, h: Any, xp: Any, transpose: bool, mode: str) -> Any:
    if aac.is_jax_namespace(xp):
        from ._autodiff_jax import lowrank_apply, lowrank_matrix

        if h is None:
            return lowrank_matrix(U, T, transpose, mode)
        return lowrank_apply(U, T, h, transpose, mode)
    if aac.is_torch_namespace(xp) and _torch_needs_grad(U, T, h):
        from ._autodiff_torch import LowRankApply

        return LowRankApply.apply(U, T, h, transpose, mode)
    return K.lowrank_apply(U, T, h, xp, transpose=transpose, mode=mode)


class _Factors:
    """U and T of V, computed on first use and shared by an operator and its transpose.

    ``cwy(V).matrix()`` for lower-trapezoidal V never needs them. With torch, factors cached
    without a graph (first used under ``no_grad``) are rebuilt when a later use needs one.
    """

    __slots__ = ("T", "U", "V", "xp")

    def __init__(self, V: Any, xp: Any) -> None:
        self.V, self.xp = V, xp
        self.U = self.T = None

    def get(self) -> tuple[Any, Any]:
        stale = self.U is None or (
            aac.is_torch_namespace(self.xp)
            and _torch_needs_grad(self.V)
            and not self.U.requires_grad
        )
        if stale:
            self.U, self.T = _factors(self.V, self.xp)
        return self.U, self.T


class _CompactWY:
    """Shared machinery of :class:`CWY` and :class:`TCWY` (and their transposes)."""

    _mode_forward = "square"
    _mode_transpose = "square"
    # make ``ndarray @ op`` defer to ``op.__rmatmul__`` instead of treating op as a scalar
    __array_ufunc__ = None

    def __init__(self, V: Any, xp: Any, transposed: bool = False, factors: Any = None) -> None:
        self._V = V  # the given vectors, resolved but never copied or written
        self._xp = xp
        self._transposed = transposed
        self._factors = _Factors(V, xp) if factors is None else factors

    # -- array-like metadata -------------------------------------------------------------
    @property
    def _U(self) -> Any:
        return self._factors.get()[0]

    @property
    def _T(self) -> Any:
        return self._factors.get()[1]

    @property
    def _n_rows_cols(self) -> tuple[int, int]:
        N, m = self._V.shape[-2], self._V.shape[-1]
        full = (N, N) if self._mode_forward == "square" else (N, m)
        return (full[1], full[0]) if self._transposed else full

    @property
    def shape(self) -> tuple[int, ...]:
        """``(..., rows, cols)`` of the matrix this operator represents."""
        return tuple(self._V.shape[:-2]) + self._n_rows_cols

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> Any:
        return self._V.dtype

    @property
    def device(self) -> Any:
        return device_of(self._V)

    @property
    def U(self) -> Any:
        """Unit reflection vectors, shape (..., N, L) (zero columns stay zero)."""
        return self._U

    @property
    def T_factor(self) -> Any:
        """T = S⁻¹, upper triangular, shape (..., L, L)."""
        return self._T

    @property
    def T(self) -> _CompactWY:
        """The transposed operator (for CWY also the inverse); shares the factors."""
        return type(self)(self._V, self._xp, not self._transposed, self._factors)

    mT = T

    @property
    def _mode(self) -> str:
        return self._mode_transpose if self._transposed else self._mode_forward

    def __repr__(self) -> str:
        t = ".T" if self._transposed else ""
        return f"{type(self).__name__}(shape={self.shape}, dtype={self.dtype}){t}"

    # -- products ------------------------------------------------------------------------
    def _operand(self, h: Any) -> Any:
        """``h`` as an array of this operator's namespace, device and common float dtype."""
        if aac.is_jax_namespace(self._xp) and aac.is_numpy_array(h):
            h = self._xp.asarray(h)  # JAX code mixes in NumPy constants routinely
        if aac.is_array_api_obj(h) and aac.array_namespace(h) is not self._xp:
            held = type(self._V)
            raise TypeError(
                f"h is a {type(h).__module__}.{type(h).__name__} but the operator holds "
                f"{held.__module__}.{held.__name__} arrays; convert h first"
            )
        xp, device, _, (h,) = resolve([("h", h)], self._xp)
        if device is not None and self.device is not None and device != self.device:
            raise ValueError(f"h is on device {device} but the operator is on {self.device}")
        if h.dtype != self.dtype:
            h = xp.astype(h, xp.result_type(h.dtype, self.dtype))
        return h

    def __matmul__(self, h: Any) -> Any:
        """``self @ h`` with ``matmul`` semantics: h (K,) or (..., K, B), K = cols."""
        xp = self._xp
        h = self._operand(h)
        U, T = self._U, self._T
        if U.dtype != h.dtype:
            U, T = xp.astype(U, h.dtype), xp.astype(T, h.dtype)
        hm, vector = as_matrix_operand(h, self._n_rows_cols[1])
        y = _lowrank(U, T, hm, xp, self._transposed, self._mode)
        return y[..., 0] if vector else y

    def __rmatmul__(self, h: Any) -> Any:
        """``h @ self`` = (selfᵀ @ hᵀ)ᵀ; h (K,) or (..., B, K), K = rows."""
        h = self._operand(h)
        if h.ndim == 1:
            return self.T @ h
        return mT(self.T @ mT(h))

    def mv(self, h: Any) -> Any:
        """Apply to a stack of vectors along the last axis: h (..., K) -> (..., rows)."""
        h = self._operand(h)
        if h.ndim == 0:
            raise ValueError(f"h must have shape (..., {self._n_rows_cols[1]}); got a scalar")
        return (self @ h[..., None])[..., 0]

    def _structured_dense(self) -> Any:
        """orgqr-style dense matrix when V is lower trapezoidal and no autodiff follows."""
        xp, V = self._xp, self._V
        if V is None or not (
            aac.is_numpy_namespace(xp)
            or aac.is_cupy_namespace(xp)
            or (aac.is_torch_namespace(xp) and not _torch_needs_grad(V))
        ):
            return None
        if not K.is_lower_trapezoidal(V, xp):
            return None
        ncols = None if self._mode_forward == "square" else V.shape[-1]
        return K.structured_matrix(V, xp, ncols)

    def matrix(self) -> Any:
        """The dense matrix, shape ``self.shape``.

        Lower-trapezoidal V (LAPACK's layout, and what :func:`householder_vectors` returns)
        on NumPy/torch/CuPy without autodiff: blocked like LAPACK orgqr on the trailing
        submatrices (:func:`~householderla._compact_wy.structured_matrix`, 4N³/3 flops for
        L = N, float64 ‖QᵀQ − I‖ at orgqr's level). Otherwise the one-shot I − U (T Uᵀ)
        (2·N²·L flops for CWY, 2·N·M² for T-CWY). float32 input is formed in float64 on CPU.
        """
        mode = self._mode_forward
        dense = self._structured_dense()
        if dense is not None:
            return mT(dense) if self._transposed else dense
        out = _lowrank(self._U, self._T, None, self._xp, False, mode)
        if self._transposed:
            return (
                mT(out)
                if mode == "embed"
                else _lowrank(self._U, self._T, None, self._xp, True, mode)
            )
        return out


class CWY(_CompactWY):
    """Q = H(v₁)…H(v_L) = I − U T Uᵀ as an operator; build it with :func:`cwy`."""


class TCWY(_CompactWY):
    """Ω = γ_{N,M}(V) ∈ St(N, M) as an operator; build it with :func:`tcwy`."""

    _mode_forward = "embed"
    _mode_transpose = "project"


def cwy(V: Any, *, xp: Any = None) -> CWY:
    """The orthogonal operator Q = H(v₁)…H(v_L) in compact WY form.

    Parameters
    ----------
    V : array, shape (..., N, L), L ≤ N
        Reflection vectors as columns; H(0) = I (seed 002 eq. 1). Integer input is promoted to
        the namespace's default float (float64 for NumPy, float32 for torch).
    xp : namespace, optional
        Array namespace to use instead of the one inferred from ``V``.

    Returns
    -------
    CWY
        Operator with ``@`` (matmul semantics), ``.T`` (transpose = inverse), ``.matrix()``,
        ``.mv``, ``.shape`` (..., N, N), ``.dtype`` and ``.device`` of ``V``.

    Notes
    -----
    Q = I − U S⁻¹ Uᵀ, U = [v₁/‖v₁‖ … v_L/‖v_L‖], S = ½I + striu(UᵀU) (seed 000 Theorem 2).
    Building costs N·L² + L³/3 flops (Gram matrix, triangular inverse; accumulated in float64
    for float32 input on CPU); ``Q @ h`` for h (N, B) costs 4·N·L·B + L²·B. T stays
    bounded for any reflectors (diagonal 2, off-diagonal entries
    T_ij = −4 u_iᵀ H(u_{i+1})…H(u_{j−1}) u_j of modulus ≤ 4).

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
    xp, _, _, (V,) = resolve([("V", V)], xp)
    _check_reflectors(V)
    _check_finite(V, xp)
    return CWY(V, xp)


def tcwy(V: Any, *, xp: Any = None) -> TCWY:
    """The Stiefel matrix Ω = γ_{N,M}(V) (truncated CWY) as an operator.

    Parameters
    ----------
    V : array, shape (..., N, M), M ≤ N
        Reflection vectors as columns.

    Returns
    -------
    TCWY
        Operator of shape (..., N, M): ``Ω @ x`` for x (M,) or (..., M, B), ``Ω.T @ y`` for
        y (N,) or (..., N, B), ``Ω.matrix()`` (N×M, never N×N).

    Notes
    -----
    Ω = [I_M; 0] − U S⁻¹ U₁ᵀ with U₁ the top M×M block of U: the first M columns of
    H(v₁)…H(v_M), a surjection onto St(N, M) (seed 000 Theorem 3). Building costs
    N·M² + M³/3 flops, ``Ω @ x`` 2·M²·B + 2·N·M·B + M²·B, ``.matrix()`` 2·N·M².

    Examples
    --------
    >>> import numpy as np, householderla as hl
    >>> Om = hl.tcwy(np.random.default_rng(0).standard_normal((5, 2))).matrix()
    >>> bool(np.allclose(Om.T @ Om, np.eye(2)))
    True
    """
    xp, _, _, (V,) = resolve([("V", V)], xp)
    _check_reflectors(V)
    _check_finite(V, xp)
    return TCWY(V, xp)
