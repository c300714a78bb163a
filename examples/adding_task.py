"""The adding task: orthogonal RNNs (oRNN map, CWY, T-CWY, SVD-Householder) against torch's
orthogonal parametrizations, an LSTM and an unconstrained RNN.

The task of Mhammedi et al. (ICML 2017, §5.2, after Arjovsky et al. 2016): the input is a
sequence of T pairs; the first entries are uniform on [0, 1], the second are 0 except for two
1s, one in each half of the sequence. The target is the sum of the two marked first entries.
Predicting the mean, 1, whatever the input costs a mean squared error of Var(u₁ + u₂) = 1/6 ≈
0.167: the baseline. Beating it needs the two marked values carried to the last step, across up
to T steps. Mhammedi et al. train an oRNN with n = 128, m = 16 reflections, batches of 50 fresh
sequences, T = 400 and 800.

Here the cells are those of ``orthogonal_rnns.py`` (modReLU, W formed once per sequence,
RMSprop at 1e-3 and 1e-4 for W), N hidden units, batches of 50 fresh sequences, the same
sequences for every cell. Measured per cell: the MSE of every step against the training wall
time, the MSE of a fixed test set of 1000 sequences at the end, and the gradient-norm profile
‖∂L/∂h_t‖ over the time steps of a test batch after training.

Run::

    python examples/adding_task.py           # T = 50, N = 64, 2500 steps
    python examples/adding_task.py --quick   # T = 50, N = 32, 150 steps

Writes ``adding_task.{json,png}``.
"""

from __future__ import annotations

import time
from typing import Any

import _gallery as G
import numpy as np
import orthogonal_rnns as R
import torch

FULL = {"T": 50, "hidden": 64, "steps": 2500}
#: the full run's cells: T-CWY is left out (for square W it is the CWY map, the same function;
#: sequential_digits.py times both)
FULL_MAPS = [m for m in R.MAPS if m != "tcwy"]
QUICK = {"T": 50, "hidden": 32, "steps": 150}
BATCH = 50
BASELINE = 1.0 / 6.0  # MSE of always answering 1 = E[u1 + u2]


def adding_batch(T: int, batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (batch, T, 2) and targets (batch, 1)."""
    values = torch.rand(batch, T, generator=gen)
    first = torch.randint(0, T // 2, (batch,), generator=gen)
    second = torch.randint(T // 2, T, (batch,), generator=gen)
    marks = torch.zeros(batch, T)
    rows = torch.arange(batch)
    marks[rows, first] = 1.0
    marks[rows, second] = 1.0
    y = (values[rows, first] + values[rows, second]).unsqueeze(1)
    return torch.stack([values, marks], dim=2), y


def train(
    map: str, T: int, hidden: int, steps: int, seed: int = 0, progress: bool = False
) -> dict[str, Any]:
    """One cell: the MSE and cumulative training seconds of every step, the test MSE, the
    gradient profile before and after training, ‖WᵀW − I‖_F at the end."""
    model = R.RecurrentNet(2, hidden, 1, map, seed)
    opt = R.optimizer(model)
    mse = torch.nn.MSELoss()
    data = torch.Generator().manual_seed(seed + 1)  # the same sequences for every cell
    xte, yte = adding_batch(T, 1000, torch.Generator().manual_seed(seed + 2))

    def probe_loss(out: torch.Tensor) -> torch.Tensor:
        return mse(out, yte[:128])

    hist: dict[str, Any] = {"loss": [], "time_s": []}
    hist["grad_profile_init"] = R.gradient_profile(model, xte[:128], probe_loss)
    spent = 0.0
    for _ in G.progress(range(steps), progress, desc=R.LABELS[map], unit="step", leave=False):
        x, y = adding_batch(T, BATCH, data)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = mse(model(x), y)
        loss.backward()
        opt.step()
        spent += time.perf_counter() - t0
        hist["loss"].append(float(loss.detach()))
        hist["time_s"].append(spent)
    with torch.no_grad():
        hist["test_mse"] = float(mse(model(xte), yte))
    hist["grad_profile"] = R.gradient_profile(model, xte[:128], probe_loss)
    hist["orth_err"] = R.orth_error(model)
    return hist


def run(
    T: int,
    hidden: int,
    steps: int,
    maps: list[str] | None = None,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    maps = maps or list(R.MAPS)
    res: dict[str, Any] = {"T": T, "hidden": hidden, "steps": steps, "batch": BATCH}
    res["baseline"], res["runs"] = BASELINE, {}
    for m in G.progress(maps, progress, desc=f"adding task T={T}", unit="cell"):
        res["runs"][m] = train(m, T, hidden, steps, seed)
    return res


def smooth(x: list[float], k: int) -> np.ndarray:
    """Running mean over k steps (k ≥ 1)."""
    c = np.cumsum(np.insert(np.asarray(x, dtype=float), 0, 0.0))
    return (c[k:] - c[:-k]) / k


def plot(res: dict[str, Any]) -> Any:
    plt = G.pyplot()
    fig, (ax, ax2, ax3) = plt.subplots(1, 3, figsize=(13, 3.9))
    k = max(1, res["steps"] // 40)
    for i, (m, h) in enumerate(res["runs"].items()):
        style = "-" if m in ("ornn", "cwy", "tcwy", "svd") else "--"
        kw = {"color": f"C{i}", "label": R.LABELS[m]}
        s = smooth(h["loss"], k)
        ax.plot(np.arange(k, len(h["loss"]) + 1), s, style, **kw)
        ax2.plot(np.array(h["time_s"][k - 1 :]), s, style, **kw)
        prof = np.array(h["grad_profile"])
        ax3.semilogy(np.arange(1, len(prof) + 1), prof / prof[-1], style, **kw)
    for a in (ax, ax2):
        a.axhline(res["baseline"], color="k", ls=":", lw=1)
        # a diverging cell (the unconstrained RNN's loss can jump by orders of magnitude)
        # leaves the top of the plot instead of squashing the rest
        a.set(ylabel=f"MSE (running mean of {k} steps)", yscale="log", ylim=(0.01, 1.0))
    ax.set(xlabel="training step")
    ax.set_title(f"adding task, T = {res['T']}, N = {res['hidden']}; baseline 0.167", fontsize=10)
    ax2.set(xlabel="training time (s)", title="MSE vs wall time")
    ax3.set(xlabel="time step t", ylabel="‖∂L/∂h_t‖ / ‖∂L/∂h_T‖")
    ax3.set_title("gradient reaching step t, after training", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    p = G.parser(__doc__)
    p.add_argument("--T", type=int, default=None, help="sequence length")
    p.add_argument("--hidden", type=int, default=None, help="hidden units N")
    p.add_argument("--steps", type=int, default=None, help="training steps (batches)")
    p.add_argument("--maps", nargs="+", default=None, choices=R.MAPS)
    args = p.parse_args(argv)
    if G.replot(args, "adding_task", plot):
        return 0
    cfg = QUICK if args.quick else FULL
    G.set_threads(args.threads)
    G.seed_everything(args.seed)
    info = G.machine()
    print("machine:", G.machine_line(info))
    t0 = time.perf_counter()
    res = run(
        args.T or cfg["T"],
        args.hidden or cfg["hidden"],
        args.steps or cfg["steps"],
        args.maps or (None if args.quick else FULL_MAPS),
        args.seed,
        not args.no_progress,
    )
    res.update(machine=info, wall_s=time.perf_counter() - t0)
    print(f"T = {res['T']}, N = {res['hidden']}, {res['steps']} steps; baseline MSE 0.167:")
    for m, h in res["runs"].items():
        prof = h["grad_profile"]
        print(
            f"  {R.LABELS[m]:22s} test MSE {h['test_mse']:.4f}  training {h['time_s'][-1]:7.1f} s"
            f"  ‖∂L/∂h_1‖/‖∂L/∂h_T‖ {prof[0] / prof[-1]:9.2e}  ‖WᵀW − I‖_F {h['orth_err']:.1e}"
        )
    print(f"{res['wall_s']:.1f} s")
    G.save(G.out_dir(args), "adding_task", res, plot(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
