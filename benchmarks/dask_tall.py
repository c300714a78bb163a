"""Tall Dask operators and TSQR retractions: peak memory per worker is O(chunk·M), not O(N·M).

V (N, M) and the right-hand sides are generated chunk by chunk (``dask.array.random``), so
nothing but what a task holds is ever in memory. Each row computes one result with the
synchronous scheduler (one task at a time: the process is one worker) under ``tracemalloc``
(NumPy's buffers are traced) and reports the peak against one chunk of V, chunk·M·8 bytes,
at two N and two chunk sizes: the peak must not grow with N and must scale with the chunk.
Measured: the factor pass (norms and Gram by tree reduction), ``tcwy(V) @ x`` (one pass),
``tcwy(V).T @ y`` (one reduction pass), ``cwy(V) @ h`` (two passes, the second over clones),
``qr_retraction`` (TSQR, local Q recomputed) and, as the anchor, the same retraction through
``dask.array.linalg.tsqr``, which keeps every local Q until the small QR is done (N·M).
Wall times are recorded, not judged (they are Dask-overhead dominated at these sizes).

``python -m benchmarks.dask_tall [--quick] [--out DIR]``.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from typing import Any

import numpy as np

import householderla as hl

from . import _harness as H

FULL = {"M": 64, "B": 8, "N": (1_000_000, 4_000_000), "chunks": (50_000, 200_000)}
# --quick: two to eight chunks a case (the smoke run's time is the tasks', under tracemalloc)
QUICK = {"M": 16, "B": 4, "N": (20_000, 40_000), "chunks": (5_000, 10_000)}
#: The scheduler's own bookkeeping (task states, graph), traced too: allowed on top of the chunks
SLACK = 2_000_000


def _peak(build: Any) -> tuple[int, float]:
    """(peak traced bytes, seconds) of computing ``build()`` on the synchronous scheduler."""
    lazy = build()
    gc.collect()
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        lazy.compute(scheduler="synchronous")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, time.perf_counter() - t0


def _anchor_tsqr(X: Any, Z: Any) -> Any:
    """qf(X + tZ) through dask.array.linalg.tsqr (the local Q factors are kept)."""
    import dask.array as da

    Q, R = da.linalg.tsqr(X + 0.1 * Z)
    d = np.sign(np.diag(R.compute()))
    return Q * d


def cases(M: int, B: int) -> dict[str, Any]:
    """name -> function (V, Z, n, chunk) returning the lazy result whose compute is measured."""
    import dask.array as da

    def rand(seed: int, n: int, cols: int, chunk: int) -> Any:
        return da.random.RandomState(seed).standard_normal((n, cols), chunks=(chunk, cols))

    def factors(n: int, chunk: int) -> Any:
        # the factor pass itself, as a lazy object: the same reduction tall_factors computes
        class Lazy:
            def compute(self, scheduler: str) -> Any:
                import dask

                with dask.config.set(scheduler=scheduler):
                    return hl.tcwy(rand(0, n, M, chunk)).factors()

        return Lazy()

    def tcwy_apply(n: int, chunk: int) -> Any:
        op = hl.tcwy(rand(0, n, M, chunk))
        op.factors()
        return (op @ np.ones((M, B))).sum(axis=0)

    def tcwy_t(n: int, chunk: int) -> Any:
        op = hl.tcwy(rand(0, n, M, chunk))
        op.factors()
        return op.T @ rand(1, n, B, chunk)

    def cwy_apply(n: int, chunk: int) -> Any:
        op = hl.cwy(rand(0, n, M, chunk))
        op.factors()
        return (op @ rand(1, n, B, chunk)).sum(axis=0)

    def qr(n: int, chunk: int) -> Any:
        return hl.qr_retraction(rand(0, n, M, chunk), rand(1, n, M, chunk), 0.1).sum(axis=0)

    def anchor(n: int, chunk: int) -> Any:
        return _anchor_tsqr(rand(0, n, M, chunk), rand(1, n, M, chunk)).sum(axis=0)

    return {
        "factors (norms + Gram, tree reduction; T on the client)": factors,
        "tcwy(V) @ x, x (M, B)": tcwy_apply,
        "tcwy(V).T @ y, y (N, B)": tcwy_t,
        "cwy(V) @ h, h (N, B) (two passes)": cwy_apply,
        "qr_retraction(X, Z, t) (TSQR, local Q recomputed)": qr,
        "anchor: qf(X + tZ) by dask.array.linalg.tsqr": anchor,
    }


def main(argv: list[str] | None = None) -> int:
    args = H.parser(__doc__, "small N and chunks: a smoke test (seconds)").parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = H.out_dir(args)
    t0 = time.perf_counter()
    threads = H.limit_threads(1)
    machine = H.machine_info()
    M, B = cfg["M"], cfg["B"]
    table, raw = [], []
    todo = cases(M, B)
    _peak(
        lambda: todo["cwy(V) @ h, h (N, B) (two passes)"](cfg["N"][0], cfg["chunks"][0])
    )  # warm-up
    with H.progress(len(todo) * len(cfg["N"]) * len(cfg["chunks"]), "dask_tall") as bar:
        for name, build in todo.items():
            for chunk in cfg["chunks"]:
                peaks = {}
                for n in cfg["N"]:
                    peak, wall = _peak(lambda b=build, n=n, c=chunk: b(n, c))
                    peaks[n] = peak
                    raw.append({"case": name, "N": n, "chunk": chunk, "M": M, "B": B,
                                "peak_bytes": peak, "wall_s": wall})  # fmt: skip
                    bar.update(1)
                chunk_bytes = chunk * M * 8
                small, large = (peaks[n] for n in cfg["N"])
                grows = large / small
                ok = large <= 12 * chunk_bytes + SLACK and large <= 1.5 * small + SLACK
                table.append(
                    H.Row(
                        f"{name}, M={M}, chunk={chunk:,} rows",
                        f"one chunk of V: {chunk_bytes / 1e6:.1f} MB; V: "
                        f"{cfg['N'][-1] * M * 8 / 1e6:,.0f} MB at N={cfg['N'][-1]:,}",
                        f"N={cfg['N'][0]:,}: {small / 1e6:.1f} MB",
                        f"N={cfg['N'][-1]:,}: {large / 1e6:.1f} MB",
                        f"{large / chunk_bytes:.1f} chunks; ×{grows:.2f} for ×"
                        f"{cfg['N'][-1] // cfg['N'][0]} N",
                        "O(chunk·M): ≤ 12 chunks + 2 MB, no growth with N",
                        "yes" if ok else "NO",
                        data={"peaks": peaks, "chunk_bytes": chunk_bytes},
                    )
                )
    columns = [("measure", "measure"), ("reference", "anchor"), ("peak, small N", "anchor_value"),
               ("peak, large N", "ours"), ("peak / chunk", "ratio"), ("target", "target"),
               ("met", "met")]  # fmt: skip
    mline = H.machine_line(machine, extra=threads)
    md = H.table_markdown(table, mline, args.quick, columns=columns)
    md += (
        "\npeak = tracemalloc's peak of NumPy buffers while the result is computed on the "
        "synchronous scheduler (one worker, one task at a time), including the scheduler's "
        "bookkeeping (hence the 2 MB allowance); a threaded or distributed "
        "worker with k threads holds about k times this. The anchor row is expected to grow "
        "with N: Dask's tsqr keeps every local Q.\n"
    )
    print(md)
    res = {"machine": machine, "threads": threads, "quick": args.quick, "rows": table,
           "raw": raw, "wall_s": time.perf_counter() - t0}  # fmt: skip
    H.write(out_dir / "dask_tall.json", res)
    H.write(out_dir / "dask_tall.md", md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
