"""Training-step benchmark: forward + backward + SGD step of one orthogonal N×N layer on a
batch of B rows, householderla against torch's own orthogonal maps and geotorch (CPU).

Run ``python -m benchmarks.training_step`` (N ∈ {128, 256, 512, 1024}, B ∈ {32, 256, 1024},
float32 and float64; one thread; several minutes on 2 cores; writes
``build/bench/training_step.{json,md,png}``) or ``--quick`` (a smoke test, seconds);
``--out DIR`` elsewhere, ``--threads K`` for K threads.

One step is ``opt.zero_grad(); loss = ⟨G, layer(x)⟩; loss.backward(); opt.step()`` with
``torch.optim.SGD(lr=1e-3)`` — the forward (forming W or not), the product, the whole backward
to the trainable parameters and the parameter update. Methods, measured side by side in one run
(``benchmarks/_harness.py``: round-robin samples after a warm-up call each, medians; the ratio
to the fastest anchor is the median over the rounds of the per-round ratio,
``_harness.paired_ratio``, so a slow spell of the machine scales both and cancels):

* ``hl OrthogonalLinear``: ``hl.torch.OrthogonalLinear(N, N, bias=False)`` — lower-
  trapezoidal reflectors (the default ``structure``) applied to the batch by blocked compact
  WY when B ≤ N (never forming W); above, W formed by blocks of 128 applied to I (one
  block up to N = 192); forward and backward in one autograd node.
* ``hl OrthogonalLinear (dense V)``: the same layer with ``structure="dense"`` (every entry
  of V a parameter, as ``hl.torch.orthogonal`` has it).
* ``hl orthogonal (W formed)``: ``hl.torch.orthogonal(Linear(N, N), map="cwy")`` — W = I − U T Uᵀ
  formed at every step, then x Wᵀ.
* ``torch matrix_exp`` / ``torch cayley`` / ``torch householder``:
  ``torch.nn.utils.parametrizations.orthogonal`` with that ``orthogonal_map``.
* ``geotorch SO(n)``: ``geotorch.orthogonal`` (the matrix-exponential trivialization) when
  geotorch is importable (the ``bench`` extra installs it).

Issue 19's target: ``hl OrthogonalLinear`` faster than the fastest of the anchors (torch's
three maps and geotorch) wherever B ≤ N, and never slower than 1.2× elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.utils import parametrizations

import householderla.torch as hlt
from benchmarks import _harness as H

try:  # an anchor; a missing geotorch is said in the table
    import geotorch
except ImportError as exc:  # pragma: no cover - geotorch is a bench extra
    geotorch, GEOTORCH = None, f"not importable ({type(exc).__name__}: {exc})"
else:
    GEOTORCH = "measured"

FULL = {
    "N": [128, 256, 512, 1024],
    "B": [32, 256, 1024],
    "dtypes": ["float32", "float64"],
    "profile": H.Profile(min_total=0.4, max_total=3.0, min_rep=3, max_rep=10, rewarm_s=0.02),
}
QUICK = {
    "N": [32, 64],
    "B": [16],
    "dtypes": ["float32"],
    "profile": H.Profile(sample_s=0.0, min_total=0.0, max_total=0.2, min_rep=2, max_rep=2),
}
OURS = "hl OrthogonalLinear"
DENSE = "hl OrthogonalLinear (dense V)"
ANCHORS = ("torch matrix_exp", "torch cayley", "torch householder", "geotorch SO(n)")


def _orth_err(W: torch.Tensor) -> float:
    W = W.detach().double()
    return float(torch.linalg.matrix_norm(W.T @ W - torch.eye(W.shape[0], dtype=W.dtype)))


class _Step:
    """A layer, its input, output cotangent and optimizer; ``__call__`` runs one step."""

    def __init__(self, layer: torch.nn.Module, x: torch.Tensor, G: torch.Tensor) -> None:
        self.layer, self.x, self.G = layer, x, G
        self.opt = torch.optim.SGD(layer.parameters(), lr=1e-3)

    def __call__(self) -> None:
        self.opt.zero_grad()
        (self.layer(self.x) * self.G).sum().backward()
        self.opt.step()

    def weight(self) -> torch.Tensor:
        return self.layer.weight


def make_steps(N: int, B: int, dtype: torch.dtype, seed: int = 0) -> dict[str, _Step]:
    """name -> one training step of that method on the same x and G."""
    torch.manual_seed(seed)
    x = torch.randn(B, N, dtype=dtype)
    G = torch.randn(B, N, dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    layers: dict[str, Callable[[], torch.nn.Module]] = {
        OURS: lambda: hlt.OrthogonalLinear(N, N, bias=False, generator=gen, dtype=dtype),
        DENSE: lambda: hlt.OrthogonalLinear(
            N, N, bias=False, structure="dense", generator=gen, dtype=dtype
        ),
        "hl orthogonal (W formed)": lambda: hlt.orthogonal(
            torch.nn.Linear(N, N, bias=False, dtype=dtype), map="cwy", generator=gen
        ),
    }
    for name in ("matrix_exp", "cayley", "householder"):
        layers[f"torch {name}"] = lambda name=name: parametrizations.orthogonal(
            torch.nn.Linear(N, N, bias=False, dtype=dtype), orthogonal_map=name
        )
    if geotorch is not None:

        def geo() -> torch.nn.Module:
            layer = torch.nn.Linear(N, N, bias=False, dtype=dtype)
            geotorch.orthogonal(layer, "weight")
            return layer

        layers["geotorch SO(n)"] = geo
    return {name: _Step(make(), x, G) for name, make in layers.items()}


def run(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    cases = [(d, N, B) for d in cfg["dtypes"] for N in cfg["N"] for B in cfg["B"]]
    with H.Bench(cfg["profile"], len(cases) * (6 + (geotorch is not None)), "training step") as b:
        for dname, N, B in cases:
            steps = make_steps(N, B, getattr(torch, dname))
            t = b.side_by_side(f"{dname} N={N} B={B}", dict(steps.items()))
            anchors = [a for a in ANCHORS if a in t]
            best = min(anchors, key=lambda a: t[a]["median_s"])
            for name, step in steps.items():
                rows.append(
                    {
                        "dtype": dname,
                        "N": N,
                        "B": B,
                        "method": name,
                        "orth_err": _orth_err(step.weight()),
                        "fastest_anchor": best,
                        "vs_fastest_anchor": H.paired_ratio(t, name, best),
                        "medians_vs_fastest_anchor": t[name]["median_s"] / t[best]["median_s"],
                        **(
                            {"operator_path": step.layer.uses_operator(B)}
                            if name in (OURS, DENSE)
                            else {}
                        ),
                        **t[name],
                    }
                )
    return rows


def _met(r: dict[str, Any]) -> str:
    target = 1.0 if r["B"] <= r["N"] else 1.2
    return f"{'yes' if r['vs_fastest_anchor'] < target else 'NO'} (< {target:g}×)"


def report_md(res: dict[str, Any], threads: str) -> str:
    load = res["load"]
    frac = load.get("foreign_cpu_fraction")
    methods = list(dict.fromkeys(r["method"] for r in res["rows"]))
    lines = [
        "# Training step: forward + backward + SGD step of an orthogonal N×N layer (CPU)",
        "",
        f"**Machine:** {H.machine_line(res['machine'], extra=threads)}; other processes used "
        f"{'?' if frac is None else f'{100 * frac:.0f}%'} of the CPU; geotorch: {GEOTORCH}.",
        "",
        f"Median time per step (ms); `{OURS}` / the fastest anchor (torch's three maps and "
        "geotorch; the one with the lowest median) in the last columns: the median over the "
        "rounds of the per-round ratio (each round times every method back to back), target: "
        "< 1× where B ≤ N, < 1.2× elsewhere.",
    ]
    for dname in res["config"]["dtypes"]:
        lines += ["", f"## {dname}", ""]
        lines += ["| N | B | " + " | ".join(methods) + " | ours / fastest anchor | met |"]
        lines += ["|---|---|" + "---|" * (len(methods) + 2)]
        for N in res["config"]["N"]:
            for B in res["config"]["B"]:
                rs = {
                    r["method"]: r
                    for r in res["rows"]
                    if (r["dtype"], r["N"], r["B"]) == (dname, N, B)
                }
                ours = rs[OURS]
                cells = [f"{rs[m]['median_s'] * 1e3:.2f}" for m in methods]
                ratio = f"{ours['vs_fastest_anchor']:.2f}× ({ours['fastest_anchor']})"
                lines.append(f"| {N} | {B} | " + " | ".join(cells) + f" | {ratio} | {_met(ours)} |")
    lines += ["", "‖WᵀW − I‖_F of the trained weight after the timed steps (largest B):", ""]
    lines += ["| dtype | N | " + " | ".join(methods) + " |", "|---|---|" + "---|" * len(methods)]
    for dname in res["config"]["dtypes"]:
        for N in res["config"]["N"]:
            B = res["config"]["B"][-1]
            rs = {
                r["method"]: r for r in res["rows"] if (r["dtype"], r["N"], r["B"]) == (dname, N, B)
            }
            lines.append(
                f"| {dname} | {N} | "
                + " | ".join(f"{rs[m]['orth_err']:.1e}" for m in methods)
                + " |"
            )
    return "\n".join(lines) + "\n"


def plot(res: dict[str, Any], path: Any) -> None:
    plt = H.pyplot()
    Bs = res["config"]["B"]
    fig, axes = plt.subplots(1, len(Bs), figsize=(4.2 * len(Bs), 3.8), squeeze=False)
    dname = res["config"]["dtypes"][0]
    for ax, B in zip(axes[0], Bs, strict=True):
        for meth in dict.fromkeys(r["method"] for r in res["rows"]):
            rs = [r for r in res["rows"] if (r["method"], r["B"], r["dtype"]) == (meth, B, dname)]
            style = "o-" if meth.startswith("hl") else "s--"
            ax.loglog([r["N"] for r in rs], [r["median_s"] * 1e3 for r in rs], style, label=meth)
        ax.set(xlabel="N", ylabel="step (ms)", title=f"batch B = {B}, {dname}")
        Ns = res["config"]["N"]
        ax.set_xticks(Ns, labels=[str(n) for n in Ns])
        ax.minorticks_off()
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    H.save_figure(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = H.parser(__doc__, "small sizes, a smoke test (seconds)")
    ap.add_argument("--threads", type=int, default=1, help="threads (default 1)")
    args = ap.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = H.out_dir(args)
    t0 = time.perf_counter()
    threads = H.limit_threads(args.threads)
    res: dict[str, Any] = {"machine": H.machine_info(), "quick": args.quick, "config": cfg}
    monitor = H.LoadMonitor()
    res["geotorch"] = GEOTORCH
    res["threads"] = threads
    res["rows"] = run(cfg)
    res["load"] = monitor.result(res["machine"]["cores_available"])
    res["wall_s"] = time.perf_counter() - t0
    text = report_md(res, threads)
    print(text)
    print(f"wall time {res['wall_s']:.1f} s")
    H.write(out_dir / "training_step.json", res)
    H.write(out_dir / "training_step.md", text)
    plot(res, out_dir / "training_step.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
