"""Headline benchmark of householderla (CPU, NumPy backend, float64 unless stated).

Run ``python -m benchmarks.run`` (full, a few minutes on 2 cores) or
``python -m benchmarks.run --quick`` (tiny sizes, a smoke test). See benchmarks/README.md for
what every row measures and the targets it is held to.

The rows are measured in benchmarks/_cwy_rows.py ((a) apply, (d) VJP, the efficiency plot)
and benchmarks/_forming_rows.py ((b) forming Q, (c) accuracy, (e) memory); timing, machine
record, table writers and plots come from benchmarks/_harness.py. Every row's methods are
timed side by side (``_harness.measure``). Sequential reference paths first time a short
pilot (the first few reflectors) and are skipped, with the reason printed and stored, when a
single run is predicted to exceed ``seq_skip_s`` seconds.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks import _cwy_rows as A
from benchmarks import _forming_rows as F
from benchmarks import _harness as H


@dataclass
class Config:
    quick: bool
    profile: H.Profile
    seq_skip_s: float  # skip a sequential reference run predicted to take longer than this
    forming_rounds: int  # paired rounds of each anchor of the headline's forming row, spread
    spread_rounds: int  # paired rounds of the headline's NumPy loop and VJP, spread over the run
    seq_processes: int  # fresh processes timing the headline's Numba loop, spread over the run
    gemm_n: int
    apply_ns: list[int]
    apply_l_fracs: list[int]  # L = N // frac
    apply_bs: list[int]
    apply_placements: int  # fresh operands per apply row (_cwy_rows.apply_in_placements)
    head_placements: int  # the same for the headline's apply rows (N, L, B) and (N, N, B)
    head_n: int  # headline apply row (N, L, B)
    head_l: int
    head_b: int
    form_ns: list[int]  # forming Q (plot and rows); the largest is the headline
    acc_ns: list[int]
    vjp_shape: tuple[int, int, int]
    mem_n: int
    mem_m: int
    mem_dense_ns: list[int]
    eff_n: int
    eff_ls: list[int]
    eff_bs: list[int]
    extra: dict[str, Any] = field(default_factory=dict)


FULL = Config(
    quick=False,
    profile=H.Profile(sample_s=2e-3, min_total=0.2, max_total=2.0, max_rep=30),
    seq_skip_s=20.0,
    forming_rounds=10,
    spread_rounds=30,
    seq_processes=16,
    gemm_n=1024,
    apply_ns=[256, 1024, 2048],
    apply_l_fracs=[8, 4, 1],
    apply_bs=[1, 64],
    apply_placements=5,
    head_placements=15,
    head_n=1024,
    head_l=256,
    head_b=64,
    form_ns=[128, 256, 512, 1024],
    acc_ns=[256, 1024],
    vjp_shape=(1024, 256, 64),
    mem_n=30000,
    mem_m=50,
    mem_dense_ns=[2000, 4000, 8000],
    eff_n=1024,
    eff_ls=[32, 64, 128, 256, 512, 1024],
    eff_bs=[1, 16, 64, 256],
)

QUICK = Config(
    quick=True,
    profile=H.Profile(sample_s=0.0, min_total=0.01, max_total=0.1, max_rep=10),
    seq_skip_s=2.0,
    forming_rounds=2,
    spread_rounds=3,
    seq_processes=1,
    gemm_n=256,
    apply_ns=[32, 128],
    apply_l_fracs=[8, 4, 1],
    apply_bs=[1, 8],
    apply_placements=2,
    head_placements=2,
    head_n=128,
    head_l=32,
    head_b=8,
    form_ns=[32, 64, 128],
    acc_ns=[64, 128],
    vjp_shape=(128, 32, 8),
    mem_n=2000,
    mem_m=10,
    mem_dense_ns=[250, 500, 1000],
    eff_n=128,
    eff_ls=[8, 16, 32, 64, 128],
    eff_bs=[1, 16],
)


def planned_measurements(c: Config) -> int:
    """Number of progress-bar steps (one per timed method or memory measurement)."""
    n_nl = len(c.apply_ns) * len(c.apply_l_fracs)
    n_apply = n_nl * len(c.apply_bs) * 4 + n_nl  # (cwy, 2-gemm, 2 seq) per (N, L, B) + build
    n_form = len(c.form_ns) * 7  # three pairs and the sequential loop
    n_acc = 2 * len(c.acc_ns) * 2  # (float32, float64) × N × (ours, LAPACK)
    n_vjp = 2
    n_mem = 3 + len(c.mem_dense_ns) + 2
    n_eff = len(c.eff_ls) * len(c.eff_bs) * 2
    return 5 + n_apply + n_form + n_acc + n_vjp + n_mem + n_eff


# -- headline ----------------------------------------------------------------------------------
def fmt_b(b: float) -> str:
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= k:
            return f"{b / k:.3g} {unit}"
    return f"{b:.0f} B"


def fmt_eff(e: float | None) -> str:
    return "—" if e is None else f"{100 * e:.0f}%"


def _find(rows: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    for r in rows:
        if all(r.get(k) == v for k, v in kw.items()):
            return r
    raise KeyError(kw)


def _ratio_cell(r: float | None) -> str:
    return "—" if r is None else H.fmt_ratio(r)


def _le(x: float) -> str:
    """Target text "≤ x×" of a ratio ours / anchor."""
    return f"≤ {x:.3g}×"


def headline(res: dict[str, Any], cfg: Config) -> list[H.Row]:
    """The headline rows. Every ratio is ours / anchor (lower is better): a row whose anchor
    was once compared as a speed-up (anchor / ours, "35.4× faster") shows its inverse (the
    same statistic: 1 / the median of the paired speed-ups, not the median of the inverses,
    which for an even number of rounds differs), and so does its target ("≥ 20× faster"
    reads "≤ 0.05×"). ``Row.data`` of a row with a ratio:
    ``ratio_ours_over_anchor`` (the figure in the table), ``target_max`` (met: ratio ≤ it;
    None where the target is on another figure, named in ``target_on``), ``timed`` (a ratio
    of two times: what ``benchmarks/reproduce.py`` reads) and ``ratio``, the figure as earlier
    versions stored it (anchor / ours for the speed-up rows), kept for older readers."""
    rows: list[H.Row] = []
    N, L, B = cfg.head_n, cfg.head_l, cfg.head_b

    def add(measure, anchor, anchor_v, ours_v, r, target, eff, met, *, tmax=None, on=None,
            timed=True, legacy=None, cell=None):  # fmt: skip
        data: dict[str, Any] = {}
        if r is not None:
            data = {"ratio_ours_over_anchor": r, "target_max": tmax, "timed": timed}
            if on is not None:
                data["target_on"] = on
            if timed:
                data["ratio"] = r if legacy is None else legacy
        if met is None:
            met_s = ""
        else:
            met_s = "yes" if met else "NO"
        cell = _ratio_cell(r) if cell is None else cell
        rows.append(H.Row(measure, anchor, anchor_v, ours_v, cell, target, met_s, eff, data))

    def add_vs_two_gemms(measure, row, target, met, tmax=None, on=None):
        r = row["ratio_cwy_over_two_gemm"]
        add(
            measure,
            "two GEMMs (numpy)",
            H.fmt_t(row["two_gemm"]["median_s"]),
            H.fmt_t(row["cwy_apply"]["median_s"]),
            r,
            target,
            f"{fmt_eff(row['gemm_eff_cwy_apply'])} (2-GEMM {fmt_eff(row['gemm_eff_two_gemm'])})",
            met,
            tmax=tmax,
            on=on,
        )

    a = _find(res["apply"], N=N, L=L, B=B)
    r = a["ratio_cwy_over_two_gemm"]
    add_vs_two_gemms(f"CWY apply N={N} L={L} B={B}", a, _le(1.15), r <= 1.15, tmax=1.15)
    add(
        f"CWY build cwy(V) (U, T) N={N} L={L}",
        "—",
        "—",
        H.fmt_t(a["build"]["median_s"]),
        None,
        "—",
        fmt_eff(a["gemm_eff_build"]),
        None,
    )
    s = _find(res["apply"], N=N, L=N, B=B)
    eff = s["gemm_eff_cwy_apply"]
    add_vs_two_gemms(
        f"CWY apply L=N={N} B={B} (reused)", s, "GEMM eff. ≥ 85%", eff >= 0.85, on="gemm_efficiency"
    )
    # both loops' rounds are spread over the run (_cwy_rows.bench_apply). The NumPy loop's
    # 30 rounds share one placement: its figure is the fastest CWY apply it was paired with
    # over the fastest loop (the time nothing slowed down). The Numba loop's samples are
    # sixteen processes, each its own placement: the median of their paired ratios (the
    # fastest process is the luckiest placement, which moved ±12% between runs).
    for key, anchor, fastest in (
        ("sequential_numpy_loop", "sequential reflections, NumPy loop", True),
        ("sequential", "sequential reflections, Numba kernel", False),
    ):
        seq = s[key]
        skipped = seq.get("skipped")
        if skipped:
            r = legacy = None
            times = ("skipped", H.fmt_t(s["cwy_apply"]["median_s"]))
        elif fastest:
            r, legacy = seq["pair_min_s"] / seq["min_s"], seq["ratio_of_minima"]
            times = (H.fmt_t(seq["min_s"]), H.fmt_t(seq["pair_min_s"]))
        else:
            r, legacy = 1.0 / seq["paired_ratio"], seq["paired_ratio"]
            times = (H.fmt_t(seq["median_s"]), H.fmt_t(s["cwy_apply"]["median_s"]))
        add(
            f"CWY apply L=N={N} B={B} (reused)" + (", fastest rounds" if fastest else ""),
            anchor,
            *times,
            r,
            _le(0.05),
            fmt_eff(s["gemm_eff_cwy_apply"]),
            None if r is None else r <= 0.05,
            tmax=0.05,
            legacy=legacy,
        )
    f = res["forming_q"][-1]
    Nf = f["N"]
    rl = f["ratio_lapack_reflectors_ours_over_orgqr"]
    add(
        f"form Q, LAPACK reflectors N={Nf}",
        "torch householder_product (orgqr)",
        H.fmt_t(f["lapack_orgqr"]["median_s"]),
        H.fmt_t(f["cwy_matrix_lapack_reflectors"]["median_s"]),
        rl,
        _le(1.0),
        f"{fmt_eff(f['gemm_eff_cwy_matrix_lapack_reflectors'])} "
        f"(orgqr {fmt_eff(f['gemm_eff_orgqr'])})",
        rl <= 1.0,
        tmax=1.0,
    )
    for key, name, tmax in (
        ("expm", "scipy expm (skew)", 1 / 3),
        ("cayley_solve", "Cayley by scipy solve", 1.0),
    ):
        sp = f["speedup_vs_expm" if key == "expm" else "speedup_vs_cayley"]
        r = 1.0 / sp
        add(
            f"CWY matrix dense V N=L={Nf}",
            name,
            H.fmt_t(f[key]["median_s"]),
            H.fmt_t(f["cwy_matrix"]["median_s"]),
            r,
            _le(tmax),
            fmt_eff(f["gemm_eff_cwy_matrix"]),
            r <= tmax,
            tmax=tmax,
            legacy=sp,
        )
    seqf = f["sequential"]
    sp = f["speedup_vs_sequential"]
    r = None if sp is None else 1.0 / sp
    add(
        f"CWY matrix dense V N=L={Nf}",
        "sequential householder_product",
        "skipped" if seqf.get("skipped") else H.fmt_t(seqf["median_s"]),
        H.fmt_t(f["cwy_matrix"]["median_s"]),
        r,
        "—",
        fmt_eff(f["gemm_eff_cwy_matrix"]),
        None,
        legacy=sp,
    )
    v = res["vjp"]
    rv = v["ratio_vjp_over_forward"]
    add(
        f"VJP cwy_apply N={v['N']} L={v['L']} B={v['B']}",
        "forward cwy(V) @ H",
        H.fmt_t(v["forward_from_v"]["median_s"]),
        H.fmt_t(v["vjp"]["median_s"]),
        rv,
        _le(3.0),
        fmt_eff(v["gemm_eff_vjp"]),
        rv <= 3,
        tmax=3.0,
    )
    Na = cfg.acc_ns[-1]
    for dt in ("float32", "float64"):
        c = _find(res["accuracy"], dtype=dt, N=Na)
        ratio = c["ratio_ours_over_lapack"]
        if dt == "float32":
            tgt, met, tmax, on = _le(1.0), ratio <= 1.0, 1.0, None
        else:
            tgt, met, tmax, on = "ours ≤ 1e-13", c["orth_err_ours"] <= 1e-13, None, "ours"
        add(
            f"‖QᵀQ−I‖_F {dt} N={Na}",
            "LAPACK orgqr, same reflectors",
            f"{c['orth_err_lapack']:.2e}",
            f"{c['orth_err_ours']:.2e}",
            ratio,
            tgt,
            "—",
            met,
            tmax=tmax,
            on=on,
            timed=False,
        )
    c = _find(res["accuracy"], dtype="float64", N=Na)
    d = c["max_abs_diff_ours_vs_lapack"]
    add(
        f"max|Q_ours − Q_LAPACK| float64 N={Na}",
        "—",
        "—",
        f"{d:.2e}",
        None,
        "ours ≤ 1e-13",
        "—",
        d <= 1e-13,
    )
    m = res["memory"]
    rm = m["ratio_ours_over_dense"]
    add(
        f"peak memory T-CWY tcwy(V)@x N={m['N']} M={m['M']}",
        "N×N intermediate (8·N² B, analytic)",
        fmt_b(m["dense_nxn_bytes_analytic"]),
        fmt_b(m["ours_build_and_apply_peak_bytes"]),
        rm,
        "ours ≤ 10·8NM B: O(N·M)",
        "—",
        m["ours_in_units_of_nm_bytes"] <= 10,
        on="ours",
        timed=False,
        cell=f"{rm:.1e}× ({m['ours_in_units_of_nm_bytes']:.1f}·8NM B)",
    )
    return rows


#: The columns of the headline table: (header, ``Row`` field).
HEADLINE_COLUMNS = [
    ("measure", "measure"),
    ("anchor", "anchor"),
    ("anchor time/value", "anchor_value"),
    ("ours", "ours"),
    ("ours / anchor (lower is better)", "ratio"),
    ("target", "target"),
    ("GEMM eff.", "gemm_efficiency"),
    ("met", "met"),
]

#: One line per column of the headline table, printed under it and written under it in
#: headline.md (``legend``); a test checks that every column has one.
LEGEND = {
    "measure": "what is timed or measured, at the shape named (N rows, L reflectors, B right-"
    "hand columns; float64 NumPy on CPU unless stated)",
    "anchor": "what ours is compared with: the bare GEMMs of the same shapes, the loop of "
    "reflections, LAPACK, SciPy (— : no anchor, the row is ours alone)",
    "anchor time/value": "the anchor's median time per call (or its error, or its bytes)",
    "ours": "householderla's median time per call (or its error, or its peak bytes)",
    "ours / anchor (lower is better)": "every ratio is ours / anchor, timed side by side in "
    "the same run (the median over the rounds of the per-round ratio; 'fastest rounds': the "
    "fastest of ours over the fastest of the anchor); below 1 ours is faster, more accurate "
    "or smaller",
    "target": "the project's target for this row (benchmarks/README.md, Targets): a bound on "
    "the ratio (≤ x×) unless it names another column (GEMM eff., ours); — : none",
    "GEMM eff.": "useful flops / time / this run's float64 GEMM rate (benchmarks/README.md, "
    "Method; in brackets: the anchor's)",
    "met": "yes: this run meets the target; NO: this run's figure misses the project's "
    "target (not an error of the run); blank: the row has no target",
}


def legend(columns: list[tuple[str, str]] = HEADLINE_COLUMNS) -> str:
    """The legend printed under the headline table: one line per column."""
    lines = ["Legend (every ratio is ours / anchor: lower is better):"]
    lines += [f"  {h}: {LEGEND[h]}" for h, _ in columns]
    return "\n".join(lines)


def legend_markdown(columns: list[tuple[str, str]] = HEADLINE_COLUMNS) -> str:
    """The legend under the table in headline.md: a list, one item per column."""
    lines = ["Every ratio is ours / anchor: lower is better.", ""]
    lines += [f"- **{h}**: {LEGEND[h]}" for h, _ in columns]
    return "\n".join(lines) + "\n"


# -- main --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = H.parser(__doc__, "tiny sizes: a smoke test (< 30 s)")
    p.add_argument("--name", default=None, help="machine tag of the JSON file (default: hostname)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="BLAS/OpenMP/torch threads; 0: every core. Default 1: one-thread runs reproduce "
        "within a few percent, while with two threads OpenBLAS stalls between consecutive calls "
        "on the 2-core VM and the same row moves by up to 2x from run to run",
    )
    args = p.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out = H.out_dir(args)

    import torch

    machine = H.machine_info()
    if args.threads:
        machine["thread_limit"] = H.limit_threads(args.threads)
    else:
        torch.set_num_threads(machine["cores_available"] or 1)
    machine["torch_threads"] = torch.get_num_threads()
    t_start = time.perf_counter()
    probe = H.LoadMonitor()  # the machine's load over half a second before we start
    time.sleep(0.5)
    busy = probe.result(machine["cores_available"]).get("foreign_cpu_fraction")
    machine["idle_fraction_before_start"] = None if busy is None else 1.0 - busy
    if busy is not None and busy > 0.2:
        print(
            f"warning: the machine is busy before we start ({100 * busy:.0f}% of its CPU "
            "used by other processes); timings will be pessimistic and noisy",
            file=sys.stderr,
        )
    monitor = H.LoadMonitor()
    res: dict[str, Any] = {"config": asdict(cfg), "machine": machine}
    with H.Bench(cfg.profile, planned_measurements(cfg), "headline") as b:
        g = H.gemm_rates(b, cfg.gemm_n)
        g.update(A.blas_stall_check(b))
        res["gemm_gflops"] = g
        res["vjp"] = A.bench_vjp(b, cfg, g["float64"])  # its rounds spread over the run
        res["apply"] = A.bench_apply(b, cfg, g["float64"], args.threads)
        res["forming_q"] = F.bench_forming_q(b, cfg, g["float64"])
        res["accuracy"] = F.bench_accuracy(b, cfg)
        res["memory"] = F.bench_memory(b, cfg)
        res["cwy_apply_efficiency"] = A.bench_efficiency(b, cfg, g["float64"])
        b.drain()  # the last rounds of the rows spread over the run (Bench.spread)
    notes = b.notes
    stall = g["blas_back_to_back_stall_s"]
    if stall > 1e-3:
        notes.append(
            f"note: a {g['blas_pair_check']['n']}² GEMM followed by a triangular solve took "
            f"{1e3 * stall:.1f} ms more than the two alone: threaded BLAS stalls between "
            "consecutive calls on this machine (inflates multi-call routines, ours and the "
            "anchors'); compare with OPENBLAS_NUM_THREADS=1"
        )
    res["notes"] = notes
    res["load"] = monitor.result(machine["cores_available"])
    warn = H.load_warning(res["load"])
    if warn:
        notes.append(warn)
    res["total_runtime_s"] = time.perf_counter() - t_start

    frac = res["load"].get("foreign_cpu_fraction")
    mline = H.machine_line(machine, g)
    if frac is not None:
        mline += f"; other load during run {100 * frac:.0f}%"
    rows = headline(res, cfg)
    res["headline"] = rows
    print(("[--quick sizes] " if cfg.quick else "") + mline)
    print(H.table_text(rows, HEADLINE_COLUMNS))
    print(legend())
    for n in notes:
        print(n)

    host = args.name or re.sub(r"[^A-Za-z0-9._-]", "_", machine["hostname"] or "") or "local"
    for name in (f"cpu-{host}.json", "latest.json"):
        H.write(out / name, res)
    md = H.table_markdown(rows, mline, cfg.quick, HEADLINE_COLUMNS)
    md += "\n" + legend_markdown()
    H.write(out / "headline.md", md)
    if not args.no_plots:
        F.plot_forming_q(res["forming_q"], out / "forming_q_vs_n.png", mline)
        A.plot_efficiency(res["cwy_apply_efficiency"], out / "cwy_apply_efficiency.png", mline)
    print(f"total runtime {time.perf_counter() - t_start:.1f} s; results in {H.shown(out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
