"""The GPU table (``make gpu-check``): our operators against the vendor's kernels on one GPU.

Rows (the H100 table of ``benchmarks/results/``): a prebuilt ``op @ h`` against two GEMMs
``V @ (V.T @ h)``; a fresh ``hl.cwy(V) @ h`` against ``torch.ormqr`` (cuSOLVER) and a Python
loop of reflections; ``hl.from_lapack(a, tau).matrix()`` against
``torch.linalg.householder_product``, square and in stacks (and ``@ C`` against batched
``ormqr``); an ``OrthogonalLinear`` training step against torch's ``parametrizations.orthogonal``
(Cayley); ``hl.torch.Muon`` against ``torch.optim.Muon``; CuPy ``op @ h`` against two CuPy
GEMMs; ``jax.jit`` of ``hl.cwy(V) @ h`` and of its gradient, with the compile time.

Method: each call is timed between two device synchronisations (``torch.cuda.synchronize``,
CuPy's device synchronise, JAX's ``block_until_ready``), after one warm-up call; the median of
up to ``REPS`` calls. Ratios are ours / the other, measured side by side in one process.

Budget: the run has ``--budget`` seconds, shared among the sections by ``SHARES`` (what a
section leaves of its share goes to the next); a section stops starting rows when its share
is spent (a row in flight is interrupted by an alarm), and
every row it did not finish is written as "not measured" with the reason, never dropped. The
table starts with every row "not measured: not reached" and is rewritten after each row, so a
run killed from outside (``make gpu-check``'s ``timeout``) still leaves every row in
``gpu.{md,json}``. ``--device cpu --quick`` runs the same rows at tiny sizes on the CPU
(the smoke test, ``tests/test_bench_gpu.py``); CuPy rows then read "not measured".

Run ``python -m benchmarks.gpu [--quick] [--device cuda|cpu] [--budget S] [--out DIR]``.
"""

from __future__ import annotations

import contextlib
import json
import platform
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

from benchmarks import _harness as H  # noqa: E402

#: Timed calls per row (median), after one warm-up call.
REPS = 7
#: Share of the budget per section (the sections run in this order).
SHARES = {
    "apply": 0.22,
    "forming": 0.2,
    "training": 0.18,
    "muon": 0.1,
    "cupy": 0.08,
    "jax": 0.22,
}
VERSIONS = "householderla numpy scipy array-api-compat torch cupy jax jaxlib numba".split()

FULL = {
    "apply": [(1024, 256, 512), (1024, 1024, 512), (4096, 1024, 1024), (4096, 4096, 1024)],
    "forming": [(1024, "float32"), (1024, "float64"), (4096, "float32"), (4096, "float64")],
    "stacks": [(8192, 8), (8192, 16), (4096, 32), (1024, 64)],
    "training": [(1024, 64), (1024, 1024), (4096, 256)],
    "muon": [(1024, 4096), (4096, 4096)],
    "cupy": [(1024, 256, 512), (4096, 1024, 1024)],
    "jax": [(1024, 256, 512), (4096, 1024, 1024)],
    "loop_max_L": 1024,  # the loop of 4096 reflections: ~4096 × 3 launches, not timed
}
QUICK = {
    "apply": [(48, 12, 8), (48, 48, 8)],
    "forming": [(32, "float32"), (32, "float64")],
    "stacks": [(16, 4), (8, 8)],
    "training": [(32, 8)],
    "muon": [(16, 24)],
    "cupy": [(48, 12, 8)],
    "jax": [(48, 12, 8)],
    "loop_max_L": 64,
}


class _Overrun(Exception):
    """A row ran past its section's share of the budget."""


@dataclass
class Row:
    section: str
    what: str
    shape: str
    ours_s: float | None = None
    other_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: max |ours − other| / max |other| where both compute the same thing (a wrong answer
    #: shows here), None where they do not (two GEMMs stand in for a cost only)
    rel_diff: float | None = None
    status: str = "not measured: not reached"

    @property
    def ratio(self) -> float | None:
        if self.ours_s is None or self.other_s is None or self.other_s <= 0:
            return None
        return self.ours_s / self.other_s


@dataclass
class Run:
    """The rows, the device and the budget; writes the table after every row."""

    out: Path
    device: str
    budget_s: float
    quick: bool
    rows: list[Row] = field(default_factory=list)
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def save(self) -> None:
        rows = [
            {
                "section": r.section,
                "row": r.what,
                "shape": r.shape,
                "ours_ms": None if r.ours_s is None else r.ours_s * 1e3,
                "other_ms": None if r.other_s is None else r.other_s * 1e3,
                "ratio": r.ratio,
                "rel_diff": r.rel_diff,
                "status": r.status,
                **r.extra,
            }
            for r in self.rows
        ]
        doc = {**self.info, "budget_s": self.budget_s, "sections": self.sections, "rows": rows}
        (self.out / "gpu.json").write_text(
            json.dumps(H.jsonable(doc), indent=1, ensure_ascii=False) + "\n"
        )
        (self.out / "gpu.md").write_text(self.markdown())

    def markdown(self) -> str:
        i = self.info
        lines = [
            f"# GPU table ({'quick, ' if self.quick else ''}{i.get('device_name')})",
            "",
            f"Date {i.get('date')}; versions: "
            + ", ".join(f"{k} {v}" for k, v in i.get("versions", {}).items() if v)
            + f". Budget {self.budget_s:.0f} s; median of up to {REPS} synchronised calls "
            "after one warm-up call; ratio = ours / other.",
            "",
            "| row | shape | ours | other | ratio ours/other | rel. diff | status |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in self.rows:
            ratio = "—" if r.ratio is None else H.fmt_ratio(r.ratio)
            extra = "".join(f"; {k} {H.fmt_t(v)}" for k, v in r.extra.items() if v is not None)
            lines.append(
                f"| {r.what} | {r.shape} | {H.fmt_t(r.ours_s)} | {H.fmt_t(r.other_s)} "
                f"| {ratio} | {'—' if r.rel_diff is None else f'{r.rel_diff:.1e}'} "
                f"| {r.status}{extra} |"
            )
        lines += ["", "Sections (budget share, seconds spent):", ""]
        lines += [
            f"- {k}: {v.get('budget_s', 0):.0f} s, spent {v.get('spent_s', 0):.1f} s, "
            f"{v.get('status', 'not started')}"
            for k, v in self.sections.items()
        ]
        return "\n".join(lines) + "\n"


# -- timing ------------------------------------------------------------------------------------


def _syncer(device: str) -> Callable[[], None]:
    if device == "cuda":
        import torch

        return torch.cuda.synchronize
    return lambda: None


def median_time(fn: Callable[[], Any], sync: Callable[[], None], reps: int = REPS) -> float:
    """Median seconds of ``fn()`` between two synchronisations, after one warm-up call;
    fewer calls when one call takes long (≥ 3 calls, ≤ ~2 s of calls)."""
    return _timed(fn, sync, reps)[0]


def _timed(fn: Callable[[], Any], sync: Callable[[], None], reps: int = REPS) -> tuple[float, Any]:
    """(:func:`median_time`, the last result)."""
    sync()
    fn()
    sync()
    times: list[float] = []
    while len(times) < reps:
        t = time.perf_counter()
        out = fn()
        _block(out)
        sync()
        times.append(time.perf_counter() - t)
        if len(times) >= 3 and sum(times) > 2.0:
            break
    return statistics.median(times), out


def pair(
    row: Row,
    ours: Callable[[], Any],
    other: Callable[[], Any],
    sync: Callable[[], None],
    other_reps: int = REPS,
) -> None:
    """Time ``ours`` and ``other`` (same results: their relative difference goes in the row)."""
    row.ours_s, y = _timed(ours, sync)
    row.other_s, ref = _timed(other, sync, other_reps)
    row.rel_diff = float(abs(y - ref).max() / abs(ref).max())


def _block(out: Any) -> None:
    """JAX results are asynchronous: wait for them (a no-op for other arrays)."""
    wait = getattr(out, "block_until_ready", None)
    if wait is not None:
        wait()


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Raise :class:`_Overrun` in this (main) thread after ``seconds`` (a device call in
    flight finishes first; the next Python line is interrupted)."""
    if seconds <= 0:
        raise _Overrun
    if not hasattr(signal, "setitimer"):  # pragma: no cover - not POSIX
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise _Overrun

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# -- the sections ------------------------------------------------------------------------------
# Each section is a list of (row, measure) pairs; measure() fills the row's times.


def _torch_setup(device: str) -> Any:
    import torch

    torch.manual_seed(0)
    return torch


def _reflectors(torch: Any, N: int, L: int, dtype: Any, device: str) -> tuple[Any, Any, Any]:
    """(a, tau) of geqrf of a random N × L matrix, and V: the unit lower trapezoidal
    reflectors, a zero column where τ = 0 (the last one of a square A: no reflection, which
    cwy's zero vector is), so that hl.cwy(V) is ormqr's Q (τ = 2/‖v‖² otherwise, for real
    geqrf output; the rows' rel. diff checks it)."""
    A = torch.randn(N, L, dtype=dtype, device=device)
    a, tau = torch.geqrf(A)
    V = (torch.tril(a, -1) + torch.eye(N, L, dtype=dtype, device=device)) * (tau != 0)
    return a, tau, V


def apply_rows(run: Run, cfg: dict[str, Any]) -> list[tuple[Row, Callable[[Row], None]]]:
    import householderla as hl

    out = []
    for N, L, B in cfg["apply"]:
        shape = f"N={N} L={L} B={B}"
        state: dict[str, Any] = {}

        def setup(N: int = N, L: int = L, B: int = B, state: dict = state) -> dict:
            if not state:
                torch = _torch_setup(run.device)
                a, tau, V = _reflectors(torch, N, L, torch.float32, run.device)
                h = torch.randn(N, B, device=run.device)
                state.update(torch=torch, a=a, tau=tau, V=V, h=h, op=hl.cwy(V))
            return state

        def prebuilt(row: Row, setup: Callable = setup) -> None:
            s = setup()
            op, V, h = s["op"], s["V"], s["h"]
            # unit columns for the GEMMs (a zero column, norm 0, stays zero; others have ≥ 1)
            Vn = V / s["torch"].linalg.vector_norm(V, dim=0).clamp_min(1.0)
            sync = _syncer(run.device)
            row.ours_s = median_time(lambda: op @ h, sync)
            row.other_s = median_time(lambda: Vn @ (Vn.T @ h), sync)

        def ormqr(row: Row, setup: Callable = setup) -> None:
            s = setup()
            torch, a, tau, V, h = s["torch"], s["a"], s["tau"], s["V"], s["h"]
            sync = _syncer(run.device)
            pair(row, lambda: hl.cwy(V) @ h, lambda: torch.ormqr(a, tau, h), sync)

        def loop(row: Row, setup: Callable = setup, L: int = L) -> None:
            s = setup()
            V, h, tau = s["V"], s["h"], s["tau"]

            def reflections() -> Any:
                y = h
                for j in range(L - 1, -1, -1):  # Q h = H(1)…H(L) h: the last one first
                    v = V[:, j : j + 1]
                    y = y - (tau[j] * v) @ (v.T @ y)
                return y

            sync = _syncer(run.device)
            pair(row, lambda: hl.cwy(V) @ h, reflections, sync, other_reps=3)

        out.append(
            (Row("apply", "prebuilt `op @ h` vs two GEMMs `V @ (V.T @ h)`", shape), prebuilt)
        )
        out.append((Row("apply", "fresh `hl.cwy(V) @ h` vs `torch.ormqr`", shape), ormqr))
        if L <= cfg["loop_max_L"]:
            out.append(
                (Row("apply", "fresh `hl.cwy(V) @ h` vs a Python loop of reflections", shape), loop)
            )
    return out


def forming_rows(run: Run, cfg: dict[str, Any]) -> list[tuple[Row, Callable[[Row], None]]]:
    import householderla as hl

    out = []
    for N, dt in cfg["forming"]:

        def square(row: Row, N: int = N, dt: str = dt) -> None:
            torch = _torch_setup(run.device)
            a, tau = torch.geqrf(torch.randn(N, N, dtype=getattr(torch, dt), device=run.device))
            sync = _syncer(run.device)
            ours = lambda: hl.from_lapack(a, tau).matrix()  # noqa: E731
            pair(row, ours, lambda: torch.linalg.householder_product(a, tau), sync)

        what = "`hl.from_lapack(a, tau).matrix()` vs `torch.linalg.householder_product`"
        out.append((Row("forming", what, f"N={N} {dt}"), square))
    for P, n in cfg["stacks"]:
        state: dict[str, Any] = {}

        def stack(P: int = P, n: int = n, state: dict = state) -> dict:
            if not state:
                torch = _torch_setup(run.device)
                a, tau = torch.geqrf(torch.randn(P, n, n, device=run.device))
                C = torch.randn(P, n, 8, device=run.device)
                state.update(torch=torch, a=a, tau=tau, C=C)
            return state

        def matrix(row: Row, stack: Callable = stack) -> None:
            s = stack()
            torch, a, tau = s["torch"], s["a"], s["tau"]
            sync = _syncer(run.device)
            ours = lambda: hl.from_lapack(a, tau).matrix()  # noqa: E731
            pair(row, ours, lambda: torch.linalg.householder_product(a, tau), sync)

        def apply(row: Row, stack: Callable = stack) -> None:
            s = stack()
            torch, a, tau, C = s["torch"], s["a"], s["tau"], s["C"]
            sync = _syncer(run.device)
            pair(row, lambda: hl.from_lapack(a, tau) @ C, lambda: torch.ormqr(a, tau, C), sync)

        shape = f"{P}×{n}×{n}"
        what = "stack: `hl.from_lapack(a, tau).matrix()` vs batched `householder_product`"
        out.append((Row("forming", what, shape), matrix))
        what = "stack: `hl.from_lapack(a, tau) @ C` (8 columns) vs batched `torch.ormqr`"
        out.append((Row("forming", what, shape), apply))
    return out


def training_rows(run: Run, cfg: dict[str, Any]) -> list[tuple[Row, Callable[[Row], None]]]:
    out = []
    for N, B in cfg["training"]:

        def step(row: Row, N: int = N, B: int = B) -> None:
            torch = _torch_setup(run.device)
            from torch.nn.utils import parametrizations

            import householderla.torch as hlt

            x = torch.randn(B, N, device=run.device)
            G = torch.randn(B, N, device=run.device)
            gen = torch.Generator().manual_seed(0)
            ours = hlt.OrthogonalLinear(N, N, bias=False, generator=gen).to(run.device)
            lin = torch.nn.Linear(N, N, bias=False).to(run.device)
            other = parametrizations.orthogonal(lin, orthogonal_map="cayley")

            def stepper(layer: Any) -> Callable[[], None]:
                opt = torch.optim.SGD(layer.parameters(), lr=1e-3)

                def one() -> None:
                    opt.zero_grad()
                    (layer(x) * G).sum().backward()
                    opt.step()

                return one

            sync = _syncer(run.device)
            row.ours_s = median_time(stepper(ours), sync)
            row.other_s = median_time(stepper(other), sync)

        what = (
            "training step (forward, backward, SGD): `hl.torch.OrthogonalLinear(N, N)` vs "
            "`parametrizations.orthogonal(nn.Linear, 'cayley')`"
        )
        out.append((Row("training", what, f"N={N} B={B}"), step))
    return out


def muon_rows(run: Run, cfg: dict[str, Any]) -> list[tuple[Row, Callable[[Row], None]]]:
    out = []
    for A, B in cfg["muon"]:

        def step(row: Row, A: int = A, B: int = B) -> None:
            torch = _torch_setup(run.device)
            import householderla.torch as hlt

            if not hasattr(torch.optim, "Muon"):
                row.status = f"not measured: torch {torch.__version__} has no torch.optim.Muon"
                raise _Skip
            p1 = torch.nn.Parameter(torch.randn(A, B, device=run.device))
            p2 = torch.nn.Parameter(p1.detach().clone())
            g = torch.randn(A, B, device=run.device)
            ours, other = hlt.Muon([p1], lr=0.02), torch.optim.Muon([p2], lr=0.02)

            def stepper(opt: Any, p: Any) -> Callable[[], None]:
                def one() -> None:
                    p.grad = g
                    opt.step()

                return one

            sync = _syncer(run.device)
            row.ours_s = median_time(stepper(ours, p1), sync)
            row.other_s = median_time(stepper(other, p2), sync)

        out.append((Row("muon", "`hl.torch.Muon` step vs `torch.optim.Muon`", f"{A}×{B}"), step))
    return out


class _Skip(Exception):
    """The row cannot be measured here (the row's status says why)."""


def cupy_rows(run: Run, cfg: dict[str, Any]) -> list[tuple[Row, Callable[[Row], None]]]:
    import householderla as hl

    out = []
    for N, L, B in cfg["cupy"]:

        def prebuilt(row: Row, N: int = N, L: int = L, B: int = B) -> None:
            if run.device != "cuda":
                row.status = "not measured: CuPy needs a GPU (--device cpu)"
                raise _Skip
            try:
                import cupy
            except ImportError as exc:
                row.status = f"not measured: CuPy not importable ({exc})"
                raise _Skip from exc
            rng = cupy.random.default_rng(0)
            V = rng.standard_normal((N, L), dtype=cupy.float32)
            h = rng.standard_normal((N, B), dtype=cupy.float32)
            op = hl.cwy(V)
            Vn = V / cupy.linalg.norm(V, axis=0)
            sync = cupy.cuda.Device().synchronize
            row.ours_s = median_time(lambda: op @ h, sync)
            row.other_s = median_time(lambda: Vn @ (Vn.T @ h), sync)

        what = "CuPy prebuilt `op @ h` vs two CuPy GEMMs"
        out.append((Row("cupy", what, f"N={N} L={L} B={B}"), prebuilt))
    return out


def jax_rows(run: Run, cfg: dict[str, Any]) -> list[tuple[Row, Callable[[Row], None]]]:
    out = []
    for N, L, B in cfg["jax"]:
        for grad in (False, True):

            def measure(row: Row, N: int = N, L: int = L, B: int = B, grad: bool = grad) -> None:
                try:
                    import jax
                    import jax.numpy as jnp
                except ImportError as exc:
                    row.status = f"not measured: JAX not importable ({exc})"
                    raise _Skip from exc
                import householderla as hl

                platform_ = "gpu" if run.device == "cuda" else "cpu"
                try:
                    dev = jax.devices(platform_)[0]
                except RuntimeError as exc:
                    row.status = f"not measured: JAX has no {platform_} device ({exc})"
                    raise _Skip from exc
                k1, k2 = jax.random.split(jax.random.PRNGKey(0))
                V = jax.device_put(jax.random.normal(k1, (N, L), jnp.float32), dev)
                h = jax.device_put(jax.random.normal(k2, (N, B), jnp.float32), dev)

                def ours(V: Any, h: Any) -> Any:
                    return hl.cwy(V) @ h

                def gemms(V: Any, h: Any) -> Any:
                    Vn = V / jnp.linalg.norm(V, axis=0)
                    return h - 2.0 * Vn @ (Vn.T @ h)

                if grad:
                    ours = jax.grad(lambda V, h, f=ours: jnp.sum(f(V, h) ** 2))
                    gemms = jax.grad(lambda V, h, f=gemms: jnp.sum(f(V, h) ** 2))
                f_ours, f_other = jax.jit(ours), jax.jit(gemms)
                t = time.perf_counter()
                f_ours.lower(V, h).compile()
                row.extra["compile_s"] = time.perf_counter() - t
                row.ours_s = median_time(lambda: f_ours(V, h), lambda: None)
                row.other_s = median_time(lambda: f_other(V, h), lambda: None)

            what = (
                "JAX `jit(grad(‖hl.cwy(V) @ h‖²))` vs the grad of two GEMMs"
                if grad
                else "JAX `jit(hl.cwy(V) @ h)` vs two GEMMs"
            )
            out.append((Row("jax", what, f"N={N} L={L} B={B}"), measure))
    return out


SECTIONS = {
    "apply": apply_rows,
    "forming": forming_rows,
    "training": training_rows,
    "muon": muon_rows,
    "cupy": cupy_rows,
    "jax": jax_rows,
}


# -- the run -----------------------------------------------------------------------------------


def _machine(device: str) -> dict[str, Any]:
    import datetime

    name = platform.processor() or platform.machine()
    if device == "cuda":
        import torch

        name = torch.cuda.get_device_name()
    return {
        "device": device,
        "device_name": name,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "versions": {k: _version(k) for k in VERSIONS},
    }


def _version(name: str) -> str | None:
    v = H._version(name)
    if v is None and name == "householderla":
        import householderla

        v = householderla.__version__
    return v


def _warm_up(device: str) -> None:
    """One tiny product and polar step before the clock of the sections starts: the first
    call imports the kernels and the rule tables (seconds), which no row should pay."""
    import torch

    import householderla as hl

    V = torch.randn(8, 3, device=device)
    (hl.cwy(V) @ torch.randn(8, 2, device=device)).sum().item()


def main(argv: list[str] | None = None) -> int:
    p = H.parser(__doc__, quick="tiny sizes (a smoke test; with --device cpu, no GPU needed)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--budget", type=float, default=None, help="seconds (default 170; quick 60)")
    p.add_argument("--sections", nargs="*", default=list(SECTIONS), choices=list(SECTIONS))
    args = p.parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("benchmarks.gpu: torch sees no CUDA device; use --device cpu", file=sys.stderr)
            return 2
    budget = args.budget if args.budget is not None else (60.0 if args.quick else 170.0)
    cfg = QUICK if args.quick else FULL
    run = Run(H.out_dir(args), args.device, budget, args.quick, info=_machine(args.device))
    plan = {name: SECTIONS[name](run, cfg) for name in args.sections}
    for name, rows in plan.items():
        run.rows += [r for r, _ in rows]
        share = budget * SHARES[name] / sum(SHARES[n] for n in plan)
        run.sections[name] = {"budget_s": share, "spent_s": 0.0, "status": "not reached"}
    run.save()
    _warm_up(args.device)
    carry = 0.0  # what the sections before left of their shares
    for name, rows in plan.items():
        sec = run.sections[name]
        sec["budget_s"] += carry
        t0 = time.perf_counter()
        sec["status"] = "running"
        for row, measure in rows:
            left = sec["budget_s"] - (time.perf_counter() - t0)
            try:
                with _alarm(left):
                    measure(row)
                row.status = "measured"
            except _Skip:
                pass
            except _Overrun:
                row.ours_s = row.other_s = None
                row.status = (
                    f"not measured: section '{name}' ran out of its {sec['budget_s']:.0f} s"
                )
            except Exception as exc:  # a failing row is reported, the others still run
                row.ours_s = row.other_s = None
                row.status = f"not measured: {type(exc).__name__}: {str(exc)[:160]}"
            sec["spent_s"] = time.perf_counter() - t0
            run.save()
            print(f"[gpu] {row.what} {row.shape}: {row.status}", file=sys.stderr)
        sec["status"] = "done"
        carry = max(0.0, sec["budget_s"] - sec["spent_s"])
        run.save()
    print(run.markdown())
    print(f"wrote {H.shown(run.out / 'gpu.md')} and gpu.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
