"""Compact WY (CWY) and truncated CWY (T-CWY) operators.

``cwy(V)`` is Q = H(v₁)…H(v_L) = I − U S⁻¹ Uᵀ with S = ½I + striu(UᵀU) (seed 000 Theorem 2;
seed 001 Proposition 1); ``tcwy(V)`` is Ω = γ_{N,M}(V) = [I; 0] − U S⁻¹ U₁ᵀ, the first M
columns of H(v₁)…H(v_M) (seed 000 Theorem 3). Both are operators: the factors U and T = S⁻¹
are computed once, on the operator's first product (N·L² + L³/3 flops), and every ``@``
costs two GEMMs and one small L×L product; the N×N (or N×M) matrix is formed only by ``.matrix()``.

Lower-trapezoidal V (column j zero above row j: LAPACK's and oRNN's layout, seed 001 eq. 9)
is exploited by ``.matrix()`` (orgqr-style blocking) and by ``@`` (blocked products that skip
the zeros, :mod:`householderla._structured`); ``structure=`` declares, detects or disables it.

With torch tensors that require grad, and always with JAX arrays, building and applying the
operator goes through :mod:`householderla.vjp`'s explicit backward passes (lazily imported
adapters, never autodiff through our internals).
"""

from __future__ import annotations

from typing import Any

import array_api_compat as aac

from . import _compact_wy as K
from . import _structured as S
from ._dask import dask_matmul, dask_rmatmul, is_dask_array
from ._lib.namespace import device_of, is_eager, mT, resolve
from .householder import (
    _check_reflectors,
    apply_sequential,
    as_matrix_operand,
    sequential_is_faster,
)

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


STRUCTURES = ("auto", "trapezoidal", "dense")


def _check_structure(structure: Any) -> str:
    if not (isinstance(structure, str) and structure in STRUCTURES):
        raise ValueError(
            f"structure must be one of 'auto', 'trapezoidal', 'dense'; got {structure!r}"
        )
    return structure


def _lowrank(
    U: Any, T: Any, h: Any, xp: Any, transpose: bool, mode: str, structured: bool = False
) -> Any:
    if aac.is_jax_namespace(xp):
        from ._autodiff_jax import lowrank_apply, lowrank_matrix

        if h is None:
            return lowrank_matrix(U, T, transpose, mode)
        return lowrank_apply(U, T, h, transpose, mode)
    if aac.is_torch_namespace(xp) and _torch_needs_grad(U, T, h):
        from ._autodiff_torch import LowRankApply

        return LowRankApply.apply(U, T, h, transpose, mode)
    if structured and h is not None:
        return S.lowrank_apply(U, T, h, xp, transpose=transpose, mode=mode)
    return K.lowrank_apply(U, T, h, xp, transpose=transpose, mode=mode)


class _Factors:
    """U and T of V, computed on first use and shared by an operator and its transpose.

    ``cwy(V).matrix()`` for lower-trapezoidal V never needs them. With torch, factors cached
    without a graph (first used under ``no_grad``) are rebuilt when a later use needs one.
    Also holds the ``structure`` of V and, for "auto", the result of detecting it (once).
    """

    __slots__ = ("T", "U", "V", "_trapezoidal", "sequential_used", "structure", "xp")

    def __init__(self, V: Any, xp: Any, structure: str = "auto") -> None:
        self.V, self.xp, self.structure = V, xp, structure
        self.U = self.T = None
        self._trapezoidal: bool | None = None
        self.sequential_used = False

    def trapezoidal(self) -> bool:
        """Whether V is lower trapezoidal: declared ("trapezoidal"), excluded ("dense"), or
        detected once on eager arrays ("auto": one N·L comparison; never on lazy arrays)."""
        if self.structure != "auto":
            return self.structure == "trapezoidal"
        if self._trapezoidal is None:
            self._trapezoidal = K.is_lower_trapezoidal(self.V, self.xp)
        return self._trapezoidal

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

    def __init__(
        self,
        V: Any,
        xp: Any,
        transposed: bool = False,
        factors: Any = None,
        structure: str = "auto",
    ) -> None:
        self._V = V  # the given vectors, resolved but never copied or written
        self._xp = xp
        self._transposed = transposed
        self._factors = _Factors(V, xp, structure) if factors is None else factors

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
        """``self @ h`` with ``matmul`` semantics: h (K,) or (..., K, B), K = cols.

        A Dask array ``h`` gives a lazy Dask array computed chunk by chunk
        (:mod:`householderla._dask`). On NumPy, the first product of an operator whose
        factors are not built yet may run the reflections one at a time (Numba kernel) when
        :func:`~householderla.householder.sequential_is_faster` says so for its shape; later
        products build and reuse U, T.
        """
        xp = self._xp
        if is_dask_array(h):
            return dask_matmul(self, h)
        h = self._operand(h)
        y = self._first_product_sequential(h)
        if y is not None:
            return y
        U, T = self._U, self._T
        if U.dtype != h.dtype:
            U, T = xp.astype(U, h.dtype), xp.astype(T, h.dtype)
        hm, vector = as_matrix_operand(h, self._n_rows_cols[1])
        structured = self._use_structured(hm.shape[-1])
        y = _lowrank(U, T, hm, xp, self._transposed, self._mode, structured)
        return y[..., 0] if vector else y

    @property
    def structure(self) -> str:
        """The ``structure`` given to :func:`cwy` / :func:`tcwy`: auto, trapezoidal or dense."""
        return self._factors.structure

    def _use_structured(self, B: int) -> bool:
        """Blocked trapezoidal products for ``@`` with B right-hand sides: V lower trapezoidal
        and a shape where they were measured faster (``_structured.use_structured``)."""
        N, L = self._V.shape[-2], self._V.shape[-1]
        return S.use_structured(N, L, B) and self._factors.trapezoidal()

    def _first_product_sequential(self, h: Any) -> Any:
        """Q h by sequential reflections (Numba) for the operator's first NumPy product when
        the measured crossover favours it over building U, T; None otherwise."""
        f = self._factors
        if f.U is not None or f.sequential_used or self._mode != "square":
            return None
        if not aac.is_numpy_namespace(self._xp):
            return None
        N, L = self._V.shape[-2], self._V.shape[-1]
        B = 1 if h.ndim == 1 else h.shape[-1]
        if not sequential_is_faster(N, L, B, h.dtype):
            return None
        f.sequential_used = True  # the next product builds the factors and reuses them
        V = self._V if self._V.dtype == h.dtype else self._xp.astype(self._V, h.dtype)
        return apply_sequential(V, h, transpose=self._transposed, xp=self._xp)

    def __rmatmul__(self, h: Any) -> Any:
        """``h @ self`` = (selfᵀ @ hᵀ)ᵀ; h (K,) or (..., B, K), K = rows."""
        if is_dask_array(h):
            return dask_rmatmul(self, h)
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

    def _direct_dense(self) -> Any:
        """The dense matrix straight from V when no autodiff follows (NumPy/CuPy/torch):
        orgqr-style for lower-trapezoidal V, else the one-shot I − V S⁻¹ Vᵀ."""
        xp, V = self._xp, self._V
        if V is None or not (
            aac.is_numpy_namespace(xp)
            or aac.is_cupy_namespace(xp)
            or (aac.is_torch_namespace(xp) and not _torch_needs_grad(V))
        ):
            return None
        ncols = None if self._mode_forward == "square" else V.shape[-1]
        if self._factors.trapezoidal():
            return K.structured_matrix(V, xp, ncols)
        return K.dense_matrix(V, xp, ncols)

    def matrix(self) -> Any:
        """The dense matrix, shape ``self.shape``.

        Lower-trapezoidal V (LAPACK's layout, and what :func:`householder_vectors` returns)
        on NumPy/torch/CuPy without autodiff: blocked like LAPACK orgqr on the trailing
        submatrices (:func:`~householderla._compact_wy.structured_matrix`, 4N³/3 flops for
        L = N, float64 ‖QᵀQ − I‖ at orgqr's level); any other V there: the one-shot
        I − V S⁻¹ Vᵀ with unnormalised factors (:func:`~householderla._compact_wy.dense_matrix`:
        syrk, one triangular solve, one GEMM). With autodiff or on other namespaces:
        I − U (T Uᵀ) through the differentiable factors (2·N²·L flops for CWY, 2·N·M² for
        T-CWY). float32 input is formed in float64 on CPU.
        """
        mode = self._mode_forward
        dense = self._direct_dense()
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


def cwy(V: Any, *, structure: str = "auto", xp: Any = None) -> CWY:
    """The orthogonal operator Q = H(v₁)…H(v_L) in compact WY form.

    Parameters
    ----------
    V : array, shape (..., N, L), L ≤ N
        Reflection vectors as columns; H(0) = I (seed 002 eq. 1). Integer input is promoted to
        the namespace's default float (float64 for NumPy, float32 for torch).
    structure : {"auto", "trapezoidal", "dense"}, default "auto"
        Whether V is lower trapezoidal (V[i, j] = 0 for i < j, seed 001 eq. 9), which
        ``.matrix()`` and ``@`` exploit. "auto" detects it on eager arrays (one N·L
        comparison, once per operator; never on JAX tracers or other lazy arrays, which are
        then treated as dense). "trapezoidal" declares it without any check (jit-friendly):
        the entries above the diagonal are *ignored*, i.e. the operator is built from
        tril(V), whatever they hold (also NaN). "dense" never uses the structure.
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

    For lower-trapezoidal V, ``Q @ h`` skips the zeros by blocked GEMMs,
    4·N·L·B − L²·B + 3·L²·B/k flops with k ≤ 8 column blocks (seed 001 Table 2: (4n − m)m
    per vector), where measured faster (L ≥ 256 and L ≥ N/2; for B < 16 right-hand sides
    L ≥ 3N/4 and L ≥ 512), on the paths without autodiff wiring (NumPy, array-api-strict,
    CuPy, torch without grad); JAX and torch with grad use the dense products, with the same
    values. ``.matrix()`` is blocked like LAPACK orgqr
    (4N³/3 flops for L = N) on NumPy, CuPy and torch without grad.

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
    return CWY(*_prepare(V, structure, xp))


def _prepare(V: Any, structure: Any, xp: Any) -> tuple[Any, Any, bool, None, str]:
    """Resolved, validated V (tril(V) for "trapezoidal") and the operator's arguments."""
    xp, _, _, (V,) = resolve([("V", V)], xp)
    _check_reflectors(V)
    structure = _check_structure(structure)
    if structure == "trapezoidal":
        V = xp.tril(V)
    _check_finite(V, xp)
    return V, xp, False, None, structure


def tcwy(V: Any, *, structure: str = "auto", xp: Any = None) -> TCWY:
    """The Stiefel matrix Ω = γ_{N,M}(V) (truncated CWY) as an operator.

    Parameters
    ----------
    V : array, shape (..., N, M), M ≤ N
        Reflection vectors as columns.
    structure : {"auto", "trapezoidal", "dense"}, default "auto"
        Whether V is lower trapezoidal (V[i, j] = 0 for i < j, seed 001 eq. 9), which
        ``.matrix()`` and ``@`` exploit. "auto" detects it on eager arrays (one N·L
        comparison, once per operator; never on JAX tracers or other lazy arrays, which are
        then treated as dense). "trapezoidal" declares it without any check (jit-friendly):
        the entries above the diagonal are *ignored*, i.e. the operator is built from
        tril(V), whatever they hold (also NaN). "dense" never uses the structure.
    xp : namespace, optional
        Array namespace to use instead of the one inferred from ``V``.

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
    Lower-trapezoidal V (what :func:`tcwy_vectors` returns) uses the blocked products of
    :func:`cwy` for ``@`` under the same conditions (U₁ is then lower triangular).

    Examples
    --------
    >>> import numpy as np, householderla as hl
    >>> Om = hl.tcwy(np.random.default_rng(0).standard_normal((5, 2))).matrix()
    >>> bool(np.allclose(Om.T @ Om, np.eye(2)))
    True
    """
    return TCWY(*_prepare(V, structure, xp))
