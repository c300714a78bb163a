"""The CPU rows an independent run checks (issue 44, item 4), by a plain timing.

Run ``python -m benchmarks.cpu_rows`` (about a minute; ``--quick``: tiny sizes, a smoke
test). None of ``benchmarks/_harness.py``'s timing is used: ours and the anchor are timed by
``timeit`` in turns, nine samples each, the fastest sample of each kept, one thread (two
where a row says so), as ``benchmarks/by_hand.py`` times the headline's three ratios. Each
group of rows runs in a fresh interpreter, as a user's own script would time it, so that no
row inherits the heap the earlier ones left: glibc serves large temporaries from fresh pages
or from a heap it trims, by thresholds that earlier frees move (one ``hl.cwy(V) @ h`` call
before the VJP row's calls made each VJP take 1,038 page faults and 10.3 ms instead of 35
and 7.4 ms; ``--same-process`` times every group in one process, the former method). Each
row is ours / anchor (lower is better) unless it says "speed-up" (anchor / ours, higher is
better):

* a prebuilt ``Q @ h`` (past the repeat switch) / the two bare GEMMs ``U (Uᵀ h)``;
* ``hl.from_lapack(a, τ).matrix()`` and ``hl.cwy(V).matrix()`` on the unit lower-trapezoidal
  V of the same reflectors / ``torch.linalg.householder_product`` (LAPACK's ``?orgqr``,
  MKL), torch tensors as ``torch.geqrf`` returns them and NumPy views of them;
* ``hl.vjp.cwy_apply`` / the forward ``hl.cwy(V) @ h`` it differentiates;
* 8192 float64 (16, 16) reflector sets: ``householder_product`` / ours (speed-up);
* ``hl.householder_apply`` of 16 reflections to one vector / the same product written by
  hand with precomputed factors ``h − U (T (Uᵀ h))``.

* the ``OrthogonalLinear`` training step (forward, backward, SGD) at N = 128 where B ≥ N,
  float32 and float64, on one and on two threads / torch's Cayley map (its fastest
  orthogonal map there; ``benchmarks/training_step.py`` has every shape and anchor);
* its forward under ``torch.no_grad`` (evaluation) / the same of torch's Cayley map.

Writes ``cpu_rows.md`` to ``--out`` (default ``build/bench``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_limits

import householderla as hl
from benchmarks.by_hand import cpu_model, fastest_times

ROOT = Path(__file__).resolve().parents[1]


Row = tuple[str, float, float, bool]  # (name, ours in s, anchor in s, speed-up row)


def _adder(out: list[Row]):
    def add(name, ours, anchor, number, speedup=False):
        t = fastest_times(ours, anchor, number)
        out.append((name, *t, speedup))

    return add


def apply_rows(quick: bool) -> list[Row]:
    """The prebuilt ``Q @ h`` rows, NumPy and torch."""
    out: list[Row] = []
    add = _adder(out)
    rng = np.random.default_rng(0)
    N, L, B = (128, 32, 8) if quick else (1024, 256, 64)
    V, U, h = (rng.standard_normal(s) for s in ((N, L), (N, L), (N, B)))
    Q = hl.cwy(V)
    Q @ np.ones((N, N))  # past the repeat switch: N columns multiplied
    add(f"prebuilt Q @ h, N={N} L={L} B={B}, NumPy / U (Uᵀ h)", lambda: Q @ h,
        lambda: U @ (U.T @ h), 50)  # fmt: skip
    Vt, Ut, ht = (torch.from_numpy(a) for a in (V, U, h))
    Qt = hl.cwy(Vt)
    Qt @ torch.ones(N, N, dtype=torch.float64)
    add(f"prebuilt Q @ h, N={N} L={L} B={B}, torch / U (Uᵀ h)", lambda: Qt @ ht,
        lambda: Ut @ (Ut.mT @ ht), 50)  # fmt: skip
    return out


def forming_rows(quick: bool) -> list[Row]:
    """``from_lapack(a, τ).matrix()`` and ``cwy(V).matrix()`` / ``householder_product``."""
    out: list[Row] = []
    add = _adder(out)
    rng = np.random.default_rng(1)
    for n in (96,) if quick else (256, 1024):
        A = torch.from_numpy(rng.standard_normal((n, n)))
        a, tau = torch.geqrf(A)
        an, taun = a.numpy(), tau.numpy()
        Vu = (a.tril(-1) + torch.eye(n, dtype=torch.float64)).contiguous()
        Vun = Vu.numpy()
        k = 20 if n <= 256 else 1

        def orgqr(a=a, tau=tau):
            return torch.linalg.householder_product(a, tau)

        add(f"from_lapack(a, τ).matrix(), N={n}, torch / householder_product",
            lambda a=a, tau=tau: hl.from_lapack(a, tau).matrix(), orgqr, k)  # fmt: skip
        add(f"from_lapack(a, τ).matrix(), N={n}, NumPy / householder_product",
            lambda a=an, tau=taun: hl.from_lapack(a, tau).matrix(), orgqr, k)  # fmt: skip
        add(f"cwy(V).matrix(), unit lower V, N={n}, torch / householder_product",
            lambda V=Vu: hl.cwy(V).matrix(), orgqr, k)  # fmt: skip
        add(f"cwy(V).matrix(), unit lower V, N={n}, NumPy / householder_product",
            lambda V=Vun: hl.cwy(V).matrix(), orgqr, k)  # fmt: skip
    return out


def vjp_rows(quick: bool) -> list[Row]:
    """``hl.vjp.cwy_apply`` / its forward."""
    out: list[Row] = []
    add = _adder(out)
    N, L, B = (128, 32, 8) if quick else (1024, 256, 64)
    rng = np.random.default_rng(5)
    V, H, G = (rng.standard_normal(s) for s in ((N, L), (N, B), (N, B)))
    add(f"vjp.cwy_apply, N={N} L={L} B={B}, NumPy / forward cwy(V) @ h",
        lambda: hl.vjp.cwy_apply(V, H, G), lambda: hl.cwy(V) @ H, 3)  # fmt: skip
    return out


def stack_rows(quick: bool) -> list[Row]:
    """8192 (16, 16) reflector sets: ``householder_product`` / ours (speed-up)."""
    out: list[Row] = []
    add = _adder(out)
    rng = np.random.default_rng(5)
    P, n = (64, 16) if quick else (8192, 16)
    A = torch.from_numpy(rng.standard_normal((P, n, n)))
    a, tau = torch.geqrf(A)
    Vs = (a.tril(-1) + torch.eye(n, dtype=torch.float64)).contiguous()
    add(f"{P} (16, 16) float64 torch: householder_product / cwy(V).matrix() (speed-up)",
        lambda: hl.cwy(Vs).matrix(), lambda: torch.linalg.householder_product(a, tau), 3,
        speedup=True)  # fmt: skip
    add(f"{P} (16, 16) float64 torch: householder_product / from_lapack(a, τ).matrix() "
        "(speed-up)", lambda: hl.from_lapack(a, tau).matrix(),
        lambda: torch.linalg.householder_product(a, tau), 3, speedup=True)  # fmt: skip
    return out


def householder_apply_rows(quick: bool) -> list[Row]:
    """``householder_apply`` of 16 reflections to one vector / the product by hand."""
    out: list[Row] = []
    add = _adder(out)
    rng = np.random.default_rng(6)
    N, L = 128, 16
    V, h = rng.standard_normal((N, L)), rng.standard_normal(N)
    Un = V / np.linalg.norm(V, axis=0)
    T = np.triu(rng.standard_normal((L, L)))
    add("householder_apply(V, h), N=128 L=16, one vector, NumPy / h − U (T (Uᵀ h))",
        lambda: hl.householder_apply(V, h), lambda: h - Un @ (T @ (Un.T @ h)), 2000)  # fmt: skip
    Vt, htt, Unt, Tt = (torch.from_numpy(x) for x in (V, h, Un, T))
    add("householder_apply(V, h), N=128 L=16, one vector, torch / h − U (T (Uᵀ h))",
        lambda: hl.householder_apply(Vt, htt), lambda: htt - Unt @ (Tt @ (Unt.mT @ htt)),
        2000)  # fmt: skip
    return out


def training_rows(quick: bool) -> list[Row]:
    """The training-step rows, each timed at the torch thread count it names (NumPy's BLAS
    stays at one thread: the step makes no NumPy call). In one process with the other rows
    they ran first: after those, torch's two-thread steps took ~2× as long, its own and the
    anchor's alike."""
    from benchmarks.training_step import make_steps

    out: list[Row] = []
    cases = [(128, 128)] if quick else [(128, 128), (128, 512), (128, 1024)]
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for dtype in (torch.float32, torch.float64):
            for N, B in cases:
                steps = make_steps(N, B, dtype)
                t = fastest_times(steps["hl OrthogonalLinear"], steps["torch cayley"], 5)
                name = (f"OrthogonalLinear training step, N={N} B={B}, {str(dtype)[6:]}, "
                        f"{threads} thread{'s' * (threads > 1)} / torch cayley")  # fmt: skip
                out.append((name, *t, False))
    return out


def inference_rows(quick: bool) -> list[Row]:
    """``OrthogonalLinear`` forwards nothing records (``torch.no_grad``: evaluation) / the
    same forward of torch's Cayley map, float32, one thread."""
    from torch.nn.utils import parametrizations

    import householderla.torch as hlt

    out: list[Row] = []
    add = _adder(out)
    cases = [(32, 32)] if quick else [(128, 128), (128, 1024), (512, 512)]
    for N, B in cases:
        gen = torch.Generator().manual_seed(0)
        ours = hlt.OrthogonalLinear(N, N, bias=False, generator=gen)
        lin = torch.nn.Linear(N, N, bias=False)
        cayley = parametrizations.orthogonal(lin, orthogonal_map="cayley")
        x = torch.randn(B, N, generator=gen)

        def timed(layer, x=x):
            with torch.no_grad():
                return layer(x)

        add(f"OrthogonalLinear no-grad forward, N={N} B={B}, float32 / torch cayley",
            lambda o=ours: timed(o), lambda c=cayley: timed(c), 3 if N >= 512 else 20)  # fmt: skip
    return out


#: the row groups in the order of the page; each runs in a fresh process by default
GROUPS = {
    "apply": apply_rows,
    "forming": forming_rows,
    "vjp": vjp_rows,
    "stacks": stack_rows,
    "householder_apply": householder_apply_rows,
    "training": training_rows,
    "inference": inference_rows,
}


def run_group(name: str, quick: bool) -> list[Row]:
    """One group's rows at one thread (BLAS and torch; the training rows set torch's)."""
    threadpool_limits(1)  # one-thread figures, as the headline's
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return GROUPS[name](quick)
    finally:
        torch.set_num_threads(threads)


def _in_fresh_process(name: str, quick: bool) -> list[Row]:
    """The group's rows timed by ``python -m benchmarks.cpu_rows --group NAME`` in a new
    interpreter (its output: the rows as JSON), as a script of the user's would time them."""
    cmd = [sys.executable, "-m", "benchmarks.cpu_rows", "--group", name] + ["--quick"] * quick
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"cpu_rows --group {name} failed:\n{done.stderr[-3000:]}")
    return [tuple(r) for r in json.loads(done.stdout.strip().splitlines()[-1])]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    p.add_argument("--out", type=Path, default=ROOT / "build" / "bench", help="results folder")
    p.add_argument(
        "--same-process",
        action="store_true",
        help="every group in this process, the training rows first (the former method)",
    )
    p.add_argument("--group", choices=sorted(GROUPS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.group:  # a worker: the rows as JSON on the last line
        print(json.dumps(run_group(args.group, args.quick)))
        return 0
    if args.same_process:
        order = ["training"] + [g for g in GROUPS if g != "training"]
        timed = {g: run_group(g, args.quick) for g in order}
    else:
        timed = {g: _in_fresh_process(g, args.quick) for g in GROUPS}
    found = [row for g in GROUPS for row in timed[g]]
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    where = "all in one process" if args.same_process else "each group in a fresh process"
    lines = [
        f"Plain timeit, one thread (unless the row names two), the fastest of nine samples "
        f"each, in turns, {where} ({date}; "
        f"{cpu_model()}, torch {torch.__version__}, "
        f"NumPy {np.__version__}). Ratio: ours / anchor (lower is better), or anchor / ours "
        "where the row says speed-up.",
        "",
        "| row | ours | anchor | ratio |",
        "|---|---|---|---|",
    ]
    for name, ours, anchor, speedup in found:
        r = anchor / ours if speedup else ours / anchor
        lines.append(f"| {name} | {ours * 1e3:.3f} ms | {anchor * 1e3:.3f} ms | {r:.2f}× |")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cpu_rows.md").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
