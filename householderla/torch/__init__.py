"""householderla for PyTorch: differentiable maps, the ``orthogonal`` parametrization.

Every map of :mod:`householderla` called with torch tensors is differentiable through a
``torch.autograd.Function`` (forward + ``setup_context`` + backward) whose backward is the
hand-derived VJP (:mod:`householderla._autodiff.torch`): ``loss.backward()``,
``torch.autograd.grad(..., create_graph=True)``, ``torch.func.grad`` / ``jacrev`` / ``vmap``
all work, and so does double backward (every backward is written in torch operations).

=========================================  ==============================================
map                                        Function(s)
=========================================  ==============================================
``cwy(V) @ h``, ``.T @``, ``.matrix()``    ``CWYFactors`` + ``LowRankApply``
``tcwy(V) @ x``, ``.T @ y``, ``.matrix()`` ``CWYFactors`` + ``LowRankApply``
``householder_apply``, ``_product``        ``HouseholderApply`` (or ``...Numba``)
``polar``, ``polar_retraction``            ``Polar`` (X + tZ by autograd)
``cayley_retraction``                      ``CayleySMW`` (+ ``Polar`` for the drift guard)
``qr_retraction``                          ``QRPositive`` (X + tZ by autograd)
=========================================  ==============================================

:class:`Muon` is ``torch.optim.Muon`` with the fixed-step polar schedules of
:func:`householderla.polar`; :class:`StiefelSGD` / :class:`StiefelAdam` keep parameters on
Stiefel manifolds. :func:`orthogonal` registers a weight parametrization in the style of
``torch.nn.utils.parametrizations.orthogonal``, by CWY, T-CWY or the SVD parametrization.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import householder as _householder
from .._autodiff.torch import (
    CayleySMW,
    CWYFactors,
    HouseholderApply,
    HouseholderApplyNumba,
    LowRankApply,
    Polar,
    QRPositive,
    with_jvp,
)
from .._kernels import load_numba
from .._lib.checks import as_matrix_operand, check_finite_norms, check_reflectors
from .._lib.namespace import resolve
from .._lib.tracing import is_transformed
from ..cwy import CWY, TCWY, cwy, tcwy
from ..retractions import cayley_retraction, polar, polar_retraction, qr_retraction

# -- the orthogonal layer applied without forming its weight (torch/_layer.py) ------------------
from ._layer import OrthogonalLinear

# -- optimizers: Muon (torch/_muon.py), StiefelSGD / StiefelAdam (torch/_optim.py)
from ._muon import Muon, orthogonalize
from ._optim import StiefelAdam, StiefelSGD

# -- the orthogonal parametrization (torch/_param.py) --------------------------------------------
from ._param import Orthogonal, orthogonal

__all__ = [
    "CWY",
    "TCWY",
    "CWYFactors",
    "CayleySMW",
    "HouseholderApply",
    "HouseholderApplyNumba",
    "LowRankApply",
    "Muon",
    "Orthogonal",
    "OrthogonalLinear",
    "Polar",
    "QRPositive",
    "StiefelAdam",
    "StiefelSGD",
    "cayley_retraction",
    "cwy",
    "householder_apply",
    "householder_product",
    "orthogonal",
    "orthogonalize",
    "polar",
    "polar_retraction",
    "qr_retraction",
    "tcwy",
]


# -- sequential Householder products ------------------------------------------------------


KERNELS = ("torch", "numba")


def householder_apply(V: Any, h: Any, *, kernel: str = "torch") -> torch.Tensor:
    """H(v₁)(H(v₂)(…H(v_L) h)) by sequential reflections, differentiable by the explicit VJP.

    Parameters
    ----------
    V : Tensor, shape (..., N, L)
        Reflection vectors as columns (L ≤ N); H(0) = I.
    h : Tensor, shape (N,) or (..., N, B) kernel : {"torch", "numba"}
        ``"torch"`` (default): torch operations, one reflection at a time
        (``HouseholderApply``); works on every device, under ``torch.func``, and twice
        differentiable. ``"numba"``: the Numba kernels on CPU tensors, handed over by
        DLPack without copies (``HouseholderApplyNumba``) — much less per-reflection overhead
        for small N·B, but its backward is opaque, hence ``once_differentiable``: first
        derivatives only, no ``torch.func`` transforms.

    Returns
    -------
    Tensor, shape (..., N) or (..., N, B)
        As :func:`householderla.householder_apply` (4·N·L·B flops); the backward replays the
        reflections in forward order, 18·N·L·B flops (Numba: 15·N·L·B) and O(N·B) extra
        memory (Mhammedi et al., ICML 2017, Algorithm 1 with Zhang, Lei & Dhillon, ICML 2018 eq.
        15's full gradient).
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}; got {kernel!r}")
    if kernel == "torch":
        return _householder.householder_apply(V, h)
    xp, _, _, (V, h) = resolve([("V", V), ("h", h)])
    N, _ = check_reflectors(V)
    hm, vector = as_matrix_operand(h, N)
    check_finite_norms(xp.max(xp.abs(V), axis=-2, keepdims=True), xp)
    _check_numba_operands(V, hm)
    y = with_jvp(HouseholderApplyNumba).apply(V, hm)
    return y[..., 0] if vector else y


def _check_numba_operands(V: Any, h: Any) -> None:
    for name, t in (("V", V), ("h", h)):
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            raise ValueError(f"kernel='numba' needs CPU tensors; {name} is not one")
        if is_transformed(t):
            raise ValueError(
                "kernel='numba' is once_differentiable and cannot run under torch.func "
                "transforms; use kernel='torch'"
            )
    if load_numba() is None:  # pragma: no cover - numba is installed here
        raise ValueError("kernel='numba' needs numba installed")


def householder_product(V: Any, *, kernel: str = "torch") -> torch.Tensor:
    """Dense H(v₁)…H(v_L), shape (..., N, N), by sequential reflections (4·N²·L flops),
    differentiable by the explicit VJP (:func:`householder_apply` on the identity)."""
    (V,) = resolve([("V", V)])[3]
    N, _ = check_reflectors(V)
    return householder_apply(V, torch.eye(N, dtype=V.dtype, device=V.device), kernel=kernel)


def __dir__() -> list[str]:
    """Only the public names: the imports above stay attributes but are not listed."""
    return sorted(__all__)
