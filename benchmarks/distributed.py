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

``python -m benchmarks.distributed [--quick] [--out DIR]``.
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
    for N, M in cfg["shapes"]:
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
    rows += _muon_rows(P, mesh, cfg)
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
    args = H.parser(__doc__, quick).parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = H.out_dir(args)
    t0 = time.perf_counter()
    machine = H.machine_info()
    raw = []
    for P in cfg["P"]:
        raw += _group(P, cfg)
    by = {(r["optimizer"], r["N"], r["M"], r["P"]): r for r in raw if r["optimizer"] != "Muon"}
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
        "set of parameters.\n"
    )
    print(md)
    res = {"machine": machine, "quick": args.quick, "config": cfg, "raw": raw,
           "wall_s": time.perf_counter() - t0}  # fmt: skip
    H.write(out_dir / "distributed.json", res)
    H.write(out_dir / "distributed.md", md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
