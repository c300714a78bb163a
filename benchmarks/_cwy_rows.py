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
    rounds_s: float = 0.0,
) -> dict[str, Any]:
    """Time ``fn_of_l(L)`` whose cost is linear in L (sequential reflections) after a pilot
    with ≤ 32 reflectors: skipped, with the reason noted, when one call is predicted to take
    longer than ``skip_s``; a long call (≥ max_total) uses the pilot as its warm-up. With
    ``pair`` (the CWY apply it is compared with), both are timed in the same rounds and
    ``paired_ratio`` is the median over the rounds of time(loop) / time(pair)
    (:func:`~benchmarks._harness.paired_ratio`): a slow spell of the machine during one of
    the two timings no longer moves the speed-up. ``rounds_s``: the paired rounds take at
    least this long together (the profile's ``min_total`` when larger; at most 30 rounds):
    the headline run's 0.2 s gave a 0.13–0.33 s loop three rounds, whose median ratio moved
    by ±10–12% between two-thread runs, and 2 s gave the NumPy loop 11–15 rounds, whose
    ratios to the CWY apply spread 40–80× within one two-thread run."""
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
    if pair is None:
        r = b.time(label, lambda: fn_of_l(L), warmup=not long, max_total=3.0)
    else:
        min_total = max(b.prof.min_total, rounds_s)
        prof = dataclasses.replace(b.prof, max_total=max(3.0, min_total), min_total=min_total)
        b.bar.set_description(label[:48])
        t = H.measure({"loop": lambda: fn_of_l(L), "pair": pair}, prof, warmup=not long)
        b.step(label)
        r = H.paired_times(t, "loop", "pair")
    r.update(predicted_s=est, skipped=False)
    if long:
        r["warmup_s"] = "pilot"
    return r


def time_in_processes(
    b: H.Bench, label: str, shape: tuple[int, int, int], threads: int, processes: int
) -> dict[str, Any]:
    """``hl.householder_apply`` (N, L, B) timed in ``processes`` fresh interpreters one after
    another (``benchmarks/_sequential_probe.py``, which says why), each side by side with the
    reused CWY apply of the same V and h: ``median_s`` is the median of their medians, each
    in ``process_median_s`` (the median, not the mean: a slow spell of the VM during one
    process, 28 and 40 ms against 16–21 ms, moved the mean of eight by up to 12%), and
    ``paired_ratio`` the median of each process's paired ratio loop / CWY apply
    (``process_ratios``). Costs ≈ 2 s a process at the headline shape."""
    b.bar.set_description(label[:48])
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    argv = [*map(str, (*shape, threads)), str(b.prof.max_total)]
    runs = []
    for _ in range(processes):
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks._sequential_probe", *argv],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    b.step(label)
    medians = [r["median_s"] for r in runs]
    ratios = [r["paired_ratio"] for r in runs]
    return {
        "median_s": statistics.median(medians),
        "paired_ratio": statistics.median(ratios),
        "process_ratios": ratios,
        "min_s": min(r["min_s"] for r in runs),
        "processes": processes,
        "process_median_s": medians,
        "statistic": "median over fresh processes of each process's median",
        "skipped": False,
    }


def apply_in_placements(
    b: H.Bench, label: str, V: Any, B: int, placements: int, rng: np.random.Generator
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
    row one draw of that spread (1.08–1.33× over three two-thread runs)."""
    N, L = V.shape
    prof = dataclasses.replace(b.prof, max_rep=max(b.prof.min_rep, b.prof.max_rep // placements))
    b.bar.set_description(label[:48])
    held, runs = [], []
    for p in range(placements):
        Vp = V if p == 0 else V.copy()
        Ur = rng.standard_normal((N, L))
        h = rng.standard_normal((N, B))
        Q = reused(built(hl.cwy(Vp)), h)
        held.append((Q, h, Ur))  # Q holds its copy of V
        runs.append(
            H.measure(
                {"cwy": lambda Q=Q, h=h: Q @ h, "two_gemm": lambda U=Ur, h=h: U @ (U.T @ h)}, prof
            )
        )
    b.step(label, 2)
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
            "placements": placements,
        }
    ratios = [H.paired_ratio(r, "cwy", "two_gemm") for r in runs]
    out["ratio"] = statistics.median(ratios)
    out["placement_ratios"] = ratios
    return out, held[0][0], held[0][1]


def bench_apply(b: H.Bench, cfg: Any, gflops64: float, threads: int) -> list[dict[str, Any]]:
    """(a) CWY apply vs the two GEMMs of the same shapes vs sequential reflections; the Numba
    loop at the headline's L = N shape in ``cfg.seq_processes`` fresh processes
    (:func:`time_in_processes`), elsewhere in this one."""
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
                t, Q, H_ = apply_in_placements(b, f"cwy apply vs 2 GEMMs {tag}", V, B, places, rng)
                t_cwy, t_g2 = t["cwy"], t["two_gemm"]
                apply = lambda Q=Q, H_=H_: Q @ H_  # noqa: E731 - the pair of the loops below
                head = (N, L, B) == (cfg.head_n, cfg.head_n, cfg.head_b)
                rounds_s = cfg.loop_rounds_s if head else 0.0  # more rounds: headline rows
                if head and cfg.seq_processes > 1:
                    t_seq = time_in_processes(
                        b, f"sequential {tag} (processes)", (N, L, B), threads, cfg.seq_processes
                    )
                else:
                    t_seq = time_sequential(
                        b,
                        f"sequential {tag}",
                        lambda k, V=V, H_=H_: hl.householder_apply(V[:, :k], H_),
                        L,
                        cfg.seq_skip_s,
                        pair=apply,
                        rounds_s=rounds_s,
                    )
                t_seq_np = time_sequential(
                    b,
                    f"sequential NumPy loop {tag}",
                    lambda k, V=V, H_=H_: _numpy_loop(hl.householder_apply, V[:, :k], H_),
                    L,
                    cfg.seq_skip_s,
                    pair=apply,
                    rounds_s=rounds_s,
                )
                err = None
                if not t_seq.get("skipped"):
                    err = float(np.max(np.abs(Q @ H_ - hl.householder_apply(V, H_))))
                cw, g2 = t_cwy["median_s"], t_g2["median_s"]
                sq = None if t_seq.get("skipped") else t_seq["median_s"]
                rows.append(
                    {
                        "N": N,
                        "L": L,
                        "B": B,
                        "build": build,
                        "cwy_apply": t_cwy,
                        "two_gemm": t_g2,
                        "sequential": t_seq,
                        "sequential_numpy_loop": t_seq_np,
                        "ratio_cwy_over_two_gemm": t["ratio"],
                        "placement_ratios": t["placement_ratios"],
                        "speedup_cwy_vs_sequential": None if sq is None else t_seq["paired_ratio"],
                        "gemm_eff_cwy_apply": fl_apply(N, L, B) / cw / 1e9 / gflops64,
                        "gemm_eff_two_gemm": fl_two_gemm(N, L, B) / g2 / 1e9 / gflops64,
                        "gemm_eff_build": fl_build(N, L) / build["median_s"] / 1e9 / gflops64,
                        "gemm_eff_sequential": None
                        if sq is None
                        else fl_two_gemm(N, L, B) / sq / 1e9 / gflops64,
                        "max_abs_diff_cwy_vs_sequential": err,
                    }
                )
    return rows


def bench_vjp(b: H.Bench, cfg: Any, gflops64: float) -> dict[str, Any]:
    """(d) explicit VJP of (V, H) ↦ cwy(V) @ H vs the forward from V."""
    N, L, B = cfg.vjp_shape
    rng = np.random.default_rng(5)
    V, H_, G = (rng.standard_normal(s) for s in ((N, L), (N, B), (N, B)))
    t = b.side_by_side(
        f"VJP vs forward N={N} L={L} B={B}",
        {"forward": lambda: hl.cwy(V) @ H_, "vjp": lambda: hl.vjp.cwy_apply(V, H_, G)},
    )
    fwd, vjp = t["forward"], t["vjp"]
    return {
        "N": N,
        "L": L,
        "B": B,
        "forward_from_v": fwd,
        "vjp": vjp,
        "ratio_vjp_over_forward": H.paired_ratio(t, "vjp", "forward"),
        "gemm_eff_forward": (fl_build(N, L) + fl_apply(N, L, B)) / fwd["median_s"] / 1e9 / gflops64,
        "gemm_eff_vjp": fl_vjp(N, L, B) / vjp["median_s"] / 1e9 / gflops64,
    }


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
