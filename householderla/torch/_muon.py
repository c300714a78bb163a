"""``torch.optim`` Muon with the fixed-step polar factors of :func:`householderla.polar`.

:class:`Muon` follows ``torch.optim.Muon`` (torch 2.13) in hyperparameters, defaults and
conventions — momentum buffer B ← μB + (1 − μ)G (``lerp``), Nesterov update
G + μ(B − G), decoupled weight decay θ ← (1 − ηλ)θ, the learning-rate adjustment
``adjust_lr_fn`` ("original": √max(1, A/B); "match_rms_adamw": 0.2√max(A, B)), the state key
``momentum_buffer`` — and orthogonalises the update with ``hl.polar(update,
schedule=...)`` in bfloat16: ``schedule="muon"`` is torch's own iteration (Jordan et al.'s
quintic), the default ``"certified"`` the schedule bounded under bfloat16 rounding
(``docs/theory/lowprec.rst``). :func:`orthogonalize`, that step as a plug-in: both public.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import array_api_compat
import torch

from .._agnostic.fixed_polar import ADJUST_LR, DEFAULT_STEPS, adjusted_lr, check_split_sizes
from .._agnostic.fixed_polar import orthogonalize as _orthogonalize

__all__ = ["Muon", "orthogonalize"]

_xp = array_api_compat.array_namespace(torch.empty(0))


def orthogonalize(
    G: torch.Tensor,
    epsilon: float | None = None,
    *,
    schedule: str = "certified",
    steps: int | None = None,
    coefficients: Any = None,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """The orthogonalised update of Muon-family optimizers: the fixed-step polar factor of
    ``G`` (..., A, B), each matrix of the batch on its own, as :class:`Muon` computes it.

    O = polar(G / max(‖G‖_F, ε)) by ``steps`` odd quintic steps of ``schedule`` (the
    schedules of :func:`householderla.polar`), in ``dtype``, returned in G's dtype.

    Parameters
    ----------
    G : torch.Tensor, shape (..., A, B)
        Updates (momentum-averaged gradients): a matrix or a batch of them (per head, per
        expert); any real floating dtype.
    epsilon : float, optional
        Floor of the normalising norm (Dion's ``epsilon``; default 1e-7, torch.optim.Muon's).
    schedule : {"certified", "polar_express", "muon", "newton_schulz"}
        The steps' coefficients (``docs/theory/lowprec.rst``); ignored with ``coefficients``.
    steps : int, optional
        Number of steps (default 5, or the number of rows of ``coefficients``).
    coefficients : (a, b, c) or sequence of (a, b, c), optional
        Fixed quintics x ↦ ax + bx³ + cx⁵: one triple for every step (torch.optim.Muon's
        ``ns_coefficients``) or one per step (optax's ``ns_coeffs`` schedules).
    dtype : torch.dtype
        Precision of the iteration (default bfloat16, as the optimizers'; the Gram matrices
        accumulate in float32).

    Returns
    -------
    torch.Tensor
        O, shape and dtype of ``G``: its singular values lie in the schedule's interval
        (``hl.polar(..., return_info=True)`` reports it), its singular vectors are G's.

    Notes
    -----
    The signatures other optimizers call: Dion (microsoft/dion) takes
    ``newton_schulz_func=hl.torch.orthogonalize`` as is (``func(input, epsilon)``);
    NVIDIA's Emerging-Optimizers take ``scaled_orthogonalize_fn=lambda g: scale(g) *
    hl.torch.orthogonalize(g)`` with their own scale factor. Cost per matrix:
    ``steps`` × (4·A·B·min(A, B) + 2·min(A, B)³) flops.

    Examples
    --------
    >>> import torch, householderla as hl
    >>> G = torch.randn(4, 16, 32)  # four heads' updates
    >>> O = hl.torch.orthogonalize(G, coefficients=[(3.4445, -4.775, 2.0315)] * 5)
    >>> O.shape, O.dtype
    (torch.Size([4, 16, 32]), torch.float32)
    """
    if not isinstance(G, torch.Tensor):
        raise TypeError(f"G must be a torch.Tensor; got {type(G).__name__}")
    if G.ndim < 2:
        raise ValueError(f"G must have shape (..., A, B); got shape {tuple(G.shape)}")
    if not (G.dtype.is_floating_point or G.dtype.is_complex):
        raise TypeError(f"G has dtype {G.dtype}; expected a floating dtype")
    eps = 1e-7 if epsilon is None else float(epsilon)
    if not eps >= 0:
        raise ValueError(f"epsilon must be >= 0; got {epsilon!r}")
    name = "muon" if coefficients is not None else schedule
    O = _orthogonalize(G.to(dtype), name, steps, coefficients, eps=eps, xp=_xp)
    return O.to(G.dtype)


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
    split_sizes : sequence of int, optional
        Row blocks of each parameter (A, B) orthogonalised each on its own, with its own
        learning-rate adjustment adjust(a_i, B): a fused QKV weight (3d, d) with
        ``(d, d, d)``, or per-head blocks ``[d_head] * heads``. The sizes must sum to A for
        every parameter of the group (a group option: give fused weights their own group).
        Default: each matrix whole, as torch.optim.Muon.

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
        split_sizes: Sequence[int] | None = None,
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
            "split_sizes": None if split_sizes is None else tuple(split_sizes),
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
            group.setdefault("split_sizes", None)

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
        sizes = group.get("split_sizes")
        if sizes is not None:
            sizes = group["split_sizes"] = check_split_sizes(sizes)
            for i, p in enumerate(group["params"]):
                if p.ndim >= 2 and sum(sizes) != p.shape[-2]:
                    raise ValueError(
                        f"split_sizes {sizes} sum to {sum(sizes)}, but parameter {i} has "
                        f"{p.shape[-2]} rows (shape {tuple(p.shape)}): give each fused "
                        "parameter its own group"
                    )
        # validates schedule and ns_steps now (ValueError naming them), not at the first step
        _orthogonalize(None, group["schedule"], group["ns_steps"], group["ns_coefficients"])

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
                p.mul_(1 - lr * wd)
                self._orthogonal_step(p, update.to(group["ns_dtype"]), lr, group)
        return loss

    @staticmethod
    def _orthogonal_step(p: torch.Tensor, U: torch.Tensor, lr: Any, group: dict) -> None:
        """p ← p − η·adjust·polar(U), or per row block of ``split_sizes`` (each block its
        own matrix, its own adjustment): equal blocks in one batched call."""

        def polar(X: torch.Tensor) -> torch.Tensor:
            return _orthogonalize(
                X, group["schedule"], group["ns_steps"], group["ns_coefficients"],
                eps=group["eps"], xp=_xp,
            )  # fmt: skip

        fn, sizes, B = group["adjust_lr_fn"], group["split_sizes"], p.shape[-1]
        if sizes is None:
            p.add_(polar(U), alpha=-adjusted_lr(lr, fn, tuple(p.shape)))
        elif len(set(sizes)) == 1:
            O = polar(U.unflatten(-2, (len(sizes), sizes[0]))).flatten(-3, -2)
            p.add_(O, alpha=-adjusted_lr(lr, fn, (sizes[0], B)))
        else:
            start = 0
            for a in sizes:
                rows = slice(start, start + a)
                p[..., rows, :].add_(polar(U[..., rows, :]), alpha=-adjusted_lr(lr, fn, (a, B)))
                start += a
