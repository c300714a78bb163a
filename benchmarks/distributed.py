"""Row-sharded Stiefel optimizers on torch.distributed: bytes per step and step time at 1, 2, 4
processes (issue 43).

X (N, M) is a DTensor sharded by rows (``Shard(0)``) over P gloo processes on the CPU; each
step of ``StiefelSGD`` / ``StiefelAdam`` reduces only M×M matrices. Per shape and optimizer the
table reports the bytes each process hands to collectives per step, counted by
``householderla._interop.torch_distributed.SENT`` (the payload: a ring ``all_reduce`` puts
about twice its payload on the wire), against gathering X (N·M·8 bytes into every process),
and the median step time at P = 1, 2 and 4 (each P a fresh group of P processes, one thread
each), with the plain single-process step (a tensor, no DTensor) as the anchor. On a machine
with fewer cores than 4 the 4-process times include oversubscription.

``python -m benchmarks.distributed [--quick] [--out DIR]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import _harness as H

FULL = {"shapes": [(4096, 32), (16384, 64), (65536, 64)], "steps": 7, "P": (1, 2, 4)}
QUICK = {"shapes": [(512, 8), (2048, 16)], "steps": 3, "P": (1, 2, 4)}
OPTIMIZERS = {"StiefelSGD": {"lr": 0.1}, "StiefelAdam": {"lr": 0.01}}


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
    if rank == 0:
        Path(out).write_text(json.dumps(rows), encoding="utf-8")
    dist.barrier()
    dist.destroy_process_group()


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
    by = {(r["optimizer"], r["N"], r["M"], r["P"]): r for r in raw}
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
        "ordinary tensor.\n"
    )
    print(md)
    res = {"machine": machine, "quick": args.quick, "config": cfg, "raw": raw,
           "wall_s": time.perf_counter() - t0}  # fmt: skip
    H.write(out_dir / "distributed.json", res)
    H.write(out_dir / "distributed.md", md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
