"""LAPACK's compact Householder reflectors ``(a, τ)`` (``?geqrf``) as operators.

``from_lapack(a, tau)`` is Q = H(1)…H(k), H(i) = I − τᵢ vᵢ vᵢᵀ, read from ``a`` exactly as
``?orgqr`` / ``?ormqr`` read it (LAPACK Users' Guide, Anderson et al., SIAM 1999): the unit
lower trapezoid of ``a`` below the diagonal, an implicit 1 on it, τᵢ = 0 for H(i) = I. The
result is this library's CWY operator (or T-CWY for the thin Q), so ``op @ C``, ``op.T @ C``,
``C @ op``, ``.matrix()``, composition, batching and the VJPs are those of :func:`cwy`.
Complex (a, τ) from ``zgeqrf``/``cgeqrf`` (complex τ, unitary non-Hermitian H(i)) give the
unitary operator whose reflectors keep LAPACK's eigenvalues λᵢ = 1 − τᵢ‖vᵢ‖²
(:mod:`householderla._agnostic.lapack`, ``docs/theory/complex.rst``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import array_api_compat as aac
import numpy as np

from ._agnostic.lapack import lapack_reflectors, normalized_sdiag, sq_norms, tau_mismatch
from ._agnostic.lapack_panels import (
    PANEL,
    LapackPanels,
    apply_panels,
    form_panel_width,
    form_panels,
)
from ._interop.dlpack import numpy_dtype, plain_cpu_tensor, plain_cpu_views
from ._kernels import numba_enabled, numba_for
from ._lib.checks import check_finite
from ._lib.device import device_kind
from ._lib.modes import is_deterministic
from ._lib.namespace import device_of, is_complex, mH, resolve
from ._lib.tracing import is_eager
from ._lib.tuning import LAPACK_SEQUENTIAL_MAX_M as SEQUENTIAL_MAX_M
from ._lib.tuning import LAPACK_SMALL_M as SMALL_M
from ._operator.factors import SMALL_N
from .cwy import CWY, TCWY
from .householder import sequential_is_faster

__all__ = ["from_lapack"]

# pickles written before the in-place operators moved here name ``householderla._lapack_stack``
sys.modules.setdefault(f"{__package__}._lapack_stack", sys.modules[__name__])


# -- a stack of small NumPy (a, τ): the batched Numba kernels read ``a`` in place -----------
#
# For a stack of P ≥ ``BATCH_MIN`` real NumPy ``a`` (P…, m, k), m ≤ ``SMALL_M``, k = n, the
# ``.matrix()`` and first ``@`` run the batched Numba kernels on ``a`` itself, with the unit
# diagonal implied and τ = 0 columns the identity, as ``?orgqr`` / ``?ormqr`` read them. No V is
# built (a fresh V, freed with its result, is page-faulted in again on every call). V =
# tril(a, −1) + I and the CWY factors are built once, when anything else needs them; the
# operator is then :class:`~householderla.cwy.CWY`'s in every respect.


class LazyLapack:
    """The part of an operator over LAPACK's ``(a, τ)`` that reads ``a`` in place until
    anything needs V: ``_build()`` makes the :class:`~householderla.cwy.CWY` (or TCWY)
    operator once, and V, the factors and everything but the in-place paths of the
    subclasses are that operator's. Variants (``.T``, ``.H``, ``.conj()``) share one state:
    ``a``, ``tau``, the operator once built, and whether the one in-place first product
    happened. Mixed in before :class:`~householderla.cwy.CWY` or TCWY."""

    _public_name = "CWY"

    def __init__(self, state: dict[str, Any], transposed: bool = False, conjugated: bool = False):
        self._state = state
        self._xp = state["xp"]  # (what CompactWYOperator's methods read besides V)
        self._transposed = transposed
        self._conjugated = conjugated

    def _build(self) -> Any:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def _built(self) -> Any:
        s = self._state
        if "op" not in s:
            s["op"] = self._build()
        return s["op"]

    @property
    def _V(self) -> Any:
        return self._built()._V

    @property
    def _factors(self) -> Any:
        return self._built()._factors

    # -- metadata without V --------------------------------------------------------------
    @property
    def _n_rows_cols(self) -> tuple[int, int]:
        m, k = self._state["a"].shape[-2], self._state["tau"].shape[-1]
        full = (m, m) if self._mode_forward == "square" else (m, k)  # type: ignore[attr-defined]
        return (full[1], full[0]) if self._transposed else full

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._state["a"].shape[:-2]) + self._n_rows_cols

    @property
    def dtype(self) -> Any:
        return self._state["a"].dtype

    @property
    def device(self) -> Any:
        return device_of(self._state["a"])

    def _variant(self, transposed: bool, conjugated: bool) -> Any:
        return type(self)(self._state, transposed, conjugated)

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled (and copied) as the operator it stands for
        return (_as_built, (self._built(), self._transposed, self._conjugated))

    def __repr__(self) -> str:
        return super().__repr__().replace(type(self).__name__, self._public_name, 1)  # type: ignore[misc]


class LapackStack(LazyLapack, CWY):
    """Q = H(1)…H(k) of a NumPy stack ``a`` (..., m, k), τ (..., k), checked by the caller;
    state ``nk``: the Numba entry module."""

    def _arrays(self) -> tuple[Any, Any]:
        """(a, τ) as the kernels read them: NumPy, the views of a torch stack's tensors
        (each matrix of ``a`` row-major, or column-major as ``torch.geqrf`` lays it out,
        which :func:`~householderla._kernels.numba.hform` reads in place)."""
        s = self._state
        return s.get("views", (s["a"], s["tau"]))

    def _row_major(self) -> tuple[Any, Any]:
        """:meth:`_arrays` with ``a`` in C order (copied once, where it is column-major), for
        the kernels that read only that order."""
        s = self._state
        a, tau = self._arrays()
        if "a_rows" not in s:
            s["a_rows"] = np.ascontiguousarray(a)
        return s["a_rows"], tau

    def _out(self, y: Any) -> Any:
        """A kernel's NumPy result in the caller's type (a CPU tensor sharing its memory)."""
        return plain_cpu_tensor(y) if "views" in self._state else y

    def _build(self) -> CWY:
        s = self._state
        a, tau = self._row_major()
        V = np.empty(a.shape, a.dtype)
        s["nk"].lapack_unit_lower(
            a.reshape((-1, *a.shape[-2:])), tau.reshape((-1, tau.shape[-1])),
            V.reshape((-1, *a.shape[-2:])),
        )  # fmt: skip
        op = CWY(self._out(V), s["xp"], structure="trapezoidal", tau=s["tau"])
        # the in-place product counts as the first one: later ones build and reuse U, T
        op._factors.sequential_used = s.get("used", False)
        return op

    # -- the in-place paths --------------------------------------------------------------
    def matrix(self) -> Any:
        """Q: the batched kernels on ``a`` (``?orgqr``'s flops); Qᵀ as CWY does."""
        if self._transposed:
            return super().matrix()
        a, tau = self._arrays()
        return self._out(self._state["nk"].hform(a, tau=tau))

    def __matmul__(self, h: Any) -> Any:
        """The first product with a NumPy h of ``a``'s dtype and batch (or one shared h):
        the reflections applied by the batched kernels on ``a``; anything else as CWY."""
        s = self._state
        a, tau = self._arrays()
        m, x = a.shape[-2], h
        if "views" in s:  # a torch stack: a plain CPU tensor h of a's dtype, by its view
            ok = type(h) is type(s["a"]) and h.dtype == s["a"].dtype
            views = plain_cpu_views(h) if ok else None
            x = None if views is None else views[0]
        if (
            "op" not in s
            and not s.get("used")
            and not is_deterministic()
            and type(x) is np.ndarray
            and x.dtype == a.dtype
            and 1 <= x.ndim
            and x.shape[0 if x.ndim == 1 else -2] == m
            and (x.ndim <= 2 or x.shape[:-2] == a.shape[:-2])
            and sequential_is_faster(m, a.shape[-1], 1 if x.ndim == 1 else x.shape[-1])
        ):
            s["used"] = True
            a, tau = self._row_major()
            return self._out(s["nk"].hprod(a, x, tau=tau, transpose=self._transposed))
        return super().__matmul__(h)


def _as_built(op: CWY, transposed: bool, conjugated: bool = False) -> CWY:
    return op._variant(transposed, conjugated) if transposed or conjugated else op


def lapack_stack(a: Any, tau: Any, xp: Any, small_m: int) -> tuple[LapackStack, float] | None:
    """The in-place operator for a NumPy stack (P ≥ ``BATCH_MIN``) of real ``(a, τ)`` with
    m ≤ ``small_m`` and k = n, C-contiguous or each matrix column-major (``torch.geqrf``'s
    layout: read in place by ``.matrix()``, copied to C order when anything else needs it;
    any other layout is copied to C order first), after τ's NaN/Inf and then one read-only
    Numba pass have checked it (NaN/Inf below the diagonal raise as ``from_lapack`` does;
    τ's first, as there), with the pass's largest
    mismatch of τ against 2/‖vᵢ‖² for the caller's check; None for anything else. A stack
    of plain CPU torch tensors is read the same way through its NumPy views, the results
    returned as tensors sharing their memory."""
    tensors = None
    if aac.is_torch_namespace(xp) and getattr(a, "ndim", 0) >= 3 and device_kind(a) == "cpu":
        views = plain_cpu_views(a, tau)  # (None for grad, subclasses, other devices, tracing)
        if views is None:
            return None
        tensors, (a, tau) = (a, tau), views
    if type(a) is not np.ndarray or type(tau) is not np.ndarray or a.ndim < 3:
        return None
    nk = numba_for(np, a, tau) if tensors is not None else numba_for(xp, a, tau)
    m, n = a.shape[-2:]
    if (
        nk is None
        or a.dtype not in (np.float32, np.float64)
        or tau.dtype != a.dtype
        or not 0 < n == tau.shape[-1] <= m <= small_m
        or a.size // (m * n) < nk.BATCH_MIN
    ):
        return None
    at = None if a.flags.c_contiguous else np.swapaxes(a, -1, -2)
    if at is None or not at.flags.c_contiguous:
        a, at = np.ascontiguousarray(a), None  # (a copy only for another layout)
    t2 = np.ascontiguousarray(tau.reshape((-1, n))).reshape(tau.shape)
    check_finite(t2, np, "tau")  # τ first, as from_lapack checks it (NumPy's pass on the view)
    if at is None:
        bad, nonfinite = nk.lapack_check(a.reshape((-1, m, n)), t2.reshape((-1, n)))
    else:  # column-major matrices, read in place
        bad, nonfinite = nk.lapack_check_transposed(at.reshape((-1, n, m)), t2.reshape((-1, n)))
    if nonfinite:
        raise ValueError("a (below the diagonal) contains NaN or Inf")
    state = {"a": a, "tau": t2, "nk": nk, "xp": xp}
    if tensors is not None:  # metadata and V as tensors; the kernels read the views
        state.update(a=tensors[0], tau=plain_cpu_tensor(t2), views=(a, t2))
    return LapackStack(state), bad


# -- one column-major NumPy (a, τ) (``?geqrf``'s order): LAPACK's panels read ``a`` in place --
#
# For such an ``a`` (m > ``SMALL_M`` rows, real or complex) the reflectors are checked in one
# read-only Numba pass and no V is built: ``.matrix()`` and the first ``@`` run LAPACK's panel
# algorithms on ``a`` (:class:`householderla._agnostic.lapack_panels.LapackPanels`, each panel
# copied into one reused buffer). V and the factors are built when anything else needs them.


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
        return LapackPanels(*s.get("views", (s["a"], s["tau"])), nb, s["nk"])

    def _out(self, y: Any) -> Any:
        """A NumPy result in the caller's type: a CPU tensor sharing its memory for torch."""
        return plain_cpu_tensor(y) if "views" in self._state else y

    def _panel_operand(self, h: Any) -> Any:
        """h as the panels read it — a NumPy array (K,) or (K, B) of ``a``'s dtype, a plain
        CPU tensor's view for a torch ``a`` — or None (then the general path takes h)."""
        s = self._state
        if "views" in s:
            if type(h) is not type(s["a"]) or h.dtype != s["a"].dtype:
                return None
            views = plain_cpu_views(h)
            h = None if views is None else views[0]
        tau = s.get("views", (None, s["tau"]))[1]  # (NumPy's dtype to compare with)
        ok = type(h) is np.ndarray and h.dtype == tau.dtype and h.ndim in (1, 2)
        return h if ok and h.shape[0] == self._n_rows_cols[1] else None

    def matrix(self) -> Any:
        """Q (Qᴴ, Q[:, :k], …) formed as ``?orgqr`` from ``a`` (no V), until V is built."""
        if "op" in self._state:
            return super().matrix()  # type: ignore[misc]
        a, k = self._state["a"], self._state["tau"].shape[0]
        ncols = a.shape[0] if self._mode_forward == "square" else k  # type: ignore[attr-defined]
        rows = None if is_complex(a.dtype) else a.shape[0]  # (the compiled real kernel)
        Q = form_panels(self._panels(form_panel_width(k, compiled_rows=rows)), ncols, np)
        if self._transposed:
            Q = mH(Q, np)
        return self._out(np.conjugate(Q) if self._conjugated else Q)

    def __matmul__(self, h: Any) -> Any:
        """The first product with a NumPy h of ``a``'s dtype, (K,) or (K, B): ``?ormqr``'s
        panels on ``a`` (no V); anything else, or the sequential kernel's shapes, as CWY."""
        s = self._state
        x = None if "op" in s or s.get("used") or is_deterministic() else self._panel_operand(h)
        if x is None:
            return super().__matmul__(h)  # type: ignore[misc]
        m, k, dt = s["a"].shape[0], s["tau"].shape[0], x.dtype
        B = 1 if x.ndim == 1 else x.shape[1]
        square = self._mode_forward == "square"  # type: ignore[attr-defined]
        real = dt.kind != "c"
        if square and real and m <= SEQUENTIAL_MAX_M and sequential_is_faster(m, k, B, dt):
            return super().__matmul__(h)  # type: ignore[misc]
        s["used"] = True
        vector, x = x.ndim == 1, (x[:, None] if x.ndim == 1 else x)
        if self._conjugated:  # conj(A) h = conj(A conj(h))
            x = np.conjugate(x)
        y = apply_panels(self._panels(PANEL), x, np, self._transposed, self._mode)
        if self._conjugated:
            y = np.conjugate(y, out=y) if y.flags.writeable else np.conjugate(y)
        return self._out(y[:, 0] if vector else y)


class LapackColumns(_InPlacePanels, LazyLapack, CWY):
    """Q = H(1)…H(k) (m × m) of one column-major NumPy ``a``, read in place."""


class LapackColumnsThin(_InPlacePanels, LazyLapack, TCWY):
    """Q[:, :k] (m × k) of one column-major NumPy ``a``, read in place."""

    _public_name = "TCWY"


def lapack_columns(
    a: Any, tau: Any, thin: bool, xp: Any, build: Callable[[Any, Any], tuple[Any, Any]]
) -> tuple[CWY, float] | None:
    """The in-place operator for one column-major NumPy ``a`` (m, n), m > ``SMALL_N`` (a
    row-major one is copied to that layout first), of
    float32/64 or complex64/128 and τ (k,), k ≥ 1, of the same dtype, after one read-only
    Numba pass has checked it (NaN/Inf below the diagonal raise as ``from_lapack`` does),
    with the pass's largest mismatch of τ for the caller's check; ``build(a, τ)`` gives
    (V, the diagonal of S or None) when V is needed. A plain CPU torch ``a`` in that layout
    (``torch.geqrf``'s) is read the same way through its NumPy view, the results returned
    as tensors sharing their memory. None for anything else."""
    tensors = None
    if aac.is_torch_namespace(xp) and getattr(a, "ndim", 0) == 2 and device_kind(a) == "cpu":
        views = plain_cpu_views(a, tau)  # (None for grad, subclasses, other devices, tracing)
        if views is None:
            return None
        tensors, (a, tau) = (a, tau), views
    elif not aac.is_numpy_namespace(xp):
        return None
    if type(a) is not np.ndarray or type(tau) is not np.ndarray or a.ndim != 2:
        return None
    m, k = a.shape[0], tau.shape[0]
    if a.flags.c_contiguous and not a.flags.f_contiguous and m > SMALL_N:
        a = np.asfortranarray(a)  # a row-major a: one copy (building V would copy it too)
    if (
        not a.flags.f_contiguous
        or a.dtype.char not in "fdFD"
        or tau.dtype != a.dtype
        or m <= SMALL_N
        or k == 0
    ):
        return None
    nk = numba_enabled()
    if nk is None:
        return None
    cx = a.dtype.kind == "c"
    at = a.T.view(a.real.dtype)  # (n, m·f): column i of a as reals, C-contiguous
    if not np.isfinite(tau).all():  # (before the pass, which reads a NaN τ as a bad column)
        raise ValueError("tau contains NaN or Inf")
    t = np.asarray(tau, np.complex128)
    bad, nonfinite = nk.lapack_check_columns(at, t, 2 if cx else 1, cx)
    if nonfinite:
        raise ValueError("a (below the diagonal) contains NaN or Inf")
    state = {"a": a, "tau": tau, "xp": xp, "build": build, "nk": nk}
    if tensors is not None:  # metadata and V from the tensors; the panels read the views
        views = (a, tau)
        build = partial(_tensor_V, build, views)
        state.update(a=tensors[0], tau=tensors[1], views=views, build=build)
    return (LapackColumnsThin if thin else LapackColumns)(state), bad


def _tensor_V(build: Callable[[Any, Any], tuple[Any, Any]], views: Any, *_: Any) -> tuple[Any, Any]:
    """``build`` of the NumPy ``views`` (a, τ) of the CPU tensors, its V and S's diagonal as
    tensors sharing their memory."""
    V, sdiag = build(*views)
    return plain_cpu_tensor(V), None if sdiag is None else plain_cpu_tensor(sdiag)


def _tau_error(bad: float, m: int, eps: float, complex_: bool) -> None:
    """Raise if τ is not LAPACK's for the reflectors in ``a`` (``bad``: the largest
    relative mismatch, :func:`~householderla._agnostic.lapack.tau_mismatch`)."""
    if bad <= 10 * m * eps:
        return
    if complex_:
        raise ValueError(
            "tau does not make H(i) = I - tau_i v_i v_i^H unitary for the reflectors "
            f"stored in a (| |1 - tau_i ||v_i||^2| - 1 | = {bad:.2g}; LAPACK's zlarfg "
            "gives 0 to rounding)"
        )
    raise ValueError(
        "tau is not LAPACK's 2/||v||^2 for the reflectors stored in a (relative "
        f"mismatch {bad:.2g}): H(i) = I - tau_i v_i v_i^T would not be orthogonal"
    )


def _eps_of(dtype: Any) -> float:
    """The unit roundoff of a floating dtype given by the caller (0 for anything else)."""
    try:
        return float(np.finfo(numpy_dtype(dtype)).eps)
    except (TypeError, ValueError):
        return 0.0


def _checked(bad: float, nonfinite: int, m: int, dtype: Any, eps: float | None) -> None:
    """Raise for what a Numba pass over real ``(a, τ)`` found: ``nonfinite`` NaN/Inf entries
    below the diagonal, or τ's largest mismatch ``bad`` beyond :func:`_tau_error`'s bound
    (``eps``: the unit roundoff τ is checked in, by default ``dtype``'s)."""
    if nonfinite:
        raise ValueError("a (below the diagonal) contains NaN or Inf")
    _tau_error(bad, m, float(np.finfo(dtype).eps) if eps is None else eps, False)


def _small_numpy_reflectors(a: Any, tau: Any, m: int, xp: Any, eps: float | None = None) -> Any:
    """V (..., m, k) of NumPy float32/float64 ``(a, τ)`` with m ≤ SMALL_M, built and checked
    (NaN/Inf below the diagonal, τ against 2/‖v‖²) by one Numba pass; None for other input
    or without Numba (the Array API path then does the same in several passes)."""
    if m > SMALL_M or type(a) is not np.ndarray or type(tau) is not np.ndarray:
        return None
    nk = numba_for(xp, a, tau)
    if nk is None or a.dtype not in (np.float32, np.float64) or tau.dtype != a.dtype:
        return None
    k = tau.shape[-1]
    V = np.empty((*a.shape[:-1], k), a.dtype)
    if V.size:
        a3 = np.ascontiguousarray(a.reshape((-1, *a.shape[-2:])))  # (geqrf's is F order)
        t2 = np.ascontiguousarray(tau.reshape((-1, k)))
        _checked(*nk.lapack_unit_lower(a3, t2, V.reshape((-1, m, k))), m, a.dtype, eps)
    return V


def _column_major_reflectors(a: Any, tau: Any, xp: Any, eps: float | None = None) -> Any:
    """V (m, k) of one column-major NumPy float32/float64 ``a`` (m, n) — LAPACK's layout, as
    ``scipy.linalg.lapack.?geqrf`` and ``scipy.linalg.qr(mode="raw")`` return it — built and
    checked (NaN/Inf below the diagonal, τ against 2/‖v‖²) by one Numba pass over the
    columns, in column-major order, in place of the NumPy passes (V's copy and masks, ‖vᵢ‖²,
    the finiteness and τ checks); None for other input or without Numba."""
    if type(a) is not np.ndarray or type(tau) is not np.ndarray or a.ndim != 2:
        return None
    if not a.flags.f_contiguous or a.dtype not in (np.float32, np.float64) or tau.dtype != a.dtype:
        return None
    nk = numba_for(xp, a, tau)
    if nk is None:
        return None
    m, k = a.shape[0], tau.shape[0]
    Vt = np.empty((k, m), a.dtype)
    if Vt.size:
        lower = nk.lapack_unit_lower_columns(a.T, np.ascontiguousarray(tau), Vt)
        _checked(*lower, m, a.dtype, eps)
    return Vt.T


def _reflectors_of_columns(a: Any, tau: Any, eps: float | None = None) -> tuple[Any, Any]:
    """(V, the diagonal of S or None) of a checked column-major NumPy ``(a, τ)``: what the
    in-place operator (``LapackColumns`` above) builds when V is needed."""
    if not is_complex(a.dtype):
        return _column_major_reflectors(a, tau, np, eps), None
    V = lapack_reflectors(a, tau)
    return V, normalized_sdiag(V, tau, sq_norms(V))


def from_lapack(a: Any, tau: Any, *, thin: bool = False, xp: Any = None) -> CWY | TCWY:
    """Q = H(1)…H(k) from LAPACK's ``(a, tau)`` as a CWY operator (T-CWY with ``thin=True``).

    Parameters
    ----------
    a : array, shape (..., m, n)
        The array ``?geqrf`` returns (``scipy.linalg.qr(A, mode="raw")[0][0]``,
        ``scipy.linalg.lapack.dgeqrf``, ``torch.geqrf``, ``jax.lax.linalg.geqrf``): vᵢ is
        eᵢ plus column i of ``a`` below the diagonal. The diagonal and the upper part (R) are
        not read. Complex ``a`` (``zgeqrf``/``cgeqrf``) gives a unitary operator.
    tau : array, shape (..., k), k ≤ min(m, n)
        The scalar factors; τᵢ = 0 makes H(i) the identity whatever column i holds. Every
        τᵢ ≠ 0 must be 2/‖vᵢ‖² (as ``?larfg`` makes it, to rounding): then H(i) is a
        reflection and Q orthogonal; eager values that are not (relative mismatch above
        10·m·eps) raise ``ValueError``. The value of τ enters only through that choice, so
        gradients flow to ``a`` and not to ``tau``. Complex τ (``zlarfg``'s) must make H(i)
        unitary, abs(1 − τᵢ‖vᵢ‖²) = 1 (same tolerance): H(i) then multiplies vᵢ by the unit
        number λᵢ = 1 − τᵢ‖vᵢ‖² and fixes vᵢ⊥; λᵢ is kept as a constant of the operator and
        gradients flow to ``a``.
    thin : bool, default False
        False: the square m × m operator Q (``?orgqr`` with m columns, ``?ormqr``). True: its
        first k columns, the m × k Stiefel operator Q[:, :k] (``?orgqr``'s thin Q when k = n).
    xp : namespace, optional
        Array namespace to use instead of the one inferred from ``a`` and ``tau``.

    Returns
    -------
    CWY or TCWY
        Shape (..., m, m) or (..., m, k), in the dtype and on the device of ``a``;
        ``op @ C`` equals ``?ormqr`` (side L, trans N), ``op.T @ C`` trans T, ``C @ op``
        side R, ``op.matrix()`` ``?orgqr``; complex: ``zunmqr`` (``op.H @ C`` trans C) and
        ``zungqr``.

    Notes
    -----
    V = tril(a[..., :k], −1) + I (τ = 0 columns zeroed) is lower trapezoidal. Where no
    autodiff follows (NumPy, torch without grad, array-api-strict, CuPy), a fresh operator's
    first product and ``.matrix()`` run LAPACK's own algorithms on τ itself
    (:mod:`householderla._agnostic.lapack_panels`): panels of nb = 32 reflectors (16 to
    form a small real Q, m·k ≤ 2¹⁶; more for k ≥ 1024), each with
    T_p = (I + diag(τ_p) striu(V_pᴴV_p))⁻¹ diag(τ_p) (``?larft``) and applied to its
    trapezoid rows only (``?larfb``), ≈ 2·m·k·nb + 4·m·k·B − 2·k²·B flops for ``@`` with B
    columns, not the m·k² + k³/3 of the whole T; ``.matrix()`` accumulates Q backwards from
    the identity as ``?orgqr`` does, at its ‖QᴴQ − I‖. Later products, JAX and autodiff use
    the CWY factors, built once and reused (4·m·k·B − k²·B per ``@``). H(vᵢ) = I −
    2vᵢvᵢᵀ/‖vᵢ‖² is LAPACK's H(i) whenever τᵢ = 2/‖vᵢ‖², and Schreiber & Van Loan, "A
    storage-efficient WY representation for products of Householder transformations", SIAM
    J. Sci. Stat. Comput. 1989, give the compact form used.

    Stacks of P ≥ 16 small real NumPy ``(a, τ)`` (m ≤ ``SMALL_M`` = 64, k = n, C order, or
    each matrix column-major as ``torch.geqrf`` returns them) are checked by one read-only
    Numba pass (NaN/Inf below the diagonal, τ against 2/‖vᵢ‖²), and their ``.matrix()`` and
    first product read ``a`` in place in the batched Numba kernels (column-major matrices:
    ``.matrix()`` only, the first product after a copy to C order)
    (:mod:`householderla._kernels.numba_lanes`, ``numba_columns``), with no V built (about
    three times faster than ``torch.linalg.householder_product``: ``benchmarks/small.py``).
    V and the CWY factors are built when anything else needs them, so such an operator, like
    :func:`cwy`'s with V, reads ``a`` when it is used: do not write into ``a`` while you use
    it. Other small stacks build V in the same one pass, and so does one column-major real
    ``a`` with m ≤ 64 (``?geqrf``'s own layout), reading each column as a contiguous row.

    One column-major NumPy ``a`` with m > 64 rows, real or complex, is checked by one
    read-only Numba pass and then read in place as well
    (``LapackColumns`` above): ``.matrix()`` and the first product run the
    panels on ``a`` itself, each panel copied into one buffer reused for all of them, and V
    is built when anything else needs it; a row-major ``a`` is copied to column-major order
    first. Plain CPU torch tensors (no grad, ``torch.geqrf``'s layout or row-major), one
    ``a`` or a stack, take these in-place paths through their NumPy views, the results
    returned as tensors (so do not write into ``a`` while you use the operator either). A
    fresh V freed with the result made glibc return the heap, so a plain loop faulted V's
    pages in again on every call (``benchmarks/results/tuning.md``).

    Examples
    --------
    >>> import numpy as np, scipy.linalg, householderla as hl
    >>> A = np.random.default_rng(0).standard_normal((5, 3))
    >>> (a, tau), R = scipy.linalg.qr(A, mode="raw")
    >>> Q = hl.from_lapack(a, tau, thin=True)
    >>> Q.shape
    (5, 3)
    >>> bool(np.allclose(Q @ R[:3], A))
    True
    >>> C = np.eye(5)
    >>> bool(np.allclose(hl.from_lapack(a, tau).T @ A, np.vstack([R[:3], np.zeros((2, 3))])))
    True
    """
    # τ is checked within the rounding of the less precise of the dtypes it and a came in
    # (τ of ``sgeqrf`` upcast to float64 is float32's τ)
    eps = max(_eps_of(getattr(a, "dtype", None)), _eps_of(getattr(tau, "dtype", None)))
    xp, _, _, (a, tau) = resolve([("a", a), ("tau", tau)], xp, complex_ok=True)
    eps = max(eps, float(xp.finfo(a.dtype).eps))
    if a.ndim < 2:
        raise ValueError(f"a must have shape (..., m, n); got shape {tuple(a.shape)}")
    m, n = a.shape[-2], a.shape[-1]
    if tau.ndim < 1 or tau.shape[-1] > min(m, n):
        raise ValueError(
            f"tau must have shape (..., k) with k <= min(m, n) = {min(m, n)}; got shape "
            f"{tuple(tau.shape)}"
        )
    if tuple(tau.shape[:-1]) != tuple(a.shape[:-2]):
        raise ValueError(
            f"tau's batch shape {tuple(tau.shape[:-1])} must equal a's {tuple(a.shape[:-2])}"
        )
    if not isinstance(thin, bool):
        raise TypeError(f"thin must be True or False; got {thin!r}")
    stack = None if thin else lapack_stack(a, tau, xp, SMALL_M)  # (τ's NaN/Inf checked first)
    if stack is not None:  # a stack of small NumPy (a, τ): read in place, checked in one pass
        _tau_error(stack[1], m, eps, False)
        return stack[0]
    cols = lapack_columns(a, tau, thin, xp, partial(_reflectors_of_columns, eps=eps))
    if cols is not None:  # one column-major NumPy a: read in place, checked in one pass
        _tau_error(cols[1], m, eps, is_complex(a.dtype))
        return cols[0]
    check_finite(tau, xp, "tau")
    V = _column_major_reflectors(a, tau, xp, eps)
    if V is None:
        V = _small_numpy_reflectors(a, tau, m, xp, eps)
    if V is not None:  # checked in the same pass; real, so no sdiag
        tau = tau.detach() if hasattr(tau, "detach") else tau
        return (TCWY if thin else CWY)(V, xp, structure="trapezoidal", tau=tau)
    V = lapack_reflectors(a, tau)
    ss = None  # ‖vᵢ‖², one pass: finiteness of V, the τ check and complex S's diagonal
    if is_eager(V) and V.shape[-1] and V.shape[-2]:
        Vc, tc = (V.detach(), tau.detach()) if hasattr(V, "detach") else (V, tau)  # a value check
        ss = sq_norms(Vc)
        if not bool(xp.all(xp.isfinite(ss))):  # NaN/Inf in V (or an overflowing ‖vᵢ‖²)
            check_finite(V, xp, "a (below the diagonal)")
        bad = float(xp.max(tau_mismatch(Vc, tc, ss)))
        _tau_error(bad, m, eps, is_complex(V.dtype))
        ss = ss if Vc is V else None  # (torch: S's diagonal from V itself, as before)
    else:
        check_finite(V, xp, "a (below the diagonal)")
    # complex τ: S = diag(1/(τ‖v‖²)) + striu(UᴴU), a constant diagonal (no cotangent)
    sdiag = normalized_sdiag(V, tau, ss) if is_complex(V.dtype) else None
    # V is lower trapezoidal and finite by construction: no second pass of cwy()'s checks
    # τ itself drives LAPACK's panel algorithms where no autodiff follows
    # (householderla._agnostic.lapack_panels); a constant, as sdiag
    tau = tau.detach() if hasattr(tau, "detach") else tau
    return (TCWY if thin else CWY)(V, xp, structure="trapezoidal", sdiag=sdiag, tau=tau)


def __dir__() -> list[str]:
    """Only the public names: the imports above stay attributes but are not listed."""
    return sorted(__all__)
