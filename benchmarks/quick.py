"""The smoke test of the benchmark scripts (``make bench-quick``, part of ``make test``): each
script named (default: every one) with ``--quick``, one after another in this one process.

Run ``python -m benchmarks.quick --out DIR [SCRIPT ...]``. Each script runs as its
``main(["--quick", "--out", DIR])``, so the test is that every script runs end to end at tiny
sizes (its timings are not meant to be read); a failing script stops the run with its error.
One process instead of one interpreter per script: starting Python with NumPy, SciPy, torch,
householderla and the harness costs seconds of CPU each time, which was most of the smoke
run's time (benchmarks/README.md, "Running"). ``reproduce`` still starts its two headline runs
in fresh interpreters (that is what it checks).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
import time
from pathlib import Path

#: Every script (the Makefile's ``BENCH_SCRIPTS``, then ``reproduce``).
SCRIPTS = (
    "run forming retractions sequential structured svd training_step stiefel dispatch lapack "
    "small dask_tall lowprec muon by_hand cpu_rows reproduce"
).split()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="results folder of every script")
    p.add_argument("scripts", nargs="*", default=SCRIPTS, help="scripts (default: every one)")
    args = p.parse_args(argv)
    times = {}
    t0, c0 = time.perf_counter(), _cpu_s()
    for name in args.scripts:
        print(f"[bench-quick] {name}", file=sys.stderr)
        # what the scripts before left behind (modules, caches) out of the collector's sight:
        # the scripts' gc.collect() calls (tracemalloc rows) then cost what they cost alone
        gc.collect()
        gc.freeze()
        t, c = time.perf_counter(), _cpu_s()
        mod = importlib.import_module(f"benchmarks.{name}")
        rc = mod.main(["--quick", "--out", str(args.out)])
        if rc:
            print(f"[bench-quick] {name} returned {rc}", file=sys.stderr)
            return rc
        times[name] = (time.perf_counter() - t, _cpu_s() - c)
    each = ", ".join(f"{k} {w:.1f} s ({c:.1f} s CPU)" for k, (w, c) in times.items())
    print(
        f"[bench-quick] {len(times)} scripts in {time.perf_counter() - t0:.1f} s "
        f"({_cpu_s() - c0:.1f} s CPU, with the processes it started): {each}"
    )
    return 0


def _cpu_s() -> float:
    """CPU seconds of this process and of the child processes it has waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


if __name__ == "__main__":
    raise SystemExit(main())
