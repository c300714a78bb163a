"""One timing of ``hl.householder_apply`` (the Numba loop of reflections) in a fresh process;
not a script of its own. ``_cwy_rows.time_in_processes`` starts it several times and takes
the median.

Why a process each: the loop of reflections streams its whole (N, B) output through the L2
cache once per reflection, so its speed depends on where the process's memory lands. At
N = L = 1024, B = 64 (float64, a 512 KiB output) the same call took 16.7–23.6 ms in nine fresh
processes and 17–23 ms over eight freshly allocated outputs of one process, while a process
keeps its figure from call to call (the allocator hands the freed block back): timed in one
process, the row is one draw of that spread (4.7–6.1× between three runs of the headline).

The loop is timed side by side with the CWY apply it is compared with (``Q @ h``, the same V
and h, factors built and reused as in the headline), so that the process's speed-up is a paired
ratio (``_harness.paired_ratio``: the median over the rounds of the per-round ratio).

``python -m benchmarks._sequential_probe N L B THREADS MAX_TOTAL`` prints one JSON object:
``median_s``, ``min_s``, ``times_s`` of the loop (``_harness.measure``), ``pair_median_s`` and
``pair_times_s`` of the CWY apply and ``paired_ratio`` (loop / CWY apply), for V (N, L) and
h (N, B) of standard normal entries (seed 2; the kernel's time does not depend on the values).
"""

from __future__ import annotations

import json
import sys

import numpy as np

import householderla as hl
from benchmarks import _harness as H
from benchmarks._cwy_rows import built, reused


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    n, L, B, threads = (int(a) for a in args[:4])
    max_total = float(args[4])
    if threads:  # 0: the libraries' defaults (every core), as run.py's --threads 0
        H.limit_threads(threads)
    rng = np.random.default_rng(2)
    V, h = rng.standard_normal((n, L)), rng.standard_normal((n, B))
    hl.householder_apply(V[:, : min(L, 32)], h)  # loads (or compiles) the kernels
    Q = reused(built(hl.cwy(V)), h)
    prof = H.Profile(sample_s=2e-3, min_total=0.2, max_total=max_total, max_rep=30)
    t = H.measure({"loop": lambda: hl.householder_apply(V, h), "pair": lambda: Q @ h}, prof)
    r = H.paired_times(t, "loop", "pair")
    keep = ("median_s", "min_s", "times_s", "pair_median_s", "pair_times_s", "paired_ratio")
    print(json.dumps({k: r[k] for k in keep}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
