"""The plain rule table: backend-neutral forwards with nothing recorded for autodiff
(NumPy, array-api-strict, CuPy, Dask, torch without grad). Signatures: see
:mod:`householderla._autodiff`."""

from __future__ import annotations

from typing import Any

from .._agnostic import compact_wy as K
from .._agnostic import retraction as RK
from .._agnostic.newton_schulz import polar_forward
from .._agnostic.reflections import reflect_all


def cwy_factors(xp: Any, V: Any, sdiag: Any = None) -> tuple[Any, Any, Any]:
    return K.cwy_factors(V, xp, check=False, sdiag=sdiag)


def lowrank(xp: Any, U: Any, T: Any, h: Any, transpose: bool, mode: str, out: Any = None) -> Any:
    return K.lowrank_apply(U, T, h, xp, transpose=transpose, mode=mode, out=out)


def householder_apply(xp: Any, V: Any, h: Any) -> Any:
    return reflect_all(K.normalize_columns(V, xp)[0], h, xp)


def polar(xp: Any, X: Any, num_iters: Any, restart: Any) -> tuple[Any, dict[str, Any]]:
    return polar_forward(X, xp, num_iters, restart)


def cayley(xp: Any, X: Any, Z: Any, step: Any) -> tuple[Any, Any]:
    return RK.cayley_along(X, Z, step, xp)


def qr_q(xp: Any, Y: Any) -> Any:
    return RK.qr_positive(Y, xp)[0]


RULES = {
    "cwy_factors": cwy_factors,
    "lowrank": lowrank,
    "householder_apply": householder_apply,
    "polar": polar,
    "cayley": cayley,
    "qr_q": qr_q,
}
