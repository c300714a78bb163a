"""Momentum Stiefel optimizers by operator splitting (Kong, Wang & Tao, ICLR 2023).

Functional, optax-style: ``opt = momentum_sgd(...)`` or ``opt = adam(...)`` is a frozen pair of
pure functions, ``state = opt.init(X)`` and ``X, state = opt.update(X, G, state)``, with ``G``
the Euclidean gradient ∂f/∂X. The state is a NamedTuple of arrays in X's namespace, device and
dtype (a JAX pytree, so ``update`` runs under ``jax.jit``). Everything is batched over leading
dimensions: one manifold St(N, M) per matrix, every moment per matrix.

Notation (Kong, Wang & Tao, ICLR 2023, §2, App. M.4–M.5): a < 1 is the metric parameter of
Definition 1 (a = ½ canonical, a = 0 Euclidean), b = a/(a − 1), c = (1 − b)/2 = 1/(2(1 − a)), d =
(3a − 2)/2; η is ``lr``, μ ``momentum``. The momentum Q = XY + V (eq. 8) is stored rescaled as Z
(M×M, skew) and U (N×M, XᵀU = 0). float32 input is computed in the library's accumulation dtype
(float64 on CPU backends) and rounded once per step. The mathematics, the product count and the
large-step analysis are in ``docs/theory/stiefel.rst``.

Complex X (complex64/complex128) runs the same splitting on the complex Stiefel manifold
{X ∈ ℂ^{N×M} : XᴴX = I} (U(N) for M = N) with every transpose Hermitian: Z is skew-Hermitian,
XᴴU = 0, G is the gradient ∂L/∂Re X + i ∂L/∂Im X (torch's ``.grad``; the conjugate of
``jax.grad``'s), and Adam's second moments are the real ``|f|²``, ``|g|²``
(``docs/theory/stiefel.rst``, "Complex Stiefel manifold and U(n)"). complex64 is computed in
complex128 on CPU backends.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import array_api_compat as aac

from ._agnostic.euclidean import (
    EuclideanAdamState,
    EuclideanAMSGradState,
    EuclideanMomentumState,
    euclidean_adam,
    euclidean_sgd,
)
from ._agnostic.newton_schulz import polar_impl, polar_maxima, polar_qr_svd
from ._agnostic.stiefel_flow import (
    AdamState,
    AMSGradState,
    MomentumState,
    StiefelOptimizer,
    cast,
    expm_skew,
    herm,
    init_arrays,
    inner_re,
    metric_a,
    momentum_rotation,
    prepare,
)
from ._agnostic.stiefel_guards import check_powers, check_step, momentum_growth
from ._lib.checks import RankDeficientError, check_choice, check_real
from ._lib.jit import eager_program, host, kernel_namespace, select
from ._lib.linalg import abs2
from ._lib.namespace import accumulation_dtype_for, mH, real_dtype
from ._lib.rows import LOCAL, Rows, block_max
from ._lib.tracing import is_eager
from .retractions import polar

__all__ = [
    "AMSGradState",
    "AdamState",
    "EuclideanAMSGradState",
    "EuclideanAdamState",
    "EuclideanMomentumState",
    "MomentumState",
    "StiefelOptimizer",
    "adam",
    "euclidean_adam",
    "euclidean_sgd",
    "expm_skew",
    "momentum_sgd",
]

#: Approximations of the M×M matrix exponentials of φ̄₁ and φ̄₂ (Kong, Wang & Tao, ICLR 2023 App.
# M.2).
EXPM_METHODS = ("euler", "cayley", "expm")
#: U-update of φ̄₃: "energy" rescales forward Euler to keep ‖U‖_F (the default), "euler" is
#: the printed forward Euler step (diverges at large steps; docs/theory/stiefel.rst).
TRANSPORTS = ("energy", "euler")


def _one_program(xp: Any, rows: Rows, *arrays: Any) -> bool:
    """Eager JAX arrays on one process: the step runs as one compiled program
    (:func:`~householderla._lib.jit.eager_program`; its range checks after it, as eager)."""
    if not aac.is_jax_namespace(xp) or rows.sharded:
        return False
    import jax

    return all(is_eager(leaf) for leaf in jax.tree_util.tree_leaves(arrays))


def _polar(X: Any, xp: Any, rows: Rows, maxima: Any = None) -> Any:
    """polar(X) with ``rank_deficient="svd"``; for a row-sharded X (``rows``) its rows of
    the polar factor of the whole matrix (the maxima and Gram matrices reduced over the
    blocks, the QR fallback by TSQR; ``maxima``: :func:`polar_maxima`, already reduced)."""
    if not rows.sharded:
        return polar(X, rank_deficient="svd", xp=xp)
    try:
        return polar_impl(X, xp, rows=rows, maxima=maxima)[0]
    except RankDeficientError:  # X is in the work dtype here: polar_qr_svd's
        return polar_qr_svd(X, kernel_namespace(xp), rows)[0]


def _project_first(X: Any, count: Any, xp: Any, rows: Rows) -> Any:
    """polar(X) on the first step (count == 0), X afterwards (Kong, Wang & Tao, ICLR 2023 App. P.1:
    any full-rank
    start; the iteration preserves the structure only from a point of St)."""
    eager = is_eager(X) and is_eager(count)
    return select(xp, eager, count == 0, lambda: _polar(X, xp, rows), lambda: X)


def _reduce_first(A: Any, G: Any, xp: Any, rows: Rows) -> tuple[Any, Any]:
    """XᴴG summed over the row blocks, and max |G| over them (None for one block): the step's
    first round. A NaN or Inf in any block's G raises on every process (the sum of the
    one-hot maxima keeps it: ``householderla._interop.torch_distributed``); traced (a JAX
    mesh) it propagates, as under ``jax.jit`` on one device."""
    if not rows.sharded:
        return A, None
    (A,), (g_max,) = rows.reduce([A], [block_max(G, xp, (-2, -1))])
    if is_eager(g_max) and not math.isfinite(host(xp.max(g_max))):
        raise ValueError("G contains NaN or Inf")
    return A, g_max


def _phi3(
    X: Any,
    R: Any,
    U_half: Any,
    U_step: Any,
    B: Any,
    lr: float,
    transport: str,
    xp: Any,
    hermitian: bool = False,
    rows: Rows = LOCAL,
    guard: Any = None,
) -> tuple[Any, Any]:
    """φ̄₃ after φ̃₁ (X½ = XR) for X ∈ St: (X⁺, U⁺).

    X† = XR + ηŨ, X⁺ = polar(X†); U⁺ = k (U½ − X R S⁻¹(ηB)) with S = RᴴR (= X½ᴴX½ for
    XᴴX = I: the Gram shortcut), B = ŨᴴU½, Ũ = ``U_step`` (U½ for Algorithm 1). Then
    X†ᴴ(U½ − X½S⁻¹ηB) = X½ᴴU½ = 0 exactly (B made Hermitian when ``hermitian``). k = 1
    (``"euler"``) or k = ‖U½‖_F/‖U½ − …‖_F (``"energy"``): the exact flow of eq. 11 keeps
    VᴴV, forward Euler adds η²BᴴS⁻¹B to it. N×M×M products: X R, X·(R S⁻¹ηB),
    and the two of ``polar``.

    Row-sharded X (``rows``): ``B`` is this block's part and ``guard`` = (this block's max
    |U½|, the range check to run on the reduced one) or None; B, ‖U½‖²_F, that max and the maxima of
    ``polar`` are reduced in one round, ``polar``'s Gram matrix in the next.
    """
    Y = X @ R + lr * U_step
    e0 = inner_re(U_half, U_half, xp) if transport == "energy" else None
    maxima = None
    if rows.sharded:
        sums = [B] if e0 is None else [B, e0]
        sums, maxima = rows.reduce(sums, [*(guard[:1] if guard else ()), *polar_maxima(Y, xp)])
        if guard is not None:
            guard[1](maxima.pop(0))
        B, e0 = sums[0], (sums[1] if e0 is not None else None)
    if hermitian:
        B = herm(B, xp)
    S = herm(mH(R, xp) @ R, xp)
    SiB = xp.linalg.solve(S, lr * B)
    X_next = _polar(Y, xp, rows, maxima)
    U_next = U_half - X @ (R @ SiB)
    if transport == "energy":
        e1 = e0 + inner_re(lr * B, SiB, xp)  # ‖U½ − X R S⁻¹ηB‖² for XᴴU½ = 0
        pos = e1 > 0
        one = xp.ones_like(e0)
        k = xp.sqrt(xp.where(pos, e0, one) / xp.where(pos, e1, one))
        U_next = k[..., None, None] * U_next
    return X_next, U_next


def momentum_sgd(
    lr: float = 0.1,
    momentum: float = 0.9,
    metric: Any = 0.5,
    *,
    expm_method: str = "euler",
    transport: str = "energy",
    nesterov: bool = False,
    dampening: float = 0.0,
    rows: Rows = LOCAL,
    xp: Any = None,
) -> StiefelOptimizer:
    """Momentum (S)GD on St(N, M) by the splitting integrator φ̄₃ ∘ φ̃₁ ∘ φ̄₂ (Kong, Wang & Tao,
    ICLR 2023 Algorithm 1; Algorithm 4 for M = N).

    Parameters
    ----------
    lr : float
        η ≥ 0 (the paper's rescaled learning rate, App. M.4: η = h(1 − e^{−γh})/γ; 0, as a
        scheduler may reach, moves nothing).
    momentum : float
        μ = e^{−γh} ∈ [0, 1).
    metric : float or str
        a < 1 of the canonical-type metric (Definition 1): 0.5 (``"canonical"``, default) or
        0 (``"euclidean"``) or any other a < 1.
    expm_method : {"euler", "cayley", "expm"}
        How the M×M exponentials of φ̄₁ (expm(ηZ)) and φ̄₂ (the VY rotation) are
        approximated (App. M.2): forward Euler (default, Theorem 6), the Cayley transform
        (eq. 32–33) or the exponential itself. All three cost the same N×M×M products.
    transport : {"energy", "euler"}
        U-update of φ̄₃. ``"energy"`` (default) rescales the forward-Euler update so that
        ‖U⁺‖_F = ‖U½‖_F, as the exact flow of eq. 11 does; ``"euler"`` is the printed update,
        which diverges at large steps (lr ≳ 0.2 on App. Q; see Notes).
    nesterov : bool
        Move X with the look-ahead momentum, as ``torch.optim.SGD(nesterov=True)``: R from
        μZ⁺ − f and X† = XR + η(μU½ − g); the momentum state is that of the plain method.
        Both look-ahead terms are skew / normal to X, so the structure is kept (Theorems
        4–6 apply to the step as to any (Z, U) of that structure).
    dampening : float
        τ ∈ [0, 1): the force enters the momentum as (1 − τ)f, (1 − τ)g (torch's
        ``dampening``; its first step undamped, as torch's buffer starts at the gradient).
    rows : Rows, optional
        X (and G, and the state's U) are this process's row block of matrices sharded by
        rows across processes, and ``rows`` reduces over the blocks (eager NumPy or torch;
        :mod:`householderla._interop.torch_distributed` for ``torch.distributed``, which
        :class:`householderla.torch.StiefelSGD` uses for row-sharded DTensors; traced JAX
        inside ``jax.shard_map``, as :func:`householderla.jax.stiefel_sgd` runs it with
        ``row_axis``). Every
        product over the rows of X becomes a sum of M×M matrices: 3 rounds of communication
        per step, O(M²) numbers each (``docs/distributed.rst``). Default: X is whole.
    xp : namespace, optional
        Force this array namespace in ``init`` and ``update``.

    Returns
    -------
    StiefelOptimizer
        ``init(X) -> MomentumState`` (U = 0, Z = 0, count = 0) and
        ``update(X, G, state) -> (X_next, state_next)``.

    Notes
    -----
    One step from (X, U, Z), G = ∂f/∂X, c = (1 − b)/2 = 1/(2(1 − a)), d = (3a − 2)/2:

    0. First step only (count = 0): X ← polar(X), so any full-rank start works (App. P.1).
    1. A = XᵀG, f = c(A − Aᵀ), g = G − XA (line 2).
    2. φ̄₂ (eq. 34): U½ = U L − g, L = μI + dηZ (``"euler"``; μ·cayley/expm(dηZ) else).
    3. φ̃₁ (Theorem 6): Z⁺ = μZ − f, X½ = XR with R = I + ηZ⁺ (or its Cayley/expm).
    4. φ̄₃ (eq. 13): X⁺ = polar(XR + ηU½), U⁺ = k(U½ − ηX R S⁻¹C), S = RᵀR, C = U½ᵀU½.

    Step 4 puts the factor X½ᵀX½ = S of eq. 13 on the U-update instead of X† (X† = X½ +
    ηU½S in the paper): equal for S = I (Cayley/expm, or Z = 0), the same first order
    otherwise (S = I − η²Z⁺²), and X⁺ᵀU⁺ = 0 by the same one-line proof; it saves one
    N×M×M product. Two printed-algorithm details follow the equations (docs/theory/stiefel):
    the sign of the UZ term is + (eq. 8, 14, 34, M.4), and X½ uses Z⁺ (Theorem 6, M.4,
    Algorithms 2 and 4).

    **Cost:** 8 N×M×M products per step — XᵀG, XA, UL, U½ᵀU½, XR, X·(RS⁻¹ηC) and the Gram
    and final product of :func:`~householderla.polar` — plus O(M³); the polar step adds 2
    (its restart) when κ(X†ᵀX†) ≳ 7 (large steps) or in float32 on accelerators. The
    paper's reference code takes 10 plus 24 M×M products (App. C). For M = N: XᵀG, XR and
    the polar step, whose Newton–Schulz iterations are then N×N products too.

    **Large steps.** With ``transport="energy"`` φ̄₃ keeps ‖U‖_F, so ‖U⁺‖_F ≤ ‖L‖₂‖U‖_F +
    ‖g‖_F: with ``expm_method`` "cayley"/"expm" ‖L‖₂ = μ and U stays bounded by
    sup‖g‖_F/(1 − μ) at every lr; with "euler" ‖L‖₂ = (μ² + d²η²‖Z‖₂²)^{1/2} (= μ when
    XᵀG is symmetric, as on App. Q). Structure (Theorems 4–6): XᵀX = I, Z skew, XᵀU = 0 after
    every step, up to rounding.

    **Complex X** (the complex Stiefel manifold XᴴX = I; U(N) for M = N): every ᵀ above is
    ᴴ, Z is skew-Hermitian, and G must be complex, ∂f/∂Re X + i ∂f/∂Im X (torch's ``.grad``;
    conjugate ``jax.grad``'s output). The step is the real step on the real representation
    [[Re X, −Im X], [Im X, Re X]] (``docs/theory/stiefel.rst``), so the structure is kept
    alike; "cayley" and "expm" are unitary, "euler" is not (the polar step corrects X).

    Examples
    --------
    >>> import numpy as np, householderla as hl
    >>> rng = np.random.default_rng(0)
    >>> B = rng.standard_normal((6, 6)); A = (B + B.T) / 2 / np.sqrt(6)
    >>> opt = hl.stiefel.momentum_sgd(lr=0.1, momentum=0.9)
    >>> X = np.linalg.qr(rng.standard_normal((6, 2)))[0]; state = opt.init(X)
    >>> for _ in range(300):
    ...     X, state = opt.update(X, -2 * A @ X, state)   # f(X) = -tr(XᵀAX)
    >>> bool(np.isclose(np.trace(X.T @ A @ X), np.linalg.eigvalsh(A)[-2:].sum()))
    True
    """
    lr = check_real("lr", lr, 0.0, math.inf)  # lr = 0: a scheduler's last step
    mu = check_real("momentum", momentum, 0.0, 1.0)
    tau = check_real("dampening", dampening, 0.0, 1.0)
    if nesterov and (mu <= 0.0 or tau != 0.0):
        raise ValueError("Nesterov momentum requires a momentum and zero dampening")
    a = metric_a(metric)
    method = check_choice("expm_method", expm_method, EXPM_METHODS)
    transport = check_choice("transport", transport, TRANSPORTS)
    c, d = 0.5 / (1.0 - a), 0.5 * (3.0 * a - 2.0)
    fixed_xp = xp
    # the float hyperparameters (and their products, rounded once as the constants would be)
    # are the step's values, not its constants: on eager JAX, optimizers that differ only in
    # them share one compiled program (a scheduled lr compiles nothing new)
    hyper = (lr, mu, tau, d * lr)
    damped = tau != 0.0

    def init(X: Any) -> MomentumState:
        return init_arrays(X, fixed_xp, adam=False, rows=rows)

    def update(X: Any, G: Any, state: MomentumState) -> tuple[Any, MomentumState]:
        xp, X, G, dtype = prepare(X, G, state, fixed_xp, rows)
        if _one_program(xp, rows, X, G, state):
            key = ("momentum_sgd", damped, nesterov, a, method, transport)
            return eager_program(key, step, (0, 1), xp, dtype, hyper, X, G, state)
        return step(xp, dtype, hyper, X, G, state)

    def step(
        xp: Any, dtype: Any, hyper: tuple, X: Any, G: Any, state: MomentumState
    ) -> tuple[Any, Any]:
        lr, mu, tau, d_lr = hyper
        X = _project_first(X, state.count, xp, rows)
        work = accumulation_dtype_for(xp, X)
        X, G, U, Z = cast(xp, work, X, G, state.U, state.Z)
        if damped:  # torch's buffer starts at the gradient: the first step is undamped
            G = G * (1.0 - tau * xp.astype(state.count > 0, G.dtype))
        A = _reduce_first(mH(X, xp) @ G, G, xp, rows)[0]
        f = c * (A - mH(A, xp))
        Z_next = mu * Z - f
        eager = is_eager(X)
        step = lr * (mu * Z_next - f if nesterov else Z_next)
        check_step("momentum_sgd", step, xp, eager)
        R = expm_skew(step, method, xp)
        if X.shape[-1] == rows.total(X.shape[-2]):  # SO(n): g = 0, no U (Algorithm 4)
            X_next, U_next = _polar(X @ R, xp, rows), U
        else:
            g = G - X @ A
            U_half = U @ momentum_rotation(Z, mu, d_lr, method, xp) - g
            why = momentum_growth(method)
            guard = None
            if rows.sharded:  # checked in _phi3's round, before anything uses its sums
                guard = (block_max(U_half, xp, (-2, -1)), partial(
                    check_powers, "momentum_sgd", "the momentum U", U_half, 4, why, xp, eager, rows
                ))  # fmt: skip
            else:
                check_powers("momentum_sgd", "the momentum U", U_half, 4, why, xp, eager)
            U_step = mu * U_half - g if nesterov else U_half
            C = mH(U_step, xp) @ U_half  # ŨᴴU½ (Hermitian, and made so, without Nesterov)
            X_next, U_next = _phi3(
                X, R, U_half, U_step, C, lr, transport, xp, not nesterov, rows, guard
            )
        X_next, U_next, Z_next = cast(xp, dtype, X_next, U_next, Z_next)
        return X_next, MomentumState(state.count + 1, U_next, Z_next)

    return StiefelOptimizer(init, update)


def adam(
    lr: float = 1e-3,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    metric: Any = 0.5,
    *,
    expm_method: str = "euler",
    transport: str = "energy",
    amsgrad: bool = False,
    rows: Rows = LOCAL,
    xp: Any = None,
) -> StiefelOptimizer:
    """Adam on St(N, M) by the splitting φ̂₃ ∘ φ̂₁ ∘ φ̂₂ (Kong, Wang & Tao, ICLR 2023, Algorithm 2,
    App. M.5;
    Algorithm 5 for M = N).

    Parameters
    ----------
    lr : float
        η > 0.
    b1, b2 : float
        β₁, β₂ ∈ [0, 1).
    eps : float
        ε > 0, added to the square roots of the second moments.
    metric : float or str
        a < 1 of Definition 1, as in :func:`momentum_sgd`.
    expm_method, transport : str
        As in :func:`momentum_sgd`.
    amsgrad : bool
        Divide by the running maxima of p and q (Reddi, Kale & Kumar, ICLR 2018;
        ``torch.optim.Adam(amsgrad=True)``): the element-wise maximum of symmetric matrices
        is symmetric, so Z⁺ ⊘ (…) stays skew, and Ũ is projected as before: the structure
        is kept.
    rows : Rows, optional
        Row-sharded X, as in :func:`momentum_sgd` (4 rounds of O(M²) numbers per step).
    xp : namespace, optional

    Returns
    -------
    StiefelOptimizer
        ``init(X) -> AdamState`` (all moments 0) and ``update(X, G, state)``.

    Notes
    -----
    One step i → i + 1 from (X, U, Z, p, q), with A, f, g, c, d as in :func:`momentum_sgd`
    and κ = √(1 − β₂^{i+1}) (the paper's bias correction; there is none for β₁):

    0. First step only: X ← polar(X) (App. P.1).
    1. p⁺ = β₂p + (1 − β₂) f∘f, q⁺ = β₂q + (1 − β₂) g∘g (line 3).
    2. φ̂₂: U½ = U L − (1 − β₁) g, L = β₁I + dηZ (line 4; sign of the UZ term as in eq. 8).
    3. φ̂₁: Z⁺ = β₁Z − (1 − β₁) f, X½ = XR, R = I + ηκ Z⁺ ⊘ (p⁺^{∘½} + ε) (line 5).
    4. φ̂₃: W = U½ ⊘ (q⁺^{∘½} + ε), Ũ = κ(W − X(XᵀW)), X⁺ = polar(XR + ηŨ),
       U⁺ = k(U½ − ηX R S⁻¹ŨᵀU½) with S = RᵀR (line 6; S moved as in :func:`momentum_sgd`).

    ⊘ is element-wise division: Algorithm 2 prints ∘ (a product) where §2.3 and Algorithm 5
    mean ⊘. The paper's projection I − X½(X½ᵀX½)⁻¹X½ᵀ equals I − XXᵀ exactly, because
    X½ = XR with R invertible, so no M×M solve is needed. Z⁺ ⊘ (…) is exactly skew because p⁺
    is exactly symmetric (f is exactly skew); Ũ ⟂ X½ gives X⁺ᵀU⁺ = 0 (Theorem 7).
    ``transport="energy"`` rescales U⁺ to ‖U½‖_F (k as in :func:`momentum_sgd`).

    **Complex X**: Hermitian transposes as in :func:`momentum_sgd`, and the second moments are
    the real p⁺ = β₂p + (1 − β₂) ``|f|²``, q⁺ = β₂q + (1 − β₂) ``|g|²`` (float32/float64 state for
    complex64/complex128): ``|f|`` is symmetric for skew-Hermitian f, so Z⁺ ⊘ (p⁺^{∘½} + ε) stays
    skew-Hermitian, and the step commutes with X ↦ X·diag(e^{iθ}).

    Examples
    --------
    Complex Brockett cost f(X) = −Re tr(XᴴAXD), gradient −2AXD, minimum −Σ dᵢλᵢ(A):

    >>> import numpy as np, householderla as hl
    >>> rng = np.random.default_rng(0)
    >>> B = rng.standard_normal((5, 5)) + 1j * rng.standard_normal((5, 5)); A = (B + B.conj().T) / 4
    >>> D = np.diag([2.0, 1.0]); opt = hl.stiefel.adam(lr=0.02)
    >>> X = np.linalg.qr(rng.standard_normal((5, 2)) + 1j * rng.standard_normal((5, 2)))[0]
    >>> state = opt.init(X)
    >>> for _ in range(2000):
    ...     X, state = opt.update(X, -2 * A @ X @ D, state)
    >>> lam = np.linalg.eigvalsh(A)[::-1][:2]
    >>> bool(np.isclose(-np.trace(X.conj().T @ A @ X @ D).real, -lam @ np.diag(D)))
    True

    **Cost:** 10 N×M×M products per step (XᵀG, XA, UL, XᵀW, X(XᵀW), XR, ŨᵀU½, X·(…), and
    the two of ``polar``) plus O(M³); for M = N as in :func:`momentum_sgd`.
    """
    lr = check_real("lr", lr, 0.0, math.inf)  # lr = 0: a scheduler's last step
    b1 = check_real("b1", b1, 0.0, 1.0)
    b2 = check_real("b2", b2, 0.0, 1.0)
    eps = check_real("eps", eps, 0.0, math.inf, lo_open=True)
    a = metric_a(metric)
    method = check_choice("expm_method", expm_method, EXPM_METHODS)
    transport = check_choice("transport", transport, TRANSPORTS)
    c, d = 0.5 / (1.0 - a), 0.5 * (3.0 * a - 2.0)
    bias_corrected = b2 > 0
    fixed_xp = xp
    # values of the step, not constants (as in momentum_sgd): (lr, β₁, β₂, ε, 1 − β₁, 1 − β₂,
    # dη, log β₂), each rounded once from its float64 value
    hyper = (lr, b1, b2, eps, 1.0 - b1, 1.0 - b2, d * lr, math.log(b2) if bias_corrected else 0.0)

    def init(X: Any) -> AdamState | AMSGradState:
        return init_arrays(X, fixed_xp, adam=True, amsgrad=bool(amsgrad), rows=rows)

    def update(X: Any, G: Any, state: AdamState) -> tuple[Any, AdamState]:
        xp, X, G, dtype = prepare(X, G, state, fixed_xp, rows)
        if _one_program(xp, rows, X, G, state):
            key = ("adam", bias_corrected, a, method, transport, bool(amsgrad))
            return eager_program(key, step, (0, 1), xp, dtype, hyper, X, G, state)
        return step(xp, dtype, hyper, X, G, state)

    def step(
        xp: Any, dtype: Any, hyper: tuple, X: Any, G: Any, state: AdamState
    ) -> tuple[Any, Any]:
        lr, b1, b2, eps, one_b1, one_b2, d_lr, log_b2 = hyper
        X = _project_first(X, state.count, xp, rows)
        work = accumulation_dtype_for(xp, X)
        X, G, U, Z, p, q = cast(xp, work, X, G, state.U, state.Z, state.p, state.q)
        if isinstance(state, AMSGradState) != bool(amsgrad):
            raise ValueError("the state was made by init() of an adam with other amsgrad")
        count = state.count + 1
        if not bias_corrected:
            kappa = 1.0
        else:
            t = xp.astype(count, real_dtype(xp, work))
            kappa = xp.sqrt(-xp.expm1(t * log_b2))
        eager = is_eager(X)
        # the second moments square f and g, whose entries are at most 2·max|G| (XᵀX = I)
        why = "the moments square it"
        if rows.sharded:
            A, g_max = _reduce_first(mH(X, xp) @ G, G, xp, rows)
            check_powers("adam", "the gradient G", 2 * G, 2, why, xp, eager, rows, 2 * g_max)
        else:
            check_powers("adam", "the gradient G", 2 * G, 2, why, xp, eager)
            A = mH(X, xp) @ G
        f = c * (A - mH(A, xp))
        p = b2 * p + one_b2 * abs2(f, xp)
        p_max = q_max = None
        if amsgrad:
            p_max, q_max = cast(xp, work, state.p_max, state.q_max)
            p_max = xp.maximum(p_max, p)
        Z_next = b1 * Z - one_b1 * f
        p_div = p_max if amsgrad else p
        step = (lr * kappa) * (Z_next / (xp.sqrt(p_div) + eps))
        check_step("adam", step, xp, eager)
        check_step("adam", d_lr * Z, xp, eager)  # the momentum rotation, unnormalised
        R = expm_skew(step, method, xp)
        if X.shape[-1] == rows.total(X.shape[-2]):  # SO(n) (Algorithm 5)
            X_next, U_next = _polar(X @ R, xp, rows), U
        else:
            g = G - X @ A
            q = b2 * q + one_b2 * abs2(g, xp)
            if amsgrad:
                q_max = xp.maximum(q_max, q)
            U_half = U @ momentum_rotation(Z, b1, d_lr, method, xp) - one_b1 * g
            why = momentum_growth(method)
            if rows.sharded:
                W = U_half / (xp.sqrt(q_max if amsgrad else q) + eps)
                (XW,), (u_max,) = rows.reduce([mH(X, xp) @ W], [block_max(U_half, xp, (-2, -1))])
                check_powers("adam", "the momentum U", U_half, 4, why, xp, eager, rows, u_max)
            else:
                check_powers("adam", "the momentum U", U_half, 4, why, xp, eager)
                W = U_half / (xp.sqrt(q_max if amsgrad else q) + eps)
                XW = mH(X, xp) @ W
            Ut = kappa * (W - X @ XW)
            B = mH(Ut, xp) @ U_half
            X_next, U_next = _phi3(X, R, U_half, Ut, B, lr, transport, xp, False, rows)
        X_next, U_next, Z_next, p, q = cast(xp, dtype, X_next, U_next, Z_next, p, q)
        if amsgrad:
            p_max, q_max = cast(xp, dtype, p_max, q_max)
            return X_next, AMSGradState(count, U_next, Z_next, p, q, p_max, q_max)
        return X_next, AdamState(count, U_next, Z_next, p, q)

    return StiefelOptimizer(init, update)


def __dir__() -> list[str]:
    """Only the public names: the imports above stay attributes but are not listed."""
    return sorted(__all__)
