"""Checks of the Stiefel optimizers and Muon on ``torch.distributed`` and of
``OrthogonalLinear`` under ``fully_shard`` (issue 43), run by ``tests/test_distributed.py`` in
P gloo processes on the CPU.

``python tests/distributed_checks.py WORLD RANK INIT_FILE OUT CHECK@P...`` joins a process
group of WORLD processes (``init_method=file://INIT_FILE``), runs each named check on the
device mesh of processes 0..P−1 (the processes outside it skip it), in order, and writes
``{"CHECK@P": "ok" | traceback}`` to ``OUT.RANK`` as JSON. So one start of 4 processes runs
the checks in 2 and in 4 processes. A check passes when it passes on every process of its
mesh. This module imports no framework at module level (the test module reads ``CHECKS``).

Each equality check builds the same random problem on every process (one seed), steps a
plain tensor with ``StiefelSGD`` / ``StiefelAdam`` (the single-process reference, computed
on every process) and a DTensor of the same values with the same gradients, and compares
the parameter and the state after every step: float64, ≤ 1e-12 relative (the sums over
processes add the same products in another order: a few eps per step, where a wrong block
or a missing reduction is O(1) off). After each comparison the reference continues from the
DTensor's point and state, so each step is compared from the same input: the trajectories
themselves part by ~2.5× a step at these learning rates on fixed gradients, as two
single-process runs whose sums are ordered differently do.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

TOL = 1e-12
#: Shapes of the equality checks: N rows split unevenly over 2 and 4 processes (19 + 18,
#: 10 + 10 + 10 + 7), and a short block: 6 rows over 4 processes (2 + 2 + 2 + 0 rows).
TALL = (37, 5)


#: The device meshes, made once by every process in the same order (a mesh is a process
#: group, whose creation involves every process): ranks 0..P−1 for each P, and 2 × 2.
_MESHES: dict[tuple[int, ...], Any] = {}


def _mesh(P: int, dims: tuple[int, ...] | None = None) -> Any:
    return _MESHES[dims or (P,)]


def _make_meshes(world: int, sizes: list[int]) -> None:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    for P in sorted(set(sizes)):
        _MESHES[(P,)] = DeviceMesh("cpu", torch.arange(P))
    if world == 4:
        _MESHES[(2, 2)] = DeviceMesh("cpu", torch.arange(4).reshape(2, 2))


def _problem(shape: tuple[int, ...], seed: int, project: bool = True) -> tuple[Any, Callable]:
    """A start X (orthonormal columns of the matrices, or not when ``project`` is False) and
    gradients: the Brockett cost −tr(XᵀAXD) per matrix plus a fixed noise term."""
    import torch

    g = torch.Generator().manual_seed(seed)
    N, M = shape[-2], shape[-1]
    tall = N >= M
    n, m = (N, M) if tall else (M, N)
    B = torch.randn(shape[:-2] + (n, n), generator=g, dtype=torch.float64)
    A = (B + B.mT) / (2 * n**0.5)
    D = torch.diag(torch.linspace(2.0, 1.0, m, dtype=torch.float64))
    X = torch.randn(shape[:-2] + (n, m), generator=g, dtype=torch.float64)
    if project:
        X = torch.linalg.qr(X)[0]
    noise = 0.1 * torch.randn(shape[:-2] + (n, m), generator=g, dtype=torch.float64)

    def grad(Xp: Any, t: int) -> Any:
        Xs = Xp if tall else Xp.mT
        Gs = -2 * A @ Xs @ D + noise * (1 + t) ** -0.5
        return Gs if tall else Gs.mT

    return (X if tall else X.mT).contiguous(), grad


def _full(t: Any) -> Any:
    return t.full_tensor() if type(t).__name__ == "DTensor" else t


def _rel(a: Any, b: Any) -> float:
    import torch

    a, b = _full(a), _full(b)
    scale = max(float(torch.linalg.norm(b)), 1e-300)
    return float(torch.linalg.norm(a - b)) / scale


def _compare(
    opt_name: str,
    options: dict[str, Any],
    placement: Any,
    P: int,
    shape: tuple[int, ...] = TALL,
    steps: int = 6,
    project: bool = True,
    mesh: Any = None,
) -> dict[str, Any]:
    """Steps a plain tensor and a DTensor (``placement``) side by side; asserts equality of
    the parameters and of every state tensor after every step. Returns the last errors."""
    import torch
    from torch.distributed.tensor import distribute_tensor

    import householderla.torch as ht

    cls = getattr(ht, opt_name)
    mesh = mesh or _mesh(P)
    X0, grad = _problem(shape, seed=len(shape) * 7 + shape[-2], project=project)
    ref = torch.nn.Parameter(X0.clone())
    dt = torch.nn.Parameter(distribute_tensor(X0.clone(), mesh, [placement], src_data_rank=None))
    o_ref, o_dt = cls([ref], **options), cls([dt], **options)
    worst = {"X": 0.0}
    for t in range(steps):
        G = grad(ref.detach(), t)
        ref.grad = G.clone()
        dt.grad = distribute_tensor(G.clone(), mesh, [placement], src_data_rank=None)
        o_ref.step()
        o_dt.step()
        worst["X"] = max(worst["X"], _rel(dt.detach(), ref.detach()))
        s_ref, s_dt = o_ref.state[ref], o_dt.state[dt]
        for k, v in s_ref.items():
            if k == "step":
                assert int(s_dt[k]) == int(v.detach()), (k, s_dt[k], v)
                continue
            assert type(s_dt[k]).__name__ == "DTensor", (k, type(s_dt[k]))
            assert tuple(s_dt[k].shape) == tuple(v.shape), (k, s_dt[k].shape, v.shape)
            if v.numel():
                worst[k] = max(worst.get(k, 0.0), _rel(s_dt[k], v))
        # the next step from the same point: the check is of the step, not of how the
        # trajectory amplifies rounding (large steps on fixed gradients: ~2.5× a step)
        with torch.no_grad():
            ref.copy_(_full(dt.detach()))
        for k, v in s_dt.items():
            s_ref[k] = _full(v).clone()
    bad = {k: v for k, v in worst.items() if not v <= TOL}
    assert not bad, f"relative differences beyond {TOL}: {bad}"
    return worst


def _older_torch() -> None:
    """torch before ``distribute_tensor(..., src_data_rank=None)`` (every process passes the
    same whole tensor, so none is sent): drop the argument, rank 0's tensor is broadcast,
    the same values."""
    import inspect

    import torch.distributed.tensor as dtensor

    plain = dtensor.distribute_tensor
    if "src_data_rank" in inspect.signature(plain).parameters:
        return

    def distribute_tensor(*args: Any, src_data_rank: Any = 0, **kwargs: Any) -> Any:
        return plain(*args, **kwargs)

    dtensor.distribute_tensor = distribute_tensor


def _shard(dim: int) -> Any:
    from torch.distributed.tensor import Shard

    return Shard(dim)


def _replicate() -> Any:
    from torch.distributed.tensor import Replicate

    return Replicate()


# -- equality to the single-process step ---------------------------------------------------------


def sgd_canonical(P: int, rank: int) -> None:
    _compare("StiefelSGD", {"lr": 0.2, "momentum": 0.9}, _shard(0), P)


def sgd_euclidean(P: int, rank: int) -> None:
    _compare("StiefelSGD", {"lr": 0.2, "momentum": 0.9, "metric": "euclidean"}, _shard(0), P)


def sgd_nesterov(P: int, rank: int) -> None:
    _compare("StiefelSGD", {"lr": 0.2, "momentum": 0.9, "nesterov": True}, _shard(0), P)


def sgd_options(P: int, rank: int) -> None:
    """Dampening, maximize, Cayley exponentials, the printed Euler transport."""
    options = {
        "lr": 0.1,
        "momentum": 0.8,
        "dampening": 0.3,
        "maximize": True,
        "expm_method": "cayley",
        "transport": "euler",
    }
    _compare("StiefelSGD", options, _shard(0), P)


def adam_canonical(P: int, rank: int) -> None:
    _compare("StiefelAdam", {"lr": 0.05}, _shard(0), P)


def adam_euclidean(P: int, rank: int) -> None:
    _compare(
        "StiefelAdam", {"lr": 0.05, "metric": "euclidean", "expm_method": "expm"}, _shard(0), P
    )


def adam_amsgrad(P: int, rank: int) -> None:
    _compare("StiefelAdam", {"lr": 0.05, "amsgrad": True}, _shard(0), P)


def replicated(P: int, rank: int) -> None:
    _compare("StiefelAdam", {"lr": 0.05, "amsgrad": True}, _replicate(), P)
    _compare("StiefelSGD", {"lr": 0.2, "nesterov": True}, _replicate(), P)


def first_step_projects(P: int, rank: int) -> None:
    """A start off the manifold: the first step's polar factor from the reduced Gram matrix
    (κ(XᵀX) large: with its restart)."""
    _compare("StiefelSGD", {"lr": 0.2}, _shard(0), P, project=False, steps=3)
    _compare("StiefelAdam", {"lr": 0.05}, _shard(0), P, project=False, steps=3)


def wide_parameter(P: int, rank: int) -> None:
    """A wide parameter (M, N): its Stiefel matrix is the transpose, so Shard(1) shards the
    rows of that."""
    _compare("StiefelSGD", {"lr": 0.2}, _shard(1), P, shape=(5, 37))
    _compare("StiefelAdam", {"lr": 0.05}, _shard(1), P, shape=(5, 37))


def batched_parameter(P: int, rank: int) -> None:
    """A batch of matrices: Shard(1) shards the rows of each, Shard(0) the batch (a local
    step: each process holds whole matrices)."""
    _compare("StiefelAdam", {"lr": 0.05}, _shard(1), P, shape=(2, 23, 4))
    _compare("StiefelSGD", {"lr": 0.2}, _shard(0), P, shape=(P, 23, 4))


def square_parameter(P: int, rank: int) -> None:
    """M = N (SO(n), Algorithms 4 and 5: no normal momentum), rows sharded."""
    _compare("StiefelSGD", {"lr": 0.2}, _shard(0), P, shape=(6, 6))
    _compare("StiefelAdam", {"lr": 0.05}, _shard(0), P, shape=(6, 6))


def short_blocks(P: int, rank: int) -> None:
    """Blocks of fewer rows than columns, and (P = 4) an empty block: 6 × 3 over P."""
    _compare("StiefelSGD", {"lr": 0.2}, _shard(0), P, shape=(6, 3), project=False, steps=4)
    _compare("StiefelAdam", {"lr": 0.05}, _shard(0), P, shape=(6, 3))


def float32_parameter(P: int, rank: int) -> None:
    """float32: computed in float64, rounded once per step; equal to the single-process step
    to float32's rounding (the rounded step may differ in its last bit)."""
    import torch
    from torch.distributed.tensor import distribute_tensor

    import householderla.torch as ht

    mesh = _mesh(P)
    X0, grad = _problem(TALL, seed=3)
    X0 = X0.float()
    ref = torch.nn.Parameter(X0.clone())
    dt = torch.nn.Parameter(distribute_tensor(X0.clone(), mesh, [_shard(0)], src_data_rank=None))
    o_ref, o_dt = ht.StiefelAdam([ref], lr=0.05), ht.StiefelAdam([dt], lr=0.05)
    for t in range(5):
        G = grad(ref.detach().double(), t).float()
        ref.grad = G.clone()
        dt.grad = distribute_tensor(G.clone(), mesh, [_shard(0)], src_data_rank=None)
        o_ref.step()
        o_dt.step()
    assert _rel(dt.detach(), ref.detach()) <= 1e-5


def rank_deficient_start(P: int, rank: int) -> None:
    """A rank-deficient start: the polar fallback (QR + SVD) by TSQR; its result is one of
    the nearest orthonormal matrices (not unique), so the check is orthonormality."""
    import torch
    from torch.distributed.tensor import distribute_tensor

    import householderla.torch as ht

    mesh = _mesh(P)
    X0, grad = _problem(TALL, seed=5, project=False)
    X0[:, 1] = X0[:, 0]
    dt = torch.nn.Parameter(distribute_tensor(X0, mesh, [_shard(0)], src_data_rank=None))
    opt = ht.StiefelSGD([dt], lr=0.1)
    dt.grad = distribute_tensor(grad(X0, 0), mesh, [_shard(0)], src_data_rank=None)
    opt.step()
    X = dt.detach().full_tensor()
    err = float(torch.linalg.norm(X.T @ X - torch.eye(X.shape[1], dtype=X.dtype)))
    assert err <= 1e-13, err


def euclidean_group(P: int, rank: int) -> None:
    """stiefel=False groups step element-wise on any placement (here Shard(1))."""
    import torch
    from torch.distributed.tensor import distribute_tensor

    import householderla.torch as ht

    mesh = _mesh(P)
    g = torch.Generator().manual_seed(11)
    b0 = torch.randn(5, 8, generator=g, dtype=torch.float64)
    ref = torch.nn.Parameter(b0.clone())
    dt = torch.nn.Parameter(distribute_tensor(b0.clone(), mesh, [_shard(1)], src_data_rank=None))
    o_ref = ht.StiefelAdam([{"params": [ref], "stiefel": False}], lr=0.1, weight_decay=0.01)
    o_dt = ht.StiefelAdam([{"params": [dt], "stiefel": False}], lr=0.1, weight_decay=0.01)
    for _ in range(3):
        G = torch.randn(5, 8, generator=g, dtype=torch.float64)
        ref.grad = G.clone()
        dt.grad = distribute_tensor(G.clone(), mesh, [_shard(1)], src_data_rank=None)
        o_ref.step()
        o_dt.step()
    assert _rel(dt.detach(), ref.detach()) <= TOL
    assert tuple(o_dt.state[dt]["m"].placements) == (_shard(1),)


def state_placements(P: int, rank: int) -> None:
    """The state lives as the parameter's sharding: N×M parts Shard(0), M×M parts replicated."""
    import torch
    from torch.distributed.tensor import distribute_tensor

    import householderla.torch as ht

    mesh = _mesh(P)
    X0, grad = _problem(TALL, seed=2)
    dt = torch.nn.Parameter(distribute_tensor(X0, mesh, [_shard(0)], src_data_rank=None))
    opt = ht.StiefelAdam([dt], lr=0.05, amsgrad=True)
    dt.grad = distribute_tensor(grad(X0, 0), mesh, [_shard(0)], src_data_rank=None)
    opt.step()
    st = opt.state[dt]
    for k in ("U", "q", "q_max"):
        assert tuple(st[k].placements) == (_shard(0),), (k, st[k].placements)
        assert tuple(st[k].to_local().shape) == tuple(dt.to_local().shape), k
    for k in ("Z", "p", "p_max"):
        assert tuple(st[k].placements) == (_replicate(),), (k, st[k].placements)
        assert tuple(st[k].shape) == (TALL[1], TALL[1]), k


def nonfinite_on_one_process(P: int, rank: int) -> None:
    """A NaN in one process's rows: every process raises (nonfinite="raise") or skips the
    step (nonfinite="skip"), and no parameter moves."""
    import torch
    from torch.distributed.tensor import distribute_tensor

    import householderla.torch as ht

    mesh = _mesh(P)
    X0, grad = _problem(TALL, seed=4)
    for mode in ("raise", "skip"):
        dt = torch.nn.Parameter(distribute_tensor(X0, mesh, [_shard(0)], src_data_rank=None))
        opt = ht.StiefelSGD([dt], lr=0.1, nonfinite=mode)
        G = grad(X0, 0)
        G[-1, 0] = float("nan")  # the last process's rows
        dt.grad = distribute_tensor(G, mesh, [_shard(0)], src_data_rank=None)
        try:
            opt.step()
            raised = False
        except ValueError as e:
            raised = "NaN or Inf" in str(e)
        assert raised == (mode == "raise"), (mode, raised)
        assert torch.equal(dt.detach().full_tensor(), X0)
        assert opt.skipped_steps == (mode == "skip")


def bytes_per_step(P: int, rank: int) -> None:
    """The bytes each process hands to collectives per step (counted): a few M×M matrices,
    independent of N, far below gathering X."""
    import torch
    from torch.distributed.tensor import distribute_tensor

    import householderla.torch as ht
    from householderla._interop import torch_distributed as td

    mesh = _mesh(P)
    for N in (200, 800):
        M = 6
        X0, grad = _problem((N, M), seed=6)
        dt = torch.nn.Parameter(distribute_tensor(X0, mesh, [_shard(0)], src_data_rank=None))
        opt = ht.StiefelSGD([dt], lr=0.1)
        for t in range(3):
            dt.grad = distribute_tensor(grad(X0, t), mesh, [_shard(0)], src_data_rank=None)
            td.reset_sent()
            opt.step()
            sent = td.reset_sent()
        # SGD: XᵀG (+ max|G|); ŨᵀU½, ‖U½‖² (+ max|U½|, the polar maxima); the Gram of X†;
        # the finiteness flag
        floats = (M * M + P) + (M * M + 1 + P * (M + 2)) + M * M
        assert sent["bytes"] == 8 * floats + 4, (sent, floats)
        assert sent["calls"] == 4, sent
        assert sent["bytes"] < 8 * N * M // P


# -- errors -------------------------------------------------------------------------------------


def column_sharding_raises(P: int, rank: int) -> None:
    import torch
    from torch.distributed.tensor import distribute_tensor

    import householderla.torch as ht

    mesh = _mesh(P)
    for shape, dim, name in (((37, 8), 1, "Shard(1)"), ((8, 37), 0, "Shard(0)")):
        X = torch.ones(shape, dtype=torch.float64)
        dt = torch.nn.Parameter(distribute_tensor(X, mesh, [_shard(dim)], src_data_rank=None))
        dt.grad = distribute_tensor(X.clone(), mesh, [_shard(dim)], src_data_rank=None)
        opt = ht.StiefelSGD([dt], lr=0.1)
        try:
            opt.step()
        except ValueError as e:
            msg = str(e)
            assert name in msg and "columns" in msg and "parameter 0 of group 0" in msg, msg
        else:
            raise AssertionError(f"{name} of shape {shape} did not raise")


def mesh_2d_raises(P: int, rank: int) -> None:
    import torch
    from torch.distributed.tensor import distribute_tensor

    import householderla.torch as ht

    if P != 4:
        return
    mesh = _mesh(P, (2, 2))
    X = torch.randn(37, 5, dtype=torch.float64)
    placements = [_shard(0), _replicate()]
    dt = torch.nn.Parameter(distribute_tensor(X, mesh, placements, src_data_rank=None))
    dt.grad = distribute_tensor(torch.ones(37, 5, dtype=torch.float64), mesh, placements)
    try:
        ht.StiefelAdam([dt]).step()
    except ValueError as e:
        assert "2-D device mesh" in str(e) and "Shard(dim=0)" in str(e), str(e)
    else:
        raise AssertionError("a 2-D mesh did not raise")


# -- orthogonality over many steps ---------------------------------------------------------------


def _drift(opt_name: str, options: dict[str, Any], P: int, steps: int) -> tuple[float, float]:
    """‖XᵀX − I‖_F after ``steps`` steps, row-sharded and on one process."""
    import torch
    from torch.distributed.tensor import distribute_tensor

    import householderla.torch as ht

    cls = getattr(ht, opt_name)
    mesh = _mesh(P)
    X0, grad = _problem((64, 8), seed=9)
    ref = torch.nn.Parameter(X0.clone())
    dt = torch.nn.Parameter(distribute_tensor(X0.clone(), mesh, [_shard(0)], src_data_rank=None))
    o_ref, o_dt = cls([ref], **options), cls([dt], **options)
    for t in range(steps):  # the same gradients (at the reference's iterate)
        G = grad(ref.detach(), t)
        ref.grad = G
        dt.grad = distribute_tensor(G.clone(), mesh, [_shard(0)], src_data_rank=None)
        o_ref.step()
        o_dt.step()
    eye = torch.eye(8, dtype=torch.float64)
    X, Xr = dt.detach().full_tensor(), ref.detach()
    return float(torch.linalg.norm(X.T @ X - eye)), float(torch.linalg.norm(Xr.T @ Xr - eye))


def _orthogonality(P: int, steps: int) -> None:
    for name, options in (("StiefelSGD", {"lr": 0.2}), ("StiefelAdam", {"lr": 0.05})):
        err, err_ref = _drift(name, options, P, steps)
        # as on one process: at float64's rounding, not growing with the steps
        assert err <= max(4 * err_ref, 64 * 2.2e-16 * 8), (name, err, err_ref)


def orthogonality_100(P: int, rank: int) -> None:
    _orthogonality(P, 100)


def orthogonality_1000(P: int, rank: int) -> None:
    _orthogonality(P, 1000)


# -- Muon: each matrix orthogonalised on its owner ------------------------------------------------

#: Parameters of the Muon checks: (shape, placement) — row-sharded matrices of different sizes
#: (tall, wide, uneven blocks), short blocks (6 rows over 4: 2 + 2 + 2 + 0; 1 row: one process
#: holds it, the others none), a batch of three matrices sharded by rows (Shard(1)), a
#: replicated matrix and a batch sharded by its batch dimension (both stepped locally).
MUON_SPECS = (
    ((40, 24), "rows"),
    ((24, 40), "rows"),
    ((17, 9), "rows"),
    ((6, 3), "rows"),
    ((1, 7), "rows"),
    ((3, 12, 10), "rows"),
    ((10, 6), "replicate"),
    ((3, 8, 5), "batch"),
)


def _placement(kind: str, ndim: int) -> Any:
    return {"rows": _shard(ndim - 2), "replicate": _replicate(), "batch": _shard(0)}[kind]


def _muon_compare(
    P: int, options: dict[str, Any], dtype: Any, specs: Any = MUON_SPECS, steps: int = 3
) -> Any:
    """Steps plain tensors and DTensors with ``hl.torch.Muon`` side by side (the same
    gradients); asserts after every step that every parameter and momentum buffer equals the
    single-process one bit for bit (``torch.equal``) and that the buffers are DTensors sharded
    like their parameters. Returns the DTensors' optimizer."""
    import torch
    from torch.distributed.tensor import distribute_tensor

    import householderla.torch as ht

    mesh = _mesh(P)
    g = torch.Generator().manual_seed(17)
    refs, dts, places = [], [], []
    for shape, kind in specs:
        pl = _placement(kind, len(shape))
        X0 = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
        refs.append(torch.nn.Parameter(X0.clone()))
        dts.append(
            torch.nn.Parameter(distribute_tensor(X0.clone(), mesh, [pl], src_data_rank=None))
        )
        places.append(pl)
    o_ref, o_dt = ht.Muon(refs, **options), ht.Muon(dts, **options)
    for t in range(steps):
        for r, d, pl in zip(refs, dts, places, strict=True):
            G = torch.randn(tuple(r.shape), generator=g, dtype=torch.float64).to(dtype)
            r.grad = G.clone()
            d.grad = distribute_tensor(G.clone(), mesh, [pl], src_data_rank=None)
        o_ref.step()
        o_dt.step()
        for i, (r, d, pl) in enumerate(zip(refs, dts, places, strict=True)):
            got = d.detach().full_tensor()
            diff = float((got.double() - r.detach().double()).abs().max())
            assert torch.equal(got, r.detach()), (options, dtype, i, t, diff)
            b_ref, b_dt = o_ref.state[r]["momentum_buffer"], o_dt.state[d]["momentum_buffer"]
            assert type(b_dt).__name__ == "DTensor" and tuple(b_dt.placements) == (pl,), i
            assert torch.equal(b_dt.full_tensor(), b_ref), (options, dtype, i, t)
    return o_dt


#: Hyperparameters of the Muon checks: Nesterov on and off, weight decay, the learning-rate
#: adjustments, other schedules and fixed coefficients.
MUON_OPTIONS = (
    {"lr": 0.05},
    {"lr": 0.05, "nesterov": False, "weight_decay": 0.0, "adjust_lr_fn": "match_rms_adamw"},
    {"lr": 0.02, "momentum": 0.9, "adjust_lr_fn": "original", "schedule": "polar_express"},
    {"lr": 0.02, "ns_coefficients": (3.4445, -4.775, 2.0315), "weight_decay": 0.01},
)


def muon_float64(P: int, rank: int) -> None:
    """float64 parameters, orthogonalised in float64 (``ns_dtype``) and in bfloat16 (the
    default): the single-process step bit for bit."""
    import torch

    for options in MUON_OPTIONS:
        _muon_compare(P, {**options, "ns_dtype": torch.float64}, torch.float64)
    _muon_compare(P, MUON_OPTIONS[1], torch.float64)


def muon_bfloat16(P: int, rank: int) -> None:
    """bfloat16 parameters (orthogonalised in bfloat16) and float32 ones: bit for bit."""
    import torch

    for options in MUON_OPTIONS:
        _muon_compare(P, options, torch.bfloat16)
    _muon_compare(P, MUON_OPTIONS[0], torch.float32)


def muon_split_sizes(P: int, rank: int) -> None:
    """A fused parameter (``split_sizes``, equal and unequal blocks): the row blocks of the
    processes cut across the split blocks, each with its own learning-rate adjustment."""
    import torch

    for sizes in ((10, 10, 10), (12, 5, 13)):
        for dtype in (torch.float64, torch.bfloat16):
            options = {"lr": 0.05, "split_sizes": sizes}
            _muon_compare(P, options, dtype, specs=(((30, 8), "rows"), ((2, 30, 7), "rows")))


def muon_owners(P: int, rank: int) -> None:
    """Every matrix is orthogonalised on exactly one process, its owner: the matrices by
    decreasing A·B·min(A, B), dealt round-robin (a batch's matrices each on its own); each
    process's count of orthogonalised matrices is its share."""
    import torch
    import torch.distributed as dist

    from householderla.torch import _muon

    specs = MUON_SPECS[:6]
    done = []
    inner = _muon._orthogonalize

    def counting(X: Any, *args: Any, **kw: Any) -> Any:
        if X is not None:  # (None: the constructor's validation)
            done.append(X.shape[:-2].numel())
        return inner(X, *args, **kw)

    _muon._orthogonalize = counting
    try:
        opt = _muon_compare(P, {"lr": 0.05}, torch.bfloat16, specs=specs, steps=1)
    finally:
        _muon._orthogonalize = inner
    mats = [(i, e) for i, (shape, _) in enumerate(specs) for e in range(math.prod(shape[:-2]))]
    cost = [specs[i][0][-2] * specs[i][0][-1] * min(specs[i][0][-2:]) for i, _ in mats]
    order = sorted(range(len(mats)), key=lambda j: (-cost[j], j))
    expected: dict[tuple[int, int], list[int]] = {(0, i): [] for i in range(len(specs))}
    owner = {mats[j]: turn % P for turn, j in enumerate(order)}
    for i, e in mats:
        expected[(0, i)].append(owner[(i, e)])
    assert opt.owners == expected, (opt.owners, expected)
    # the reference optimizer's calls: one per parameter, its matrices
    ref_calls = sum(math.prod(shape[:-2]) for shape, _ in specs)
    mine = sum(done) - ref_calls
    assert mine == sum(o == rank for os in expected.values() for o in os), (mine, done)
    count = torch.tensor([float(mine)])
    dist.all_reduce(count, group=_mesh(P).get_group())
    assert int(count) == len(mats), (int(count), len(mats))
    loads = [sum(c for c, j in zip(cost, range(len(mats)), strict=True) if owner[mats[j]] == k)
             for k in range(P)]  # fmt: skip
    assert max(loads) - min(loads) <= max(cost), loads


def muon_bytes(P: int, rank: int) -> None:
    """The bytes each process hands to collectives per step (counted): its rows of U for the
    matrices others own, and the other processes' rows of O for those it owns (bfloat16, 2
    bytes a number), in two ``all_to_all`` calls; below gathering every matrix to every
    process from P = 4 on (the ratio is about 2/P)."""
    import torch
    from torch.distributed.tensor import distribute_tensor

    import householderla.torch as ht
    from householderla._interop import torch_distributed as td

    mesh = _mesh(P)
    shapes = [(96, 64), (64, 48), (2, 40, 40), (7, 30)]
    params = []
    for shape in shapes:
        X = torch.randn(shape, dtype=torch.float32)
        pl = _shard(len(shape) - 2)
        params.append(torch.nn.Parameter(distribute_tensor(X, mesh, [pl], src_data_rank=None)))
    opt = ht.Muon(params, lr=0.02)
    for _ in range(2):
        for prm in params:
            G = torch.randn(tuple(prm.shape), dtype=torch.float32)
            prm.grad = distribute_tensor(G, mesh, [_shard(prm.ndim - 2)], src_data_rank=None)
        td.reset_sent()
        opt.step()
        sent = td.reset_sent()
    expected = gather = 0
    for i, shape in enumerate(shapes):
        A, B = shape[-2:]
        r0, r1 = td.row_range(A, P, rank)
        for owner in opt.owners[(0, i)]:
            expected += 2 * B * ((A - (r1 - r0)) if owner == rank else (r1 - r0))
            gather += 2 * B * (r1 - r0) * (P - 1)
    assert sent == {"bytes": expected, "calls": 2}, (sent, expected)
    if P >= 4:
        assert sent["bytes"] < gather, (sent, gather)


def muon_100_steps(P: int, rank: int) -> None:
    """100 steps in bfloat16 and float32 (``make test-long``): still bit for bit (a
    trajectory, not only a step: nothing drifts)."""
    import torch

    for dtype in (torch.bfloat16, torch.float32):
        _muon_compare(P, MUON_OPTIONS[0], dtype, steps=100)


def muon_errors(P: int, rank: int) -> None:
    """Shard of the columns and Partial raise ValueError naming the placement; so does a
    2-D mesh."""
    import torch
    from torch.distributed.tensor import Partial, distribute_tensor

    import householderla.torch as ht

    mesh = _mesh(P)
    for shape, pl, name in (
        ((12, 8), _shard(1), "Shard(1)"),
        ((2, 12, 8), _shard(2), "Shard(2)"),
    ):
        X = torch.ones(shape, dtype=torch.float64)
        dt = torch.nn.Parameter(distribute_tensor(X, mesh, [pl], src_data_rank=None))
        dt.grad = distribute_tensor(X.clone(), mesh, [pl], src_data_rank=None)
        try:
            ht.Muon([dt], lr=0.1).step()
        except ValueError as e:
            msg = str(e)
            assert name in msg and "columns" in msg and "parameter 0 of group 0" in msg, msg
        else:
            raise AssertionError(f"{name} did not raise")
    from torch.distributed.tensor import DTensor

    local = torch.ones(12, 8, dtype=torch.float64)
    dt = torch.nn.Parameter(DTensor.from_local(local, mesh, [Partial()], run_check=False))
    dt.grad = DTensor.from_local(local.clone(), mesh, [Partial()], run_check=False)
    try:
        ht.Muon([dt], lr=0.1).step()
    except ValueError as e:
        assert "Partial(sum)" in str(e), str(e)
    else:
        raise AssertionError("Partial did not raise")
    if P == 4:
        mesh2 = _mesh(P, (2, 2))
        placements = [_shard(0), _replicate()]
        X = torch.ones(12, 8, dtype=torch.float64)
        dt = torch.nn.Parameter(distribute_tensor(X, mesh2, placements, src_data_rank=None))
        dt.grad = distribute_tensor(X.clone(), mesh2, placements, src_data_rank=None)
        try:
            ht.Muon([dt], lr=0.1).step()
        except ValueError as e:
            assert "2-D device mesh" in str(e), str(e)
        else:
            raise AssertionError("a 2-D mesh did not raise")


# -- OrthogonalLinear under fully_shard --------------------------------------------------------

#: (N, rows a process, bias, dtype, nested): N = 8 one block; N = 200 the blocked one-node
#: path, applied (16 rows) and formed (400 rows > N); N = 37 and 13 uneven row shards
#: (19 + 18, 10 + 10 + 10 + 7; 7 + 6, 4 + 4 + 4 + 1).
FSDP_CASES = (
    (8, 5, True, "float64", False),
    (200, 16, False, "float64", True),
    (200, 400, True, "float64", False),
    (37, 7, True, "float64", True),
    (13, 30, False, "float64", False),
    (37, 7, True, "float32", True),
    (200, 16, False, "float32", False),
)
#: float32: the P micro-batch gradients are summed in another order than the reference's
#: accumulation (FSDP's reduce-scatter), ≤ (P − 1)·eps relative an entry; the forward and
#: each micro-batch's gradient are the same operations on the same numbers.
FSDP_TOL = {"float64": TOL, "float32": 3e-6}


def _fsdp_pair(N: int, bias: bool, dtype: Any, nested: bool, P: int) -> tuple[Any, Any, Any]:
    """(reference layer, its fully_shard copy, the module stepped): the same initial
    parameters; ``nested``: the layer inside a ``Sequential`` with its own ``fully_shard``
    (not the root: resharded after forward, gathered again for backward)."""
    import torch
    from torch.distributed.fsdp import fully_shard

    import householderla.torch as ht

    def layer() -> Any:
        g = torch.Generator().manual_seed(N)
        return ht.OrthogonalLinear(N, N, bias=bias, generator=g, dtype=dtype)

    ref, lay = layer(), layer()
    if nested:
        model = torch.nn.Sequential(lay, torch.nn.Identity())
        fully_shard(lay, mesh=_mesh(P))
        fully_shard(model, mesh=_mesh(P))
    else:
        model = fully_shard(lay, mesh=_mesh(P))
    return ref, lay, model


def fsdp_layer(P: int, rank: int) -> None:
    """``OrthogonalLinear`` under ``fully_shard`` (FSDP2): its reflectors V (and the bias) are
    DTensors sharded by rows; FSDP gathers them into a plain parameter before the forward,
    so the layer (its one autograd node, blocked or not, applied or formed) sees the full V.
    Each process takes its own micro-batch; the forward rows, the gradients (reduce-scattered:
    averaged over the processes), an SGD step and the next forward equal the single-process
    layer run on each micro-batch with the gradients averaged."""
    import torch

    from householderla.torch import _layer

    inner, seen = _layer.CWYLinear, []

    class Recording:
        @staticmethod
        def apply(V: Any, x: Any, trapezoidal: bool, formed: bool, block: int) -> Any:
            seen.append((type(V).__name__, tuple(V.shape), formed))
            return inner.apply(V, x, trapezoidal, formed, block)

    _layer.CWYLinear = Recording
    try:
        for N, b, bias, dt, nested in FSDP_CASES:
            dtype = getattr(torch, dt)
            ref, lay, model = _fsdp_pair(N, bias, dtype, nested, P)
            names = [n for n, _ in ref.named_parameters()]
            assert type(lay.vectors[0]).__name__ == "DTensor", type(lay.vectors[0])
            assert tuple(lay.vectors[0].placements) == (_shard(0),)
            g = torch.Generator().manual_seed(N + b)
            xs = torch.randn(P, b, N, generator=g, dtype=dtype)
            ws = torch.randn(P, b, N, generator=g, dtype=dtype)
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05)
            for step in range(2):
                del seen[:]
                y = model(xs[rank])
                assert seen == [("Parameter", (N, N), b > N)], seen
                (y * ws[rank]).sum().backward()
                ys = []
                for k in range(P):  # the single-process layer, micro-batch by micro-batch
                    yk = ref(xs[k])
                    ((yk * ws[k]).sum() / P).backward()
                    ys.append(yk.detach())
                tol = FSDP_TOL[dt]
                case = (N, b, bias, dt, nested, step)
                assert _rel(y.detach(), ys[rank]) <= tol, (case, _rel(y.detach(), ys[rank]))
                for name, p, q in zip(names, ref.parameters(), lay.parameters(), strict=True):
                    assert type(q.grad).__name__ == "DTensor", (case, name)
                    err = _rel(q.grad, p.grad)
                    assert err <= tol, (case, name, err)
                opt.step()
                opt_ref.step()
                opt.zero_grad()
                opt_ref.zero_grad()
                for name, p, q in zip(names, ref.parameters(), lay.parameters(), strict=True):
                    assert _rel(q.detach(), p.detach()) <= tol, (case, name, "after the step")
    finally:
        _layer.CWYLinear = inner


def fsdp_layer_replicated(P: int, rank: int) -> None:
    """The alternative to sharding V (``docs/distributed.rst``): ``fully_shard`` of the model
    with the layer's parameters in ``ignored_params`` (V kept whole on every process) and
    their gradients averaged by one ``all_reduce``: the gradients of the sharded layer
    (≤ 1e-12 relative); and the collectives of a step (counted) in both ways: sharded, V's
    and the bias' shard (padded to ⌈N/P⌉ rows) gathered for the forward and again for the
    backward of a layer below the root, their gradients reduce-scattered; replicated, one
    all_reduce of V̄, none of V's size else."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    import householderla.torch as ht

    N, b, dtype = 37, 6, torch.float64
    g = torch.Generator().manual_seed(3)
    xs = torch.randn(P, b, N, generator=g, dtype=dtype)
    ws = torch.randn(P, b, N, generator=g, dtype=dtype)
    sent: list[tuple[str, int]] = []
    originals = {}
    # torch 2.13's FSDP2 calls the ``*_single`` collectives, torch 2.11's the ``*_tensor``
    # ones (the ``*_single`` names do not exist there): counted as "all_gather" and
    # "reduce_scatter" either way
    for name in ("all_gather_single", "reduce_scatter_single", "all_reduce",
                 "all_gather_into_tensor", "reduce_scatter_tensor"):  # fmt: skip
        if not hasattr(dist, name):
            continue
        originals[name] = fn = getattr(dist, name)
        kind = next(k for k in ("all_gather", "reduce_scatter", name) if name.startswith(k))

        def counting(*args: Any, _fn: Any = fn, _name: str = kind, **kw: Any) -> Any:
            if _name == "all_reduce":  # (tensor, ...)
                t = args[0] if args else kw["tensor"]
            else:  # (output, input, ...)
                t = args[1] if len(args) > 1 else kw.get("input", kw.get("input_tensor"))
            sent.append((_name, t.numel() * t.element_size()))
            return _fn(*args, **kw)

        setattr(dist, name, counting)
    try:
        grads = {}
        for mode in ("sharded", "replicated"):
            gl = torch.Generator().manual_seed(N)
            lay = ht.OrthogonalLinear(N, N, generator=gl, dtype=dtype)
            head = torch.nn.Linear(N, 3, dtype=dtype)
            torch.nn.init.ones_(head.weight)
            torch.nn.init.zeros_(head.bias)
            model = torch.nn.Sequential(lay, head)
            if mode == "sharded":
                fully_shard(lay, mesh=_mesh(P))
                fully_shard(model, mesh=_mesh(P))
            else:
                fully_shard(model, mesh=_mesh(P), ignored_params=set(lay.parameters()))
            del sent[:]
            (model(xs[rank]) * ws[rank][:, :3]).sum().backward()
            if mode == "replicated":
                for p in lay.parameters():
                    dist.all_reduce(p.grad, group=_mesh(P).get_group())
                    p.grad /= P
            grads[mode] = [_full(p.grad) for p in lay.parameters()]
            counted = sorted(sent)
            pad = -(-N // P)  # FSDP pads V's rows to a multiple of P
            if mode == "sharded":
                # V and the bias in one all_gather each time: forward and backward (nested);
                # their gradients in one reduce_scatter; the head likewise, separately
                own = 8 * (pad * N + -(-N // P))
                assert ("all_gather", own) in counted, counted
                assert counted.count(("all_gather", own)) == 2, counted
                assert ("reduce_scatter", P * own) in counted, counted
            else:
                assert ("all_reduce", 8 * N * N) in counted, counted
                assert not any(n.startswith("all_gather") and s >= 8 * N * N // P
                               for n, s in counted), counted  # fmt: skip
        for a, c in zip(grads["sharded"], grads["replicated"], strict=True):
            assert _rel(a, c) <= TOL, _rel(a, c)
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


CHECKS: dict[str, Callable[[int, int], None]] = {
    f.__name__: f
    for f in (
        sgd_canonical,
        sgd_euclidean,
        sgd_nesterov,
        sgd_options,
        adam_canonical,
        adam_euclidean,
        adam_amsgrad,
        replicated,
        first_step_projects,
        wide_parameter,
        batched_parameter,
        square_parameter,
        short_blocks,
        float32_parameter,
        rank_deficient_start,
        euclidean_group,
        state_placements,
        nonfinite_on_one_process,
        bytes_per_step,
        column_sharding_raises,
        mesh_2d_raises,
        orthogonality_100,
        orthogonality_1000,
        muon_float64,
        muon_bfloat16,
        muon_split_sizes,
        muon_owners,
        muon_bytes,
        muon_errors,
        muon_100_steps,
        fsdp_layer,
        fsdp_layer_replicated,
    )
}


def main(argv: list[str]) -> None:
    world, rank, init_file, out, *items = argv
    world, rank = int(world), int(rank)
    runs = [(name, int(P)) for name, P in (item.split("@") for item in items)]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    _older_torch()
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
        timeout=timedelta(seconds=60),
    )  # fmt: skip
    _make_meshes(world, [P for _, P in runs])
    results = {}
    for name, P in runs:
        if rank >= P:  # not in this check's mesh
            continue
        t0 = time.perf_counter()
        try:
            CHECKS[name](P, rank)
            results[f"{name}@{P}"] = "ok"
        except Exception:
            results[f"{name}@{P}"] = traceback.format_exc()
        print(f"{name}@{P}: {time.perf_counter() - t0:.2f} s", flush=True)
    with open(f"{out}.{rank}", "w", encoding="utf-8") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
