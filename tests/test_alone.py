"""A user's process with one framework (``tests/alone_checks.py``): the library's common
calls on torch tensors with JAX, Dask, CuPy and array-api-strict not importable, on NumPy
arrays with torch too not importable, and on JAX arrays without torch; nothing tries to
import them. The suite's own
processes import every framework, so it sees neither case otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require, torch_below

ROOT = Path(__file__).resolve().parents[1]


def _run(user: str, *flags: str) -> None:
    path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    run = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "alone_checks.py"), user, *flags],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-4000:]


def test_torch_alone():
    """Products, gradients, the layer's training step, the Stiefel optimizers and Muon, and
    (torch ≥ 2.11) ``torch.compile`` of the layer (one graph), in a process
    where only torch is importable."""
    require("torch")
    _run("torch", *(() if torch_below("compile") else ("--compile",)))


def test_numpy_alone():
    """Operators, stacks, a VJP, polar, svd_householder and the functional optimizers on
    NumPy arrays, in a process where no framework is importable."""
    _run("numpy")


def test_jax_alone():
    """Gradients eager and under ``jax.jit``, polar, an eager optimizer step (one compiled
    program) on JAX arrays, in a process where torch is not importable."""
    require("jax")
    _run("jax")


@pytest.mark.parametrize("user", ["torch", "numpy", "jax"])
def test_the_refusal_is_real(user):
    """The hook refuses what it names, and would report an attempt (the check can fail)."""
    import alone_checks  # (tests/ is on the path, as for sharded_checks)

    refuse = alone_checks.Refuse(alone_checks.OTHERS[user])
    name = alone_checks.OTHERS[user][0]
    with pytest.raises(ImportError, match="refused"):
        refuse.find_spec(f"{name}.sub", None)
    assert refuse.attempts == [f"{name}.sub"] and refuse.find_spec("numpy", None) is None
