"""SVD-Householder (svdRNN) benchmark: applying W = Q_U Σ Q_Vᵀ to a block of vectors (CPU,
NumPy backend), next to the flop counts of svdRNN's Table 1.

Run ``python -m benchmarks.svd`` (N ∈ {128, 256, 512, 1024}, float64 and float32; ~1 min on
2 idle cores; writes ``build/bench/svd.json`` and ``svd.md``) or
``python -m benchmarks.svd --quick`` (N ∈ {64, 128}, a smoke test; writes
``build/bench/quick/``). ``--out DIR`` overrides the directory.

Square W (N×N) with 2N reflectors (k₁ = k₂ = N, Gaussian vectors), X ∈ ℝ^{N×B}, B = 64.
Rows, measured side by side in one run:

* ``ours: build + apply`` — ``svd_householder(U, σ, V) @ X``: both CWY factor pairs
  (2·(N·k² + k³/3) flops), then two CWY applies (2·(4·N·k·B + k²·B) + N·B);
* ``ours: apply`` — the same operator, factors already built (an RNN applies one W at every
  time step);
* ``ours: VJP`` — ``svd_householder_apply_vjp`` (factors + two apply backward passes);
* ``form W (.matrix()) + GEMM`` — W formed densely, then W @ X;
* ``two GEMMs (dense Q_U, Q_V)`` — Q_U (σ ⊙ (Q_Vᵀ X)) with the orthogonal factors given as
  dense matrices: the GEMM work of an SVD-form apply (4·N²·B);
* ``one GEMM (dense W)`` — W @ X with W given (2·N²·B);
* ``sequential (svdRNN Alg. 1)`` — 2N reflections one at a time (``householder_apply``),
  the paper's method.

Flop columns: ``flops`` is what each row executes; ``Table 1`` is the paper's count for the
local forward pass with structured reflectors, (4n(m₁+m₂) − 2m₁² − 2m₂²)·B, or backward,
(6n(m₁+m₂) − 1.5m₁² − 1.5m₂²)·B for the VJP row. GFLOP/s = flops / median time, for both
counts.

Timing (``benchmarks/_harness.py``): the methods of one (N, dtype) timed side by side,
round-robin, after one warm-up call each; the median of 3..max_rep samples (≥ min_total
seconds together). The machine's load during the run is stored (other processes on a 2-core VM make
BLAS timings noisy by up to 2×; see benchmarks/README.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import householderla as hl
from benchmarks import _harness as H
from householderla.svd import svd_householder, svd_householder_apply_vjp

FULL = {
    "N": [128, 256, 512, 1024],
    "B": 64,
    "profile": H.Profile(sample_s=2e-3, min_total=0.3, max_total=3.0, max_rep=15),
    "seq_max_N": 1024,
}
QUICK = {
    "N": [64, 128],
    "B": 16,
    "profile": H.Profile(sample_s=0.0, min_total=0.05, max_total=0.5, max_rep=5),
    "seq_max_N": 128,
}
METHODS = [
    "ours: build + apply",
    "ours: apply",
    "ours: VJP",
    "form W (.matrix()) + GEMM",
    "two GEMMs (dense Q_U, Q_V)",
    "one GEMM (dense W)",
    "sequential (svdRNN Alg. 1)",
]


def table1(n: int, m1: int, m2: int, B: int) -> dict[str, float]:
    """svdRNN Table 1: local forward / backward flops for B right-hand sides."""
    return {
        "fp": (4.0 * n * (m1 + m2) - 2.0 * m1 * m1 - 2.0 * m2 * m2) * B,
        "bp": (6.0 * n * (m1 + m2) - 1.5 * m1 * m1 - 1.5 * m2 * m2) * B,
    }


def executed_flops(N: int, k: int, B: int) -> dict[str, float]:
    build = 2.0 * (N * k * k + k**3 / 3.0)
    apply = 2.0 * (4.0 * N * k * B + k * k * B) + N * B
    # dense Q per side: N·k² + k³/3 (factors) + 2·k²·N (T Uᵀ) + 2·N²·k (U (T Uᵀ)); then
    # W = (Q_U σ) Q_Vᵀ (2N³) and W @ X
    per_side = N * k * k + k**3 / 3.0 + 2.0 * k * k * N + 2.0 * N * N * k
    form = 2.0 * per_side + 2.0 * N**3 + 2.0 * N * N * B
    return {
        "ours: build + apply": build + apply,
        "ours: apply": apply,
        # factors + per side 8·N·k·B + 2·N·k² (docs/theory/vjp.rst, cost table) + 2·k·B
        "ours: VJP": build + 2.0 * (8.0 * N * k * B + 2.0 * N * k * k) + 2.0 * N * B,
        "form W (.matrix()) + GEMM": form,
        "two GEMMs (dense Q_U, Q_V)": 4.0 * N * N * B + N * B,
        "one GEMM (dense W)": 2.0 * N * N * B,
        "sequential (svdRNN Alg. 1)": 2.0 * 4.0 * N * k * B + N * B,
    }


def bench(b: H.Bench, cfg: dict[str, Any], rng: np.random.Generator) -> list[dict[str, Any]]:
    rows = []
    B = cfg["B"]
    for N in cfg["N"]:
        U64, V64 = rng.standard_normal((N, N)), rng.standard_normal((N, N))
        s64 = rng.uniform(0.5, 1.5, N)
        X64, G64 = rng.standard_normal((N, B)), rng.standard_normal((N, B))
        for dtype in (np.float64, np.float32):
            U, V, s, X, G = (a.astype(dtype) for a in (U64, V64, s64, X64, G64))
            op = svd_householder(U, s, V)
            op @ X  # builds and caches the factors of both sides
            W = op.matrix()
            QU, QV = op.Q_U.matrix(), op.Q_V.matrix()
            Vrev = V[:, ::-1]  # Q_Vᵀ = H(v_k)…H(v₁)

            def sequential(U=U, s=s, X=X, Vrev=Vrev):
                return hl.householder_apply(U, s[:, None] * hl.householder_apply(Vrev, X))

            fns: dict[str, Callable[[], Any]] = {
                "ours: build + apply": lambda U=U, s=s, V=V, X=X: svd_householder(U, s, V) @ X,
                "ours: apply": lambda op=op, X=X: op @ X,
                "ours: VJP": lambda U=U, s=s, V=V, X=X, G=G: svd_householder_apply_vjp(
                    U, s, V, X, G
                ),
                "form W (.matrix()) + GEMM": lambda U=U, s=s, V=V, X=X: (
                    svd_householder(U, s, V).matrix() @ X
                ),
                "two GEMMs (dense Q_U, Q_V)": lambda QU=QU, QV=QV, s=s, X=X: (
                    QU @ (s[:, None] * (QV.T @ X))
                ),
                "one GEMM (dense W)": lambda W=W, X=X: W @ X,
            }
            if N <= cfg["seq_max_N"]:
                fns["sequential (svdRNN Alg. 1)"] = sequential
            ref = (W.astype(np.float64) @ X64).astype(np.float64)
            scale = float(np.max(np.abs(ref)))
            t1 = table1(N, N, N, B)
            flops = executed_flops(N, N, B)
            times = b.side_by_side(f"N={N} {np.dtype(dtype).name}", fns)
            for name in METHODS:
                if name not in fns:
                    rows.append(
                        {
                            "N": N,
                            "dtype": np.dtype(dtype).name,
                            "method": name,
                            "skipped": "N > seq_max_N (pure-Python loop of 2N steps)",
                        }
                    )
                    b.step(f"N={N} {name} skipped")
                    continue
                fn, t = fns[name], times[name]
                out = fn()
                err = None
                if name != "ours: VJP":
                    err = float(np.max(np.abs(np.asarray(out, dtype=np.float64) - ref))) / scale
                paper = t1["bp"] if name == "ours: VJP" else t1["fp"]
                rows.append(
                    {
                        "N": N,
                        "dtype": np.dtype(dtype).name,
                        "method": name,
                        "B": B,
                        "reflectors": 2 * N,
                        "flops": flops[name],
                        "table1_flops": paper,
                        "gflops": flops[name] / t["median_s"] / 1e9,
                        "table1_gflops": paper / t["median_s"] / 1e9,
                        "rel_err_vs_dense": err,
                        **t,
                    }
                )
    return rows


def _fmt_t(s: float) -> str:
    return f"{s * 1e3:10.3f} ms" if s < 1 else f"{s:10.3f} s "


def report(res: dict[str, Any]) -> str:
    load = res["load"]
    frac = load.get("foreign_cpu_fraction")
    lines = [
        f"machine: {H.machine_line(res['machine'])}; "
        f"loadavg {load.get('loadavg_start')} -> {load.get('loadavg_end')}, "
        f"other processes used {'?' if frac is None else f'{100 * frac:.0f}%'} of the CPU",
        "",
        f"svdRNN W = Q_U Σ Q_Vᵀ, N×N with 2N reflectors, W @ X for X of N×{res['config']['B']}",
        "",
        "| N | dtype | method | time | time / one GEMM | flops | GFLOP/s | Table 1 flops "
        "| Table 1 GFLOP/s | rel. err |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
        if "skipped" in r:
            lines.append(f"| {r['N']} | {r['dtype']} | {r['method']} | skipped | | | | | | |")
            continue
        gemm = next(
            x["median_s"]
            for x in res["rows"]
            if (x["N"], x["dtype"], x["method"]) == (r["N"], r["dtype"], "one GEMM (dense W)")
        )
        err = "" if r["rel_err_vs_dense"] is None else f"{r['rel_err_vs_dense']:.1e}"
        lines.append(
            f"| {r['N']} | {r['dtype']} | {r['method']} | {_fmt_t(r['median_s']).strip()} "
            f"| {r['median_s'] / gemm:.1f} | {r['flops']:.3g} | {r['gflops']:.2f} "
            f"| {r['table1_flops']:.3g} | {r['table1_gflops']:.2f} | {err} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = H.parser(__doc__).parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = H.out_dir(args)
    rng = np.random.default_rng(0)
    monitor = H.LoadMonitor()
    res: dict[str, Any] = {"machine": H.machine_info(), "quick": args.quick, "config": cfg}
    with H.Bench(cfg["profile"], len(cfg["N"]) * 2 * len(METHODS), "svd") as b:
        res["rows"] = bench(b, cfg, rng)
    res["load"] = monitor.result(res["machine"]["cores_available"])
    text = report(res)
    print(text)
    print(f"\nwall time {res['load']['wall_s']:.1f} s")
    H.write(out_dir / "svd.json", res)
    H.write(out_dir / "svd.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
