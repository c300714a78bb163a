"""The explicit JVP of the CWY factors V ↦ (U, T) (``_agnostic/compact_wy_jvp.py``), which the
lineax operators use for their derivatives.

Two checks on every backend, in float64: against central differences of the factors
(ε = 1e-6: truncation O(ε²) and rounding O(eps/ε) stay ≲ 1e-9 relative to the tangent's
size; bound 1e-7, a wrong term is off by O(1)), and the dot-product test against the
explicit VJP :func:`householderla.vjp.cwy_factors` (⟨J dV, (Ū, T̄)⟩ = ⟨dV, Jᵀ(Ū, T̄)⟩ to
rounding: a few hundred eps for these sizes; bound 1e-12 relative).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import to_numpy

import householderla as hl
from householderla._agnostic.compact_wy import cwy_factors
from householderla._agnostic.compact_wy_jvp import factors_jvp

pytestmark = pytest.mark.no_dask("the factors of V take no Dask operand")


def _V(rng: np.random.Generator, shape: tuple[int, ...], zero: int | None) -> np.ndarray:
    V = rng.standard_normal(shape)
    if zero is not None:
        V[..., zero] = 0.0  # H(0) = I: its column has tangent 0
    return V


@pytest.mark.parametrize(("shape", "zero"), [((7, 4), None), ((2, 6, 6), 2), ((5, 1), None)])
def test_factors_jvp_matches_central_differences(bk, shape, zero):
    rng = np.random.default_rng(sum(shape))
    V, dV = _V(rng, shape, zero), rng.standard_normal(shape)
    if zero is not None:
        dV[..., zero] = 0.0  # a zero column stays the non-differentiable point 0
    fwd = bk.call(lambda a, b: factors_jvp(a, b, bk.xp), bk.asarray(V), bk.asarray(dV))
    (U, T), (dU, dT) = [[to_numpy(a) for a in pair] for pair in fwd]
    U0, T0, _ = cwy_factors(V, np, check=False)
    np.testing.assert_allclose(U, U0, atol=1e-14)
    np.testing.assert_allclose(T, T0, atol=1e-13)
    eps = 1e-6
    Up, Tp, _ = cwy_factors(V + eps * dV, np, check=False)
    Um, Tm, _ = cwy_factors(V - eps * dV, np, check=False)
    scale = 1.0 + np.abs(dT).max()
    np.testing.assert_allclose(dU, (Up - Um) / (2 * eps), atol=1e-7 * scale)
    np.testing.assert_allclose(dT, (Tp - Tm) / (2 * eps), atol=1e-7 * scale)
    if zero is not None:
        assert np.all(dU[..., zero] == 0.0)


def test_factors_jvp_is_the_transpose_of_the_vjp(bk):
    rng = np.random.default_rng(11)
    V, dV = _V(rng, (9, 5), 3), rng.standard_normal((9, 5))
    Ub, Tb = rng.standard_normal((9, 5)), rng.standard_normal((5, 5))
    (_, _), (dU, dT) = bk.call(lambda a, b: factors_jvp(a, b, bk.xp), bk.asarray(V), bk.asarray(dV))
    Vb = hl.vjp.cwy_factors(V, Ub, Tb)
    lhs = np.sum(to_numpy(dU) * Ub) + np.sum(to_numpy(dT) * Tb)
    rhs = np.sum(dV * Vb)
    assert abs(lhs - rhs) <= 1e-12 * (abs(lhs) + np.linalg.norm(dV) * np.linalg.norm(Vb))
