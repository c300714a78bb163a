"""Compile the Numba kernels ahead: ``python -m householderla._kernels.warm`` (``make warm``).

Importing the kernel modules compiles every entry kernel (explicit signatures) into Numba's
on-disk cache, so that the first NumPy call of a later process loads them instead of compiling
them (see :mod:`householderla._kernels`); each NumPy entry point is then called once on tiny
float32 and float64 inputs, which also checks that the compiled code runs. Prints what it did
and how long it took; exits 0 without Numba (nothing to compile).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from . import import_kernels


def warm() -> bool:
    """Compile (or load) every kernel and run each entry point once; False without Numba."""
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
