"""Retraction benchmarks: polar by Newton–Schulz vs QR / SVD / the reference scheme, and
Cayley by Sherman–Morrison–Woodbury vs the dense N×N Cayley transform (CPU, NumPy backend).

Run ``python -m benchmarks.retractions`` (full, < 3 min on 2 cores; writes
``build/bench/retractions.{json,md}``) or ``python -m benchmarks.retractions --quick``
(small sizes, < 20 s; writes ``build/bench/quick/``); ``--out DIR`` elsewhere.

Every row is measured side by side in one run (``benchmarks/_harness.py``: the methods of a
row timed round-robin, median of the samples; README "Method"). Orthogonality is
‖QᵀQ − I‖_F computed in float64. Memory is the tracemalloc peak of one call (NumPy
allocations; LAPACK workspaces are not traced).

Tables:

1. *One-shot polar* of a Gaussian X (``float32`` and ``float64``): ``hl.polar`` (Newton–Schulz),
   ``numpy.linalg.qr`` (computes in float64 internally, so its float32 row is the rounding
   floor), ``scipy.linalg.qr`` (LAPACK ``?geqrf``/``?orgqr`` in the input precision: the
   Householder-QR floor the targets refer to), ``scipy.linalg.polar`` (SVD), and the reference
   scheme of Kong et al.'s code (Frobenius scaling, always 10 coupled iterations, returns the
   9th iterate), implemented below.
2. *Newton–Schulz iterations from a tangent step* X + ξ (X ∈ St(N, M), ‖ξ‖₂ ∈ {0.01, 0.3,
   1.5}), float64: the certified count, the error and the QR floor of the same matrix.
3. *Cayley, SMW vs dense* (canonical metric, M = 16, N growing): time and peak memory.
4. *Backward / forward* time ratio of the explicit VJPs.
5. *Complex* (``complex64``, ``complex128``): one-shot polar of a complex Gaussian X against
   ``scipy.linalg.qr`` (LAPACK ``?geqrf``/``?ungqr``) and ``scipy.linalg.polar``, and the
   backward / forward ratio of the complex retractions' VJPs (``docs/theory/complex.rst``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.linalg

import householderla as hl
from benchmarks import _harness as H
from benchmarks._harness import orth_err, peak_bytes

FULL = {
    "polar_shapes": [(1000, 10), (4096, 256), (2048, 1024)],
    "tangent_shapes": [(1000, 10), (4096, 256), (2048, 1024)],
    "cayley_N": [256, 1024, 4096],
    "cayley_M": 16,
    "vjp_shape": (4096, 256),
    "complex_shapes": [(1000, 10), (2048, 256)],
    "complex_vjp_shape": (2048, 128),
    "profile": H.Profile(sample_s=2e-3, min_total=0.3, max_total=2.0, max_rep=15),
}
QUICK = {
    "polar_shapes": [(1000, 10), (512, 64)],
    "tangent_shapes": [(1000, 10)],
    "cayley_N": [128, 512],
    "cayley_M": 16,
    "vjp_shape": (1000, 32),
    "complex_shapes": [(500, 10)],
    "complex_vjp_shape": (500, 16),
    "profile": H.Profile(sample_s=0.0, min_total=0.05, max_total=0.5, max_rep=5),
}
METHODS = 5  # one-shot polar methods per (shape, dtype)
COMPLEX_METHODS = 3


def planned(cfg: dict[str, Any]) -> int:
    return (
        len(cfg["polar_shapes"]) * 2 * METHODS
        + len(cfg["tangent_shapes"]) * 3
        + len(cfg["cayley_N"]) * 2
        + 8
        + len(cfg["complex_shapes"]) * 2 * COMPLEX_METHODS
        + 3
    )


def reference_polar(X: np.ndarray) -> np.ndarray:
    """Kong et al.'s reference scheme: A = XᵀX scaled by its Frobenius norm, 10 coupled
    Newton–Schulz iterations in the input precision, the 9th iterate returned."""
    A = X.T @ X
    c = np.sqrt(np.sum(A * A))
    Y, Z = A / c, np.eye(A.shape[0], dtype=X.dtype)
    eye = np.eye(A.shape[0], dtype=X.dtype)
    Z_prev = Z
    for _ in range(10):
        T = 0.5 * (3.0 * eye - Z @ Y)
        Z_prev = Z
        Y, Z = Y @ T, T @ Z
    return X @ (Z_prev / np.sqrt(c).astype(X.dtype))


def stiefel(rng: np.random.Generator, N: int, M: int) -> np.ndarray:
    Q, R = np.linalg.qr(rng.standard_normal((N, M)))
    return Q * np.sign(np.diag(R))


def tangent(rng: np.random.Generator, X: np.ndarray, norm2: float) -> np.ndarray:
    Z = rng.standard_normal(X.shape)
    S = X.T @ Z
    Z = Z - X @ (0.5 * (S + S.T))
    return Z * (norm2 / np.linalg.norm(Z, 2))


def dense_cayley(X: np.ndarray, G: np.ndarray, eta: float) -> np.ndarray:
    """What geoopt does: form A = GXᵀ − XGᵀ (N×N) and solve (I + ηA/2) Y = (I − ηA/2) X."""
    A = G @ X.T
    A = A - A.T
    eye = np.eye(X.shape[0])
    return np.linalg.solve(eye + 0.5 * eta * A, X - 0.5 * eta * (A @ X))


def _polar_methods(X: np.ndarray) -> dict[str, Callable[[], Any]]:
    """The one-shot polar methods every dtype has (ours, LAPACK QR, SciPy's SVD polar)."""
    return {
        "polar-NS (ours)": lambda: hl.polar(X),
        "scipy.linalg.qr (LAPACK)": lambda: scipy.linalg.qr(X, mode="economic", check_finite=False)[
            0
        ],
        "scipy.linalg.polar (SVD)": lambda: scipy.linalg.polar(X)[0],
    }


def _polar_rows(b: H.Bench, label: str, X: np.ndarray, methods: dict) -> list[dict]:
    """One side-by-side row per method: time, ‖QᴴQ − I‖_F, our iteration count."""
    N, M = X.shape
    _, info = hl.polar(X, return_info=True)
    ts = b.side_by_side(f"{label} {N}×{M} {X.dtype.name}", methods)
    return [
        {
            "N": N,
            "M": M,
            "dtype": X.dtype.name,
            "method": name,
            "orth_err": orth_err(fn()),
            "iterations": info["iterations"] if name.startswith("polar-NS") else None,
            **ts[name],
        }
        for name, fn in methods.items()
    ]


def bench_polar(b: H.Bench, cfg: dict[str, Any], rng: np.random.Generator) -> list[dict]:
    rows = []
    for N, M in cfg["polar_shapes"]:
        X64 = rng.standard_normal((N, M))
        for dtype in (np.float32, np.float64):
            X = X64.astype(dtype)
            ours, lapack, svd = _polar_methods(X).items()
            methods = dict(
                [ours, ("numpy.linalg.qr", lambda X=X: np.linalg.qr(X)[0]), lapack, svd]
                + [("reference NS (Frobenius, 10 it.)", lambda X=X: reference_polar(X))]
            )
            rows += _polar_rows(b, "polar", X, methods)
    return rows


def bench_tangent(b: H.Bench, cfg: dict[str, Any], rng: np.random.Generator) -> list[dict]:
    rows = []
    for N, M in cfg["tangent_shapes"]:
        X = stiefel(rng, N, M)
        for norm2, target in ((0.01, 2), (0.3, 4), (1.5, 9)):
            Y = X + tangent(rng, X, norm2)
            Q, info = hl.polar(Y, return_info=True)
            t = b.time(f"polar from X + ξ {N}×{M} ‖ξ‖={norm2}", lambda Y=Y: hl.polar(Y))
            rows.append(
                {
                    "N": N,
                    "M": M,
                    "xi_norm2": norm2,
                    "iterations": info["iterations"],
                    "restart_iterations": info["restart_iterations"],
                    "target": target,
                    "met": info["iterations"] is not None and info["iterations"] <= target,
                    "orth_err": orth_err(Q),
                    "qr_floor": orth_err(np.linalg.qr(Y)[0]),
                    "max_diff_vs_svd_polar": float(np.max(np.abs(Q - scipy.linalg.polar(Y)[0]))),
                    **t,
                }
            )
    return rows


def bench_cayley(b: H.Bench, cfg: dict[str, Any], rng: np.random.Generator) -> list[dict]:
    rows = []
    M = cfg["cayley_M"]
    for N in cfg["cayley_N"]:
        X = stiefel(rng, N, M)
        G = rng.standard_normal((N, M))
        eta = 0.1
        Z = -hl.riemannian_gradient(X, G)  # the canonical step: its lift is A = GXᵀ − XGᵀ
        smw = lambda X=X, Z=Z, eta=eta: hl.cayley_retraction(X, Z, eta)  # noqa: E731
        dense = lambda X=X, G=G, eta=eta: dense_cayley(X, G, eta)  # noqa: E731
        diff = float(np.max(np.abs(smw() - dense())))
        fns = {"SMW (ours)": smw, "dense N×N solve": dense}
        ts = b.side_by_side(f"Cayley N={N} M={M}", fns)
        for name, fn in fns.items():
            rows.append(
                {
                    "N": N,
                    "M": M,
                    "method": name,
                    "peak_bytes": peak_bytes(fn),
                    "orth_err": orth_err(fn()),
                    "max_diff_smw_vs_dense": diff,
                    **ts[name],
                }
            )
    return rows


def bench_vjp(b: H.Bench, cfg: dict[str, Any], rng: np.random.Generator) -> list[dict]:
    N, M = cfg["vjp_shape"]
    X = stiefel(rng, N, M)
    Z = tangent(rng, X, 0.3)
    g = rng.standard_normal((N, M))
    pairs = {
        "polar": (lambda: hl.polar(X + Z), lambda: hl.vjp.polar(X + Z, g)),
        "cayley_retraction": (
            lambda: hl.cayley_retraction(X, Z, 0.1),
            lambda: hl.vjp.cayley_retraction(X, Z, 0.1, g),
        ),
        "qr_retraction": (
            lambda: hl.qr_retraction(X, Z, 0.1),
            lambda: hl.vjp.qr_retraction(X, Z, 0.1, g),
        ),
    }
    rows = []
    for name, (fwd, bwd) in pairs.items():
        t = b.side_by_side(f"VJP {name}", {"fwd": fwd, "bwd": bwd})
        tf, tb = t["fwd"]["median_s"], t["bwd"]["median_s"]
        rows.append({"map": name, "N": N, "M": M, "forward_s": tf, "vjp_s": tb, "ratio": tb / tf})
    return rows


def _crandn(rng: np.random.Generator, N: int, M: int) -> np.ndarray:
    return rng.standard_normal((N, M)) + 1j * rng.standard_normal((N, M))


def bench_complex(b: H.Bench, cfg: dict[str, Any], rng: np.random.Generator) -> dict[str, list]:
    polar_rows = []
    for N, M in cfg["complex_shapes"]:
        X128 = _crandn(rng, N, M)
        for dtype in (np.complex64, np.complex128):
            X = X128.astype(dtype)
            polar_rows += _polar_rows(b, "complex polar", X, _polar_methods(X))
    N, M = cfg["complex_vjp_shape"]
    X = np.linalg.qr(_crandn(rng, N, M))[0]
    Z = _crandn(rng, N, M)
    Z = 0.3 * (Z - X @ (0.5 * (X.conj().T @ Z + Z.conj().T @ X))) / np.linalg.norm(Z, 2)
    g = _crandn(rng, N, M)
    pairs = {
        "polar_retraction": (hl.polar_retraction, hl.vjp.polar_retraction),
        "cayley_retraction": (hl.cayley_retraction, hl.vjp.cayley_retraction),
        "qr_retraction": (hl.qr_retraction, hl.vjp.qr_retraction),
    }
    vjp_rows = []
    for name, (f, v) in pairs.items():
        t = b.side_by_side(
            f"complex VJP {name}",
            {"fwd": lambda f=f: f(X, Z, 0.1), "bwd": lambda v=v: v(X, Z, 0.1, g)},
        )
        tf, tb = t["fwd"]["median_s"], t["bwd"]["median_s"]
        vjp_rows.append(
            {"map": name, "N": N, "M": M, "forward_s": tf, "vjp_s": tb, "ratio": tb / tf}
        )
    return {"polar": polar_rows, "vjp": vjp_rows}


def _fmt_t(s: float) -> str:
    return f"{s * 1e3:9.3f} ms" if s < 1 else f"{s:9.3f} s "


def _fmt_b(b: float) -> str:
    return f"{b / 2**20:8.2f} MiB"


def _polar_lines(rows: list[dict[str, Any]], dtype_w: int, method_w: int) -> list[str]:
    """Table rows of one-shot polar results, each with its error over LAPACK QR's of the same
    shape and dtype."""
    out = []
    for r in rows:
        floor = next(
            x["orth_err"]
            for x in rows
            if (x["N"], x["M"], x["dtype"]) == (r["N"], r["M"], r["dtype"])
            and x["method"].startswith("scipy.linalg.qr")
        )
        out.append(
            f"{r['N']:>5}×{r['M']:<4} {r['dtype']:>{dtype_w}} {r['method']:<{method_w}} "
            f"{_fmt_t(r['median_s'])} {r['orth_err']:11.2e} {r['orth_err'] / floor:10.2f} "
            f"{'' if r['iterations'] is None else r['iterations']:>5}"
        )
    return out


def report(res: dict[str, Any]) -> str:
    frac = res["load"].get("foreign_cpu_fraction")
    out = [
        f"machine: {H.machine_line(res['machine'])}; other load during run "
        + ("?" if frac is None else f"{100 * frac:.0f}%"),
        "",
        "1. one-shot polar of a Gaussian X: time and ‖QᵀQ − I‖_F",
        f"{'shape':>10} {'dtype':>8} {'method':<34} {'time':>12} {'‖QᵀQ−I‖_F':>11} "
        f"{'/LAPACK QR':>10} {'iters':>5}",
    ]
    out += _polar_lines(res["polar"], 8, 34)
    out += [
        "",
        "2. Newton–Schulz iterations from a tangent step X + ξ (float64)",
        f"{'shape':>10} {'‖ξ‖₂':>6} {'iters':>5} {'target':>6} {'met':>4} {'restart':>7} "
        f"{'‖QᵀQ−I‖_F':>11} {'QR floor':>10} {'vs SVD':>9} {'time':>12}",
    ]
    for r in res["tangent"]:
        out.append(
            f"{r['N']:>5}×{r['M']:<4} {r['xi_norm2']:>6} {r['iterations']!s:>5} "
            f"{'≤' + str(r['target']):>6} {'yes' if r['met'] else 'NO':>4} "
            f"{r['restart_iterations']:>7} {r['orth_err']:11.2e} {r['qr_floor']:10.2e} "
            f"{r['max_diff_vs_svd_polar']:9.1e} {_fmt_t(r['median_s'])}"
        )
    out += [
        "",
        "3. Cayley retraction, canonical metric, M = 16: SMW vs dense N×N solve",
        f"{'N':>6} {'method':<18} {'time':>12} {'peak memory':>12} {'‖YᵀY−I‖_F':>11} "
        f"{'max|SMW−dense|':>15}",
    ]
    for r in res["cayley"]:
        out.append(
            f"{r['N']:>6} {r['method']:<18} {_fmt_t(r['median_s'])} {_fmt_b(r['peak_bytes'])} "
            f"{r['orth_err']:11.2e} {r['max_diff_smw_vs_dense']:15.1e}"
        )
    out += ["", "4. explicit VJP time / forward time", f"{'map':<20} {'shape':>10} {'ratio':>6}"]
    for r in res["vjp"]:
        out.append(f"{r['map']:<20} {r['N']:>5}×{r['M']:<4} {r['ratio']:6.2f}")
    out += [
        "",
        "5. complex: one-shot polar of a complex Gaussian X (‖QᴴQ − I‖_F), VJP / forward",
        f"{'shape':>10} {'dtype':>10} {'method':<26} {'time':>12} {'‖QᴴQ−I‖_F':>11} "
        f"{'/LAPACK QR':>10} {'iters':>5}",
    ]
    out += _polar_lines(res["complex"]["polar"], 10, 26)
    out.append(f"{'map (complex128)':<20} {'shape':>10} {'ratio':>6}")
    for r in res["complex"]["vjp"]:
        out.append(f"{r['map']:<20} {r['N']:>5}×{r['M']:<4} {r['ratio']:6.2f}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = H.parser(__doc__, "small sizes, a smoke test (< 20 s)").parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = H.out_dir(args)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    res: dict[str, Any] = {"machine": H.machine_info(), "quick": args.quick, "config": cfg}
    monitor = H.LoadMonitor()
    with H.Bench(cfg["profile"], planned(cfg), "retractions") as b:
        res["polar"] = bench_polar(b, cfg, rng)
        res["tangent"] = bench_tangent(b, cfg, rng)
        res["cayley"] = bench_cayley(b, cfg, rng)
        res["vjp"] = bench_vjp(b, cfg, rng)
        res["complex"] = bench_complex(b, cfg, rng)
    res["load"] = monitor.result(res["machine"]["cores_available"])
    res["wall_s"] = time.perf_counter() - t0
    text = report(res)
    print(text)
    print(f"\nwall time {res['wall_s']:.1f} s")
    H.write(out_dir / "retractions.json", res)
    H.write(out_dir / "retractions.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
