"""Row-sharded Stiefel optimizers and Muon on torch.distributed: bytes per step and step time at
1, 2, 4 processes (issue 43).

X (N, M) is a DTensor sharded by rows (``Shard(0)``) over P gloo processes on the CPU; each
step of ``StiefelSGD`` / ``StiefelAdam`` reduces only M×M matrices. Per shape and optimizer the
table reports the bytes each process hands to collectives per step, counted by
``householderla._interop.torch_distributed.SENT`` (the payload: a ring ``all_reduce`` puts
about twice its payload on the wire), against gathering X (N·M·8 bytes into every process),
and the median step time at P = 1, 2 and 4 (each P a fresh group of P processes, one thread
each), with the plain single-process step (a tensor, no DTensor) as the anchor. On a machine
with fewer cores than 4 the 4-process times include oversubscription.

Muon (``hl.torch.Muon``, bfloat16 orthogonalisation): per set of row-sharded parameters (the
matrices of a transformer layer of width d: attention, MLP, a batch of experts), the bytes each
process hands to the two ``all_to_all`` calls of a step (counted, the largest over the
processes) against gathering every matrix of U into every process (Σ A·B·2 bytes), and the
median step time at P = 1, 2, 4 with the plain single-process step as the anchor.

``hl.torch.OrthogonalLinear`` under ``fully_shard`` (FSDP2, float32): per N, one training
step (forward, backward, SGD) of a batch of ``fsdp_rows`` rows a process, with the layer's
reflectors V sharded by FSDP (gathered for the forward, again for the backward of a non-root
layer unless ``reshard_after_forward=False``, V̄ reduce-scattered) or kept whole on every
process (``ignored_params``, V̄ averaged by one ``all_reduce``): the tensors handed to each
collective (counted by wrapping ``torch.distributed``) and the median step time.
``--fsdp`` runs only that part and writes ``distributed_fsdp.{json,md}``.

``python -m benchmarks.distributed [--quick] [--fsdp] [--out DIR]``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import _harness as H

FULL = {
    "shapes": [(4096, 32), (16384, 64), (65536, 64)],
    "steps": 7,
    "P": (1, 2, 4),
    "muon_d": 768,
    "muon_steps": 5,
}
QUICK = {
    "shapes": [(512, 8), (2048, 16)],
    "steps": 3,
    "P": (1, 2, 4),
    "muon_d": 128,
    "muon_steps": 3,
}
OPTIMIZERS = {"StiefelSGD": {"lr": 0.1}, "StiefelAdam": {"lr": 0.01}}
FULL.update(fsdp_N=[256, 1024], fsdp_rows=64, fsdp_steps=7)
QUICK.update(fsdp_N=[64], fsdp_rows=16, fsdp_steps=3)
#: The ways of running OrthogonalLinear under fully_shard, measured: V sharded (FSDP's
#: default for a layer with its own ``fully_shard`` below the root; and not resharded after
#: the forward) or kept whole on every process; and the same step without ``fully_shard``
#: and without collectives (each process alone: the computation's share of the step).
FSDP_MODES = ("sharded", "sharded, no reshard", "replicated", "no FSDP")
_COLLECTIVES = ("all_gather_single", "reduce_scatter_single", "all_reduce",
                "all_gather_into_tensor", "reduce_scatter_tensor")  # fmt: skip


def muon_sets(d: int) -> list[tuple[str, list[tuple[int, ...]]]]:
    """Muon's parameter sets at width d: (name, shapes), each shape one parameter."""
    attention = [(d, d)] * 4
    mlp = [(4 * d, d), (d, 4 * d)]
    experts = [(8, d // 2, d)]
    return [
        ("attention: 4 × (d, d)", attention),
        ("MLP: (4d, d), (d, 4d)", mlp),
        ("experts: one (8, d/2, d)", experts),
        ("the layer: all of the above", attention + mlp + experts),
    ]


def _worker(P: int, rank: int, init: str, out: str, cfg: dict[str, Any]) -> None:
    """One process of a group of P: every shape and optimizer, rank 0 writes the results."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    import householderla.torch as ht
    from householderla._interop import torch_distributed as td

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init}", rank=rank, world_size=P,
        timeout=timedelta(seconds=600),
    )  # fmt: skip
    mesh = init_device_mesh("cpu", (P,))
    rows = []
    for N, M in [] if cfg.get("fsdp_only") else cfg["shapes"]:
        g = torch.Generator().manual_seed(N + M)
        X0 = torch.linalg.qr(torch.randn(N, M, generator=g, dtype=torch.float64))[0]
        # a gradient of the scale of a loss of O(1) per column (a tangent step of O(lr))
        G0 = torch.randn(N, M, generator=g, dtype=torch.float64) / N**0.5
        for name, options in OPTIMIZERS.items():
            cls = getattr(ht, name)
            times = {}
            for kind in ("dtensor", "tensor") if P == 1 else ("dtensor",):
                if kind == "dtensor":
                    p = torch.nn.Parameter(distribute_tensor(X0, mesh, [Shard(0)]))
                    p.grad = distribute_tensor(G0, mesh, [Shard(0)])
                else:
                    p = torch.nn.Parameter(X0.clone())
                    p.grad = G0.clone()
                opt = cls([p], **options)
                opt.step()  # the first step (projection, state) is not timed
                per = []
                sent = []
                for _ in range(cfg["steps"]):
                    dist.barrier()
                    td.reset_sent()
                    t0 = time.perf_counter()
                    opt.step()
                    per.append(time.perf_counter() - t0)
                    sent.append(td.reset_sent())
                per.sort()
                times[kind] = per[len(per) // 2]
                if kind == "dtensor":
                    step_bytes = sent[-1]["bytes"]
                    calls = sent[-1]["calls"]
            rows.append({"optimizer": name, "N": N, "M": M, "P": P, "bytes": step_bytes,
                         "calls": calls, "step_s": times["dtensor"],
                         "tensor_step_s": times.get("tensor")})  # fmt: skip
    if not cfg.get("fsdp_only"):
        rows += _muon_rows(P, mesh, cfg)
    else:
        rows = []
    if P > 1:
        rows += _fsdp_rows(P, mesh, cfg)
    if rank == 0:
        Path(out).write_text(json.dumps(rows), encoding="utf-8")
    dist.barrier()
    dist.destroy_process_group()


def _muon_rows(P: int, mesh: Any, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Muon on each parameter set: counted bytes per process (every process's, gathered) and
    the median step time, as DTensors sharded by rows and (P = 1) as plain tensors."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor

    import householderla.torch as ht
    from householderla._interop import torch_distributed as td

    rows = []
    for name, shapes in muon_sets(cfg["muon_d"]):
        g = torch.Generator().manual_seed(len(shapes))
        W0 = [torch.randn(s, generator=g) / s[-1] ** 0.5 for s in shapes]
        G0 = [torch.randn(s, generator=g) for s in shapes]
        times, sent = {}, None
        for kind in ("dtensor", "tensor") if P == 1 else ("dtensor",):
            params = []
            for W, G in zip(W0, G0, strict=True):
                if kind == "dtensor":
                    pl = [Shard(W.ndim - 2)]
                    p = torch.nn.Parameter(distribute_tensor(W, mesh, pl))
                    p.grad = distribute_tensor(G, mesh, pl)
                else:
                    p = torch.nn.Parameter(W.clone())
                    p.grad = G.clone()
                params.append(p)
            opt = ht.Muon(params, lr=0.02)
            opt.step()  # the first step (the buffers, the schedule's coefficients) untimed
            per = []
            for _ in range(cfg["muon_steps"]):
                dist.barrier()
                td.reset_sent()
                t0 = time.perf_counter()
                opt.step()
                per.append(time.perf_counter() - t0)
                counted = td.reset_sent()
            per.sort()
            times[kind] = per[len(per) // 2]
            if kind == "dtensor":
                sent = [None] * P
                dist.all_gather_object(sent, counted)
        gather = sum(2 * math.prod(s) for s in shapes)  # U in bfloat16, whole, per process
        rows.append({"optimizer": "Muon", "set": name, "shapes": shapes, "P": P,
                     "bytes": [c["bytes"] for c in sent], "calls": sent[0]["calls"],
                     "gather": gather, "step_s": times["dtensor"],
                     "tensor_step_s": times.get("tensor")})  # fmt: skip
    return rows


def _fsdp_rows(P: int, mesh: Any, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """OrthogonalLinear (N, N, float32) as ``Sequential(layer, head)`` under ``fully_shard``
    in each of :data:`FSDP_MODES`: the payloads handed to collectives in one step (name,
    bytes) and the median step time."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    import householderla.torch as ht

    calls: list[tuple[str, int]] = []
    originals = {name: getattr(dist, name) for name in _COLLECTIVES}

    def counting(name: str, fn: Any) -> Any:
        def wrapped(*args: Any, **kw: Any) -> Any:
            if name == "all_reduce":
                t = args[0] if args else kw["tensor"]
            else:
                t = args[1] if len(args) > 1 else kw.get("input", kw.get("input_tensor"))
            calls.append((name, t.numel() * t.element_size()))
            return fn(*args, **kw)

        return wrapped

    rows = []
    try:
        for name, fn in originals.items():
            setattr(dist, name, counting(name, fn))
        for N in cfg["fsdp_N"]:
            b = cfg["fsdp_rows"]
            g = torch.Generator().manual_seed(N)
            x = torch.randn(b, N, generator=g)
            for mode in FSDP_MODES:
                lay = ht.OrthogonalLinear(N, N, generator=torch.Generator().manual_seed(0))
                head = torch.nn.Linear(N, 16)
                model = torch.nn.Sequential(lay, head)
                if mode == "replicated":
                    fully_shard(model, mesh=mesh, ignored_params=set(lay.parameters()))
                elif mode != "no FSDP":
                    fully_shard(lay, mesh=mesh, reshard_after_forward=mode == "sharded")
                    fully_shard(model, mesh=mesh)
                opt = torch.optim.SGD(model.parameters(), lr=1e-3)
                per = []
                for _ in range(cfg["fsdp_steps"] + 1):
                    dist.barrier()
                    del calls[:]
                    t0 = time.perf_counter()
                    model(x).square().mean().backward()
                    if mode == "replicated":  # what DDP would do for these parameters
                        for p in lay.parameters():
                            dist.all_reduce(p.grad, group=mesh.get_group())
                            p.grad /= P
                    opt.step()
                    opt.zero_grad()
                    per.append(time.perf_counter() - t0)
                    counted = list(calls)
                per = sorted(per[1:])
                vbytes = 4 * N * N
                rows.append({"optimizer": "fsdp", "mode": mode, "N": N, "P": P, "rows": b,
                             "calls": counted, "V_bytes": vbytes,
                             "step_s": per[len(per) // 2]})  # fmt: skip
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
    return rows


def _wire(name: str, nbytes: int, P: int) -> float:
    """Bytes a process sends for a collective with this payload, by a ring: an all_gather
    sends (P − 1) shards; a reduce_scatter (P − 1)/P of its input; an all_reduce twice
    that."""
    if name.startswith("all_gather"):
        return (P - 1) * nbytes
    if name.startswith("reduce_scatter"):
        return (P - 1) / P * nbytes
    return 2 * (P - 1) / P * nbytes


def _fsdp_table(raw: list[dict[str, Any]], cfg: dict[str, Any]) -> list[str]:
    """The FSDP section: per N, P and mode, the collectives that carry V or V̄ (sharded: the
    layer's gathers of its shard of V and the bias, padded to ⌈N/P⌉ rows, and the
    reduce-scatter of P such shards; replicated: the all_reduce of V̄), the others (the
    head's; the bias' all_reduce) apart, and the step time."""
    lines = [
        "| N | P | V | collectives of V, V̄ (payload bytes a process) | sent a process, ring "
        "| others (the head, the bias) | persistent V a process | step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in raw:
        if r["optimizer"] != "fsdp":
            continue
        N, P, vb = r["N"], r["P"], r["V_bytes"]
        own = 4 * -(-N // P) * (N + 1)
        ours = {("all_gather_single", own), ("reduce_scatter_single", P * own), ("all_reduce", vb)}
        big = [c for c in r["calls"] if tuple(c) in ours]
        small = [c for c in r["calls"] if tuple(c) not in ours]
        short = {"all_gather_single": "AG", "reduce_scatter_single": "RS", "all_reduce": "AR"}
        desc = ", ".join(f"{short.get(n, n)} {b:,}" for n, b in big)
        wire = sum(_wire(n, b, P) for n, b in big)
        other = sum(b for _, b in small)
        keep = -(-N // P) * N * 4 if r["mode"].startswith("sharded") else vb
        lines.append(
            f"| {N:,} | {P} | {r['mode']} | {desc} | {wire:,.0f} | {len(small)}: "
            f"{other:,} | {keep:,} | {H.fmt_t(r['step_s'])} |"
        )
    return lines


def _fsdp_md(machine: dict[str, Any], raw: list[dict[str, Any]], cfg: dict[str, Any]) -> str:
    return (
        f"## OrthogonalLinear under fully_shard (float32, {cfg['fsdp_rows']} rows a "
        "process)\n\n"
        + H.machine_line(machine, extra="1 thread per process")
        + "\n\n"
        + "\n".join(_fsdp_table(raw, cfg))
        + "\n\nOne training step of Sequential(OrthogonalLinear(N, N), Linear(N, 16)): "
        "forward, backward, SGD. sharded: V (and the bias, in the same collectives) sharded "
        "by rows by the layer's own fully_shard below the root's, gathered for the forward "
        "and again for the backward (AG), V̄ reduce-scattered (RS); 'no reshard': "
        "reshard_after_forward=False, one gather; replicated: the layer's parameters in the "
        "root's ignored_params, whole on every process, V̄ and the bias' averaged by "
        "all_reduce (AR) after the backward. Payload = the tensor handed over: an AG's own "
        "shard (FSDP pads the rows to a multiple of P), an RS's whole input, an AR's tensor; "
        "'sent, ring' = what a ring sends a process: (P − 1) shards for an AG, (P − 1)/P of "
        "the input for an RS, twice that for an AR. 'no FSDP': the same step on each "
        "process alone, no collectives. Times: median of the steps after the first.\n"
    )


def _muon_table(raw: list[dict[str, Any]], cfg: dict[str, Any]) -> list[str]:
    by = {(r["set"], r["P"]): r for r in raw if r["optimizer"] == "Muon"}
    lines = [
        f"| Muon, d = {cfg['muon_d']} | matrices | bytes / step / process, largest "
        "(P = 2, 4) | gathering U | ratios | all_to_alls | plain tensor | P = 1 | P = 2 "
        "| P = 4 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, shapes in muon_sets(cfg["muon_d"]):
        r = {P: by[(name, P)] for P in cfg["P"]}
        ours = [max(r[P]["bytes"]) for P in cfg["P"] if P > 1]
        gather = r[1]["gather"]
        count = sum(math.prod(s[:-2]) for s in shapes)
        lines.append(
            f"| {name} | {count} | {', '.join(f'{b:,}' for b in ours)} | {gather:,} "
            f"| {', '.join(f'{b / gather:.3f}' for b in ours)} | {r[max(cfg['P'])]['calls']} "
            f"| {H.fmt_t(r[1]['tensor_step_s'])} | "
            + " | ".join(H.fmt_t(r[P]["step_s"]) for P in cfg["P"])
            + " |"
        )
    return lines


def _group(P: int, cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the worker in P fresh processes; rank 0's rows."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(root))
    with tempfile.TemporaryDirectory() as tmp:
        init, out = os.path.join(tmp, "init"), os.path.join(tmp, "out.json")
        cmd = [sys.executable, "-m", "benchmarks.distributed", "--worker", json.dumps(cfg)]
        procs = [
            subprocess.Popen([*cmd, str(P), str(r), init, out], env=env, cwd=root) for r in range(P)
        ]
        codes = [p.wait() for p in procs]
        if any(codes):
            raise RuntimeError(f"a process of the group of {P} failed: exit codes {codes}")
        return json.loads(Path(out).read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        cfg = json.loads(argv[1])
        cfg["shapes"] = [tuple(s) for s in cfg["shapes"]]
        _worker(int(argv[2]), int(argv[3]), argv[4], argv[5], cfg)
        return 0
    quick = "small shapes, 3 steps: a smoke test (~30 s: the processes' starts)"
    parser = H.parser(__doc__, quick)
    parser.add_argument("--fsdp", action="store_true", help="OrthogonalLinear under "
                        "fully_shard only (writes distributed_fsdp.{json,md})")  # fmt: skip
    args = parser.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL, fsdp_only=args.fsdp)
    out_dir = H.out_dir(args)
    t0 = time.perf_counter()
    machine = H.machine_info()
    raw = []
    for P in [P for P in cfg["P"] if P > 1] if args.fsdp else cfg["P"]:
        raw += _group(P, cfg)
    if args.fsdp:
        md = _fsdp_md(machine, raw, cfg)
        print(md)
        res = {"machine": machine, "quick": args.quick, "config": cfg, "raw": raw,
               "wall_s": time.perf_counter() - t0}  # fmt: skip
        H.write(out_dir / "distributed_fsdp.json", res)
        H.write(out_dir / "distributed_fsdp.md", md)
        return 0
    by = {(r["optimizer"], r["N"], r["M"], r["P"]): r for r in raw if r["optimizer"] in OPTIMIZERS}
    lines = [
        "| optimizer | N × M | bytes / step / process (P = 2, 4) | gathering X | ratio "
        "| all_reduces | plain tensor | P = 1 | P = 2 | P = 4 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in OPTIMIZERS:
        for N, M in cfg["shapes"]:
            r = {P: by[(name, N, M, P)] for P in cfg["P"]}
            gather = N * M * 8
            ours = [r[P]["bytes"] for P in cfg["P"] if P > 1]
            lines.append(
                f"| {name} | {N:,} × {M} | {', '.join(f'{b:,}' for b in ours)} | {gather:,} "
                f"| {max(ours) / gather:.4f} | {r[max(cfg['P'])]['calls']} "
                f"| {H.fmt_t(r[1]['tensor_step_s'])} | "
                + " | ".join(H.fmt_t(r[P]["step_s"]) for P in cfg["P"])
                + " |"
            )
    md = (
        "# Row-sharded Stiefel steps on torch.distributed (gloo, CPU)\n\n"
        + H.machine_line(machine, extra="1 thread per process")
        + "\n\n"
        + "\n".join(lines)
        + "\n\nbytes = the payload each process hands to collectives in one step (counted): "
        "the fused M×M all_reduces of the step and the gradients' finiteness flag; gathering "
        "X brings N·M·8 bytes into every process. all_reduces = collectives per step. Times: "
        "median of the steps after the first; 'plain tensor' is the single-process step on an "
        "ordinary tensor.\n\n"
        + "\n".join(_muon_table(raw, cfg))
        + "\n\nMuon: each matrix (each matrix of a batch) is orthogonalised on one process, its "
        "owner (round-robin by decreasing A·B·min(A, B)); bytes = what each process hands to "
        "the step's two all_to_alls (its rows of U for the matrices others own, the others' "
        "rows of O for those it owns, bfloat16), the largest over the processes, counted; "
        "gathering U brings every matrix, Σ A·B·2 bytes, into every process. The ratio is "
        "about 2(P − 1)/P² where the owners' shares are even. Times as above, for the whole "
        "set of parameters.\n\n" + _fsdp_md(machine, raw, cfg)
    )
    print(md)
    res = {"machine": machine, "quick": args.quick, "config": cfg, "raw": raw,
           "wall_s": time.perf_counter() - t0}  # fmt: skip
    H.write(out_dir / "distributed.json", res)
    H.write(out_dir / "distributed.md", md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
