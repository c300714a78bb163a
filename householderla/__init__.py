"""householderla: orthogonal and Stiefel matrices by Householder reflections.

Compact WY (CWY) and truncated CWY (T-CWY) operators, the oRNN structured parametrization
and the SVD-Householder (svdRNN) map, sequential Householder products (Numba kernels on
NumPy), their constructive inverses, retractions, momentum Stiefel optimizers, and explicit
VJPs of every differentiable map, written once against the Python Array API standard (NumPy,
torch, JAX, array-api-strict, CuPy, ...).

The framework adapters ``householderla.torch``, ``householderla.jax`` and
``householderla.lineax`` are imported on first access, never by ``import householderla``;
without their framework that access raises ``ModuleNotFoundError`` naming the extra to install.
"""

from __future__ import annotations

import importlib as _importlib

from . import stiefel, vjp
from ._kernels import PerformanceWarning
from ._lib.modes import is_deterministic, set_deterministic
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
    "PerformanceWarning",
    "SVDHouseholder",
    "__version__",
    "bounded_sigma",
    "cayley_retraction",
    "cwy",
    "from_lapack",
    "householder_apply",
    "householder_product",
    "householder_vectors",
    "is_deterministic",
    "ornn",
    "ornn_params",
    "polar",
    "polar_retraction",
    "qr_retraction",
    "riemannian_gradient",
    "set_deterministic",
    "stiefel",
    "svd_householder",
    "svd_householder_params",
    "tcwy",
    "tcwy_vectors",
    "vjp",
]

#: lazily imported adapters: (the packages they need, the extra that installs them)
_LAZY_SUBMODULES = {
    "torch": (("torch",), "torch"),
    "jax": (("jax", "jaxlib"), "jax"),
    "lineax": (("lineax", "equinox", "jax", "jaxlib"), "lineax"),
    "peft": (("peft", "transformers", "torch"), "peft"),
}


def __getattr__(name: str) -> object:
    if name not in _LAZY_SUBMODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return _importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        needs, extra = _LAZY_SUBMODULES[name]
        missing = (e.name or "").partition(".")[0]
        if missing not in needs:
            raise  # not a missing framework: a genuine error, unchanged
        *first, last = (p for p in needs if p != "jaxlib")
        what = f"{', '.join(first)} and {last}" if first else last
        why = f" ({missing} cannot be imported)" if first else ""
        raise ModuleNotFoundError(
            f'householderla.{name} needs {what}{why}: pip install "householderla[{extra}]"',
            name=e.name,
        ) from e


def __dir__() -> list[str]:
    return sorted({*__all__, *_LAZY_SUBMODULES})
