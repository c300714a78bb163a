"""Sequential Householder kernels (Numba) vs compact WY on small shapes (CPU, NumPy backend).

Run ``python -m benchmarks.sequential`` (full, a few minutes on 2 cores; writes
``build/bench/sequential.json`` and ``sequential.md``) or
``python -m benchmarks.sequential --quick`` (< 30 s with a warm Numba cache; writes
``build/bench/quick/``). ``--out DIR`` writes elsewhere.

Tables:

1. *Tiny-shape latency*, N = 128, L = 16, one vector, float64 and float32: the Numba kernel
   (``hprod`` of the kernel module, see ``benchmarks/_internals.py``, and the public
   ``hl.householder_apply`` with its argument resolution) vs CWY with precomputed factors
   ``h - U @ (T @ (U.T @ h))`` in NumPy, vs a prebuilt ``hl.cwy(V)`` operator's ``@``, vs
   the pure-NumPy sequential loop (``HL_DISABLE_NUMBA=1``). The same for the VJP (Numba
   ``hgrad`` vs the NumPy sequential VJP vs ``hl.vjp.cwy_apply``). Target: kernel no slower
   than precomputed CWY.
2. *Crossover grid*: N ∈ {32, 64, 128, 256, 512}, L ∈ {4, 16, 64, N}, B ∈ {1, 4, 16, 64}:
   ``apply_sequential(V, h)`` (the Numba kernel behind the public wrapper) vs ``hl.cwy(V) @ h``
   on a fresh operator (factors built in the call) and vs a prebuilt operator (factors cached).
   The constants of ``householder.sequential_is_faster`` are read off this table.
3. *Achieved GFLOP/s* per vector of the trapezoidal forward (FP) and backward (BP, from the
   output, recomputing the states) against Mhammedi et al. (ICML 2017) Table 2's counts,
   FP (4n − m + 2)m and BP (7n − 2m + 3)m (with a stored tape) / (11n − 3m + 5)m (states
   regenerated, as here), and Zhang, Lei & Dhillon (ICML 2018) Table 1's (Hprod 4k and Hgrad
   3n + 6k per reflection of length k).
4. *JIT compile time*: importing the kernel module compiles the three entry kernels for
   float32 and float64 (explicit signatures) or loads them from Numba's on-disk cache; the full run
   also times a cold compile in a subprocess with an empty ``NUMBA_CACHE_DIR``. Compile time is
   never part of the timings above (every method is warmed up first).

Timing (``benchmarks/_harness.py``): one warm-up call, then the calls per sample are
calibrated (``timeit.Timer.autorange``) so that a sample takes ≥ 2 ms (quick: 1 ms); 7 (5)
samples of every method of a row are taken round-robin and the best and the median per call
are reported. The methods that need ``HL_DISABLE_NUMBA=1`` are timed in a group of their own.
On a shared machine re-run when the load line says other processes were busy.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import householderla as hl
from benchmarks import _harness as H
from benchmarks import _internals as I

FULL = {
    "profile": H.Profile(sample_s=2e-3, min_total=0.0, max_total=2.0, min_rep=7, max_rep=7),
    "grid_N": [32, 64, 128, 256, 512],
    "grid_L": [4, 16, 64, "N"],
    "grid_B": [1, 4, 16, 64],
    "grid_dtypes": ["float64", "float32"],
    "flop_shapes": [(128, 16), (128, 127), (512, 64), (512, 511), (1024, 128)],
    "cold_compile": True,
}
QUICK = {
    "profile": H.Profile(sample_s=1e-3, min_total=0.0, max_total=0.5, min_rep=5, max_rep=5),
    "grid_N": [32, 128],
    "grid_L": [4, 16],
    "grid_B": [1, 16],
    "grid_dtypes": ["float64"],
    "flop_shapes": [(128, 16), (128, 127)],
    "cold_compile": False,
}


ENTRY = "numba entry kernel only (fp_kernel, operands prepared)"
HPROD = "numba kernel (kernel module hprod)"


def grid_shapes(cfg: dict[str, Any]) -> list[tuple[int, int, int]]:
    out = []
    for N in cfg["grid_N"]:
        Ls = sorted({N if L == "N" else L for L in cfg["grid_L"]})
        for L in Ls:
            if L <= N:
                out.extend((N, L, B) for B in cfg["grid_B"])
    return out


def load_kernels() -> tuple[Any, dict[str, Any]]:
    """Import the kernel module (compiles, or loads Numba's cache) and time it."""
    s = time.perf_counter()
    nk = I.numba_kernels()

    info: dict[str, Any] = {"import_s": time.perf_counter() - s, "have_numba": nk.HAVE_NUMBA}
    if nk.HAVE_NUMBA:
        import numba

        info["numba"] = numba.__version__
        st = [k.stats for k in I.entry_kernels()]
        info["cache_hits"] = sum(sum(x.cache_hits.values()) for x in st)
        info["cache_misses"] = sum(sum(x.cache_misses.values()) for x in st)
    return nk, info


def cold_compile_s() -> float | None:
    """Seconds to import the kernel module in a fresh interpreter with an empty Numba cache,
    minus the same import with the cache it just wrote (the import of numba itself)."""
    code = (
        f"import time; s=time.perf_counter(); import {I.NUMBA_MODULE}; print(time.perf_counter()-s)"
    )
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, NUMBA_CACHE_DIR=d, PYTHONPATH=str(H.ROOT))
        run = [sys.executable, "-c", code]
        try:
            cold = float(subprocess.run(run, env=env, capture_output=True, check=True).stdout)
            warm = float(subprocess.run(run, env=env, capture_output=True, check=True).stdout)
        except (subprocess.CalledProcessError, ValueError):
            return None
    return cold - warm


# -- 1. tiny-shape latency ---------------------------------------------------------------------


def bench_latency(b: H.Bench, nk: Any, rng: np.random.Generator) -> list:
    rows: list[dict[str, Any]] = []
    for dtype in (np.float64, np.float32):
        rows += _latency_rows(b, nk, rng, np.dtype(dtype))
    return rows


def _latency_rows(b: H.Bench, nk: Any, rng: np.random.Generator, dtype: Any) -> list:
    N, L = 128, 16
    rows = []
    V = rng.standard_normal((N, L)).astype(dtype)
    h = rng.standard_normal(N).astype(dtype)
    g = rng.standard_normal(N).astype(dtype)
    U, T, _ = I.compact_wy().cwy_factors(V, np)
    Q = hl.cwy(V)
    Q @ h  # build and cache the factors
    y = nk.hprod(V, h)
    ref = h - U @ (T @ (U.T @ h))
    V3, H3, Y3 = V[None], h.reshape(1, N, 1), np.empty((1, N, 1), dtype)
    se = nk.SAFE_EXP[np.dtype(dtype)]
    fp_kernel = I.entry_kernels()[0]

    def entry() -> Any:
        fp_kernel(V3, H3, Y3, False, False, se)
        return Y3[0, :, 0]

    fwd: dict[str, tuple[Callable[[], Any], bool]] = {
        ENTRY: (entry, False),
        HPROD: (lambda: nk.hprod(V, h), False),
        "public hl.householder_apply (numba)": (lambda: hl.householder_apply(V, h), False),
        "precomputed CWY: h - U @ (T @ (U.T @ h))": (lambda: h - U @ (T @ (U.T @ h)), False),
        "prebuilt operator: Q @ h": (lambda: Q @ h, False),
        "fresh operator: hl.cwy(V) @ h": (lambda: hl.cwy(V) @ h, False),
        "NumPy sequential loop (HL_DISABLE_NUMBA=1)": (
            lambda: hl.householder_apply(V, h),
            True,
        ),
    }
    bwd: dict[str, tuple[Callable[[], Any], bool]] = {
        "numba hgrad from h (kernel module hgrad)": (lambda: nk.hgrad(V, g, h=h), False),
        "numba hgrad from y": (lambda: nk.hgrad(V, g, y=y), False),
        "public hl.vjp.householder_apply (numba)": (
            lambda: hl.vjp.householder_apply(V, h, g),
            False,
        ),
        "NumPy sequential VJP (HL_DISABLE_NUMBA=1)": (
            lambda: hl.vjp.householder_apply(V, h, g),
            True,
        ),
        "CWY VJP: hl.vjp.cwy_apply": (lambda: hl.vjp.cwy_apply(V, h, g), False),
    }
    for kind, methods in (("forward", fwd), ("vjp", bwd)):
        times, outs = {}, {}
        for disable in (False, True):
            group = {k: fn for k, (fn, d) in methods.items() if d == disable}
            label = f"latency {np.dtype(dtype).name} {kind}" + (" NumPy loop" if disable else "")
            with I.numba_disabled() if disable else contextlib.nullcontext():
                times.update(b.side_by_side(label, group))
                outs.update({k: fn() for k, fn in group.items()})
        for name in methods:
            t, out = times[name], outs[name]
            diff = None
            if kind == "forward":
                diff = float(np.max(np.abs(np.asarray(out, np.float64) - ref)))
            rows.append(
                {
                    "N": N,
                    "L": L,
                    "B": 1,
                    "dtype": np.dtype(dtype).name,
                    "kind": kind,
                    "method": name,
                    "max_abs_diff_vs_cwy": diff,
                    **t,
                }
            )
    return rows


# -- 2. crossover grid -------------------------------------------------------------------------


def bench_grid(b: H.Bench, cfg: dict[str, Any], rng: np.random.Generator) -> list:
    hh = I.householder()
    rows = []
    for dname in cfg["grid_dtypes"]:
        dtype = np.dtype(dname)
        for N, L, B in grid_shapes(cfg):
            V = rng.standard_normal((N, L)).astype(dtype)
            h = rng.standard_normal((N, B) if B > 1 else N).astype(dtype)
            Q = hl.cwy(V)
            Q @ h
            methods = {
                "sequential": lambda V=V, h=h: hh.apply_sequential(V, h),
                "cwy_fresh": lambda V=V, h=h: hl.cwy(V) @ h,
                "cwy_prebuilt": lambda Q=Q, h=h: Q @ h,
            }
            row: dict[str, Any] = {"N": N, "L": L, "B": B, "dtype": dname}
            row.update(b.side_by_side(f"grid {dname} N={N} L={L} B={B}", methods))
            # best-of ratios: on a loaded machine the minimum is the robust statistic
            seq = row["sequential"]["min_s"]
            row["ratio_seq_over_fresh"] = seq / row["cwy_fresh"]["min_s"]
            row["ratio_seq_over_prebuilt"] = seq / row["cwy_prebuilt"]["min_s"]
            med = row["sequential"]["median_s"]
            row["median_ratio_seq_over_fresh"] = med / row["cwy_fresh"]["median_s"]
            row["median_ratio_seq_over_prebuilt"] = med / row["cwy_prebuilt"]["median_s"]
            row["rule_says_sequential_fresh"] = hh.sequential_is_faster(N, L, B, dtype)
            row["rule_says_sequential_prebuilt"] = hh.sequential_is_faster(
                N, L, B, dtype, precomputed=True
            )
            rows.append(row)
    return rows


# -- 3. achieved GFLOP/s -----------------------------------------------------------------------


def flop_counts(n: int, m: int) -> dict[str, int]:
    k = np.arange(n, n - m, -1)  # lengths of the m trapezoidal columns
    return {
        "fp_ornn": (4 * n - m + 2) * m,
        "bp_ornn_tape": (7 * n - 2 * m + 3) * m,
        "bp_ornn_regen": (11 * n - 3 * m + 5) * m,
        "fp_svdrnn": int(np.sum(4 * k)),
        "bp_svdrnn": int(np.sum(3 * n + 6 * k) + np.sum(4 * k)),  # Hgrad + regenerated Hprod
        "fp_ours": int(np.sum(4 * k)),
        "bp_ours": int(np.sum(11 * k)),
    }


def bench_flops(b: H.Bench, cfg: dict[str, Any], nk: Any, rng: np.random.Generator) -> list:
    rows = []
    for n, m in cfg["flop_shapes"]:
        for dtype in (np.float64, np.float32):
            V = np.tril(rng.standard_normal((n, m))).astype(dtype)
            h = rng.standard_normal(n).astype(dtype)
            g = rng.standard_normal(n).astype(dtype)
            y = nk.hprod(V, h, trapezoidal=True)
            t = b.side_by_side(
                f"flops n={n} m={m} {np.dtype(dtype).name}",
                {
                    "fp": lambda V=V, h=h: nk.hprod(V, h, trapezoidal=True),
                    "bp": lambda V=V, g=g, y=y: nk.hgrad(V, g, y=y, trapezoidal=True),
                },
            )
            tf, tb = t["fp"], t["bp"]
            c = flop_counts(n, m)
            rows.append(
                {
                    "n": n,
                    "m": m,
                    "dtype": np.dtype(dtype).name,
                    "fp": tf,
                    "bp": tb,
                    "flops": c,
                    "gflops_fp_ornn": c["fp_ornn"] / tf["min_s"] / 1e9,
                    "gflops_bp_ornn_regen": c["bp_ornn_regen"] / tb["min_s"] / 1e9,
                    "gflops_fp_svdrnn": c["fp_svdrnn"] / tf["min_s"] / 1e9,
                    "gflops_bp_svdrnn": c["bp_svdrnn"] / tb["min_s"] / 1e9,
                }
            )
    return rows


# -- report ------------------------------------------------------------------------------------


def _us(s: float) -> str:
    return f"{s * 1e6:10.2f} µs"


def report(res: dict[str, Any]) -> str:
    jit, frac = res["jit"], res["load"].get("foreign_cpu_fraction")
    out = [
        "# Sequential Householder kernels vs compact WY",
        "",
        f"machine: {H.machine_line(res['machine'])}; numba {jit.get('numba')}; other load "
        "during run " + ("?" if frac is None else f"{100 * frac:.0f}%"),
        "",
        f"JIT: importing the kernel module took {jit['import_s']:.2f} s here "
        f"(cache hits {jit.get('cache_hits')}, misses {jit.get('cache_misses')}); "
        f"cold compile of the three entry kernels × 2 dtypes: "
        + (f"{jit['cold_compile_s']:.1f} s" if jit.get("cold_compile_s") else "not measured"),
        "",
        "## 1. Tiny-shape latency, N = 128, L = 16, one vector (per call)",
        "",
        "| dtype | kind | method | best | median | max abs diff vs CWY |",
        "|---|---|---|---:|---:|---:|",
    ]
    for r in res["latency"]:
        d = "" if r["max_abs_diff_vs_cwy"] is None else f"{r['max_abs_diff_vs_cwy']:.1e}"
        out.append(
            f"| {r['dtype']} | {r['kind']} | {r['method']} | {_us(r['min_s'])} | "
            f"{_us(r['median_s'])} | {d} |"
        )
    out.append("")
    for dt in sorted({r["dtype"] for r in res["latency"]}):
        rows = {r["method"]: r for r in res["latency"] if r["dtype"] == dt}
        c = rows["precomputed CWY: h - U @ (T @ (U.T @ h))"]["min_s"]
        for label, name in (("entry kernel", ENTRY), ("hprod (kernel + NumPy wrapper)", HPROD)):
            k = rows[name]["min_s"]
            out.append(
                f"- {dt}, {label} / precomputed CWY (best of repeats) = {k / c:.2f}: target "
                f"(no slower than CWY) {'met' if k <= c else 'NOT met'}"
            )
    out += [
        "",
        "## 2. Crossover: sequential (Numba) time / CWY time (< 1: sequential faster)",
        "",
        "seq = `householder.apply_sequential(V, h)` (median); ratios of best-of-repeats times. "
        "fresh = `hl.cwy(V) @ h` (factors built in the call); prebuilt = `Q @ h` with cached "
        "factors. Rule = what `sequential_is_faster` says (S = sequential, C = CWY).",
        "",
        "| dtype | N | L | B | seq | /fresh | rule | /prebuilt | rule |",
        "|---|---:|---:|---:|---:|---:|:-:|---:|:-:|",
    ]
    for r in res["grid"]:
        out.append(
            f"| {r['dtype']} | {r['N']} | {r['L']} | {r['B']} | "
            f"{_us(r['sequential']['median_s'])} | {r['ratio_seq_over_fresh']:.2f} | "
            f"{'S' if r['rule_says_sequential_fresh'] else 'C'} | "
            f"{r['ratio_seq_over_prebuilt']:.2f} | "
            f"{'S' if r['rule_says_sequential_prebuilt'] else 'C'} |"
        )
    wrong = [
        r
        for r in res["grid"]
        for key, rule in (
            ("ratio_seq_over_fresh", "rule_says_sequential_fresh"),
            ("ratio_seq_over_prebuilt", "rule_says_sequential_prebuilt"),
        )
        if (r[key] < 1) != r[rule] and abs(r[key] - 1) > 0.25
    ]
    out += [
        "",
        f"cells where the rule picks the path that is > 25% slower: {len(wrong)} "
        f"of {2 * len(res['grid'])}",
        "",
        "## 3. Achieved GFLOP/s per vector, trapezoidal layout (best of repeats)",
        "",
        "FP: Mhammedi et al. (ICML 2017) Table 2 (4n − m + 2)m = "
        "Zhang, Lei & Dhillon (ICML 2018) Table 1 Σ 4k; "
        "BP from the output, states regenerated: Mhammedi et al. (11n − 3m + 5)m, "
        "Zhang et al. Σ (3n + 6k) + Σ 4k.",
        "",
        "| n | m | dtype | FP time | FP GFLOP/s (001) | BP time | BP GFLOP/s (001) | "
        "BP GFLOP/s (002) | BP/FP time |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["flops"]:
        out.append(
            f"| {r['n']} | {r['m']} | {r['dtype']} | {_us(r['fp']['min_s'])} | "
            f"{r['gflops_fp_ornn']:.2f} | {_us(r['bp']['min_s'])} | "
            f"{r['gflops_bp_ornn_regen']:.2f} | {r['gflops_bp_svdrnn']:.2f} | "
            f"{r['bp']['min_s'] / r['fp']['min_s']:.2f} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = H.parser(__doc__, "small grid, a smoke test (< 30 s)").parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = H.out_dir(args)
    t0 = time.perf_counter()
    res: dict[str, Any] = {"machine": H.machine_info(), "quick": args.quick, "config": cfg}
    monitor = H.LoadMonitor()
    nk, res["jit"] = load_kernels()
    if not nk.HAVE_NUMBA:
        print("numba is not installed: nothing to benchmark", file=sys.stderr)
        return 1
    if cfg["cold_compile"]:
        res["jit"]["cold_compile_s"] = cold_compile_s()
    rng = np.random.default_rng(0)
    n_grid = len(grid_shapes(cfg)) * 3 * len(cfg["grid_dtypes"])
    with H.Bench(cfg["profile"], 2 * 12 + n_grid + 4 * len(cfg["flop_shapes"]), "sequential") as b:
        res["latency"] = bench_latency(b, nk, rng)
        res["grid"] = bench_grid(b, cfg, rng)
        res["flops"] = bench_flops(b, cfg, nk, rng)
    res["load"] = monitor.result(res["machine"]["cores_available"])
    res["wall_s"] = time.perf_counter() - t0
    text = report(res)
    print(text)
    print(f"\nwall time {res['wall_s']:.1f} s")
    H.write(out_dir / "sequential.json", res)
    H.write(out_dir / "sequential.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
