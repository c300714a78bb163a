"""``benchmarks/gpu.py`` (``make gpu-check``'s table) on the CPU: every row of the GPU table is
written, with its two timings and their ratio or as "not measured" with the reason, also when
a section's share of the budget runs out. Timings themselves are never asserted (README,
"Speed is measured, not asserted in tests")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import require

pytestmark = pytest.mark.no_dask("the GPU table times torch calls, no Dask operand")

torch = require("torch")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu  # noqa: E402

#: Rows per section of the full table: apply 4 shapes × (prebuilt, ormqr) + the loop at the 3
#: shapes with L ≤ 1024; forming 4 square + 4 stacks × (matrix, @ C); training 3; Muon 2;
#: CuPy 2; JAX 2 shapes × (product, gradient). The H100 table's rows, and JAX's.
FULL_ROWS = {"apply": 11, "forming": 12, "training": 3, "muon": 2, "cupy": 2, "jax": 4}


def _rows(out: Path) -> list[dict]:
    doc = json.loads((out / "gpu.json").read_text())
    assert doc["device"] == "cpu" and doc["versions"]["torch"] == torch.__version__
    md = (out / "gpu.md").read_text()
    for r in doc["rows"]:
        assert f"| {r['row']} | {r['shape']} |" in md
    return doc["rows"]


def _planned(cfg: dict, sections: list[str]) -> list[tuple[str, str]]:
    run = gpu.Run(Path("."), "cpu", 1.0, True)
    return [(r.what, r.shape) for s in sections for r, _ in gpu.SECTIONS[s](run, cfg)]


def test_the_full_table_has_every_row():
    for name, n in FULL_ROWS.items():
        assert len(_planned(gpu.FULL, [name])) == n, name


def test_quick_cpu_run_writes_every_row_timed_or_not_measured(tmp_path):
    sections = ["apply", "forming", "muon", "cupy"]
    assert (
        gpu.main(
            ["--quick", "--device", "cpu", "--out", str(tmp_path), "--budget", "120"]
            + ["--sections", *sections]
        )
        == 0
    )
    rows = _rows(tmp_path)
    assert [(r["row"], r["shape"]) for r in rows] == _planned(gpu.QUICK, sections)
    for r in rows:
        if r["status"] == "measured":
            assert r["ours_ms"] > 0 and r["other_ms"] > 0
            assert r["ratio"] == pytest.approx(r["ours_ms"] / r["other_ms"], rel=1e-12)
        else:
            assert r["status"].startswith("not measured: ") and r["ratio"] is None
    # CuPy needs a GPU; forming has no reason not to run in 120 s (Muon: torch ≥ 2.9)
    assert all(r["status"].startswith("not measured: CuPy") for r in rows if "CuPy" in r["row"])
    forming = [r for r in rows if r["section"] == "forming"]
    assert forming and all(r["status"] == "measured" for r in forming)
    # ours and LAPACK's form / apply the same Q: the same numbers to float32's rounding
    # (≤ 1e-4 ≫ n·ε₃₂ at n ≤ 32; a wrong Q, a transpose or a missed reflector is O(1))
    assert all(r["rel_diff"] is not None and r["rel_diff"] <= 1e-4 for r in forming)
    checked = [r for r in rows if r["rel_diff"] is not None]
    assert len(checked) == len(forming) + 4  # + cwy(V) @ h vs ormqr and vs the loop, twice
    assert all(r["rel_diff"] <= 1e-4 for r in checked)


def test_a_spent_budget_reports_not_measured(tmp_path):
    """No time left: every row is still in the table, "not measured" with the reason."""
    sections = ["apply", "training"]
    argv = ["--quick", "--device", "cpu", "--out", str(tmp_path), "--budget", "0"]
    assert gpu.main([*argv, "--sections", *sections]) == 0
    rows = _rows(tmp_path)
    assert [(r["row"], r["shape"]) for r in rows] == _planned(gpu.QUICK, sections)
    assert all("ran out of its 0 s" in r["status"] and r["ours_ms"] is None for r in rows)
