"""Pixel-by-pixel digits: orthogonal RNNs (oRNN map, CWY, T-CWY, SVD-Householder) against
torch's matrix_exp / Cayley / Householder parametrizations, an LSTM and an unconstrained RNN.

The pixel-by-pixel MNIST task of Mhammedi et al. (ICML 2017, §5.3) and Likhosherstov et al.
(AISTATS 2021, §4.1) reads an image one pixel per time step and classifies it from the last
hidden state, so the gradient must travel back over every step. Here the images are
scikit-learn's 8 × 8 digits (1797 images, shipped with the package): sequences of T = 64 pixels,
a 75/25 split stratified by class. The cells are those of ``orthogonal_rnns.py`` (modReLU, W
formed once per sequence, RMSprop at 1e-3 and 1e-4 for W), all with N hidden units, all from
the same seed; batches of 32.

Measured per cell: test accuracy after every epoch against the training wall time, and the
gradient-norm profile ‖∂L/∂h_t‖ over the time steps t of a batch after training: flat for the
orthogonal cells (‖W h‖ = ‖h‖, and modReLU is 1-Lipschitz, so the backward pass can neither
blow up nor — away from the ReLU's zero region — die out), decaying for the LSTM, and
exponential in t for the unconstrained W.

Run::

    python examples/sequential_digits.py           # N = 64, 20 epochs
    python examples/sequential_digits.py --quick   # N = 32, 3 epochs

Writes ``sequential_digits.{json,png}``.
"""

from __future__ import annotations

import time
from typing import Any

import _gallery as G
import numpy as np
import orthogonal_rnns as R
import torch

FULL = {"hidden": 64, "epochs": 20}
QUICK = {"hidden": 32, "epochs": 3}
BATCH = 32


def sequences(images: np.ndarray) -> torch.Tensor:
    """(B, 8, 8) images -> (B, 64, 1) pixel sequences, row by row."""
    return torch.tensor(images.reshape(len(images), 64, 1), dtype=torch.float32)


def accuracy(model: R.RecurrentNet, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def train(
    map: str,
    hidden: int,
    epochs: int,
    seed: int = 0,
    progress: bool = False,
    limit: int | None = None,
) -> dict[str, Any]:
    """One cell: per-epoch training loss, test accuracy and cumulative training seconds; the
    gradient profile before and after training; ‖WᵀW − I‖_F at the end. ``limit``: train on
    the first ``limit`` images only (a smoke test)."""
    xtr, ytr, xte, yte = G.digits_split(seed)
    xtr, ytr = xtr[:limit], ytr[:limit]
    xtr, xte = sequences(xtr), sequences(xte)
    ytr, yte = torch.tensor(ytr), torch.tensor(yte)
    model = R.RecurrentNet(1, hidden, 10, map, seed)
    opt = R.optimizer(model)
    lossf = torch.nn.CrossEntropyLoss()
    probe = xtr[:128], ytr[:128]

    def probe_loss(out: torch.Tensor) -> torch.Tensor:
        return lossf(out, probe[1])

    hist: dict[str, Any] = {"loss": [], "test_acc": [], "time_s": []}
    hist["grad_profile_init"] = R.gradient_profile(model, probe[0], probe_loss)
    order = torch.Generator().manual_seed(seed)
    spent = 0.0
    for _ in G.progress(range(epochs), progress, desc=R.LABELS[map], unit="epoch", leave=False):
        t0 = time.perf_counter()
        perm = torch.randperm(len(xtr), generator=order)
        total = 0.0
        for i in range(0, len(xtr), BATCH):
            idx = perm[i : i + BATCH]
            opt.zero_grad()
            loss = lossf(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        spent += time.perf_counter() - t0
        hist["loss"].append(total / len(xtr))
        hist["time_s"].append(spent)
        hist["test_acc"].append(accuracy(model, xte, yte))
    hist["grad_profile"] = R.gradient_profile(model, probe[0], probe_loss)
    hist["orth_err"] = R.orth_error(model)
    return hist


def run(
    hidden: int,
    epochs: int,
    maps: list[str] | None = None,
    seed: int = 0,
    progress: bool = True,
    limit: int | None = None,
) -> dict[str, Any]:
    maps = maps or list(R.MAPS)
    res: dict[str, Any] = {"hidden": hidden, "epochs": epochs, "batch": BATCH, "runs": {}}
    for m in G.progress(maps, progress, desc="pixel-by-pixel digits", unit="cell"):
        res["runs"][m] = train(m, hidden, epochs, seed, limit=limit)
    return res


def plot(res: dict[str, Any]) -> Any:
    plt = G.pyplot()
    fig, (ax, ax2, ax3) = plt.subplots(1, 3, figsize=(13, 3.9))
    for i, (m, h) in enumerate(res["runs"].items()):
        style = "-" if m in ("ornn", "cwy", "tcwy", "svd") else "--"
        kw = {"color": f"C{i}", "label": R.LABELS[m]}
        acc = 100 * np.array(h["test_acc"])
        ax.plot(h["time_s"], acc, style + "o", ms=3, **kw)
        ax2.plot(np.arange(1, len(acc) + 1), acc, style, **kw)
        prof = np.array(h["grad_profile"])
        ax3.semilogy(np.arange(1, len(prof) + 1), prof / prof[-1], style, **kw)
    ax.set(xlabel="training time (s)", ylabel="test accuracy (%)", title="accuracy vs wall time")
    ax2.set(xlabel="epoch", ylabel="test accuracy (%)")
    ax2.set_title(f"N = {res['hidden']}, T = 64, batch {res['batch']}")
    ax3.set(xlabel="time step t", ylabel="‖∂L/∂h_t‖ / ‖∂L/∂h_T‖")
    ax3.set_title("gradient reaching step t, after training")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    p = G.parser(__doc__)
    p.add_argument("--hidden", type=int, default=None, help="hidden units N")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--maps", nargs="+", default=None, choices=R.MAPS)
    p.add_argument("--train-limit", type=int, default=None, help="use only this many images")
    args = p.parse_args(argv)
    if G.replot(args, "sequential_digits", plot):
        return 0
    cfg = QUICK if args.quick else FULL
    G.set_threads(args.threads)
    G.seed_everything(args.seed)
    info = G.machine()
    print("machine:", G.machine_line(info))
    t0 = time.perf_counter()
    res = run(
        args.hidden or cfg["hidden"],
        args.epochs or cfg["epochs"],
        args.maps,
        args.seed,
        not args.no_progress,
        args.train_limit,
    )
    res.update(machine=info, wall_s=time.perf_counter() - t0)
    print(f"N = {res['hidden']}, {res['epochs']} epochs:")
    for m, h in res["runs"].items():
        prof = h["grad_profile"]
        print(
            f"  {R.LABELS[m]:22s} test accuracy {100 * h['test_acc'][-1]:6.2f} %  "
            f"training {h['time_s'][-1]:7.1f} s  ‖∂L/∂h_1‖/‖∂L/∂h_T‖ {prof[0] / prof[-1]:9.2e}  "
            f"‖WᵀW − I‖_F {h['orth_err']:.1e}"
        )
    print(f"{res['wall_s']:.1f} s")
    G.save(G.out_dir(args), "sequential_digits", res, plot(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
