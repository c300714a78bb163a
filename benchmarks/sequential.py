"""Sequential Householder kernels (Numba) vs compact WY on small shapes (CPU, NumPy backend).

Run ``python -m benchmarks.sequential`` (full, a few minutes on 2 cores; writes
``benchmarks/results/sequential.json`` and ``sequential.md``) or
``python -m benchmarks.sequential --quick`` (< 30 s with a warm Numba cache; writes
``benchmarks/results/quick/``). ``--out DIR`` writes elsewhere.

Tables:

1. *Tiny-shape latency*, N = 128, L = 16, one vector, float64 and float32: the Numba kernel
   (``_numba_kernels.hprod``, and the public ``hl.householder_apply`` with its argument
   resolution) vs CWY with precomputed factors ``h - U @ (T @ (U.T @ h))`` in NumPy, vs a
   prebuilt ``hl.cwy(V)`` operator's ``@``, vs the pure-NumPy sequential loop
   (``HL_DISABLE_NUMBA=1``). The same for the VJP (Numba ``hgrad`` vs the NumPy sequential
   VJP vs ``hl.vjp.cwy_apply``). Target: kernel no slower than precomputed CWY.
2. *Crossover grid*: N ∈ {32, 64, 128, 256, 512}, L ∈ {4, 16, 64, N}, B ∈ {1, 4, 16, 64}:
   ``apply_sequential(V, h)`` (the Numba kernel behind the public wrapper) vs ``hl.cwy(V) @ h``
   on a fresh operator (factors built in the call) and vs a prebuilt operator (factors cached).
   The constants of ``householder.sequential_is_faster`` are read off this table.
3. *Achieved GFLOP/s* per vector of the trapezoidal forward (FP) and backward (BP, from the
   output, recomputing the states) against seed 001 Table 2's counts, FP (4n − m + 2)m and BP
   (7n − 2m + 3)m (with a stored tape) / (11n − 3m + 5)m (states regenerated, as here), and
   seed 002 Table 1's (Hprod 4k and Hgrad 3n + 6k per reflection of length k).
4. *JIT compile time*: importing the kernel module compiles the three entry kernels for
   float32 and float64 (explicit signatures) or loads them from Numba's on-disk cache; the full run
   also times a cold compile in a subprocess with an empty ``NUMBA_CACHE_DIR``. Compile time is
   never part of the timings above (every method is warmed up first).

Timing: one warm-up call, then the number of calls per sample is calibrated so that a sample
takes ≥ ``sample_s`` (2 ms full, 1 ms quick); ``repeats`` samples (7 / 5) are taken with
``time.perf_counter`` and the best and the median per call are reported. The machine is a
2-core VM shared with other jobs while these numbers were taken: re-run on a quiet machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import householderla as hl  # noqa: E402
from benchmarks.retractions import machine_info as _machine_info  # noqa: E402
from householderla import householder as hh  # noqa: E402
from householderla._compact_wy import cwy_factors  # noqa: E402

try:  # tqdm is a bench extra; fall back to silence without it
    from tqdm import tqdm
except ImportError:  # pragma: no cover
    tqdm = None

FULL = {
    "sample_s": 2e-3,
    "repeats": 7,
    "grid_N": [32, 64, 128, 256, 512],
    "grid_L": [4, 16, 64, "N"],
    "grid_B": [1, 4, 16, 64],
    "grid_dtypes": ["float64", "float32"],
    "flop_shapes": [(128, 16), (128, 127), (512, 64), (512, 511), (1024, 128)],
    "cold_compile": True,
}
QUICK = {
    "sample_s": 1e-3,
    "repeats": 5,
    "grid_N": [32, 128],
    "grid_L": [4, 16],
    "grid_B": [1, 16],
    "grid_dtypes": ["float64"],
    "flop_shapes": [(128, 16), (128, 127)],
    "cold_compile": False,
}


def timeit(fn: Callable[[], Any], sample_s: float, repeats: int) -> dict[str, Any]:
    """Warm-up, calibrate calls per sample to ≥ sample_s, then best/median per call."""
    fn()
    number = 1
    while True:
        s = time.perf_counter()
        for _ in range(number):
            fn()
        dt = time.perf_counter() - s
        if dt >= sample_s or number >= 1 << 20:
            break
        number = min(1 << 20, max(2 * number, int(number * sample_s / max(dt, 1e-9)) + 1))
    per_call = []
    for _ in range(repeats):
        s = time.perf_counter()
        for _ in range(number):
            fn()
        per_call.append((time.perf_counter() - s) / number)
    return {
        "best_s": min(per_call),
        "median_s": statistics.median(per_call),
        "number": number,
        "repeats": repeats,
    }


@contextlib.contextmanager
def numba_disabled() -> Iterator[None]:
    old = os.environ.get("HL_DISABLE_NUMBA")
    os.environ["HL_DISABLE_NUMBA"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["HL_DISABLE_NUMBA"]
        else:
            os.environ["HL_DISABLE_NUMBA"] = old


class Progress:
    def __init__(self, total: int) -> None:
        self.bar = tqdm(total=total, file=sys.stderr, unit="meas") if tqdm else None

    def step(self, label: str) -> None:
        if self.bar is not None:
            self.bar.set_description(label[:40])
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


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
    from householderla import _numba_kernels as nk

    info: dict[str, Any] = {"import_s": time.perf_counter() - s, "have_numba": nk.HAVE_NUMBA}
    if nk.HAVE_NUMBA:
        import numba

        info["numba"] = numba.__version__
        st = [k.stats for k in (nk._fp_kernel, nk._fp_vec_kernel, nk._bp_kernel)]
        info["cache_hits"] = sum(sum(x.cache_hits.values()) for x in st)
        info["cache_misses"] = sum(sum(x.cache_misses.values()) for x in st)
    return nk, info


def cold_compile_s() -> float | None:
    """Seconds to import the kernel module in a fresh interpreter with an empty Numba cache,
    minus the same import with the cache it just wrote (the import of numba itself)."""
    code = (
        "import time; s=time.perf_counter(); import householderla._numba_kernels; "
        "print(time.perf_counter()-s)"
    )
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, NUMBA_CACHE_DIR=d, PYTHONPATH=str(ROOT))
        run = [sys.executable, "-c", code]
        try:
            cold = float(subprocess.run(run, env=env, capture_output=True, check=True).stdout)
            warm = float(subprocess.run(run, env=env, capture_output=True, check=True).stdout)
        except (subprocess.CalledProcessError, ValueError):
            return None
    return cold - warm


# -- 1. tiny-shape latency ---------------------------------------------------------------------


def bench_latency(cfg: dict[str, Any], nk: Any, rng: np.random.Generator, pr: Progress) -> list:
    rows: list[dict[str, Any]] = []
    for dtype in (np.float64, np.float32):
        rows += _latency_rows(cfg, nk, rng, pr, np.dtype(dtype))
    return rows


def _latency_rows(
    cfg: dict[str, Any], nk: Any, rng: np.random.Generator, pr: Progress, dtype: Any
) -> list:
    N, L = 128, 16
    rows = []
    V = rng.standard_normal((N, L)).astype(dtype)
    h = rng.standard_normal(N).astype(dtype)
    g = rng.standard_normal(N).astype(dtype)
    U, T, _ = cwy_factors(V, np)
    Q = hl.cwy(V)
    Q @ h  # build and cache the factors
    y = nk.hprod(V, h)
    ref = h - U @ (T @ (U.T @ h))
    V3, H3, Y3 = V[None], h.reshape(1, N, 1), np.empty((1, N, 1), dtype)
    se = nk.SAFE_EXP[np.dtype(dtype)]

    def entry() -> Any:
        nk._fp_kernel(V3, H3, Y3, False, False, se)
        return Y3[0, :, 0]

    fwd: dict[str, tuple[Callable[[], Any], bool]] = {
        "numba entry kernel only (_fp_kernel, operands prepared)": (entry, False),
        "numba kernel (_numba_kernels.hprod)": (lambda: nk.hprod(V, h), False),
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
        "numba hgrad from h (_numba_kernels.hgrad)": (lambda: nk.hgrad(V, g, h=h), False),
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
        for name, (fn, disable) in methods.items():
            pr.step(f"latency {np.dtype(dtype).name} {name}")
            ctx = numba_disabled() if disable else contextlib.nullcontext()
            with ctx:
                t = timeit(fn, cfg["sample_s"], cfg["repeats"])
                out = fn()
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


def bench_grid(cfg: dict[str, Any], rng: np.random.Generator, pr: Progress) -> list:
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
            for name, fn in methods.items():
                pr.step(f"grid {dname} N={N} L={L} B={B} {name}")
                row[name] = timeit(fn, cfg["sample_s"], cfg["repeats"])
            # best-of ratios: on a loaded machine the minimum is the robust statistic
            seq = row["sequential"]["best_s"]
            row["ratio_seq_over_fresh"] = seq / row["cwy_fresh"]["best_s"]
            row["ratio_seq_over_prebuilt"] = seq / row["cwy_prebuilt"]["best_s"]
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
        "fp_seed001": (4 * n - m + 2) * m,
        "bp_seed001_tape": (7 * n - 2 * m + 3) * m,
        "bp_seed001_regen": (11 * n - 3 * m + 5) * m,
        "fp_seed002": int(np.sum(4 * k)),
        "bp_seed002": int(np.sum(3 * n + 6 * k) + np.sum(4 * k)),  # Hgrad + regenerated Hprod
        "fp_ours": int(np.sum(4 * k)),
        "bp_ours": int(np.sum(11 * k)),
    }


def bench_flops(cfg: dict[str, Any], nk: Any, rng: np.random.Generator, pr: Progress) -> list:
    rows = []
    for n, m in cfg["flop_shapes"]:
        for dtype in (np.float64, np.float32):
            V = np.tril(rng.standard_normal((n, m))).astype(dtype)
            h = rng.standard_normal(n).astype(dtype)
            g = rng.standard_normal(n).astype(dtype)
            y = nk.hprod(V, h, trapezoidal=True)
            pr.step(f"flops n={n} m={m} FP")
            tf = timeit(lambda V=V, h=h: nk.hprod(V, h, trapezoidal=True), **_tk(cfg))
            pr.step(f"flops n={n} m={m} BP")
            tb = timeit(
                lambda V=V, g=g, y=y: nk.hgrad(V, g, y=y, trapezoidal=True),
                **_tk(cfg),
            )
            c = flop_counts(n, m)
            rows.append(
                {
                    "n": n,
                    "m": m,
                    "dtype": np.dtype(dtype).name,
                    "fp": tf,
                    "bp": tb,
                    "flops": c,
                    "gflops_fp_seed001": c["fp_seed001"] / tf["best_s"] / 1e9,
                    "gflops_bp_seed001_regen": c["bp_seed001_regen"] / tb["best_s"] / 1e9,
                    "gflops_fp_seed002": c["fp_seed002"] / tf["best_s"] / 1e9,
                    "gflops_bp_seed002": c["bp_seed002"] / tb["best_s"] / 1e9,
                }
            )
    return rows


def _tk(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"sample_s": cfg["sample_s"], "repeats": cfg["repeats"]}


# -- report ------------------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    """The shared machine record plus the BLAS thread setting (the kernels are single-threaded,
    the CWY side is not)."""
    info = _machine_info()
    info["openblas_num_threads"] = os.environ.get("OPENBLAS_NUM_THREADS")
    return info


def _us(s: float) -> str:
    return f"{s * 1e6:10.2f} µs"


def report(res: dict[str, Any]) -> str:
    m, jit = res["machine"], res["jit"]
    out = [
        "# Sequential Householder kernels vs compact WY",
        "",
        f"machine: {m['cpu_model']}, {m['cpu_count']} cores, numpy {m['numpy']} ({m['blas']}), "
        f"numba {jit.get('numba')}, load at start {m['loadavg_at_start']}, "
        f"load at end {res.get('loadavg_at_end')}",
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
            f"| {r['dtype']} | {r['kind']} | {r['method']} | {_us(r['best_s'])} | "
            f"{_us(r['median_s'])} | {d} |"
        )
    out.append("")
    for dt in sorted({r["dtype"] for r in res["latency"]}):
        rows = {r["method"]: r for r in res["latency"] if r["dtype"] == dt}
        c = rows["precomputed CWY: h - U @ (T @ (U.T @ h))"]["best_s"]
        for label, name in (
            ("entry kernel", "numba entry kernel only (_fp_kernel, operands prepared)"),
            ("hprod (kernel + NumPy wrapper)", "numba kernel (_numba_kernels.hprod)"),
        ):
            k = rows[name]["best_s"]
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
        "FP: seed 001 Table 2 (4n − m + 2)m = seed 002 Table 1 Σ 4k; "
        "BP from the output, states regenerated: seed 001 (11n − 3m + 5)m, "
        "seed 002 Σ (3n + 6k) + Σ 4k.",
        "",
        "| n | m | dtype | FP time | FP GFLOP/s (001) | BP time | BP GFLOP/s (001) | "
        "BP GFLOP/s (002) | BP/FP time |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["flops"]:
        out.append(
            f"| {r['n']} | {r['m']} | {r['dtype']} | {_us(r['fp']['best_s'])} | "
            f"{r['gflops_fp_seed001']:.2f} | {_us(r['bp']['best_s'])} | "
            f"{r['gflops_bp_seed001_regen']:.2f} | {r['gflops_bp_seed002']:.2f} | "
            f"{r['bp']['best_s'] / r['fp']['best_s']:.2f} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small grid, a smoke test (< 30 s)")
    ap.add_argument("--out", type=Path, default=None, help="output directory")
    args = ap.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = args.out or ROOT / "benchmarks" / "results" / ("quick" if args.quick else "")
    t0 = time.perf_counter()
    res: dict[str, Any] = {"machine": machine_info(), "quick": args.quick, "config": cfg}
    nk, res["jit"] = load_kernels()
    if not nk.HAVE_NUMBA:
        print("numba is not installed: nothing to benchmark", file=sys.stderr)
        return 1
    if cfg["cold_compile"]:
        res["jit"]["cold_compile_s"] = cold_compile_s()
    rng = np.random.default_rng(0)
    n_grid = len(grid_shapes(cfg)) * 3 * len(cfg["grid_dtypes"])
    pr = Progress(2 * 12 + n_grid + 4 * len(cfg["flop_shapes"]))
    try:
        res["latency"] = bench_latency(cfg, nk, rng, pr)
        res["grid"] = bench_grid(cfg, rng, pr)
        res["flops"] = bench_flops(cfg, nk, rng, pr)
    finally:
        pr.close()
    res["loadavg_at_end"] = os.getloadavg()
    res["wall_s"] = time.perf_counter() - t0
    text = report(res)
    print(text)
    print(f"\nwall time {res['wall_s']:.1f} s")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "sequential.json").write_text(json.dumps(res, indent=1, default=str))
    (out_dir / "sequential.md").write_text(text + "\n")
    print(f"wrote {out_dir / 'sequential.json'} and sequential.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
