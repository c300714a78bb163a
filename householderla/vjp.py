"""Explicit vector–Jacobian products of every differentiable map, in the Array API.

Each function takes the forward inputs and the cotangent of the output and returns the
cotangents of the inputs, in the inputs' namespace, device and dtype. The derivations are in
``docs/theory/vjp.rst``. Apply-type VJPs need O(N·L + L·B) memory (no N×N intermediate) and
at most about twice the forward's flops; zero reflection vectors get a zero gradient.

=========================================  ===============================================
function                                   map
=========================================  ===============================================
``cwy_apply(V, h, g)``                     (V, h) ↦ cwy(V) @ h
``cwy_transpose_apply(V, h, g)``           (V, h) ↦ cwy(V).T @ h
``cwy_matrix(V, G)``                       V ↦ cwy(V).matrix()
``tcwy_apply(V, x, g)``                    (V, x) ↦ tcwy(V) @ x
``tcwy_transpose_apply(V, y, g)``          (V, y) ↦ tcwy(V).T @ y
``tcwy_matrix(V, G)``                      V ↦ tcwy(V).matrix()
``householder_apply(V, h, g)``             (V, h) ↦ householder_apply(V, h)
``householder_product(V, G)``              V ↦ householder_product(V)
``cwy_factors(V, U_bar, T_bar)``           V ↦ (U, T = S⁻¹), the factors every operator holds
=========================================  ===============================================
"""

from __future__ import annotations

from typing import Any

from . import _compact_wy as K
from ._lib.linalg import eye_like
from ._lib.namespace import resolve
from .householder import _check_reflectors, as_matrix_operand, householder_apply_vjp

__all__ = [
    "cwy_apply",
    "cwy_factors",
    "cwy_matrix",
    "cwy_transpose_apply",
    "householder_apply",
    "householder_product",
    "tcwy_apply",
    "tcwy_matrix",
    "tcwy_transpose_apply",
]


def _broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(s) for s in shapes)
    out = []
    for dims in zip(*((1,) * (n - len(s)) + tuple(s) for s in shapes), strict=True):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise ValueError(f"batch shapes {shapes} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _check_cotangent(g: Any, shape: tuple[int, ...], name: str) -> None:
    if tuple(g.shape) != tuple(shape):
        raise ValueError(
            f"{name} must have the shape of the forward output {tuple(shape)}; got {tuple(g.shape)}"
        )


def _apply_vjp(
    V: Any, h: Any, g: Any, xp: Any, *, transpose: bool, mode: str, hname: str
) -> tuple[Any, Any]:
    xp, _, _, (V, h, g) = resolve([("V", V), (hname, h), ("g", g)], xp)
    N, L = _check_reflectors(V)
    n_in = {"square": N, "embed": L, "project": N}[mode]
    n_out = {"square": N, "embed": N, "project": L}[mode]
    hm, vector = as_matrix_operand(h, n_in, hname)
    out_shape = _broadcast_shapes(tuple(V.shape[:-2]), tuple(hm.shape[:-2])) + (
        n_out,
        hm.shape[-1],
    )
    _check_cotangent(g, out_shape[:-1] if vector else out_shape, "g")
    gm = g[..., None] if vector else g
    U, T, r = K.cwy_factors(V, xp)
    U_bar, h_bar, _, S_bar = K.lowrank_vjp(U, T, hm, gm, xp, transpose=transpose, mode=mode)
    V_bar = K.factors_vjp(U, r, U_bar, S_bar, xp)
    return V_bar, (h_bar[..., 0] if vector else h_bar)


def _matrix_vjp(V: Any, G: Any, xp: Any, *, transpose: bool, mode: str) -> Any:
    xp, _, _, (V, G) = resolve([("V", V), ("G", G)], xp)
    N, L = _check_reflectors(V)
    shape = tuple(V.shape[:-2]) + ((N, N) if mode == "square" else (N, L))
    _check_cotangent(G, shape, "G")
    U, T, r = K.cwy_factors(V, xp)
    U_bar, _, _, S_bar = K.lowrank_vjp(U, T, None, G, xp, transpose=transpose, mode=mode)
    return K.factors_vjp(U, r, U_bar, S_bar, xp)


def cwy_apply(V: Any, h: Any, g: Any, *, xp: Any = None) -> tuple[Any, Any]:
    """VJP of (V, h) ↦ cwy(V) @ h.

    Parameters
    ----------
    V : array, shape (..., N, L)
        Reflection vectors.
    h : array, shape (N,) or (..., N, B)
        The right operand of the forward.
    g : array
        Cotangent of the output ``cwy(V) @ h`` (its shape).
    xp : namespace, optional

    Returns
    -------
    V_bar : array, shape (..., N, L)
    h_bar : array, shape of h

    Notes
    -----
    With a = Uᵀh, b = T a, c = Uᵀg, d = Tᵀc: h̄ = Qᵀg = g − U d,
    Ū = −g bᵀ − h dᵀ + U (P + Pᵀ) with P = striu(d bᵀ), then v̄ = (ū − u uᵀū)/‖v‖.
    8·N·L·B + 2·N·L² flops on top of building the factors.
    """
    return _apply_vjp(V, h, g, xp, transpose=False, mode="square", hname="h")


def cwy_transpose_apply(V: Any, h: Any, g: Any, *, xp: Any = None) -> tuple[Any, Any]:
    """VJP of (V, h) ↦ cwy(V).T @ h; as :func:`cwy_apply` with T ↔ Tᵀ and S̄ = b dᵀ."""
    return _apply_vjp(V, h, g, xp, transpose=True, mode="square", hname="h")


def cwy_matrix(V: Any, G: Any, *, xp: Any = None) -> Any:
    """VJP of V ↦ cwy(V).matrix(); G has shape (..., N, N).

    Ū = −G U Tᵀ − Gᵀ U T + U (P + Pᵀ), P = striu(Tᵀ Uᵀ G U Tᵀ); 4·N²·L + O(N·L²) flops.
    """
    return _matrix_vjp(V, G, xp, transpose=False, mode="square")


def tcwy_apply(V: Any, x: Any, g: Any, *, xp: Any = None) -> tuple[Any, Any]:
    """VJP of (V, x) ↦ tcwy(V) @ x; x (M,) or (..., M, B), g (..., N[, B]).

    Returns (V_bar (..., N, M), x_bar shaped as x). Equal to :func:`cwy_apply` with
    h = [x; 0] and x̄ = h̄[:M], without forming the padding.
    """
    return _apply_vjp(V, x, g, xp, transpose=False, mode="embed", hname="x")


def tcwy_transpose_apply(V: Any, y: Any, g: Any, *, xp: Any = None) -> tuple[Any, Any]:
    """VJP of (V, y) ↦ tcwy(V).T @ y; y (N,) or (..., N, B), g (..., M[, B])."""
    return _apply_vjp(V, y, g, xp, transpose=True, mode="project", hname="y")


def tcwy_matrix(V: Any, G: Any, *, xp: Any = None) -> Any:
    """VJP of V ↦ tcwy(V).matrix(); G has shape (..., N, M). 6·N·M² + O(M³) flops."""
    return _matrix_vjp(V, G, xp, transpose=False, mode="embed")


def householder_apply(V: Any, h: Any, g: Any, *, xp: Any = None) -> tuple[Any, Any]:
    """VJP of (V, h) ↦ householder_apply(V, h), by sequential reflections (8·N·L·B flops,
    O(N·B) extra memory: each reflector's input is recovered from its output)."""
    xp, _, _, (V, h, g) = resolve([("V", V), ("h", h), ("g", g)], xp)
    N, _ = _check_reflectors(V)
    hm, vector = as_matrix_operand(h, N)
    out = _broadcast_shapes(tuple(V.shape[:-2]), tuple(hm.shape[:-2])) + tuple(hm.shape[-2:])
    _check_cotangent(g, out[:-1] if vector else out, "g")
    return householder_apply_vjp(V, h, g, xp)


def householder_product(V: Any, G: Any, *, xp: Any = None) -> Any:
    """VJP of V ↦ householder_product(V); G has shape (..., N, N)."""
    xp, device, dtype, (V, G) = resolve([("V", V), ("G", G)], xp)
    N, _ = _check_reflectors(V)
    _check_cotangent(G, tuple(V.shape[:-2]) + (N, N), "G")
    V_bar, _ = householder_apply_vjp(V, eye_like(xp, N, dtype, device), G, xp)
    return V_bar


def cwy_factors(V: Any, U_bar: Any, T_bar: Any, *, xp: Any = None) -> Any:
    """VJP of V ↦ (U, T): unit columns and T = S⁻¹ (what every CWY/T-CWY operator holds).

    S̄ = −Tᵀ T̄ Tᵀ, Ū += U (P + Pᵀ) with P = striu(S̄), then the normalisation backward.
    This is the rule the torch and JAX wiring use, so that several applies of one operator
    share one factor backward.
    """
    xp, _, _, (V, U_bar, T_bar) = resolve([("V", V), ("U_bar", U_bar), ("T_bar", T_bar)], xp)
    _, L = _check_reflectors(V)
    _check_cotangent(U_bar, tuple(V.shape), "U_bar")
    _check_cotangent(T_bar, tuple(V.shape[:-2]) + (L, L), "T_bar")
    U, T, r = K.cwy_factors(V, xp)
    return K.factors_vjp(U, r, U_bar, K.s_bar_from_t_bar(T, T_bar), xp)
