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

from functools import partial
from typing import Any

import numpy as np

from ._agnostic.lapack import lapack_reflectors, normalized_sdiag, sq_norms, tau_mismatch
from ._interop.dlpack import numpy_dtype
from ._kernels import numba_for
from ._lapack_columns import lapack_columns
from ._lapack_stack import lapack_stack
from ._lib.checks import check_finite
from ._lib.namespace import is_complex, resolve
from ._lib.tracing import is_eager
from .cwy import CWY, TCWY

__all__ = ["from_lapack"]

#: Largest m for which a stack of NumPy ``(a, τ)`` is read by one Numba pass
#: (:func:`householderla._kernels.numba_checks.lapack_unit_lower`): V in C order, its norms,
#: the τ check and the NaN check together (8192 × 16 × 16: 7.7 → 1.6 ms, one thread). Larger
#: ``a`` keeps its memory order for LAPACK's panels.
SMALL_M = 64


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
    columns, in column-major order; None for other input or without Numba. ``from_lapack``
    of 256 × 256 float64, one thread: 0.10 → 0.04 ms (in place of the NumPy passes: V's
    copy and masks, ‖vᵢ‖², the finiteness and τ checks); 1024 × 1024: 0.60 → 0.40 ms;
    1024 × 256: 0.148 → 0.139 ms (memory-bound: V no longer fits the caches)."""
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
    in-place operator (:mod:`householderla._lapack_columns`) builds when V is needed."""
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
    (:mod:`householderla._agnostic.lapack_panels`): panels of nb = 32 reflectors, each with
    T_p = (I + diag(τ_p) striu(V_pᴴV_p))⁻¹ diag(τ_p) (``?larft``) and applied to its
    trapezoid rows only (``?larfb``), ≈ 2·m·k·nb + 4·m·k·B − 2·k²·B flops for ``@`` with B
    columns, not the m·k² + k³/3 of the whole T; ``.matrix()`` accumulates Q backwards from
    the identity as ``?orgqr`` does, at its ‖QᴴQ − I‖. Later products, JAX and autodiff use
    the CWY factors, built once and reused (4·m·k·B − k²·B per ``@``). H(vᵢ) = I −
    2vᵢvᵢᵀ/‖vᵢ‖² is LAPACK's H(i) whenever τᵢ = 2/‖vᵢ‖², and Schreiber & Van Loan, "A
    storage-efficient WY representation for products of Householder transformations", SIAM
    J. Sci. Stat. Comput. 1989, give the compact form used.

    Stacks of P ≥ 16 small real NumPy ``(a, τ)`` (m ≤ ``SMALL_M`` = 64, k = n, C order) are
    checked by one read-only Numba pass (NaN/Inf below the diagonal, τ against 2/‖vᵢ‖²), and
    their ``.matrix()`` and first product read ``a`` in place in the batched Numba kernels
    (:mod:`householderla._kernels.numba_lanes`, ``numba_columns``), with no V built: 8192
    stacked 16 × 16 formed in ≈ 5 ms against ≈ 16.5 ms for
    ``torch.linalg.householder_product`` (one thread; ``benchmarks/small.py``). V and the
    CWY factors are built when anything else needs them, so such an operator, like
    :func:`cwy`'s with V, reads ``a`` when it is used: do not write into ``a`` while you use
    it. Other small stacks build V in the same one pass, and so does one column-major real
    ``a`` with m ≤ 64 (``?geqrf``'s own layout), reading each column as a contiguous row.

    One column-major NumPy ``a`` with m > 64 rows, real or complex, is checked by one
    read-only Numba pass and then read in place as well
    (:mod:`householderla._lapack_columns`): ``.matrix()`` and the first product run the
    panels on ``a`` itself, each panel copied into one buffer reused for all of them, and V
    is built when anything else needs it. A fresh V freed with the result made glibc return
    the heap, so a plain loop faulted V's pages in again on every call: the thin 1024 × 256
    float64 Q took 5.9–6.3 ms (1,375 page faults a call) and now 3.9–4.4 ms (``dorgqr``
    5.1–5.4 ms, one thread).

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
    check_finite(tau, xp, "tau")
    stack = None if thin else lapack_stack(a, tau, xp, SMALL_M)
    if stack is not None:  # a stack of small NumPy (a, τ): read in place, checked in one pass
        _tau_error(stack[1], m, eps, False)
        return stack[0]
    cols = lapack_columns(a, tau, thin, xp, partial(_reflectors_of_columns, eps=eps))
    if cols is not None:  # one column-major NumPy a: read in place, checked in one pass
        _tau_error(cols[1], m, eps, is_complex(a.dtype))
        return cols[0]
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
