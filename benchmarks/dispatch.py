"""Small-shape table: what householderla's public calls cost over the same products written by
hand in the caller's library, one thread, float64 NumPy and float32 torch.

Run ``python -m benchmarks.dispatch`` (full, < 1 min on 2 cores; writes
``build/bench/dispatch.{json,md}``) or ``python -m benchmarks.dispatch --quick`` (a
smoke test, a few seconds; writes ``build/bench/quick/``); ``--out DIR`` elsewhere.

At these shapes the flops take microseconds, so the ratio is the library's own overhead
(argument resolution, dispatch, checks, dtype handling) next to the minimal code a caller
would write. Rows, each a ratio ours / anchor measured side by side in one run
(``benchmarks/_harness.py``: loops per sample calibrated, samples taken round-robin):

* *prebuilt* ``op @ h`` with ``op = hl.cwy(V)`` whose factors are built (one prior product,
  ``op.U`` / ``op.T_factor`` read) vs ``h - U @ (T @ (U.T @ h))`` with ``U = op.U``,
  ``T = op.T_factor``; N/L = 16/4, 128/16, 512/64, h one vector (N,) and B = 8 columns.
  Target ≤ 1.5×.
* *fresh* ``hl.cwy(V) @ h`` (a new operator every call) vs by hand: normalise the columns,
  Gram ``UᵀU``, ``S = ½I + striu(UᵀU)``, ``T = S⁻¹`` by ``solve_triangular(S, I)`` (SciPy with
  ``check_finite=False`` / ``torch.linalg``), then the three products. Same shapes; ≤ 2×.
* ``hl.householder_apply(V, h)`` at N = 128, L = 16, one vector vs the precomputed CWY product
  by hand (the reflections one at a time against CWY with its factors given). ≤ 1.0×.
* One optimizer step at N = 200, M = 10 (float32): ``hl.torch.StiefelSGD`` (momentum
  0.9) vs geoopt's ``RiemannianSGD`` on a ``ManifoldParameter`` of
  ``geoopt.Stiefel(canonical=True)``, and ``hl.torch.StiefelAdam`` vs ``RiemannianAdam``, on
  the Brockett loss ``−tr(XᵀAXD)``. Two regimes: *descent* sets the gradient −2AXD of the
  current point before each ``step()`` (one 200×200×10 product, identical on both sides,
  included in both times) — a training loop's step; ≤ 1.0×. *Fixed gradient* steps with X₀'s
  gradient forever, so the momentum saturates and every step is large: a stress case of the
  retraction, reported without a target.

Threads: ``torch.set_num_threads(1)`` and threadpoolctl limits every BLAS / OpenMP pool of
the process to one thread (recorded on the machine line and in the JSON).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.linalg as sla
import torch

import householderla as hl
import householderla.torch as hlt
from benchmarks import _harness as H

try:  # the optimizer rows' anchor; a missing geoopt is said in the table
    import geoopt
except ImportError as exc:  # pragma: no cover - geoopt is a bench extra
    geoopt, GEOOPT_ERROR = None, f"{type(exc).__name__}: {exc}"
else:
    GEOOPT_ERROR = None

FULL = {"profile": H.Profile(sample_s=5e-3, min_total=0.25, max_total=2.0, min_rep=10)}
QUICK = {"profile": H.Profile(sample_s=2e-4, min_total=0.0, max_total=0.2, min_rep=3, max_rep=3)}
SHAPES = [(16, 4), (128, 16), (512, 64)]
BS = [1, 8]  # 1: one vector h of shape (N,)
TARGET = {"prebuilt": 1.5, "fresh": 2.0, "householder_apply": 1.0, "optimizer": 1.0}
# kinds reported without a target: "optimizer_stress"
OPT_N, OPT_M = 200, 10


# -- the two libraries, written by hand --------------------------------------------------------
def np_factors(V: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    U = V / np.linalg.norm(V, axis=0)
    eye = np.eye(V.shape[1], dtype=V.dtype)
    S = np.triu(U.T @ U, 1) + 0.5 * eye
    return U, sla.solve_triangular(S, eye, check_finite=False)


def torch_factors(V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    U = V / torch.linalg.vector_norm(V, dim=0)
    eye = torch.eye(V.shape[1], dtype=V.dtype)
    S = torch.triu(U.T @ U, 1) + 0.5 * eye
    return U, torch.linalg.solve_triangular(S, eye, upper=True)


BACKENDS: dict[str, dict[str, Any]] = {
    "numpy float64": {
        "randn": lambda rng, *s: rng.standard_normal(s),
        "factors": np_factors,
        "err": lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))),
    },
    "torch float32": {
        "randn": lambda rng, *s: torch.from_numpy(rng.standard_normal(s).astype(np.float32)),
        "factors": torch_factors,
        "err": lambda a, b: float((a - b).abs().max()),
    },
}


def cwy_rows(b: H.Bench, rng: np.random.Generator) -> list[H.Row]:
    rows = []
    for bname, be in BACKENDS.items():
        factors, err = be["factors"], be["err"]
        for N, L in SHAPES:
            V = be["randn"](rng, N, L)
            for B in BS:
                h = be["randn"](rng, N) if B == 1 else be["randn"](rng, N, B)
                op = hl.cwy(V)
                op @ h  # one prior product ...
                U, T = op.U, op.T_factor  # ... and the factors built
                op @ h
                tag = f"{bname} N={N} L={L} B={B}"

                def hand_prebuilt(U: Any = U, T: Any = T, h: Any = h) -> Any:
                    return h - U @ (T @ (U.T @ h))

                def hand_fresh(V: Any = V, h: Any = h, factors: Any = factors) -> Any:
                    U, T = factors(V)
                    return h - U @ (T @ (U.T @ h))

                t = b.side_by_side(
                    f"prebuilt {tag}", {"anchor": hand_prebuilt, "ours": lambda op=op, h=h: op @ h}
                )
                rows.append(
                    _row(f"prebuilt op @ h, {tag}", "h − U @ (T @ (Uᵀ h)) by hand", t, "prebuilt")
                )
                rows[-1].data["max_abs_diff"] = err(op @ h, hand_prebuilt())
                t = b.side_by_side(
                    f"fresh {tag}", {"anchor": hand_fresh, "ours": lambda V=V, h=h: hl.cwy(V) @ h}
                )
                anchor = "normalise, Gram, solve_triangular, 3 products by hand"
                rows.append(_row(f"hl.cwy(V) @ h, {tag}", anchor, t, "fresh"))
                rows[-1].data["max_abs_diff"] = err(hl.cwy(V) @ h, hand_fresh())
    return rows


def householder_apply_rows(b: H.Bench, rng: np.random.Generator) -> list[H.Row]:
    rows = []
    N, L = 128, 16
    for bname, be in BACKENDS.items():
        V, h = be["randn"](rng, N, L), be["randn"](rng, N)
        U, T = be["factors"](V)
        t = b.side_by_side(
            f"householder_apply {bname}",
            {
                "anchor": lambda U=U, T=T, h=h: h - U @ (T @ (U.T @ h)),
                "ours": lambda V=V, h=h: hl.householder_apply(V, h),
            },
        )
        anchor = "precomputed CWY h − U @ (T @ (Uᵀ h)) by hand"
        rows.append(_row(f"hl.householder_apply(V, h), {bname} N={N} L={L} B=1", anchor, t,
                         "householder_apply"))  # fmt: skip
        rows[-1].data["max_abs_diff"] = be["err"](
            hl.householder_apply(V, h), h - U @ (T @ (U.T @ h))
        )
    return rows


# -- optimizers --------------------------------------------------------------------------------
def _brockett() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """X₀ ∈ St(N, M), and A (symmetric), D of the Brockett loss f(X) = −tr(XᵀAXD)."""
    g = torch.Generator().manual_seed(0)
    X0 = torch.linalg.qr(torch.randn(OPT_N, OPT_M, generator=g))[0]
    A = torch.randn(OPT_N, OPT_N, generator=g)
    A = (A + A.T) / (2 * OPT_N**0.5)  # spectrum in about (−√2, √2)
    D = torch.diag(torch.arange(1.0, OPT_M + 1))
    return X0, A, D


def _stepper(
    make_param: Callable[[torch.Tensor], Any], make_opt: Callable[[Any], Any], regime: str
) -> tuple[Any, Callable[[], Any]]:
    """A parameter on St(N, M), its optimizer after 20 steps, and the timed callable.

    ``"descent"``: each call sets the gradient −2AXD of the current point (one 200×200×10
    product, the same on both sides; a training loop's backward), then steps — the regime of
    a real run, steps shrinking as X converges. ``"fixed"``: the gradient of X₀ is kept, so
    the momentum saturates at G/(1 − μ) and every step is large (‖ηU‖ ≈ 1, far from the
    manifold): a stress case for the retraction, not a training step.
    """
    X0, A, D = _brockett()
    p = make_param(X0.clone())
    p.grad = -2 * A @ p.detach() @ D
    opt = make_opt(p)

    def refresh() -> None:
        with torch.no_grad():
            p.grad.copy_(-2 * (A @ p) @ D)
        opt.step()

    fn = refresh if regime == "descent" else opt.step
    for _ in range(20):  # state initialised and in flight
        fn()
    return p, fn


def optimizer_rows(b: H.Bench) -> list[H.Row]:
    pairs = [
        ("StiefelSGD", "RiemannianSGD", {"lr": 1e-2, "momentum": 0.9}),
        ("StiefelAdam", "RiemannianAdam", {"lr": 1e-3}),
    ]
    rows = []
    for regime in ("descent", "fixed"):
        for ours_name, geo_name, kw in pairs:
            args = ", momentum=0.9" if "momentum" in kw else ""
            what = (
                "gradient of the current point + step()"
                if regime == "descent"
                else "step() with a fixed gradient (large steps)"
            )
            measure = f"hl.torch.{ours_name}(…{args}): {what}, float32 N={OPT_N} M={OPT_M}"
            anchor = f"geoopt {geo_name}(…{args}), Stiefel(canonical=True)"
            if geoopt is None:
                b.step(f"{ours_name} (no geoopt)", 2)
                rows.append(H.Row(measure, f"{anchor}: not installed ({GEOOPT_ERROR})", "—", "—",
                                  "—", "≤ 1×", "n/a"))  # fmt: skip
                continue
            cls = getattr(hlt, ours_name)
            q, ours = _stepper(torch.nn.Parameter, lambda p, cls=cls, kw=kw: cls([p], **kw), regime)
            man = geoopt.Stiefel(canonical=True)
            p, ref = _stepper(
                lambda X, man=man: geoopt.ManifoldParameter(X, manifold=man),
                lambda p, g=geo_name, kw=kw: getattr(geoopt.optim, g)([p], **kw),
                regime,
            )
            t = b.side_by_side(f"{regime} {ours_name}", {"anchor": ref, "ours": ours})
            kind = "optimizer" if regime == "descent" else "optimizer_stress"
            rows.append(_row(measure, anchor, t, kind))
            rows[-1].data.update(
                regime=regime,
                orth_err_ours=H.orth_err(q.detach().numpy()),
                orth_err_geoopt=H.orth_err(p.detach().numpy()),
            )
    return rows


def _row(measure: str, anchor: str, t: dict[str, dict[str, Any]], kind: str) -> H.Row:
    a, o = t["anchor"], t["ours"]
    target = TARGET.get(kind)
    row = H.ratio_row(measure, anchor, a["median_s"], o["median_s"], target or 0.0, kind=kind)
    if target is None:  # reported, not a target
        row.target, row.met = "—", ""
    row.data.update(anchor_timing=a, ours_timing=o, ratio_of_minima=o["min_s"] / a["min_s"])
    return row


def main(argv: list[str] | None = None) -> int:
    args = H.parser(__doc__, "a smoke test (a few seconds)").parse_args(argv)
    cfg = QUICK if args.quick else FULL
    out_dir = H.out_dir(args)
    t0 = time.perf_counter()
    threads = H.limit_threads(1)  # after numpy, scipy and torch loaded their pools
    machine = H.machine_info()
    monitor = H.LoadMonitor()
    rng = np.random.default_rng(0)
    total = len(BACKENDS) * (len(SHAPES) * len(BS) * 4 + 2) + 8
    with H.Bench(cfg["profile"], total, "dispatch") as b:
        rows = cwy_rows(b, rng) + householder_apply_rows(b, rng) + optimizer_rows(b)
    mline, load = H.run_line(machine, monitor, threads)
    md = H.table_markdown(rows, mline, args.quick)
    md += (
        "\nratio = ours / anchor, medians of samples taken round-robin in one process; "
        "optimizer rows: *gradient of the current point + step()* sets the Brockett gradient "
        "−2AXD of the current X (one 200×200×10 product, the same for both) and steps, as a "
        "training loop does; *fixed gradient* keeps X₀'s gradient, so momentum saturates and "
        "every step is large (a stress case of the retraction, no target).\n"
    )
    print(md)
    warn = H.load_warning(load)
    if warn:
        print(warn)
    res = {
        "machine": machine,
        "threads": threads,
        "quick": args.quick,
        "config": {**cfg, "shapes": SHAPES, "B": BS, "targets": TARGET},
        "geoopt": GEOOPT_ERROR or "measured",
        "rows": rows,
        "load": load,
        "wall_s": time.perf_counter() - t0,
    }
    H.write(out_dir / "dispatch.json", res)
    H.write(out_dir / "dispatch.md", md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
