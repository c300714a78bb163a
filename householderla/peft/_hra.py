"""HRA layers whose r reflections are applied as one compact WY operator, never as d×d matrices.

PEFT's layer forms Δ = H(u₁)…H(u_r) by r rank-1 updates of a d×d matrix every forward (O(d²·r))
and multiplies W·Δ; here Δ is ``cwy(U)`` (I − U S⁻¹ Uᵀ) applied to the tokens in their row
layout (x − ((x U) Tᵀ) Uᵀ, 4·d·r per token) or to W once (Δᵀ Wᵀ, 4·d·r per output row),
whichever has fewer rows; gradients go through the library's explicit VJPs. ``apply_GS``:
Δ = I − 2 W Wᵀ with W the orthonormalised U (QR spans the same columns as Gram–Schmidt, and Δ
depends only on the span).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.nn.functional as F
from peft.tuners.hra import HRAConfig as _PeftHRAConfig
from peft.tuners.hra import HRAConv2d as _PeftHRAConv2d
from peft.tuners.hra import HRALinear as _PeftHRALinear
from peft.tuners.hra import HRAModel as _PeftHRAModel
from peft.tuners.tuners_utils import BaseTunerLayer, check_adapters_to_merge

from ..cwy import cwy
from ._registry import peft_type

__all__ = ["HRAConfig", "HRAConv2d", "HRALinear", "HRAModel"]


class HRAConfig(_PeftHRAConfig):
    """PEFT's ``HRAConfig`` (same fields and defaults) for householderla's HRA method.

    ``peft.get_peft_model(model, HRAConfig(r=8, target_modules=[...]))`` builds
    :class:`HRAModel`; the adapters' state-dict keys (``...hra_u.<adapter>``) are PEFT's, so
    checkpoints move between PEFT's HRA and this one either way.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        self.peft_type = peft_type("HL_HRA")


class _Reflections:
    """Δ = H(u₁)…H(u_r) of one adapter as an operator on columns: ``Δ @ h`` and ``Δᵀ @ h``."""

    def __init__(self, U: torch.Tensor, apply_gs: bool) -> None:
        self.gs = apply_gs
        if apply_gs:
            self.W = torch.linalg.qr(U).Q  # Δ = I − 2 W Wᵀ, symmetric
        else:
            self.Q = cwy(U)

    def apply(self, h: torch.Tensor, transpose: bool = False) -> torch.Tensor:
        if self.gs:
            return h - 2 * self.W @ (self.W.T @ h)
        return (self.Q.T if transpose else self.Q) @ h

    def apply_rows(self, x: torch.Tensor) -> torch.Tensor:
        """x Δᵀ for tokens x (n, d) in their own row layout: x − ((x U) Tᵀ) Uᵀ with the
        operator's differentiable factors U, T = S⁻¹ (no transposed copies of x)."""
        if self.gs:
            return torch.addmm(x, x @ self.W, self.W.T, alpha=-2)
        U = self.Q.U
        return torch.addmm(x, (x @ U) @ self.Q.T_factor.T, U.T, alpha=-1)


class _HRAMixin:
    """What :class:`HRALinear` and :class:`HRAConv2d` share (forward, merge, unmerge)."""

    def _compute_dtype(self) -> Any:
        """The first active adapter's dtype (PEFT's HRA computes in it), else the base's."""
        names = [n for n in self.active_adapters if n in self.hra_u]
        return self.hra_u[names[0]].dtype if names else self.get_base_layer().weight.dtype

    def _check_r(self, adapter_name: str) -> None:
        d, r = self.hra_u[adapter_name].shape
        if r > d:
            raise ValueError(
                f"HRA: r ({r}) must not exceed the adapted dimension ({d}): a product of more "
                f"than {d} reflections of R^{d} is still one orthogonal matrix"
            )

    def _ops(self, names: list[str]) -> list[_Reflections]:
        return [_Reflections(self.hra_u[n], self.hra_apply_GS[n]) for n in names if n in self.hra_u]

    def _flat_weight(self) -> torch.Tensor:
        w = self.get_base_layer().weight
        return w.reshape(w.shape[0], -1)

    def _adapted_weight(self, ops: list[_Reflections], w: torch.Tensor) -> torch.Tensor:
        """W Δ₁ … Δ_k as (Δ_kᵀ … Δ₁ᵀ Wᵀ)ᵀ: 4·d·r flops per row of W and adapter."""
        wt = w.T
        for op in ops:
            wt = op.apply(wt, transpose=True)
        return wt.T

    def get_delta_weight(self, adapter_name: str, reverse: bool = False) -> torch.Tensor:
        """Δ (``reverse``: Δᵀ = Δ⁻¹) as a dense d×d matrix, as PEFT's layer returns it."""
        U = self.hra_u[adapter_name]
        eye = torch.eye(U.shape[0], dtype=U.dtype, device=U.device)
        return _Reflections(U, self.hra_apply_GS[adapter_name]).apply(eye, transpose=reverse)

    def merge(self, safe_merge: bool = False, adapter_names: list[str] | None = None) -> None:
        """W ← W Δ for each adapter (PEFT's ``merge``), without forming Δ."""
        adapter_names = check_adapters_to_merge(self, adapter_names)
        base = self.get_base_layer()
        for name in adapter_names:
            if name not in self.hra_u:
                continue
            w = base.weight.data
            with torch.no_grad():
                dtype = self.hra_u[name].dtype
                new = self._adapted_weight(self._ops([name]), self._flat_weight().to(dtype))
            if safe_merge and not torch.isfinite(new).all():
                raise ValueError(
                    f"NaNs detected in the merged weights. The adapter {name} seems to be broken"
                )
            base.weight.data = new.reshape(w.shape).to(w.dtype)
            self.merged_adapters.append(name)

    def unmerge(self) -> None:
        """W ← W Δᵀ for each merged adapter, last merged first."""
        if not self.merged:
            warnings.warn("Already unmerged. Nothing to do.", stacklevel=2)
            return
        base = self.get_base_layer()
        while self.merged_adapters:
            name = self.merged_adapters.pop()
            if name not in self.hra_u:
                continue
            w = base.weight.data
            with torch.no_grad():
                op = self._ops([name])[0]
                wt = self._flat_weight().to(self.hra_u[name].dtype).T
                new = op.apply(wt).T
            base.weight.data = new.reshape(w.shape).to(w.dtype)

    def _adapted_forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        """The base output for disabled or merged adapters, else None (the subclass adapts)."""
        if self.disable_adapters:
            if self.merged:
                self.unmerge()
            return self.base_layer(x, *args, **kwargs)
        if self.merged:
            return self.base_layer(x, *args, **kwargs)
        return None


class HRALinear(_HRAMixin, _PeftHRALinear):
    """HRA on ``nn.Linear``: y = x (W Δ)ᵀ + b, Δ = H(u₁)…H(u_r) (Yuan, Liu & Xu, NeurIPS
    2024, Section 3.1), applied to the activations (or to W when it has fewer rows than the
    batch)."""

    def update_layer(self, adapter_name: str, r: int, config: Any, **kwargs: Any) -> None:
        super().update_layer(adapter_name, r, config=config, **kwargs)
        self._check_r(adapter_name)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        previous_dtype = x.dtype
        result = self._adapted_forward(x, *args, **kwargs)
        if result is None:
            ops = self._ops(self.active_adapters)
            base = self.get_base_layer()
            dtype = self._compute_dtype()
            w = self._cast_input_dtype(base.weight.detach(), dtype)
            bias = self._cast_input_dtype(base.bias, dtype)
            x = self._cast_input_dtype(x, dtype)
            rows = x.reshape(-1, x.shape[-1])
            if rows.shape[0] <= w.shape[0]:  # Δ on the tokens: z = x Δ_kᵀ … Δ₁ᵀ
                for op in reversed(ops):
                    rows = op.apply_rows(rows)
                result = F.linear(rows.reshape(x.shape), w, bias)
            else:  # Δ on W, once
                result = F.linear(x, self._adapted_weight(ops, w), bias)
        return result.to(previous_dtype)


class HRAConv2d(_HRAMixin, _PeftHRAConv2d):
    """HRA on ``nn.Conv2d``: the flattened kernel W (out, in·k·k) becomes W Δ, by applying the
    reflections to W's rows (4·in·k²·r flops per output channel), once per forward."""

    def update_layer(self, adapter_name: str, r: int, config: Any, **kwargs: Any) -> None:
        base = self.get_base_layer()
        if base.kernel_size[0] != base.kernel_size[1]:
            raise ValueError(f"HRA (as PEFT's) needs a square kernel; got {base.kernel_size}")
        super().update_layer(adapter_name, r, config=config, **kwargs)
        self._check_r(adapter_name)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        previous_dtype = x.dtype
        result = self._adapted_forward(x, *args, **kwargs)
        if result is None:
            ops = self._ops(self.active_adapters)
            base = self.get_base_layer()
            dtype = self._compute_dtype()
            w = self._cast_input_dtype(self._flat_weight().detach(), dtype)
            w = self._adapted_weight(ops, w).reshape(base.weight.shape)
            bias = self._cast_input_dtype(base.bias, dtype)
            x = self._cast_input_dtype(x, dtype)
            result = base._conv_forward(x, w, bias)
        return result.to(previous_dtype)


class HRAModel(_PeftHRAModel):
    """PEFT's ``HRAModel`` building :class:`HRALinear` / :class:`HRAConv2d` layers."""

    prefix: str = "hra_u"

    @staticmethod
    def _create_new_module(hra_config: Any, adapter_name: str, target: Any, **kwargs: Any) -> Any:
        base = target.get_base_layer() if isinstance(target, BaseTunerLayer) else target
        if isinstance(base, torch.nn.Linear):
            return HRALinear(target, adapter_name, config=hra_config, **kwargs)
        if isinstance(base, torch.nn.Conv2d):
            return HRAConv2d(target, adapter_name, config=hra_config, **kwargs)
        raise TypeError(
            f"Target module {target} is not supported. "
            "Currently, only `torch.nn.Linear` and `torch.nn.Conv2d` are supported."
        )
