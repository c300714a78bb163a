"""What every gallery script shares: the command line (``--quick``, ``--out``, ``--threads``,
``--seed``), the machine line it prints, seeding, the progress bar and writing JSON + PNG.

Not an example itself. The scripts import it as a sibling module (``examples/`` is on
``sys.path`` when a script runs, and the docs pages put it there).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import random
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
try:
    import householderla  # noqa: F401
except ImportError:  # running from a source checkout without installing
    sys.path.insert(0, str(ROOT))

#: Full runs write here (committed); ``--quick`` runs into the docs build directory (ignored).
FULL_OUT = ROOT / "benchmarks" / "results" / "gallery"
QUICK_OUT = ROOT / "docs" / "_build" / "gallery"


def parser(doc: str | None) -> argparse.ArgumentParser:
    """The options every gallery script takes."""
    p = argparse.ArgumentParser(
        description=(doc or "").strip().splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="the short run of the docs page")
    p.add_argument("--out", type=Path, default=None, help="folder of the JSON and PNG")
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw")
    p.add_argument(
        "--threads", type=int, default=1, help="torch and BLAS threads (0: the library default)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--replot", type=Path, default=None, help="redraw the PNG from a saved JSON, no run"
    )
    return p


def replot(args: argparse.Namespace, name: str, plot: Any) -> bool:
    """With ``--replot FILE.json``: draw ``plot(result)`` next to it as ``name.png``."""
    if args.replot is None:
        return False
    res = json.loads(args.replot.read_text())
    out = args.replot.parent / f"{name}.png"
    plot(res).savefig(out, dpi=110)
    print(f"wrote {out}")
    return True


def out_dir(args: argparse.Namespace) -> Path:
    d = args.out or (QUICK_OUT if args.quick else FULL_OUT)
    d.mkdir(parents=True, exist_ok=True)
    return d


def set_threads(n: int) -> None:
    """torch's intra-op threads (the BLAS of NumPy keeps its own unless OMP_NUM_THREADS is set
    before it is loaded); 0 leaves the defaults."""
    import torch

    if n > 0:
        torch.set_num_threads(n)


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` inside the block, restored after (the docs pages
    run their examples this way: one thread is faster for these small products on a busy
    machine and leaves the build's other work alone)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def seed_everything(seed: int) -> None:
    """Python's and torch's global generators (the scripts draw their data from explicit,
    seeded generators; this covers library code that uses the global ones)."""
    import torch

    random.seed(seed)
    torch.manual_seed(seed)


def digits_split(seed: int) -> tuple[Any, Any, Any, Any]:
    """scikit-learn's 8 × 8 digits (1797 images, shipped with the package) as NumPy arrays
    (x_train, y_train, x_test, y_test): a 75/25 split stratified by class, pixels in [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    xtr, xte, ytr, yte = train_test_split(
        d.images / 16.0, d.target, test_size=0.25, random_state=seed, stratify=d.target
    )
    return xtr, ytr, xte, yte


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """What ran the example: CPU, cores, threads, versions, the load average at the start."""
    import numpy as np
    import torch

    info: dict[str, Any] = {
        "cpu": _cpu_name(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "householderla": householderla_version(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    if hasattr(os, "getloadavg"):
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return info


def householderla_version() -> str:
    import householderla

    return householderla.__version__


def machine_line(info: dict[str, Any]) -> str:
    gpu = f", GPU {info['gpu']}" if "gpu" in info else ""
    load = info.get("load_average")
    busy = f"; load average {load[0]:.1f} on {info['cores']} cores" if load else ""
    return (
        f"{info['cpu']}, {info['cores']} cores{gpu}, torch {info['torch']} "
        f"({info['torch_threads']} thread(s)), numpy {info['numpy']}{busy}"
    )


def progress(it: Iterable[Any], enabled: bool, **kw: Any) -> Iterable[Any]:
    """``it`` with a tqdm bar when ``enabled`` (and tqdm importable)."""
    if not enabled:
        return it
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is in the bench extra
        return it
    return tqdm(it, **kw)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
        x = x.item()
    if isinstance(x, float):
        # 7 significant digits: float32 results and timings carry no more
        return float(f"{x:.7g}") if math.isfinite(x) else str(x)
    return x


def save(out: Path, name: str, result: dict[str, Any], fig: Any = None) -> None:
    """``out/name.json`` (and ``out/name.png`` from a matplotlib figure)."""
    path = out / f"{name}.json"
    text = json.dumps(_jsonable(result), separators=(",", ":"), ensure_ascii=False)
    path.write_text(text + "\n")
    print(f"wrote {path}")
    if fig is not None:
        fig.savefig(out / f"{name}.png", dpi=110)
        print(f"wrote {out / f'{name}.png'}")


def pyplot() -> Any:
    """matplotlib.pyplot with a non-interactive backend unless one is already chosen."""
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
