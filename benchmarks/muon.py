"""Muon (issue 13, item 3): ``hl.torch.Muon`` side by side with ``torch.optim.Muon``.

1. Singular values of the orthogonalised update at equal steps (5) in bfloat16, on a
   Gaussian and a log-spaced-spectrum gradient (1024 × 4096; --quick 128 × 512): torch's
   own iteration against each schedule of ``hl.polar(..., schedule=)``, with the interval
   our certificate gives.
2. Time per optimizer step for one 1024 × 4096 parameter (--quick 128 × 512), float32
   parameter, bfloat16 orthogonalisation, measured round-robin in one process.
3. Training curves of a small MLP on scikit-learn's digits (64 → 64 → 64 → 10; synthetic
   data if scikit-learn is missing): AdamW; torch.optim.Muon (hidden matrices) + AdamW (the
   rest); ours likewise; and our StiefelAdam with the hidden square matrices on O(64).
   Full-batch-free minibatches of 64, the same seeds for every run; a plot of the training
   loss.

``python -m benchmarks.muon [--quick] [--out DIR]``; writes ``muon.{json,md,png}``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

import householderla as hl
from householderla._agnostic import polar_schedules as PS

from . import _harness as H

FULL = {"profile": H.Profile(sample_s=5e-3, min_total=0.5, max_total=3.0, min_rep=5),
        "shape": (1024, 4096), "epochs": 30}  # fmt: skip
QUICK = {"profile": H.Profile(sample_s=0.0, min_total=0.0, max_total=0.2, min_rep=3, max_rep=3),
         "shape": (128, 512), "epochs": 2}  # fmt: skip
SCHEDULES = ("muon", "polar_express", "certified", "newton_schulz")


def gradients(shape: tuple[int, int], rng: np.random.Generator) -> dict[str, torch.Tensor]:
    M, N = shape
    U = np.linalg.qr(rng.standard_normal((M, M)))[0]
    V = np.linalg.qr(rng.standard_normal((N, M)))[0]
    s = np.exp(rng.uniform(np.log(1e-3), 0.0, M))
    return {
        "gaussian": torch.from_numpy(rng.standard_normal(shape)).float(),
        "log-spaced spectrum": torch.from_numpy((U * s) @ V.T).float(),
    }


def sv_rows(b: H.Bench, shape: tuple[int, int]) -> list[H.Row]:
    from torch.optim import _muon

    rows = []
    for kind, G in gradients(shape, np.random.default_rng(0)).items():
        ratio = torch.linalg.svdvals(G.double()) / torch.linalg.norm(G.double())
        ref = _muon._zeropower_via_newtonschulz(G, PS.MUON_COEFFS, 5, 1e-7)
        s_ref = torch.linalg.svdvals(ref.double())
        for name in SCHEDULES:
            O, info = hl.polar(G.bfloat16(), schedule=name, steps=5, return_info=True)
            s = torch.linalg.svdvals(O.double())
            ell = info["certified_min_sv"]
            covered = "—" if ell is None else f"{float((ratio >= ell).float().mean()):.0%}"
            cert = f"≤ {info['upper']:.3g}" if ell is None else (
                f"[½, {info['upper']:.3g}] for σ ≥ {ell:.3g}‖G‖_F ({covered} of them)"
            )  # fmt: skip
            rows.append(
                H.Row(
                    f"σ(update) bfloat16 {kind} {shape[0]}×{shape[1]}, 5 steps, ours {name}",
                    "torch.optim.Muon (Jordan quintic)",
                    f"[{float(s_ref.min()):.3f}, {float(s_ref.max()):.3f}]",
                    f"[{float(s.min()):.3f}, {float(s.max()):.3f}]",
                    "—",
                    cert,
                    "",
                    data={"ours": [float(s.min()), float(s.max())], "torch": [
                        float(s_ref.min()), float(s_ref.max())], "info": info},
                )
            )  # fmt: skip
            b.step(f"sv {kind} {name}")
    return rows


def time_rows(b: H.Bench, shape: tuple[int, int]) -> list[H.Row]:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(1)).to(dev)

    def make(cls: Any, **kw: Any) -> Any:
        p = torch.nn.Parameter(torch.randn(*shape, device=dev))
        p.grad = g.clone()
        opt = cls([p], lr=1e-3, **kw)
        if dev == "cpu":
            return opt.step

        def step() -> None:
            opt.step()
            torch.cuda.synchronize()

        return step

    fns = {
        "torch": make(torch.optim.Muon),
        "ours muon": make(hl.torch.Muon, schedule="muon"),
        "ours certified": make(hl.torch.Muon),
    }
    t = b.side_by_side(f"step {shape}", fns)
    med = {k: v["median_s"] for k, v in t.items()}
    return [
        H.ratio_row(f"Muon step {shape[0]}×{shape[1]} float32 ({dev}), bfloat16 NS, {k}",
                    "torch.optim.Muon.step", med["torch"], med[k], 1.1, timings=t)
        for k in ("ours muon", "ours certified")
    ]  # fmt: skip


def data(quick: bool) -> tuple[torch.Tensor, torch.Tensor, str]:
    try:
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
        X, y, name = X / 16.0, y, "sklearn digits"
    except ImportError:  # pragma: no cover - scikit-learn is in the bench extra
        rng = np.random.default_rng(0)
        W = rng.standard_normal((64, 10))
        X = rng.standard_normal((1797, 64))
        y = np.argmax(X @ W + 0.5 * rng.standard_normal((1797, 10)), axis=1)
        name = "synthetic (scikit-learn missing)"
    n = 256 if quick else len(X)
    return torch.tensor(X[:n], dtype=torch.float32), torch.tensor(y[:n]), name


def mlp() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
        torch.nn.Linear(64, 10),
    )  # fmt: skip


def optimizers(model: torch.nn.Sequential, kind: str) -> list[Any]:
    hidden = [model[0].weight, model[2].weight]
    rest = [p for p in model.parameters() if all(p is not h for h in hidden)]
    if kind == "AdamW":
        return [torch.optim.AdamW(model.parameters(), lr=3e-3)]
    if kind == "torch.optim.Muon + AdamW":
        return [torch.optim.Muon(hidden, lr=0.02), torch.optim.AdamW(rest, lr=3e-3)]
    if kind == "hl.torch.Muon + AdamW":
        return [hl.torch.Muon(hidden, lr=0.02), torch.optim.AdamW(rest, lr=3e-3)]
    # StiefelAdam: the hidden square matrices on O(64), the rest Euclidean (same optimizer)
    return [hl.torch.StiefelAdam([{"params": hidden}, {"params": rest, "stiefel": False}], lr=3e-3)]


def curves(b: H.Bench, epochs: int, quick: bool) -> tuple[dict[str, list[float]], str]:
    X, y, name = data(quick)
    kinds = ("AdamW", "torch.optim.Muon + AdamW", "hl.torch.Muon + AdamW", "StiefelAdam")
    out = {}
    for kind in kinds:
        model = mlp()
        opts = optimizers(model, kind)
        gen = torch.Generator().manual_seed(0)
        losses = []
        for _ in range(epochs):
            perm = torch.randperm(len(X), generator=gen)
            for i in range(0, len(X), 64):
                idx = perm[i : i + 64]
                loss = torch.nn.functional.cross_entropy(model(X[idx]), y[idx])
                for o in opts:
                    o.zero_grad()
                loss.backward()
                for o in opts:
                    o.step()
                losses.append(float(loss.detach()))
        out[kind] = losses
        b.step(f"train {kind}")
    return out, name


def plot(curves_: dict[str, list[float]], name: str, path: Any, mline: str) -> None:
    plt = H.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for kind, losses in curves_.items():
        w = 10
        sm = np.convolve(losses, np.ones(w) / w, mode="valid") if len(losses) > w else losses
        ax.plot(sm, label=kind)
    ax.set_yscale("log")
    ax.set_xlabel("step (minibatch of 64)")
    ax.set_ylabel("training loss (moving average of 10)")
    ax.set_title(f"MLP 64-64-64-10 on {name}")
    ax.legend()
    H.save_figure(fig, path, mline)


def main(argv: list[str] | None = None) -> int:
    args = H.parser(__doc__, "tiny sizes: a smoke test (seconds)").parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = H.out_dir(args)
    t0 = time.perf_counter()
    threads = H.limit_threads(1)
    machine = H.machine_info()
    monitor = H.LoadMonitor()
    with H.Bench(cfg["profile"], 2 * len(SCHEDULES) + 3 + 4, "muon") as b:
        table = sv_rows(b, cfg["shape"]) + time_rows(b, cfg["shape"])
        curves_, name = curves(b, cfg["epochs"], args.quick)
    load = monitor.result(machine["cores_available"])
    mline = H.machine_line(machine, extra=threads)
    columns = [("anchor value" if h == "anchor time" else h, k) for h, k in H.RATIO_COLUMNS]
    md = H.table_markdown(table, mline, args.quick, columns)
    final = {k: float(np.mean(v[-20:])) for k, v in curves_.items()}
    md += "\nσ rows: anchor/ours = [min, max] singular value of the orthogonalised update; "
    md += "target = our certificate (rounding model, docs/theory/lowprec.rst).\n"
    md += f"\nTraining ({name}, {cfg['epochs']} epochs): final loss (mean of the last 20 steps) "
    md += ", ".join(f"{k} {v:.4f}" for k, v in final.items()) + ".\n"
    print(md)
    res = {"machine": machine, "threads": threads, "quick": args.quick, "rows": table,
           "curves": curves_, "final_loss": final, "data": name, "load": load,
           "wall_s": time.perf_counter() - t0}  # fmt: skip
    H.write(out_dir / "muon.json", res)
    H.write(out_dir / "muon.md", md)
    plot(curves_, name, out_dir / "muon_training.png", mline)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
