"""Rows (a) CWY apply, (d) VJP and the apply-efficiency plot of the headline run
(``python -m benchmarks.run``); not a script. Imports the harness and the public API only."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import scipy.linalg as sla

import householderla as hl
from benchmarks import _harness as H
from benchmarks._internals import numba_disabled


# -- flop models (useful flops; README "Method") -----------------------------------------------
def fl_apply(N: int, L: int, B: int) -> float:
    return 4.0 * N * L * B + L * L * B


def fl_two_gemm(N: int, L: int, B: int) -> float:
    return 4.0 * N * L * B


def fl_build(N: int, L: int) -> float:
    return N * L * L + L**3 / 3.0


def fl_vjp(N: int, L: int, B: int) -> float:
    return fl_build(N, L) + 8.0 * N * L * B + 2.0 * N * L * L


def blas_stall_check(b: H.Bench) -> dict[str, Any]:
    """Back-to-back BLAS calls: on small VMs threaded OpenBLAS can stall for whole scheduler
    ticks between consecutive calls (a GEMM followed by a triangular solve is the pattern of
    our build), which inflates every multi-call routine, ours and the anchors' alike; measured
    so that a run records whether it was affected (README "Method")."""
    m = 256
    rng = np.random.default_rng(1)
    A = rng.standard_normal((m, m))
    S, eye = np.triu(A) / m + np.eye(m), np.eye(m)

    def trsm() -> Any:
        return sla.solve_triangular(S, eye, check_finite=False)

    one = b.time(f"BLAS stall check N={m} (GEMM)", lambda: A @ A)["median_s"]
    tri = b.time(f"BLAS stall check N={m} (trsm)", trsm)["median_s"]
    two = b.time(f"BLAS stall check N={m} (GEMM+trsm)", lambda: (A @ A, trsm()))["median_s"]
    return {
        "blas_pair_check": {"n": m, "gemm_s": one, "trsm_s": tri, "gemm_then_trsm_s": two},
        "blas_back_to_back_stall_s": max(0.0, two - one - tri),
    }


def built(op: Any) -> Any:
    """``op`` with its factors U and T computed (operators compute them on first use)."""
    op.U  # noqa: B018 - property access forces the factors
    op.T_factor  # noqa: B018
    return op


def reused(op: Any, h: Any) -> Any:
    """``op`` after the products of a loop (an RNN's steps, an iterative solver) have
    multiplied N columns: a plain product then runs with W = U T or the dense Q
    (``LazyFactors.product_factor``; the switch's one-off cost is in the first N columns).
    The N columns go in as one product (the switch counts columns, not calls): for h of one
    column at N = L = 2048, N products took 6.2 s, which the five placements of an apply row
    (:func:`apply_in_placements`) would pay five times."""
    n = op.shape[-1]
    op @ np.ones((n, n), dtype=h.dtype)
    return op


def _numpy_loop(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` with the Numba kernels switched off (the Array API loop of reflections)."""
    with numba_disabled():
        return fn(*args)


def time_sequential(
    b: H.Bench,
    label: str,
    fn_of_l: Callable[[int], Any],
    L: int,
    skip_s: float,
    pair: Callable[[], Any] | None = None,
    spread_rounds: int = 0,
    then: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Time ``fn_of_l(L)`` whose cost is linear in L (sequential reflections) after a pilot
    with ≤ 32 reflectors: skipped, with the reason noted, when one call is predicted to take
    longer than ``skip_s``; a long call (≥ max_total) uses the pilot as its warm-up. With
    ``pair`` (the CWY apply it is compared with), both are timed in the same rounds and
    ``paired_ratio`` is the median over the rounds of time(loop) / time(pair)
    (:func:`~benchmarks._harness.paired_ratio`): a slow spell of the machine during one of
    the two timings no longer moves the speed-up.

    ``spread_rounds`` (with ``pair``): that many paired rounds, spread over the rest of the run
    (:meth:`~benchmarks._harness.Bench.spread`) instead of back to back; the returned dict is
    filled in when the last has run (``round_at_s``: when each began), and then ``then(row)``
    is called. Four seconds of consecutive rounds gave the two-thread NumPy loop at
    N = L = 1024 ratios of 64–81× over three runs, as its speed drifted over seconds."""
    lp = min(L, 32)
    pilot = math.inf
    for _ in range(2):  # a second pilot when the first may have paid a first-call cost (JIT)
        s = time.perf_counter()
        fn_of_l(lp)
        pilot = min(pilot, time.perf_counter() - s)
        if pilot < 0.05:
            break
    est = pilot * L / lp
    if est > skip_s:
        b.note(
            f"[skip] {label}: one run predicted at {est:.1f} s "
            f"(pilot {lp} reflectors: {pilot:.3f} s) > {skip_s:.0f} s"
        )
        b.step(label)
        return {"skipped": True, "predicted_s": est, "reason": "predicted single run too long"}
    long = est >= b.prof.max_total
    if pair is not None and spread_rounds > 0:
        job = H.SpreadRounds({"loop": lambda: fn_of_l(L), "pair": pair}, b.prof, warmup=not long)
        r = {"predicted_s": est, "skipped": False, "spread_rounds": spread_rounds}

        def fill(_: list[Any]) -> dict[str, Any]:
            t = job.result()
            return {
                **H.paired_times(t, "loop", "pair"),
                "pair_min_s": t["pair"]["min_s"],
                "ratio_of_minima": t["loop"]["min_s"] / t["pair"]["min_s"],
            }

        return b.spread(label, job, spread_rounds, fill, r, then)
    if pair is None:
        r = b.time(label, lambda: fn_of_l(L), warmup=not long, max_total=3.0)
    else:
        prof = dataclasses.replace(b.prof, max_total=max(3.0, b.prof.min_total))
        b.bar.set_description(label[:48])
        t = H.measure({"loop": lambda: fn_of_l(L), "pair": pair}, prof, warmup=not long)
        b.step(label)
        r = H.paired_times(t, "loop", "pair")
    r.update(predicted_s=est, skipped=False)
    if long:
        r["warmup_s"] = "pilot"
    return r


def _probe_process(shape: tuple[int, int, int], threads: int, max_total: float) -> dict[str, Any]:
    """One run of ``benchmarks/_sequential_probe.py`` in a fresh interpreter: its JSON."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    argv = [*map(str, (*shape, threads)), str(max_total)]
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks._sequential_probe", *argv],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def _processes_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    medians = [r["median_s"] for r in runs]
    ratios = [r["paired_ratio"] for r in runs]
    mins = [r["min_s"] for r in runs]
    pair_mins = [min(r["pair_times_s"]) for r in runs]
    return {
        "median_s": statistics.median(medians),
        "paired_ratio": statistics.median(ratios),
        "ratio_of_minima": min(mins) / min(pair_mins),
        "process_ratios": ratios,
        "min_s": min(mins),
        "pair_min_s": min(pair_mins),
        "processes": len(runs),
        "process_median_s": medians,
        "process_min_s": mins,
        "process_pair_min_s": pair_mins,
        "statistic": "median over fresh processes of each process's median",
        "skipped": False,
    }


def time_in_processes(
    b: H.Bench,
    label: str,
    shape: tuple[int, int, int],
    threads: int,
    processes: int,
    then: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """``hl.householder_apply`` (N, L, B) timed in ``processes`` fresh interpreters
    (``benchmarks/_sequential_probe.py``, which says why), one at a time spread over the rest
    of the run (:meth:`~benchmarks._harness.Bench.spread`; ``round_at_s``: when each began),
    each side by side with the reused CWY apply of the same V and h: ``median_s`` is the
    median of their medians, each in ``process_median_s`` (the median, not the mean: a slow
    spell of the VM during one process, 28 and 40 ms against 16–21 ms, moved the mean of
    eight by up to 12%), and ``paired_ratio`` the median of each process's paired ratio
    loop / CWY apply (``process_ratios``). The returned dict is filled in when the last
    process has ended, and then ``then(row)`` is called. Costs ≈ 2 s a process at the headline
    shape."""
    probe = lambda i: _probe_process(shape, threads, b.prof.max_total)  # noqa: E731
    return b.spread(label, probe, processes, _processes_summary, {"skipped": False}, then)


def _placement(
    V: Any, B: int, p: int, prof: H.Profile, rng: np.random.Generator
) -> tuple[dict[str, Any], tuple[Any, Any, Any]]:
    """One placement of :func:`apply_in_placements`: (its paired times, (Q, h, Uᵣ))."""
    N, L = V.shape
    Vp = V if p == 0 else V.copy()
    Ur = rng.standard_normal((N, L))
    h = rng.standard_normal((N, B))
    Q = reused(built(hl.cwy(Vp)), h)  # Q holds its copy of V
    fns = {"cwy": lambda: Q @ h, "two_gemm": lambda: Ur @ (Ur.T @ h)}
    return H.measure(fns, prof), (Q, h, Ur)


def _placements_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in ("cwy", "two_gemm"):
        times = [x for r in runs for x in r[k]["times_s"]]
        out[k] = {
            "median_s": statistics.median(times),
            "min_s": min(times),
            "repeats": len(times),
            "loops": [r[k]["loops"] for r in runs],
            "warmup_s": runs[0][k]["warmup_s"],
            "times_s": times,
            "placements": len(runs),
        }
    ratios = [H.paired_ratio(r, "cwy", "two_gemm") for r in runs]
    out["ratio"] = statistics.median(ratios)
    out["placement_ratios"] = ratios
    return out


def apply_in_placements(
    b: H.Bench,
    label: str,
    V: Any,
    B: int,
    placements: int,
    rng: np.random.Generator,
    spread: bool = False,
    then: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[dict[str, Any], Any, Any]:
    """The reused CWY apply Q h (Q = ``hl.cwy(V)``, h N × B) side by side with the two bare
    GEMMs Uᵣ (Uᵣᵀ h) of the same shapes (Uᵣ N × L), in ``placements`` placements: each a
    fresh operator (its U and W built again), Uᵣ and h, all held until the row is done so
    that each lands in new memory, timed in ``max_rep / placements`` rounds. Returns
    (times, Q, h) of the first placement: ``times["cwy"]`` / ``["two_gemm"]`` pool every
    placement's samples (``median_s`` their median), ``ratio`` is the median over the
    placements of each one's paired ratio (``placement_ratios``).

    Why: at N = 1024, L = 256, B = 64 (one thread) the paired ratio of one placement is
    steady from round to round (quartiles within ±3%), but eight placements in one process
    read 1.11–1.33×: where U, W, Uᵣ and h land in memory (the VM's pages, which the cache
    sets follow) moves both products by up to 20%. One placement per row made the headline
    row one draw of that spread (1.08–1.33× over three two-thread runs).

    ``spread``: the first placement is timed now, the others one at a time spread over the
    rest of the run (:meth:`~benchmarks._harness.Bench.spread`; ``round_at_s``: when each
    began); the returned times are filled in when the last has run, and then ``then(times)``
    is called. Fifteen placements timed back to back (about a second) moved together from run
    to run: at two threads 1.00–1.14× and 1.00–1.19× over three runs, the fifteen of one run
    mostly 1.10–1.22×, of the next mostly 0.95–1.02×."""
    prof = dataclasses.replace(b.prof, max_rep=max(b.prof.min_rep, b.prof.max_rep // placements))
    b.bar.set_description(label[:48])
    first, held0 = _placement(V, B, 0, prof, rng)
    held = [held0]

    def run(i: int) -> dict[str, Any]:
        t, operands = _placement(V, B, i + 1, prof, rng)
        held.append(operands)
        return t

    if not spread:
        runs = [first] + [run(i) for i in range(placements - 1)]
        b.step(label, 2)
        return _placements_summary(runs), held0[0], held0[1]

    def fill(runs: list[dict[str, Any]]) -> dict[str, Any]:
        held.clear()
        return _placements_summary([first, *runs])

    b.step(label)  # the CWY apply's step; the anchor's when the last placement has run
    out = b.spread(label, run, placements - 1, fill, then=then)
    return out, held0[0], held0[1]


def _sequential_fields(row: dict[str, Any], gflops64: float) -> None:
    """The row's figures of its Numba loop (``row["sequential"]``), once that is timed."""
    t_seq = row["sequential"]
    sq = None if t_seq.get("skipped") else t_seq["median_s"]
    N, L, B = row["N"], row["L"], row["B"]
    row["speedup_cwy_vs_sequential"] = None if sq is None else t_seq["paired_ratio"]
    row["gemm_eff_sequential"] = None if sq is None else fl_two_gemm(N, L, B) / sq / 1e9 / gflops64


def _apply_fields(row: dict[str, Any], t: dict[str, Any], gflops64: float) -> None:
    """The row's figures of its CWY apply and two GEMMs (:func:`apply_in_placements`'s
    ``t``), once they are timed."""
    N, L, B = row["N"], row["L"], row["B"]
    row.update(
        cwy_apply=t["cwy"],
        two_gemm=t["two_gemm"],
        ratio_cwy_over_two_gemm=t["ratio"],
        placement_ratios=t["placement_ratios"],
        gemm_eff_cwy_apply=fl_apply(N, L, B) / t["cwy"]["median_s"] / 1e9 / gflops64,
        gemm_eff_two_gemm=fl_two_gemm(N, L, B) / t["two_gemm"]["median_s"] / 1e9 / gflops64,
    )
    if "round_at_s" in t:  # spread placements: when each after the first began
        row["placement_at_s"] = t["round_at_s"]


def bench_apply(b: H.Bench, cfg: Any, gflops64: float, threads: int) -> list[dict[str, Any]]:
    """(a) CWY apply vs the two GEMMs of the same shapes vs sequential reflections. The
    headline's rows are spread over the rest of the run
    (:meth:`~benchmarks._harness.Bench.spread`): the placements of its two apply rows
    (N, N/4, B) and (N, N, B), and at L = N the NumPy loop's ``cfg.spread_rounds`` paired
    rounds and the Numba loop's ``cfg.seq_processes`` fresh processes
    (:func:`time_in_processes`); their rows are complete when the run's bench is drained."""
    rng = np.random.default_rng(2)
    rows = []
    for N in cfg.apply_ns:
        for frac in cfg.apply_l_fracs:
            L = max(1, N // frac)
            V = rng.standard_normal((N, L))
            build = b.time(f"build N={N} L={L}", lambda V=V: built(hl.cwy(V)))
            for B in cfg.apply_bs:
                tag = f"N={N} L={L} B={B}"
                # the headline rows (N, N/4, B) and (N, N, B): more placements (a row's
                # figure is the median of their ratios, which spread 0.94-1.21x at L = N/4)
                head_nb = (N, B) == (cfg.head_n, cfg.head_b) and L in (cfg.head_l, N)
                places = cfg.head_placements if head_nb else cfg.apply_placements
                row: dict[str, Any] = {"N": N, "L": L, "B": B, "build": build}
                t, Q, H_ = apply_in_placements(
                    b,
                    f"cwy apply vs 2 GEMMs {tag}",
                    V,
                    B,
                    places,
                    rng,
                    spread=head_nb,
                    then=lambda t, row=row: _apply_fields(row, t, gflops64),
                )
                apply = lambda Q=Q, H_=H_: Q @ H_  # noqa: E731 - the pair of the loops below
                head = (N, L, B) == (cfg.head_n, cfg.head_n, cfg.head_b)
                if head:
                    t_seq = time_in_processes(
                        b,
                        f"sequential {tag} (processes)",
                        (N, L, B),
                        threads,
                        cfg.seq_processes,
                        then=lambda _, row=row: _sequential_fields(row, gflops64),
                    )
                else:
                    t_seq = time_sequential(
                        b,
                        f"sequential {tag}",
                        lambda k, V=V, H_=H_: hl.householder_apply(V[:, :k], H_),
                        L,
                        cfg.seq_skip_s,
                        pair=apply,
                    )
                t_seq_np = time_sequential(
                    b,
                    f"sequential NumPy loop {tag}",
                    lambda k, V=V, H_=H_: _numpy_loop(hl.householder_apply, V[:, :k], H_),
                    L,
                    cfg.seq_skip_s,
                    pair=apply,
                    spread_rounds=cfg.spread_rounds if head else 0,
                )
                err = None
                if not t_seq.get("skipped"):
                    err = float(np.max(np.abs(Q @ H_ - hl.householder_apply(V, H_))))
                row.update(
                    {
                        "sequential": t_seq,
                        "sequential_numpy_loop": t_seq_np,
                        "gemm_eff_build": fl_build(N, L) / build["median_s"] / 1e9 / gflops64,
                        "max_abs_diff_cwy_vs_sequential": err,
                    }
                )
                if not t.get("pending"):
                    _apply_fields(row, t, gflops64)
                if not t_seq.get("pending"):
                    _sequential_fields(row, gflops64)
                rows.append(row)
    return rows


def bench_vjp(b: H.Bench, cfg: Any, gflops64: float) -> dict[str, Any]:
    """(d) explicit VJP of (V, H) ↦ cwy(V) @ H vs the forward from V, in ``cfg.spread_rounds``
    paired rounds spread over the rest of the run (:meth:`~benchmarks._harness.Bench.spread`):
    the returned dict is complete when the run's bench is drained. At two threads its 13–20
    consecutive rounds of one run had read 0.94–3.22× and the median of three runs
    1.81–2.11×."""
    N, L, B = cfg.vjp_shape
    rng = np.random.default_rng(5)
    V, H_, G = (rng.standard_normal(s) for s in ((N, L), (N, B), (N, B)))
    label = f"VJP vs forward N={N} L={L} B={B}"
    b.bar.set_description(label[:48])
    job = H.SpreadRounds(
        {"forward": lambda: hl.cwy(V) @ H_, "vjp": lambda: hl.vjp.cwy_apply(V, H_, G)}, b.prof
    )
    b.step(label)  # the forward's step; the VJP's when its last round has run

    def fill(_: list[Any]) -> dict[str, Any]:
        t = job.result()
        fwd, vjp = t["forward"], t["vjp"]
        return {
            "forward_from_v": fwd,
            "vjp": vjp,
            "ratio_vjp_over_forward": H.paired_ratio(t, "vjp", "forward"),
            "gemm_eff_forward": (fl_build(N, L) + fl_apply(N, L, B))
            / fwd["median_s"]
            / 1e9
            / gflops64,
            "gemm_eff_vjp": fl_vjp(N, L, B) / vjp["median_s"] / 1e9 / gflops64,
        }

    return b.spread(label, job, cfg.spread_rounds, fill, {"N": N, "L": L, "B": B})


def bench_efficiency(b: H.Bench, cfg: Any, gflops64: float) -> list[dict[str, Any]]:
    """CWY apply GEMM efficiency vs L and B at fixed N (plot ii)."""
    N = cfg.eff_n
    rng = np.random.default_rng(7)
    rows = []
    for L in cfg.eff_ls:
        V = rng.standard_normal((N, L))
        Ur = rng.standard_normal((N, L))
        for B in cfg.eff_bs:
            H_ = rng.standard_normal((N, B))
            Q = reused(built(hl.cwy(V)), H_)
            t = b.side_by_side(
                f"eff N={N} L={L} B={B}",
                {"cwy": lambda Q=Q, H_=H_: Q @ H_, "2gemm": lambda Ur=Ur, H_=H_: Ur @ (Ur.T @ H_)},
            )
            c, g = t["cwy"]["median_s"], t["2gemm"]["median_s"]
            rows.append(
                {
                    "N": N,
                    "L": L,
                    "B": B,
                    "cwy_apply_s": c,
                    "two_gemm_s": g,
                    "gemm_eff_cwy_apply": fl_apply(N, L, B) / c / 1e9 / gflops64,
                    "gemm_eff_two_gemm": fl_two_gemm(N, L, B) / g / 1e9 / gflops64,
                }
            )
    return rows


def plot_efficiency(rows: list[dict[str, Any]], path: Path, mline: str) -> None:
    plt = H.pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    Bs = sorted({r["B"] for r in rows})
    Ls = sorted({r["L"] for r in rows})
    for i, B in enumerate(Bs):
        sub = sorted((r for r in rows if r["B"] == B), key=lambda r: r["L"])
        x = [r["L"] for r in sub]
        ax.plot(x, [100 * r["gemm_eff_cwy_apply"] for r in sub], "o-", color=f"C{i}",
                label=f"CWY apply, B={B}")  # fmt: skip
        ax.plot(x, [100 * r["gemm_eff_two_gemm"] for r in sub], ":", color=f"C{i}", alpha=0.7,
                label=f"two GEMMs, B={B}")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xticks(Ls, [str(x) for x in Ls])
    ax.set_xlabel("L (number of reflectors)")
    ax.set_ylabel("GEMM efficiency [% of the float64 GEMM rate]")
    ax.set_title(f"CWY apply efficiency, N={rows[0]['N']}, float64", fontsize=11)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    H.save_figure(fig, path, mline)
