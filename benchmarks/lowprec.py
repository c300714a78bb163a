"""Half precision (issue 13, item 1): accuracy of ``hl.polar``, ``hl.cwy`` and ``hl.tcwy`` on
bfloat16/float16 input.

Target: ‖QᵀQ − I‖_F of our half-precision result ≤ 2× that of the exact (float64) polar
factor rounded to the same dtype, at N = 256 … 4096 (shapes N × N/4). Inputs: a Gaussian
matrix (κ ≈ 3) and a tangent step X + ξ, ‖ξ‖₂ = 0.3, from a point of the Stiefel manifold;
rounded to the half dtype first, so that the exact answer is the polar factor of the very
numbers the call receives. Backends: torch (CUDA when present, else CPU) and JAX (its default
device). The compact WY rows: ‖QᵀQ − I‖_F of ``hl.cwy(V).matrix()`` (N × N) and of
``hl.tcwy(V).matrix()`` (N × N/4) for Gaussian V (N × N/4) rounded to the half dtype, against
the float64 product of the same half-precision reflectors rounded once to that dtype (the same
≤ 2× target). A second table re-measures the rounding model of the fixed-step mode
(``householderla._agnostic.polar_schedules.rounding_gamma``): the largest
‖fl(p(X)) − p(X)‖₂ / (u(|a|h + |b|h³ + |c|h⁵)) over the steps of Muon's and Polar Express's
schedules, against the γ(M) the certificates use. Timings of one call are recorded for the
lead's quiet-machine runs (meaningless under load).

``python -m benchmarks.lowprec [--quick] [--out DIR]``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import householderla as hl
from householderla._agnostic import polar_schedules as PS

from . import _harness as H

# (the rounding-model rows take exact 2-norms of every step: ~12 min at 1024 × 1024 on 2 cores)
FULL = {"sizes": [256, 512, 1024, 2048, 4096], "gamma_sizes": [(64, 256), (256, 1024),
        (1024, 1024)]}  # fmt: skip
# --quick: one size (each size is a new set of shapes for JAX to compile: most of its time)
QUICK = {"sizes": [64], "gamma_sizes": [(32, 64)]}
U = {"bfloat16": 2.0**-8, "float16": 2.0**-11}


def inputs(N: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    M = N // 4
    Q0 = np.linalg.qr(rng.standard_normal((N, M)))[0]
    Z = rng.standard_normal((N, M))
    Z -= Q0 @ (0.5 * (Q0.T @ Z + Z.T @ Q0))
    Z *= 0.3 / np.linalg.norm(Z, 2)
    return {"gaussian": rng.standard_normal((N, M)) / np.sqrt(N), "tangent step": Q0 + Z}


def backends() -> list[tuple[str, Any, Any]]:
    """(label, to-half, to-float64) per available backend."""
    out = []
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"

    def t_half(a: np.ndarray, name: str) -> Any:
        return torch.from_numpy(a).to(dev).to(getattr(torch, name))

    out.append((f"torch {dev}", t_half, lambda x: x.double().cpu().numpy()))
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:  # pragma: no cover - jax is in the bench extra
        return out

    def j_half(a: np.ndarray, name: str) -> Any:
        return jnp.asarray(a.astype(np.float32)).astype(getattr(jnp, name))

    out.append(
        (f"jax {jax.default_backend()}", j_half, lambda x: np.asarray(x.astype(jnp.float32), float))
    )
    return out


def exact_polar(X: np.ndarray) -> np.ndarray:
    U_, _, Vt = np.linalg.svd(X, full_matrices=False)
    return U_ @ Vt


def accuracy_rows(b: H.Bench, sizes: list[int]) -> list[H.Row]:
    rows = []
    rng = np.random.default_rng(0)
    bks = backends()
    for N in sizes:
        for kind, X in inputs(N, rng).items():
            for label, to_half, to_f64 in bks:
                for name in ("bfloat16", "float16"):
                    Xh = to_half(X, name)
                    Xe = to_f64(Xh)  # the numbers the call receives
                    rows.append(
                        _accuracy_row(
                            f"‖QᵀQ−I‖_F polar {name}, {label}, {kind} {N}×{N // 4}",
                            f"exact polar factor rounded to {name}",
                            exact_polar(Xe),
                            lambda Xh=Xh: hl.polar(Xh),
                            name,
                            to_half,
                            to_f64,
                        )
                    )
                    b.step(f"{label} {name} N={N}")
    return rows


def _accuracy_row(
    measure: str, anchor: str, Qe: Any, run: Any, name: str, to_half: Any, to_f64: Any
) -> H.Row:
    """‖QᵀQ − I‖_F of ``run()`` (a half-precision result) against the floor: the exact
    float64 ``Qe`` rounded once to ``name``; target ≤ 2× (issue 13)."""
    floor = H.orth_err(to_f64(to_half(Qe, name)))
    t0 = time.perf_counter()
    Qf = to_f64(run())  # (synchronises the device)
    dt = time.perf_counter() - t0
    err = H.orth_err(Qf)
    dev = float(np.max(np.abs(Qf - Qe) / (U[name] * np.abs(Qe) + 1e-30)))
    r = err / floor
    return H.Row(measure, anchor, f"{floor:.2e}", f"{err:.2e}", f"{r:.2f}×", "≤ 2×",
                 "yes" if r <= 2.0 else "NO",
                 data={"ours": err, "floor": floor, "ratio": r, "seconds": dt,
                       "max_entry_error_in_u": dev})  # fmt: skip


def cwy_rows(b: H.Bench, sizes: list[int]) -> list[H.Row]:
    """‖QᵀQ − I‖_F of cwy(V).matrix() and tcwy(V).matrix() in half precision against the exact
    (float64) matrix of the same half-precision V rounded once to that dtype."""
    rows = []
    rng = np.random.default_rng(2)
    bks = backends()
    for N in sizes:
        V = rng.standard_normal((N, N // 4))
        for label, to_half, to_f64 in bks:
            for name in ("bfloat16", "float16"):
                Vh = to_half(V, name)
                Ve = to_f64(Vh)  # the reflectors the call receives
                for mapname, fn in (("cwy", hl.cwy), ("tcwy", hl.tcwy)):
                    rows.append(
                        _accuracy_row(
                            f"‖QᵀQ−I‖_F {mapname}(V).matrix() {name}, {label}, V {N}×{N // 4}",
                            f"exact {mapname} matrix rounded to {name}",
                            fn(Ve).matrix(),
                            lambda fn=fn, Vh=Vh: fn(Vh).matrix(),
                            name,
                            to_half,
                            to_f64,
                        )
                    )
                b.step(f"cwy {label} {name} N={N}")
    return rows


def gamma_rows(b: H.Bench, sizes: list[tuple[int, int]]) -> list[H.Row]:
    """The rounding model, measured: max over steps of ‖fl(p(X)) − p(X)‖₂ / (u·bound)."""
    import torch

    rows = []
    rng = np.random.default_rng(1)
    for M, N in sizes:
        for name, u in (("bfloat16", U["bfloat16"]), ("float16", U["float16"])):
            dt = getattr(torch, name)
            worst = 0.0
            for kind in ("log-spaced", "flat", "low-rank"):
                Uq = np.linalg.qr(rng.standard_normal((M, M)))[0]
                Vq = np.linalg.qr(rng.standard_normal((N, M)))[0]
                if kind == "log-spaced":
                    s = np.exp(rng.uniform(np.log(1e-3), 0, M))
                elif kind == "flat":
                    s = rng.uniform(0.5, 1, M)
                else:
                    s = np.where(np.arange(M) < max(M // 8, 1), 1.0, 0.0)
                for sched in ("muon", "polar_express"):
                    S = PS.schedule(sched, 5, 1e-3, 0.0, M)
                    G = (Uq * s) @ Vq.T
                    X = torch.from_numpy(G / (S.scale * np.linalg.norm(G))).to(dt)
                    for a, bb, c in S.coeffs:
                        X64 = X.double()
                        A = X64 @ X64.T
                        ex = a * X64 + (bb * A + c * A @ A) @ X64
                        Ah = X @ X.T
                        X = a * X + (bb * Ah + c * (Ah @ Ah)) @ X
                        h = float(torch.linalg.matrix_norm(X64, 2))
                        err = float(torch.linalg.matrix_norm(X.double() - ex, 2))
                        worst = max(worst, err / (u * PS._step_bound((a, bb, c), h)))
            g = PS.rounding_gamma(M)
            rows.append(
                H.Row(f"rounding model, {name}, {M}×{N}", "γ(M) of the certificates",
                      f"{g:.2f}", f"{worst:.2f}", f"{worst / g:.2f}×", "≤ 1×",
                      "yes" if worst <= g else "NO", data={"measured": worst, "gamma": g})
            )  # fmt: skip
            b.step(f"gamma {name} {M}x{N}")
    return rows


COLUMNS = [
    ("measure", "measure"),
    ("anchor", "anchor"),
    ("anchor value", "anchor_value"),
    ("ours", "ours"),
    ("ours / anchor (lower is better)", "ratio"),
    ("target", "target"),
    ("met", "met"),
]


def main(argv: list[str] | None = None) -> int:
    args = H.parser(__doc__, "tiny sizes: a smoke test (seconds)").parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = H.out_dir(args)
    t0 = time.perf_counter()
    machine = H.machine_info()
    monitor = H.LoadMonitor()
    n_acc = len(cfg["sizes"]) * 2 * 2 * len(backends())
    n_cwy = len(cfg["sizes"]) * 2 * len(backends())
    with H.Bench(H.Profile(), n_acc + n_cwy + 2 * len(cfg["gamma_sizes"]), "lowprec") as b:
        table = accuracy_rows(b, cfg["sizes"]) + cwy_rows(b, cfg["sizes"])
        table += gamma_rows(b, cfg["gamma_sizes"])
    load = monitor.result(machine["cores_available"])
    mline = H.machine_line(machine)
    md = H.table_markdown(table, mline, args.quick, COLUMNS)
    md += (
        "\nratio = ours / anchor. Accuracy rows: anchor = the float64 polar factor of the "
        "same half-precision input, rounded once to that dtype (the floor of any "
        "half-precision orthonormal matrix); for cwy/tcwy the float64 matrix of the same "
        "half-precision reflectors, rounded once. Rounding-model rows: anchor = γ(M), ours = the "
        "largest measured ratio.\n"
    )
    print(md)
    res = {"machine": machine, "quick": args.quick, "rows": table, "load": load,
           "wall_s": time.perf_counter() - t0}  # fmt: skip
    H.write(out_dir / "lowprec.json", res)
    H.write(out_dir / "lowprec.md", md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
