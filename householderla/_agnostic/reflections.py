"""Householder reflections one at a time: the sequential product, its backward, and the
reflectors of Householder QR with a positive diagonal.

H(v) = I − 2 v vᵀ / ‖v‖² for v ≠ 0 and H(0) = I (Zhang, Lei & Dhillon, ICML 2018, eq. 1); for
complex v, H(v) = I − 2 v vᴴ / ‖v‖² (Hermitian and unitary), with every transpose below a
conjugate transpose. Every function takes ``xp`` (or reads it from its input) and works on any
Array API namespace.
"""

from __future__ import annotations

from typing import Any

import array_api_compat as aac

from .._lib.checks import as_matrix_operand, check_reflectors
from .._lib.jit import fori
from .._lib.linalg import sum_to_shape
from .._lib.namespace import device_of, mH
from .compact_wy import normalize_columns, normalize_columns_vjp

__all__ = [
    "householder_apply_vjp",
    "positive_qr_reflectors",
    "reflect_all",
    "reflect_sequence",
    "unitary_qr_reflectors",
]


def reflect_sequence(U: Any, y: Any, order: range, xp: Any) -> Any:
    for k in order:
        u = U[..., :, k : k + 1]
        y = y - 2.0 * (u @ (mH(u, xp) @ y))
    return y


def reflect_all(U: Any, y: Any, xp: Any) -> Any:
    """H(u₁)(H(u₂)(…H(u_L) y)) for unit columns U."""
    return reflect_sequence(U, y, range(U.shape[-1] - 1, -1, -1), xp)


def householder_apply_vjp(V: Any, h: Any, g: Any, xp: Any) -> tuple[Any, Any]:
    """Backward of :func:`householder_apply` (inputs already resolved).

    Cost ≈ 18·N·L·B flops (4·N·L·B to replay the forward, the rest in the backward sweep).

    Runs the reflections in forward order, recovering each reflector's input from its output (H(u)
    is an involution, so no O(L·N·B) tape is stored; Mhammedi et al., ICML 2017, Algorithm 1). For y
    = H(u) x: x̄ = H(u) ȳ and ū = −2 (ȳ (uᴴx)ᴴ + x (uᴴȳ)ᴴ) summed over the B columns; the
    normalisation u = v/‖v‖ then gives the full gradient of Zhang, Lei & Dhillon, ICML 2018 eq. 15
    (v̄ = (ū − u uᵀū)/‖v‖), not Mhammedi et al.'s fixed-norm version.

    The Numba kernel :func:`householderla._kernels.numba.hgrad` computes the same on NumPy
    float32/float64 (15·N·L·B flops including the forward replay); NaN/Inf propagate on both.
    """
    N, L = check_reflectors(V)
    hm, vector = as_matrix_operand(h, N)
    gm = g[..., None] if vector else g
    U, r = normalize_columns(V, xp)
    y = reflect_sequence(U, hm, range(L - 1, -1, -1), xp)
    cols = []
    for k in range(L):
        u = U[..., :, k : k + 1]
        uh = mH(u, xp)
        x = y - 2.0 * (u @ (uh @ y))
        w = uh @ x  # (..., 1, B)
        z = uh @ gm
        cols.append(-2.0 * (gm @ mH(w, xp) + x @ mH(z, xp)))
        gm = gm - 2.0 * (u @ z)
        y = x
    Ubar = xp.concat(cols, axis=-1) if cols else xp.zeros_like(U)
    Vbar = normalize_columns_vjp(U, r, sum_to_shape(Ubar, tuple(U.shape), xp), xp)
    hbar = sum_to_shape(gm, tuple(hm.shape), xp)
    return Vbar, (hbar[..., 0] if vector else hbar)


def positive_qr_reflectors(A: Any) -> Any:
    """Reflectors v₁…v_K of Householder QR of A (..., N, K) with R's diagonal ≥ 0.

    For the current column x = [α; y] the reflector maps x to ‖x‖e₁: v = [α − ‖x‖; y], with
    Parlett's α − ‖x‖ = −‖y‖²/(α + ‖x‖) for α > 0 (no cancellation). It is returned divided
    by ρ = ‖y‖ (H(cv) = H(v)): v = [−ρ/(α + ‖x‖); y/ρ] (α > 0) or [(α − ‖x‖)/ρ; y/ρ], so no
    square of an entry is ever formed: ρ and ‖x‖ are computed from max-abs-scaled entries, as
    LAPACK's dnrm2/dlarfg do. Columns at 1e±300 give the same reflections as at unit scale.
    With y = 0, or ‖y‖ ≤ N·eps·|α| (rounding noise of the earlier steps, or entries near
    1e-200 of an orthogonal Q: a backward error below N·eps·‖x‖), the reflector is 0
    (α ≥ 0: H = I) or −e₁ (α < 0). On JAX the same steps run on fixed shapes
    (:func:`_fixed_shape_reflectors`).
    """
    return _qr_reflectors(A, _positive_reflector)[0]


def _positive_reflector(alpha: Any, rest: Any, negligible: float, xp: Any) -> tuple[Any, Any]:
    """(v₀, θ = 0) and y/ρ of :func:`positive_qr_reflectors` for the column [α; y] (``rest``
    = y, possibly padded with zeros, which change neither its max nor its norm)."""
    one, zero = xp.ones_like(alpha), xp.zeros_like(alpha)
    mr = xp.max(xp.abs(rest), axis=-1) if rest.shape[-1] else zero
    rs = rest / xp.where(mr > 0, mr, one)[..., None]
    rho = mr * xp.sqrt(xp.sum(rs * rs, axis=-1))  # ‖y‖ without squaring y
    # ‖y‖ at rounding level next to |α| (a column already reduced, as in an orthogonal input
    # after k steps) counts as y = 0: its direction is noise, and XLA may evaluate that noise
    # differently in the fused expressions below (inconsistent reflectors, an error of order
    # 1, seen under jax.jit). Backward error ≤ tiny·|α|.
    has = rho > negligible * xp.abs(alpha)
    big = xp.maximum(xp.abs(alpha), rho)
    big1 = xp.where(big > 0, big, one)
    a_s, r_s = alpha / big1, rho / big1
    nrm = big * xp.sqrt(a_s * a_s + r_s * r_s)  # ‖x‖
    pos = alpha > 0
    rho1 = xp.where(has, rho, one)
    head = xp.where(pos, -rho / xp.where(pos, alpha + nrm, one), (alpha - nrm) / rho1)
    v0 = xp.where(has, head, xp.where(alpha < 0, -one, zero))
    y = xp.where(has[..., None], rest / rho1[..., None], xp.zeros_like(rest))
    return (v0, zero), y


def _from_parts(re: Any, im: Any, xp: Any, dtype: Any) -> Any:
    """re + i·im as ``dtype`` (the standard has no ``complex(re, im)``)."""
    return xp.astype(re, dtype) + xp.astype(im, dtype) * 1j


def _div_real(z: Any, r: Any, xp: Any) -> Any:
    """z / r for complex z and real r > 0, part by part: complex division forms 1/r first,
    which overflows for a subnormal r."""
    return _from_parts(xp.real(z) / r, xp.imag(z) / r, xp, z.dtype)


def unitary_qr_reflectors(A: Any) -> tuple[Any, Any]:
    """Reflectors v₁…v_K and phases θ of Householder QR of complex A (..., N, K) with
    Hermitian reflections: A = H(v₁)…H(v_K) [R; 0] with R's diagonal ‖x_k‖ e^{iθ_k}.

    A Hermitian reflection maps x = [α; y] to β e₁ only if |β| = ‖x‖ and conj(α)β is real,
    so β = ‖x‖ e^{iφ}, φ = arg α (the phase cannot be chosen away: ``docs/theory/complex.rst``).
    The reflector x − βe₁ = e^{iφ}[|α| − ‖x‖; e^{−iφ}y] is stored as v = [−ρ/(|α| + ‖x‖);
    e^{−iφ}y/ρ] (ρ = ‖y‖; H(cv) = H(v) for complex c; Parlett's |α| − ‖x‖ = −ρ²/(|α| + ‖x‖),
    no cancellation), from max-abs-scaled moduli as in :func:`positive_qr_reflectors`.
    y = 0 (or ρ ≤ N·eps·|α|) gives v = 0. θ_k = arg α_k (0 for α_k = 0). For unitary A
    (square, or columns orthonormal) R = diag(e^{iθ}): A = H(v₁)…H(v_K) diag(e^{iθ}) (first K
    columns), Mhammedi et al., ICML 2017, §4.3, Corollary 1; the last reflector of a square A
    is 0. For any full-rank A this is its Q factor with a positive diagonal R.
    """
    return _qr_reflectors(A, _unitary_reflector)


def _unitary_reflector(alpha: Any, rest: Any, negligible: float, xp: Any) -> tuple[Any, Any]:
    """(v₀, θ) and e^{−iφ}y/ρ of :func:`unitary_qr_reflectors` for the column [α; y] (zero
    padding of ``rest`` allowed, as in :func:`_positive_reflector`)."""
    a_re, a_im = xp.real(alpha), xp.imag(alpha)
    aa = xp.abs(alpha)
    one, zero = xp.ones_like(aa), xp.zeros_like(aa)
    ar = xp.abs(rest)
    mr = xp.max(ar, axis=-1) if ar.shape[-1] else zero
    mr1 = xp.where(mr > 0, mr, one)
    rho = mr * xp.sqrt(xp.sum((ar / mr1[..., None]) ** 2, axis=-1))  # ‖y‖, no squares
    has = rho > negligible * aa
    big = xp.maximum(aa, rho)
    big1 = xp.where(big > 0, big, one)
    nrm = big * xp.sqrt((aa / big1) ** 2 + (rho / big1) ** 2)  # ‖x‖
    head = xp.where(has, -rho / xp.where(has, aa + nrm, one), zero)
    aa1 = xp.where(aa > 0, aa, one)
    unit = _from_parts(xp.where(aa > 0, a_re / aa1, one), a_im / aa1, xp, alpha.dtype)
    rho1 = xp.where(has, rho, one)
    y = _div_real(xp.conj(unit)[..., None] * rest, rho1[..., None], xp)
    y = xp.where(has[..., None], y, xp.zeros_like(y))
    return (xp.astype(head, alpha.dtype), xp.atan2(a_im, a_re)), y


def _reflect_rest(W: Any, v: Any, xp: Any) -> Any:
    """H(v) W for v with vᴴv = 1 + v₀² or 0 (no underflow; H(0) = I)."""
    cplx = xp.isdtype(v.dtype, "complex floating")
    vh = xp.conj(v) if cplx else v
    vv = xp.sum(xp.real(vh * v), axis=-1) if cplx else xp.sum(v * v, axis=-1)
    one, zero = xp.ones_like(vv), xp.zeros_like(vv)
    coef = xp.where(vv > 0, 2.0 / xp.where(vv > 0, vv, one), zero)
    coef = coef if coef.dtype == v.dtype else xp.astype(coef, v.dtype)
    return W - (coef[..., None, None] * v[..., :, None]) * (vh[..., None, :] @ W)


def _qr_reflectors(A: Any, reflector: Any) -> tuple[Any, Any]:
    """The column steps of Householder QR with ``reflector`` (:func:`_positive_reflector` or
    :func:`_unitary_reflector`): (V, θ). Eager namespaces shrink the working block each step;
    JAX runs :func:`_fixed_shape_reflectors`."""
    xp = aac.array_namespace(A)
    if aac.is_jax_namespace(xp):
        return _fixed_shape_reflectors(A, reflector, xp)
    K = A.shape[-1]
    batch = tuple(A.shape[:-2])
    device = device_of(A)
    W = A
    cols, phases = [], []
    negligible = float(xp.finfo(A.dtype).eps) * A.shape[-2]
    for k in range(K):
        x = W[..., :, 0]
        (v0, theta), y = reflector(x[..., 0], x[..., 1:], negligible, xp)
        v = xp.concat([v0[..., None], y], axis=-1)
        phases.append(theta)
        if k + 1 < K:
            W = _reflect_rest(W[..., :, 1:], v, xp)[..., 1:, :]
        pad = xp.zeros(batch + (k,), dtype=A.dtype, device=device)
        cols.append(xp.concat([pad, v], axis=-1))
    return xp.stack(cols, axis=-1), xp.stack(phases, axis=-1)


def _fixed_shape_reflectors(A: Any, reflector: Any, xp: Any) -> tuple[Any, Any]:
    """:func:`_qr_reflectors` on the whole (..., N, K) array in a :func:`fori` loop: step k
    reads column k at rows ≥ k (the rows above masked to 0, so max and norm are unchanged)
    and reflects every column (rows < k see v = 0). One compiled step whatever K: the
    shrinking steps unrolled under ``jax.jit`` compiled K different ones (227 s at N = 64)."""
    N, K = A.shape[-2], A.shape[-1]
    rows = xp.arange(N, device=device_of(A))
    cols = xp.arange(K, device=device_of(A))
    negligible = float(xp.finfo(A.dtype).eps) * N
    theta0 = xp.zeros(A.shape[:-2] + (K,), dtype=xp.real(A).dtype, device=device_of(A))

    def step(k: Any, carry: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
        W, V, theta = carry
        x = W[..., :, k]
        rest = xp.where(rows > k, x, xp.zeros_like(x))
        (v0, phase), y = reflector(x[..., k], rest, negligible, xp)
        v = xp.where(rows == k, v0[..., None], y)
        return (
            _reflect_rest(W, v, xp),
            xp.where(cols == k, v[..., :, None], V),
            xp.where(cols == k, phase[..., None], theta),
        )

    _, V, theta = fori(xp, K, step, (A, xp.zeros_like(A), theta0))
    return V, theta
