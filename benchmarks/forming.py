"""Forming Q from LAPACK reflectors: ``hl.from_lapack(a, tau).matrix()`` against ``?orgqr``.

Issue 19 item 1: form the dense N×N Q of ``?geqrf``'s (a, τ) in at most 0.9× the time of
LAPACK's ``?orgqr`` — SciPy's ``dorgqr``/``sorgqr`` and ``torch.linalg.householder_product``,
whichever is faster in the run — at N = 256 … 4096, float32 and float64, with one and with two
threads (``--threads``). Every row also gives ‖QᵀQ − I‖_F of both. Methods are timed side by
side round-robin in one process; the ratio is the median over the rounds of ours / the faster
anchor of that round (``_harness.paired_ratio``). Idle thread pools wait passively
(``benchmarks/__init__.py``), so the libraries do not spin against each other.

``python -m benchmarks.forming [--quick] [--threads N] [--out DIR]``; writes ``forming.md``
(``forming-2threads.md`` for two threads) and the JSON beside it.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np
import scipy.linalg.lapack as la
import torch

import householderla as hl

from . import _harness as H

FULL = {"profile": H.Profile(sample_s=5e-3, min_total=1.0, max_total=8.0, min_rep=5),
        "ns": [256, 512, 1024, 2048, 4096]}  # fmt: skip
QUICK = {"profile": H.Profile(sample_s=0.0, min_total=0.0, max_total=0.2, min_rep=3, max_rep=3),
         "ns": [32, 64]}  # fmt: skip
TARGET = 0.9


def _best_ratio(t: dict[str, dict[str, Any]]) -> float:
    """Median over the rounds of ours / min(dorgqr, householder_product) of the same round."""
    rounds = zip(t["ours"]["times_s"], t["orgqr"]["times_s"], t["torch"]["times_s"], strict=True)
    return statistics.median(o / min(a, b) for o, a, b in rounds)


def rows(b: H.Bench, N: int, dtype: Any) -> list[H.Row]:
    rng = np.random.default_rng(N)
    p = "s" if dtype == np.float32 else "d"
    A = rng.standard_normal((N, N)).astype(dtype)
    a, tau, _, info = getattr(la, p + "geqrf")(A)
    assert info == 0
    orgqr = getattr(la, p + "orgqr")
    lw = 64 * N
    ta, tt = torch.from_numpy(a), torch.from_numpy(tau)
    name = np.dtype(dtype).name
    t = b.side_by_side(
        f"form Q {name} N={N}",
        {
            "orgqr": lambda: orgqr(a, tau, lwork=lw)[0],
            "torch": lambda: torch.linalg.householder_product(ta, tt),
            "ours": lambda: hl.from_lapack(a, tau).matrix(),
        },
    )
    r = _best_ratio(t)
    fast = min(("orgqr", f"scipy {p}orgqr"), ("torch", "torch householder_product"),
               key=lambda k: t[k[0]]["median_s"])  # fmt: skip
    e_ours = H.orth_err(hl.from_lapack(a, tau).matrix())
    e_lapack = H.orth_err(orgqr(a, tau, lwork=lw)[0])
    return [
        H.Row(
            f"form Q from (a, τ), {name} N={N}",
            fast[1],
            H.fmt_t(t[fast[0]]["median_s"]),
            H.fmt_t(t["ours"]["median_s"]),
            f"{r:.2f}×",
            f"≤ {TARGET}×",
            "yes" if r <= TARGET else "NO",
            data={"ratio": r, "timings": t, "orth_ours": e_ours, "orth_lapack": e_lapack},
        ),
        H.Row(
            f"‖QᵀQ−I‖_F, {name} N={N}",
            f"scipy {p}orgqr, same (a, τ)",
            f"{e_lapack:.2e}",
            f"{e_ours:.2e}",
            f"{e_ours / e_lapack:.2f}×",
            "—",
            "",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    p = H.parser(__doc__, "tiny sizes: a smoke test (seconds)")
    p.add_argument("--threads", type=int, default=1, help="BLAS/OpenMP/torch threads")
    args = p.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = H.out_dir(args)
    t0 = time.perf_counter()
    threads = H.limit_threads(args.threads)
    machine = H.machine_info()
    monitor = H.LoadMonitor()
    table: list[H.Row] = []
    with H.Bench(cfg["profile"], 6 * len(cfg["ns"]), "forming") as b:
        for dtype in (np.float64, np.float32):
            for N in cfg["ns"]:
                table += rows(b, N, dtype)
    mline, load = H.run_line(machine, monitor, threads)
    md = H.table_markdown(table, mline, args.quick)
    md += (
        "\nratio = median over the rounds of ours / the faster LAPACK anchor of that round "
        "(samples taken round-robin in one process).\n"
    )
    print(md)
    res = {"machine": machine, "threads": threads, "quick": args.quick, "rows": table,
           "load": load, "wall_s": time.perf_counter() - t0}  # fmt: skip
    stem = "forming" if args.threads == 1 else f"forming-{args.threads}threads"
    H.write(out_dir / f"{stem}.json", res)
    H.write(out_dir / f"{stem}.md", md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
