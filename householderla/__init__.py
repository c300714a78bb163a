"""householderla: orthogonal and Stiefel matrices by Householder reflections.

Compact WY (CWY) and truncated CWY (T-CWY) operators, the oRNN structured parametrization
and the SVD-Householder (svdRNN) map, sequential Householder products (Numba kernels on
NumPy), their constructive inverses, retractions, momentum Stiefel optimizers, and explicit
VJPs of every differentiable map, written once against the Python Array API standard (NumPy,
torch, JAX, array-api-strict, CuPy, ...).

The framework adapters ``householderla.torch`` and ``householderla.jax`` are imported on
first access, never by ``import householderla``.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import stiefel, vjp
from .cwy import CWY, TCWY, cwy, tcwy
from .householder import (
    householder_apply,
    householder_product,
    householder_vectors,
    tcwy_vectors,
)
from .lapack import from_lapack
from .ornn import ornn, ornn_params
from .retractions import (
    cayley_retraction,
    polar,
    polar_retraction,
    qr_retraction,
    riemannian_gradient,
)
from .svd import SVDHouseholder, bounded_sigma, svd_householder, svd_householder_params

__version__ = "0.1.0"

__all__ = [
    "CWY",
    "TCWY",
    "SVDHouseholder",
    "__version__",
    "bounded_sigma",
    "cayley_retraction",
    "cwy",
    "from_lapack",
    "householder_apply",
    "householder_product",
    "householder_vectors",
    "ornn",
    "ornn_params",
    "polar",
    "polar_retraction",
    "qr_retraction",
    "riemannian_gradient",
    "stiefel",
    "svd_householder",
    "svd_householder_params",
    "tcwy",
    "tcwy_vectors",
    "vjp",
]

_LAZY_SUBMODULES = {"torch", "jax", "lineax"}


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
