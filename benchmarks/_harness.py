"""The one shared module of the benchmark scripts: timing, machine record, ratio rows,
writers, plots and the progress bar (README "Harness" and "Method").

Scripts import this module, householderla's public API and, where they must,
``benchmarks._internals`` (every private import); never another script.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import importlib.metadata
import json
import math
import os
import statistics
import sys
import textwrap
import time
import timeit
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

# tqdm and threadpoolctl (the bench extra) are imported where used: benchmarks/gpu.py reuses
# this module on a GPU machine that has only the project's own dependencies

VERSIONS = "householderla numpy scipy torch jax numba geoopt pyperf threadpoolctl".split()


# -- command line and files --------------------------------------------------------------------
def parser(doc: str | None, quick: str = "small sizes, a smoke test") -> argparse.ArgumentParser:
    """The options every script takes: ``--quick`` and ``--out DIR``."""
    p = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0])
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument(
        "--out",
        type=Path,
        help="results folder (default: build/bench[/quick], git-ignored; the committed "
        "results: --out benchmarks/results)",
    )
    return p


#: Where a script writes without ``--out``: outside the committed ``benchmarks/results/``, so
#: that a run never overwrites them unless asked (``make bench BENCH_OUT=benchmarks/results``).
DEFAULT_OUT = ROOT / "build" / "bench"


def out_dir(args: argparse.Namespace) -> Path:
    d = args.out or DEFAULT_OUT / ("quick" if args.quick else "")
    d.mkdir(parents=True, exist_ok=True)
    return d


def shown(path: Path) -> str:
    full = Path(path).resolve()
    return str(full.relative_to(ROOT) if full.is_relative_to(ROOT) else path)


def jsonable(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return jsonable(dataclasses.asdict(x))
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x if isinstance(x, (str, int, float, bool, type(None))) else str(x)


def write(path: Path, content: Any) -> None:
    """Write ``content``: a string as it is, anything else as JSON (see :func:`jsonable`)."""
    if not isinstance(content, str):
        content = json.dumps(jsonable(content), indent=1, ensure_ascii=False)
    path.write_text(content.rstrip("\n") + "\n", encoding="utf-8")
    print(f"wrote {shown(path)}")


# -- progress ----------------------------------------------------------------------------------
def progress(total: int, desc: str = "", unit: str = "meas") -> Any:
    """A tqdm bar on stderr (stdout keeps the tables)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr, unit=unit, dynamic_ncols=True)


# -- timing ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Profile:
    """How long one measurement takes: loops per sample calibrated so that a sample takes
    ≥ ``sample_s`` (0: one call per sample), then ``min_rep``..``max_rep`` samples taking
    ≥ ``min_total`` seconds together, cut to ``max_total`` (1 sample for longer calls).
    Methods whose call takes less than ``rewarm_s`` get one untimed call right before each
    sample, so that a sample is the steady state of a loop of that method, not the first call
    after another method (whose larger working set left the caches cold: a 1 ms training step
    read 0.3 ms slower right after an 8 ms one)."""

    sample_s: float = 0.0
    min_total: float = 0.2
    max_total: float = 2.0
    min_rep: int = 3
    max_rep: int = 30
    rewarm_s: float = 0.0


class _Enough(Exception):
    pass


def calibrate(timer: timeit.Timer, target_s: float) -> tuple[int, float]:
    """Loops per sample by :meth:`timeit.Timer.autorange` (1, 2, 5, 10, 20, … loops until a
    sample takes ≥ 0.2 s), stopped through its callback as soon as a sample takes
    ≥ ``target_s`` when that is shorter. Returns (loops, seconds of that sample)."""
    found: list[tuple[int, float]] = []

    def enough(number: int, taken: float) -> None:
        if taken >= target_s:
            found.append((number, taken))
            raise _Enough

    try:
        return timer.autorange(enough)
    except _Enough:
        return found[0]


def _calibrated(
    timers: dict[str, timeit.Timer], prof: Profile, warmup: bool
) -> tuple[dict[str, float | None], dict[str, int], dict[str, float]]:
    """Per method: the warm-up call's time (None without ``warmup``), loops per sample and the
    time of one such sample (see :class:`Profile`)."""
    warm: dict[str, float | None] = {}
    loops: dict[str, int] = {}
    sample: dict[str, float] = {}
    for k, t in timers.items():
        warm[k] = t.timeit(1) if warmup else None  # first call: caches, JIT, lazy factors
        est = math.inf if warm[k] is None else warm[k]
        if est < prof.max_total:
            est = t.timeit(1)  # steady state
        if prof.sample_s > 0 and est < prof.sample_s:
            loops[k], sample[k] = calibrate(t, prof.sample_s)
        else:
            loops[k], sample[k] = 1, est
    return warm, loops, sample


def _round(
    i: int,
    timers: dict[str, timeit.Timer],
    loops: dict[str, int],
    rewarm: dict[str, bool],
    times: dict[str, list[float]],
) -> None:
    """Round ``i``: one sample of every method, appended to ``times``. Each round starts one
    method later, and every other round runs backwards, so that no method is always timed
    right after the same (slow) one."""
    order = list(timers.items())
    shift = i % len(order)
    rnd = order[shift:] + order[:shift]
    for k, t in rnd if i % 2 == 0 else rnd[::-1]:
        if rewarm[k]:
            t.timeit(1)
        times[k].append(t.timeit(loops[k]) / loops[k])


def _summary(
    times: dict[str, list[float]], loops: dict[str, int], warm: dict[str, float | None]
) -> dict[str, dict[str, Any]]:
    out = {k: {"median_s": statistics.median(v), "min_s": min(v)} for k, v in times.items()}
    for k, o in out.items():
        o.update(repeats=len(times[k]), loops=loops[k], warmup_s=warm[k], times_s=times[k])
    return out


def measure(
    fns: dict[str, Callable[[], Any]], prof: Profile, *, warmup: bool = True
) -> dict[str, dict[str, Any]]:
    """Time the methods of one row side by side (see the module docstring). Returns per method
    ``median_s`` and ``min_s`` per call, ``times_s`` (every sample), ``repeats``, ``loops``,
    ``warmup_s``."""
    timers = {k: timeit.Timer(f) for k, f in fns.items()}
    warm, loops, sample = _calibrated(timers, prof, warmup)
    reps = prof.max_rep
    for s in sample.values():
        if s >= prof.max_total:
            reps = 1
            break
        r = min(max(prof.min_rep, math.ceil(prof.min_total / max(s, 1e-9))), prof.max_rep)
        reps = max(1, min(reps, r, int(prof.max_total // max(s, 1e-9))))
    times: dict[str, list[float]] = {k: [] for k in fns}
    rewarm = {k: sample[k] / loops[k] < prof.rewarm_s for k in fns}
    for i in range(reps):
        _round(i, timers, loops, rewarm, times)
    return _summary(times, loops, warm)


class SpreadRounds:
    """The rounds of :func:`measure` one at a time, for :meth:`Bench.spread` to run them at
    points spread over the rest of a run: the methods are warmed up and their loops per sample
    calibrated on construction; ``self(i)`` runs round ``i``; :meth:`result` is
    :func:`measure`'s return value over the rounds run so far. Between two rounds other rows
    run, so every method whose call takes less than ``rewarm_s`` gets an untimed call right
    before its sample (its operands back in the caches)."""

    def __init__(
        self,
        fns: dict[str, Callable[[], Any]],
        prof: Profile,
        *,
        warmup: bool = True,
        rewarm_s: float = 0.05,
    ) -> None:
        self.timers = {k: timeit.Timer(f) for k, f in fns.items()}
        self.warm, self.loops, sample = _calibrated(self.timers, prof, warmup)
        self.rewarm = {k: sample[k] / self.loops[k] < rewarm_s for k in fns}
        self.times: dict[str, list[float]] = {k: [] for k in fns}

    def __call__(self, i: int) -> None:
        _round(i, self.timers, self.loops, self.rewarm, self.times)

    def result(self) -> dict[str, dict[str, Any]]:
        return _summary(self.times, self.loops, self.warm)


def paired_ratio(res: dict[str, dict[str, Any]], num: str, den: str) -> float:
    """Median over the rounds of :func:`measure` of time(num) / time(den): each round times
    both methods back to back, so a slow spell of the machine (another process, a frequency
    change) scales both and cancels in the ratio, which the ratio of the two medians does not
    do."""
    a, b = res[num]["times_s"], res[den]["times_s"]
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def paired_times(res: dict[str, dict[str, Any]], num: str, den: str) -> dict[str, Any]:
    """``res[num]`` with the method it was timed against: ``pair_median_s``,
    ``pair_times_s`` (``den``'s) and ``paired_ratio`` (:func:`paired_ratio` num / den)."""
    out = dict(res[num])
    out.update(
        pair_median_s=res[den]["median_s"],
        pair_times_s=res[den]["times_s"],
        paired_ratio=paired_ratio(res, num, den),
    )
    return out


@dataclass
class _Spread:
    """A row whose rounds :meth:`Bench.spread` runs at the progress steps ``due``."""

    label: str
    run_round: Callable[[int], Any]
    due: list[int]
    done: Callable[[list[Any], list[float]], None]
    out: list[Any] = field(default_factory=list)
    at_s: list[float] = field(default_factory=list)


class Bench:
    """A progress bar (one step per timed method) with the timing profile and the notes of a
    run. ``with Bench(...) as b:`` closes the bar, after running the rounds of the rows still
    spread over the run (:meth:`spread`, :meth:`drain`)."""

    def __init__(self, prof: Profile, total: int, desc: str = "", unit: str = "meas") -> None:
        self.prof = prof
        self.bar = progress(total, desc, unit)
        self.notes: list[str] = []
        self.t0 = time.perf_counter()
        self._spread: list[_Spread] = []

    def __enter__(self) -> Bench:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        try:
            if exc_type is None:
                self.drain()
        finally:
            self.bar.close()

    def step(self, label: str, n: int = 1) -> None:
        self.bar.set_description(label[:48])
        self.bar.update(n)
        self._run_due()

    def spread(
        self,
        label: str,
        run_round: Callable[[int], Any],
        rounds: int,
        fill: Callable[[list[Any]], dict[str, Any]],
        row: dict[str, Any] | None = None,
        then: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Run ``run_round(i)``, i = 0 … rounds − 1, one at a time at evenly spaced progress
        steps of the rest of the run (the first at the next step), between the other rows'
        measurements, never inside one. Returns ``row`` (a new dict by default) marked
        ``"pending"``; after the last round the mark goes, ``row`` is updated with
        ``fill(results)`` and ``round_at_s`` (the seconds since the bar started at which each
        round began), ``then(row)`` is called, and the bar takes one step.

        Why: a loop of reflections streams its operands through the caches once per
        reflection, and on the 2-core VM its speed drifts over seconds (the NumPy loop at
        N = L = 1024, B = 64, two threads: 127–203 ms within 150 s, while the CWY apply it is
        paired with moved less). Medians of 22 consecutive rounds of one process spread
        ±12.2% over such a stretch; 22 rounds drawn from all over it spread ±3–7%."""
        out: dict[str, Any] = {} if row is None else row
        out["pending"] = True

        def done(results: list[Any], at_s: list[float]) -> None:
            out.pop("pending")
            out.update(fill(results), round_at_s=at_s)
            if then is not None:
                then(out)

        start = self.bar.n
        left = max(0, (self.bar.total or start) - start)
        due = [start + (i * left) // rounds for i in range(rounds)]
        self._spread.append(_Spread(label, run_round, due, done))
        return out

    def drain(self) -> None:
        """Run every spread row's remaining rounds now and finish it (see :meth:`spread`)."""
        for job in list(self._spread):
            self._run_rounds(job, len(job.due))

    def _run_due(self) -> None:
        for job in list(self._spread):
            self._run_rounds(job, sum(d <= self.bar.n for d in job.due))

    def _run_rounds(self, job: _Spread, upto: int) -> None:
        while len(job.out) < upto:
            job.at_s.append(time.perf_counter() - self.t0)
            job.out.append(job.run_round(len(job.out)))
        if len(job.out) == len(job.due):
            self._spread.remove(job)
            job.done(job.out, job.at_s)
            self.bar.set_description(job.label[:48])
            self.bar.update(1)

    def note(self, msg: str) -> None:
        self.notes.append(msg)
        self.bar.write(msg, file=sys.stderr)

    def side_by_side(
        self, label: str, fns: dict[str, Callable[[], Any]], **kw: Any
    ) -> dict[str, dict[str, Any]]:
        """:func:`measure` with this run's profile (``max_total=``, ``warmup=`` override)."""
        self.bar.set_description(label[:48])
        warmup = kw.pop("warmup", True)
        res = measure(fns, dataclasses.replace(self.prof, **kw), warmup=warmup)
        self.step(label, len(fns))
        return res

    def time(self, label: str, fn: Callable[[], Any], **kw: Any) -> dict[str, Any]:
        return self.side_by_side(label, {"": fn}, **kw)[""]  # one method


# -- machine -----------------------------------------------------------------------------------
def _version(name: str) -> str | None:
    if name == "householderla":  # the imported one (a checkout may differ from the installed)
        return sys.modules["householderla"].__version__ if name in sys.modules else None
    module = sys.modules.get(name.replace("-", "_"))
    if getattr(module, "__version__", None):  # the imported build: torch's "2.4.1+cu121",
        return str(module.__version__)  # where its wheel's metadata says "2.4.1"
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """The machine record every script stores (see the module docstring)."""
    import pyperf

    meta = pyperf.Run([1.0], collect_metadata=True).get_metadata()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info: dict[str, Any] = {
        "hostname": meta.get("hostname"),
        "cpu_model": meta.get("cpu_model_name"),
        "cpu_count": os.cpu_count(),
        "cores_available": cores,
        "python": meta.get("python_version"),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "loadavg_at_start": _loadavg(),
        "thread_env": {
            k: os.environ[k]
            for k in (
                "OPENBLAS_NUM_THREADS",
                "OMP_NUM_THREADS",
                "MKL_NUM_THREADS",
                "OMP_WAIT_POLICY",
                "GOMP_SPINCOUNT",
                "OPENBLAS_THREAD_TIMEOUT",
            )
            if k in os.environ
        },
        **{name: _version(name) for name in VERSIONS},
        "pyperf_metadata": meta,
    }
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]  # numpy >= 2 (required)
    info["numpy_blas"] = {k: blas.get(k) for k in ("name", "version", "openblas configuration")}
    from threadpoolctl import threadpool_info

    info["threadpools"] = threadpool_info()  # BLAS / OpenMP libraries loaded, their threads
    if "torch" in sys.modules:
        info["torch_threads"] = sys.modules["torch"].get_num_threads()
    return info


def limit_threads(n: int) -> str:
    """Limit torch (``set_num_threads``) and every BLAS/OpenMP pool loaded so far
    (threadpoolctl) to ``n`` threads for the rest of the process; says what was done."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=n)
    if "torch" not in sys.modules:
        return f"{n} thread{'' if n == 1 else 's'} (threadpoolctl)"
    sys.modules["torch"].set_num_threads(n)
    return f"{n} thread{'' if n == 1 else 's'} (threadpoolctl, torch.set_num_threads)"


def run_line(
    machine: dict[str, Any], monitor: LoadMonitor, extra: str = ""
) -> tuple[str, dict[str, Any]]:
    """(the machine line ending in the share of CPU other processes used during the run,
    the load record of ``monitor``)."""
    load = monitor.result(machine["cores_available"])
    frac = load.get("foreign_cpu_fraction")
    line = machine_line(machine, extra=extra)
    line += "" if frac is None else f"; other load during run {100 * frac:.0f}%"
    return line, load


def machine_line(m: dict[str, Any], gemm: dict[str, Any] | None = None, extra: str = "") -> str:
    """One line naming the machine: CPU, cores, thread settings, libraries, GEMM rate, date."""
    blas = m.get("numpy_blas") or {}
    blas_s = f"{blas.get('name')} {blas.get('version')}" if blas else "unknown BLAS"
    env = "".join(f", {k}={v}" for k, v in (m.get("thread_env") or {}).items())
    if m.get("thread_limit"):
        env += f", limited to {m['thread_limit']}"
    line = (
        f"{m['cpu_model']}, {m['cores_available']} cores{env}; numpy {m['numpy']} ({blas_s}), "
        f"scipy {m['scipy']}, torch {m.get('torch')}"
    )
    if gemm:
        line += (
            f"; GEMM N={gemm['n']}: {gemm['float64']:.0f} GFLOP/s float64, "
            f"{gemm['float32']:.0f} GFLOP/s float32"
        )
    return line + (f"; {extra}" if extra else "") + f"; {m['date']}"


def _loadavg() -> tuple[float, ...] | None:
    return tuple(round(x, 2) for x in os.getloadavg()) if hasattr(os, "getloadavg") else None


def _cpu_busy_s() -> float | None:
    """Busy CPU seconds of the whole machine since boot (all cores; /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    """CPU seconds of this process and of its children that have ended (the fresh
    processes a benchmark starts and waits for, ``_cwy_rows.time_in_processes``)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class LoadMonitor:
    """CPU time other processes used while we ran: benchmarks on a shared machine are only
    as good as this number (threaded BLAS stalls when a core is taken). Our own child
    processes count as ours."""

    def __init__(self) -> None:
        self.load_start = _loadavg()
        self.wall0, self.busy0 = time.perf_counter(), _cpu_busy_s()
        self.own0 = _own_cpu_s()

    def result(self, ncores: int | None = None) -> dict[str, Any]:
        ncores = ncores or os.cpu_count() or 1
        wall, busy1 = time.perf_counter() - self.wall0, _cpu_busy_s()
        own = _own_cpu_s() - self.own0
        out = {"loadavg_start": self.load_start, "loadavg_end": _loadavg(), "own_cpu_s": own}
        out["wall_s"] = wall
        if self.busy0 is not None and busy1 is not None:
            foreign = max(0.0, (busy1 - self.busy0) - own)
            out["foreign_cpu_s"] = foreign
            out["foreign_cpu_fraction"] = foreign / (wall * ncores)
        return out


def load_warning(load: dict[str, Any]) -> str | None:
    frac = load.get("foreign_cpu_fraction") or 0.0
    if frac > 0.1:
        return (
            f"warning: other processes used {100 * frac:.0f}% of the machine's CPU during the "
            "run; rerun on an idle machine for trustworthy timings"
        )
    return None


def gemm_rates(bench: Bench, n: int) -> dict[str, Any]:
    """GEMM rate ``A @ B`` (N×N, float64 and float32) in GFLOP/s (2N³ flops)."""
    rng = np.random.default_rng(1)
    out: dict[str, Any] = {"n": n}
    for name, dt in (("float64", np.float64), ("float32", np.float32)):
        A, B = (rng.standard_normal((n, n)).astype(dt) for _ in range(2))
        t = bench.time(f"GEMM {name} N={n}", lambda A=A, B=B: A @ B)["median_s"]
        out[name], out[f"{name}_time_s"] = 2.0 * n**3 / t / 1e9, t
    return out


# -- ratio rows and tables ---------------------------------------------------------------------
@dataclass
class Row:
    """One line of a ratio table: a measure, its anchor and ours side by side (cells as
    text), and the raw numbers behind them in ``data``."""

    measure: str
    anchor: str
    anchor_value: str
    ours: str
    ratio: str
    target: str
    met: str
    gemm_efficiency: str = "—"
    data: dict[str, Any] = field(default_factory=dict)


RATIO_COLUMNS = [
    ("measure", "measure"),
    ("anchor", "anchor"),
    ("anchor time", "anchor_value"),
    ("ours", "ours"),
    ("ours / anchor (lower is better)", "ratio"),
    ("target", "target"),
    ("met", "met"),
]


def ratio_row(
    measure: str, anchor: str, t_anchor: float, t_ours: float, target: float, **data: Any
) -> Row:
    """A time-ratio row ours / anchor with the target "≤ target×"."""
    r = t_ours / t_anchor
    return Row(
        measure,
        anchor,
        fmt_t(t_anchor),
        fmt_t(t_ours),
        f"{r:.2f}×",
        f"≤ {target:g}×",
        "yes" if r <= target else "NO",
        data={"anchor_s": t_anchor, "ours_s": t_ours, "ratio": r, "target": target, **data},
    )


def _cells(rows: list[Row], columns: list[tuple[str, str]]) -> list[list[str]]:
    return [[str(getattr(r, k)) for _, k in columns] for r in rows]


def table_text(rows: list[Row], columns: list[tuple[str, str]] = RATIO_COLUMNS) -> str:
    cells = [[h for h, _ in columns], *_cells(rows, columns)]
    w = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = []
    for j, row in enumerate(cells):
        lines.append("  ".join(x.ljust(w[i]) for i, x in enumerate(row)).rstrip())
        if j == 0:
            lines.append("  ".join("-" * x for x in w))
    return "\n".join(lines)


def table_markdown(
    rows: list[Row], mline: str, quick: bool, columns: list[tuple[str, str]] = RATIO_COLUMNS
) -> str:
    """``**Machine:** …`` then the table (the format of headline.md, which the README embeds)."""
    out = [f"**Machine:** {mline}" + ("  *(--quick sizes)*" if quick else ""), ""]
    out.append("| " + " | ".join(h for h, _ in columns) + " |")
    out.append("|" + "|".join("---" for _ in columns) + "|")
    for row in _cells(rows, columns):
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
    return "\n".join(out) + "\n"


def fmt_ratio(r: float) -> str:
    """A ratio to three significant digits: 1.03×, 0.450×, 0.0283×, 35.4×."""
    return f"{r:#.3g}×"


def fmt_t(s: float | None) -> str:
    if s is None:
        return "—"
    if s < 1e-3:
        return f"{s * 1e6:.{0 if s >= 1e-5 else 1}f} µs"
    return f"{s * 1e3:.2f} ms" if s < 1.0 else f"{s:.2f} s"


# -- plots -------------------------------------------------------------------------------------
def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, mline: str | None = None, dpi: int = 130) -> None:
    """Save and close ``fig``, with the machine line in small grey type at the bottom."""
    if mline:
        fig.text(0.01, 0.005, textwrap.fill(mline, 150), fontsize=5.5, color="gray")
        fig.tight_layout(rect=(0, 0.035, 1, 1))
    else:
        fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    print(f"wrote {shown(path)}")


# -- small helpers shared by several scripts ---------------------------------------------------
def orth_err(Q: Any) -> float:
    """‖QᴴQ − I‖_F computed in float64 (complex128 for complex Q)."""
    Q = np.asarray(Q)
    Q = Q.astype(np.complex128 if np.iscomplexobj(Q) else np.float64)
    E = Q.conj().T @ Q - np.eye(Q.shape[1])
    return float(np.sqrt(np.sum(np.abs(E) ** 2)))


def peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes newly allocated while ``fn`` runs (tracemalloc; NumPy buffers are traced,
    LAPACK workspaces are not)."""
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
