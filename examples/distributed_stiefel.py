"""Principal subspace of data whose features are split over processes: StiefelAdam on a DTensor
sharded by rows, every step's communication a few M×M matrices.

The data D (S samples × N features) is split by feature columns over P processes, and so are
the rows of the Stiefel matrix W (N × M, ``Shard(0)``, as ``fully_shard`` makes it). The loss
−‖DW‖²_F / S (the captured variance, negated) is computed by DTensor (D_k W_k summed over the
processes); ``householderla.torch.StiefelAdam`` takes the step on each process's rows, with
the M×M sums of ``docs/distributed.rst`` as its only collectives. At the end W spans the
leading principal subspace: the captured variance equals the sum of the M largest eigenvalues
of the covariance, and WᵀW = I to rounding.

Run::

    torchrun --nproc-per-node 2 examples/distributed_stiefel.py            # N = 4096, M = 8
    torchrun --nproc-per-node 2 examples/distributed_stiefel.py --quick    # N = 256, M = 4
    python examples/distributed_stiefel.py --quick                         # one process
"""

from __future__ import annotations

import os

import _gallery as G
import torch
import torch.distributed as dist
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

import householderla.torch as ht
from householderla._interop import torch_distributed as td

FULL = {"N": 4096, "M": 8, "S": 2048, "steps": 400}
QUICK = {"N": 256, "M": 4, "S": 512, "steps": 150}


def data(N: int, S: int, seed: int) -> torch.Tensor:
    """S samples of N features with a decaying spectrum (the same on every process)."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(0, -2, N, dtype=torch.float64)
    basis = torch.linalg.qr(torch.randn(N, N, generator=g, dtype=torch.float64))[0]
    return torch.randn(S, N, generator=g, dtype=torch.float64) * scales @ basis.T


def main(argv: list[str] | None = None) -> int:
    args = G.parser(__doc__).parse_args(argv)  # --quick: N = 256, 150 steps
    cfg = QUICK if args.quick else FULL
    G.set_threads(args.threads)
    if "RANK" not in os.environ:  # plain `python`: a group of one process
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))

    N, M, S = cfg["N"], cfg["M"], cfg["S"]
    D_full = data(N, S, args.seed)
    D = distribute_tensor(D_full, mesh, [Shard(1)], src_data_rank=None)  # feature columns
    W0 = torch.randn(
        N, M, generator=torch.Generator().manual_seed(args.seed + 1), dtype=torch.float64
    )
    W = torch.nn.Parameter(distribute_tensor(W0, mesh, [Shard(0)], src_data_rank=None))
    opt = ht.StiefelAdam([W], lr=0.02)

    sent = 0
    steps = G.progress(range(cfg["steps"]), rank == 0 and not args.no_progress, desc="steps")
    for step in steps:
        loss = -(D @ W).pow(2).sum() / S  # DTensor: Σ_k D_k W_k, one S×M all_reduce
        opt.zero_grad()
        loss.backward()
        td.reset_sent()
        opt.step()
        sent = td.reset_sent()["bytes"]
        if rank == 0 and step % 50 == 0:
            print(f"step {step:4d}  captured variance {-loss.item():.6f}")

    Wf = W.detach().full_tensor()
    captured = float(((D_full @ Wf) ** 2).sum() / S)
    best = float(torch.linalg.eigvalsh(D_full.T @ D_full / S)[-M:].sum())
    ortho = float(torch.linalg.norm(Wf.T @ Wf - torch.eye(M, dtype=torch.float64)))
    if rank == 0:
        print(f"captured {captured:.6f} of the best {best:.6f} (M = {M} leading eigenvalues)")
        print(f"‖WᵀW − I‖_F = {ortho:.1e}; {world} processes, N = {N} rows of W")
        print(f"bytes each process sent per optimizer step: {sent:,} (gathering W: {N * M * 8:,})")
        result = {"processes": world, **cfg, "captured": captured, "best": best}
        result.update(orthogonality=ortho, bytes_per_step=sent)
        G.save(G.out_dir(args), "distributed_stiefel", result)
    dist.destroy_process_group()
    ok = captured >= (1 - 1e-3) * best and ortho < 1e-12
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
