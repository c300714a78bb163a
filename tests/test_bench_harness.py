"""The benchmark harness's own bookkeeping (``benchmarks/``): the load monitor counts the fresh
processes a benchmark starts as its own CPU time, and the probe that times the Numba loop of
reflections in such a process reports a timing of the call it names. Timings themselves are
never asserted (README, "Speed is measured, not asserted in tests")."""

from __future__ import annotations

import contextlib
import io
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tqdm", reason="the benchmark harness's progress bars (bench extra)")
pytest.importorskip("threadpoolctl", reason="the benchmark harness limits threads (bench extra)")

pytestmark = pytest.mark.no_dask("the harness times NumPy calls, no Dask operand")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import _harness as H  # noqa: E402
from benchmarks import _sequential_probe  # noqa: E402

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"


def test_load_monitor_counts_a_child_process_as_its_own():
    """A child that burns 0.4 s of CPU: the monitor's own CPU time includes it, so it is not
    reported as other processes' load (the old monitor counted this process only: the
    headline's eight probe processes read as 8–10% other load)."""
    mon = H.LoadMonitor()
    subprocess.run([sys.executable, "-c", BURN], check=True)
    r = mon.result(1)
    # 0.4 s burnt, minus the clock's granularity. (Foreign load is not asserted: another
    # test worker on the same cores is foreign load, as it should be.)
    assert r["own_cpu_s"] >= 0.35, r


def test_sequential_probe_reports_a_timing_of_the_named_shape(monkeypatch):
    calls = []
    import householderla as hl

    real = hl.householder_apply

    def spy(V, h):
        calls.append((V.shape, h.shape))
        return real(V, h)

    monkeypatch.setattr(hl, "householder_apply", spy)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        # threads 0: no limit (a limit would stay on this test process)
        assert _sequential_probe.main(["48", "40", "3", "0", "0.05"]) == 0
    r = json.loads(out.getvalue())
    assert r["median_s"] > 0 and r["min_s"] <= r["median_s"]
    assert len(r["times_s"]) >= 1
    assert ((48, 40), (48, 3)) in calls  # the timed call has the shape asked for
    assert calls[0] == ((48, 32), (48, 3))  # the warm-up loads the kernels on ≤ 32 reflectors
    # the CWY apply was timed in the same rounds, and the ratio is the median of the rounds'
    pairs = [a / b for a, b in zip(r["times_s"], r["pair_times_s"], strict=True)]
    assert r["paired_ratio"] == statistics.median(pairs)


def test_time_sequential_pairs_the_loop_with_its_cwy_apply():
    """``time_sequential(..., pair=)`` times the loop and the apply in the same rounds and
    reports the median of their per-round ratios (not the ratio of the medians), one
    progress step; without ``pair`` no ratio."""
    from benchmarks._cwy_rows import time_sequential

    prof = H.Profile(sample_s=0.0, min_total=0.0, max_total=0.2, min_rep=5, max_rep=5)
    loop_calls, pair_calls = [], []
    with H.Bench(prof, 2, "test") as b:
        r = time_sequential(
            b, "loop", loop_calls.append, 40, 10.0, pair=lambda: pair_calls.append(1)
        )
        assert b.bar.n == 1
        plain = time_sequential(b, "loop", loop_calls.append, 40, 10.0)
    pairs = [x / y for x, y in zip(r["times_s"], r["pair_times_s"], strict=True)]
    assert len(pairs) == 5 and r["paired_ratio"] == statistics.median(pairs)
    assert 40 in loop_calls and len(pair_calls) >= 5
    assert "paired_ratio" not in plain


def test_apply_in_placements_pools_fresh_operands():
    """The apply row is timed on ``placements`` fresh operands, each held until the row is
    done (so the next lands in other memory): ``ratio`` is the median of each placement's
    paired ratio, the samples are pooled, the first placement's Q applies the reflectors of
    V to its h, and the row takes the two progress steps of its two methods."""
    import numpy as np

    import householderla as hl
    from benchmarks._cwy_rows import apply_in_placements

    rng = np.random.default_rng(0)
    V = rng.standard_normal((16, 4))
    V0 = V.copy()
    prof = H.Profile(sample_s=0.0, min_total=0.0, max_total=0.2, min_rep=3, max_rep=9)
    with H.Bench(prof, 2, "test") as b:
        t, Q, h = apply_in_placements(b, "apply", V, 3, 3, rng)
        assert b.bar.n == 2
    assert len(t["placement_ratios"]) == 3
    assert t["ratio"] == statistics.median(t["placement_ratios"])
    assert t["cwy"]["repeats"] == len(t["cwy"]["times_s"]) == len(t["two_gemm"]["times_s"]) == 9
    assert t["cwy"]["median_s"] == statistics.median(t["cwy"]["times_s"])
    assert h.shape == (16, 3)
    np.testing.assert_allclose(Q @ h, hl.householder_apply(V, h), rtol=0, atol=1e-13)
    np.testing.assert_array_equal(V, V0)


def test_reproduce_reports_each_ratios_spread_across_runs():
    """``benchmarks/reproduce.py`` reads the timed ratios of each run's headline rows (rows
    without a ratio, like the accuracy rows, are left out), and a ratio whose runs deviate
    from their mean by more than 10% is marked as missing the target, per thread count."""
    from benchmarks import reproduce as R

    def latest(a: float, b: float) -> dict:
        # the loop row's legacy ``ratio`` is its speed-up anchor / ours: never read
        loop = {"ratio_ours_over_anchor": b, "timed": True, "ratio": 1 / b}
        rows = [
            {"measure": "apply", "anchor": "two GEMMs", "data": {"ratio": a}},  # older run.py
            {"measure": "loop", "anchor": "Numba", "data": loop},
            {"measure": "‖QᵀQ−I‖", "anchor": "LAPACK", "data": {}},
            {"measure": "‖QᵀQ−I‖ f32", "anchor": "LAPACK", "data": {
                "ratio_ours_over_anchor": 0.1, "timed": False}},
        ]  # fmt: skip
        return {"headline": rows}

    one = [R.timed_ratios(latest(1.0, 5.0)), R.timed_ratios(latest(1.1, 5.1))]
    two = [R.timed_ratios(latest(1.0, 9.0)), R.timed_ratios(latest(1.0, 12.0))]
    assert one[0] == {"apply / two GEMMs": 1.0, "loop / Numba": 5.0}
    rows = R.summary({1: one, 2: two})
    by = {r["ratio"]: r for r in rows}
    # 1.0 and 1.1: mean 1.05, deviation 0.05 / 1.05 = 4.8%; 9 and 12: 1.5 / 10.5 = 14.3%
    assert by["apply / two GEMMs"]["1thread"]["spread"] == pytest.approx(0.05 / 1.05)
    assert by["apply / two GEMMs"]["1thread"]["met"]
    assert by["loop / Numba"]["2threads"]["spread"] == pytest.approx(1.5 / 10.5)
    assert not by["loop / Numba"]["2threads"]["met"]
    md = R.markdown(rows, [1, 2], "test machine")
    assert "9.00–12.0× (±14.3%) ✗" in md and "1thread 2 of 2, 2threads 1 of 2" in md
    assert "| ours / anchor |" in md and "lower is better" in md


def test_spread_runs_a_rows_rounds_between_the_other_rows_until_drained():
    """``Bench.spread``: the rounds run one at a time at evenly spaced progress steps of the
    rest of the run (the first at the next step), never inside another row; the returned row
    stays marked ``pending`` until the last has run, then ``fill`` gets the rounds' results,
    the row gets its fields and the rounds' start times, ``then`` gets the row, and the row
    takes one progress step; ``drain`` runs what is left, and leaving the ``with`` block
    drains."""
    log: list[str] = []
    got: list[list] = []
    seen: list[dict] = []

    def fill(out: list) -> dict:
        got.append(out)
        return {"sum": sum(out)}

    with H.Bench(H.Profile(), 11, "test") as b:
        b.step("first")  # step 1 of 11: ten steps left for four rounds
        row = b.spread(
            "row", lambda i: log.append(f"r{i}") or i * i, 4, fill, {"k": 1}, seen.append
        )
        assert row == {"k": 1, "pending": True}
        for k in range(2, 8):
            log.append(f"s{k}")
            b.step(f"s{k}")
        # due at steps 1 + i * 10 // 4 = 1, 3, 6, 8: each runs after the step reaching it
        assert log == ["s2", "r0", "s3", "r1", "s4", "s5", "s6", "r2", "s7"]
        assert not got and row["pending"] and b.bar.n == 7
        b.drain()
        assert log[-1] == "r3" and b.bar.n == 8  # the row's own step
        assert got == [[0, 1, 4, 9]] and seen == [row] and "pending" not in row
        at = row["round_at_s"]
        assert row["k"] == 1 and row["sum"] == 14 and len(at) == 4 and at == sorted(at)
        late = b.spread("late", lambda i: log.append(f"late{i}"), 2, lambda o: {"n": len(o)})
        assert late["pending"]
    assert log[-2:] == ["late0", "late1"] and late["n"] == 2  # drained by __exit__
    assert "pending" not in late


def test_spread_rounds_rewarm_the_short_method_before_its_sample():
    """``SpreadRounds``: a round times every method once, alternating their order as
    ``measure`` does; a method shorter than ``rewarm_s`` gets an untimed call right before
    its sample (other rows ran since the last round), a longer one does not."""
    import time

    calls: list[str] = []

    def slow() -> None:
        calls.append("slow")
        time.sleep(0.02)

    prof = H.Profile(sample_s=0.0, max_total=1.0)
    job = H.SpreadRounds({"slow": slow, "fast": lambda: calls.append("fast")}, prof, rewarm_s=0.01)
    calls.clear()  # warm-up and calibration
    job(0)
    job(1)
    # (with two methods both rounds run in the same order: round 1 starts one later, backwards)
    assert calls == ["slow", "fast", "fast", "slow", "fast", "fast"]
    r = job.result()
    assert r["slow"]["repeats"] == len(r["fast"]["times_s"]) == 2
    assert min(r["slow"]["times_s"]) >= 0.02 > max(r["fast"]["times_s"])


def test_time_sequential_spread_fills_its_row_when_drained():
    """``time_sequential(..., spread_rounds=)`` returns a pending row that the last of its
    rounds fills in (the paired ratio the median of the rounds' ratios, one sample each), and
    then calls ``then``."""
    from benchmarks._cwy_rows import time_sequential

    prof = H.Profile(sample_s=0.0, min_total=0.0, max_total=0.2, min_rep=5, max_rep=5)
    filled = []
    with H.Bench(prof, 3, "test") as b:
        r = time_sequential(
            b, "loop", lambda k: None, 40, 10.0, pair=lambda: None, spread_rounds=7,
            then=lambda row: filled.append(dict(row)),
        )  # fmt: skip
        assert r["pending"] and "paired_ratio" not in r and b.bar.n == 0
        b.step("other")
        assert r["pending"]  # rounds due at steps 0, 0, 0, 1, 1, 2, 2: five of seven ran
    assert "pending" not in r and len(filled) == 1 and b.bar.n == 2
    pairs = [x / y for x, y in zip(r["times_s"], r["pair_times_s"], strict=True)]
    assert len(pairs) == 7 and r["paired_ratio"] == statistics.median(pairs)
    assert len(r["round_at_s"]) == 7 and filled[0]["paired_ratio"] == r["paired_ratio"]
    # the headline's figure: the fastest loop over the fastest apply
    assert r["ratio_of_minima"] == min(r["times_s"]) / min(r["pair_times_s"])


def test_time_in_processes_spread_runs_one_process_a_round(monkeypatch):
    """``time_in_processes``: one fresh process per round of the spread
    row; the summary (the median over the processes, and the fastest loop over the fastest
    apply) is filled in when the last has run."""
    from benchmarks import _cwy_rows as A

    results = iter(
        {"median_s": m, "min_s": m / 2, "paired_ratio": 10 * m, "pair_times_s": [m / 4, m]}
        for m in (3.0, 1.0, 2.0, 5.0)
    )
    shapes = []

    def fake_probe(shape, threads, max_total):
        shapes.append((shape, threads))
        return next(results)

    monkeypatch.setattr(A, "_probe_process", fake_probe)
    then = []
    with H.Bench(H.Profile(), 8, "test") as b:
        r = A.time_in_processes(b, "p", (8, 8, 2), 1, 4, then=then.append)
        assert r["pending"] and not shapes
        b.step("other")
        assert len(shapes) == 1  # one process at the next step
    assert shapes == [((8, 8, 2), 1)] * 4 and then == [r]
    assert r["median_s"] == 2.5 and r["paired_ratio"] == 25.0 and r["min_s"] == 0.5
    assert r["process_ratios"] == [30.0, 10.0, 20.0, 50.0] and len(r["round_at_s"]) == 4
    # fastest loop (1.0 / 2) over fastest CWY apply (1.0 / 4), each over all processes
    assert r["ratio_of_minima"] == 2.0 and r["process_pair_min_s"] == [0.75, 0.25, 0.5, 1.25]


def test_apply_in_placements_spread_times_the_first_now_and_the_rest_later():
    """``apply_in_placements(..., spread=True)``: the first placement is timed at once (its
    Q and h come back for the loops' pairs), the others as rounds spread over the run; the
    pooled figures are filled in with ``then`` once the last has run."""
    import numpy as np

    import householderla as hl
    from benchmarks._cwy_rows import apply_in_placements

    rng = np.random.default_rng(0)
    V = rng.standard_normal((16, 4))
    prof = H.Profile(sample_s=0.0, min_total=0.0, max_total=0.2, min_rep=3, max_rep=9)
    seen = []
    with H.Bench(prof, 6, "test") as b:
        t, Q, h = apply_in_placements(b, "apply", V, 3, 3, rng, spread=True, then=seen.append)
        assert t["pending"] and b.bar.n == 1  # the CWY apply's step
        np.testing.assert_allclose(Q @ h, hl.householder_apply(V, h), rtol=0, atol=1e-13)
        b.step("other")  # rounds due at steps 1 and 3: the second placement runs
        assert t["pending"] and not seen
    assert seen == [t] and "pending" not in t and b.bar.n == 3
    assert len(t["placement_ratios"]) == 3 and len(t["round_at_s"]) == 2
    assert t["ratio"] == statistics.median(t["placement_ratios"])
    assert t["cwy"]["repeats"] == len(t["two_gemm"]["times_s"]) == 9


# -- the headline table: one direction, targets, legend ----------------------------------------
RESULTS = ROOT / "benchmarks" / "results"


def _seconds(cell: str) -> float:
    """A time cell of the table (``_harness.fmt_t``) in seconds."""
    value, unit = cell.split()
    return float(value) * {"µs": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


def _headline_rows() -> list:
    """The headline rows of the committed run's raw results (its JSON keeps every figure
    the rows are made of)."""
    from benchmarks import run

    res = json.loads((RESULTS / "latest.json").read_text(encoding="utf-8"))
    return run.headline(res, run.QUICK if res["config"]["quick"] else run.FULL)


def test_headline_ratios_are_ours_over_anchor():
    """Every ratio of the headline is ours / anchor (issue 40 item 4): no cell says
    "faster"; a timed ratio agrees with the ours and anchor times of its row (a speed-up
    anchor / ours, as the loop rows once printed, is off by its square: 35× -> 0.03×); the
    cell is that ratio; a target on the ratio reads "≤ x×" and "met" is ratio ≤ x."""
    from benchmarks import _harness as Hh

    rows = _headline_rows()
    timed = [r for r in rows if r.data.get("timed")]
    assert len(timed) >= 9  # the rows benchmarks/reproduce.py checks
    for r in rows:
        cells = [r.measure, r.anchor, r.anchor_value, r.ours, r.ratio, r.target, r.met]
        assert not any("faster" in c or "slower" in c for c in cells), r
        assert r.met in ("yes", "NO", ""), r
        if "ratio_ours_over_anchor" not in r.data:
            assert r.ratio == "—", r
            continue
        x = r.data["ratio_ours_over_anchor"]
        assert r.ratio.startswith((Hh.fmt_ratio(x), f"{x:.1e}×")), r  # memory: 1.8e-03×
        if r.data["timed"]:
            by_times = _seconds(r.ours) / _seconds(r.anchor_value)
            assert 0.8 < x / by_times < 1.25, (r, by_times)
            # ``ratio`` keeps the earlier figure: the same, or the speed-up it inverts
            assert r.data["ratio"] in (x, pytest.approx(1 / x, rel=1e-12)), r
        tmax = r.data["target_max"]
        if tmax is not None:
            assert r.target == f"≤ {tmax:.3g}×", r
            assert r.met == ("yes" if x <= tmax else "NO"), r
        else:
            assert r.data.get("target_on") in ("gemm_efficiency", "ours") or r.target == "—", r
    # the loop of reflections: 35× faster in the committed table, so its ratio is below 1/20
    loop = next(r for r in rows if "NumPy loop" in r.anchor)
    assert loop.data["ratio_ours_over_anchor"] < 0.05 and loop.target == "≤ 0.05×"
    assert loop.data["ratio"] == pytest.approx(1 / loop.data["ratio_ours_over_anchor"])


def test_headline_legend_names_every_column_and_the_targets_source():
    """The legend under the table has a line for every column, says what yes and NO mean,
    and sends the reader to the Targets section of benchmarks/README.md, which lists every
    target the rows show."""
    from benchmarks import run

    text, md = run.legend(), run.legend_markdown()
    headers = [h for h, _ in run.HEADLINE_COLUMNS]
    assert [h for h, _ in run.HEADLINE_COLUMNS if h.startswith("ours / anchor")] == [
        "ours / anchor (lower is better)"
    ]
    for h in headers:
        assert f"\n  {h}: " in text and f"- **{h}**: " in md, h
    assert len(text.splitlines()) == len(headers) + 1
    met = run.LEGEND["met"]
    assert "yes" in met and "NO" in met and "target" in met
    assert "benchmarks/README.md, Targets" in run.LEGEND["target"]
    readme = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    assert "\n## Targets\n" in readme
    section = readme.split("\n## Targets\n", 1)[1].split("\n## ", 1)[0]
    for r in _headline_rows():
        if r.target != "—":
            assert f"| {r.target} |" in section, r.target


def test_scripts_write_outside_the_committed_results_by_default():
    """Without ``--out`` a script writes under build/bench (git-ignored), never into the
    committed benchmarks/results/ (issue 40 item 4)."""
    p = H.parser("doc")
    for argv, sub in (([], ""), (["--quick"], "quick")):
        d = H.out_dir(p.parse_args(argv)).resolve()
        assert d == (ROOT / "build" / "bench" / sub).resolve()
        assert not d.is_relative_to(RESULTS.resolve())
