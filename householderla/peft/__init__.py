"""PEFT adapters backed by householderla: HRA and OFT as methods of Hugging Face PEFT.

``import householderla.peft`` registers two methods with PEFT's public
``register_peft_method`` (``"hl_hra"``, ``"hl_oft"``); their configs are PEFT's own (same
fields, defaults and state-dict keys), so ::

    model = peft.get_peft_model(model, hl.peft.HRAConfig(r=32, target_modules=["q_proj"]))

adapts ``model`` and a checkpoint saved by PEFT's HRA or OFT loads into it, and back.

=======================  ====================================================================
:class:`HRAConfig`       Householder reflection adaptation (Yuan, Liu & Xu, NeurIPS 2024,
                         Section 3.1): W ↦ W H(u₁)…H(u_r), applied as one compact WY operator to the
                         activations — O(d·r) per token — instead of PEFT's d×d matrix built by
                         r rank-1 updates every forward (O(d²·r)).
:class:`OFTConfig`       Orthogonal finetuning (Qiu et al., NeurIPS 2023) with PEFT's block
                         layout (``r`` / ``oft_block_size``, ``block_share``, COFT): every block
                         is the exact Cayley transform of its skew-symmetric parameter, orthogonal
                         to float32 rounding for every parameter value.
=======================  ====================================================================

``docs/peft.rst`` has the math and the benchmark against PEFT's own layers.
"""

from __future__ import annotations

import peft as _peft  # noqa: F401 -- first: a missing PEFT is named as the extra by ``householderla.__getattr__``

from ._hra import HRAConfig, HRAConv2d, HRALinear, HRAModel
from ._oft import ExactOFTRotation, OFTConfig, OFTModel
from ._registry import register

__all__ = [
    "ExactOFTRotation",
    "HRAConfig",
    "HRAConv2d",
    "HRALinear",
    "HRAModel",
    "OFTConfig",
    "OFTModel",
]

register("hl_hra", HRAConfig, HRAModel)
register("hl_oft", OFTConfig, OFTModel)


def __dir__() -> list[str]:
    return sorted(__all__)
