"""``torch.optim`` front end of the momentum Stiefel optimizers (Kong, Wang & Tao, ICLR 2023,
Algorithms 1, 2, 4, 5), re-exported as ``householderla.torch.StiefelSGD`` / ``StiefelAdam``.

Groups with ``stiefel=True`` run :func:`householderla.stiefel.momentum_sgd` / ``adam`` on each
(..., N, M) parameter (wide ones through their transpose: orthonormal rows), others the matching
Euclidean update with the same hyperparameters. The first step projects onto the manifold; state
is tensors (``state_dict`` resumes bit-identically); complex parameters live on the complex
Stiefel manifold. CPU steps run on zero-copy NumPy views, CUDA and ``torch.compile`` in torch.
A step is all or nothing on non-finite gradients. Options: ``docs/theory/stiefel.rst``; row-
sharded DTensors step with M×M ``all_reduce``s (``docs/distributed.rst``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .. import stiefel as S
from .._interop.dlpack import from_numpy, to_numpy
from .._interop.torch_distributed import ProcessRows, any_bad, layout
from .._lib.device import emulated_kind
from .._lib.rows import LOCAL

__all__ = ["StiefelAdam", "StiefelSGD"]

#: What a step does when a gradient holds NaN or Inf: raise (naming it) or skip the whole step.
NONFINITE = ("raise", "skip")

_STATE_KEYS = {
    (True, "sgd"): ("step", "U", "Z"),
    (True, "adam"): ("step", "U", "Z", "p", "q"),
    (False, "sgd"): ("step", "v"),
    (False, "adam"): ("step", "m", "s"),
}
_AMSGRAD_KEYS = {True: ("p_max", "q_max"), False: ("s_max",)}
#: torch.optim options without a meaning here (see the module docstring).
UNSUPPORTED = ("foreach", "fused", "differentiable", "capturable")
#: Keys torch itself (LR schedulers) puts into parameter groups.
_TORCH_GROUP_KEYS = {"params", "initial_lr", "param_names"}


def _state_keys(manifold: bool, kind: str, amsgrad: bool) -> tuple[str, ...]:
    keys = _STATE_KEYS[(manifold, kind)]
    return keys + _AMSGRAD_KEYS[manifold] if amsgrad else keys


def _unsupported(options: dict[str, Any], name: str) -> None:
    for k in UNSUPPORTED:
        if options.get(k):
            raise ValueError(
                f"{name} does not implement {k}={options[k]!r}: each step is a per-parameter "
                "manifold update (no multi-tensor or fused kernel) and is not differentiable"
            )


class _StiefelOptimizer(torch.optim.Optimizer):
    """Shared loop: one functional optimizer per group, built from the group's values."""

    _kind = ""

    def _functional(
        self, group: dict[str, Any], rows: ProcessRows | None = None
    ) -> S.StiefelOptimizer:
        raise NotImplementedError

    def _check_group(self, group: dict[str, Any]) -> None:
        unknown = sorted(set(group) - set(self.defaults) - _TORCH_GROUP_KEYS)
        if unknown:
            raise ValueError(
                f"parameter group has unknown option(s) {unknown}; {type(self).__name__} "
                f"takes {sorted(self.defaults)}"
            )
        self._functional(group)  # validates the hyperparameters (ValueError naming them)
        if not isinstance(group.get("stiefel", True), bool):
            raise ValueError(f"stiefel must be True or False; got {group['stiefel']!r}")
        if group["stiefel"]:
            for i, p in enumerate(group["params"]):
                if p.ndim < 2:
                    raise ValueError(
                        f"parameter {i} of a stiefel=True group has shape {tuple(p.shape)}; "
                        "Stiefel parameters need (..., N, M) — put vectors and scalars in a "
                        "group with stiefel=False"
                    )

    def _gradients_valid(self) -> bool:
        """Every gradient of every group is checked before any parameter moves (a step is
        all or nothing): sparse ones raise TypeError; a NaN/Inf raises ValueError naming the
        parameter, or with ``nonfinite="skip"`` the whole step is skipped and counted in
        ``skipped_steps``. One reduction per gradient."""
        bad = []
        shared: dict[Any, list[tuple[str, bool]]] = {}  # DTensors: flags OR-ed over the mesh
        for gi, group in enumerate(self.param_groups):
            for pi, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise TypeError(
                        f"{type(self).__name__} does not support sparse gradients "
                        f"(parameter {pi} of group {gi}); use dense gradients"
                    )
                name = f"parameter {pi} of group {gi} (shape {tuple(p.shape)})"
                if _is_dtensor(p.grad):
                    finite = bool(torch.isfinite(p.grad.to_local()).all())
                    shared.setdefault(p.grad.device_mesh, []).append((name, not finite))
                elif not bool(torch.isfinite(p.grad).all()):
                    bad.append(name)
        for mesh, flags in shared.items():
            group_ = mesh.get_group() if mesh.ndim == 1 else None
            t = torch.tensor([float(b) for _, b in flags], device=mesh.device_type)
            bad += [n for (n, _), b in zip(flags, any_bad(t, group_).tolist(), strict=True) if b]
        if not bad:
            return True
        if self.nonfinite == "skip":
            self.skipped_steps += 1
            return False
        raise ValueError(
            f"the gradient of {', '.join(bad)} contains NaN or Inf; no parameter was changed "
            "(pass nonfinite='skip' to skip such steps)"
        )

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        self._check_group(self.param_groups[-1])

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One optimisation step for every parameter with a gradient.

        Parameters
        ----------
        closure : callable, optional
            Re-evaluates the model and returns the loss (called with gradients enabled).

        Returns
        -------
        The closure's loss, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._gradients_valid():
            return loss  # nonfinite="skip": nothing moved, the step is counted
        for gi, group in enumerate(self.param_groups):
            manifold = group["stiefel"]
            opt = self._functional(group)
            keys = _state_keys(manifold, self._kind, group.get("amsgrad", False))
            wd = 0.0 if manifold else group["weight_decay"]  # a no-op on St(N, M)
            for pi, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                wide = manifold and p.shape[-2] < p.shape[-1]
                P, Gp, shard = p.detach(), p.grad.detach(), None
                if _is_dtensor(P):  # this process's part (writes to P reach p)
                    shard = _Shard(P, wide, manifold, f"parameter {pi} of group {gi}")
                    P, Gp = shard.local(P), shard.local(shard.align(Gp))
                X = P.mT if wide else P
                G = Gp.mT if wide else Gp
                if group["maximize"]:
                    G = -G
                if wd:
                    G = G + wd * X
                state = self.state[p]
                f_opt = opt if shard is None else shard.functional(self, group, opt)
                if not state:
                    new = f_opt.init(X)
                    state.update(zip(keys, _wrap(shard, keys, new), strict=True))
                tup_type = _state_type(manifold, self._kind, group.get("amsgrad", False))
                tensors = [state[k] if shard is None else shard.local(state[k]) for k in keys]
                if _on_host(X, G, *tensors):
                    # CPU float32/float64: the step's ~60 small operations run in NumPy on
                    # zero-copy read-only views (several times cheaper than torch kernels)
                    X_np, G_np, *st = (to_numpy(t) for t in (X, G, *tensors))
                    X_next, new = f_opt.update(X_np, G_np, tup_type(*st))
                    X_next, *new = (from_numpy(np.asarray(a), like=X) for a in (X_next, *new))
                else:
                    X_next, new = f_opt.update(X, G, tup_type(*tensors))
                state.update(zip(keys, _wrap(shard, keys, new), strict=True))
                P.copy_(X_next.mT if wide else X_next)
        return loss


def _is_dtensor(t: Any) -> bool:
    """Whether ``t`` is a ``torch.distributed`` DTensor (without importing it otherwise)."""
    return type(t).__name__ == "DTensor" and type(t).__module__.startswith("torch.distributed")


class _Shard:
    """A DTensor parameter's step: its local tensors, the :class:`ProcessRows` of a
    parameter sharded by the rows of its Stiefel matrix (None for a local step), and the
    state as DTensors of the parameter's sharding (N×M parts like X, M×M parts replicated
    unless a batch dimension is sharded; the step count a plain tensor)."""

    def __init__(self, P: Any, wide: bool, manifold: bool, what: str) -> None:
        try:
            from torch.distributed.tensor import Replicate, Shard
        except ImportError as exc:  # torch < 2.5: DTensor was private (torch.distributed._tensor)
            raise RuntimeError(
                f"{what} is a DTensor: DTensor parameters need torch >= 2.6 (the public "
                f"torch.distributed.tensor; tested from 2.6), this is torch {torch.__version__}"
            ) from exc

        self.mesh, self.placements = P.device_mesh, tuple(P.placements)
        self.rows = layout(P, wide, what) if manifold else None
        shape = tuple(P.shape)
        self.shape = shape[:-2] + shape[-2:][::-1] if wide else shape  # X's (global)
        nd = len(shape)
        batch = [pl.is_shard() and pl.dim % nd < nd - 2 for pl in self.placements]
        self.big = [Shard(nd - 2)] if self.rows is not None else list(self.placements)
        self.small = [
            pl if b else Replicate() for pl, b in zip(self.placements, batch, strict=True)
        ]

    def align(self, g: Any) -> Any:
        """The gradient with the parameter's placements (a Partial one is reduced)."""
        if tuple(g.placements) == self.placements:
            return g
        return g.redistribute(self.mesh, self.placements)

    @staticmethod
    def local(t: Any) -> Any:
        return t.to_local() if _is_dtensor(t) else t

    def functional(
        self, optimizer: _StiefelOptimizer, group: dict[str, Any], opt: S.StiefelOptimizer
    ) -> S.StiefelOptimizer:
        """The group's functional optimizer, reducing over the rows when they are sharded."""
        return opt if self.rows is None else optimizer._functional(group, self.rows)

    def wrap(self, keys: tuple[str, ...], arrays: Any) -> list[Any]:
        """The step's local state arrays as DTensors (the count stays a plain tensor)."""
        from torch.distributed.tensor import DTensor

        out = []
        for key, a in zip(keys, arrays, strict=True):
            if key == "step":
                out.append(a)
                continue
            if key in _MXM_KEYS:
                placements, shape = self.small, self.shape[:-2] + tuple(a.shape[-2:])
            else:
                placements, shape = self.big, self.shape[:-1] + tuple(a.shape[-1:])
            stride = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
            out.append(
                DTensor.from_local(
                    a.contiguous(), self.mesh, placements, run_check=False, shape=shape,
                    stride=stride,
                )
            )  # fmt: skip
        return out


def _wrap(shard: _Shard | None, keys: tuple[str, ...], arrays: Any) -> list[Any]:
    return list(arrays) if shard is None else shard.wrap(keys, arrays)


#: State of Stiefel parameters that is M×M (the rest is shaped like X, or the step count).
_MXM_KEYS = ("Z", "p", "p_max")


def _on_host(*tensors: torch.Tensor) -> bool:
    """Whether a step runs in NumPy: eager, every tensor on the CPU, float32/float64 or
    complex64/complex128."""
    if torch.compiler.is_compiling():
        return False
    X = tensors[0]
    on_cpu = X.device.type == "cpu" and emulated_kind() != "cuda"  # (emulate_device)
    return on_cpu and X.dtype in _HOST_DTYPES


_HOST_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)


def _unsupported_kwargs(kwargs: dict[str, Any], name: str) -> None:
    """``foreach=`` & co. raise naming the option when truthy; anything else is unknown."""
    _unsupported(kwargs, name)
    unknown = sorted(k for k in kwargs if k not in UNSUPPORTED)
    if unknown:
        raise TypeError(f"{name} got unexpected keyword argument(s) {unknown}")


def _check_flags(group: dict[str, Any], names: tuple[str, ...]) -> None:
    for k in names:
        if not isinstance(group[k], bool):
            raise ValueError(f"{k} must be True or False; got {group[k]!r}")


def _check_weight_decay(group: dict[str, Any]) -> None:
    wd = group["weight_decay"]
    if isinstance(wd, bool) or not isinstance(wd, (int, float)) or not 0.0 <= wd < float("inf"):
        raise ValueError(f"weight_decay must be a finite number >= 0; got {wd!r}")


def _nonfinite_option(value: Any) -> str:
    if value not in NONFINITE:
        raise ValueError(f"nonfinite must be one of {NONFINITE}; got {value!r}")
    return value


def _state_type(manifold: bool, kind: str, amsgrad: bool) -> Any:
    if kind == "sgd":
        return S.MomentumState if manifold else S.EuclideanMomentumState
    if manifold:
        return S.AMSGradState if amsgrad else S.AdamState
    return S.EuclideanAMSGradState if amsgrad else S.EuclideanAdamState


class StiefelSGD(_StiefelOptimizer):
    """Momentum SGD on Stiefel manifolds (Kong, Wang & Tao, ICLR 2023, Algorithm 1; Algorithm 4 for
    square parameters) as a ``torch.optim.Optimizer``.

    Parameters
    ----------
    params : iterable
        Tensors or parameter-group dicts. Groups may set ``stiefel=False`` (heavy-ball SGD
        with the same lr and momentum, App. P) and override any hyperparameter.
    lr : float
        η ≥ 0 (default 0.1; 0, as a scheduler may reach, moves nothing).
    momentum : float
        μ ∈ [0, 1) (default 0.9).
    metric : float or str
        a < 1 of Definition 1 (default 0.5, canonical).
    dampening, weight_decay, nesterov, maximize
        ``torch.optim.SGD``'s options (defaults 0, 0, False, False); ``weight_decay`` acts on
        ``stiefel=False`` groups only (a no-op on the manifold; module docstring).
    expm_method : {"euler", "cayley", "expm"}
        App. M.2 option (default forward Euler).
    transport : {"energy", "euler"}
        φ̄₃ U-update (default "energy", stable at large steps; see
        :func:`householderla.stiefel.momentum_sgd`).
    stiefel : bool
        Default of the groups' ``stiefel`` key (True).
    nonfinite : {"raise", "skip"}
        A NaN/Inf in any gradient raises ``ValueError`` naming the parameter before anything
        moves (default), or skips the whole step and counts it in ``skipped_steps``.
    foreach, fused, differentiable, capturable
        Not implemented: a truthy value raises ``ValueError``.

    Notes
    -----
    Per step and parameter: 8 N×M×M products + O(M³) (:func:`~householderla.stiefel.momentum_sgd`).
    float32 parameters on CPU are updated in float64 and rounded once.

    Examples
    --------
    >>> import torch
    >>> from householderla.torch import StiefelSGD
    >>> W = torch.nn.Parameter(torch.randn(8, 3, dtype=torch.float64))
    >>> b = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    >>> opt = StiefelSGD([{"params": [W]}, {"params": [b], "stiefel": False}], lr=0.1)
    >>> loss = ((W + b) ** 2).sum(); loss.backward(); opt.step()
    >>> bool(torch.allclose(W.T @ W, torch.eye(3, dtype=torch.float64)))
    True
    """

    _kind = "sgd"

    def __init__(
        self,
        params: Any,
        lr: float = 0.1,
        momentum: float = 0.9,
        metric: Any = 0.5,
        *,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        maximize: bool = False,
        expm_method: str = "euler",
        transport: str = "energy",
        stiefel: bool = True,
        nonfinite: str = "raise",
        **unsupported: Any,
    ) -> None:
        _unsupported_kwargs(unsupported, "StiefelSGD")
        self.nonfinite = _nonfinite_option(nonfinite)
        self.skipped_steps = 0
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
            "maximize": maximize,
            "metric": metric,
            "expm_method": expm_method,
            "transport": transport,
            "stiefel": stiefel,
        }
        super().__init__(params, defaults)

    def _functional(
        self, group: dict[str, Any], rows: ProcessRows | None = None
    ) -> S.StiefelOptimizer:
        _check_flags(group, ("nesterov", "maximize"))
        _check_weight_decay(group)
        kw = {"nesterov": group["nesterov"], "dampening": group["dampening"]}
        if not group["stiefel"]:
            return S.euclidean_sgd(group["lr"], group["momentum"], **kw)
        return S.momentum_sgd(
            group["lr"],
            group["momentum"],
            group["metric"],
            expm_method=group["expm_method"],
            transport=group["transport"],
            rows=rows if rows is not None else LOCAL,
            **kw,
        )


class StiefelAdam(_StiefelOptimizer):
    """Adam on Stiefel manifolds (Kong, Wang & Tao, ICLR 2023, Algorithm 2; Algorithm 5 for square
    parameters) as a ``torch.optim.Optimizer``.

    Parameters
    ----------
    params : iterable
        Tensors or parameter-group dicts; ``stiefel=False`` groups get
        :func:`~householderla.stiefel.euclidean_adam` with the same hyperparameters.
    lr : float
        η ≥ 0 (default 1e-3, App. P; 0 moves nothing).
    betas : tuple of float
        (β₁, β₂) ∈ [0, 1)² (default (0.9, 0.999)).
    eps : float
        ε > 0 (default 1e-8).
    weight_decay, amsgrad, maximize
        ``torch.optim.Adam``'s options (defaults 0, False, False); ``weight_decay`` (L2, added
        to the gradient) acts on ``stiefel=False`` groups only.
    metric, expm_method, transport, stiefel
        As in :class:`StiefelSGD`.
    nonfinite : {"raise", "skip"}
        As :class:`StiefelSGD`: raise naming the parameter, or skip and count the step.
    foreach, fused, differentiable, capturable
        Not implemented: a truthy value raises ``ValueError``.

    Notes
    -----
    The paper's bias correction: only κ = √(1 − β₂ᵗ) multiplies the step (no β₁
    correction), for Stiefel and Euclidean parameters alike; so a ``stiefel=False`` group is
    *not* ``torch.optim.Adam`` (see :func:`~householderla.stiefel.euclidean_adam`).
    Per step and parameter: 10 N×M×M products + O(M³).
    """

    _kind = "adam"

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        metric: Any = 0.5,
        *,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        maximize: bool = False,
        expm_method: str = "euler",
        transport: str = "energy",
        stiefel: bool = True,
        nonfinite: str = "raise",
        **unsupported: Any,
    ) -> None:
        _unsupported_kwargs(unsupported, "StiefelAdam")
        self.nonfinite = _nonfinite_option(nonfinite)
        self.skipped_steps = 0
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "amsgrad": amsgrad,
            "maximize": maximize,
            "metric": metric,
            "expm_method": expm_method,
            "transport": transport,
            "stiefel": stiefel,
        }
        super().__init__(params, defaults)

    def _functional(
        self, group: dict[str, Any], rows: ProcessRows | None = None
    ) -> S.StiefelOptimizer:
        betas = group["betas"]
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            raise ValueError(f"betas must be a pair (b1, b2); got {betas!r}")
        b1, b2 = betas
        _check_flags(group, ("amsgrad", "maximize"))
        _check_weight_decay(group)
        if not group["stiefel"]:
            return S.euclidean_adam(group["lr"], b1, b2, group["eps"], amsgrad=group["amsgrad"])
        return S.adam(
            group["lr"],
            b1,
            b2,
            group["eps"],
            group["metric"],
            expm_method=group["expm_method"],
            transport=group["transport"],
            amsgrad=group["amsgrad"],
            rows=rows if rows is not None else LOCAL,
        )
