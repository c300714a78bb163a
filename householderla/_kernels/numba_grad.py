"""The backward entry kernel of the sequential Householder product (``hgrad``'s loop).

V̄ and H̄ of y = H(v₁)⋯H(v_L) h for a stack, summed over broadcast batch entries: each
matrix's output recomputed (or read), then the reflections undone one by one with their
cotangents (:func:`~householderla._kernels.numba_loops.grad_one`; algorithm and numerics
there). Its own module so that ``make warm`` compiles it beside ``numba_batched``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .numba_loops import HAVE_NUMBA, apply_one, grad_one, njit
from .numba_taus import all_taus

if HAVE_NUMBA:
    from numba import types as _nt

__all__ = ["bp_kernel"]

#: A hash of the sibling kernel modules this one imports (see :mod:`.numba`'s).
KERNEL_DEPS = "708b0f3a1549dfa1"


def _sigs() -> Any:
    if not HAVE_NUMBA:
        return None
    out = []
    for f in (_nt.float32, _nt.float64):
        ro3 = _nt.Array(f, 3, "C", readonly=True)
        rw3 = _nt.Array(f, 3, "C")
        b, i = _nt.boolean, _nt.int64
        out.append(i(ro3, ro3, ro3, rw3, rw3, b, b, b, i))
    return out


@njit(_sigs())
def bp_kernel(
    V: Any,
    X: Any,
    G: Any,
    Vb: Any,
    Hb: Any,
    from_output: bool,
    trap: bool,
    transpose: bool,
    safe_exp: int,
) -> int:
    """V̄ → Vb (Pv, N, L) and H̄ → Hb (Ph, N, B) (summed over broadcast batch entries) for
    V (Pv, N, L), G (P, N, B), and X (Px, N, B) the input h (``from_output=False``: the
    output is recomputed first) or the output y. Status as
    :func:`~householderla._kernels.numba_batched.fp_kernel`."""
    Pv, n, _ = V.shape
    Px, _, B = X.shape
    P = G.shape[0]
    Ph = Hb.shape[0]
    tau, status = all_taus(V, trap, safe_exp)
    if status < 0:
        return status
    Y = np.empty((n, B), V.dtype)
    Gw = np.empty((n, B), V.dtype)
    acc = np.empty((4, B), V.dtype)
    c = np.empty((2, B), V.dtype)
    Vb[:] = 0
    Hb[:] = 0
    for p in range(P):
        pv = p if Pv > 1 else 0
        Y[:] = X[p if Px > 1 else 0]
        if not from_output:
            apply_one(V[pv], tau[pv], Y, trap, transpose, acc, c)
        Gw[:] = G[p]
        grad_one(V[pv], tau[pv], Y, Gw, Vb[pv], trap, transpose, acc, c)
        Hb[p if Ph > 1 else 0] += Gw
    return status
