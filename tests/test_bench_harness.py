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


def test_time_sequential_rounds_s_buys_more_paired_rounds():
    """``rounds_s`` makes the paired rounds of a loop take at least that long together: a
    10 ms loop gets the profile's three rounds without it and ≥ 5 with 0.5 s."""
    import time

    from benchmarks._cwy_rows import time_sequential

    prof = H.Profile(sample_s=0.0, min_total=0.0, max_total=0.2, min_rep=3, max_rep=30)

    def loop(k: int) -> None:
        time.sleep(0.01)

    with H.Bench(prof, 2, "test") as b:
        few = time_sequential(b, "loop", loop, 40, 10.0, pair=lambda: None)
        more = time_sequential(b, "loop", loop, 40, 10.0, pair=lambda: None, rounds_s=0.5)
    assert len(few["times_s"]) == 3
    assert len(more["times_s"]) >= 5


def test_reproduce_reports_each_ratios_spread_across_runs():
    """``benchmarks/reproduce.py`` reads the timed ratios of each run's headline rows (rows
    without a ratio, like the accuracy rows, are left out), and a ratio whose runs deviate
    from their mean by more than 10% is marked as missing the target, per thread count."""
    from benchmarks import reproduce as R

    def latest(a: float, b: float) -> dict:
        rows = [
            {"measure": "apply", "anchor": "two GEMMs", "data": {"ratio": a}},
            {"measure": "loop", "anchor": "Numba", "data": {"ratio": b}},
            {"measure": "‖QᵀQ−I‖", "anchor": "LAPACK", "data": {}},
        ]
        return {"headline": rows}

    one = [R.timed_ratios(latest(1.0, 5.0)), R.timed_ratios(latest(1.1, 5.1))]
    two = [R.timed_ratios(latest(1.0, 9.0)), R.timed_ratios(latest(1.0, 12.0))]
    assert list(one[0]) == ["apply / two GEMMs", "loop / Numba"]
    rows = R.summary({1: one, 2: two})
    by = {r["ratio"]: r for r in rows}
    # 1.0 and 1.1: mean 1.05, deviation 0.05 / 1.05 = 4.8%; 9 and 12: 1.5 / 10.5 = 14.3%
    assert by["apply / two GEMMs"]["1thread"]["spread"] == pytest.approx(0.05 / 1.05)
    assert by["apply / two GEMMs"]["1thread"]["met"]
    assert by["loop / Numba"]["2threads"]["spread"] == pytest.approx(1.5 / 10.5)
    assert not by["loop / Numba"]["2threads"]["met"]
    md = R.markdown(rows, [1, 2], "test machine")
    assert "9.0–12.0× (±14.3%) ✗" in md and "1thread 2 of 2, 2threads 1 of 2" in md
