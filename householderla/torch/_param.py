"""The orthogonal parametrization of ``householderla.torch``: :func:`orthogonal` registers an
:class:`Orthogonal` module (a ``torch.nn.utils.parametrize`` parametrization) that maps
reflection vectors to an orthogonal / Stiefel weight by CWY, T-CWY or SVD-Householder, with a
``right_inverse`` by the constructive inverses. Re-exported by :mod:`householderla.torch`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.utils import parametrize

from ..cwy import cwy, tcwy
from ..householder import householder_vectors, tcwy_vectors
from ..svd import bounded_sigma, svd_householder, svd_householder_params

__all__ = ["INITS", "MAPS", "STRUCTURES", "Orthogonal", "orthogonal"]

MAPS = ("cwy", "tcwy", "svd")
INITS = ("haar", "identity", "keep")
STRUCTURES = ("dense", "trapezoidal")


def _haar_stiefel(shape: tuple[int, ...], dtype: Any, device: Any, gen: Any) -> torch.Tensor:
    """Haar-distributed (..., N, M) with orthonormal columns: Q of a Gaussian matrix with R's
    diagonal made positive (Mezzadri 2007), sampled in float64."""
    A = torch.randn(shape, dtype=torch.float64, device=device, generator=gen)
    Q, R = torch.linalg.qr(A)
    d = torch.diagonal(R, dim1=-2, dim2=-1)
    Q = Q * torch.where(d < 0, -1.0, 1.0).unsqueeze(-2)
    return Q.to(dtype)


def _fixing_vectors(
    batch: tuple[int, ...],
    N: int,
    M: int,
    count: int,
    dtype: Any,
    device: Any,
    gen: Any,
    trapezoidal: bool = False,
) -> torch.Tensor:
    """``count`` nonzero-where-possible reflection vectors whose product fixes e₁…e_M:
    pairs (w, w) (H(w)H(w) = I) and, for odd ``count``, one w supported on rows > M (zero when
    M = N). Unlike zero vectors (H(0) = I has zero gradient) they can train. ``trapezoidal``:
    the pair in columns (2i, 2i + 1) is supported on rows ≥ 2i + 1, so that both columns
    keep it under the lower-trapezoidal mask (column j reads rows ≥ j)."""
    W = torch.randn(
        batch + (N, (count + 1) // 2), dtype=torch.float64, device=device, generator=gen
    )
    if trapezoidal:
        W = torch.where(
            torch.arange(N, device=device)[:, None] > 2 * torch.arange(W.shape[-1], device=device),
            W,
            0.0,
        )
    cols = [W[..., j // 2] for j in range(count)]
    if count % 2:
        cols[-1] = torch.cat([torch.zeros_like(cols[-1][..., :M]), cols[-1][..., M:]], dim=-1)
    if not cols:
        return torch.zeros(batch + (N, 0), dtype=dtype, device=device)
    return torch.stack(cols, dim=-1).to(dtype)


def _trainable(V: torch.Tensor, M: int, trapezoidal: bool = False) -> torch.Tensor:
    """The same product H(v₁)…H(v_L) (first M columns) with no zero vector left where one can
    be avoided: zero columns (identity factors, whose gradient is 0, so they never train) are
    moved to the end, and there replaced by pairs (w, w) (H(w)H(w) = I), counted from the
    last column; an odd one out gets a w supported on rows ≥ M (zero for square maps).
    Assigning W = I (all-zero vectors) then trains like ``init="identity"``. ``trapezoidal``
    (lower-trapezoidal V, which moving nonzero columns to the front keeps): a pair in columns
    (p − 1, p) is supported on rows ≥ p."""
    zero = torch.all(V == 0, dim=-2)  # (..., L)
    if not bool(torch.any(zero)):
        return V
    order = torch.argsort(zero.to(torch.int8), dim=-1, stable=True)  # nonzero columns first
    V = torch.gather(V, -1, order[..., None, :].expand(V.shape))
    N, L = V.shape[-2], V.shape[-1]
    z = torch.sum(zero, dim=-1, keepdim=True)  # (..., 1) zero columns per matrix
    t = torch.arange(L - 1, -1, -1, device=V.device)  # distance from the last column
    R = torch.randn((*V.shape[:-2], N, (L + 1) // 2), dtype=torch.float64, device=V.device)
    F = R[..., t // 2]  # columns t = 2i, 2i + 1 share w_i: pairs H(w)H(w) = I
    rows = torch.arange(N, device=V.device)[:, None] >= M
    odd = (z % 2 == 1) & (t == z - 1)  # the unpaired one: fixes e₁…e_M
    F = torch.where(odd[..., None, :] & ~rows, torch.zeros_like(F), F)
    if trapezoidal:  # pair (t = 2i, 2i + 1) sits in columns (L − 2 − 2i, L − 1 − 2i)
        top = L - 1 - 2 * (t // 2)
        F = torch.where(torch.arange(N, device=V.device)[:, None] >= top, F, 0.0)
    return torch.where((t < z)[..., None, :], F.to(V.dtype), V)


class Orthogonal(torch.nn.Module):
    """The parametrization :func:`orthogonal` registers: reflection vectors ↦ weight.

    ``forward(V)`` returns the (..., n, k) weight, ``right_inverse(W)`` reflection vectors
    for an orthogonal / Stiefel ``W`` (see :func:`orthogonal`). Wide weights (n < k) are the
    transpose of a tall Stiefel matrix. ``structure="trapezoidal"`` (square ``"cwy"`` only)
    reads the reflectors from the lower trapezoid of V (v_j[i] = 0 for i < j; the entries
    above the diagonal are ignored and get zero gradients).
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        map: str,
        reflectors: int | None,
        sigma_radius: float = 0.0,
        structure: str = "dense",
    ) -> None:
        super().__init__()
        if map not in MAPS:
            raise ValueError(f"map must be one of {MAPS}; got {map!r}")
        if structure not in STRUCTURES:
            raise ValueError(f"structure must be one of {STRUCTURES}; got {structure!r}")
        if structure == "trapezoidal" and (map != "cwy" or shape[-2] != shape[-1]):
            raise ValueError(
                "structure='trapezoidal' applies to a square weight with map='cwy'; got "
                f"map={map!r} and shape {tuple(shape)}"
            )
        self.trapezoidal = structure == "trapezoidal"
        n, k = shape[-2], shape[-1]
        self.shape = tuple(shape)
        self.map = map
        self.transposed = n < k and map != "svd"  # svd handles wide weights itself
        self.N, self.M = max(n, k), min(n, k)
        self.square = n == k
        self._pending: Any = None
        if isinstance(sigma_radius, bool) or not float(sigma_radius) >= 0.0:
            raise ValueError(f"sigma_radius must be a number >= 0; got {sigma_radius!r}")
        self.sigma_radius = float(sigma_radius)
        if map == "svd":
            if reflectors is not None:
                raise ValueError(
                    "map='svd' does not take reflectors (it uses 2·min(n, k) − 1 of them)"
                )
            r = self.M
            self.reflectors = None
            self.svd_counts = (r - 1, r) if n <= k else (r, r - 1)
            return
        if self.sigma_radius:
            raise ValueError("sigma_radius applies to map='svd' only")
        full = self.N if (map == "cwy" and self.square) else self.M
        if reflectors is None:
            reflectors = full
        if isinstance(reflectors, bool) or int(reflectors) != reflectors:
            raise TypeError(f"reflectors must be an integer; got {reflectors!r}")
        reflectors = int(reflectors)
        if map == "tcwy" and reflectors != self.M:
            raise ValueError(
                f"map='tcwy' uses exactly min(n, k) = {self.M} reflectors; got reflectors="
                f"{reflectors}"
            )
        if not 1 <= reflectors <= self.N:
            raise ValueError(
                f"reflectors must be between 1 and max(n, k) = {self.N}; got {reflectors}"
            )
        self.reflectors = reflectors
        self.full = full

    def extra_repr(self) -> str:
        if self.map == "svd":
            return f"map='svd', shape={self.shape}, sigma_radius={self.sigma_radius}"
        tail = ", structure='trapezoidal'" if self.trapezoidal else ""
        return f"map={self.map!r}, shape={self.shape}, reflectors={self.reflectors}{tail}"

    def _cwy(self, V: torch.Tensor) -> Any:
        """``hl.cwy`` of the reflectors: of tril(V) declared trapezoidal (its blocks then skip
        the zero rows, about half the flops at L = N) when ``structure="trapezoidal"``."""
        if self.trapezoidal:
            return cwy(torch.tril(V), structure="trapezoidal")
        return cwy(V)

    # V (..., N, L) -> weight (..., n, k); svd: (U_vecs, [s_hat,] V_vecs) -> weight
    def forward(self, *params: torch.Tensor) -> torch.Tensor:
        if self.map == "svd":
            return self._svd_forward(*params)
        (V,) = params
        if self.map == "tcwy":
            Q = tcwy(V).matrix()
        elif self.square:
            Q = self._cwy(V).matrix()
        else:
            # the method, not ``@``: dynamo (torch 2.13) puts a binary operator with a tensor
            # operand into the graph as it is instead of calling CWY.__matmul__
            Q = cwy(V).__matmul__(torch.eye(self.N, self.M, dtype=V.dtype, device=V.device))
        return Q.mT if self.transposed else Q

    def operator(self, *params: torch.Tensor) -> Any:
        """The weight ``forward(*params)`` as an operator that is never formed (``@``, ``.T``),
        or None where no operator represents it (a rectangular ``"cwy"`` weight with more
        reflectors than min(n, k): its first columns of an N × N product)."""
        if self.map == "svd":
            if self.sigma_radius == 0.0:
                U, V = params
                sigma = torch.ones(self.M, dtype=U.dtype, device=U.device)
            else:
                U, s_hat, V = params
                sigma = bounded_sigma(s_hat, 1.0, self.sigma_radius)
            return svd_householder(U, sigma, V)
        (V,) = params
        if self.square and self.map == "cwy":
            return self._cwy(V)
        if self.reflectors != self.M:
            return None
        return tcwy(V).T if self.transposed else tcwy(V)

    def right_inverse(self, W: torch.Tensor) -> Any:
        """Reflection vectors V with ``forward(V) ≈ W`` for orthogonal / Stiefel ``W``.

        Householder QR with positive diagonal (:func:`householderla.householder_vectors`,
        :func:`householderla.tcwy_vectors`; Likhosherstov et al., AISTATS 2021, Theorems 1 and 3):
        both determinants for square W. A non-orthogonal full-rank W is replaced by its Q factor
        (the positive-diagonal QR), as ``torch.nn.utils.parametrizations.orthogonal`` does.
        Zero vectors, which would never train (W = I gives only zeros), are replaced by pairs
        of equal reflectors with the same product.
        """
        if self._pending is not None:  # the initial point chosen by orthogonal(init=...)
            V, self._pending = self._pending, None
            return V
        if not isinstance(W, torch.Tensor) or tuple(W.shape[-2:]) != self.shape[-2:]:
            got = tuple(W.shape) if isinstance(W, torch.Tensor) else type(W).__name__
            raise ValueError(f"the assigned weight must have shape {self.shape}; got {got}")
        if self.map == "svd":
            return self._svd_inverse(W)
        if self.reflectors < self.full:
            raise ValueError(
                f"a product of reflectors={self.reflectors} < {self.full} reflections cannot "
                "represent every orthogonal matrix; register with the default reflectors to "
                "assign weights"
            )
        Wt = W.mT if self.transposed else W
        if self.map == "cwy" and self.square:
            return _trainable(householder_vectors(Wt), self.N, self.trapezoidal)
        V = _trainable(tcwy_vectors(Wt), self.M)
        extra = self.reflectors - self.M
        if extra:
            batch = tuple(V.shape[:-2])
            pad = _fixing_vectors(batch, self.N, self.M, extra, V.dtype, V.device, None)
            V = torch.cat([V, pad], dim=-1)
        return V

    def initial_vectors(self, init: str, dtype: Any, device: Any, gen: Any) -> Any:
        """Reflection vectors of the starting point: ``"haar"`` (a Haar-random orthogonal /
        Stiefel matrix; Gaussian reflectors when ``reflectors`` is below the full count, whose
        image is then not a group) or ``"identity"`` (``[I; 0]`` by pairs of equal
        reflectors, which train, unlike zero vectors)."""
        batch = self.shape[:-2]
        if self.map == "svd":
            if init == "identity":
                (k1, k2), (m, n) = self.svd_counts, self.shape[-2:]
                U = _fixing_vectors(batch, m, self.M, k1, dtype, device, gen)
                V = _fixing_vectors(batch, n, self.M, k2, dtype, device, gen)
                s_hat = torch.zeros(batch + (self.M,), dtype=dtype, device=device)
                return (U, V) if self.sigma_radius == 0 else (U, s_hat, V)
            Q = _haar_stiefel(batch + (self.N, self.M), dtype, device, gen)
            return self._svd_inverse(Q.mT if self.shape[-2] < self.shape[-1] else Q)
        if init == "identity":
            return _fixing_vectors(
                batch, self.N, self.M, self.reflectors, dtype, device, gen, self.trapezoidal
            )
        if self.reflectors < self.full:
            shape = batch + (self.N, self.reflectors)
            V = torch.randn(shape, dtype=torch.float64, device=device, generator=gen).to(dtype)
            return torch.tril(V) if self.trapezoidal else V
        m = self.N if (self.map == "cwy" and self.square) else self.M
        Q = _haar_stiefel(batch + (self.N, m), dtype, device, gen)
        self._pending = None
        return self.right_inverse(Q.mT if self.transposed else Q)

    # -- SVD parametrization (householderla.svd, Zhang, Lei & Dhillon, ICML 2018)
    # ----------------------------------
    def _svd_forward(self, *params: torch.Tensor) -> torch.Tensor:
        """W = Q_U Σ Q_Vᵀ with σ = 1 (orthogonal), or σ = r·tanh(ŝ/2) + 1 ∈ [1 − r, 1 + r]
        (Zhang, Lei & Dhillon, ICML 2018 eq. 8) for ``sigma_radius`` r > 0."""
        if self.sigma_radius == 0.0:
            U, V = params
            sigma = torch.ones(self.M, dtype=U.dtype, device=U.device)
        else:
            U, s_hat, V = params
            sigma = bounded_sigma(s_hat, 1.0, self.sigma_radius)
        return svd_householder(U, sigma, V).matrix()

    def _svd_inverse(self, W: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(U_vecs, [ŝ,] V_vecs) by :func:`householderla.svd_householder_params`. With σ fixed
        at 1 a non-orthogonal W is replaced by its polar factor Q_U Q_Vᵀ; with a radius, σ is
        clipped into the open interval (1 − r, 1 + r) before ŝ = 2 atanh((σ − 1)/r)."""
        U, s, V = svd_householder_params(W)
        U, V = _trainable(U, U.shape[-2]), _trainable(V, V.shape[-2])
        if self.sigma_radius == 0.0:
            return U, V
        lim = 1.0 - 4.0 * float(torch.finfo(W.dtype).eps)
        z = torch.clamp((s - 1.0) / self.sigma_radius, -lim, lim)
        return U, 2.0 * torch.atanh(z), V


def orthogonal(
    module: torch.nn.Module,
    name: str = "weight",
    map: str = "cwy",
    reflectors: int | None = None,
    *,
    init: str = "haar",
    sigma_radius: float = 0.0,
    generator: torch.Generator | None = None,
) -> torch.nn.Module:
    """Constrain ``module.<name>`` to be orthogonal (or to have orthonormal columns / rows).

    In the style of ``torch.nn.utils.parametrizations.orthogonal``: registers an
    :class:`Orthogonal` parametrization with ``torch.nn.utils.parametrize``, so the weight is
    recomputed from the trainable reflection vectors at every access (or once per
    ``with parametrize.cached():`` block), and ``module.<name> = Q`` sets the vectors through
    the constructive inverse.

    Parameters
    ----------
    module : torch.nn.Module name : str
        A parameter or buffer of shape (..., n, k), float32 or float64.
    map : {"cwy", "tcwy", "svd"}
        ``"cwy"``: W = H(v₁)…H(v_L) (square; Likhosherstov et al., AISTATS 2021, Theorem 2), or its
        first min(n, k) columns for rectangular W. ``"tcwy"``: W = γ_{N,M}(V), the first M columns
        of H(v₁)…H(v_M) without forming N × N (Likhosherstov et al., AISTATS 2021, Theorem 3).
        ``"svd"``: the svdRNN parametrization W = Q_U Σ Q_Vᵀ = H(u₁)…H(u_{k₁}) Σ (H(v₁)…H(v_{k₂}))ᵀ
        (Zhang, Lei & Dhillon, ICML 2018 eq. 3/17; :func:`householderla.svd_householder`) with σ =
        1, or with trainable bounded singular values (``sigma_radius``). For ``"cwy"`` / ``"tcwy"``
        wide weights (n < k) are the transpose of the tall map; ``"svd"`` is rectangular by itself.
    reflectors : int, optional
        L, the number of reflection vectors. Default: n for square ``"cwy"`` (all of O(n), both
        determinants: Likhosherstov et al., AISTATS 2021, Theorem 1 with H(0) = I), min(n, k)
        otherwise (all of the Stiefel manifold: Theorem 3). Fewer give a cheaper map onto a subset;
        assigning a weight then raises.
    init : {"haar", "identity", "keep"}
        The starting weight: Haar-random on O(n) / St(N, M), the identity ``[I; 0]`` (by
        pairs of equal reflectors, which keep nonzero gradients), or the Q factor of the
        current weight (positive-diagonal QR), as torch's ``orthogonal`` does.
    sigma_radius : float
        ``map="svd"`` only. 0 (default): σ = 1, W orthogonal. r > 0: W's singular values are
        σ = r·tanh(ŝ/2) + 1 ∈ [1 − r, 1 + r] with ŝ trainable (Zhang, Lei & Dhillon, ICML 2018 eq.
        8,
        :func:`householderla.bounded_sigma`): W is then *not* orthogonal, but its condition
        number is at most (1 + r)/(1 − r) — the svdRNN use.
    generator : torch.Generator, optional
        Random source of ``init="haar"`` / ``"identity"``.

    Returns
    -------
    torch.nn.Module
        ``module``, with the parametrization registered; the trainable parameter is
        ``module.parametrizations.<name>.original`` of shape (..., max(n, k), L). For
        ``map="svd"`` they are ``original0`` = U_vecs (..., n, k₁), [``original1`` = ŝ
        (..., min(n, k)),] and the last one V_vecs (..., k, k₂), with (k₁, k₂) as
        :func:`householderla.svd_householder_params` returns them (2·min(n, k) − 1 vectors).

    Notes
    -----
    Cost per forward (W formed once), counting GEMMs: ≈ 2·N²·L + 4·N·L² + L³/3 flops for
    square ``"cwy"`` (Gram matrix, T Uᵀ, U (T Uᵀ); ≈ 6·N³ at L = N), ≈ 6·N·M² for
    ``"tcwy"``, both sides plus 2·n·k·min(n, k) for ``"svd"``; the backward goes through the
    explicit VJPs (≈ 3× the forward for the dense matrix). float32 weights are formed in
    float64 on CPU (``cwy(V).matrix()``), then rounded once. ``init="keep"`` with ``"svd"``
    and σ = 1 starts from the polar factor of the current weight (its SVD's U Vᵀ), not the
    QR factor.
    A zero reflection vector is the identity reflector H(0) = I and gets a zero gradient, so
    it stays zero: assigning a Q whose constructive inverse has zero columns (e.g. exactly
    Q = I) freezes those columns; ``init="identity"`` avoids that.

    Examples
    --------
    >>> import torch, householderla as hl
    >>> layer = hl.torch.orthogonal(torch.nn.Linear(5, 5, bias=False), init="haar")
    >>> W = layer.weight
    >>> bool(torch.allclose(W.T @ W, torch.eye(5), atol=1e-5))
    True
    >>> layer.weight = torch.eye(5)                     # assign: sets the reflectors
    >>> bool(torch.allclose(layer.weight, torch.eye(5), atol=1e-6))
    True
    """
    weight = getattr(module, name, None)
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"module {type(module).__name__} has no parameter or buffer {name!r}")
    if weight.ndim < 2:
        raise ValueError(
            f"{name} must have shape (..., n, k); got a tensor of {weight.ndim} dimension(s)"
        )
    if weight.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{name} has dtype {weight.dtype}; supported are float32 and float64")
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}; got {init!r}")
    param = Orthogonal(tuple(weight.shape), map, reflectors, sigma_radius)
    if init != "keep":
        with torch.no_grad():
            param._pending = param.initial_vectors(init, weight.dtype, weight.device, generator)
    parametrize.register_parametrization(module, name, param)
    return module
