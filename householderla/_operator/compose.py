"""Products of operators: ``A @ B`` for two operators of this library gives an operator.

Two square CWY operators of one namespace whose reflectors fit (L₁ + L₂ ≤ N) compose into one
CWY operator: H(V₁)H(V₂) = H(v₁₁)…H(v₁L₁) H(v₂₁)…H(v₂L₂) is the CWY operator of [V₁ V₂]
(a transposed factor contributes its columns in reverse order, Qᵀ = H(v_L)…H(v₁)). Any other
pair (T-CWY, SVD-Householder, too many reflectors) gives an :class:`OperatorProduct`, which
applies its factors right to left and forms nothing until ``.matrix()``.
"""

from __future__ import annotations

from typing import Any

import array_api_compat as aac

from .._lib.checks import broadcast_batch
from .._lib.namespace import mT
from .linear_operator import LinearOperatorMixin

__all__ = ["OperatorProduct", "compose", "is_operator"]


def is_operator(x: Any) -> bool:
    """True for the operators of this library (they have ``matrix`` and are not arrays)."""
    return hasattr(x, "matrix") and hasattr(x, "shape") and not aac.is_array_api_obj(x)


def compose(left: Any, right: Any) -> Any:
    """``left @ right`` for two operators: one CWY operator when the reflectors concatenate,
    else an :class:`OperatorProduct`. ValueError when the inner dimensions differ."""
    if left.shape[-1] != right.shape[-2]:
        raise ValueError(
            f"cannot compose operators of shapes {tuple(left.shape)} and "
            f"{tuple(right.shape)}: inner dimensions {left.shape[-1]} and {right.shape[-2]} differ"
        )
    merged = _merged_cwy(left, right)
    return merged if merged is not None else OperatorProduct(left, right)


def _reflectors(op: Any) -> Any:
    """(V, xp) with the columns of V in the order the product H(v)… applies them, or None
    when ``op`` is not a square CWY operator."""
    sequence = getattr(op, "reflector_sequence", None)
    return sequence() if sequence is not None else None


def _merged_cwy(left: Any, right: Any) -> Any:
    a, b = _reflectors(left), _reflectors(right)
    if a is None or b is None or a[1] is not b[1]:
        return None
    (V1, xp), (V2, _) = a, b
    N = V1.shape[-2]
    if V1.shape[-1] + V2.shape[-1] > N or V1.dtype != V2.dtype:
        return None
    batch = broadcast_batch([("left", V1.shape[:-2]), ("right", V2.shape[:-2])])
    V1 = xp.broadcast_to(V1, (*batch, *V1.shape[-2:]))
    V2 = xp.broadcast_to(V2, (*batch, *V2.shape[-2:]))
    return type(left)(xp.concat([V1, V2], axis=-1), xp)


class OperatorProduct(LinearOperatorMixin):
    """``left @ right`` of two operators, applied right to left (``(left @ right) @ h =
    left @ (right @ h)``); ``.T`` is ``right.T @ left.T``, ``.H`` ``right.H @ left.H``;
    ``.matrix()`` applies ``left`` to
    the dense matrix of ``right``. Shapes follow matmul: batch axes broadcast."""

    __array_ufunc__ = None

    def __init__(self, left: Any, right: Any) -> None:
        self.left, self.right = left, right

    @property
    def shape(self) -> tuple[int, ...]:
        batch = broadcast_batch([("left", self.left.shape[:-2]), ("right", self.right.shape[:-2])])
        return (*batch, self.left.shape[-2], self.right.shape[-1])

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> Any:
        return self.left.dtype

    @property
    def device(self) -> Any:
        return self.left.device

    def _reference_array(self) -> Any:
        return self.left._reference_array()

    @property
    def T(self) -> OperatorProduct:
        return OperatorProduct(self.right.T, self.left.T)

    mT = T

    @property
    def H(self) -> OperatorProduct:
        """The conjugate transpose (``.T`` for real operators)."""
        return OperatorProduct(self.right.H, self.left.H)

    mH = H

    def __repr__(self) -> str:
        return f"OperatorProduct({self.left!r} @ {self.right!r})"

    def __matmul__(self, h: Any) -> Any:
        if is_operator(h):
            return compose(self, h)
        return self.left @ (self.right @ h)

    def __rmatmul__(self, h: Any) -> Any:
        return (h @ self.left) @ self.right

    def mv(self, h: Any) -> Any:
        """Apply to a stack of vectors along the last axis: h (..., K) -> (..., rows)."""
        return self.left.mv(self.right.mv(h))

    def matrix(self) -> Any:
        """The dense matrix, shape ``self.shape``."""
        R = self.right.matrix()
        return self.left @ R if R.ndim > 1 else mT(self.left @ mT(R))
