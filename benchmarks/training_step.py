"""Training-step benchmark: one forward + backward of an orthogonal N×N layer on a batch,
householderla's CWY against ``torch.nn.utils.parametrizations.orthogonal`` (CPU, float32).

Run ``python -m benchmarks.training_step`` (N ∈ {128, 256, 512, 1024}; a few minutes on 2
cores; writes ``benchmarks/results/training_step.{json,md,png}``) or
``python -m benchmarks.training_step --quick`` (N ∈ {128, 256}, < 40 s; writes to
``benchmarks/results/quick/``). ``--out DIR`` overrides the directory.

One step is ``loss = ⟨G, layer(x)⟩; loss.backward()`` for x of shape (B, N), B = 64, with the
gradient buffers cleared before each step: the parametrization's forward (forming W or not),
the layer's product and the whole backward to the trainable parameters. Rows, measured side
by side in one run (``benchmarks/_harness.py``: the methods of one N timed round-robin after
a warm-up call each, the median of an adaptive number of samples):

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

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.utils import parametrizations

import householderla as hl
import householderla.torch as hlt
from benchmarks import _harness as H

FULL = {"N": [128, 256, 512, 1024], "B": 64, "profile": H.Profile(min_total=0.5, max_rep=10)}
QUICK = {"N": [128, 256], "B": 64, "profile": H.Profile(min_total=0.2, max_rep=7)}


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


def run(cfg: dict[str, Any], progress: bool = True) -> list[dict[str, Any]]:
    rows = []
    names = list(make_steps(8, 2))
    total = len(cfg["N"]) * len(names) if progress else 0
    with H.Bench(cfg["profile"], total, "training step", unit="case") as b:
        for N in cfg["N"]:
            steps = make_steps(N, cfg["B"])
            if progress:
                t = b.side_by_side(f"N={N}", {k: step for k, (step, _) in steps.items()})
            else:
                t = H.measure({k: step for k, (step, _) in steps.items()}, cfg["profile"])
            for name, (_, weight) in steps.items():
                rows.append(
                    {
                        "N": N,
                        "B": cfg["B"],
                        "method": name,
                        "orth_err": _orth_err(weight()),
                        **t[name],
                    }
                )
    for r in rows:
        ref = next(
            x["median_s"] for x in rows if x["N"] == r["N"] and x["method"] == "hl CWY weight"
        )
        r["vs_hl_cwy_weight"] = r["median_s"] / ref
    return rows


def report_md(res: dict[str, Any]) -> str:
    m, load = res["machine"], res["load"]
    frac = load.get("foreign_cpu_fraction")
    methods = list(dict.fromkeys(r["method"] for r in res["rows"]))
    lines = [
        "# Training step: forward + backward of an orthogonal N×N layer (float32, CPU)",
        "",
        f"Machine: {H.machine_line(m)}; torch {m['torch_threads']} threads; load average "
        f"{load['loadavg_start']} at start, {load['loadavg_end']} at end, other processes used "
        f"{'?' if frac is None else f'{100 * frac:.0f}%'} of the CPU; batch B = "
        f"{res['config']['B']}; geotorch: {res['geotorch']}. Read the ratios.",
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


def plot(res: dict[str, Any], path: Any) -> None:
    plt = H.pyplot()
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
    H.save_figure(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = H.parser(__doc__, "small sizes, a smoke test (< 40 s)")
    ap.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    ap.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's)"
    )
    args = ap.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    cfg = QUICK if args.quick else FULL
    out_dir = H.out_dir(args)
    t0 = time.perf_counter()
    res: dict[str, Any] = {"machine": H.machine_info(), "quick": args.quick, "config": cfg}
    monitor = H.LoadMonitor()
    res["geotorch"] = geotorch_status()
    res["rows"] = run(cfg, progress=not args.no_progress)
    res["load"] = monitor.result(res["machine"]["cores_available"])
    res["wall_s"] = time.perf_counter() - t0
    text = report_md(res)
    print(text)
    print(f"wall time {res['wall_s']:.1f} s")
    H.write(out_dir / "training_step.json", res)
    H.write(out_dir / "training_step.md", text)
    plot(res, out_dir / "training_step.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
