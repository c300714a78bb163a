"""PEFT adapters: householderla's HRA and OFT (``householderla.peft``) beside PEFT's own, on one
adapted linear layer and on a randomly initialised small Llama (CPU, no weights downloaded).

Run ``python -m benchmarks.peft`` (d ∈ {1024, 2048}, r = 32, 512 tokens; a 200-step fine-tuning
run of a small Llama; one thread; several minutes on 2 cores; writes
``build/bench/peft.{json,md,png}``) or ``--quick`` (a smoke test, seconds); ``--out DIR``
elsewhere, ``--threads K`` for K threads.

One step is ``loss = ⟨G, layer(x)⟩; loss.backward()`` with x (512 tokens × d) needing its
gradient, as inside a network: the adapter's forward, the base layer and the whole backward.
Methods, side by side in one run (``benchmarks/_harness.py``: round-robin samples, medians; the
ratios are medians of per-round ratios, so a slow spell of the machine cancels):

* ``plain Linear``: the frozen ``nn.Linear(d, d)`` without adapter (the floor);
* ``peft HRA`` / ``hl HRA``: ``peft.HRAConfig(r=32)`` / ``hl.peft.HRAConfig(r=32)``;
* ``peft OFT (Neumann)``: ``peft.OFTConfig(oft_block_size=32)``, PEFT's default 5-term
  Cayley–Neumann series; ``peft OFT (exact)``: ``use_cayley_neumann=False``
  (``torch.linalg.solve``); ``hl OFT``: ``hl.peft.OFTConfig(oft_block_size=32)``.

Peak memory of a step: how far the resident set peaks above its level before a warm step
(``VmHWM`` after resetting it by ``/proc/self/clear_refs``; Linux), each method in a fresh
subprocess with every large block mmapped so that freed memory is returned at once.
``‖RᵀR − I‖₂``: the largest over the blocks at the timed parameters (every adapter entry
drawn from N(0, 0.05²), half of PEFT's ``init_weights=False`` spread). ``--quick`` skips the
memory column (a subprocess a method). Issue 21's targets: HRA step ≥ 8× faster than PEFT's
and ≤ 1.6× the plain layer's, peak memory ≤ 1/3 of PEFT's; OFT step ≤ 1.2× PEFT's Neumann
OFT.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import subprocess
import sys
import time
import warnings
from typing import Any

import peft
import torch

import householderla as hl
from benchmarks import _harness as H

warnings.filterwarnings("ignore", category=FutureWarning)  # transformers 5 deprecations
warnings.filterwarnings("ignore", message="Invalid `")  # PEFT's block-size adjustments

FULL = {
    "quick": False,
    "d": [1024, 2048],
    "r": 32,
    "block": 32,
    "tokens": 512,
    "llama": {"hidden": 256, "layers": 2, "steps": 200, "batch": 8, "seq": 64},
    "profile": H.Profile(min_total=1.0, max_total=6.0, min_rep=3, max_rep=10),
}
QUICK = {
    "quick": True,
    "d": [128],
    "r": 8,
    "block": 16,
    "tokens": 64,
    "llama": {"hidden": 64, "layers": 1, "steps": 5, "batch": 2, "seq": 16},
    "profile": H.Profile(sample_s=0.0, min_total=0.0, max_total=0.2, min_rep=2, max_rep=2),
}
PLAIN = "plain Linear"
METHODS = (PLAIN, "peft HRA", "hl HRA", "peft OFT (Neumann)", "peft OFT (exact)", "hl OFT")


def _config(method: str, r: int, block: int, targets: list[str]) -> Any:
    if method.endswith("HRA"):
        lib = hl.peft if method.startswith("hl") else peft
        return lib.HRAConfig(r=r, target_modules=targets)
    if method.startswith("hl"):
        return hl.peft.OFTConfig(oft_block_size=block, target_modules=targets)
    exact = method.endswith("(exact)")
    return peft.OFTConfig(
        oft_block_size=block, use_cayley_neumann=not exact, target_modules=targets
    )


def make_layer(method: str, d: int, r: int, block: int, seed: int = 0) -> torch.nn.Module:
    """``nn.Linear(d, d)`` adapted by ``method`` (the plain layer frozen, as PEFT freezes it)."""
    torch.manual_seed(seed)
    base = torch.nn.Sequential(torch.nn.Linear(d, d))
    if method == PLAIN:
        return base.requires_grad_(False)
    model = peft.get_peft_model(base, _config(method, r, block, ["0"]))
    with torch.no_grad():  # away from the identity start, the same draw for every method
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    return model


class _Step:
    def __init__(self, layer: torch.nn.Module, d: int, tokens: int) -> None:
        g = torch.Generator().manual_seed(2)
        self.layer = layer
        self.x = torch.randn(tokens, d, generator=g).requires_grad_(True)
        self.G = torch.randn(tokens, d, generator=g)

    def __call__(self) -> None:
        self.x.grad = None
        self.layer.zero_grad(set_to_none=True)
        (self.layer(self.x) * self.G).sum().backward()


def _status_bytes(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def _peak_growth(method: str, d: int, r: int, block: int, tokens: int) -> int:
    """Bytes the resident set peaks above its level before one (warm) step, Linux only: the
    peak is reset through ``/proc/self/clear_refs`` and read as ``VmHWM``."""
    step = _Step(make_layer(method, d, r, block), d, tokens)
    step()
    gc.collect()
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _status_bytes("VmRSS:")
    step()
    return _status_bytes("VmHWM:") - before


def peak_memory(method: str, d: int, r: int, block: int, tokens: int, threads: int) -> int:
    """:func:`_peak_growth` in a fresh process whose large blocks are all mmapped (glibc's
    ``MALLOC_MMAP_THRESHOLD_``), so that freed memory leaves the resident set at once."""
    code = (
        "import json, sys, torch; from benchmarks import peft as P; "
        f"torch.set_num_threads({threads}); "
        f"print(json.dumps(P._peak_growth({method!r}, {d}, {r}, {block}, {tokens})))"
    )
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=H.ROOT,
        env=env,
    )  # fmt: skip
    return int(json.loads(out.stdout.strip().splitlines()[-1]))


def _orth_err(layer: torch.nn.Module) -> float | None:
    mods = [m for m in layer.modules() if hasattr(m, "oft_R")]
    if not mods:
        return None
    rot = mods[0].oft_R["default"]
    with torch.no_grad():
        R = rot._cayley_batch(rot.weight, rot.block_size, rot.use_cayley_neumann).double()
    if not torch.isfinite(R).all():
        return float("inf")
    eye = torch.eye(R.shape[-1], dtype=R.dtype)
    return float(torch.linalg.matrix_norm(R.mT @ R - eye, ord=2).max())


def run_layers(cfg: dict[str, Any], threads: int) -> list[dict[str, Any]]:
    rows = []
    with H.Bench(cfg["profile"], len(cfg["d"]) * len(METHODS), "layer step") as b:
        for d in cfg["d"]:
            steps = {m: _Step(make_layer(m, d, cfg["r"], cfg["block"]), d, cfg["tokens"])
                     for m in METHODS}  # fmt: skip
            t = b.side_by_side(f"d={d}", dict(steps.items()))
            for m, step in steps.items():
                errs = _orth_err(step.layer)
                rows.append(
                    {
                        "d": d,
                        "method": m,
                        "vs_plain": H.paired_ratio(t, m, PLAIN),
                        "vs_peft_hra": H.paired_ratio(t, m, "peft HRA"),
                        "vs_peft_oft": H.paired_ratio(t, m, "peft OFT (Neumann)"),
                        "peak_bytes": None
                        if cfg["quick"]
                        else peak_memory(m, d, cfg["r"], cfg["block"], cfg["tokens"], threads),
                        "orth_err": errs,
                        **t[m],
                    }
                )
    return rows


# -- a small Llama: step time and a fine-tuning curve ----------------------------------------
LLAMA_METHODS = ("LoRA", "peft HRA", "hl HRA", "peft OFT (Neumann)", "hl OFT")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "gate_proj"]


def _llama(c: dict[str, Any]) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=c["hidden"],
        intermediate_size=2 * c["hidden"],
        num_hidden_layers=c["layers"],
        num_attention_heads=4,
        vocab_size=256,
    )
    return transformers.LlamaForCausalLM(cfg)


def run_llama(cfg: dict[str, Any]) -> dict[str, Any]:
    """Each method fine-tunes the same random Llama (Adam, lr 1e-3) for ``steps`` steps on a
    fixed random next-token task (a random permutation of the vocabulary, so there is a
    target to learn); the loss curve and the mean step time."""
    c = cfg["llama"]
    base = _llama(c)
    perm = torch.randperm(256, generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(4)
    out: dict[str, Any] = {}
    for m in LLAMA_METHODS:
        if m == "LoRA":
            conf = peft.LoraConfig(r=cfg["r"], target_modules=TARGETS)
        else:
            conf = _config(m, cfg["r"], cfg["block"], TARGETS)
        torch.manual_seed(5)  # the same adapter draws for the methods that share a layout
        model = peft.get_peft_model(copy.deepcopy(base), conf)
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        losses, times = [], []
        g.manual_seed(4)
        for _ in range(c["steps"]):
            ids = torch.randint(0, 256, (c["batch"], c["seq"]), generator=g)
            t0 = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(
                model(ids).logits[:, :-1].reshape(-1, 256), perm[ids[:, :-1]].reshape(-1)
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            losses.append(float(loss.detach()))
        out[m] = {"loss": losses, "step_s": sorted(times)[len(times) // 2]}
    return out


# -- report ------------------------------------------------------------------------------------
def report_md(res: dict[str, Any], threads: str) -> str:
    load = res["load"]
    frac = load.get("foreign_cpu_fraction")
    la = load.get("loadavg_start"), load.get("loadavg_end")
    cfg = res["config"]
    lines = [
        "# PEFT adapters: householderla's HRA and OFT beside PEFT's (CPU)",
        "",
        f"**Machine:** {H.machine_line(res['machine'], extra=threads)}; other processes used "
        f"{'?' if frac is None else f'{100 * frac:.0f}%'} of the CPU (load average at start "
        f"/ end: {la[0]} / {la[1]}); PEFT {res['versions']['peft']}, transformers "
        f"{res['versions']['transformers']}, torch {torch.__version__}.",
        "",
        f"One adapted `nn.Linear(d, d)`, {cfg['tokens']} tokens, forward + backward (input "
        f"gradient included); HRA r = {cfg['r']}, OFT blocks of {cfg['block']}. Median ms per "
        "step; ratios are medians of per-round ratios; peak = how far the RSS peaks above its "
        "level before a warm step (fresh process, large blocks mmapped).",
        "",
        "| d | method | step (ms) | / plain | / PEFT's HRA | / PEFT's OFT (Neumann) | "
        "peak (MiB) | ‖RᵀR − I‖₂ |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        err = "" if r["orth_err"] is None else f"{r['orth_err']:.1e}"
        peak = "—" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:.1f}"
        lines.append(
            f"| {r['d']} | {r['method']} | {r['median_s'] * 1e3:.1f} | {r['vs_plain']:.2f}× | "
            f"{r['vs_peft_hra']:.3f}× | {r['vs_peft_oft']:.2f}× | "
            f"{peak} | {err} |"
        )
    lines += ["", "Targets (issue 21):", ""]
    for d in cfg["d"]:
        rs = {r["method"]: r for r in res["rows"] if r["d"] == d}
        ours, theirs = rs["hl HRA"], rs["peft HRA"]
        speed = 1 / ours["vs_peft_hra"]
        mem = (ours["peak_bytes"] or 0) / max(theirs["peak_bytes"] or 0, 1)
        oft = rs["hl OFT"]["vs_peft_oft"]
        lines.append(
            f"- d = {d}: HRA {speed:.1f}× faster than PEFT's ({'met' if speed >= 8 else 'NOT met'}"
            f", ≥ 8×); {ours['vs_plain']:.2f}× the plain layer "
            f"({'met' if ours['vs_plain'] <= 1.6 else 'NOT met'}, ≤ 1.6×); peak memory "
            f"{mem:.2f} of PEFT's ({'met' if mem <= 1 / 3 else 'NOT met'}, ≤ 1/3); OFT "
            f"{oft:.2f}× PEFT's Neumann OFT ({'met' if oft <= 1.2 else 'NOT met'}, ≤ 1.2×)"
        )
    ll = res["llama"]
    c = cfg["llama"]
    lines += [
        "",
        f"## Fine-tuning a random Llama (hidden {c['hidden']}, {c['layers']} layers, all "
        f"attention and MLP projections adapted, batch {c['batch']}×{c['seq']} tokens, Adam "
        f"1e-3, {c['steps']} steps; LoRA r = {cfg['r']})",
        "",
        "| method | median step (ms) | loss first → last 10 mean |",
        "|---|---|---|",
    ]
    for m, v in ll.items():
        last = sum(v["loss"][-10:]) / len(v["loss"][-10:])
        lines.append(f"| {m} | {v['step_s'] * 1e3:.1f} | {v['loss'][0]:.3f} → {last:.3f} |")
    return "\n".join(lines) + "\n"


def plot(res: dict[str, Any], path: Any) -> None:
    plt = H.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for m, v in res["llama"].items():
        ax.plot(v["loss"], label=m, lw=1)
    ax.set(xlabel="step", ylabel="training loss", title="random Llama, next-token task")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
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
    import transformers

    res["versions"] = {"peft": peft.__version__, "transformers": transformers.__version__}
    monitor = H.LoadMonitor()
    res["threads"] = threads
    res["rows"] = run_layers(cfg, args.threads)
    res["llama"] = run_llama(cfg)
    res["load"] = monitor.result(res["machine"]["cores_available"])
    res["wall_s"] = time.perf_counter() - t0
    text = report_md(res, threads)
    print(text)
    print(f"wall time {res['wall_s']:.1f} s")
    H.write(out_dir / "peft.json", res)
    H.write(out_dir / "peft.md", text)
    plot(res, out_dir / "peft.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
