"""Three headline ratios by a plain timing, without the harness (issue 40: a speed figure
must be one that an independent simple timing on the same machine gets again).

Run ``python -m benchmarks.by_hand`` (under a minute; ``--quick``: tiny sizes, a smoke
test). None of ``benchmarks/_harness.py``'s timing is used: ours and the anchor are timed by
``timeit`` in turns, nine samples each, and the fastest sample of each is kept (one thread);
each ratio is ours / anchor (lower is better), as in the headline table
(``python -m benchmarks.run``):

* the reused CWY apply ``Q @ h`` (N = 1024, L = 256, B = 64) / the two bare GEMMs of the same
  shapes ``U @ (U.T @ h)``;
* the dense ``hl.cwy(V).matrix()`` (N = L = 1024) / ``scipy.linalg.expm`` of a skew matrix;
* the same / the Cayley transform by ``scipy.linalg.solve``.

The headline pairs ours and the anchor round by round, on several placements, over a spread
of the run (benchmarks/README.md, Method); this script does none of that, so on a quiet
machine its figures should land near the headline's, and on a busy one they scatter. Writes
``by_hand.md`` to ``--out`` (default ``build/bench``).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import timeit
from pathlib import Path

import numpy as np
import scipy.linalg as sla
from threadpoolctl import threadpool_limits

import householderla as hl

ROOT = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    """The processor's model name, as every results page names it (the harness's machine
    record; its timing is not used here): the ratios differ between machines (MKL's orgqr is
    ~1.6× slower on an AMD EPYC than on a Xeon), so every figure names its CPU."""
    from benchmarks._harness import machine_info

    return machine_info()["cpu_model"] or platform.machine()


def fastest_times(ours, anchor, number: int, samples: int = 9) -> tuple[float, float]:
    """(fastest ours, fastest anchor) in seconds per call over ``samples`` samples of
    ``number`` calls each, the two sampled in turns (so that a slow spell of the machine does
    not fall on one only)."""
    t_ours, t_anchor = [], []
    ours(), anchor()  # first calls: caches, lazily built factors, compiled kernels
    for _ in range(samples):
        t_ours.append(timeit.timeit(ours, number=number))
        t_anchor.append(timeit.timeit(anchor, number=number))
    return min(t_ours) / number, min(t_anchor) / number


def fastest(ours, anchor, number: int, samples: int = 9) -> float:
    """Fastest ours / fastest anchor (:func:`fastest_times`)."""
    t_ours, t_anchor = fastest_times(ours, anchor, number, samples)
    return t_ours / t_anchor


def ratios(N: int, L: int, B: int, number: int) -> list[tuple[str, float]]:
    rng = np.random.default_rng(0)
    V, U, h = (rng.standard_normal(s) for s in ((N, L), (N, L), (N, B)))
    Q = hl.cwy(V)
    Q @ np.ones((N, N))  # reused: once its products have covered N columns, as in a loop
    name = f"CWY apply N={N} L={L} B={B} (reused) / two GEMMs U @ (U.T @ h)"
    out = [(name, fastest(lambda: Q @ h, lambda: U @ (U.T @ h), number))]
    X = rng.standard_normal((N, N))
    A, Vd, eye = (X - X.T) / 2.0, rng.standard_normal((N, N)), np.eye(N)
    ours = lambda: hl.cwy(Vd).matrix()  # noqa: E731
    out.append(
        (f"CWY matrix dense V N=L={N} / scipy expm (skew)", fastest(ours, lambda: sla.expm(A), 1))
    )
    cayley = lambda: sla.solve(eye + A / 2.0, eye - A / 2.0)  # noqa: E731
    out.append((f"CWY matrix dense V N=L={N} / Cayley by scipy solve", fastest(ours, cayley, 1)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    p.add_argument("--out", type=Path, default=ROOT / "build" / "bench", help="results folder")
    args = p.parse_args(argv)
    threadpool_limits(1)  # the headline's figures are one-thread runs
    shape = (128, 32, 8, 5) if args.quick else (1024, 256, 64, 50)
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    lines = [
        f"Plain timeit, one thread, the fastest of nine samples each, in turns ({date}; "
        f"{cpu_model()}); "
        "ours / anchor, lower is better:",
        "",
    ]
    lines += [f"- {name}: {r:#.3g}×" for name, r in ratios(*shape)]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "by_hand.md").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
