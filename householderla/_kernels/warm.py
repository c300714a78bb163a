"""Compile the Numba kernels ahead: ``python -m householderla._kernels.warm`` (``make warm``).

Importing the kernel modules compiles every entry kernel into Numba's on-disk cache, so later
processes load them (:mod:`householderla._kernels`); each NumPy entry point then runs once on
tiny float32 and float64 inputs. On a cold cache and two or more cores, the modules compile in
two processes at once, in two rounds (:data:`ROUNDS`), into the same cache.
Prints what it did and how long it took; exits 0 without Numba.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np

from . import COMPILE_NOTICE, cold_cache, import_kernels, say_once

#: (modules another process compiles, modules this process compiles meanwhile), round by
#: round: each round's modules import only their own and earlier rounds' (the LAPACK panels
#: and the lanes beside the columns, checks and vector kernels; then the stack dispatch,
#: which needs both halves, beside the backward kernel); each half of a round about as long
#: as the other. The entry module :mod:`.numba` then loads them all from the cache.
ROUNDS = (
    (
        ("numba_lanes", "numba_larft", "numba_panels"),
        ("numba_checks", "numba_columns", "numba_vec"),
    ),
    (("numba_grad",), ("numba_batched",)),
)


def _compile_in_two_processes() -> None:
    """Compile the kernel modules round by round in two processes at once when the cache is
    cold and the machine has two cores; nothing otherwise (the import in :func:`warm`
    compiles or loads them)."""
    import importlib.util

    if importlib.util.find_spec("numba") is None or (os.cpu_count() or 1) < 2:
        return
    if cold_cache() is None:
        return
    if say_once("compile"):
        print(COMPILE_NOTICE, file=sys.stderr, flush=True)
    for other_modules, own in ROUNDS:
        code = "; ".join(f"import {__package__}.{m}" for m in other_modules)
        other = subprocess.Popen([sys.executable, "-c", code])
        try:
            for m in own:
                __import__(f"{__package__}.{m}")
        finally:
            other.wait()


def warm() -> bool:
    """Compile (or load) every kernel and run each entry point once; False without Numba."""
    _compile_in_two_processes()
    nk, _ = import_kernels()
    if nk is None:
        return False
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        V = rng.standard_normal((2, 4, 4, 3)).astype(dtype)
        h = rng.standard_normal((2, 4, 4, 2)).astype(dtype)
        y = nk.hprod(V, h)
        nk.hprod(np.tril(V), h, trapezoidal=True, transpose=True)
        nk.hprod_vector(V[0, 0], h[0, 0, :, 0])
        nk.hgrad(V, np.ones_like(y), h=h)
        nk.hgrad(V, np.ones_like(y), y=y)
        nk.hform(V)
        nk.hform(np.tril(V), 2, trapezoidal=True)
        nk.finite_lower(V.reshape(-1, 4, 3))
        nk.upper_is_zero(V.reshape(-1, 4, 3))
    return True


def main() -> int:
    start = time.perf_counter()
    if not warm():
        print("householderla: Numba is not installed; nothing to compile", file=sys.stderr)
        return 0
    seconds = time.perf_counter() - start
    print(f"householderla: Numba kernels compiled or loaded from the cache in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
