"""Many small matrices: forming and applying thousands of tiny products of reflectors at once.

Batched orgqr / ormqr of thousands of tiny matrices is a known weak spot (pytorch issue
143281; jax issue 8542: vmapped QR runs serially). Rows (float64, one thread, side by side
round-robin in one process), for P matrices of N × N from N reflectors each, in LAPACK's
layout (unit lower trapezoidal ``a`` and τ = 2/‖v‖²):

* *form*: ``hl.cwy(a).matrix()`` (NumPy, and CPU torch tensors) and
  ``hl.from_lapack(a, tau).matrix()`` against ``torch.linalg.householder_product`` (batched
  orgqr), a loop of SciPy's ``dorgqr`` and ``jax.vmap`` of ``jax.lax.linalg.householder_product``
  (compiled once);
* *apply*: a fresh ``hl.cwy(a) @ C`` and ``hl.from_lapack(a, tau) @ C`` (C: P × N × 8)
  against batched ``torch.ormqr`` and a loop of SciPy's ``dormqr``.

The ratio is ours over the fastest anchor; issue 14's target: ≤ 1/3 (3× faster) at N ≤ 16,
≤ 1 at N = 64. ``python -m benchmarks.small [--quick] [--out DIR]``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import scipy.linalg.lapack as la
import torch

import householderla as hl

from . import _harness as H

try:  # an anchor; a missing JAX is said in the table
    import jax

    jax.config.update("jax_enable_x64", True)
except ImportError:  # pragma: no cover - jax comes with the docs extra
    jax = None

FULL = {"profile": H.Profile(sample_s=5e-3, min_total=0.5, max_total=3.0, min_rep=7),
        "cases": [(3, 8192), (8, 8192), (16, 8192), (64, 1024)], "B": 8}  # fmt: skip
QUICK = {"profile": H.Profile(sample_s=0.0, min_total=0.0, max_total=0.2, min_rep=3, max_rep=3),
         "cases": [(3, 16), (8, 20)], "B": 2}  # fmt: skip


def _anchors(a: np.ndarray, tau: np.ndarray, C: np.ndarray) -> tuple[dict, dict]:
    """The form and apply anchors on the same reflectors."""
    ta, tt, tc = (torch.from_numpy(x) for x in (a, tau, C))
    form: dict[str, Any] = {
        "torch householder_product": lambda: torch.linalg.householder_product(ta, tt),
        "scipy dorgqr loop": lambda: [la.dorgqr(a[p], tau[p])[0] for p in range(len(a))],
    }
    if jax is not None:
        f = jax.jit(jax.vmap(jax.lax.linalg.householder_product))
        ja, jt = jax.numpy.asarray(a), jax.numpy.asarray(tau)
        f(ja, jt).block_until_ready()  # compiled before timing
        form["jax.vmap householder_product"] = lambda: f(ja, jt).block_until_ready()
    apply = {
        "torch.ormqr": lambda: torch.ormqr(ta, tt, tc),
        "scipy dormqr loop": lambda: [
            la.dormqr("L", "N", a[p], tau[p], C[p], lwork=64 * a.shape[1])[0] for p in range(len(a))
        ],
    }
    return form, apply


def case_rows(b: H.Bench, n: int, batch: int, B: int) -> list[H.Row]:
    rng = np.random.default_rng(n)
    a = np.tril(rng.standard_normal((batch, n, n)), -1) + np.eye(n)
    tau = 2 / (a * a).sum(-2)
    C = rng.standard_normal((batch, n, B))
    ta = torch.from_numpy(a)
    form, apply = _anchors(a, tau, C)
    ours_form = {
        "hl.cwy(a).matrix() (NumPy)": lambda: hl.cwy(a).matrix(),
        "hl.cwy(a).matrix() (torch)": lambda: hl.cwy(ta).matrix(),
        "hl.from_lapack(a, tau).matrix()": lambda: hl.from_lapack(a, tau).matrix(),
    }
    ours_apply = {
        "hl.cwy(a) @ C": lambda: hl.cwy(a) @ C,
        "hl.from_lapack(a, tau) @ C": lambda: hl.from_lapack(a, tau) @ C,
    }
    target = 1 / 3 if n <= 16 else 1.0
    out = []
    for kind, anchors, ours in (("form", form, ours_form), ("apply", apply, ours_apply)):
        t = b.side_by_side(f"{kind} N={n} P={batch}", {**anchors, **ours})
        best = min(anchors, key=lambda k: t[k]["median_s"])
        for name in ours:
            what = f"{name}, {batch} matrices {n}×{n}" + (
                f", C with {B} columns" * (kind == "apply")
            )
            row = H.ratio_row(what, best, t[best]["median_s"], t[name]["median_s"], target)
            row.target = "≤ 1/3×" if target < 1 else "≤ 1×"
            row.data.update(timings=t, kind=kind)
            out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    args = H.parser(__doc__, "tiny sizes: a smoke test (seconds)").parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = H.out_dir(args)
    t0 = time.perf_counter()
    threads = H.limit_threads(1)
    machine = H.machine_info()
    monitor = H.LoadMonitor()
    with H.Bench(cfg["profile"], 2 * len(cfg["cases"]), "small") as b:
        table = [r for n, P in cfg["cases"] for r in case_rows(b, n, P, cfg["B"])]
    mline, load = H.run_line(machine, monitor, threads)
    md = H.table_markdown(table, mline, args.quick)
    md += (
        "\nratio = ours / the fastest anchor of the row, medians of samples taken round-robin "
        "in one process; JAX "
        + ("compiled before timing" if jax is not None else "not installed")
        + ".\n"
    )
    print(md)
    res: dict[str, Any] = {
        "machine": machine,
        "threads": threads,
        "quick": args.quick,
        "rows": table,
        "load": load,
        "wall_s": time.perf_counter() - t0,
    }
    H.write(out_dir / "small.json", res)
    H.write(out_dir / "small.md", md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
