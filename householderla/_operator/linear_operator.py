"""SciPy's ``LinearOperator`` protocol for every operator of the library.

``scipy.sparse.linalg.aslinearoperator(op)`` accepts any object with ``shape``, ``dtype``,
``matvec`` (and uses ``rmatvec``, ``rmatmat`` when present), so CWY, T-CWY, SVD-Householder
operators and their products run in SciPy's iterative solvers and eigensolvers (``gmres``,
``lsqr``, ``eigsh``, ``svds``, …) without forming a matrix: each ``matvec`` is one ``op @ x``
(4·N·L flops for a CWY operator), each ``rmatvec`` one ``op.H @ x`` (the adjoint: the
conjugate transpose, which is the transpose of a real operator). ``op.aslinearoperator()``
returns the ``LinearOperator`` itself, with ``matmat`` too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._interop.dlpack import from_numpy, numpy_dtype, writable_numpy

__all__ = ["LinearOperatorMixin"]


class LinearOperatorMixin:
    """``matvec``, ``rmatvec``, ``matmat``, ``rmatmat`` with SciPy's semantics, and
    ``aslinearoperator()``, for a class with ``shape``, ``dtype``, ``H`` and ``@``."""

    def _matrix_shape(self) -> tuple[int, int]:
        shape = tuple(self.shape)  # type: ignore[attr-defined]
        if len(shape) != 2:
            raise ValueError(
                f"a batched operator (shape {shape}) is not a LinearOperator: one matrix "
                f"per LinearOperator, e.g. build the operator from V[i]"
            )
        return shape  # type: ignore[return-value]

    def matvec(self, x: Any) -> Any:
        """``op @ x`` for x of shape (n,) or (n, 1), returned in the same form (SciPy's
        ``LinearOperator.matvec``); n = ``op.shape[1]``."""
        return self._vector_product(self, x, self._matrix_shape()[1])

    def rmatvec(self, x: Any) -> Any:
        """``op.H @ x`` (the adjoint) for x of shape (m,) or (m, 1); m = ``op.shape[0]``."""
        return self._vector_product(self.H, x, self._matrix_shape()[0])  # type: ignore[attr-defined]

    def matmat(self, X: Any) -> Any:
        """``op @ X`` for X of shape (n, B)."""
        n = self._matrix_shape()[1]
        if X.ndim != 2 or X.shape[0] != n:
            raise ValueError(f"X must have shape ({n}, B); got shape {tuple(X.shape)}")
        return self @ X  # type: ignore[operator]

    def rmatmat(self, X: Any) -> Any:
        """``op.H @ X`` (the adjoint) for X of shape (m, B)."""
        m = self._matrix_shape()[0]
        if X.ndim != 2 or X.shape[0] != m:
            raise ValueError(f"X must have shape ({m}, B); got shape {tuple(X.shape)}")
        return self.H @ X  # type: ignore[attr-defined]

    @staticmethod
    def _vector_product(op: Any, x: Any, n: int) -> Any:
        if tuple(x.shape) not in ((n,), (n, 1)):
            raise ValueError(f"x must have shape ({n},) or ({n}, 1); got shape {tuple(x.shape)}")
        return op @ x

    def _reference_array(self) -> Any:
        """An array of the operator's namespace and device (its parameters)."""
        raise NotImplementedError

    def aslinearoperator(self) -> Any:
        """This operator as a ``scipy.sparse.linalg.LinearOperator``: NumPy arrays in and out,
        fresh and writable (SciPy's solvers update them in place), for an operator on any
        backend on the CPU — torch, JAX, array-api-strict arrays are exchanged by DLPack, a
        vector at a time. Needs SciPy."""
        from scipy.sparse.linalg import LinearOperator

        shape = self._matrix_shape()
        like = self._reference_array()

        def wrap(product: Any) -> Any:
            def numpy_product(x: Any) -> np.ndarray:
                y = product(from_numpy(np.array(x, dtype=dtype), like))
                return writable_numpy(y)

            return numpy_product

        dtype = numpy_dtype(self.dtype)  # type: ignore[attr-defined]
        return LinearOperator(
            shape,
            matvec=wrap(self.matvec),
            rmatvec=wrap(self.rmatvec),
            matmat=wrap(self.matmat),
            rmatmat=wrap(self.rmatmat),
            dtype=dtype,
        )
