"""Structured (lower-trapezoidal, oRNN / LAPACK layout) compact WY vs dense: apply, backward,
forming Q.

Run ``python -m benchmarks.structured`` (full) or ``python -m benchmarks.structured --quick``
(small sizes, a smoke test; writes ``build/bench/quick/``); ``--out DIR`` elsewhere.
Writes ``structured.json`` (every raw time, machine info, load) and ``structured.md`` (the
tables below).

Tables:

1. *Apply* y = Q h for V (n, m) lower trapezoidal, n ∈ {256, 512, 1024}, m ∈ {n/4, n/2,
   n − 1} (quick: n ∈ {256, 512}, m ∈ {n/4, n − 1}), B ∈ {1, 64}, from prebuilt factors
   (U, T): the dense products (``lowrank_apply`` of the package's compact-WY kernels), the
   blocked products that skip the zeros (``lowrank_apply`` of its trapezoidal kernels, ours;
   both private, imported through ``benchmarks/_internals.py``), SciPy BLAS ``trmm`` for the
   triangles + GEMM for the rest (a reference implementation written here, 2-D NumPy only),
   ``hl.cwy(V) @ h`` as dispatched (structure "auto"), and dense / blocked on torch tensors.
   Achieved GFLOP/s are against Mhammedi et al. (ICML 2017) Table 2's forward count
   (4n − m + 2)·m·B for every method, so they are inverse times on one scale; the dense
   products spend 4nmB + 2m²B.
2. *Backward* of the apply (the oRNN VJP's core, from prebuilt factors): dense
   (``lowrank_vjp`` + ``factors_vjp``) vs blocked (the trapezoidal kernels' ``apply_vjp``);
   GFLOP/s against Table 2's BP count (7n − 2m + 3)·m·B.
3. *Forming Q* from LAPACK's reflectors (``torch.geqrf``) at n ∈ {256, 512, 1024}:
   ``hl.cwy(V).matrix()`` structured (orgqr-style blocked) vs dense (one-shot I − U T Uᵀ,
   ``structure="dense"``, factors included) vs ``torch.linalg.householder_product`` (LAPACK
   orgqr); GFLOP/s against orgqr's 4n³/3.

Timing (``benchmarks/_harness.py``): every method of one row is warmed up, then timed
round-robin (one sample each per round, ``rounds`` rounds, loops per sample calibrated to
≥ 1 ms), so that background load hits all methods alike; the table shows the median, the
JSON all times and the minimum. Timings on a shared machine are noisy: the load
other processes put on the CPU during the run is stored and printed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import array_api_compat as aac
import numpy as np
import scipy.linalg.blas as blas

import householderla as hl
from benchmarks import _harness as H
from benchmarks import _internals as I

K = I.compact_wy()  # dense CWY kernels (private)
S = I.trapezoidal()  # blocked lower-trapezoidal kernels (private)

FULL = {
    "apply_ns": [256, 512, 1024],
    "apply_m_fracs": [(1, 4), (1, 2), (1, 1)],  # m = n·p/q, (1, 1) meaning n − 1
    "apply_bs": [1, 64],
    "dtypes": ["float64", "float32"],
    "form_ns": [256, 512, 1024],
    "rounds": 15,
    "sample_s": 1e-3,
}
QUICK = {
    "apply_ns": [256, 512],
    "apply_m_fracs": [(1, 4), (1, 1)],
    "apply_bs": [1, 64],
    "dtypes": ["float64"],
    "form_ns": [256, 512],
    "rounds": 5,
    "sample_s": 0.0,
}

XP_NP = aac.array_namespace(np.empty(0))


def ms(n: int, cfg: dict[str, Any]) -> list[int]:
    """The m of each row: n·p/q, and n − 1 (the oRNN maximum) for (1, 1)."""
    return [n - 1 if (p, q) == (1, 1) else n * p // q for p, q in cfg["apply_m_fracs"]]


def profile(cfg: dict[str, Any], rounds: int | None = None) -> H.Profile:
    r = rounds or cfg["rounds"]
    return H.Profile(sample_s=cfg["sample_s"], min_total=0.0, max_total=60.0, min_rep=r, max_rep=r)


def trmm_apply(U: np.ndarray, T: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """y = h − U T Uᵀ h with BLAS trmm for the triangles U₁ (m × m, lower) and T (upper),
    GEMM for U₂; the layout work (Fortran copies of U₁ᵀ and T) is done once, like factors."""
    m = U.shape[1]
    trmm = blas.get_blas_funcs("trmm", (U,))
    U1t = np.asfortranarray(U[:m].T)  # upper triangular
    U2 = U[m:]
    Tf = np.asfortranarray(T)

    def apply(h: np.ndarray) -> np.ndarray:
        h1, h2 = h[:m], h[m:]
        a = trmm(1.0, U1t, h1, lower=0)  # U₁ᵀ h₁
        a += U2.T @ h2
        b = trmm(1.0, Tf, a, lower=0, overwrite_b=1)
        top = trmm(1.0, U1t, b, lower=0, trans_a=1)  # U₁ b
        return np.concatenate([h1 - top, h2 - U2 @ b])

    return apply


def trapezoid(rng: np.random.Generator, n: int, m: int, dtype: str) -> np.ndarray:
    return np.tril(rng.standard_normal((n, m))).astype(dtype)


def _apply_methods(
    U: Any, T: Any, tr: Any, op: Any, h: Any, Ut: Any, Tt: Any, ht: Any, xp_t: Any
) -> dict[str, Callable[[], Any]]:
    kw = {"transpose": False, "mode": "square"}
    return {
        "dense": lambda: K.lowrank_apply(U, T, h, XP_NP, **kw),
        "blocked (ours)": lambda: S.lowrank_apply(U, T, h, XP_NP, **kw),
        "trmm (SciPy BLAS)": lambda: tr(h),
        "hl.cwy(V) @ h (auto)": lambda: op @ h,
        "torch dense": lambda: K.lowrank_apply(Ut, Tt, ht, xp_t, **kw),
        "torch blocked": lambda: S.lowrank_apply(Ut, Tt, ht, xp_t, **kw),
    }


def bench_apply(b: H.Bench, cfg: dict[str, Any], rng: np.random.Generator) -> list[dict]:
    import torch

    xp_t = aac.array_namespace(torch.empty(0))
    rows = []
    for dtype in cfg["dtypes"]:
        for n in cfg["apply_ns"]:
            for m in ms(n, cfg):
                V = trapezoid(rng, n, m, dtype)
                op = hl.cwy(V)
                U, T = op.U, op.T_factor
                tr = trmm_apply(U, T)
                Ut, Tt = torch.asarray(U), torch.asarray(T)
                for B in cfg["apply_bs"]:
                    h = rng.standard_normal((n, B)).astype(dtype)
                    fns = _apply_methods(U, T, tr, op, h, Ut, Tt, torch.asarray(h), xp_t)
                    ref = fns["dense"]()
                    err = {
                        k: float(np.max(np.abs(np.asarray(f()) - ref)))
                        for k, f in fns.items()
                        if k != "dense"
                    }
                    res = b.side_by_side(f"apply {dtype} n={n} m={m} B={B}", fns)
                    table2 = (4 * n - m + 2) * m * B
                    dense_flops = 4 * n * m * B + 2 * m * m * B
                    for k, r in res.items():
                        rows.append(
                            {
                                "dtype": dtype,
                                "n": n,
                                "m": m,
                                "B": B,
                                "method": k,
                                "table2_flops": table2,
                                "dense_flops": dense_flops,
                                "gflops_table2": table2 / r["median_s"] / 1e9,
                                "speedup_vs_dense": res["dense"]["median_s"] / r["median_s"],
                                "max_abs_diff_vs_dense": err.get(k, 0.0),
                                "structured_dispatched": S.use_structured(n, m, B),
                                **r,
                            }
                        )
    return rows


def bench_vjp(b: H.Bench, cfg: dict[str, Any], rng: np.random.Generator) -> list[dict]:
    rows = []
    for n in cfg["apply_ns"]:
        for m in ms(n, cfg):
            V = trapezoid(rng, n, m, "float64")
            U, T, r = K.cwy_factors(V, XP_NP)
            for B in cfg["apply_bs"]:
                h, g = rng.standard_normal((2, n, B))

                def dense(U=U, T=T, r=r, h=h, g=g):
                    Ub, hb, _, Sb = K.lowrank_vjp(U, T, h, g, XP_NP, transpose=False, mode="square")
                    return np.tril(K.factors_vjp(U, r, Ub, Sb, XP_NP)), hb

                fns = {
                    "dense": dense,
                    "blocked (ours)": lambda U=U, T=T, r=r, h=h, g=g: S.apply_vjp(
                        U, T, r, h, g, XP_NP
                    ),
                }
                d1, d2 = dense(), fns["blocked (ours)"]()
                diff = max(
                    float(np.max(np.abs(d1[0] - d2[0]))), float(np.max(np.abs(d1[1] - d2[1])))
                )
                res = b.side_by_side(f"vjp n={n} m={m} B={B}", fns)
                table2 = (7 * n - 2 * m + 3) * m * B
                for k, t in res.items():
                    rows.append(
                        {
                            "n": n,
                            "m": m,
                            "B": B,
                            "method": k,
                            "table2_bp_flops": table2,
                            "gflops_table2": table2 / t["median_s"] / 1e9,
                            "speedup_vs_dense": res["dense"]["median_s"] / t["median_s"],
                            "max_abs_diff_vs_dense": diff if k != "dense" else 0.0,
                            **t,
                        }
                    )
    return rows


def bench_form(b: H.Bench, cfg: dict[str, Any], rng: np.random.Generator) -> list[dict]:
    import torch

    rows = []
    for n in cfg["form_ns"]:
        a, tau = torch.geqrf(torch.asarray(rng.standard_normal((n, n))))
        Vl = ((torch.tril(a, -1) + torch.eye(n, dtype=a.dtype)) * (tau != 0)).numpy()
        fns = {
            "structured .matrix() (ours)": lambda Vl=Vl: hl.cwy(
                Vl, structure="trapezoidal"
            ).matrix(),
            "dense .matrix() (one-shot)": lambda Vl=Vl: hl.cwy(Vl, structure="dense").matrix(),
            "torch.linalg.householder_product (orgqr)": lambda a=a, tau=tau: (
                torch.linalg.householder_product(a, tau)
            ),
        }
        ref = fns["torch.linalg.householder_product (orgqr)"]().numpy()
        res = b.side_by_side(f"form n={n}", fns, min_rep=max(3, cfg["rounds"] // 3))
        flops = 4 * n**3 / 3
        for k, t in res.items():
            Q = np.asarray(fns[k]())
            rows.append(
                {
                    "n": n,
                    "method": k,
                    "flops_orgqr": flops,
                    "gflops": flops / t["median_s"] / 1e9,
                    "orth_err": H.orth_err(Q),
                    "max_abs_diff_vs_orgqr": float(np.max(np.abs(Q - ref))),
                    **t,
                }
            )
    return rows


def _t(s: float) -> str:
    return f"{s * 1e3:.3f} ms"


def report(res: dict[str, Any]) -> str:
    frac = res["load"].get("foreign_cpu_fraction")
    out = [
        "# Structured (lower-trapezoidal) CWY benchmark",
        "",
        f"machine: {H.machine_line(res['machine'])}; other processes used "
        f"{'?' if frac is None else f'{100 * frac:.0f}'}% of the CPU during the run",
        "(timings on a shared machine are noisy; medians of round-robin repeats)",
        "",
        "## 1. Apply y = Q h (prebuilt factors); GFLOP/s against "
        "Mhammedi et al. (ICML 2017) Table 2 (4n − m + 2)·m·B",
        "",
        "| dtype | n | m | B | method | time | GFLOP/s (Table 2) "
        "| time / dense (lower is better) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in res["apply"]:
        out.append(
            f"| {r['dtype']} | {r['n']} | {r['m']} | {r['B']} | {r['method']} | "
            f"{_t(r['median_s'])} | {r['gflops_table2']:.2f} "
            f"| {H.fmt_ratio(1 / r['speedup_vs_dense'])} |"
        )
    out += [
        "",
        "## 2. Backward of the apply (float64, prebuilt factors); GFLOP/s against Table 2 BP "
        "(7n − 2m + 3)·m·B",
        "",
        "| n | m | B | method | time | GFLOP/s (Table 2) | time / dense (lower is better) "
        "| max diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in res["vjp"]:
        out.append(
            f"| {r['n']} | {r['m']} | {r['B']} | {r['method']} | {_t(r['median_s'])} | "
            f"{r['gflops_table2']:.2f} | {H.fmt_ratio(1 / r['speedup_vs_dense'])} | "
            f"{r['max_abs_diff_vs_dense']:.1e} |"
        )
    out += [
        "",
        "## 3. Forming Q from LAPACK's reflectors (float64); GFLOP/s against orgqr's 4n³/3",
        "",
        "| n | method | time | GFLOP/s | ‖QᵀQ − I‖_F | max \\|Q − Q_orgqr\\| |",
        "|---|---|---|---|---|---|",
    ]
    for r in res["form"]:
        out.append(
            f"| {r['n']} | {r['method']} | {_t(r['median_s'])} | {r['gflops']:.2f} | "
            f"{r['orth_err']:.2e} | {r['max_abs_diff_vs_orgqr']:.1e} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = H.parser(__doc__).parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = H.out_dir(args)
    rng = np.random.default_rng(0)
    rows = len(cfg["apply_ns"]) * len(cfg["apply_m_fracs"]) * len(cfg["apply_bs"])
    total = (len(cfg["dtypes"]) * 6 + 2) * rows + 3 * len(cfg["form_ns"])
    info = H.machine_info()
    mon = H.LoadMonitor()
    res: dict[str, Any] = {"machine": info, "quick": args.quick, "config": cfg}
    with H.Bench(profile(cfg), total, "structured") as b:
        res["apply"] = bench_apply(b, cfg, rng)
        res["vjp"] = bench_vjp(b, cfg, rng)
        res["form"] = bench_form(b, cfg, rng)
    res["load"] = mon.result(info["cores_available"])
    text = report(res)
    print(text)
    print()
    H.write(out_dir / "structured.json", res)
    H.write(out_dir / "structured.md", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
