"""The operator of one column-major NumPy ``(a, τ)``: LAPACK's reflectors read in place.

``?geqrf`` returns ``a`` in column-major order (``scipy.linalg.lapack``, ``scipy.linalg.qr``
with ``mode="raw"``). For such an ``a`` (m > 64 rows, real or complex), ``from_lapack`` checks
the reflectors in one read-only Numba pass
(:func:`householderla._kernels.numba_checks.lapack_check_columns`) and builds no V: the
operator's ``.matrix()`` and first ``@`` run LAPACK's panel algorithms on ``a`` itself
(:class:`householderla._agnostic.lapack_panels.LapackPanels`: each panel of reflectors copied
into one reused buffer, as ``?orgqr``/``?ormqr`` read it). V and the factors are built when
anything else needs them (``op.V``, later products, autodiff-free composition...), and the
operator is then :class:`~householderla.cwy.CWY`'s (or TCWY's) in every respect.

Why: a fresh V (m × k) is written once and read once, and freed with the result it made
glibc return the heap to the system, so the next call faulted its pages in again. Measured
(one thread, 2-core VM, a plain loop of ``hl.from_lapack(a, tau, thin=True).matrix()`` at
1024 × 256 in a fresh process): float64 5.9–6.3 ms and 1,375 page faults a call with V,
3.9–4.4 ms and none without (``dorgqr`` 5.1–5.4 ms); complex128 16.0–17.3 ms in the
processes where it faulted (1,250–1,420 a call), 13.8 ms without V (``zungqr`` 14.4–14.6).
Where V did not fault, the two paths took 0.97–1.04× each other's time (256 ≤ m ≤ 2048).

As :func:`householderla.cwy` reads V, the operator reads ``a`` when it is used, not when it
is built: write into ``a`` only after you are done with the operator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import array_api_compat as aac
import numpy as np

from ._agnostic.lapack_panels import (
    PANEL,
    LapackPanels,
    apply_panels,
    form_panel_width,
    form_panels,
)
from ._factors import SMALL_N
from ._kernels import numba_enabled
from ._lapack_stack import LazyLapack
from ._lib.namespace import mH
from .cwy import CWY, TCWY
from .householder import sequential_is_faster

__all__ = ["SEQUENTIAL_MAX_M", "LapackColumns", "LapackColumnsThin", "lapack_columns"]

#: Largest m at which a first product with few columns (``sequential_is_faster``) runs the
#: sequential Numba kernel (on a built V) instead of the panels on ``a``. Fresh
#: ``from_lapack(a, tau) @ C``, float64, one thread, ms, sequential / panels: m = k = 128:
#: B = 1 0.10 / 0.17, B = 16 0.14 / 0.18; m = k = 256: B = 1 0.33 / 0.34, B = 16 0.50 /
#: 0.38, B = 64 1.26 / 0.55; m = k = 512: B = 1 3.4 / 0.92, B = 64 5.7 / 1.6 (the kernel's
#: 4·m·k·B flops at level-2 speed, and V's 2 MB faulted in each call).
SEQUENTIAL_MAX_M = 128


class _InPlacePanels:
    """``.matrix()`` and the first ``@`` of :class:`LazyLapack` operators over one ``a``."""

    _state: dict[str, Any]
    _transposed: bool
    _conjugated: bool
    _mode: str
    _n_rows_cols: tuple[int, int]

    def _build(self) -> CWY:
        s = self._state
        V, sdiag = s["build"](s["a"], s["tau"])
        kind = CWY if self._mode_forward == "square" else TCWY  # type: ignore[attr-defined]
        op = kind(V, s["xp"], structure="trapezoidal", sdiag=sdiag, tau=s["tau"])
        # the in-place product counts as the first one: later ones build and reuse factors
        op._factors.panels_used = s.get("used", False)
        return op

    def _panels(self, nb: int) -> LapackPanels:
        s = self._state
        return LapackPanels(s["a"], s["tau"], nb, s["nk"])

    def matrix(self) -> Any:
        """Q (Qᴴ, Q[:, :k], …) formed as ``?orgqr`` from ``a`` (no V), until V is built."""
        if "op" in self._state:
            return super().matrix()  # type: ignore[misc]
        a, k = self._state["a"], self._state["tau"].shape[0]
        ncols = a.shape[0] if self._mode_forward == "square" else k  # type: ignore[attr-defined]
        Q = form_panels(self._panels(form_panel_width(k)), ncols, np)
        if self._transposed:
            Q = mH(Q, np)
        return np.conjugate(Q) if self._conjugated else Q

    def __matmul__(self, h: Any) -> Any:
        """The first product with a NumPy h of ``a``'s dtype, (K,) or (K, B): ``?ormqr``'s
        panels on ``a`` (no V); anything else, or the sequential kernel's shapes, as CWY."""
        s = self._state
        a = s["a"]
        m, k = a.shape[0], s["tau"].shape[0]
        if not (
            "op" not in s
            and not s.get("used")
            and type(h) is np.ndarray
            and h.dtype == a.dtype
            and h.ndim in (1, 2)
            and h.shape[0] == self._n_rows_cols[1]
        ):
            return super().__matmul__(h)  # type: ignore[misc]
        B = 1 if h.ndim == 1 else h.shape[1]
        square = self._mode_forward == "square"  # type: ignore[attr-defined]
        real = a.dtype.kind != "c"
        if square and real and m <= SEQUENTIAL_MAX_M and sequential_is_faster(m, k, B, a.dtype):
            return super().__matmul__(h)  # type: ignore[misc]
        s["used"] = True
        x = h[:, None] if h.ndim == 1 else h
        if self._conjugated:  # conj(A) h = conj(A conj(h))
            x = np.conjugate(x)
        y = apply_panels(self._panels(PANEL), x, np, self._transposed, self._mode)
        if self._conjugated:
            y = np.conjugate(y, out=y) if y.flags.writeable else np.conjugate(y)
        return y[:, 0] if h.ndim == 1 else y


class LapackColumns(_InPlacePanels, LazyLapack, CWY):
    """Q = H(1)…H(k) (m × m) of one column-major NumPy ``a``, read in place."""


class LapackColumnsThin(_InPlacePanels, LazyLapack, TCWY):
    """Q[:, :k] (m × k) of one column-major NumPy ``a``, read in place."""

    _public_name = "TCWY"


def lapack_columns(
    a: Any, tau: Any, thin: bool, xp: Any, build: Callable[[Any, Any], tuple[Any, Any]]
) -> tuple[CWY, float] | None:
    """The in-place operator for one column-major NumPy ``a`` (m, n), m > ``SMALL_N``, of
    float32/64 or complex64/128 and τ (k,), k ≥ 1, of the same dtype, after one read-only
    Numba pass has checked it (NaN/Inf below the diagonal raise as ``from_lapack`` does),
    with the pass's largest mismatch of τ for the caller's check; ``build(a, τ)`` gives
    (V, the diagonal of S or None) when V is needed. None for anything else."""
    if type(a) is not np.ndarray or type(tau) is not np.ndarray or a.ndim != 2:
        return None
    m, k = a.shape[0], tau.shape[0]
    if (
        not a.flags.f_contiguous
        or a.dtype.char not in "fdFD"
        or tau.dtype != a.dtype
        or m <= SMALL_N
        or k == 0
        or not aac.is_numpy_namespace(xp)
    ):
        return None
    nk = numba_enabled()
    if nk is None:
        return None
    cx = a.dtype.kind == "c"
    at = a.T.view(a.real.dtype)  # (n, m·f): column i of a as reals, C-contiguous
    t = np.asarray(tau, np.complex128)
    bad, nonfinite = nk.lapack_check_columns(at, t, 2 if cx else 1, cx)
    if nonfinite:
        raise ValueError("a (below the diagonal) contains NaN or Inf")
    state = {"a": a, "tau": tau, "xp": xp, "build": build, "nk": nk}
    return (LapackColumnsThin if thin else LapackColumns)(state), bad
