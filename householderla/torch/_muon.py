"""``torch.optim`` Muon with the fixed-step polar factors of :func:`householderla.polar`.

:class:`Muon` follows ``torch.optim.Muon`` (torch 2.13) in hyperparameters, defaults and
conventions — buffer B ← μB + (1 − μ)G (``lerp``), Nesterov update G + μ(B − G), decoupled
weight decay θ ← (1 − ηλ)θ, ``adjust_lr_fn`` ("original": √max(1, A/B); "match_rms_adamw":
0.2√max(A, B)), the state key ``momentum_buffer`` — and orthogonalises the update with
``hl.polar(update, schedule=...)`` in bfloat16: ``"muon"`` is torch's own iteration (Jordan et
al.'s quintic), the default ``"certified"`` bounded under bfloat16 rounding
(``docs/theory/lowprec.rst``). Row-sharded DTensors: each matrix on one owner process
(``docs/distributed.rst``). :func:`orthogonalize`, that step as a plug-in: both public.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import array_api_compat
import torch

from .._agnostic.fixed_polar import ADJUST_LR, DEFAULT_STEPS, adjusted_lr, check_split_sizes
from .._agnostic.fixed_polar import orthogonalize as _orthogonalize
from .._interop.torch_distributed import all_to_all, is_dtensor, muon_layout, round_robin, row_range

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
    ``ns_dtype``. Parameters in bfloat16 or float16 take the step θ − η'·O in float32, then
    rounded to their dtype (the same arithmetic for every entry).

    DTensor parameters on a 1-D mesh (``docs/distributed.rst``): sharded by rows
    (``Shard(ndim − 2)``, ``Shard(0)`` of a matrix, as ``fully_shard`` makes it), each matrix
    is orthogonalised on exactly one process per step, its owner — the matrices of all such
    parameters (each matrix of a batch on its own) dealt round-robin by decreasing cost —
    with one ``all_to_all`` bringing every matrix's row blocks of U (in ``ns_dtype``) to its
    owner and one taking the rows of O back; the result is the single-process step bit for
    bit. ``owners`` maps (group, parameter) to the owner of each matrix at the last step.
    Replicated parameters and ``Shard`` of a batch dimension step locally (no
    communication); other placements raise ``ValueError`` naming them. The momentum buffer
    is a DTensor sharded like the parameter.

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
        self.owners: dict[tuple[int, int], list[int]] = {}
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
        sharded: list[_Rows] = []  # row-sharded DTensors: orthogonalised by their owners below
        for gi, group in enumerate(self.param_groups):
            lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
            for pi, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                g = p.grad
                if g.is_sparse:
                    raise RuntimeError("Muon does not support sparse gradients")
                rows = False
                if is_dtensor(p):
                    rows = muon_layout(p, f"parameter {pi} of group {gi}") == "rows"
                    if tuple(g.placements) != tuple(p.placements):  # a Partial gradient
                        g = g.redistribute(p.device_mesh, p.placements)
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(
                        g, memory_format=torch.preserve_format
                    )
                buf = state["momentum_buffer"]
                # DTensors: the same element-wise arithmetic on this process's part
                P, g, buf = (t.detach().to_local() if is_dtensor(t) else t for t in (p, g, buf))
                buf.lerp_(g, 1 - mu)
                update = g.lerp(buf, mu) if group["nesterov"] else buf
                P.mul_(1 - lr * wd)
                U = update.to(group["ns_dtype"])
                if rows:
                    sharded.append(_Rows(p, P, U, group, (gi, pi)))
                else:
                    O = self._polar(U, group)
                    self._apply(P, O, lr, group, tuple(P.shape[-2:]), 0)
        if sharded:
            self._owned_steps(sharded)
        return loss

    @staticmethod
    def _polar(U: torch.Tensor, group: dict) -> torch.Tensor:
        """polar(U), or of each row block of ``split_sizes`` (each block its own matrix):
        equal blocks in one batched call."""

        def polar(X: torch.Tensor) -> torch.Tensor:
            return _orthogonalize(
                X, group["schedule"], group["ns_steps"], group["ns_coefficients"],
                eps=group["eps"], xp=_xp,
            )  # fmt: skip

        sizes = group["split_sizes"]
        if sizes is None:
            return polar(U)
        if len(set(sizes)) == 1:
            return polar(U.unflatten(-2, (len(sizes), sizes[0]))).flatten(-3, -2)
        blocks, start = [], 0
        for a in sizes:
            blocks.append(polar(U[..., start : start + a, :]))
            start += a
        return torch.cat(blocks, -2)

    @staticmethod
    def _apply(
        P: torch.Tensor, O: torch.Tensor, lr: Any, group: dict, shape: tuple, start: int
    ) -> None:
        """P ← P − η·adjust·O where P holds rows [start, start + P.shape[-2]) of matrices of
        ``shape`` (A, B): each row block of ``split_sizes`` with its own adjustment
        adjust(a_i, B). 16-bit parameters: in float32, then rounded to their dtype (torch's
        own bfloat16 ``add_`` rounds its vectorised body and its scalar tail differently)."""
        (A, B), fn = shape, group["adjust_lr_fn"]
        stop, at = start + P.shape[-2], 0
        for a in group["split_sizes"] or (A,):
            lo, hi = max(at, start) - start, min(at + a, stop) - start
            at += a
            if lo >= hi:
                continue
            alpha = -adjusted_lr(lr, fn, (a, B))
            rows = slice(lo, hi)
            if P.dtype in (torch.bfloat16, torch.float16):
                P[..., rows, :] = P[..., rows, :].float().add_(O[..., rows, :].float(), alpha=alpha)
            else:
                P[..., rows, :].add_(O[..., rows, :], alpha=alpha)

    def _owned_steps(self, sharded: list[_Rows]) -> None:
        """The row-sharded parameters' orthogonalisations, each matrix on its owner: per
        mesh, one ``all_to_all`` of U's row blocks to the owners, the owners' polar factors
        (the single-process call on the same matrices), one ``all_to_all`` of O's rows back."""
        meshes: dict[Any, list[_Rows]] = {}
        for item in sharded:
            meshes.setdefault(item.mesh, []).append(item)
        self.owners = {}
        for mesh, items in meshes.items():
            group, size, me = mesh.get_group(), mesh.size(), mesh.get_local_rank()
            units = [(k, e) for k, it in enumerate(items) for e in range(it.count)]
            owner = round_robin([items[k].cost for k, _ in units], size)
            for it in items:
                self.owners[it.key] = []
            for (k, _), o in zip(units, owner, strict=True):
                self.owners[items[k].key].append(o)
            mine = [u for u, o in zip(units, owner, strict=True) if o == me]
            device = items[0].U.device
            # U's row blocks to the owners
            send: list[list[Any]] = [[] for _ in range(size)]
            for (k, e), o in zip(units, owner, strict=True):
                if o != me:
                    send[o].append(items[k].U3[e])
            expect = [[] if s == me else [items[k].block(s) for k, _ in mine] for s in range(size)]
            got = all_to_all(send, expect, group, device)
            # the owner's polar factors, a parameter's matrices in one call
            whole: dict[int, list[torch.Tensor]] = {}
            for j, (k, e) in enumerate(mine):
                blocks = [items[k].U3[e] if s == me else got[s][j] for s in range(size)]
                whole.setdefault(k, []).append(torch.cat(blocks, 0))
            O_of: dict[tuple[int, int], torch.Tensor] = {}
            for k, mats in whole.items():
                it = items[k]
                X = mats[0] if it.U.ndim == 2 else torch.stack(mats)
                O = self._polar(X, it.group)
                O = O.unsqueeze(0) if it.U.ndim == 2 else O
                es = [e for kk, e in mine if kk == k]
                O_of.update(((k, e), O[i]) for i, e in enumerate(es))
            # O's rows back
            send = [[] for _ in range(size)]
            for k, e in mine:
                for s in range(size):
                    if s != me:
                        r0, r1 = items[k].rows(s)
                        send[s].append(O_of[(k, e)][r0:r1])
            expect = [[] for _ in range(size)]
            for (k, _), o in zip(units, owner, strict=True):
                if o != me:
                    expect[o].append(items[k].block(me))
            got = all_to_all(send, expect, group, device)
            taken = [0] * size
            for (k, e), o in zip(units, owner, strict=True):
                it = items[k]
                if o == me:
                    r0, r1 = it.rows(me)
                    it.O3[e] = O_of[(k, e)][r0:r1]
                else:
                    it.O3[e] = got[o][taken[o]]
                    taken[o] += 1
            for it in items:
                lr = it.group["lr"]
                self._apply(it.P, it.O3.reshape(it.U.shape), lr, it.group, it.shape, it.start)


class _Rows:
    """A row-sharded DTensor parameter's step: this process's part P and U (..., r, B), the
    global matrix shape (A, B), the matrices' count and cost, the row blocks of every
    process, and O's rows as they arrive (``O3``, (count, r, B))."""

    def __init__(self, p: Any, P: torch.Tensor, U: torch.Tensor, group: dict, key: tuple) -> None:
        self.mesh, self.P, self.U, self.group, self.key = p.device_mesh, P, U, group, key
        self.shape = tuple(p.shape[-2:])
        A, B = self.shape
        self.count = math.prod(p.shape[:-2])
        self.cost = A * B * min(A, B)  # ∝ the orthogonalisation's flops
        self.size, index = p.device_mesh.size(), p.device_mesh.get_local_rank()
        self.start, stop = self.rows(index)
        if P.shape[-2] != stop - self.start:
            raise ValueError(
                f"parameter {key[1]} of group {key[0]} (shape {tuple(p.shape)}) holds "
                f"{P.shape[-2]} rows on process {index}; Muon expects torch's Shard blocks "
                f"of ⌈{A}/{self.size}⌉ rows ({stop - self.start} here)"
            )
        self.U3 = U.reshape(self.count, stop - self.start, B)
        self.O3 = torch.empty_like(self.U3)

    def rows(self, index: int) -> tuple[int, int]:
        return row_range(self.shape[0], self.size, index)

    def block(self, index: int) -> tuple[tuple[int, int], Any]:
        """(shape, dtype) of process ``index``'s rows of one matrix of U."""
        r0, r1 = self.rows(index)
        return (r1 - r0, self.shape[1]), self.U.dtype
