"""OFT layers whose blocks are the exact Cayley transform of their skew-symmetric parameters.

R = (I − Q)(I + Q)⁻¹ per block (PEFT's exact path, ``torch.linalg.solve(..., left=False)``),
solved in float64 for every block at once and rounded once to the compute dtype (float32 or
wider), so ‖RᵀR − I‖ is float32 rounding whatever ‖Q‖; for float64 one Newton–Schulz step
R(3I − RᵀR)/2 removes the solve's error (it keeps R's tangent derivative). A truncated Neumann
series of (I + Q)⁻¹ is not orthogonal and diverges for ‖Q‖ ≥ 1. The tokens are rotated in the
compute dtype (bfloat16 weights: float32 accumulation), then cast back for the base layer.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from peft.tuners.oft import OFTConfig as _PeftOFTConfig
from peft.tuners.oft import OFTModel as _PeftOFTModel
from peft.tuners.oft.layer import OFTRotationModule

from ._registry import peft_type

__all__ = ["ExactOFTRotation", "OFTConfig", "OFTModel"]


@dataclass
class OFTConfig(_PeftOFTConfig):
    """PEFT's ``OFTConfig`` (same fields; ``use_cayley_neumann`` defaults to False and is
    ignored: the blocks are always the exact Cayley transform) for householderla's OFT.

    ``peft.get_peft_model(model, OFTConfig(oft_block_size=32, target_modules=[...]))`` builds
    :class:`OFTModel`; the state-dict keys (``...oft_R.<adapter>.weight``) are PEFT's.
    """

    use_cayley_neumann: bool = field(
        default=False,
        metadata={"help": "Ignored: householderla's OFT uses the exact Cayley transform."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self.peft_type = peft_type("HL_OFT")
        if self.use_cayley_neumann:
            warnings.warn(
                "householderla's OFT uses the exact Cayley transform; use_cayley_neumann=True "
                "(an approximate, non-orthogonal series) is ignored",
                stacklevel=2,
            )


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the rotation is built and applied in: at least float32."""
    return torch.promote_types(dtype, torch.float32)


class ExactOFTRotation(OFTRotationModule):
    """PEFT's ``OFTRotationModule`` with the exact Cayley transform in float64 blocks and the
    rotation of the tokens in :func:`compute_dtype` (same parameter and buffers)."""

    def _cayley_batch(
        self,
        Q: torch.Tensor,
        block_size: int,
        use_cayley_neumann: bool = False,
        num_neumann_terms: int = 5,
    ) -> torch.Tensor:
        dtype = compute_dtype(Q.dtype)
        skew = self._pytorch_skew_symmetric(Q.to(torch.float64), block_size)
        eye = torch.eye(block_size, dtype=torch.float64, device=Q.device)
        R = torch.linalg.solve(eye + skew, eye - skew, left=False).to(dtype)
        if dtype == torch.float64:  # one Newton–Schulz step: the solve's error, squared
            R = R @ (1.5 * eye - 0.5 * (R.mT @ R))
        return R

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        required_dtype = x.dtype
        x = x.to(compute_dtype(self.weight.dtype))
        orig_shape = x.shape
        if self.coft:
            with torch.no_grad():
                self.weight.copy_(self._project_batch(self.weight, eps=self.eps))
        R = self._cayley_batch(self.weight, self.block_size)
        if len(orig_shape) == 4:
            x = self._unfold(x)
        folded_shape = x.shape
        rank = self.in_features // self.block_size if self.block_share else self.r
        xb = x.reshape(*folded_shape[:-1], rank, self.block_size)
        if self.block_share:
            out = xb @ R[0]
        else:
            out = torch.einsum("...rk,rkc->...rc", xb, R)
        out = out.reshape(folded_shape)
        if len(orig_shape) == 4:
            out = self._fold(out, orig_shape)
        return out.to(required_dtype)


def _make_exact(layer: Any, adapter_name: str) -> None:
    for name in ("oft_R", "oft_embedding_R"):
        mods = getattr(layer, name, None)
        if mods is not None and adapter_name in mods:
            mod = mods[adapter_name]
            if type(mod) is OFTRotationModule:  # same state: only the methods change
                mod.__class__ = ExactOFTRotation


class OFTModel(_PeftOFTModel):
    """PEFT's ``OFTModel`` whose rotation modules are :class:`ExactOFTRotation`."""

    prefix: str = "oft_R"

    def _create_and_replace(
        self,
        oft_config: Any,
        adapter_name: str,
        target: Any,
        target_name: str,
        parent: Any,
        current_key: Any,
        **optional_kwargs: Any,
    ) -> None:
        super()._create_and_replace(
            oft_config, adapter_name, target, target_name, parent, current_key, **optional_kwargs
        )
        _make_exact(getattr(parent, target_name), adapter_name)
