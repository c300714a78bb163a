"""The triangular factor of a panel of reflectors from its Gram matrix, by ``?larft``'s recurrence.

For a panel V_p with LAPACK's τ, H(1)…H(nb) = I − V_p T V_pᴴ with T upper triangular
(Schreiber & Van Loan, SIAM J. Sci. Stat. Comput. 1989; ``?larft``, direct = "F", storev = "C"):
T[i, i] = τᵢ, T[:i, i] = −τᵢ T[:i, :i] G[:i, i], G = V_pᴴV_p — the closed form
(I + diag(τ) striu(G))⁻¹ diag(τ) of
:func:`householderla._agnostic.lapack_panels.panel_factors` column by column: nb³/6
multiply-adds per panel and no inverse.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .numba_loops import HAVE_NUMBA, njit

__all__ = ["lapack_panel", "larft_forward", "larft_one", "panel_rows"]

#: A hash of the sibling kernel modules this one imports: Numba's on-disk cache keys a
#: compiled function on its own file only, so changing this line when one of them changes
#: makes the cache recompile (tests/test_numba_kernels.py checks it).
KERNEL_DEPS = "b0a0beb634880961"


def _sigs(kind: str = "larft") -> Any:
    if not HAVE_NUMBA:
        return None
    from numba import types as nt

    out = []
    for f in (nt.float32, nt.float64, nt.complex64, nt.complex128):
        ro3, ro2 = nt.Array(f, 3, "C", readonly=True), nt.Array(f, 2, "C", readonly=True)
        if kind == "panel":
            ro1, rw2, i = nt.Array(f, 1, "C", readonly=True), nt.Array(f, 2, "C"), nt.int64
            out.append(nt.void(ro2, ro1, i, i, rw2, rw2, nt.boolean))
        else:
            out.append(nt.void(ro3, ro2, nt.Array(f, 3, "C")))
    return out


@njit()
def panel_rows(at: Any, tau: Any, s: int, e: int, out: Any, cout: Any, conj: bool) -> None:
    """The body of :func:`lapack_panel` (compiled per caller's types)."""
    m = at.shape[1]
    for j in range(e - s):
        c = s + j
        row = out[j]
        if tau[c] == 0:  # H(c) = I whatever the column holds
            row[s:] = 0
        else:
            row[s:c] = 0
            row[c] = 1
            row[c + 1 : m] = at[c, c + 1 :]
        if conj:
            crow = cout[j]
            for r in range(s, m):
                crow[r] = np.conj(row[r])


@njit(_sigs("panel"))
def lapack_panel(at: Any, tau: Any, s: int, e: int, out: Any, cout: Any, conj: bool) -> None:
    """Panel [s, e) of LAPACK's reflectors from ``at`` = aᵀ (n, m) C-contiguous (a column-major
    ``a``): out[j, s:] ← v_{s+j}[s:] for j < e − s, the zeros above the diagonal, the implicit
    1 and the entries of ``a`` below it, or all zeros where τ_{s+j} = 0; with ``conj`` also
    cout[j, s:] ← its conjugate. ``out`` and ``cout`` (≥ e − s, m) C-contiguous: the panel is
    out[:e − s, s:]ᵀ. One call for what took five NumPy calls a panel."""
    panel_rows(at, tau, s, e, out, cout, conj)


@njit()
def larft_one(G: Any, tau: Any, T: Any) -> None:
    """T ← the upper-triangular factor of one panel from its Gram G = V_pᴴV_p (n, n) and τ
    (n,): only G's strict upper triangle is read, T's strict lower triangle is set to 0."""
    n = tau.shape[0]
    for i in range(n):
        ti = tau[i]
        for r in range(i + 1, n):
            T[r, i] = 0
        T[i, i] = ti
        for r in range(i):
            acc = T[r, r] * G[r, i]
            for c in range(r + 1, i):
                acc += T[r, c] * G[c, i]
            T[r, i] = -ti * acc


@njit(_sigs())
def larft_forward(G: Any, tau: Any, T: Any) -> None:
    """T[b] ← the upper-triangular factor of panel b from its Gram G[b] = V_bᴴV_b and τ[b],
    for G (P, n, n), τ (P, n), T (P, n, n), all C-contiguous and of one dtype; only G's
    strict upper triangle is read, T's strict lower triangle is set to 0."""
    for b in range(tau.shape[0]):
        larft_one(G[b], tau[b], T[b])
