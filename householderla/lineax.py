"""householderla for lineax: the operators as ``lineax.AbstractLinearOperator``\\ s, an
``orthogonal_tag`` and a solver that solves with one application of the transpose.

:func:`operator` turns :func:`~householderla.cwy`, :func:`~householderla.tcwy`,
:func:`~householderla.from_lapack` and :func:`~householderla.svd_householder` operators on JAX
(or NumPy) arrays, their transposes and their products into lineax operators, so that
``lineax.linear_solve`` with any of its solvers (``QR``, ``SVD``, ``Normal``, ``LU``, ``GMRES``,
…) runs on them; ``op.mv`` applies the compact WY form (4·N·L flops, never an N×N matrix) and
``op.transpose()`` shares the factors (the plain transpose Aᵀ also for complex A, as lineax's
``MatrixLinearOperator``; ``lx.conj`` conjugates). lineax has no tag for orthogonality:
``orthogonal_tag`` marks an operator A with orthonormal columns or rows (AᴴA = I or AAᴴ = I,
so A⁺ = Aᴴ), which every CWY / T-CWY operator carries, and the :class:`Orthogonal` solver uses
it: x = Aᴴb, the exact solution for a square A, the least-squares one for a tall A and the
minimum-norm one for a wide A, in one product and no factorisation.

Derivatives: lineax differentiates a solve through the JVP of the operator; the factors
(U, T) of a CWY operator get theirs from the explicit rule of
:mod:`householderla._agnostic.compact_wy_jvp` (a ``jax.custom_jvp``), products with (U, T)
are bilinear, so ``jax.grad`` and ``jax.jvp`` of a solve with respect to the reflectors work.
Imported on first access of ``householderla.lineax`` (needs ``lineax``).
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np

from ._agnostic import compact_wy as K
from ._agnostic.compact_wy_jvp import factors_jvp
from ._autodiff.jax import PRECISION
from ._operator.compose import OperatorProduct
from .cwy import CWY, TCWY
from .svd import SVDHouseholder

__all__ = [
    "CWYLinearOperator",
    "Orthogonal",
    "is_orthogonal",
    "operator",
    "orthogonal_tag",
]


class _Tag:
    """A lineax tag: an object with a readable repr, compared by identity."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: Marks a lineax operator A with orthonormal columns or rows (A⁺ = Aᴴ); kept by transposition.
orthogonal_tag = _Tag("orthogonal_tag")


def _keep_orthogonal(tags: frozenset[object]) -> object | None:
    return orthogonal_tag if orthogonal_tag in tags else None


if _keep_orthogonal not in lx.transpose_tags_rules:
    lx.transpose_tags_rules.append(_keep_orthogonal)


# -- the factors with an explicit JVP ---------------------------------------------------------


@jax.custom_jvp
def cwy_factors(V: Any, sdiag: Any) -> tuple[Any, Any]:
    """(U, T) of V (N, L) with S = diag(sdiag) + striu(UᴴU) (sdiag = ½: reflections);
    differentiable in both modes, in V and sdiag, through :func:`factors_jvp`."""
    with jax.default_matmul_precision(PRECISION):
        U, T, _ = K.cwy_factors(V, jnp, check=False, sdiag=sdiag)
    return U, T


@cwy_factors.defjvp
def _cwy_factors_jvp(primals: Any, tangents: Any) -> tuple[Any, Any]:
    with jax.default_matmul_precision(PRECISION):
        return factors_jvp(primals[0], tangents[0], jnp, primals[1], tangents[1])


# -- the operator ----------------------------------------------------------------------------

_TRANSPOSED_MODE = {"square": "square", "embed": "project", "project": "embed"}


class CWYLinearOperator(lx.AbstractLinearOperator):
    """A compact WY operator as a lineax operator. With Q₀ = R − U_out T U_inᴴ (Q = I − U T Uᴴ
    for ``mode="square"``, the T-CWY Ω = [I; 0] − U T U₁ᴴ for ``"embed"``, Ωᴴ for
    ``"project"``) and D = diag(``phase``) (identity when None), it is

        A₀ = Q₀ D  (``transposed=False``)   or   A₀ = Dᴴ Q₀ᴴ  (``transposed=True``),

    and A = conj(A₀) when ``conjugated`` (complex only). ``transpose()`` is the plain
    transpose Aᵀ = conj(A₀ᴴ) (for complex A *not* the inverse: that is
    ``lx.conj(A.transpose())``). Build it with :func:`operator`; U (N, L), T_factor (L, L) and
    phase (cols or rows,) are pytree leaves; mode, the two flags and tags are static."""

    U: Any
    T_factor: Any
    mode: str = eqx.field(static=True)
    transposed: bool = eqx.field(static=True)
    tags: frozenset[object] = eqx.field(static=True)
    phase: Any = None
    conjugated: bool = eqx.field(static=True, default=False)

    def _sizes(self) -> tuple[int, int]:
        """(rows, cols) of the matrix."""
        N, L = self.U.shape[-2], self.T_factor.shape[-1]
        return {"square": (N, N), "embed": (N, L), "project": (L, N)}[self.mode]

    def _apply(self, h: Any) -> Any:
        """A₀ h for h (cols, B), or A₀ for h = None."""
        d = self.phase
        if d is not None and not self.transposed and h is not None:
            h = d[:, None] * h  # Q₀ D h
        with jax.default_matmul_precision(PRECISION):
            y = K.lowrank_apply(
                self.U, self.T_factor, h, jnp, transpose=self.transposed, mode=self.mode
            )
        if d is not None and not self.transposed and h is None:
            y = y * d[None, :]  # Q₀ D: columns scaled
        if d is not None and self.transposed:
            y = jnp.conj(d)[:, None] * y  # Dᴴ Q₀ᴴ: rows scaled
        return y

    def _conj(self, x: Any) -> Any:
        return jnp.conj(x) if self.conjugated else x

    def mv(self, vector: Any) -> Any:
        """The product with a vector (cols,): 4·N·L + L² flops (+ cols for the phases);
        conj(A₀ conj(x)) for a conjugated operator."""
        return self._conj(self._apply(self._conj(vector)[:, None])[:, 0])

    def as_matrix(self) -> Any:
        """The dense (rows, cols) matrix: 2·N²·L flops for CWY, 2·N·L² for T-CWY."""
        return self._conj(self._apply(None))

    def transpose(self) -> CWYLinearOperator:
        """The plain transpose Aᵀ, sharing the factors: the inverse of a real square operator;
        for complex ones conj(A₀ᴴ) (the inverse is its conjugate, ``lx.conj``)."""
        return CWYLinearOperator(
            self.U,
            self.T_factor,
            _TRANSPOSED_MODE[self.mode],
            not self.transposed,
            lx.transpose_tags(self.tags),
            self.phase,
            self.conjugated ^ _is_complex(self.U),
        )

    def conj(self) -> CWYLinearOperator:
        """The complex conjugate conj(A) (A itself for a real operator); ``lx.conj``."""
        flip = _is_complex(self.U)
        return CWYLinearOperator(
            self.U,
            self.T_factor,
            self.mode,
            self.transposed,
            self.tags,
            self.phase,
            self.conjugated ^ flip,
        )

    def in_structure(self) -> Any:
        return jax.ShapeDtypeStruct((self._sizes()[1],), self.U.dtype)

    def out_structure(self) -> Any:
        return jax.ShapeDtypeStruct((self._sizes()[0],), self.U.dtype)

    def diagonal(self) -> Any:
        """The leading min(rows, cols) diagonal entries without the N×N matrix: those of
        R − U_out M U_inᴴ are 1 − rowsum((U M) ∘ conj(U)) over the rows that meet the
        diagonal (M = T, or Tᴴ transposed), times dₖ (Q₀ D) or conj(dₖ) (Dᴴ Q₀ᴴ), conjugated
        for a conjugated operator: 2·N·L² flops."""
        k = min(self._sizes())
        M = jnp.conj(self.T_factor.mT) if self.transposed else self.T_factor
        Uk = self.U[:k]  # the rows of U_out and U_in that meet the diagonal, in every mode
        with jax.default_matmul_precision(PRECISION):
            diag = 1 - jnp.sum((Uk @ M) * jnp.conj(Uk), axis=-1)
        if self.phase is not None:
            d = self.phase[:k]
            diag = diag * (jnp.conj(d) if self.transposed else d)
        return self._conj(diag)


def _is_complex(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jnp.complexfloating)


def _false(operator: Any) -> bool:
    return False


def _itself(operator: Any) -> Any:
    return operator


lx.linearise.register(CWYLinearOperator, _itself)
lx.materialise.register(CWYLinearOperator, _itself)
lx.conj.register(CWYLinearOperator, lambda op: op.conj())
lx.diagonal.register(CWYLinearOperator, lambda op: op.diagonal())
lx.tridiagonal.register(
    CWYLinearOperator, lambda op: lx.tridiagonal(lx.MatrixLinearOperator(op.as_matrix()))
)
lx.is_symmetric.register(CWYLinearOperator, lambda op: lx.symmetric_tag in op.tags)
for _query in (
    lx.is_diagonal,
    lx.is_tridiagonal,
    lx.has_unit_diagonal,
    lx.is_lower_triangular,
    lx.is_upper_triangular,
    lx.is_positive_semidefinite,
    lx.is_negative_semidefinite,
):
    _query.register(CWYLinearOperator, _false)


# -- from householderla operators ----------------------------------------------------------------


def _jax_array(x: Any, what: str) -> Any:
    if isinstance(x, (jax.Array, np.ndarray)):
        return jnp.asarray(x)
    raise TypeError(
        f"{what} holds {type(x).__module__}.{type(x).__name__} arrays; lineax operators need "
        "JAX (or NumPy) arrays"
    )


def _cwy_operator(op: CWY | TCWY, dtype: Any = None) -> CWYLinearOperator:
    """The lineax operator of ``op`` (its factors in ``dtype``, default ``op.dtype``): Q₀ from
    V and the diagonal ``sdiag`` of S (``from_lapack``'s reflectors, ½ otherwise), the phases
    of ``theta=``, and the (conjugate) transpose / conjugate flags."""
    V = _jax_array(op.V, "the operator")
    if V.ndim != 2:
        raise ValueError(
            f"a batched operator (shape {tuple(op.shape)}) is not one lineax operator: build "
            "one per matrix, e.g. under jax.vmap"
        )
    dtype = op.dtype if dtype is None else dtype
    V = V if V.dtype == dtype else V.astype(dtype)
    f = op._factors
    if f.sdiag is None:
        sdiag = jnp.full((V.shape[-1],), 0.5, dtype=V.real.dtype)
    else:
        sdiag = _jax_array(f.sdiag, "the operator")
    U, T = cwy_factors(V, sdiag)
    phase = None if f.phase is None else _jax_array(f.phase, "the operator").astype(dtype)
    mode = "embed" if isinstance(op, TCWY) else "square"
    if op.transposed:
        mode = _TRANSPOSED_MODE[mode]
    return CWYLinearOperator(
        U, T, mode, op.transposed, frozenset([orthogonal_tag]), phase, op._conjugated
    )


def _adjoint(A: Any) -> Any:
    """Aᴴ = conj(Aᵀ) of a lineax operator."""
    return lx.conj(A.transpose())


def _sigma_operator(diag: Any, m: int, n: int, dtype: Any) -> Any:
    """Σ (m × n) with ``diag`` leading (σ, or σ·e^{iθ}), as a lineax operator on vectors of
    ``dtype`` (c ↦ pad(diag ⊙ c[:r]))."""
    r = diag.shape[-1]
    diag = diag.astype(dtype)

    def apply(c: Any) -> Any:
        y = diag * c[:r]
        return jnp.concatenate([y, jnp.zeros((m - r,), y.dtype)]) if m > r else y

    return lx.FunctionLinearOperator(apply, jax.ShapeDtypeStruct((n,), dtype))


def _svd_operator(op: SVDHouseholder) -> Any:
    """W = Q_L diag(σ·e^{iθ}) Q_Rᴴ (conjugated for ``op.conj()`` and complex ``op.T``)."""
    sigma = _jax_array(op.sigma, "the operator")
    if sigma.ndim != 1:
        raise ValueError(
            f"a batched operator (shape {tuple(op.shape)}) is not one lineax operator: "
            "build one per matrix, e.g. under jax.vmap"
        )
    m, n, dtype = op.shape[-2], op.shape[-1], op.dtype
    Q_L, Q_R = _cwy_operator(op.Q_U, dtype), _cwy_operator(op.Q_V, dtype)
    diag = _jax_array(op._diag, "the operator")
    W = Q_L @ _sigma_operator(diag, m, n, dtype) @ _adjoint(Q_R)
    return lx.conj(W) if op._conj else W


def operator(op: Any) -> lx.AbstractLinearOperator:
    """A lineax operator equal to the householderla operator ``op``.

    Parameters
    ----------
    op : CWY, TCWY, SVDHouseholder or a product of them
        From :func:`~householderla.cwy`, :func:`~householderla.tcwy`,
        :func:`~householderla.from_lapack`, :func:`~householderla.svd_householder` (or their
        ``.T``, ``.H``, ``.conj()``, or ``A @ B``), real or complex, with or without phases
        ``theta``, holding JAX (or NumPy) arrays, one matrix (no batch axes: use
        ``jax.vmap`` for a batch).

    Returns
    -------
    lineax.AbstractLinearOperator
        CWY / T-CWY: a :class:`CWYLinearOperator` (vectors (cols,) in, (rows,) out) tagged
        ``orthogonal_tag``; W = Q_U D(θ) Σ Q_Vᴴ: the composition of the two CWY operators and
        Σ; a product: the composition of its factors. ``mv`` costs what ``op @ x`` costs;
        ``transpose()`` is the plain transpose (``op.T``), ``lx.conj`` the conjugate.

    Notes
    -----
    Q = I − U T Uᴴ, T = S⁻¹, S = ½I + striu(UᴴU) (Likhosherstov et al., AISTATS 2021,
    Theorems 2 and 3; ``from_lapack``'s complex reflectors replace the ½ by 1/(τ‖v‖²)); the
    factors are computed when the lineax operator is built (N·L² + L³/3 flops), with the
    explicit JVP dT = −T dS T for lineax's derivatives.

    Examples
    --------
    >>> import jax.numpy as jnp, lineax as lx, numpy as np, householderla as hl
    >>> V = jnp.asarray(np.random.default_rng(0).standard_normal((6, 3)), dtype=jnp.float32)
    >>> A = hl.lineax.operator(hl.cwy(V))
    >>> b = jnp.arange(6.0, dtype=jnp.float32)
    >>> x = lx.linear_solve(A, b, hl.lineax.Orthogonal()).value   # x = Qᵀ b, one product
    >>> bool(jnp.allclose(A.mv(x), b, atol=1e-5))
    True
    """
    if isinstance(op, (CWY, TCWY)):
        return _cwy_operator(op)
    if isinstance(op, SVDHouseholder):
        return _svd_operator(op)
    if isinstance(op, OperatorProduct):
        return operator(op.left) @ operator(op.right)
    raise TypeError(
        f"operator() takes a householderla operator (cwy, tcwy, from_lapack, svd_householder "
        f"or their products); got {type(op).__name__}"
    )


# -- orthogonality -------------------------------------------------------------------------------


def is_orthogonal(operator: lx.AbstractLinearOperator) -> bool:
    """Whether ``operator`` is known to have orthonormal columns or rows (A⁺ = Aᴴ): tagged
    ``orthogonal_tag`` (any lineax operator with ``tags``, e.g. a ``MatrixLinearOperator``), or
    a composition of two such square operators."""
    if isinstance(operator, lx.ComposedLinearOperator):
        parts = (operator.operator1, operator.operator2)
        return all(is_orthogonal(p) and p.in_size() == p.out_size() for p in parts)
    return orthogonal_tag in getattr(operator, "tags", ())


class Orthogonal(lx.AbstractLinearSolver):
    """Solve A x = b by x = Aᴴ b (Aᵀ b for real A) for an operator with orthonormal columns or
    rows.

    For such an A (``is_orthogonal``: tagged ``orthogonal_tag``, as every CWY / T-CWY operator
    from :func:`operator` is) the pseudo-inverse is A⁺ = Aᴴ: the exact solution of a square
    system, the least-squares solution of a tall one, the minimum-norm solution of a wide one.
    One product with the adjoint (4·N·L flops for a CWY operator), no factorisation;
    ``init`` raises ``ValueError`` for an operator not known to be orthogonal.
    """

    def init(self, operator: Any, options: dict[str, Any]) -> Any:
        del options
        if not is_orthogonal(operator):
            raise ValueError(
                "Orthogonal() needs an operator with orthonormal columns or rows, tagged "
                "householderla.lineax.orthogonal_tag (operators from hl.lineax.operator of "
                f"cwy/tcwy/from_lapack are); got {type(operator).__name__}"
            )
        return _adjoint(operator)  # A⁺ = Aᴴ (Aᵀ for a real A)

    def compute(self, state: Any, vector: Any, options: dict[str, Any]) -> Any:
        del options
        return state.mv(vector), lx.RESULTS.successful, {}

    def transpose(self, state: Any, options: dict[str, Any]) -> Any:
        return state.transpose(), options

    def conj(self, state: Any, options: dict[str, Any]) -> Any:
        return lx.conj(state), options

    def assume_full_rank(self) -> bool:
        return True


def __dir__() -> list[str]:
    """Only the public names: the imports above stay attributes but are not listed."""
    return sorted(__all__)
