"""CWY and T-CWY operators whose reflectors are a row-chunked Dask array: N beyond memory.

``hl.cwy(V)`` / ``hl.tcwy(V)`` with V a Dask array (N, M) chunked along its rows return a
:class:`TallCWY` / :class:`TallTCWY`. Building one computes nothing. The first product (or
:meth:`TallOperator.factors`) runs one pass over V — the column norms and the Gram matrix UᵀU
as a tree reduction — and computes T = S⁻¹ on the client (M×M); products are lazy Dask arrays,
one task per row chunk, computed by ``.compute()``. The kernels and their costs are in
:mod:`householderla._interop.dask_tall`. NumPy operands are wrapped into Dask arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._interop.dask_tall import (
    TallFactors,
    as_rows,
    check_tall,
    project,
    rows_apply,
    tall_factors,
    unit_rows,
)

__all__ = ["TallCWY", "TallOperator", "TallTCWY", "tall_operator"]


def tall_operator(V: Any, kind: str) -> TallOperator:
    """A :class:`TallCWY` (``kind="square"``) or :class:`TallTCWY` (``"embed"``) of a Dask V."""
    V = check_tall(V)
    return (TallCWY if kind == "square" else TallTCWY)(V)


class TallOperator:
    """Shared machinery of the tall operators (and their transposes, which share the factors)."""

    _mode_forward = "square"
    __array_ufunc__ = None  # ``ndarray @ op`` defers to ``op.__rmatmul__``

    def __init__(self, V: Any, transposed: bool = False, box: list | None = None) -> None:
        self._V, self._transposed = V, transposed
        self._box: list[TallFactors | None] = box if box is not None else [None]

    # -- metadata ---------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        N, M = self._V.shape
        full = (N, N) if self._mode_forward == "square" else (N, M)
        return (full[1], full[0]) if self._transposed else full

    @property
    def ndim(self) -> int:
        return 2

    @property
    def dtype(self) -> Any:
        return np.dtype(self._V.dtype)

    @property
    def V(self) -> Any:
        """The reflection vectors, a Dask array (N, M) chunked along its rows."""
        return self._V

    @property
    def transposed(self) -> bool:
        return self._transposed

    @property
    def T(self) -> TallOperator:
        """The transpose (for CWY the inverse), sharing the factors."""
        return type(self)(self._V, not self._transposed, self._box)

    mT = T

    def __repr__(self) -> str:
        t = ".T" if self._transposed else ""
        chunks = len(self._V.chunks[0])
        return (
            f"{type(self).__name__}(shape={self.shape}, dtype={self.dtype}, {chunks} row chunks){t}"
        )

    # -- factors ----------------------------------------------------------------------------
    def factors(self) -> TallFactors:
        """The client-side factors (column scales, T = S⁻¹, U₁), computed on first use by one
        tree-reduction pass over V."""
        if self._box[0] is None:
            self._box[0] = tall_factors(self._V)
        return self._box[0]

    @property
    def T_factor(self) -> np.ndarray:
        """T = S⁻¹ (M, M), a NumPy array (computes the factors)."""
        return self.factors().T

    @property
    def U(self) -> Any:
        """Unit reflection vectors (N, M), lazy and row-chunked like V (computes the factors)."""
        f = self.factors()
        return self._V.map_blocks(unit_rows, f.m, f.dn, dtype=self.dtype)

    # -- products ---------------------------------------------------------------------------
    def _dtype_with(self, h: Any) -> Any:
        dt = np.dtype(h.dtype)
        if dt.kind in "iub":
            return self.dtype
        if dt.kind != "f":
            raise TypeError(f"h must have a real floating or integer dtype; got {dt}")
        return np.result_type(dt, self.dtype)

    def __matmul__(self, h: Any) -> Any:
        """``self @ h``: h (cols,) or (cols, B), a Dask or NumPy array; a lazy Dask result."""
        if not (hasattr(h, "chunks") or isinstance(h, np.ndarray)):
            if hasattr(h, "shape") and hasattr(h, "dtype"):
                raise TypeError(
                    f"h is a {type(h).__module__}.{type(h).__name__}; a tall Dask operator "
                    "takes Dask or NumPy operands"
                )
            h = np.asarray(h)
        dtype = self._dtype_with(h)
        vector = h.ndim == 1
        hm = h[:, None] if vector else h
        mode = self._mode_forward
        if mode == "embed" and self._transposed:
            mode = "project"
        if hm.ndim != 2 or hm.shape[0] != self.shape[1]:
            n = self.shape[1]
            raise ValueError(f"h must have shape ({n},) or ({n}, B); got shape {tuple(h.shape)}")
        f = self.factors()
        V = self._V if dtype == self.dtype else self._V.astype(dtype)
        if mode == "embed":
            y = self._embed(V, f, hm, dtype)
        elif mode == "project":
            y = self._project(V, f, hm, dtype)
        else:
            hd = as_rows(hm, V, "h").astype(dtype)
            a = project(V, f, hd, dtype)
            T = (f.T.T if self._transposed else f.T).astype(dtype)
            b = a.map_blocks(_left_mul, T, dtype=dtype)
            y = rows_apply(V, f, b, dtype, h=hd)
        return y[:, 0] if vector else y

    @staticmethod
    def _embed(V: Any, f: TallFactors, x: Any, dtype: Any) -> Any:
        """Ω x = [x; 0] − U (T (U₁ᵀ x)), one pass over V."""
        T, U1 = f.T.astype(dtype), f.U1.astype(dtype)
        if isinstance(x, np.ndarray):
            x = x.astype(dtype)
            b: Any = T @ (U1.T @ x)  # M×B on the client
        else:
            x = x.astype(dtype).rechunk({0: -1})
            b = x.map_blocks(_left_mul, T @ U1.T, dtype=dtype)
        return rows_apply(V, f, b, dtype, top=x)

    @staticmethod
    def _project(V: Any, f: TallFactors, y: Any, dtype: Any) -> Any:
        """Ωᵀ y = y[:M] − U₁ Tᵀ (Uᵀ y), one pass over V and y; (M, B)."""
        M = V.shape[1]
        yd = as_rows(y, V, "h").astype(dtype)
        a = project(V, f, yd, dtype)
        P = (f.U1 @ f.T.T).astype(dtype)
        return yd[:M].rechunk({0: -1}) - a.map_blocks(_left_mul, P, dtype=dtype)

    def __rmatmul__(self, h: Any) -> Any:
        """``h @ self`` = (selfᵀ @ hᵀ)ᵀ for h (rows,) or (B, rows)."""
        if h.ndim == 1:
            return self.T @ h
        return (self.T @ h.T).T

    def matrix(self) -> Any:
        """The dense matrix as a lazy Dask array, row-chunked like V (T-CWY: N×M; CWY: N×N,
        only sensible for moderate N)."""
        import dask.array as da

        N, M = self._V.shape
        if self._mode_forward == "square":  # Q I (Qᵀ I for the transpose)
            return self @ da.eye(N, chunks=self._V.chunks[0][0], dtype=self.dtype)
        E = TallTCWY(self._V, False, self._box) @ np.eye(M, dtype=self.dtype)
        return E.T if self._transposed else E


def _left_mul(block: np.ndarray, A: np.ndarray) -> np.ndarray:
    return A @ block


class TallCWY(TallOperator):
    """Q = H(v₁)…H(v_M) = I − U T Uᵀ for a row-chunked Dask V; build it with :func:`cwy`."""


class TallTCWY(TallOperator):
    """Ω = γ_{N,M}(V) ∈ St(N, M) for a row-chunked Dask V; build it with :func:`tcwy`."""

    _mode_forward = "embed"
