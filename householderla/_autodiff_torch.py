"""torch.autograd wiring of the explicit CWY backward passes (imported only for torch input).

Two ``Function``s in the ``forward`` + ``setup_context`` + ``backward`` style: the factor map
V ↦ (U, T) and the low-rank apply (U, T, h) ↦ R(h) − U_out M U_inᵀ h. Their backward passes are
:func:`householderla._compact_wy.factors_vjp` and :func:`~householderla._compact_wy.lowrank_vjp`,
written in array operations, so double backward works. The full adapter
(``householderla.torch``: parametrizations, every map) builds on these.
"""

from __future__ import annotations

from typing import Any

import array_api_compat
import torch

from . import _compact_wy as K

_xp = array_api_compat.array_namespace(torch.empty(0))


class CWYFactors(torch.autograd.Function):
    """V ↦ (U, T, r): unit columns, T = S⁻¹ and the column norms."""

    @staticmethod
    def forward(V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return K.cwy_factors(V, _xp, check=False)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        U, T, r = output
        ctx.save_for_backward(U, T, r)

    @staticmethod
    def backward(ctx: Any, U_bar: torch.Tensor, T_bar: torch.Tensor, r_bar: Any) -> Any:
        # r stays differentiable (∂‖v‖/∂v = u) so that double backward sees how the
        # 1/‖v‖ in the normalisation backward depends on V.
        U, T, r = ctx.saved_tensors
        S_bar = K.s_bar_from_t_bar(T, T_bar)
        return K.factors_vjp(U, r, U_bar, S_bar, _xp) + U * r_bar


class LowRankApply(torch.autograd.Function):
    """(U, T, h) ↦ R(h) − U_out M U_inᵀ h (``h=None``: the dense matrix)."""

    @staticmethod
    def forward(U: Any, T: Any, h: Any, transpose: bool, mode: str) -> torch.Tensor:
        return K.lowrank_apply(U, T, h, _xp, transpose=transpose, mode=mode)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        U, T, h, transpose, mode = inputs
        ctx.save_for_backward(U, T, h)
        ctx.transpose, ctx.mode = transpose, mode

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        U, T, h = ctx.saved_tensors
        U_bar, h_bar, T_bar, _ = K.lowrank_vjp(
            U, T, h, g, _xp, transpose=ctx.transpose, mode=ctx.mode
        )
        return U_bar, T_bar, h_bar, None, None
