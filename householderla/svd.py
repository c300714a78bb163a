"""SVD-Householder parametrization (svdRNN): W = Q_U Σ Q_Vᵀ with both factors in compact WY.

Zhang, Lei & Dhillon (ICML 2018), eq. 3 (square) and eq. 17 (rectangular), in our CWY order:

    W = Q_U · Σ · Q_Vᵀ ∈ ℝ^{m×n},   Q_U = H(u₁)…H(u_{k₁}) ∈ O(m),   Q_V = H(v₁)…H(v_{k₂}) ∈ O(n),

Σ the m×n matrix with diag(σ), σ ∈ ℝʳ, r = min(m, n), on its leading diagonal. The paper's
û_i = [0_{m−i}; u_i] (u_i ∈ ℝⁱ) in the order H_m(u_m)…H_{k}(u_k) is our column j = m − i + 1:
its lower-trapezoidal layout is the one :func:`householder_vectors` returns, and any
full-length columns are allowed here. Applying W never forms an m×m or n×n matrix:

    W x = Q_U E_r (σ ⊙ P_r (Q_Vᵀ x)),   E_r = [I_r; 0],  P_r = E_rᵀ,

where Q E_r is T-CWY (Likhosherstov et al., AISTATS 2021, Theorem 3) when the side has exactly r
reflectors, so the rectangular side costs 2·(N + r)·k·B instead of 4·N·k·B. The explicit VJPs
compose the CWY backward passes of :mod:`householderla._agnostic.compact_wy`; they are derived in
``docs/theory/svd.rst``.

Complex sides give W = Q_U diag(e^{iθ}) Σ Q_Vᴴ ∈ ℂ^{m×n} with real σ; the phases θ ∈ ℝʳ (the
``theta=`` argument) are what the unitary sides cannot absorb (``docs/theory/complex.rst``),
and :func:`svd_householder_params` returns them with ``return_phases=True``.

The constructive inverse :func:`svd_householder_params` finds parameters reproducing a given W by
one SVD and two Householder QRs (Zhang, Lei & Dhillon, ICML 2018, Theorems 2 and 4).
"""

from __future__ import annotations

from typing import Any

import array_api_compat as aac

from ._agnostic.phases import phase_factor
from ._agnostic.svd import pad, side_mode
from ._agnostic.svd_vjp import (
    bounded_sigma,
    bounded_sigma_vjp,
    resolve_params,
    svd_householder_apply_vjp,
    svd_householder_matrix_vjp,
)
from ._interop.dask import dask_matmul, dask_rmatmul, is_dask_array
from ._lib.checks import as_matrix_operand, broadcast_batch, check_finite, finite_reflectors
from ._lib.jit import jit_for
from ._lib.namespace import (
    accumulation_dtype_for,
    conj,
    device_of,
    is_complex,
    mH,
    mT,
    real_dtype,
    resolve,
)
from ._operator.compose import compose, is_operator
from ._operator.factors import LazyFactors
from ._operator.linear_operator import LinearOperatorMixin
from .cwy import CWY, TCWY
from .householder import householder_vectors, tcwy_vectors

__all__ = [
    "SVDHouseholder",
    "bounded_sigma",
    "bounded_sigma_vjp",
    "svd_householder",
    "svd_householder_apply_vjp",
    "svd_householder_matrix_vjp",
    "svd_householder_params",
]


# -- one side: Q E_r (and P_r Qᵀ) for Q = H(v₁)…H(v_k) ∈ O(N) -----------------------------------


class _Side:
    """Q = cwy(V) ∈ O(N) seen through E_r: ``embed`` c ↦ Q E_r c, ``project`` x ↦ P_r Qᵀ x,
    ``stiefel()`` = Q E_r. Built on the CWY/T-CWY operators (their torch/JAX wiring included),
    sharing one lazily computed pair of factors U, T."""

    __slots__ = ("N", "V", "factors", "k", "mode", "r", "xp")

    def __init__(self, V: Any, xp: Any, r: int) -> None:
        self.V, self.xp, self.r = V, xp, r
        self.N, self.k = V.shape[-2], V.shape[-1]
        self.mode = side_mode(self.N, self.k, r)
        self.factors = LazyFactors(V, xp)

    def __getstate__(self) -> dict[str, Any]:
        # the namespace (a module) is re-derived from V on load
        return {k: getattr(self, k) for k in self.__slots__ if k != "xp"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)
        self.xp = aac.array_namespace(self.V)

    def _op(self, cls: type, transposed: bool = False) -> Any:
        return cls(self.V, self.xp, transposed, self.factors)

    def embed(self, c: Any) -> Any:
        if self.mode == "identity":
            return pad(c, self.N, self.xp)
        if self.mode == "stiefel":
            return self._op(TCWY) @ c
        return self._op(CWY) @ pad(c, self.N, self.xp)

    def project(self, x: Any) -> Any:
        if self.mode == "identity":
            return x[..., : self.r, :]
        if self.mode == "stiefel":
            return self._op(TCWY, True) @ x
        y = self._op(CWY, True) @ x
        return y if self.mode == "square" else y[..., : self.r, :]

    def stiefel(self, dtype: Any) -> Any:
        if self.mode == "square":
            return self._op(CWY).matrix()
        if self.mode == "stiefel":
            return self._op(TCWY).matrix()
        eye = self.xp.eye(self.N, self.r, dtype=dtype, device=device_of(self.V))
        return eye if self.mode == "identity" else self._op(CWY) @ eye


# -- the operator ---------------------------------------------------------------------------------


class SVDHouseholder(LinearOperatorMixin):
    """W = Q_U Σ Q_Vᵀ (svdRNN, Zhang, Lei & Dhillon, ICML 2018 eq. 3/17) as an operator; build it
    with :func:`svd_householder`. ``.T`` is Wᵀ = Q_V Σᵀ Q_Uᵀ, the same kind of operator with the
    two sides swapped (sharing their factors). Complex: W = Q_U D(θ) Σ Q_Vᴴ; ``.H`` is
    Q_V Σᵀ D(−θ) Q_Uᴴ, ``.T`` and ``.conj()`` conjugate that, computed as conj(W conj(x))."""

    # make ``ndarray @ op`` defer to ``op.__rmatmul__`` instead of treating op as a scalar
    __array_ufunc__ = None

    def __init__(
        self, left: _Side, sigma: Any, right: _Side, xp: Any, theta: Any = None, conj: bool = False
    ) -> None:
        self._left, self._sigma, self._right, self._xp = left, sigma, right, xp
        self._theta, self._conj = theta, conj
        # the diagonal of D(θ) Σ: σ, or σ e^{iθ}
        self._diag = sigma if theta is None else sigma * phase_factor(theta, xp)
        self._dtype = xp.result_type(left.V.dtype, right.V.dtype, self._diag.dtype)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_xp": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._xp = aac.array_namespace(self._sigma)

    # -- metadata -------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        """``(..., m, n)``: the broadcast batch shape of the parameters, then W's size."""
        batch = broadcast_batch(
            [
                ("U_vecs", tuple(self._left.V.shape[:-2])),
                ("sigma", tuple(self._sigma.shape[:-1])),
                ("V_vecs", tuple(self._right.V.shape[:-2])),
            ]
        )
        return batch + (self._left.N, self._right.N)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> Any:
        return self._dtype

    @property
    def device(self) -> Any:
        return device_of(self._sigma)

    def _reference_array(self) -> Any:
        return self._sigma

    @property
    def sigma(self) -> Any:
        """The diagonal of Σ, shape (..., r), real; the singular values of W are abs(σ)."""
        return self._sigma

    @property
    def theta(self) -> Any:
        """The phases θ (..., r) of D(θ) = diag(e^{iθ}), or None."""
        return self._theta

    @property
    def Q_U(self) -> CWY:
        """The left orthogonal factor H(u₁)…H(u_{k₁}) as a :class:`~householderla.CWY` operator."""
        return self._left._op(CWY)

    @property
    def Q_V(self) -> CWY:
        """The right orthogonal factor H(v₁)…H(v_{k₂}) as a :class:`~householderla.CWY` operator."""
        return self._right._op(CWY)

    def _swap(self, conj: bool) -> SVDHouseholder:
        theta = None if self._theta is None else -self._theta
        return SVDHouseholder(self._right, self._sigma, self._left, self._xp, theta, conj)

    @property
    def T(self) -> SVDHouseholder:
        """Wᵀ = Q_V Σᵀ Q_Uᵀ (shares the factors of both sides); for complex W the plain
        transpose, conj(Wᴴ)."""
        return self._swap(self._conj ^ is_complex(self._dtype))

    mT = T

    @property
    def H(self) -> SVDHouseholder:
        """The conjugate transpose Wᴴ = Q_V Σᵀ D(−θ) Q_Uᴴ (``.T`` for real W)."""
        return self._swap(self._conj)

    mH = H

    def conj(self) -> SVDHouseholder:
        """The complex conjugate (this operator itself for real W)."""
        c = self._conj ^ is_complex(self._dtype)
        return SVDHouseholder(self._left, self._sigma, self._right, self._xp, self._theta, c)

    def _plain(self) -> SVDHouseholder:
        return SVDHouseholder(self._left, self._sigma, self._right, self._xp, self._theta)

    def __repr__(self) -> str:
        return (
            f"SVDHouseholder(shape={self.shape}, dtype={self.dtype}, "
            f"reflectors=({self._left.k}, {self._right.k}))"
        )

    # -- products -------------------------------------------------------------------------------
    def _operand(self, x: Any) -> Any:
        xp = self._xp
        if aac.is_jax_namespace(xp) and aac.is_numpy_array(x):
            x = xp.asarray(x)  # JAX code mixes in NumPy constants routinely
        if aac.is_array_api_obj(x) and aac.array_namespace(x) is not xp:
            held = type(self._sigma)
            raise TypeError(
                f"x is a {type(x).__module__}.{type(x).__name__} but the operator holds "
                f"{held.__module__}.{held.__name__} arrays; convert x first"
            )
        xp, device, _, (x,) = resolve([("x", x)], xp, complex_ok=True)
        if device is not None and self.device is not None and device != self.device:
            raise ValueError(f"x is on device {device} but the operator is on {self.device}")
        if x.dtype != self.dtype:
            x = xp.astype(x, xp.result_type(x.dtype, self.dtype))
        return x

    def __matmul__(self, x: Any) -> Any:
        """``W @ x`` with ``matmul`` semantics: x (n,) or (..., n, B).

        Q_U E_r (σ ⊙ P_r Q_Vᵀ x): two CWY/T-CWY applies and an r·B scaling. An operator
        ``x`` gives the composed operator; a Dask array ``x`` a lazy Dask array
        (:mod:`householderla._interop.dask`).
        """
        if is_dask_array(x):
            return dask_matmul(self, x)
        if is_operator(x):
            return compose(self, x)
        x = self._operand(x)
        if self._conj:  # conj(W) x = conj(W conj(x))
            return conj(self._plain() @ conj(x, self._xp), self._xp)
        xm, vector = as_matrix_operand(x, self._right.N, "x")
        s = self._diag if self._diag.dtype == x.dtype else self._xp.astype(self._diag, x.dtype)
        y = self._full_batch(self._left.embed(s[..., :, None] * self._right.project(xm)))
        return y[..., 0] if vector else y

    def _full_batch(self, y: Any) -> Any:
        """Broadcast to the operator's batch (a side with k = 0 adds its batch axes only
        here, since it applies no array of that batch)."""
        batch = broadcast_batch([("W", self.shape[:-2]), ("x", tuple(y.shape[:-2]))])
        shape = batch + tuple(y.shape[-2:])
        return y if tuple(y.shape) == shape else self._xp.broadcast_to(y, shape)

    def __rmatmul__(self, x: Any) -> Any:
        """``x @ W`` = (Wᵀ xᵀ)ᵀ; x (m,) or (..., B, m)."""
        if is_dask_array(x):
            return dask_rmatmul(self, x)
        if is_operator(x):
            return compose(x, self)
        x = self._operand(x)
        if x.ndim == 1:
            return self.T @ x
        return mT(self.T @ mT(x))

    def mv(self, x: Any) -> Any:
        """Apply to a stack of vectors along the last axis: x (..., n) -> (..., m)."""
        if not is_dask_array(x):
            x = self._operand(x)
        n = self._right.N
        if x.ndim == 0 or x.shape[-1] != n:
            got = "a scalar" if x.ndim == 0 else f"shape {tuple(x.shape)}"
            raise ValueError(f"x must have shape (..., {n}) (vectors on the last axis); got {got}")
        return (self @ x[..., None])[..., 0]

    def matrix(self) -> Any:
        """The dense W, shape ``self.shape``: (Q_U E_r) diag(σ) (Q_V E_r)ᵀ.

        Q E_r is formed by the CWY/T-CWY dense paths (orgqr-style blocked for lower-trapezoidal
        vectors on NumPy/torch/CuPy, 4N³/3 flops for a square side; T-CWY 2·N·r² + … for a
        rectangular side with r reflectors), then one m×r by r×n GEMM (2·m·n·r flops).
        """
        if self._conj:
            return conj(self._plain().matrix(), self._xp)
        A = self._left.stiefel(self.dtype)
        B = self._right.stiefel(self.dtype)
        return self._full_batch((A * self._diag[..., None, :]) @ mH(B, self._xp))


def svd_householder(
    U_vecs: Any, sigma: Any, V_vecs: Any, *, theta: Any = None, xp: Any = None
) -> SVDHouseholder:
    """The svdRNN parametrization W = Q_U Σ Q_Vᵀ as an operator (never formed unless asked).

    Parameters
    ----------
    U_vecs : array, shape (..., m, k₁), k₁ ≤ m
        Reflection vectors of Q_U = H(u₁)…H(u_{k₁}) ∈ O(m) as columns (H(0) = I; k₁ = 0 is
        allowed and means Q_U = I).
    sigma : array, shape (..., r), r = min(m, n)
        Diagonal of Σ. Any sign: the singular values of W are abs(σ). Use
        :func:`bounded_sigma` to keep them in [center − radius, center + radius]
        (Zhang, Lei & Dhillon, ICML 2018 eq. 8).
    V_vecs : array, shape (..., n, k₂), k₂ ≤ n
        Reflection vectors of Q_V = H(v₁)…H(v_{k₂}) ∈ O(n). Complex vectors (either side) give
        a complex W with unitary sides, W = Q_U Σ Q_Vᴴ; σ stays real.
    theta : real array, shape (..., r), optional
        Phases between the left side and Σ: W = Q_U diag(e^{iθ}) Σ Q_Vᴴ (complex). With them
        every complex matrix is reached (:func:`svd_householder_params` with
        ``return_phases=True``); differentiable.
    xp : namespace, optional
        Array namespace to use instead of the one inferred from the inputs.

    Returns
    -------
    SVDHouseholder
        Operator of shape (..., m, n) (batch axes of the three inputs broadcast) with ``@``
        (matmul semantics, also ``x @ W``), ``.T`` (Wᵀ), ``.mv``, ``.matrix()``, ``.shape``,
        ``.dtype``, ``.device``, ``.sigma`` and the factors ``.Q_U``, ``.Q_V`` (CWY operators).

    Notes
    -----
    W = Q_U Σ Q_Vᵀ, Σ = diag(σ) padded with zeros to m×n (Zhang, Lei & Dhillon, ICML 2018 eq. 3 for
    m = n, eq. 17 otherwise; the paper's H_i(u_i) with u_i ∈ ℝⁱ padded by m − i leading zeros is our
    column m − i + 1, see ``docs/theory/svd.rst``). By Theorems 2 and 4 of Zhang, Lei & Dhillon,
    ICML 2018 every real m×n matrix is reached; :func:`svd_householder_params` constructs the
    vectors with 2·min(m, n) − 1 reflectors in total.

    ``W @ x`` for x (n, B) costs, per side with N rows and k reflectors, 4·N·k·B + k²·B
    (T-CWY side, k = r < N: 2·(N + r)·k·B + k²·B), plus r·B for σ — two GEMM pairs, no
    N×N matrix. Building the factors costs N·k² + k³/3 per side, once per operator (shared
    with ``.T``). With torch tensors that require grad, and always with JAX arrays, the
    CWY/T-CWY parts run through the explicit backward passes of :mod:`householderla.vjp`; the
    scaling by σ and the zero padding are differentiated natively.

    Examples
    --------
    >>> import numpy as np, householderla as hl
    >>> rng = np.random.default_rng(0)
    >>> U, V = rng.standard_normal((4, 4)), rng.standard_normal((3, 3))
    >>> W = hl.svd_householder(U, np.array([3.0, 2.0, 0.5]), V)
    >>> W.shape
    (4, 3)
    >>> np.round(np.linalg.svd(W.matrix(), compute_uv=False), 12)
    array([3. , 2. , 0.5])
    >>> x = rng.standard_normal(3)
    >>> bool(np.allclose(W @ x, W.matrix() @ x))
    True
    """
    xp, (U_vecs, sigma, V_vecs, theta), (_, _, r) = resolve_params(
        U_vecs, sigma, V_vecs, xp, theta=theta
    )
    U_vecs, V_vecs = (
        finite_reflectors(U_vecs, xp, "U_vecs"),
        finite_reflectors(V_vecs, xp, "V_vecs"),
    )
    return SVDHouseholder(_Side(U_vecs, xp, r), sigma, _Side(V_vecs, xp, r), xp, theta)


# -- the constructive inverse: parameters that reproduce a given W ----------------------------


def svd_householder_params(
    W: Any, *, return_phases: bool = False, xp: Any = None
) -> tuple[Any, ...]:
    """Constructive inverse of :func:`svd_householder`: parameters that reproduce any real W
    (any complex W with ``return_phases=True``).

    Parameters
    ----------
    W : array, shape (..., m, n)
        Any real matrices (square or rectangular, any rank), m, n ≥ 1; or complex ones, which
        need ``return_phases=True`` (ValueError otherwise).
    return_phases : bool, default False
        Also return θ (..., r) with ``svd_householder(U_vecs, sigma, V_vecs,
        theta=theta).matrix() ≈ W``: the unitary singular-vector matrices are Hermitian
        reflections times phases (:func:`householder_vectors`), and the phases of both sides
        meet at Σ, θ = θ_left − θ_right. Zero for real W.

    Returns
    -------
    U_vecs : array, shape (..., m, k₁) sigma : array, shape (..., r), r = min(m, n)
        The singular values as the SVD returns them (≥ 0, descending).
    V_vecs : array, shape (..., n, k₂)
        Lower-trapezoidal reflection vectors with ``svd_householder(U_vecs, sigma, V_vecs).matrix()
        ≈ W``, where (k₁, k₂) = (r − 1, r) for m ≤ n and (r, r − 1) for m > n: 2·min(m, n) − 1
        reflectors in total, one fewer than Zhang, Lei & Dhillon, ICML 2018, Theorem 4.

    Notes
    -----
    Reduced SVD W = U diag(σ) Vᵀ (``xp.linalg.svd(W, full_matrices=False)``; for m ≤ n, U is
    m×m orthogonal and V ∈ St(n, m), and the other way round for m > n). The square factor
    (size r) goes through :func:`householder_vectors`; its r-th vector is 0 or −2e_r, and in
    the second case the r-th columns of *both* singular-vector matrices are negated, which
    leaves W and σ unchanged and makes that vector 0, so it is dropped (r − 1 vectors). The
    other factor, now in St(·, r), goes through :func:`tcwy_vectors` (r vectors; for m = n
    this is :func:`householder_vectors`). Shapes depend only on (m, n), so this runs under
    ``jax.jit``. Cost: the SVD plus 4r³/3 + 2r²(N − r/3) flops for the two Householder QRs,
    computed in float64 for float32 input on CPU backends.

    Complex W: the same with Hermitian reflections; the square factor's r-th vector is then
    always 0 (its phase went to θ), so the counts are those above.

    Rank-deficient W (some σ_i = 0): the SVD still returns orthogonal singular vectors
    (not unique — any orthonormal basis of the null spaces will do), and the parameters
    reproduce W to the same accuracy; which basis you get is the backend's choice.

    Examples
    --------
    >>> import numpy as np, householderla as hl
    >>> W = np.random.default_rng(0).standard_normal((5, 3))
    >>> U_vecs, sigma, V_vecs = hl.svd_householder_params(W)
    >>> U_vecs.shape, sigma.shape, V_vecs.shape
    ((5, 3), (3,), (3, 2))
    >>> bool(np.allclose(hl.svd_householder(U_vecs, sigma, V_vecs).matrix(), W))
    True
    """
    xp, _, dtype, (W,) = resolve([("W", W)], xp, complex_ok=True)
    if W.ndim < 2 or W.shape[-1] == 0 or W.shape[-2] == 0:
        raise ValueError(f"W must have shape (..., m, n) with m, n >= 1; got {tuple(W.shape)}")
    if is_complex(dtype) and return_phases is not True:
        raise ValueError(
            "W is complex: its singular vectors need phases besides the reflections; use "
            "U_vecs, sigma, V_vecs, theta = svd_householder_params(W, return_phases=True)"
        )
    check_finite(W, xp, "W")
    acc = accumulation_dtype_for(xp, W)
    Wa = W if W.dtype == acc else xp.astype(W, acc)
    out = list(jit_for(xp, _params_core)(xp, Wa))
    rdtype = real_dtype(xp, dtype)
    if len(out) == 3 and return_phases:
        out.append(xp.zeros_like(out[1]))
    types = (dtype, rdtype, dtype, rdtype)[: len(out)]
    out = [a if a.dtype == t else xp.astype(a, t) for a, t in zip(out, types, strict=True)]
    return tuple(out)


def _params_core(xp: Any, W: Any) -> tuple[Any, ...]:
    """SVD, sign flip and the two Householder QRs (compiled once per shape on JAX); for
    complex W the QRs with phases, and θ = θ_left − θ_right returned last."""
    m, n = W.shape[-2], W.shape[-1]
    r = min(m, n)
    # W = 2^e·Ws with max|Ws| in [1, 2): exact, and the SVD then never squares entries at
    # 1e±300 (XLA on the CPU would also flush their subnormal squares to zero); two steps,
    # since 2^±1074 itself is not a normal number
    mx = xp.max(xp.abs(W), axis=(-2, -1), keepdims=True)
    e = xp.floor(xp.log2(xp.where(mx > 0, mx, xp.ones_like(mx))))
    half = xp.floor(e / 2)
    U, s, Vh = xp.linalg.svd((W * 2.0**-half) * 2.0 ** (half - e), full_matrices=False)
    s = (s * 2.0 ** half[..., 0]) * 2.0 ** (e - half)[..., 0]
    V = mH(Vh, xp)
    square, other = (U, V) if m <= n else (V, U)
    if is_complex(W.dtype):  # W = U Σ Vᴴ = Q_U D_U Σ D_Vᴴ Q_Vᴴ, the r-th square vector is 0
        sq_vecs, sq_theta = householder_vectors(square, return_phases=True, xp=xp)
        other_vecs, o_theta = tcwy_vectors(other, return_phases=True, xp=xp)
        sq_vecs = sq_vecs[..., : r - 1]
        if m <= n:
            return sq_vecs, s, other_vecs, sq_theta - o_theta
        return other_vecs, s, sq_vecs, o_theta - sq_theta
    sq_vecs = householder_vectors(square, xp=xp)
    # the r-th vector is 0 or −e_r; in the second case negate the r-th column of both
    # factors (W and σ unchanged), which turns it into the zero vector
    last = sq_vecs[..., r - 1, r - 1]
    sign = xp.where(last < 0, -xp.ones_like(last), xp.ones_like(last))
    other = xp.concat([other[..., : r - 1], other[..., r - 1 :] * sign[..., None, None]], axis=-1)
    sq_vecs = sq_vecs[..., : r - 1]
    other_vecs = tcwy_vectors(other, xp=xp)
    return (sq_vecs, s, other_vecs) if m <= n else (other_vecs, s, sq_vecs)


def __dir__() -> list[str]:
    """Only the public names: the imports above stay attributes but are not listed."""
    return sorted(__all__)
