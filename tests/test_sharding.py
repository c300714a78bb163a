"""Sharded JAX (issue 14, item 2): operators, retractions and the optax-style Stiefel
optimizers under ``jax.jit`` with ``NamedSharding`` over four CPU devices, and inside
``jax.shard_map``; Stiefel parameters sharded by rows (issue 43, item 4: ``row_axis``, Muon).

JAX fixes its device count at import, and this process imported it already with one device,
so the checks (``tests/sharded_checks.py``, which documents each) run in one subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=4``; each test here reports one of them.
The subprocess imports the checkout under test (``PYTHONPATH``), so ``make test`` runs them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import once_per_run, require

require("jax")
import sharded_checks  # noqa: E402  (imports no framework)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    """Every check, from one subprocess of 4 CPU devices (once per run: ``once_per_run``)."""
    return once_per_run("sharded", _run_checks)


def _run_checks() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("JAX_PLATFORMS", None)  # the forced host devices are CPU devices
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("sharded_checks.py"))],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(sharded_checks.CHECKS))
def test_sharded(results: dict[str, str], name: str) -> None:
    assert results.get(name) == "ok", results.get(name, f"{name} did not run")
