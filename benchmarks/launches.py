"""Launch counts (issue 44, item 3): how many top-level aten ops one call runs, on the CPU's
path and on the CUDA path, each beside torch's own way of doing the same.

A GPU pays a few microseconds per launched kernel whatever its size; ``torch.profiler`` on the
CPU records the top-level aten ops of a call (an aten op not called from inside another aten
op), which is the number of CUDA kernels the same call launches to within a few. The "cuda"
rows run the CUDA path on CPU tensors under ``householderla._lib.device.emulate_device``
("cuda"): counted on the CPU, not measured on a GPU.

``python -m benchmarks.launches [--quick] [--out DIR]`` writes ``DIR/launches.json`` (default
``build/bench``): a list of rows ``{"what", "N", "B", "path", "ops", "anchor",
"anchor_ops"}``. ``--quick`` uses small shapes (seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.autograd.profiler_util import EventList

import householderla as hl
import householderla.torch as hlt
from householderla._lib.device import emulate_device

__all__ = ["by_name", "count_ops", "main", "op_names", "plan_name", "rows"]

FULL = {
    "layer": [(1024, 64), (1024, 1024), (4096, 256)],
    "form": [1024],
    "apply": [(1024, 64)],
    "muon": [(1024, 1024)],
}
QUICK = {"layer": [(64, 16), (64, 64)], "form": [64], "apply": [(64, 16)], "muon": [(64, 64)]}


def _top_level(events: EventList) -> list[Any]:
    """The aten ops of a profile that no other aten op called."""
    out = []
    for e in events:
        if not e.name.startswith("aten::"):
            continue
        p = e.cpu_parent
        while p is not None and not p.name.startswith("aten::"):
            p = p.cpu_parent
        if p is None:
            out.append(e)
    return out


#: One profiling cycle, whose events are all kept: torch 2.11 warns, on reading them, that a
#: cycle's end clears them unless ``acc_events`` asks to keep them (absent in torch 2.4).
_KEEP = (
    {"acc_events": True}
    if "acc_events" in inspect.signature(torch.profiler.profile).parameters
    else {}
)


def op_names(fn: Callable[[], Any], warmup: int = 1) -> list[str]:
    """The names of the top-level aten ops of one call of ``fn`` (after ``warmup`` calls)."""
    for _ in range(warmup):
        fn()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], **_KEEP) as prof:
        fn()
    return [e.name for e in _top_level(prof.events())]


def count_ops(fn: Callable[[], Any], warmup: int = 1) -> int:
    """How many top-level aten ops one call of ``fn`` runs, after ``warmup`` calls."""
    return len(op_names(fn, warmup))


def _device(path: str) -> Any:
    return emulate_device("cuda") if path == "cuda" else contextlib.nullcontext()


def _layer_step(N: int, B: int, ours: bool) -> Callable[[], None]:
    """forward + backward + SGD of an N × N orthogonal layer on B rows (float32)."""
    gen = torch.Generator().manual_seed(0)
    if ours:
        layer = hlt.OrthogonalLinear(N, N, bias=False, generator=gen)
    else:
        lin = torch.nn.Linear(N, N, bias=False)
        layer = torch.nn.utils.parametrizations.orthogonal(lin, orthogonal_map="cayley")
    opt = torch.optim.SGD(layer.parameters(), lr=1e-3)
    x = torch.randn(B, N, generator=gen)
    G = torch.randn(B, N, generator=gen)

    def step() -> None:
        opt.zero_grad()
        (layer(x) * G).sum().backward()
        opt.step()

    return step


def _form(N: int) -> tuple[Callable[[], Any], Callable[[], Any]]:
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(N, N, dtype=torch.float64, generator=gen)
    a, tau = torch.geqrf(a)
    return (lambda: hl.from_lapack(a, tau).matrix()), (
        lambda: torch.linalg.householder_product(a, tau)
    )


def _apply(N: int, B: int, fresh: bool) -> tuple[Callable[[], Any], Callable[[], Any]]:
    gen = torch.Generator().manual_seed(2)
    V = torch.randn(N, N, dtype=torch.float64, generator=gen)
    h = torch.randn(N, B, dtype=torch.float64, generator=gen)
    if fresh:
        a, tau = torch.geqrf(V)
        return (lambda: hl.cwy(V) @ h), (lambda: torch.ormqr(a, tau, h))
    op = hl.cwy(V)
    for _ in range(N // B + 1):  # past the repeat switch (N columns): its factor is built
        op @ h
    W, G = torch.randn(N, N, dtype=torch.float64), torch.randn(N, N, dtype=torch.float64)
    return (lambda: op @ h), (lambda: h - W @ (G @ h))


def _muon(M: int, N: int) -> tuple[Callable[[], Any], Callable[[], Any] | None]:
    """Our Muon step and torch.optim.Muon's (None where this torch has none: older ones)."""
    gen = torch.Generator().manual_seed(3)
    out = []
    for cls in (hlt.Muon, getattr(torch.optim, "Muon", None)):
        if cls is None:
            out.append(None)
            continue
        W = torch.nn.Parameter(torch.randn(M, N, generator=gen))
        W.grad = torch.randn(M, N, generator=gen)
        opt = cls([W], lr=0.02)
        out.append(opt.step)
    return out[0], out[1]


def rows(cfg: dict[str, Any], paths: tuple[str, ...] = ("cpu", "cuda")) -> list[dict[str, Any]]:
    """Every row of ``launches.json`` for the shapes of ``cfg`` (FULL or QUICK)."""
    out: list[dict[str, Any]] = []
    # torch's count: the same on both paths; None where this torch lacks the anchor
    anchors: dict[tuple[str, int, int | None], int | None] = {}

    def add(what: str, N: int, B: int | None, path: str, ours: Any, anchor: str, ref: Any):
        with _device(path):
            ops = count_ops(ours)
        if (what, N, B) not in anchors:
            anchors[what, N, B] = None if ref is None else count_ops(ref)
        out.append({"what": what, "N": N, "B": B, "path": path, "ops": ops,
                    "anchor": anchor, "anchor_ops": anchors[what, N, B]})  # fmt: skip
        print(f"  counted {what} N={N} B={B} {path}: {ops}", file=sys.stderr, flush=True)

    for path in paths:
        for N, B in cfg["layer"]:
            with _device(path):
                step = _layer_step(N, B, True)
            add("OrthogonalLinear training step", N, B, path, step,
                "torch orthogonal (cayley) training step", _layer_step(N, B, False))  # fmt: skip
        for N in cfg["form"]:
            ours, ref = _form(N)
            add("from_lapack(a, tau).matrix()", N, None, path, ours,
                "torch.linalg.householder_product", ref)  # fmt: skip
        for N, B in cfg["apply"]:
            with _device(path):
                ours, ref = _apply(N, B, fresh=False)
            add("prebuilt op @ h", N, B, path, ours, "two GEMMs h - W (G h)", ref)
            ours, ref = _apply(N, B, fresh=True)
            add("fresh cwy(V) @ h", N, B, path, ours, "torch.ormqr", ref)
        for M, N in cfg["muon"]:
            ours, ref = _muon(M, N)
            add("Muon step", N, M, path, ours, "torch.optim.Muon step", ref)
    return out


def plan_name(layer: Any, x: Any, path: str = "cpu") -> str:
    """The planner's path of ``layer``'s forward on rows ``x`` on the device kind ``path``."""
    from householderla._operator.plan import plan_layer

    with _device(path):
        return plan_layer(layer._layer_facts(x.reshape(-1, layer.in_features))).name


def by_name(fn: Callable[[], Any], path: str = "cpu") -> Counter:
    """The top-level aten ops of one call of ``fn`` on ``path``, counted by name."""
    with _device(path):
        return Counter(op_names(fn))


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes (a smoke test)")
    ap.add_argument("--out", default="build/bench", help="folder of launches.json")
    ap.add_argument("--paths", default="cpu,cuda", help="device paths to count (cpu,cuda)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = rows(QUICK if args.quick else FULL, tuple(args.paths.split(",")))
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "launches.json").write_text(json.dumps(out, indent=1) + "\n")
    for r in out:
        print(f"{r['what']:32} N={r['N']:5} B={r['B']!s:5} {r['path']:4} ops={r['ops']:5} "
              f"| {r['anchor']}: {r['anchor_ops']}")  # fmt: skip
    return out


if __name__ == "__main__":
    main()
