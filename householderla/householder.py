"""Householder reflections: sequential products and the constructive inverses.

H(v) = I − 2 v vᵀ / ‖v‖² for v ≠ 0 and H(0) = I (Zhang, Lei & Dhillon, ICML 2018 eq. 1). The
sequential path applies the reflections one at a time (4·N·L·B flops for L reflections on B
vectors): the reference implementation against which CWY is tested, and the fastest path for tiny
shapes.

The constructive inverses run Householder QR with a positive diagonal (Mhammedi et al., ICML 2017,
Algorithm 2; the proof of Likhosherstov et al., AISTATS 2021, Theorems 1 and 3, eq. 4–7): the k-th
reflector maps the current k-th column x to +‖x‖ e_k, computed without cancellation by Parlett's
formula v_k = −‖x_{k+1:}‖² / (x_k + ‖x‖) when x_k > 0. For Q ∈ O(N) the first N − 1 steps leave R =
diag(1, …, 1, ρ) with ρ = (−1)^m det Q, m the number of nonzero reflectors so far; the N-th
reflector is then 0 (ρ = +1) or −e_N (ρ = −1). So N vectors, one possibly zero, reach both
components of O(N), and the number of nonzero vectors has the parity of det Q.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._agnostic.reflections import householder_apply_vjp as _householder_apply_vjp
from ._agnostic.reflections import positive_qr_reflectors, unitary_qr_reflectors
from ._autodiff import call, route
from ._interop.dlpack import from_numpy, plain_cpu_tensor, plain_cpu_views, to_numpy
from ._kernels import numba_enabled, numba_for, numba_for_torch
from ._lib.checks import (
    as_matrix_operand,
    broadcast_batch,
    check_finite_norms,
    check_reflectors,
    finite_reflectors,
)
from ._lib.jit import jit_for
from ._lib.linalg import eye_like, pow2_normalise
from ._lib.mixed import widen
from ._lib.namespace import (
    accumulation_dtype_for,
    device_of,
    is_complex,
    is_half,
    real_dtype,
    resolve,
)

__all__ = [
    "apply_sequential",
    "householder_apply",
    "householder_apply_vjp",
    "householder_product",
    "householder_vectors",
    "sequential_is_faster",
    "tcwy_vectors",
]


#: The Numba kernels' dtypes. Complex input runs the Array API loop instead: a quick check
#: (2-core VM under load, best of 5) gave the complex loop 44 / 110 / 280 µs at (N, L, B) =
#: (16, 4, 1), (64, 16, 1), (128, 32, 4) against 2 / 3 / 19 µs for the real Numba kernel, and
#: ``cwy(V) @ h`` 60–80 µs at the first two. Complex kernel signatures would close that gap for
#: tiny products, but need conjugating variants of every loop of ``numba_loops`` and double the
#: kernels' cold compile (≈ 26 s); sequential complex products stay the reference path, and the
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
    if xp is None and type(V) is np.ndarray and type(h) is np.ndarray and V.dtype == h.dtype:
        # the common NumPy call goes straight to the kernel (it checks dtypes and NaN itself)
        nk = numba_enabled()
        if nk is not None:
            y = nk.hprod_vector(V, h)  # one vector: no further checks needed
            if y is not None:
                return y
            if V.dtype in _KERNEL_DTYPES:
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


#: Crossover of the Numba sequential kernel against CWY, from two full runs of
#: ``benchmarks/sequential.py`` (results/sequential{,-run1}.md) on the 2-core EPYC VM while other
#: jobs kept the load at 8–10: best-of-7 times, then the better of the two runs. Grid
#: N ∈ {32, 64, 128, 256, 512}, L ∈ {4, 16, 64, N}, B ∈ {1, 4, 16, 64}, float32 and float64
#: (144 cells). Re-run on a quiet machine before trusting the second decimal.
#:
#: * Against ``cwy(V) @ h`` with the factors still to build (N·L² + L³/3 flops and several
#:   BLAS calls, ≈ 70 µs fixed): sequential was faster in all 144 cells, median ratio 0.23
#:   (e.g. N=128, L=16, B=1: 16 µs vs 80 µs); each run alone had 1–2 cells where CWY was
#:   up to 1.67× faster (N=128, L=64, B=16; N=L=128, B=4 and 16, float64), contradicted by
#:   the other run. Caveat: the CWY times at L ≥ 64 include this VM's OpenBLAS stalls between
#:   back-to-back calls (12–50 ms, see benchmarks/README.md); on a quiet machine the flop
#:   model (4·N·L·B at ≈ 4 GFLOP/s against N·L² + 4·N·L·B at ≈ 30 GFLOP/s plus 70 µs)
#:   predicts CWY wins at large L·B, e.g. N = L = 512, B = 64: ≈ 5 ms vs the kernel's
#:   8.5 ms. Beyond the grid (N > 512 or B > 64) CWY is assumed to win.
#: * Against a built operator's ``Q @ h`` (two GEMMs and an L×L product): CWY was faster by
#:   more than 25% in 78 cells, sequential in 6, each with a stalled CWY time (0.5–44 ms,
#:   2–1000× the same shape in the other dtype or at a neighbouring L, B); at L·B ≤ 64,
#:   where argument resolution (~15 µs) dominates both, the median ratio is 1.15.
#:   Hence 0: with built factors, never sequential.
#: * Re-run after the other jobs ended (results/sequential.md, load 2.4 and falling): against
#:   a fresh operator sequential was faster in 142 of 144 cells; the two others are
#:   N = L = 512, B ∈ {4, 16}, float64, at 1.01–1.02× (a tie), so the rule stands.
#: * Re-run 2026-11-27 on the idle VM with the fused block pass of the kernel
#:   (results/sequential.md): sequential faster than a fresh operator in all 144 cells (median
#:   0.48, at most 0.86), slower than a built one in all 144 (median 2.8×); the rule picks the
#:   path more than 25% slower in 0 of 288 cells.
SEQUENTIAL_MAX_N = 512
SEQUENTIAL_MAX_B = 64
SEQUENTIAL_MAX_LB_PRECOMPUTED = 0


def sequential_is_faster(
    N: int, L: int, B: int, dtype: Any = None, *, precomputed: bool = False
) -> bool:
    """Whether the Numba sequential kernel beats CWY for ``Q @ h`` with h of shape (N, B).

    ``precomputed=False`` compares with ``cwy(V) @ h`` on an operator whose factors U, T are
    not built yet (N·L² + L³/3 flops of setup); ``precomputed=True`` with the bare apply of
    a built operator (4·N·L·B + L²·B). False whenever the kernels are unavailable (no numba,
    or ``HL_DISABLE_NUMBA`` set). ``dtype`` is accepted for the CWY hook's signature; the
    measured crossover is the same for float32 and float64 within the noise. The constants
    and the figures behind them are ``SEQUENTIAL_MAX_N``, ``SEQUENTIAL_MAX_B`` and
    ``SEQUENTIAL_MAX_LB_PRECOMPUTED`` in this module.

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
    nk = numba_for(xp, V, h)
    if nk is not None:
        return nk.hprod(V, h, transpose=transpose, trapezoidal=trapezoidal)
    nk = numba_for_torch(V, h) if route(xp, V, h) == "plain" else None
    if nk is not None:
        Vn, hn = to_numpy(V, name="V"), to_numpy(h, name="h")
        return from_numpy(nk.hprod(Vn, hn, transpose=transpose, trapezoidal=trapezoidal), like=V)
    return householder_apply(xp.flip(V, axis=-1) if transpose else V, h, xp=xp)


def householder_product(V: Any, *, xp: Any = None) -> Any:
    """Dense H(v₁)…H(v_L), shape (..., N, N), by sequential reflections (4·N²·L flops).

    The reference path; ``cwy(V).matrix()`` computes the same matrix with GEMMs.
    """
    xp, device, dtype, (V,) = resolve([("V", V)], xp, complex_ok=True, half=True)
    N, _ = check_reflectors(V)
    return householder_apply(V, eye_like(xp, N, dtype, device), xp=xp)


def householder_vectors(Q: Any, *, return_phases: bool = False, xp: Any = None) -> Any:
    """Constructive inverse of CWY: reflection vectors V with ``cwy(V).matrix() == Q``.

    Parameters
    ----------
    Q : array, shape (..., N, N)
        Orthogonal matrices, either determinant; or unitary (complex) matrices, which need
        ``return_phases=True``.
    return_phases : bool, default False
        Also return phases θ with ``cwy(V, theta=theta).matrix() == Q``. Required for complex Q:
        a product of Hermitian reflections has determinant ±1, so a unitary Q is H(v₁)…H(v_N)
        diag(e^{iθ}) (Mhammedi et al., ICML 2017, §4.3, Corollary 1); complex Q without it raises
        ``ValueError``. For real Q, θ = 0.

    Returns
    -------
    V : array, shape (..., N, N)
        Column k is zero above row k (lower trapezoidal, as in Mhammedi et al., ICML 2017 eq. 9).
        Real Q: the last column is 0 or −e_N, whichever makes (−1)^(number of nonzero columns) =
        det Q, so V ↦ cwy(V) reaches all of O(N) (Likhosherstov et al., AISTATS 2021, Theorem 1
        with H(0) = I). Complex Q: the last column is 0 (N − 1 reflectors and N phases).
    theta : array, shape (..., N), only with ``return_phases=True``
        Real, Q's real dtype: θ_k = arg of the k-th diagonal entry of R in Householder QR with
        Hermitian reflections.

    Notes
    -----
    Householder QR with positive diagonal (Mhammedi et al., ICML 2017, Algorithm 2), 4N³/3 flops,
    computed in float64 (complex128) for float32 (complex64) inputs on CPU backends. For a
    non-orthogonal full-rank Q the result parametrises the orthogonal (unitary) factor of Q = QR
    with diag(R) > 0.

    Examples
    --------
    >>> import numpy as np, householderla as hl
    >>> Q = np.linalg.qr(np.random.default_rng(0).standard_normal((4, 4)))[0]
    >>> bool(np.allclose(hl.cwy(hl.householder_vectors(Q)).matrix(), Q))
    True
    >>> from scipy.stats import unitary_group
    >>> U = unitary_group.rvs(4, random_state=0)
    >>> V, theta = hl.householder_vectors(U, return_phases=True)
    >>> bool(np.allclose(hl.cwy(V, theta=theta).matrix(), U))
    True
    """
    xp, _, _, (Q,) = resolve([("Q", Q)], xp, complex_ok=True)
    if Q.ndim < 2 or Q.shape[-1] != Q.shape[-2]:
        raise ValueError(f"Q must have shape (..., N, N); got shape {tuple(Q.shape)}")
    return _inverse(Q, xp, "Q", return_phases)


def tcwy_vectors(Omega: Any, *, return_phases: bool = False, xp: Any = None) -> Any:
    """Constructive inverse of T-CWY: V with ``tcwy(V).matrix() == Omega``.

    Parameters
    ----------
    Omega : array, shape (..., N, M), M ≤ N
        Matrices with orthonormal columns (points of the Stiefel manifold St(N, M), real or
        complex; complex input needs ``return_phases=True``).
    return_phases : bool, default False
        Also return phases θ (..., M) with ``tcwy(V, theta=theta).matrix() == Omega``; required
        for complex Omega (see :func:`householder_vectors`). For real Omega, θ = 0.

    Returns
    -------
    V : array, shape (..., N, M)
        Lower-trapezoidal reflection vectors (Likhosherstov et al., AISTATS 2021, Theorem 3,
        constructive proof).
    theta : array, shape (..., M), only with ``return_phases=True``

    Notes
    -----
    Householder QR with positive diagonal, 2·M²(N − M/3) flops. For a full-rank
    non-orthonormal input the result parametrises its Q factor (the QR retraction point).
    """
    xp, _, _, (Omega,) = resolve([("Omega", Omega)], xp, complex_ok=True)
    if Omega.ndim < 2 or Omega.shape[-1] > Omega.shape[-2]:
        raise ValueError(
            f"Omega must have shape (..., N, M) with M <= N; got shape {tuple(Omega.shape)}"
        )
    return _inverse(Omega, xp, "Omega", return_phases)


def _inverse(A: Any, xp: Any, name: str, return_phases: bool) -> Any:
    if not isinstance(return_phases, bool):
        raise TypeError(f"return_phases must be True or False; got {return_phases!r}")
    cplx = is_complex(A.dtype)
    if cplx and not return_phases:
        raise ValueError(
            f"{name} is complex: a unitary matrix is a product of Hermitian reflections times "
            "a diagonal of phases; use V, theta = householder_vectors(Q, return_phases=True) "
            "(tcwy_vectors likewise) and cwy(V, theta=theta)"
        )
    rdtype = real_dtype(xp, A.dtype)
    if A.shape[-1] == 0:
        theta = xp.zeros(A.shape[:-2] + (0,), dtype=rdtype, device=device_of(A))
        return (A, theta) if return_phases else A
    check_finite_norms(xp.max(xp.abs(A), axis=-2, keepdims=True), xp, name)
    acc = accumulation_dtype_for(xp, A)
    Aa = A if A.dtype == acc else xp.astype(A, acc)
    # the Q factor of A·D is A's for positive diagonal D: each column scaled exactly to
    # max ∈ [1, 2) (subnormal and huge columns alike), the reflectors then see no underflow
    Aa = pow2_normalise(Aa, xp, axis=-2)[0]
    if cplx:
        V, theta = jit_for(xp, unitary_qr_reflectors, ())(Aa)
        theta = theta if theta.dtype == rdtype else xp.astype(theta, rdtype)
    else:
        V = jit_for(xp, positive_qr_reflectors, ())(Aa)
        theta = xp.zeros(A.shape[:-2] + (A.shape[-1],), dtype=rdtype, device=device_of(A))
    V = V if V.dtype == A.dtype else xp.astype(V, A.dtype)
    return (V, theta) if return_phases else V
