"""LAPACK reflectors ``(a, τ)`` in: ``hl.from_lapack`` against ``?ormqr`` / ``?orgqr``.

Rows (float64, one thread, side by side round-robin in one process): apply Q to C without
forming Q — prebuilt operator and fresh ``from_lapack(a, tau) @ C`` (build included) —
against SciPy's ``dormqr`` and ``torch.ormqr``; form the thin Q against ``dorgqr`` and
``torch.linalg.householder_product``; and the orthogonality ‖QᵀQ − I‖_F of both formed Q.
Issue 15's targets: apply ≤ 1.0× and form ≤ 1.0× the LAPACK routine, orthogonality ≤ 1.0×.
The same rows in complex128 against ``zunmqr`` / ``zungqr`` on ``zgeqrf``'s (a, τ), whose τ is
complex (unitary, non-Hermitian reflectors; issue 15 item 3). Many small matrices (issue 14)
are in ``benchmarks/small.py``.

A fresh operator's first product and ``.matrix()`` run LAPACK's panel algorithms on τ
(``householderla/_agnostic/lapack_panels.py``, panels of nb = ``PANEL`` = 32 reflectors,
``?ormqr``/``?orgqr``'s block size). Flops at m = 1024, k = 256, B = 64: fresh ``@`` 14.9
Mflop of panel Grams (2·nb²·Σ(m − s_p), both triangles by matmul) + 59.8 Mflop of products
(4·B·nb·Σ(m − s_p)); ``dormqr`` ≈ 7.5 (``larft``, one triangle) + 59.8, so equal GEMM speed
gives ≈ 1.1×; the whole factor instead would cost 67.1 + 5.6 Mflop before its 62.9 Mflop apply.
Thin ``.matrix()``: 2·m·k² − 2k³/3 = 123 Mflop + the panel Grams, as ``dorgqr``. Panel size
(float64, one thread, 2-core VM with other work running, so ratios only): nb = 32 / 64 / 128
took 2.65 / 2.82 / 3.65 ms for a fresh product (dormqr 2.3 ms), and the thin Q had
‖QᵀQ − I‖_F 1.00 / 1.06 / 1.17 × dorgqr's; the ``prebuilt`` row is the blocked CWY factors
that the second product builds (``householderla._operator.blocked``, blocks of 64).

``python -m benchmarks.lapack [--quick] [--out DIR]``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import scipy.linalg.lapack as la
import torch

import householderla as hl

from . import _harness as H

FULL = {"profile": H.Profile(sample_s=5e-3, min_total=0.5, max_total=3.0, min_rep=7), "m": 1024,
        "k": 256, "B": 64}  # fmt: skip
QUICK = {"profile": H.Profile(sample_s=0.0, min_total=0.0, max_total=0.2, min_rep=3, max_rep=3),
         "m": 64, "k": 16, "B": 4}  # fmt: skip


def rows(b: H.Bench, m: int, k: int, B: int, dtype: Any = np.float64) -> list[H.Row]:
    """The apply / form / orthogonality rows for float64 (``d`` routines) or complex128
    (``z`` routines: ``zunmqr`` with trans "N", ``zungqr``)."""
    rng = np.random.default_rng(0)
    cx = np.dtype(dtype).kind == "c"
    p = "z" if cx else "d"
    A = rng.standard_normal((m, k)) + (1j * rng.standard_normal((m, k)) if cx else 0)
    C = rng.standard_normal((m, B)) + (1j * rng.standard_normal((m, B)) if cx else 0)
    geqrf, ormqr, orgqr = (getattr(la, p + n) for n in ("geqrf", "unmqr" if cx else "ormqr",
                                                        "ungqr" if cx else "orgqr"))  # fmt: skip
    a, tau, _, info = geqrf(A)
    assert info == 0
    op = hl.from_lapack(a, tau)
    ta, tt, tc = (torch.from_numpy(x) for x in (a, tau, C))
    lw = 64 * max(m, B)
    t = b.side_by_side(
        f"apply {np.dtype(dtype).name}",
        {
            "ormqr": lambda: ormqr("L", "N", a, tau, C, lwork=lw)[0],
            "torch.ormqr": lambda: torch.ormqr(ta, tt, tc),
            "prebuilt": lambda: op @ C,
            "fresh": lambda: hl.from_lapack(a, tau) @ C,
        },
    )
    f = b.side_by_side(
        f"form thin Q {np.dtype(dtype).name}",
        {
            "orgqr": lambda: orgqr(a, tau, lwork=lw)[0],
            "householder_product": lambda: torch.linalg.householder_product(ta, tt),
            "ours": lambda: hl.from_lapack(a, tau, thin=True).matrix(),
        },
    )
    med = {k_: v["median_s"] for k_, v in {**t, **f}.items()}
    shape = f"{np.dtype(dtype).name} m={m} k={k}"
    ormqr_name, orgqr_name = (
        f"scipy {p}{'unmqr' if cx else 'ormqr'}",
        f"scipy {p}{'ungqr' if cx else 'orgqr'}",
    )
    out = [
        H.ratio_row(f"from_lapack(a, tau) @ C (build + apply), {shape} B={B}",
                    ormqr_name, med["ormqr"], med["fresh"], 1.0),
        H.ratio_row(f"from_lapack(a, tau) @ C (build + apply), {shape} B={B}",
                    "torch.ormqr", med["torch.ormqr"], med["fresh"], 1.0),
        H.ratio_row(f"prebuilt op @ C, {shape} B={B}", ormqr_name, med["ormqr"],
                    med["prebuilt"], 1.0),
        H.ratio_row(f"prebuilt op @ C, {shape} B={B}", "torch.ormqr", med["torch.ormqr"],
                    med["prebuilt"], 1.0),
        H.ratio_row(f"from_lapack(a, tau, thin=True).matrix(), {shape}", orgqr_name,
                    med["orgqr"], med["ours"], 1.0),
        H.ratio_row(f"from_lapack(a, tau, thin=True).matrix(), {shape}",
                    "torch householder_product", med["householder_product"], med["ours"], 1.0),
    ]  # fmt: skip
    e_ours = H.orth_err(hl.from_lapack(a, tau, thin=True).matrix())
    e_lapack = H.orth_err(orgqr(a, tau, lwork=lw)[0])
    out.append(
        H.Row(f"‖QᴴQ−I‖_F thin Q, {shape}", f"{orgqr_name}, same (a, τ)", f"{e_lapack:.2e}",
              f"{e_ours:.2e}", f"{e_ours / e_lapack:.2f}×", "≤ 1.0×",
              "yes" if e_ours <= e_lapack else "NO", data={"ours": e_ours, "lapack": e_lapack})
    )  # fmt: skip
    for r in out[:-1]:
        r.data.update(timings={**t, **f})
    return out


def main(argv: list[str] | None = None) -> int:
    args = H.parser(__doc__, "tiny sizes: a smoke test (seconds)").parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = H.out_dir(args)
    t0 = time.perf_counter()
    threads = H.limit_threads(1)
    machine = H.machine_info()
    monitor = H.LoadMonitor()
    with H.Bench(cfg["profile"], 14, "lapack") as b:
        table = rows(b, cfg["m"], cfg["k"], cfg["B"])
        table += rows(b, cfg["m"], cfg["k"], cfg["B"], np.complex128)
    mline, load = H.run_line(machine, monitor, threads)
    md = H.table_markdown(table, mline, args.quick)
    md += "\nratio = ours / anchor, medians of samples taken round-robin in one process.\n"
    print(md)
    res: dict[str, Any] = {
        "machine": machine,
        "threads": threads,
        "quick": args.quick,
        "rows": table,
        "load": load,
        "wall_s": time.perf_counter() - t0,
    }
    H.write(out_dir / "lapack.json", res)
    H.write(out_dir / "lapack.md", md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
