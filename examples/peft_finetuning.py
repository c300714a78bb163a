"""Fine-tuning a small Llama with HRA and OFT: householderla's adapters beside PEFT's and LoRA.

``householderla.peft`` registers HRA (Yuan, Liu & Xu, NeurIPS 2024) and OFT (Qiu et al.,
NeurIPS 2023) with Hugging Face PEFT: ``peft.get_peft_model(model, hl.peft.HRAConfig(...))``.
This script fine-tunes one randomly initialised Llama from ``transformers`` (no weights are
downloaded) with every method on the same synthetic next-token task — the next token is a
fixed random permutation of the current one, so there is something to learn — and records the
training loss and the time per step:

* ``LoRA``: ``peft.LoraConfig(r)``;
* ``peft HRA`` / ``hl HRA``: the same method, PEFT's layer (a d × d matrix built from r rank-1
  updates every forward) and ours (the r reflections applied to the tokens in compact WY form);
  with the same seed both start from the same reflectors and follow the same curve;
* ``peft OFT (Neumann)`` / ``hl OFT``: PEFT's default Cayley–Neumann series and our exact
  Cayley blocks (orthogonal to float32 rounding).

Every adapted model starts as the base model (HRA's paired reflectors, OFT's zero skew
blocks, LoRA's zero B). Run::

    python examples/peft_finetuning.py            # hidden 256, 200 steps: a few minutes
    python examples/peft_finetuning.py --quick    # hidden 64, 30 steps: seconds

Writes ``peft_finetuning.json`` and ``.png`` (``benchmarks/results/gallery/``, or
``docs/_build/gallery/`` for ``--quick``). ``benchmarks/peft.py`` is the measurement of the
single-layer costs.
"""

from __future__ import annotations

import copy
import time
import warnings
from typing import Any

import _gallery as G
import torch

import householderla as hl

FULL = {"hidden": 256, "layers": 2, "steps": 200, "batch": 8, "seq": 64, "r": 32, "block": 32}
QUICK = {"hidden": 64, "layers": 1, "steps": 30, "batch": 4, "seq": 32, "r": 8, "block": 16}
METHODS = ("LoRA", "peft HRA", "hl HRA", "peft OFT (Neumann)", "hl OFT")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
VOCAB = 256


def config(method: str, r: int, block: int) -> Any:
    """The PEFT config of ``method``."""
    import peft

    if method == "LoRA":
        return peft.LoraConfig(r=r, target_modules=TARGETS)
    if method == "peft HRA":
        return peft.HRAConfig(r=r, target_modules=TARGETS)
    if method == "hl HRA":
        return hl.peft.HRAConfig(r=r, target_modules=TARGETS)
    if method == "peft OFT (Neumann)":
        return peft.OFTConfig(oft_block_size=block, target_modules=TARGETS)
    return hl.peft.OFTConfig(oft_block_size=block, target_modules=TARGETS)


def llama(hidden: int, layers: int, seed: int) -> torch.nn.Module:
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        vocab_size=VOCAB,
    )
    return transformers.LlamaForCausalLM(cfg)


def finetune(base: torch.nn.Module, method: str, cfg: dict[str, Any], seed: int) -> dict:
    """Adam (lr 1e-3) on the permutation task; the loss of every step, the median step time."""
    import peft

    torch.manual_seed(seed)  # the same adapter draws for the methods with the same layout
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = peft.get_peft_model(copy.deepcopy(base), config(method, cfg["r"], cfg["block"]))
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    perm = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed + 1))
    data = torch.Generator().manual_seed(seed + 2)
    losses, times = [], []
    for _ in range(cfg["steps"]):
        ids = torch.randint(0, VOCAB, (cfg["batch"], cfg["seq"]), generator=data)
        t0 = time.perf_counter()
        logits = model(ids).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), perm[ids].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
    return {"loss": losses, "step_s": sorted(times)[len(times) // 2]}


def run(cfg: dict[str, Any], seed: int = 0, progress: bool = True) -> dict[str, Any]:
    base = llama(cfg["hidden"], cfg["layers"], seed)
    out = {m: finetune(base, m, cfg, seed) for m in G.progress(METHODS, progress, desc="method")}
    return {"config": cfg, "methods": out}


def plot(res: dict[str, Any]) -> Any:
    plt = G.pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for m, v in res["methods"].items():
        style = "-" if m.startswith("hl") else "--"
        ax.plot(v["loss"], style, lw=1.2, label=f"{m} ({1e3 * v['step_s']:.0f} ms/step)")
    c = res["config"]
    ax.set(
        xlabel="step",
        ylabel="training loss",
        title=f"random Llama (hidden {c['hidden']}, {c['layers']} layers), r = {c['r']}",
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    p = G.parser(__doc__)
    p.add_argument("--steps", type=int, default=None, help="training steps per method")
    args = p.parse_args(argv)
    if G.replot(args, "peft_finetuning", plot):
        return 0
    cfg = dict(QUICK if args.quick else FULL)
    if args.steps:
        cfg["steps"] = args.steps
    G.set_threads(args.threads)
    G.seed_everything(args.seed)
    info = G.machine()
    print("machine:", G.machine_line(info))
    t0 = time.perf_counter()
    res = run(cfg, args.seed, not args.no_progress)
    res.update(machine=info, wall_s=time.perf_counter() - t0)
    for m, v in res["methods"].items():
        last = sum(v["loss"][-10:]) / len(v["loss"][-10:])
        print(f"{m:20s} {1e3 * v['step_s']:8.1f} ms/step   loss {v['loss'][0]:.3f} -> {last:.3f}")
    G.save(G.out_dir(args), "peft_finetuning", res, plot(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
