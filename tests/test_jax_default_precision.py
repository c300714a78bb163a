"""JAX as most users run it: x64 disabled (the suite itself enables x64 in-process, so this
runs in a fresh interpreter). Every map must stay float32 and emit no warning."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import require

SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np, householderla as hl
    assert not jax.config.jax_enable_x64
    V = jax.random.normal(jax.random.PRNGKey(0), (32, 8))
    h = jnp.ones((32, 3))
    Q = hl.cwy(V)
    M = Q.matrix()
    outs = [Q @ h, M, hl.tcwy(V).matrix(), hl.householder_vectors(M),
            jax.grad(lambda V: (hl.cwy(V) @ h).sum())(V), hl.polar(V),
            jax.jit(hl.polar)(V), hl.cayley_retraction(hl.polar(V), V, 0.1),
            hl.cwy(jnp.ones((4, 2), dtype=jnp.int32)).matrix()]
    assert all(o.dtype == jnp.float32 for o in outs), [o.dtype for o in outs]
    err = float(jnp.linalg.norm(M.T @ M - jnp.eye(32)))
    assert err < 32 * 1.2e-7, err   # float32 floor ~ eps·N (no float64 accumulation here)
    print("ok")
    """
)


def test_jax_without_x64_stays_float32_and_warning_free():
    require("jax")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", SCRIPT],
        capture_output=True,
        text=True,
        cwd=root,
        env={
            # the root first, then the caller's path: a GPU machine brings array-api-compat
            # as a wheel directory on PYTHONPATH (docs/install.rst, make gpu-check)
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p
            ),
            "JAX_PLATFORMS": "cpu",
            "PATH": "",
            "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),  # conftest's faster compiles
        },
        timeout=300,
        check=False,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
