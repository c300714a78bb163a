"""Benchmark harness of householderla (CPU, NumPy backend, float64 unless stated).

Run ``python -m benchmarks.run`` (full, a few minutes on 2 cores) or
``python -m benchmarks.run --quick`` (tiny sizes, a smoke test). See benchmarks/README.md for
what every row measures and the targets it is held to.

Timing: one warm-up call, then the median of ``r`` repeats timed with ``time.perf_counter``;
``r`` is chosen so that the repeats take at least ``min_total`` seconds together (at least 3,
at most ``max_rep``), but is cut down to fit ``max_total`` seconds (1 repeat for very long
calls). Sequential reference paths first time a short pilot (the first few reflectors) and
are skipped, with the reason printed and stored, when a single run is predicted to exceed
``seq_skip_s`` seconds.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import re
import socket
import statistics
import sys
import textwrap
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import scipy  # noqa: E402
import scipy.linalg as sla  # noqa: E402

import householderla as hl  # noqa: E402

try:  # tqdm is a bench extra; fall back to a silent counter without it
    from tqdm import tqdm
except ImportError:  # pragma: no cover
    tqdm = None


# --------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------
@dataclass
class Config:
    quick: bool
    min_total: float  # seconds the repeats of one measurement should take together
    max_total: float  # cap on the repeats of one measurement
    max_rep: int
    seq_skip_s: float  # skip a sequential reference run predicted to take longer than this
    gemm_n: int
    apply_ns: list[int]
    apply_l_fracs: list[int]  # L = N // frac
    apply_bs: list[int]
    head_n: int  # headline apply row (N, L, B)
    head_l: int
    head_b: int
    form_ns: list[int]  # forming Q (plot and rows); the largest is the headline
    acc_ns: list[int]
    vjp_shape: tuple[int, int, int]
    mem_n: int
    mem_m: int
    mem_dense_ns: list[int]
    eff_n: int
    eff_ls: list[int]
    eff_bs: list[int]
    extra: dict[str, Any] = field(default_factory=dict)


FULL = Config(
    quick=False,
    min_total=0.2,
    max_total=2.0,
    max_rep=30,
    seq_skip_s=20.0,
    gemm_n=1024,
    apply_ns=[256, 1024, 2048],
    apply_l_fracs=[8, 4, 1],
    apply_bs=[1, 64],
    head_n=1024,
    head_l=256,
    head_b=64,
    form_ns=[128, 256, 512, 1024],
    acc_ns=[256, 1024],
    vjp_shape=(1024, 256, 64),
    mem_n=30000,
    mem_m=50,
    mem_dense_ns=[2000, 4000, 8000],
    eff_n=1024,
    eff_ls=[32, 64, 128, 256, 512, 1024],
    eff_bs=[1, 16, 64, 256],
)

QUICK = Config(
    quick=True,
    min_total=0.01,
    max_total=0.1,
    max_rep=10,
    seq_skip_s=2.0,
    gemm_n=256,
    apply_ns=[32, 128],
    apply_l_fracs=[8, 4, 1],
    apply_bs=[1, 8],
    head_n=128,
    head_l=32,
    head_b=8,
    form_ns=[32, 64, 128],
    acc_ns=[64, 128],
    vjp_shape=(128, 32, 8),
    mem_n=2000,
    mem_m=10,
    mem_dense_ns=[250, 500, 1000],
    eff_n=128,
    eff_ls=[8, 16, 32, 64, 128],
    eff_bs=[1, 16],
)


def planned_measurements(c: Config) -> int:
    """Number of progress-bar steps (one per timed or memory measurement)."""
    n_apply = len(c.apply_ns) * len(c.apply_l_fracs) * len(c.apply_bs) * 3 + len(c.apply_ns) * len(
        c.apply_l_fracs
    )  # (cwy, 2-gemm, seq) per (N, L, B) + one build per (N, L)
    n_form = len(c.form_ns) * 6
    n_acc = 2 * len(c.acc_ns) * 2  # (float32, float64) × N × (ours, LAPACK)
    n_vjp = 2
    n_mem = 3 + len(c.mem_dense_ns) + 2
    n_eff = len(c.eff_ls) * len(c.eff_bs) * 2
    return 5 + n_apply + n_form + n_acc + n_vjp + n_mem + n_eff


# --------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------
class Runner:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        total = planned_measurements(cfg)
        if tqdm is not None:
            self.bar = tqdm(total=total, file=sys.stderr, unit="meas", dynamic_ncols=True)
        else:  # pragma: no cover
            self.bar = None
        self.notes: list[str] = []

    def step(self, label: str) -> None:
        if self.bar is not None:
            self.bar.set_description(label[:48])
            self.bar.update(1)

    def note(self, msg: str) -> None:
        self.notes.append(msg)
        if self.bar is not None:
            self.bar.write(msg, file=sys.stderr)
        else:  # pragma: no cover
            print(msg, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def time(
        self,
        label: str,
        fn: Callable[[], Any],
        *,
        warmup: bool = True,
        max_total: float | None = None,
    ) -> dict[str, Any]:
        """Warm-up + median of adaptively many repeats. Returns seconds and raw times."""
        c = self.cfg
        cap = c.max_total if max_total is None else max_total
        t_warm = None
        if warmup:
            s = time.perf_counter()
            fn()
            t_warm = time.perf_counter() - s
            est = t_warm
        else:
            est = math.inf
        if est >= cap:
            reps = 1
        else:
            reps = min(max(3, math.ceil(c.min_total / max(est, 1e-9))), c.max_rep)
            reps = max(1, min(reps, int(cap // max(est, 1e-9))))
        times = []
        for _ in range(reps):
            s = time.perf_counter()
            fn()
            times.append(time.perf_counter() - s)
        self.step(label)
        return {
            "median_s": statistics.median(times),
            "min_s": min(times),
            "repeats": reps,
            "warmup_s": t_warm,
            "times_s": times,
        }

    def time_sequential(
        self, label: str, fn_of_l: Callable[[int], Any], L: int
    ) -> dict[str, Any] | None:
        """Time ``fn_of_l(L)`` (cost linear in L) after a pilot with a few reflectors; skip it
        when one run is predicted to take longer than ``seq_skip_s``."""
        lp = min(L, 32)
        s = time.perf_counter()
        fn_of_l(lp)
        t_pilot = time.perf_counter() - s
        est = t_pilot * L / lp
        if est > self.cfg.seq_skip_s:
            self.note(
                f"[skip] {label}: one run predicted at {est:.1f} s "
                f"(pilot {lp} reflectors: {t_pilot:.3f} s) > {self.cfg.seq_skip_s:.0f} s"
            )
            self.step(label)
            return {"skipped": True, "predicted_s": est, "reason": "predicted single run too long"}
        long = est >= self.cfg.max_total
        r = self.time(label, lambda: fn_of_l(L), warmup=not long, max_total=3.0)
        r["predicted_s"] = est
        r["skipped"] = False
        if long:
            r["warmup_s"] = "pilot"
        return r


# --------------------------------------------------------------------------------------------
# machine
# --------------------------------------------------------------------------------------------
def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        affinity = os.cpu_count()
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "cpu_model": cpu,
        "cpu_count": os.cpu_count(),
        "cores_available": affinity,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "householderla": hl.__version__,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "thread_env": {
            k: os.environ[k]
            for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
            if k in os.environ
        },
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:  # pragma: no cover
        info["torch"] = None
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg.get("Build Dependencies", {}).get("blas", {})
        info["numpy_blas"] = {k: blas.get(k) for k in ("name", "version", "openblas configuration")}
    except Exception:  # pragma: no cover - older numpy
        info["numpy_blas"] = None
    try:
        from threadpoolctl import threadpool_info

        info["threadpools"] = threadpool_info()
    except ImportError:
        info["threadpools"] = None
    return info


def _cpu_busy_s() -> float | None:
    """Busy CPU seconds of the whole machine since boot (all cores; /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class LoadMonitor:
    """CPU time other processes used while we ran: benchmarks on a shared machine are only
    as good as this number (OpenBLAS threads stall when a core is taken)."""

    def __init__(self) -> None:
        self.load_start = os.getloadavg() if hasattr(os, "getloadavg") else None
        self.wall0 = time.perf_counter()
        self.busy0 = _cpu_busy_s()
        t = os.times()
        self.own0 = t.user + t.system

    def result(self, ncores: int) -> dict[str, Any]:
        wall = time.perf_counter() - self.wall0
        busy1 = _cpu_busy_s()
        t = os.times()
        own = t.user + t.system - self.own0
        out: dict[str, Any] = {
            "loadavg_start": self.load_start,
            "loadavg_end": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "own_cpu_s": own,
            "wall_s": wall,
        }
        if self.busy0 is not None and busy1 is not None:
            foreign = max(0.0, (busy1 - self.busy0) - own)
            out["foreign_cpu_s"] = foreign
            out["foreign_cpu_fraction"] = foreign / (wall * max(ncores, 1))
        return out


def idle_fraction_now(seconds: float = 0.5) -> float | None:
    """Fraction of the machine's CPU that is idle over a short window (before we start)."""
    b0, w0 = _cpu_busy_s(), time.perf_counter()
    time.sleep(seconds)
    b1, w1 = _cpu_busy_s(), time.perf_counter()
    if b0 is None or b1 is None:
        return None
    n = os.cpu_count() or 1
    return max(0.0, 1.0 - (b1 - b0) / ((w1 - w0) * n))


def gemm_rates(run: Runner, n: int) -> dict[str, float]:
    rng = np.random.default_rng(1)
    out = {}
    for name, dt in (("float64", np.float64), ("float32", np.float32)):
        A = rng.standard_normal((n, n)).astype(dt)
        B = rng.standard_normal((n, n)).astype(dt)
        r = run.time(f"GEMM {name} N={n}", lambda A=A, B=B: A @ B)
        out[name] = 2.0 * n**3 / r["median_s"] / 1e9
        out[f"{name}_time_s"] = r["median_s"]
    out["n"] = n
    # back-to-back BLAS calls: on small VMs threaded OpenBLAS can stall for whole scheduler
    # ticks between consecutive calls (a GEMM followed by a triangular solve is the pattern of
    # our build), which inflates every multi-call routine, ours and the anchors' alike;
    # measured here so that a run records whether it was affected
    m = 256
    A = rng.standard_normal((m, m))
    S = np.triu(A) / m + np.eye(m)
    eye = np.eye(m)

    def trsm() -> Any:
        return sla.solve_triangular(S, eye, check_finite=False)

    one = run.time(f"BLAS stall check N={m} (GEMM)", lambda: A @ A)["median_s"]
    tri = run.time(f"BLAS stall check N={m} (trsm)", trsm)["median_s"]
    two = run.time(f"BLAS stall check N={m} (GEMM+trsm)", lambda: (A @ A, trsm()))["median_s"]
    out["blas_pair_check"] = {"n": m, "gemm_s": one, "trsm_s": tri, "gemm_then_trsm_s": two}
    out["blas_back_to_back_stall_s"] = max(0.0, two - one - tri)
    return out


# --------------------------------------------------------------------------------------------
# flop models (useful flops; see README)
# --------------------------------------------------------------------------------------------
def fl_apply(N: int, L: int, B: int) -> float:
    return 4.0 * N * L * B + L * L * B


def fl_two_gemm(N: int, L: int, B: int) -> float:
    return 4.0 * N * L * B


def fl_build(N: int, L: int) -> float:
    return N * L * L + L**3 / 3.0


def fl_matrix_from_v(N: int, L: int) -> float:
    # one-shot I − V S⁻¹ Vᵀ: syrk N·L², triangular solve L²·N, GEMM 2·N²·L
    return N * L * L + L * L * N + 2.0 * N * N * L


def fl_orgqr(N: int) -> float:
    return 4.0 * N**3 / 3.0


def fl_vjp(N: int, L: int, B: int) -> float:
    return fl_build(N, L) + 8.0 * N * L * B + 2.0 * N * L * L


# --------------------------------------------------------------------------------------------
# sections
# --------------------------------------------------------------------------------------------
def built(op: Any) -> Any:
    """``op`` with its factors U and T computed (operators compute them on first use)."""
    op.U  # noqa: B018 - property access forces the factors
    op.T_factor  # noqa: B018
    return op


def _numpy_loop(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` with the Numba kernels switched off (the Array API loop of reflections)."""
    old = os.environ.get("HL_DISABLE_NUMBA")
    os.environ["HL_DISABLE_NUMBA"] = "1"
    try:
        return fn(*args)
    finally:
        if old is None:
            del os.environ["HL_DISABLE_NUMBA"]
        else:
            os.environ["HL_DISABLE_NUMBA"] = old


def bench_apply(run: Runner, gflops64: float) -> list[dict[str, Any]]:
    """(a) CWY apply vs the two GEMMs of the same shapes vs sequential reflections."""
    c = run.cfg
    rng = np.random.default_rng(2)
    rows = []
    for N in c.apply_ns:
        for frac in c.apply_l_fracs:
            L = max(1, N // frac)
            V = rng.standard_normal((N, L))
            Ur = rng.standard_normal((N, L))
            build = run.time(f"build N={N} L={L}", lambda V=V: built(hl.cwy(V)))
            Q = built(hl.cwy(V))
            for B in c.apply_bs:
                H = rng.standard_normal((N, B))
                tag = f"N={N} L={L} B={B}"
                t_cwy = run.time(f"cwy apply {tag}", lambda Q=Q, H=H: Q @ H)
                t_g2 = run.time(f"2 GEMMs {tag}", lambda Ur=Ur, H=H: Ur @ (Ur.T @ H))
                t_seq = run.time_sequential(
                    f"sequential {tag}",
                    lambda l, V=V, H=H: hl.householder_apply(V[:, :l], H),
                    L,
                )
                t_seq_np = run.time_sequential(
                    f"sequential NumPy loop {tag}",
                    lambda l, V=V, H=H: _numpy_loop(hl.householder_apply, V[:, :l], H),
                    L,
                )
                err = None
                if t_seq is not None and not t_seq.get("skipped"):
                    y1, y2 = Q @ H, hl.householder_apply(V, H)
                    err = float(np.max(np.abs(y1 - y2)))
                cw, g2 = t_cwy["median_s"], t_g2["median_s"]
                sq = None if t_seq is None or t_seq.get("skipped") else t_seq["median_s"]
                rows.append(
                    {
                        "N": N,
                        "L": L,
                        "B": B,
                        "build": build,
                        "cwy_apply": t_cwy,
                        "two_gemm": t_g2,
                        "sequential": t_seq,
                        "sequential_numpy_loop": t_seq_np,
                        "ratio_cwy_over_two_gemm": cw / g2,
                        "speedup_cwy_vs_sequential": None if sq is None else sq / cw,
                        "gemm_eff_cwy_apply": fl_apply(N, L, B) / cw / 1e9 / gflops64,
                        "gemm_eff_two_gemm": fl_two_gemm(N, L, B) / g2 / 1e9 / gflops64,
                        "gemm_eff_build": fl_build(N, L) / build["median_s"] / 1e9 / gflops64,
                        "gemm_eff_sequential": None
                        if sq is None
                        else fl_two_gemm(N, L, B) / sq / 1e9 / gflops64,
                        "max_abs_diff_cwy_vs_sequential": err,
                    }
                )
    return rows


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


def bench_forming_q(run: Runner, gflops64: float) -> list[dict[str, Any]]:
    """(b) forming the dense N×N Q: CWY, LAPACK orgqr, expm, Cayley (solve), sequential."""
    import torch

    c = run.cfg
    rng = np.random.default_rng(3)
    rows = []
    for N in c.form_ns:
        V = rng.standard_normal((N, N))
        X = rng.standard_normal((N, N))
        Ask = (X - X.T) / 2.0
        eye = np.eye(N)
        a, tau, Vl, n_zero = lapack_reflectors(rng.standard_normal((N, N)))
        tag = f"N={N}"
        r = {"N": N, "lapack_zero_tau_columns": n_zero}
        r["cwy_matrix"] = run.time(f"cwy(V).matrix() {tag}", lambda V=V: hl.cwy(V).matrix())
        r["cwy_matrix_lapack_reflectors"] = run.time(
            f"cwy(Vl).matrix() {tag}", lambda Vl=Vl: hl.cwy(Vl).matrix()
        )
        r["lapack_orgqr"] = run.time(
            f"torch householder_product {tag}",
            lambda a=a, tau=tau: torch.linalg.householder_product(a, tau),
        )
        r["expm"] = run.time(f"expm {tag}", lambda Ask=Ask: sla.expm(Ask))
        r["cayley_solve"] = run.time(
            f"Cayley solve {tag}",
            lambda Ask=Ask, eye=eye: sla.solve(eye + Ask / 2.0, eye - Ask / 2.0),
        )
        r["sequential"] = run.time_sequential(
            f"householder_product {tag}", lambda l, V=V: hl.householder_product(V[:, :l]), N
        )
        t = r["cwy_matrix"]["median_s"]
        r["speedup_vs_expm"] = r["expm"]["median_s"] / t
        r["speedup_vs_cayley"] = r["cayley_solve"]["median_s"] / t
        seq = r["sequential"]
        r["speedup_vs_sequential"] = (
            None if seq is None or seq.get("skipped") else seq["median_s"] / t
        )
        r["ratio_lapack_reflectors_ours_over_orgqr"] = (
            r["cwy_matrix_lapack_reflectors"]["median_s"] / r["lapack_orgqr"]["median_s"]
        )
        r["gemm_eff_cwy_matrix"] = fl_matrix_from_v(N, N) / t / 1e9 / gflops64
        # useful flops of forming Q from LAPACK's (trapezoidal) reflectors: orgqr's 4N³/3
        r["gemm_eff_cwy_matrix_lapack_reflectors"] = (
            fl_orgqr(N) / r["cwy_matrix_lapack_reflectors"]["median_s"] / 1e9 / gflops64
        )
        r["gemm_eff_orgqr"] = fl_orgqr(N) / r["lapack_orgqr"]["median_s"] / 1e9 / gflops64
        rows.append(r)
    return rows


def orth_err(Q: np.ndarray) -> float:
    Q = Q.astype(np.float64)
    return float(np.linalg.norm(Q.T @ Q - np.eye(Q.shape[1])))


def bench_accuracy(run: Runner) -> list[dict[str, Any]]:
    """(c) ‖QᵀQ − I‖_F of cwy(Vl).matrix() vs LAPACK orgqr on the same reflectors."""
    import torch

    c = run.cfg
    rng = np.random.default_rng(4)
    rows = []
    for dt in (np.float32, np.float64):
        for N in c.acc_ns:
            A = rng.standard_normal((N, N)).astype(dt)
            a, tau, Vl, n_zero = lapack_reflectors(A)
            assert Vl.dtype == dt
            Q_ours = hl.cwy(Vl).matrix()
            run.step(f"accuracy ours {np.dtype(dt).name} N={N}")
            Q_lap = torch.linalg.householder_product(a, tau).numpy()
            run.step(f"accuracy LAPACK {np.dtype(dt).name} N={N}")
            e_ours, e_lap = orth_err(Q_ours), orth_err(Q_lap)
            rows.append(
                {
                    "dtype": np.dtype(dt).name,
                    "N": N,
                    "ours_dtype": str(Q_ours.dtype),
                    "orth_err_ours": e_ours,
                    "orth_err_lapack": e_lap,
                    "ratio_ours_over_lapack": e_ours / e_lap if e_lap > 0 else math.inf,
                    "max_abs_diff_ours_vs_lapack": float(
                        np.max(np.abs(Q_ours.astype(np.float64) - Q_lap.astype(np.float64)))
                    ),
                    "lapack_zero_tau_columns": n_zero,
                }
            )
    return rows


def bench_vjp(run: Runner, gflops64: float) -> dict[str, Any]:
    """(d) explicit VJP of (V, H) ↦ cwy(V) @ H vs the forward from V."""
    N, L, B = run.cfg.vjp_shape
    rng = np.random.default_rng(5)
    V, H, G = (rng.standard_normal(s) for s in ((N, L), (N, B), (N, B)))
    fwd = run.time(f"forward cwy(V)@H N={N} L={L} B={B}", lambda: hl.cwy(V) @ H)
    vjp = run.time(f"vjp.cwy_apply N={N} L={L} B={B}", lambda: hl.vjp.cwy_apply(V, H, G))
    return {
        "N": N,
        "L": L,
        "B": B,
        "forward_from_v": fwd,
        "vjp": vjp,
        "ratio_vjp_over_forward": vjp["median_s"] / fwd["median_s"],
        "gemm_eff_forward": (fl_build(N, L) + fl_apply(N, L, B)) / fwd["median_s"] / 1e9 / gflops64,
        "gemm_eff_vjp": fl_vjp(N, L, B) / vjp["median_s"] / 1e9 / gflops64,
    }


def peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes newly allocated while ``fn`` runs (tracemalloc; NumPy buffers are traced)."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del out
    return int(peak - base)


def dense_first_columns(U: np.ndarray, T: np.ndarray, M: int) -> np.ndarray:
    """First M columns of I − U T U₁ᵀ-style products via the N×N matrix (in place: the
    smallest dense peak, ≈ 8·N² bytes)."""
    N = U.shape[0]
    Q = U @ (T @ U.T)
    np.negative(Q, out=Q)
    Q.flat[:: N + 1] += 1.0
    return Q[:, :M].copy()


def bench_memory(run: Runner) -> dict[str, Any]:
    """(e) peak memory of T-CWY apply vs forming an N×N intermediate."""
    c = run.cfg
    N, M = c.mem_n, c.mem_m
    rng = np.random.default_rng(6)
    V = rng.standard_normal((N, M))
    x = rng.standard_normal((M, 1))
    Om = built(hl.tcwy(V))
    out: dict[str, Any] = {"N": N, "M": M, "itemsize": 8}
    out["ours_build_and_apply_peak_bytes"] = peak_bytes(lambda: hl.tcwy(V) @ x)
    run.step(f"memory tcwy(V)@x N={N}")
    out["ours_apply_prebuilt_peak_bytes"] = peak_bytes(lambda: Om @ x)
    run.step(f"memory Ω@x N={N}")
    out["ours_matrix_peak_bytes"] = peak_bytes(lambda: hl.tcwy(V).matrix())
    run.step(f"memory tcwy(V).matrix() N={N}")
    out["n_m_bytes"] = N * M * 8
    out["dense_nxn_bytes_analytic"] = N * N * 8
    out["ours_time"] = run.time(f"time tcwy(V)@x N={N}", lambda: hl.tcwy(V) @ x)
    dense = []
    for n in c.mem_dense_ns:
        Vd = rng.standard_normal((n, M))
        O = hl.tcwy(Vd)
        U, T = O.U, O.T_factor
        pk = peak_bytes(lambda U=U, T=T: dense_first_columns(U, T, M))
        run.step(f"memory dense N={n}")
        ours = peak_bytes(lambda Vd=Vd: hl.tcwy(Vd) @ x)
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
    run.step("memory done")
    return out


def bench_efficiency(run: Runner, gflops64: float) -> list[dict[str, Any]]:
    """CWY apply GEMM efficiency vs L and B at fixed N (plot ii)."""
    c = run.cfg
    N = c.eff_n
    rng = np.random.default_rng(7)
    rows = []
    for L in c.eff_ls:
        V = rng.standard_normal((N, L))
        Ur = rng.standard_normal((N, L))
        Q = built(hl.cwy(V))
        for B in c.eff_bs:
            H = rng.standard_normal((N, B))
            t = run.time(f"eff cwy N={N} L={L} B={B}", lambda Q=Q, H=H: Q @ H)["median_s"]
            g = run.time(f"eff 2GEMM N={N} L={L} B={B}", lambda Ur=Ur, H=H: Ur @ (Ur.T @ H))[
                "median_s"
            ]
            rows.append(
                {
                    "N": N,
                    "L": L,
                    "B": B,
                    "cwy_apply_s": t,
                    "two_gemm_s": g,
                    "gemm_eff_cwy_apply": fl_apply(N, L, B) / t / 1e9 / gflops64,
                    "gemm_eff_two_gemm": fl_two_gemm(N, L, B) / g / 1e9 / gflops64,
                }
            )
    return rows


# --------------------------------------------------------------------------------------------
# headline
# --------------------------------------------------------------------------------------------
def fmt_t(s: float | None) -> str:
    if s is None:
        return "—"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1.0:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def fmt_b(b: float) -> str:
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= k:
            return f"{b / k:.3g} {unit}"
    return f"{b:.0f} B"


def fmt_eff(e: float | None) -> str:
    return "—" if e is None else f"{100 * e:.0f}%"


def _find(rows: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    for r in rows:
        if all(r.get(k) == v for k, v in kw.items()):
            return r
    raise KeyError(kw)


def headline(res: dict[str, Any], cfg: Config) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    N, L, B = cfg.head_n, cfg.head_l, cfg.head_b

    def add(measure, anchor, anchor_v, ours_v, ratio, target, eff, met):
        rows.append(
            {
                "measure": measure,
                "anchor": anchor,
                "anchor_value": anchor_v,
                "ours": ours_v,
                "ratio": ratio,
                "target": target,
                "gemm_efficiency": eff,
                "met": met,
            }
        )

    a = _find(res["apply"], N=N, L=L, B=B)
    r = a["ratio_cwy_over_two_gemm"]
    add(
        f"CWY apply N={N} L={L} B={B}",
        "two GEMMs (numpy)",
        fmt_t(a["two_gemm"]["median_s"]),
        fmt_t(a["cwy_apply"]["median_s"]),
        f"{r:.2f}×",
        "≤ 1.5× (perf issue: ≤ 1.3×)",
        f"{fmt_eff(a['gemm_eff_cwy_apply'])} (2-GEMM {fmt_eff(a['gemm_eff_two_gemm'])})",
        "yes" if r <= 1.3 else ("≤1.5 only" if r <= 1.5 else "NO"),
    )
    add(
        f"CWY build cwy(V) (U, T) N={N} L={L}",
        "—",
        "—",
        fmt_t(a["build"]["median_s"]),
        "—",
        "—",
        fmt_eff(a["gemm_eff_build"]),
        "",
    )
    s = _find(res["apply"], N=N, L=N, B=B)
    for key, anchor in (
        ("sequential_numpy_loop", "sequential reflections, NumPy loop"),
        ("sequential", "sequential reflections, Numba kernel"),
    ):
        seq = s.get(key)
        if seq is None:
            continue
        sp = None if seq.get("skipped") else seq["median_s"] / s["cwy_apply"]["median_s"]
        add(
            f"CWY apply L=N={N} B={B} (prebuilt)",
            anchor,
            "skipped" if seq.get("skipped") else fmt_t(seq["median_s"]),
            fmt_t(s["cwy_apply"]["median_s"]),
            "—" if sp is None else f"{sp:.1f}× faster",
            "≥ 20× faster",
            fmt_eff(s["gemm_eff_cwy_apply"]),
            "" if sp is None else ("yes" if sp >= 20 else "NO"),
        )
    f = res["forming_q"][-1]
    Nf = f["N"]
    rl = f["ratio_lapack_reflectors_ours_over_orgqr"]
    add(
        f"form Q, LAPACK reflectors N={Nf}",
        "torch householder_product (orgqr)",
        fmt_t(f["lapack_orgqr"]["median_s"]),
        fmt_t(f["cwy_matrix_lapack_reflectors"]["median_s"]),
        f"{rl:.2f}×",
        "≤ 1.0×",
        f"{fmt_eff(f['gemm_eff_cwy_matrix_lapack_reflectors'])} "
        f"(orgqr {fmt_eff(f['gemm_eff_orgqr'])})",
        "yes" if rl <= 1.0 else "NO",
    )
    for key, name, tgt, thr in (
        ("expm", "scipy expm (skew)", "≥ 3× faster", 3.0),
        ("cayley_solve", "Cayley by scipy solve", "≥ 1.0× faster", 1.0),
    ):
        sp = f[key]["median_s"] / f["cwy_matrix"]["median_s"]
        add(
            f"CWY matrix dense V N=L={Nf}",
            name,
            fmt_t(f[key]["median_s"]),
            fmt_t(f["cwy_matrix"]["median_s"]),
            f"{sp:.2f}× faster",
            tgt,
            fmt_eff(f["gemm_eff_cwy_matrix"]),
            "yes" if sp >= thr else "NO",
        )
    seqf = f["sequential"]
    add(
        f"CWY matrix dense V N=L={Nf}",
        "sequential householder_product",
        "skipped" if seqf is None or seqf.get("skipped") else fmt_t(seqf["median_s"]),
        fmt_t(f["cwy_matrix"]["median_s"]),
        "—" if f["speedup_vs_sequential"] is None else f"{f['speedup_vs_sequential']:.1f}× faster",
        "—",
        fmt_eff(f["gemm_eff_cwy_matrix"]),
        "",
    )
    v = res["vjp"]
    rv = v["ratio_vjp_over_forward"]
    add(
        f"VJP cwy_apply N={v['N']} L={v['L']} B={v['B']}",
        "forward cwy(V) @ H",
        fmt_t(v["forward_from_v"]["median_s"]),
        fmt_t(v["vjp"]["median_s"]),
        f"{rv:.2f}×",
        "≤ 3×",
        fmt_eff(v["gemm_eff_vjp"]),
        "yes" if rv <= 3 else "NO",
    )
    Na = cfg.acc_ns[-1]
    for dt in ("float32", "float64"):
        c = _find(res["accuracy"], dtype=dt, N=Na)
        ratio = c["ratio_ours_over_lapack"]
        if dt == "float32":
            tgt, met = "ours/LAPACK ≤ 1.0", ratio <= 1.0
        else:
            tgt, met = "ours ≤ 1e-13", c["orth_err_ours"] <= 1e-13
        add(
            f"‖QᵀQ−I‖_F {dt} N={Na}",
            "LAPACK orgqr, same reflectors",
            f"{c['orth_err_lapack']:.2e}",
            f"{c['orth_err_ours']:.2e}",
            f"{ratio:.2f}×",
            tgt,
            "—",
            "yes" if met else "NO",
        )
    c = _find(res["accuracy"], dtype="float64", N=Na)
    d = c["max_abs_diff_ours_vs_lapack"]
    add(
        f"max|Q_ours − Q_LAPACK| float64 N={Na}",
        "—",
        "—",
        f"{d:.2e}",
        "—",
        "≲ 1e-13",
        "—",
        "yes" if d <= 1e-13 else "NO",
    )
    m = res["memory"]
    add(
        f"peak memory T-CWY tcwy(V)@x N={m['N']} M={m['M']}",
        "N×N intermediate (8·N² B, analytic)",
        fmt_b(m["dense_nxn_bytes_analytic"]),
        fmt_b(m["ours_build_and_apply_peak_bytes"]),
        f"{m['ratio_ours_over_dense']:.1e}× ({m['ours_in_units_of_nm_bytes']:.1f}·8NM B)",
        "O(N·M)",
        "—",
        "yes" if m["ours_in_units_of_nm_bytes"] <= 10 else "NO",
    )
    return rows


HEADERS = ["measure", "anchor", "anchor time/value", "ours", "ratio", "target", "GEMM eff.", "met"]
KEYS = ["measure", "anchor", "anchor_value", "ours", "ratio", "target", "gemm_efficiency", "met"]


def table_text(rows: list[dict[str, Any]]) -> str:
    cells = [HEADERS] + [[str(r[k]) for k in KEYS] for r in rows]
    w = [max(len(row[i]) for row in cells) for i in range(len(HEADERS))]
    lines = []
    for j, row in enumerate(cells):
        lines.append("  ".join(x.ljust(w[i]) for i, x in enumerate(row)).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w[i] for i in range(len(w))))
    return "\n".join(lines)


def machine_line(m: dict[str, Any], g: dict[str, Any]) -> str:
    blas = m.get("numpy_blas") or {}
    blas_s = f"{blas.get('name')} {blas.get('version')}" if blas else "unknown BLAS"
    env = "".join(f", {k}={v}" for k, v in (m.get("thread_env") or {}).items())
    return (
        f"{m['cpu_model']}, {m['cores_available']} cores{env}; numpy {m['numpy']} ({blas_s}), "
        f"scipy {m['scipy']}, torch {m.get('torch')}; GEMM N={g['n']}: "
        f"{g['float64']:.0f} GFLOP/s float64, {g['float32']:.0f} GFLOP/s float32; {m['date']}"
    )


def table_markdown(rows: list[dict[str, Any]], mline: str, quick: bool) -> str:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    out = [f"**Machine:** {mline}" + ("  *(--quick sizes)*" if quick else ""), ""]
    out.append("| " + " | ".join(HEADERS) + " |")
    out.append("|" + "|".join("---" for _ in HEADERS) + "|")
    for r in rows:
        out.append("| " + " | ".join(esc(r[k]) for k in KEYS) + " |")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------
# plots
# --------------------------------------------------------------------------------------------
def plot_forming_q(rows: list[dict[str, Any]], path: Path, mline: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
        xs, ys = [], []
        for r in rows:
            t = r.get(key)
            if t is not None and not t.get("skipped"):
                xs.append(r["N"])
                ys.append(t["median_s"])
        if xs:
            ax.loglog(xs, ys, style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(Ns, [str(n) for n in Ns])
    ax.set_xlabel("N")
    ax.set_ylabel("time to form the N×N orthogonal matrix [s]")
    ax.set_title("Forming Q (float64, CPU)", fontsize=11)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.005, textwrap.fill(mline, 150), fontsize=5.5, color="gray")
    fig.tight_layout(rect=(0, 0.035, 1, 1))
    fig.savefig(path, dpi=130)
    plt.close(fig)


def plot_efficiency(rows: list[dict[str, Any]], path: Path, mline: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    Bs = sorted({r["B"] for r in rows})
    Ls = sorted({r["L"] for r in rows})
    N = rows[0]["N"]
    for i, B in enumerate(Bs):
        sub = sorted((r for r in rows if r["B"] == B), key=lambda r: r["L"])
        col = f"C{i}"
        ax.plot(
            [r["L"] for r in sub],
            [100 * r["gemm_eff_cwy_apply"] for r in sub],
            "o-",
            color=col,
            label=f"CWY apply, B={B}",
        )
        ax.plot(
            [r["L"] for r in sub],
            [100 * r["gemm_eff_two_gemm"] for r in sub],
            ":",
            color=col,
            alpha=0.7,
            label=f"two GEMMs, B={B}",
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(Ls, [str(x) for x in Ls])
    ax.set_xlabel("L (number of reflectors)")
    ax.set_ylabel("GEMM efficiency [% of the float64 GEMM rate]")
    ax.set_title(f"CWY apply efficiency, N={N}, float64", fontsize=11)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.text(0.01, 0.005, textwrap.fill(mline, 150), fontsize=5.5, color="gray")
    fig.tight_layout(rect=(0, 0.035, 1, 1))
    fig.savefig(path, dpi=130)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------
def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test (< 30 s)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (default benchmarks/results; benchmarks/results/quick with --quick)",
    )
    p.add_argument("--name", default=None, help="machine tag of the JSON file (default: hostname)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    args = p.parse_args(argv)

    cfg = QUICK if args.quick else FULL
    out = args.out or (ROOT / "benchmarks" / "results" / ("quick" if args.quick else ""))
    out.mkdir(parents=True, exist_ok=True)

    import torch

    ncores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(ncores or 1)

    t_start = time.perf_counter()
    machine = machine_info()
    idle = idle_fraction_now()
    machine["idle_fraction_before_start"] = idle
    if idle is not None and idle < 0.8:
        print(
            f"warning: the machine is busy before we start ({100 * (1 - idle):.0f}% of its CPU "
            "used by other processes); timings will be pessimistic and noisy",
            file=sys.stderr,
        )
    monitor = LoadMonitor()
    run = Runner(cfg)
    res: dict[str, Any] = {"config": asdict(cfg), "machine": machine}
    try:
        g = gemm_rates(run, cfg.gemm_n)
        res["gemm_gflops"] = g
        res["apply"] = bench_apply(run, g["float64"])
        res["forming_q"] = bench_forming_q(run, g["float64"])
        res["accuracy"] = bench_accuracy(run)
        res["vjp"] = bench_vjp(run, g["float64"])
        res["memory"] = bench_memory(run)
        res["cwy_apply_efficiency"] = bench_efficiency(run, g["float64"])
    finally:
        run.close()
    stall = g.get("blas_back_to_back_stall_s", 0.0)
    if stall > 1e-3:
        run.notes.append(
            f"note: a {g['blas_pair_check']['n']}² GEMM followed by a triangular solve took "
            f"{1e3 * stall:.1f} ms more than the two alone: threaded BLAS stalls between "
            "consecutive calls on this machine (inflates multi-call routines, ours and the "
            "anchors'); compare with OPENBLAS_NUM_THREADS=1"
        )
    res["notes"] = run.notes
    res["load"] = monitor.result(ncores or 1)
    frac = res["load"].get("foreign_cpu_fraction")
    if frac is not None and frac > 0.1:
        run.notes.append(
            f"warning: other processes used {100 * frac:.0f}% of the machine's CPU during the "
            "run; rerun on an idle machine for trustworthy timings"
        )
    res["total_runtime_s"] = time.perf_counter() - t_start

    mline = machine_line(machine, g)
    if frac is not None:
        mline += f"; other load during run {100 * frac:.0f}%"
    rows = headline(res, cfg)
    res["headline"] = rows
    text = table_text(rows)
    print(("[--quick sizes] " if cfg.quick else "") + mline)
    print(text)
    for n in run.notes:
        print(n)

    host = args.name or re.sub(r"[^A-Za-z0-9._-]", "_", machine["hostname"] or "") or "local"
    payload = json.dumps(_jsonable(res), indent=1, ensure_ascii=False)
    for name in (f"cpu-{host}.json", "latest.json"):
        (out / name).write_text(payload + "\n", encoding="utf-8")
    (out / "headline.md").write_text(table_markdown(rows, mline, cfg.quick), encoding="utf-8")
    if not args.no_plots:
        plot_forming_q(res["forming_q"], out / "forming_q_vs_n.png", mline)
        plot_efficiency(res["cwy_apply_efficiency"], out / "cwy_apply_efficiency.png", mline)
    total = time.perf_counter() - t_start
    print(f"total runtime {total:.1f} s; results in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
