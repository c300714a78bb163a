"""The operator of a stack of small NumPy ``(a, τ)``: LAPACK's reflectors read in place.

``from_lapack(a, tau)`` for a stack of P ≥ ``BATCH_MIN`` real NumPy ``a`` (P…, m, k), m ≤ 64,
k = n: its ``.matrix()`` and its first ``@`` run the batched Numba kernels on ``a`` itself,
with the unit diagonal implied and τ = 0 columns the identity, as ``?orgqr`` / ``?ormqr``
read them (:func:`householderla._kernels.numba_checks.unit_reflectors`). No V is built: for
8192 stacked 16 × 16 that is 16 MB written, which, freed together with the 16 MB result,
glibc returns to the system and the next call faults in again (≈ 1,000 page faults, 3–4 ms
a call in a plain loop, measured). V = tril(a, −1) + I (τ ≠ 0 columns) and the CWY factors
are built, once, when anything else needs them (``op.V``, ``op.U``, later products,
transposed ``.matrix()``, autodiff-free composition...): the operator is then
:class:`~householderla.cwy.CWY`'s in every respect.

As :func:`householderla.cwy` reads V, the operator reads ``a`` when it is used, not when it
is built: write into ``a`` only after you are done with the operator.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._kernels import numba_for
from ._lib.namespace import device_of
from .cwy import CWY
from .householder import sequential_is_faster

__all__ = ["LapackStack", "LazyLapack", "lapack_stack"]


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

    def _build(self) -> CWY:
        s = self._state
        a, tau = s["a"], s["tau"]
        V = np.empty(a.shape, a.dtype)
        s["nk"].lapack_unit_lower(
            a.reshape((-1, *a.shape[-2:])), tau.reshape((-1, tau.shape[-1])),
            V.reshape((-1, *a.shape[-2:])),
        )  # fmt: skip
        op = CWY(V, s["xp"], structure="trapezoidal", tau=tau)
        # the in-place product counts as the first one: later ones build and reuse U, T
        op._factors.sequential_used = s.get("used", False)
        return op

    # -- the in-place paths --------------------------------------------------------------
    def matrix(self) -> Any:
        """Q: the batched kernels on ``a`` (``?orgqr``'s flops); Qᵀ as CWY does."""
        if self._transposed:
            return super().matrix()
        s = self._state
        return s["nk"].hform(s["a"], tau=s["tau"])

    def __matmul__(self, h: Any) -> Any:
        """The first product with a NumPy h of ``a``'s dtype and batch (or one shared h):
        the reflections applied by the batched kernels on ``a``; anything else as CWY."""
        s = self._state
        a = s["a"]
        m = a.shape[-2]
        if (
            "op" not in s
            and not s.get("used")
            and type(h) is np.ndarray
            and h.dtype == a.dtype
            and 1 <= h.ndim
            and h.shape[0 if h.ndim == 1 else -2] == m
            and (h.ndim <= 2 or h.shape[:-2] == a.shape[:-2])
            and sequential_is_faster(m, a.shape[-1], 1 if h.ndim == 1 else h.shape[-1])
        ):
            s["used"] = True
            return s["nk"].hprod(a, h, tau=s["tau"], transpose=self._transposed)
        return super().__matmul__(h)


def _as_built(op: CWY, transposed: bool, conjugated: bool = False) -> CWY:
    return op._variant(transposed, conjugated) if transposed or conjugated else op


def lapack_stack(a: Any, tau: Any, xp: Any, small_m: int) -> tuple[LapackStack, float] | None:
    """The in-place operator for a NumPy stack (P ≥ ``BATCH_MIN``) of real ``(a, τ)`` with
    m ≤ ``small_m`` and k = n, C-contiguous, after one read-only Numba pass has checked it
    (NaN/Inf below the diagonal raise as ``from_lapack`` does), with the pass's largest
    mismatch of τ against 2/‖vᵢ‖² for the caller's check; None for anything else."""
    if type(a) is not np.ndarray or type(tau) is not np.ndarray or a.ndim < 3:
        return None
    nk = numba_for(xp, a, tau)
    m, n = a.shape[-2:]
    if (
        nk is None
        or a.dtype not in (np.float32, np.float64)
        or tau.dtype != a.dtype
        or not 0 < n == tau.shape[-1] <= m <= small_m
        or a.size // (m * n) < nk.BATCH_MIN
        or not a.flags.c_contiguous
    ):
        return None
    t2 = np.ascontiguousarray(tau.reshape((-1, n)))
    bad, nonfinite = nk.lapack_check(a.reshape((-1, m, n)), t2)
    if nonfinite:
        raise ValueError("a (below the diagonal) contains NaN or Inf")
    return LapackStack({"a": a, "tau": t2.reshape(tau.shape), "nk": nk, "xp": xp}), bad
