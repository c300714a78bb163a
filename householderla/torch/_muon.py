"""``torch.optim`` Muon with the fixed-step polar factors of :func:`householderla.polar`.

:class:`Muon` follows ``torch.optim.Muon`` (torch 2.13) in hyperparameters, defaults and
conventions — momentum buffer B ← μB + (1 − μ)G (``lerp``), Nesterov update
G + μ(B − G), decoupled weight decay θ ← (1 − ηλ)θ, the learning-rate adjustment
``adjust_lr_fn`` ("original": √max(1, A/B); "match_rms_adamw": 0.2√max(A, B)), the state key
``momentum_buffer`` — and orthogonalises the update with ``hl.polar(update,
schedule=...)`` in bfloat16: ``schedule="muon"`` is torch's own iteration (Jordan et al.'s
quintic), the default ``"certified"`` the schedule whose singular values stay bounded under
bfloat16 rounding (``docs/theory/lowprec.rst``). Re-exported as ``householderla.torch.Muon``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import array_api_compat
import torch

from .._agnostic.fixed_polar import ADJUST_LR, DEFAULT_STEPS, adjusted_lr, orthogonalize

__all__ = ["Muon"]

_xp = array_api_compat.array_namespace(torch.empty(0))


class Muon(torch.optim.Optimizer):
    """Muon (momentum, orthogonalised) as a ``torch.optim.Optimizer``, torch.optim.Muon's
    conventions with a choice of polar-factor schedule.

    Parameters
    ----------
    params : iterable
        Tensors or parameter-group dicts; every parameter (..., A, B) with at least two
        dimensions (leading dimensions are a batch of matrices; ``torch.optim.Muon`` takes
        2-D parameters only). Vectors, embeddings and heads belong to another optimizer.
    lr, weight_decay, momentum, nesterov, eps, ns_steps, adjust_lr_fn
        As ``torch.optim.Muon`` (defaults 1e-3, 0.1, 0.95, True, 1e-7, 5, None).
    ns_coefficients : tuple of three floats, optional
        A fixed quintic (a, b, c) every step, as ``torch.optim.Muon``'s argument (then
        ``schedule`` must be "muon", which it implies). Default: the schedule's.
    schedule : {"certified", "polar_express", "muon", "newton_schulz"}
        The polar-factor schedule of :func:`householderla.polar` (default "certified").
    ns_dtype : torch.dtype
        Precision of the orthogonalisation (default ``torch.bfloat16``, as torch.optim.Muon;
        ``torch.float32`` for exactness studies).

    Notes
    -----
    One step for a parameter θ with gradient G (Jordan et al., Muon, 2024; ``torch.optim.Muon``):
    B ← μB + (1 − μ)G; U = G + μ(B − G) (Nesterov) or B; O = polar(U, schedule, ns_steps)
    in ``ns_dtype``; θ ← (1 − ηλ)θ − η·adjust(A, B)·O. The orthogonalisation normalises U
    by its Frobenius norm accumulated in float32 (torch.optim.Muon: in bfloat16, clamped at
    ``eps``; here ``eps`` clamps the norm likewise). Learning-rate schedulers, parameter
    groups, ``state_dict`` (the buffer is ``momentum_buffer``, as torch's) work as usual; a
    ``torch.optim.Muon`` checkpoint loads and continues with torch's quintic, and one of this
    class built with ``ns_coefficients`` loads into ``torch.optim.Muon``.
    Cost per parameter and step: ``ns_steps`` × (4·A·B·min(A, B) + 2·min(A, B)³) flops in
    ``ns_dtype``.

    Examples
    --------
    >>> import torch
    >>> from householderla.torch import Muon
    >>> W = torch.nn.Parameter(torch.randn(16, 32))
    >>> opt = Muon([W], lr=0.02)
    >>> (W ** 2).sum().backward(); opt.step()
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] | None = None,
        eps: float = 1e-7,
        ns_steps: int = DEFAULT_STEPS,
        adjust_lr_fn: str | None = None,
        *,
        schedule: str = "certified",
        ns_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        if not 0.0 <= lr:
            raise ValueError(f"Learning rate should be >= 0 but is: {lr}")
        if not 0.0 <= momentum:
            raise ValueError(f"momentum should be >= 0 but is: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"weight decay should be >= 0 but is: {weight_decay}")
        if adjust_lr_fn not in ADJUST_LR:
            raise ValueError(f"Adjust learning rate function {adjust_lr_fn} is not supported")
        if ns_coefficients is not None:
            if len(ns_coefficients) != 3:
                raise ValueError("ns_coefficients must be a tuple of exactly 3 values")
            if schedule not in ("muon", "certified"):
                raise ValueError("ns_coefficients replaces the schedule: leave schedule unset")
            schedule = "muon"
        defaults = {
            "lr": lr,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_coefficients": ns_coefficients,
            "eps": eps,
            "ns_steps": ns_steps,
            "adjust_lr_fn": adjust_lr_fn,
            "schedule": schedule,
            "ns_dtype": ns_dtype,
        }
        super().__init__(params, defaults)
        for group in self.param_groups:
            self._check_group(group)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Also a ``torch.optim.Muon`` checkpoint (``load_state_dict``): its groups have no
        ``schedule`` or ``ns_dtype`` and get torch's own step (its fixed quintic in
        bfloat16)."""
        super().__setstate__(state)
        for group in self.param_groups:
            if "schedule" not in group:
                fixed = group.get("ns_coefficients") is not None
                group["schedule"] = "muon" if fixed else self.defaults["schedule"]
            group.setdefault("ns_dtype", torch.bfloat16)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if hasattr(self, "defaults") and len(self.param_groups) > 1:
            self._check_group(self.param_groups[-1])

    @staticmethod
    def _check_group(group: dict[str, Any]) -> None:
        for i, p in enumerate(group["params"]):
            if p.ndim < 2:
                raise ValueError(
                    f"Muon optimises matrices; parameter {i} has shape {tuple(p.shape)}: "
                    "give vectors, embeddings and heads to another optimizer (AdamW)"
                )
            if torch.is_complex(p):
                raise RuntimeError("Muon does not support complex parameters")
        # validates schedule and ns_steps now (ValueError naming them), not at the first step
        orthogonalize(None, group["schedule"], group["ns_steps"], group["ns_coefficients"])

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One Muon step for every parameter with a gradient; returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if g.is_sparse:
                    raise RuntimeError("Muon does not support sparse gradients")
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(
                        g, memory_format=torch.preserve_format
                    )
                buf = state["momentum_buffer"]
                buf.lerp_(g, 1 - mu)
                update = g.lerp(buf, mu) if group["nesterov"] else buf
                O = orthogonalize(
                    update.to(group["ns_dtype"]),
                    group["schedule"],
                    group["ns_steps"],
                    group["ns_coefficients"],
                    eps=group["eps"],
                    xp=_xp,
                )
                p.mul_(1 - lr * wd)
                p.add_(O, alpha=-adjusted_lr(lr, group["adjust_lr_fn"], tuple(p.shape)))
        return loss
