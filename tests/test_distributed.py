"""Stiefel optimizers and Muon on ``torch.distributed`` (issue 43, items 1, 2 and 5):
row-sharded and replicated DTensor parameters in 2 and 4 gloo processes on the CPU; and
``OrthogonalLinear`` under ``fully_shard`` (item 3: ``fsdp_layer``, ``fsdp_layer_replicated``).

The checks (``tests/distributed_checks.py``, which documents each) run in P processes
spawned here, one group per P for all checks (starting the processes is most of the time);
each test reports one check. The processes import the checkout under test (``PYTHONPATH``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import once_per_run, require, torch_below

require("torch")
if why := torch_below("dtensor"):
    pytest.skip(why, allow_module_level=True)
import distributed_checks  # noqa: E402  (imports no framework)

ROOT = Path(__file__).resolve().parents[1]
SIZES = (2, 4)
#: Every test run: every check in 2 processes, and in 4 those where the blocks differ in kind
#: (uneven and empty blocks, a 2-D mesh, counted bytes, a NaN in one block, every Muon
#: check: ownership and its bytes change with P; FSDP's shards of the layer, a 1-row one
#: and sums of 4 gradients); the rest in 4
#: processes and the 1,000-step runs in ``make test-long`` (4 processes on a 2-core machine
#: take ~1 s a check).
#: Checks of ``make test-long`` only, in 2 and 4 processes.
LONG_ONLY = ("orthogonality_1000", "muon_100_steps")
CHECKS_2 = [name for name in distributed_checks.CHECKS if name not in LONG_ONLY]
CHECKS_4 = [
    "sgd_nesterov",
    "adam_amsgrad",
    "short_blocks",
    "rank_deficient_start",
    "nonfinite_on_one_process",
    "bytes_per_step",
    "column_sharding_raises",
    "mesh_2d_raises",
    "muon_float64",
    "muon_bfloat16",
    "muon_split_sizes",
    "muon_owners",
    "muon_bytes",
    "muon_errors",
    "fsdp_layer",
    "fsdp_layer_replicated",
]
DEFAULT = [f"{name}@2" for name in CHECKS_2] + [f"{name}@4" for name in CHECKS_4]
LONG_RUNS = [f"{name}@4" for name in CHECKS_2 if name not in CHECKS_4] + [
    f"{name}@{P}" for name in LONG_ONLY for P in SIZES
]


def _run(world: int, items: list[str], timeout: float = 300) -> dict[str, str]:
    """{"check@P": "ok" | the tracebacks of the processes where it failed}."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with the gloo backend is not available")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    env["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        init, out = os.path.join(tmp, "init"), os.path.join(tmp, "out")
        script = str(ROOT / "tests" / "distributed_checks.py")
        procs = [
            subprocess.Popen(
                [sys.executable, script, str(world), str(r), init, out, *items],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for r in range(world)
        ]
        logs = []
        try:
            for p in procs:
                logs.append(p.communicate(timeout=timeout)[0])
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        per_rank = []
        for r in range(world):
            path = f"{out}.{r}"
            if not os.path.exists(path):
                pytest.fail(f"process {r} of {world} wrote no results:\n" + "\n".join(logs)[-4000:])
            with open(path, encoding="utf-8") as f:
                per_rank.append(json.load(f))
    merged = {}
    for item in items:
        bad = [
            f"process {r}: {res[item]}"
            for r, res in enumerate(per_rank)
            if res.get(item, "ok") != "ok"
        ]
        missing = int(item.split("@")[1]) > sum(item in res for res in per_rank)
        merged[item] = "ok" if not bad and not missing else "\n".join(bad) or "not run"
    return merged


#: why the FSDP2 checks (``fully_shard`` of the layer in CPU processes) skip, or None
FSDP_SKIP = torch_below("fsdp_cpu")


def _runs(items: list[str]) -> list[str]:
    return [i for i in items if not (FSDP_SKIP and i.startswith("fsdp_"))]


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    """The default checks, from one start of 4 processes (once per run: ``once_per_run``)."""
    return once_per_run("distributed", lambda: _run(max(SIZES), _runs(DEFAULT)))


@pytest.mark.parametrize("item", DEFAULT)
def test_distributed(results: dict[str, str], item: str) -> None:
    if item not in _runs([item]):
        pytest.skip(FSDP_SKIP)
    assert results[item] == "ok", results[item]


@pytest.mark.long
def test_distributed_long() -> None:
    """The other checks in 4 processes, and 1,000 Stiefel steps and 100 Muon steps in 2 and
    4."""
    res = _run(max(SIZES), _runs(LONG_RUNS), timeout=900)
    bad = {k: v for k, v in res.items() if v != "ok"}
    assert not bad, bad


@pytest.mark.long
def test_example_under_torchrun() -> None:
    """``torchrun --nproc-per-node 2 examples/distributed_stiefel.py --quick`` runs and finds
    the principal subspace (the script's exit code says so)."""
    import shutil

    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    if not Path(torchrun).exists():
        pytest.skip("torchrun is not installed")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [torchrun, "--nproc-per-node", "2", "--master-port", "29531"]
    run = subprocess.run(
        [*cmd, str(ROOT / "examples" / "distributed_stiefel.py"), "--quick"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "captured" in run.stdout
