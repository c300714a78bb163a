"""Rows (b) forming Q, (c) accuracy, (e) memory and the forming-Q plot of the headline run
(``python -m benchmarks.run``); not a script. Imports the harness and the public API only."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.linalg as sla

import householderla as hl
from benchmarks import _harness as H
from benchmarks._cwy_rows import time_sequential


def fl_matrix_from_v(N: int, L: int) -> float:
    # one-shot I − V S⁻¹ Vᵀ: syrk N·L², triangular solve L²·N, GEMM 2·N²·L
    return N * L * L + L * L * N + 2.0 * N * N * L


def fl_orgqr(N: int) -> float:
    return 4.0 * N**3 / 3.0


def lapack_reflectors(A: np.ndarray) -> tuple[Any, Any, np.ndarray, int]:
    """geqrf of A -> (a, tau) and the reflector matrix Vl with H(Vl[:, k]) = I − τ_k v_k v_kᵀ.

    Vl = tril(a, −1) + I (LAPACK's unit-diagonal v_k). A column with τ_k = 0 is LAPACK's
    identity reflector (always the last one for square A: dlarfg of a 1-vector), which in our
    convention is the zero vector (H(0) = I); with its unit diagonal kept it would be
    H(e_k) = I − 2 e_k e_kᵀ, a different Q.
    """
    import torch

    a, tau = torch.geqrf(torch.from_numpy(A))
    K = A.shape[1]
    Vl = np.tril(a.numpy(), -1)[:, :K].copy()
    idx = np.arange(K)
    Vl[idx, idx] = 1.0
    zero = tau.numpy() == 0
    Vl[:, zero] = 0.0
    return a, tau, Vl, int(zero.sum())


def _forming_fields(r: dict[str, Any], timed: dict[str, Any], gflops64: float) -> None:
    """The row's figures once its pairs (``timed``) and its sequential loop are timed."""
    N = r["N"]
    r.update(timed["lapack"])
    r["cwy_matrix"], r["cayley_solve"] = (
        timed["cayley"]["cwy_matrix"],
        timed["cayley"]["cayley_solve"],
    )
    r["expm"], r["cwy_matrix_with_expm"] = timed["expm"]["expm"], timed["expm"]["cwy_matrix"]
    t = r["cwy_matrix"]["median_s"]
    r["speedup_vs_expm"] = H.paired_ratio(timed["expm"], "expm", "cwy_matrix")
    r["speedup_vs_cayley"] = H.paired_ratio(r, "cayley_solve", "cwy_matrix")
    seq = r["sequential"]
    r["speedup_vs_sequential"] = None if seq.get("skipped") else seq["paired_ratio"]
    r["ratio_lapack_reflectors_ours_over_orgqr"] = H.paired_ratio(
        r, "cwy_matrix_lapack_reflectors", "lapack_orgqr"
    )
    r["gemm_eff_cwy_matrix"] = fl_matrix_from_v(N, N) / t / 1e9 / gflops64
    # useful flops of forming Q from LAPACK's (trapezoidal) reflectors: orgqr's 4N³/3
    r["gemm_eff_cwy_matrix_lapack_reflectors"] = (
        fl_orgqr(N) / r["cwy_matrix_lapack_reflectors"]["median_s"] / 1e9 / gflops64
    )
    r["gemm_eff_orgqr"] = fl_orgqr(N) / r["lapack_orgqr"]["median_s"] / 1e9 / gflops64


def bench_forming_q(b: H.Bench, cfg: Any, gflops64: float) -> list[dict[str, Any]]:
    """(b) forming the dense N×N Q: CWY, LAPACK orgqr, expm, Cayley (solve), sequential. At
    the largest N (the headline's) each anchor is paired with ours in rounds of its own,
    ``cfg.forming_rounds`` of them spread over the rest of the run
    (:meth:`~benchmarks._harness.Bench.spread`); that row is complete when the run's bench is
    drained."""
    import torch

    rng = np.random.default_rng(3)
    rows = []
    for N in cfg.form_ns:
        V = rng.standard_normal((N, N))
        X = rng.standard_normal((N, N))
        Ask = (X - X.T) / 2.0
        eye = np.eye(N)
        a, tau, Vl, n_zero = lapack_reflectors(rng.standard_normal((N, N)))
        r: dict[str, Any] = {"N": N, "lapack_zero_tau_columns": n_zero}
        ours = lambda V=V: hl.cwy(V).matrix()  # noqa: E731
        cayley = lambda Ask=Ask, eye=eye: sla.solve(eye + Ask / 2.0, eye - Ask / 2.0)  # noqa: E731
        pairs = {
            "cayley": {"cwy_matrix": ours, "cayley_solve": cayley},
            "expm": {"cwy_matrix": ours, "expm": lambda Ask=Ask: sla.expm(Ask)},
            "lapack": {
                "cwy_matrix_lapack_reflectors": lambda Vl=Vl: hl.cwy(Vl).matrix(),
                "lapack_orgqr": lambda a=a, tau=tau: torch.linalg.householder_product(a, tau),
            },
        }
        # the headline's row: each anchor paired with ours in rounds of its own (timed
        # together with expm, 0.65 s a call at N = 1024, orgqr and Cayley got two or three
        # rounds: over three two-thread runs the LAPACK pair read 0.64-0.79x, Cayley
        # 0.81-1.39x), spread over the run (in one burst of >= 4 s, one two-thread run's
        # CWY matrix took 92-95 ms in six of its eleven rounds and 53-59 ms in the others)
        head = N == max(cfg.form_ns)
        label = f"forming Q N={N}"
        if head:
            b.bar.set_description(label[:48])
            jobs = {k: H.SpreadRounds(fns, b.prof) for k, fns in pairs.items()}
            b.step(label, 2 * len(jobs) - 1)  # the last step when the rounds are done

            def finish(_: Any, r: dict[str, Any] = r, jobs: dict[str, Any] = jobs) -> None:
                """Once both the pairs' rounds (``r["pairs"]``) and the loop's are done."""
                parts = (r.get(k, {"pending": 1}) for k in ("pairs", "sequential"))
                if not any(p.get("pending") for p in parts):
                    _forming_fields(r, {k: j.result() for k, j in jobs.items()}, gflops64)

            r["pairs"] = b.spread(
                label,
                lambda i, jobs=jobs: [j(i) for j in jobs.values()],
                cfg.forming_rounds,
                lambda _: {},
                then=finish,
            )
        else:
            timed = {k: b.side_by_side(f"{label} vs {k}", fns) for k, fns in pairs.items()}
        r["sequential"] = time_sequential(
            b,
            f"householder_product N={N}",
            lambda k, V=V: hl.householder_product(V[:, :k]),
            N,
            cfg.seq_skip_s,
            pair=lambda V=V: hl.cwy(V).matrix(),
            spread_rounds=cfg.forming_rounds if head else 0,
            then=finish if head else None,
        )
        if head and r["sequential"].get("skipped"):
            finish(None)
        elif not head:
            _forming_fields(r, timed, gflops64)
        rows.append(r)
    return rows


def bench_accuracy(b: H.Bench, cfg: Any) -> list[dict[str, Any]]:
    """(c) ‖QᵀQ − I‖_F of cwy(Vl).matrix() vs LAPACK orgqr on the same reflectors."""
    import torch

    rng = np.random.default_rng(4)
    rows = []
    for dt in (np.float32, np.float64):
        for N in cfg.acc_ns:
            A = rng.standard_normal((N, N)).astype(dt)
            a, tau, Vl, n_zero = lapack_reflectors(A)
            assert Vl.dtype == dt
            Q_ours = hl.cwy(Vl).matrix()
            b.step(f"accuracy ours {np.dtype(dt).name} N={N}")
            Q_lap = torch.linalg.householder_product(a, tau).numpy()
            b.step(f"accuracy LAPACK {np.dtype(dt).name} N={N}")
            e_ours, e_lap = H.orth_err(Q_ours), H.orth_err(Q_lap)
            diff = np.max(np.abs(Q_ours.astype(np.float64) - Q_lap.astype(np.float64)))
            rows.append(
                {
                    "dtype": np.dtype(dt).name,
                    "N": N,
                    "ours_dtype": str(Q_ours.dtype),
                    "orth_err_ours": e_ours,
                    "orth_err_lapack": e_lap,
                    "ratio_ours_over_lapack": e_ours / e_lap if e_lap > 0 else math.inf,
                    "max_abs_diff_ours_vs_lapack": float(diff),
                    "lapack_zero_tau_columns": n_zero,
                }
            )
    return rows


def dense_first_columns(U: np.ndarray, T: np.ndarray, M: int) -> np.ndarray:
    """First M columns of I − U T Uᵀ via the N×N matrix (in place: the smallest dense peak,
    ≈ 8·N² bytes)."""
    N = U.shape[0]
    Q = U @ (T @ U.T)
    np.negative(Q, out=Q)
    Q.flat[:: N + 1] += 1.0
    return Q[:, :M].copy()


def bench_memory(b: H.Bench, cfg: Any) -> dict[str, Any]:
    """(e) peak memory of T-CWY apply vs forming an N×N intermediate."""
    N, M = cfg.mem_n, cfg.mem_m
    rng = np.random.default_rng(6)
    V = rng.standard_normal((N, M))
    x = rng.standard_normal((M, 1))
    Om = hl.tcwy(V)
    Om.U, Om.T_factor  # noqa: B018 - build the factors
    out: dict[str, Any] = {"N": N, "M": M, "itemsize": 8}
    out["ours_build_and_apply_peak_bytes"] = H.peak_bytes(lambda: hl.tcwy(V) @ x)
    b.step(f"memory tcwy(V)@x N={N}")
    out["ours_apply_prebuilt_peak_bytes"] = H.peak_bytes(lambda: Om @ x)
    b.step(f"memory Ω@x N={N}")
    out["ours_matrix_peak_bytes"] = H.peak_bytes(lambda: hl.tcwy(V).matrix())
    b.step(f"memory tcwy(V).matrix() N={N}")
    out["n_m_bytes"] = N * M * 8
    out["dense_nxn_bytes_analytic"] = N * N * 8
    out["ours_time"] = b.time(f"time tcwy(V)@x N={N}", lambda: hl.tcwy(V) @ x)
    dense = []
    for n in cfg.mem_dense_ns:
        Vd = rng.standard_normal((n, M))
        O = hl.tcwy(Vd)
        U, T = O.U, O.T_factor
        pk = H.peak_bytes(lambda U=U, T=T: dense_first_columns(U, T, M))
        b.step(f"memory dense N={n}")
        ours = H.peak_bytes(lambda Vd=Vd: hl.tcwy(Vd) @ x)
        s = time.perf_counter()
        D = dense_first_columns(U, T, M)
        t_dense = time.perf_counter() - s
        err = float(np.max(np.abs(D - O.matrix())))
        del D
        dense.append(
            {
                "N": n,
                "dense_peak_bytes": pk,
                "dense_nxn_bytes_analytic": n * n * 8,
                "ours_build_and_apply_peak_bytes": ours,
                "dense_time_s": t_dense,
                "max_abs_diff_dense_vs_tcwy_matrix": err,
            }
        )
    out["dense_measured"] = dense
    # the N×N peak extrapolated from the largest measured dense run (bytes per N²)
    big = dense[-1]
    out["dense_peak_bytes_extrapolated"] = big["dense_peak_bytes"] / big["N"] ** 2 * N**2
    out["ratio_ours_over_dense"] = (
        out["ours_build_and_apply_peak_bytes"] / out["dense_nxn_bytes_analytic"]
    )
    out["ours_in_units_of_nm_bytes"] = out["ours_build_and_apply_peak_bytes"] / out["n_m_bytes"]
    b.step("memory done")
    return out


def plot_forming_q(rows: list[dict[str, Any]], path: Path, mline: str) -> None:
    plt = H.pyplot()
    Ns = [r["N"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    series = [
        ("cwy_matrix", "CWY matrix (dense V, L=N)", "o-"),
        ("cwy_matrix_lapack_reflectors", "CWY matrix (LAPACK reflectors)", "o--"),
        ("lapack_orgqr", "LAPACK orgqr (torch householder_product)", "s-"),
        ("expm", "expm (scipy)", "^-"),
        ("cayley_solve", "Cayley (scipy solve)", "v-"),
        ("sequential", "sequential reflections", "x-"),
    ]
    for key, label, style in series:
        pts = [(r["N"], r[key]["median_s"]) for r in rows if not r[key].get("skipped")]
        if pts:
            ax.loglog(*zip(*pts, strict=True), style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(Ns, [str(n) for n in Ns])
    ax.set_xlabel("N")
    ax.set_ylabel("time to form the N×N orthogonal matrix [s]")
    ax.set_title("Forming Q (float64, CPU)", fontsize=11)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    H.save_figure(fig, path, mline)
