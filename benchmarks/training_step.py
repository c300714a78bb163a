"""Training-step benchmark: one forward + backward of an orthogonal N×N layer on a batch,
householderla's CWY against ``torch.nn.utils.parametrizations.orthogonal`` (CPU, float32).

Run ``python -m benchmarks.training_step`` (N ∈ {128, 256, 512, 1024}; a few minutes on 2
cores; writes ``benchmarks/results/training_step.{json,md,png}``) or
``python -m benchmarks.training_step --quick`` (N ∈ {128, 256}, < 40 s; writes to
``benchmarks/results/quick/``). ``--out DIR`` overrides the directory.

One step is ``loss = ⟨G, layer(x)⟩; loss.backward()`` for x of shape (B, N), B = 64, with the
gradient buffers cleared before each step: the parametrization's forward (forming W or not),
the layer's product and the whole backward to the trainable parameters. Rows, measured side
by side in one run (warm-up call, then the median of an adaptive number of repeats):

* ``hl CWY weight``: ``hl.torch.orthogonal(Linear(N, N), map="cwy")`` — W = I − U T Uᵀ
  formed (2·N²·L + N·L² flops, L = N), then x Wᵀ; backward by the explicit CWY VJPs.
* ``hl CWY operator``: the same reflectors applied without forming W, ``hl.cwy(V) @ xᵀ``
  (4·N·L·B + L²·B flops) — what CWY is for when B < N.
* ``torch matrix_exp`` / ``torch cayley`` / ``torch householder``: torch's own orthogonal
  parametrization with that ``orthogonal_map`` (default trivialization).
* ``geotorch SO(n)`` when geotorch is importable (it is not installed here).

Timings on a shared machine are noisy: the load average at start and end is recorded, and
the ratios (measured in one run, interleaved per N) are what to read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.nn.utils import parametrizations  # noqa: E402

import householderla as hl  # noqa: E402
import householderla.torch as hlt  # noqa: E402
from benchmarks.retractions import machine_info as _machine_info  # noqa: E402
from benchmarks.retractions import timeit  # noqa: E402

FULL = {"N": [128, 256, 512, 1024], "B": 64, "min_total": 0.5, "max_rep": 10}
QUICK = {"N": [128, 256], "B": 64, "min_total": 0.2, "max_rep": 7}


def _orth_err(W: torch.Tensor) -> float:
    W = W.detach().double()
    return float(torch.linalg.matrix_norm(W.T @ W - torch.eye(W.shape[0], dtype=W.dtype)))


class _Step:
    """A layer, its input and output cotangent; ``__call__`` runs one forward + backward."""

    def __init__(self, forward: Callable[[], torch.Tensor], params: list[Any], G: Any) -> None:
        self.forward, self.params, self.G = forward, params, G

    def __call__(self) -> None:
        for p in self.params:
            p.grad = None
        y = self.forward()
        (y * self.G).sum().backward()


def make_steps(N: int, B: int, seed: int = 0) -> dict[str, tuple[_Step, Callable[[], Any]]]:
    """name -> (one training step, the current weight as a tensor)."""
    torch.manual_seed(seed)
    x = torch.randn(B, N)
    G = torch.randn(B, N)
    out: dict[str, tuple[_Step, Callable[[], Any]]] = {}

    lin = torch.nn.Linear(N, N, bias=False)
    hlt.orthogonal(lin, map="cwy")
    out["hl CWY weight"] = (_Step(lambda: lin(x), list(lin.parameters()), G), lambda: lin.weight)

    V = torch.nn.Parameter(lin.parametrizations.weight.original.detach().clone())
    out["hl CWY operator"] = (
        _Step(lambda: (hl.cwy(V) @ x.T).T, [V], G),
        lambda: hl.cwy(V).matrix(),
    )

    for name in ("matrix_exp", "cayley", "householder"):
        layer = torch.nn.Linear(N, N, bias=False)
        parametrizations.orthogonal(layer, orthogonal_map=name)
        out[f"torch {name}"] = (
            _Step(lambda layer=layer: layer(x), list(layer.parameters()), G),
            lambda layer=layer: layer.weight,
        )
    try:
        import geotorch  # type: ignore[import-not-found]
    except ImportError:
        pass
    else:  # pragma: no cover - geotorch is not installed here
        layer = torch.nn.Linear(N, N, bias=False)
        geotorch.orthogonal(layer, "weight")
        out["geotorch SO(n)"] = (
            _Step(lambda: layer(x), list(layer.parameters()), G),
            lambda: layer.weight,
        )
    return out


def geotorch_status() -> str:
    try:
        import geotorch  # type: ignore[import-not-found]  # noqa: F401
    except ImportError as exc:
        return f"not importable ({exc}); not installed on purpose"
    return "measured"  # pragma: no cover


def machine_info() -> dict[str, Any]:
    """The shared machine record plus torch's version and thread count."""
    info = _machine_info()
    info.update(torch=torch.__version__, torch_threads=torch.get_num_threads())
    return info


def run(cfg: dict[str, Any], progress: bool = True) -> list[dict[str, Any]]:
    rows = []
    jobs = [(N, name) for N in cfg["N"] for name in make_steps(8, 2)]
    bar: Any = jobs
    if progress:
        from tqdm import tqdm

        bar = tqdm(jobs, desc="training step", unit="case")
    steps: dict[str, Any] = {}
    current = None
    for N, name in bar:
        if N != current:
            steps, current = make_steps(N, cfg["B"]), N
        if progress:
            bar.set_postfix(N=N, method=name)
        step, weight = steps[name]
        t = timeit(step, cfg["min_total"], cfg["max_rep"])
        rows.append({"N": N, "B": cfg["B"], "method": name, "orth_err": _orth_err(weight()), **t})
    for r in rows:
        ref = next(
            x["median_s"] for x in rows if x["N"] == r["N"] and x["method"] == "hl CWY weight"
        )
        r["vs_hl_cwy_weight"] = r["median_s"] / ref
    return rows


def report_md(res: dict[str, Any]) -> str:
    m = res["machine"]
    methods = list(dict.fromkeys(r["method"] for r in res["rows"]))
    lines = [
        "# Training step: forward + backward of an orthogonal N×N layer (float32, CPU)",
        "",
        f"Machine: {m['cpu_model']}, {m['cpu_count']} cores, torch {m['torch']} "
        f"({m['torch_threads']} threads), load average {m['loadavg_at_start']} at start, "
        f"{res['loadavg_at_end']} at end; batch B = {res['config']['B']}; "
        f"geotorch: {res['geotorch']}. Other jobs shared the CPU: read the ratios.",
        "",
        "Median time per step (ms); in brackets, time / `hl CWY weight`.",
        "",
        "| N | " + " | ".join(methods) + " |",
        "|---|" + "---|" * len(methods),
    ]
    for N in res["config"]["N"]:
        cells = []
        for meth in methods:
            r = next(x for x in res["rows"] if x["N"] == N and x["method"] == meth)
            cells.append(f"{r['median_s'] * 1e3:.2f} ({r['vs_hl_cwy_weight']:.2f}×)")
        lines.append(f"| {N} | " + " | ".join(cells) + " |")
    lines += ["", "‖WᵀW − I‖_F of the weight each method trains (float32):", ""]
    lines += ["| N | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for N in res["config"]["N"]:
        cells = [
            f"{next(x for x in res['rows'] if x['N'] == N and x['method'] == m)['orth_err']:.1e}"
            for m in methods
        ]
        lines.append(f"| {N} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for meth in dict.fromkeys(r["method"] for r in res["rows"]):
        rs = [r for r in res["rows"] if r["method"] == meth]
        ax.loglog([r["N"] for r in rs], [r["median_s"] * 1e3 for r in rs], "o-", label=meth)
    ax.set(
        xlabel="N",
        ylabel="forward + backward (ms)",
        title=f"orthogonal N×N layer, batch {res['config']['B']}, float32, CPU",
    )
    Ns = res["config"]["N"]
    ax.set_xticks(Ns, labels=[str(n) for n in Ns])
    ax.minorticks_off()
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, a smoke test (< 40 s)")
    ap.add_argument("--out", type=Path, default=None, help="output directory")
    ap.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    ap.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's)"
    )
    args = ap.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    cfg = QUICK if args.quick else FULL
    out_dir = args.out or ROOT / "benchmarks" / "results" / ("quick" if args.quick else "")
    t0 = time.perf_counter()
    res: dict[str, Any] = {"machine": machine_info(), "quick": args.quick, "config": cfg}
    res["geotorch"] = geotorch_status()
    res["rows"] = run(cfg, progress=not args.no_progress)
    res["loadavg_at_end"] = os.getloadavg()
    res["wall_s"] = time.perf_counter() - t0
    text = report_md(res)
    print(text)
    print(f"wall time {res['wall_s']:.1f} s")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "training_step.json").write_text(json.dumps(res, indent=1, default=str))
    (out_dir / "training_step.md").write_text(text)
    plot(res, out_dir / "training_step.png")
    for name in ("json", "md", "png"):
        path = out_dir / f"training_step.{name}"
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
