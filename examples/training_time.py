"""Time per training step of one orthogonal N × N layer: CWY and T-CWY against torch's
matrix exponential, Cayley and Householder maps and geotorch.

In the spirit of Figure 1c of Likhosherstov, Davis, Choromanski & Weller (CWY
parametrization, AISTATS 2021), which timed forming the orthogonal matrix on a GPU and found CWY
one to three orders of magnitude faster than the matrix exponential and the Cayley map. Here one
step is what training costs: forward of a layer ``y = x Wᵀ`` on a batch of B rows, backward to
the trainable parameters and an SGD update,

    opt.zero_grad(); (layer(x) * G).sum().backward(); opt.step()

for every way of making W orthogonal:

* ``CWY (hl)``: ``hl.torch.orthogonal(Linear(N, N), map="cwy")``, W = H(v₁)…H(v_N) formed as
  I − U S⁻¹ Uᵀ (Theorem 2 of the paper), backward by the explicit VJP;
* ``T-CWY (hl)``: ``map="tcwy"``, the truncated map γ_{N,N} (Theorem 3) — same image, another
  way of computing it;
* ``CWY operator (hl)``: ``hl.torch.OrthogonalLinear(N, N)``, which applies the reflectors to a
  batch of B ≤ N rows without forming W (blocked compact WY);
* ``torch matrix_exp`` / ``torch cayley`` / ``torch householder``:
  ``torch.nn.utils.parametrizations.orthogonal`` with that ``orthogonal_map``;
* ``geotorch``: ``geotorch.orthogonal`` (matrix-exponential trivialization), if installed.

Every method sees the same x and G; each is warmed up once, then timed step by step in
round-robin order until ``--budget`` seconds per size are spent; the median is reported.
Timings on a shared machine are noisy: the ratios within one run are what to read.

Run::

    python examples/training_time.py            # N = 64 … 1024, a few minutes
    python examples/training_time.py --quick    # N = 32, 64, 128: seconds
    python examples/training_time.py --device cuda   # on a GPU, where there is one

Writes ``training_time.json`` and ``training_time.png`` (``benchmarks/results/gallery/``, or
``docs/_build/gallery/`` for ``--quick``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import _gallery as G
import torch
from torch.nn.utils import parametrizations

import householderla.torch as hlt

FULL = {"N": [64, 128, 256, 512, 1024], "B": 64, "budget": 6.0}
QUICK = {"N": [32, 64, 128], "B": 32, "budget": 0.6}
REFERENCE = "CWY (hl)"


def _geotorch() -> Any:
    try:
        import geotorch
    except ImportError:  # the bench extra installs it
        return None
    return geotorch


def layers(N: int, dtype: torch.dtype, device: str, seed: int) -> dict[str, torch.nn.Module]:
    """name -> an N × N orthogonal layer (no bias) of every method, all seeded; built on the CPU
    (one seeded CPU generator for every initialisation), then moved to ``device``."""
    gen = torch.Generator().manual_seed(seed)

    def linear() -> torch.nn.Linear:
        return torch.nn.Linear(N, N, bias=False, dtype=dtype)

    out: dict[str, Callable[[], torch.nn.Module]] = {
        "CWY (hl)": lambda: hlt.orthogonal(linear(), map="cwy", generator=gen),
        "T-CWY (hl)": lambda: hlt.orthogonal(linear(), map="tcwy", generator=gen),
        "CWY operator (hl)": lambda: hlt.OrthogonalLinear(
            N, N, bias=False, generator=gen, dtype=dtype
        ),
    }
    for name in ("matrix_exp", "cayley", "householder"):
        out[f"torch {name}"] = lambda name=name: parametrizations.orthogonal(
            linear(), orthogonal_map=name
        )
    geotorch = _geotorch()
    if geotorch is not None:

        def geo() -> torch.nn.Module:
            layer = linear()
            geotorch.orthogonal(layer, "weight")
            return layer

        out["geotorch"] = geo
    torch.manual_seed(seed)
    return {name: make().to(device) for name, make in out.items()}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_steps(
    mods: dict[str, torch.nn.Module], x: torch.Tensor, Gy: torch.Tensor, budget: float
) -> dict[str, list[float]]:
    """Seconds per training step of each layer, round-robin until ``budget`` s are spent."""
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in mods.items()}
    device = str(x.device)

    def step(name: str) -> float:
        _sync(device)
        t0 = time.perf_counter()
        opts[name].zero_grad()
        (mods[name](x) * Gy).sum().backward()
        opts[name].step()
        _sync(device)
        return time.perf_counter() - t0

    for name in mods:  # warm-up: first calls allocate, compile kernels, fill caches
        step(name)
    times: dict[str, list[float]] = {k: [] for k in mods}
    start = time.perf_counter()
    while True:
        for name in mods:
            times[name].append(step(name))
        spent = time.perf_counter() - start
        if (spent > budget and min(map(len, times.values())) >= 3) or min(
            map(len, times.values())
        ) >= 50:
            return times


def orth_error(layer: torch.nn.Module) -> float:
    with torch.no_grad():
        W = layer.weight.double()
        return float(torch.linalg.matrix_norm(W.T @ W - torch.eye(W.shape[0], device=W.device)))


def run(
    sizes: list[int],
    batch: int,
    budget: float,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Median seconds per step and ‖WᵀW − I‖_F after the timed steps, per method and N."""
    res: dict[str, Any] = {"N": sizes, "B": batch, "median_s": {}, "orth_err": {}, "steps": {}}
    for N in G.progress(sizes, progress, desc="training step vs N", unit="size"):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(batch, N, dtype=dtype, generator=gen).to(device)
        Gy = torch.randn(batch, N, dtype=dtype, generator=gen).to(device)
        mods = layers(N, dtype, device, seed)
        times = time_steps(mods, x, Gy, budget)
        for name, t in times.items():
            res["median_s"].setdefault(name, []).append(statistics.median(t))
            res["steps"].setdefault(name, []).append(len(t))
            res["orth_err"].setdefault(name, []).append(orth_error(mods[name]))
    return res


def plot(res: dict[str, Any], title: str) -> Any:
    plt = G.pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ref = res["median_s"][REFERENCE]
    for name, t in res["median_s"].items():
        style = "-o" if "(hl)" in name else "--s"
        ax.loglog(res["N"], [1e3 * s for s in t], style, ms=4, label=name)
        ax2.semilogx(res["N"], [s / r for s, r in zip(t, ref, strict=True)], style, ms=4)
    ax.set(xlabel="N", ylabel="ms per training step", title=title)
    ax.legend(fontsize=7)
    ax2.set_yscale("log")
    ax2.axhline(1.0, color="k", lw=0.8)
    ax2.set(xlabel="N", ylabel=f"time / {REFERENCE}", title="ratio within the run")
    for a in (ax, ax2):
        a.set_xticks(res["N"], [str(n) for n in res["N"]])
        a.minorticks_off()
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    p = G.parser(__doc__)
    p.add_argument("--N", type=int, nargs="+", default=None, help="layer sizes")
    p.add_argument("--batch", type=int, default=None, help="rows B of x")
    p.add_argument("--budget", type=float, default=None, help="seconds of timing per size")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    args = p.parse_args(argv)

    def replot(res: dict[str, Any]) -> Any:
        return plot(res, f"one orthogonal layer, B = {res['B']}, {res['dtype']}, {res['device']}")

    if G.replot(args, "training_time", replot):
        return 0
    cfg = QUICK if args.quick else FULL
    G.set_threads(args.threads)
    G.seed_everything(args.seed)
    info = G.machine()
    print("machine:", G.machine_line(info))
    sizes = args.N or cfg["N"]
    batch = args.batch or cfg["B"]
    t0 = time.perf_counter()
    res = run(
        sizes,
        batch,
        args.budget or cfg["budget"],
        getattr(torch, args.dtype),
        args.device,
        args.seed,
        not args.no_progress,
    )
    res.update(machine=info, dtype=args.dtype, device=args.device, wall_s=time.perf_counter() - t0)
    names = list(res["median_s"])
    print(f"ms per step (B = {batch}, {args.dtype}, {args.device}); in brackets / {REFERENCE}:")
    print("N".rjust(6) + "".join(n.rjust(20) for n in names))
    for i, N in enumerate(sizes):
        ref = res["median_s"][REFERENCE][i]
        cells = [
            f"{1e3 * res['median_s'][n][i]:.2f} ({res['median_s'][n][i] / ref:.2f}x)" for n in names
        ]
        print(f"{N:6d}" + "".join(c.rjust(20) for c in cells))
    title = f"one orthogonal layer, B = {batch}, {args.dtype}, {args.device}"
    G.save(G.out_dir(args), "training_time", res, plot(res, title))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
