"""Householder reflections applied one at a time: the sequential path of the CWY operator.

H(v) = I − 2 v vᴴ / ‖v‖² for v ≠ 0 and H(0) = I. ``householder_apply`` runs L sequential steps
(4·N·L·B flops): the Numba kernel on NumPy / plain CPU torch float32/float64, else the Array API
loop through the autodiff switch. ``sequential_is_faster`` is the rule by which the operator's
first product takes this path instead of building the compact WY factors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._agnostic.reflections import householder_apply_vjp as _householder_apply_vjp
from .._autodiff import call, route
from .._interop.dlpack import from_numpy, plain_cpu_tensor, plain_cpu_views, to_numpy
from .._kernels import numba_enabled, numba_for, numba_for_torch
from .._lib.checks import as_matrix_operand, broadcast_batch, check_reflectors, finite_reflectors
from .._lib.mixed import widen
from .._lib.namespace import is_half, resolve
from .._lib.tuning import SEQUENTIAL_MAX_B, SEQUENTIAL_MAX_LB_PRECOMPUTED, SEQUENTIAL_MAX_N

__all__ = [
    "SEQUENTIAL_MAX_B",
    "SEQUENTIAL_MAX_LB_PRECOMPUTED",
    "SEQUENTIAL_MAX_N",
    "apply_sequential",
    "householder_apply",
    "householder_apply_vjp",
    "run_sequential",
    "sequential_is_faster",
]


#: The Numba kernels' dtypes. Complex input runs the Array API loop instead (an order of
#: magnitude slower than the real kernel at tiny shapes: ``benchmarks/results/tuning.md``).
#: Complex kernel signatures would close that gap for
#: tiny products, but need conjugating variants of every loop of ``numba_loops`` and double the
#: kernels' cold compile; sequential complex products stay the reference path, and the
#: CWY operator (GEMMs, any dtype) is the fast complex route.
_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def householder_apply(V: Any, h: Any, *, xp: Any = None) -> Any:
    """Apply H(v₁)…H(v_L) to ``h`` one reflection at a time.

    Parameters
    ----------
    V : array, shape (..., N, L)
        Reflection vectors as columns (L ≤ N); a zero column is the identity reflector.
    h : array, shape (N,) or (..., N, B)
        Right operand, following ``matmul``'s rules (batch axes broadcast with V's).
    xp : namespace, optional
        Array namespace to use instead of the one inferred from the inputs.

    Returns
    -------
    array, shape (..., N) or (..., N, B)
        ``H(v₁)(H(v₂)(…H(v_L) h))``, in the namespace, device and dtype of the inputs.

    Notes
    -----
    4·N·L·B flops in L sequential steps (Mhammedi et al., ICML 2017, Algorithm 1, forward). Same
    result as ``cwy(V) @ h``; cheaper than building CWY when L·B is small. NumPy float32/float64
    inputs run the Numba kernel (:func:`householderla._kernels.numba.hprod`: τ = 2/‖v‖² from the
    unnormalised columns, agreeing with the Array API loop to a few ulps per reflection) when numba
    is installed and ``HL_DISABLE_NUMBA`` is unset.

    Complex V or h (complex64/complex128): H(v) = I − 2vvᴴ/‖v‖², Hermitian and unitary, by the
    Array API loop (the Numba kernels are real; ``cwy(V) @ h`` is the faster complex route
    beyond tiny shapes).

    Examples
    --------
    >>> import numpy as np, householderla as hl
    >>> V = np.array([[1.0], [1.0]])          # reflect across the line x = -y
    >>> hl.householder_apply(V, np.array([1.0, 0.0]))
    array([ 0., -1.])
    """
    if xp is None and type(V) is np.ndarray and type(h) is np.ndarray:
        # the common NumPy call goes straight to the kernel (it checks dtypes and NaN itself)
        nk = numba_enabled()
        if nk is not None:
            y = nk.hprod_vector(V, h)  # one vector of V's dtype: no further checks needed
            if y is not None:
                return y
            if V.dtype == h.dtype and V.dtype in _KERNEL_DTYPES:
                as_matrix_operand(h, check_reflectors(V)[0])
                return nk.hprod(V, h)
    elif xp is None:
        views = plain_cpu_views(V, h)  # eager CPU torch without autograd: the same kernel
        nk = numba_enabled() if views is not None else None
        y = nk.hprod_vector(*views) if nk is not None else None
        if y is not None:
            return plain_cpu_tensor(y)
    xp, _, dtype, (V, h) = resolve([("V", V), ("h", h)], xp, complex_ok=True, half=True)
    N, _ = check_reflectors(V)
    hm, vector = as_matrix_operand(h, N)
    if is_half(xp, dtype):  # in float32 (exact copies), rounded once
        return xp.astype(householder_apply(widen(V, xp), widen(h, xp), xp=xp), dtype)
    nk = numba_for(xp, V, h)
    if nk is not None:
        return nk.hprod(V, h)
    r = route(xp, V, hm)
    nk = numba_for_torch(V, h) if r == "plain" else None
    if nk is not None:  # CPU tensors: one kernel call instead of ~3 torch operations per reflection
        return from_numpy(nk.hprod(to_numpy(V, name="V"), to_numpy(h, name="h")), like=V)
    V = finite_reflectors(V, xp)
    y = call(r, "householder_apply", xp, V, hm)
    batch = broadcast_batch([("V", V.shape[:-2]), ("h", hm.shape[:-2])])
    if tuple(y.shape[:-2]) != batch:  # L = 0: no reflection touched h, so V's batch is added
        y = xp.broadcast_to(y, (*batch, *y.shape[-2:]))
    return y[..., 0] if vector else y


def householder_apply_vjp(V: Any, h: Any, g: Any, xp: Any) -> tuple[Any, Any]:
    """Backward of :func:`householder_apply` for resolved inputs (exported as
    ``householderla.vjp.householder_apply``): the Numba kernel ``hgrad`` on NumPy
    float32/float64 when available, else the Array API sweep
    (:func:`householderla._agnostic.reflections.householder_apply_vjp`)."""
    nk = numba_for(xp, V, h, g)
    if nk is not None:
        check_reflectors(V)
        return nk.hgrad(V, g, h=h)
    return _householder_apply_vjp(V, h, g, xp)


def sequential_is_faster(
    N: int, L: int, B: int, dtype: Any = None, *, precomputed: bool = False
) -> bool:
    """Whether the Numba sequential kernel beats CWY for ``Q @ h`` with h of shape (N, B).

    ``precomputed=False`` compares with ``cwy(V) @ h`` on an operator whose factors U, T are
    not built yet (N·L² + L³/3 flops of setup); ``precomputed=True`` with the bare apply of
    a built operator (4·N·L·B + L²·B). False whenever the kernels are unavailable (no numba,
    or ``HL_DISABLE_NUMBA`` set). ``dtype`` is accepted for the CWY hook's signature; the
    measured crossover is the same for float32 and float64 within the noise. The constants
    are ``SEQUENTIAL_MAX_N``, ``SEQUENTIAL_MAX_B`` and ``SEQUENTIAL_MAX_LB_PRECOMPUTED`` of
    :mod:`householderla._lib.tuning` (figures in ``benchmarks/results/tuning.md``).

    Examples
    --------
    >>> import numpy as np
    >>> from householderla.householder import sequential_is_faster
    >>> sequential_is_faster(128, 16, 1, np.float64, precomputed=True)
    False
    """
    if numba_enabled() is None:
        return False
    if precomputed:
        return L * B <= SEQUENTIAL_MAX_LB_PRECOMPUTED
    return N <= SEQUENTIAL_MAX_N and B <= SEQUENTIAL_MAX_B


def apply_sequential(
    V: Any, h: Any, *, transpose: bool = False, trapezoidal: bool = False, xp: Any = None
) -> Any:
    """Q h (or Qᵀ h with ``transpose``) for Q = H(v₁)…H(v_L), one reflection at a time.

    What the CWY operator's ``@`` calls when :func:`sequential_is_faster` says so: the Numba
    kernel for NumPy float32/float64 inputs (no factors are built), otherwise
    :func:`householder_apply` (with the columns reversed for Qᵀ = H(v_L)…H(v₁)). Shapes as in
    :func:`householder_apply`; 4·N·L·B flops, (4N − L + 2)·L·B for lower-trapezoidal V
    (``trapezoidal``, which the caller has verified: the kernel then skips the zeros).
    """
    xp, _, _, (V, h) = resolve([("V", V), ("h", h)], xp, complex_ok=True)
    N, _ = check_reflectors(V)
    as_matrix_operand(h, N)
    return run_sequential(V, h, transpose, trapezoidal, xp)


def run_sequential(V: Any, h: Any, transpose: bool, trapezoidal: bool, xp: Any) -> Any:
    """:func:`apply_sequential` on inputs the caller has validated (the planner's
    ``sequential`` path of the CWY operator): no checks repeated."""
    nk = numba_for(xp, V, h)
    if nk is not None:
        return nk.hprod(V, h, transpose=transpose, trapezoidal=trapezoidal)
    nk = numba_for_torch(V, h) if route(xp, V, h) == "plain" else None
    if nk is not None:
        Vn, hn = to_numpy(V, name="V"), to_numpy(h, name="h")
        return from_numpy(nk.hprod(Vn, hn, transpose=transpose, trapezoidal=trapezoidal), like=V)
    return householder_apply(xp.flip(V, axis=-1) if transpose else V, h, xp=xp)
