"""The torch rule table: ``torch.autograd.Function``s wired to the explicit backward passes
(imported only for torch input; signatures in :mod:`householderla._autodiff`).

One Function per primitive (``forward`` + ``setup_context`` + ``backward``, as ``torch.func``
needs): ``CWYFactors``, ``LowRankApply`` (``LowRankApplyKept``), ``HouseholderApply``,
``HouseholderApplyNumba``, ``Polar``, ``CayleySMW``, ``QRPositive``, and ``CWYLinear`` (the one
node of ``householderla.torch._layer``, not a rule). Every backward is torch operations, so
double backward and ``torch.func`` compose; ``vmap`` by ``generate_vmap_rule`` or, for
``Polar``, an explicit rule. Only ``HouseholderApplyNumba`` is ``once_differentiable``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import array_api_compat
import torch
from torch.autograd.function import once_differentiable

from .._agnostic import compact_wy as K
from .._agnostic import compact_wy_jvp as KJ
from .._agnostic import cwy_rows as R
from .._agnostic import retraction as RK
from .._agnostic.newton_schulz import polar_backward, polar_forward
from .._agnostic.reflections import householder_apply_vjp, reflect_all
from .._interop.dlpack import from_numpy, to_numpy
from .._kernels import load_numba
from .._lib.linalg import sum_to_shape
from .._lib.namespace import accumulation_dtype_for
from .._lib.tuning import MASKED_MAX_N

_xp = array_api_compat.array_namespace(torch.empty(0))


# -- compact WY ---------------------------------------------------------------------------


class CWYFactors(torch.autograd.Function):
    """V ↦ (U, T, r): unit columns, T = S⁻¹ and the column norms."""

    generate_vmap_rule = True

    @staticmethod
    def forward(V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return K.cwy_factors(V, _xp, check=False)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        U, T, r = output
        ctx.save_for_backward(U, T, r)
        ctx.save_for_forward(U, T, r)

    @staticmethod
    def _jvp(ctx: Any, dV: Any) -> Any:
        U, T, r = ctx.saved_tensors
        return KJ.factor_tangents(U, T, r, dV, _xp)

    @staticmethod
    def backward(ctx: Any, U_bar: torch.Tensor, T_bar: torch.Tensor, r_bar: Any) -> Any:
        # r stays differentiable (∂‖v‖/∂v = u) so that double backward sees how the
        # 1/‖v‖ in the normalisation backward depends on V.
        U, T, r = ctx.saved_tensors
        S_bar = K.s_bar_from_t_bar(T, T_bar, _xp)
        return K.factors_vjp(U, r, U_bar, S_bar, _xp) + U * r_bar


class CWYFactorsDiag(torch.autograd.Function):
    """(V, sdiag) ↦ (U, T, r) with S = diag(sdiag) + striu(UᴴU); sdiag is a constant."""

    generate_vmap_rule = True

    @staticmethod
    def forward(V: torch.Tensor, sdiag: torch.Tensor) -> tuple[Any, Any, Any]:
        return K.cwy_factors(V, _xp, check=False, sdiag=sdiag)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        ctx.save_for_backward(*output)  # sdiag gets no cotangent (None below)
        ctx.save_for_forward(*output)

    @staticmethod
    def _jvp(ctx: Any, dV: Any, _dsdiag: Any) -> Any:
        return CWYFactors._jvp(ctx, dV)  # sdiag is a constant: only the strict upper part moves

    @staticmethod
    def backward(ctx: Any, U_bar: torch.Tensor, T_bar: torch.Tensor, r_bar: Any) -> Any:
        return CWYFactors.backward(ctx, U_bar, T_bar, r_bar), None


def _rows(x: Any) -> Any:
    """x with unit stride along its last axis (a copy only where it is not), so that the
    products below and every block after them run on row-major operands: a column-major
    h (the ``x.mT`` of a layer's rows) propagates its layout into ``h − U b``, and torch's
    float64 GEMM ``h @ bᵀ`` on such operands ran at 9 against 40 GFLOP/s (512 × 1024 h,
    64 columns, one thread); the copy is one memory pass of h."""
    return x if x is None or x.ndim < 2 or x.stride(-1) == 1 else x.contiguous()


def _lowrank_cotangents(ctx: Any, U: Any, T: Any, h: Any, g: Any, parts: Any) -> tuple:
    """(Ū, T̄, h̄) of the low-rank apply for the cotangent g: ``compact_wy.lowrank_vjp`` on
    row-major operands, without S̄ (the factor node converts the sum of its consumers' T̄)
    and without h̄ where h needs none; ``parts``: the forward's (a, b), or None."""
    U_bar, h_bar, T_bar, _ = K.lowrank_vjp(
        U,
        T,
        _rows(h),
        _rows(g),
        _xp,
        transpose=ctx.transpose,
        mode=ctx.mode,
        need_h=ctx.needs_input_grad[2],
        need_s=False,
        parts=parts,
    )
    return U_bar, T_bar, h_bar


class LowRankApply(torch.autograd.Function):
    """(U, T, h) ↦ R(h) − U_out M U_inᵀ h (``h=None``: the dense matrix, rounded once to
    ``out`` when given: the half dtype of V, whose factors are float32)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(
        U: Any, T: Any, h: Any, transpose: bool, mode: str, out: Any = None
    ) -> torch.Tensor:
        return K.lowrank_apply(U, T, _rows(h), _xp, transpose=transpose, mode=mode, out=out)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        U, T, h, transpose, mode = inputs[:5]  # (``out``: the dense matrix's dtype, or absent)
        ctx.save_for_backward(U, T, h)
        ctx.save_for_forward(U, T, h)
        ctx.transpose, ctx.mode = transpose, mode
        ctx.out = inputs[5] if len(inputs) > 5 else None

    @staticmethod
    def _jvp(ctx: Any, dU: Any, dT: Any, dh: Any, *_: Any) -> Any:
        U, T, h = ctx.saved_tensors
        dy = KJ.lowrank_jvp(U, T, h, dU, dT, dh, _xp, transpose=ctx.transpose, mode=ctx.mode)
        return dy if ctx.out is None else dy.to(ctx.out)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        U, T, h = ctx.saved_tensors
        return (*_lowrank_cotangents(ctx, U, T, h, g, None), None, None, None)


class LowRankApplyKept(torch.autograd.Function):
    """:class:`LowRankApply` for h and factors of one dtype, keeping a = U_inᵀh and b = M a
    for the backward (two non-differentiable extra outputs), which then skips recomputing
    them: 2·N·L·B + 2·L²·B of its ≈ 8·N·L·B flops. Under double backward (grad mode on in
    the backward) they are recomputed from the saved inputs so the graph sees them."""

    generate_vmap_rule = True

    @staticmethod
    def forward(U: Any, T: Any, h: Any, transpose: bool, mode: str) -> tuple[Any, Any, Any]:
        return K.lowrank_apply_parts(U, T, _rows(h), _xp, transpose=transpose, mode=mode)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        U, T, h, transpose, mode = inputs
        _, a, b = output
        ctx.mark_non_differentiable(a, b)
        ctx.save_for_backward(U, T, h, a, b)
        ctx.save_for_forward(U, T, h)
        ctx.transpose, ctx.mode = transpose, mode

    @staticmethod
    def _jvp(ctx: Any, dU: Any, dT: Any, dh: Any, *_: Any) -> Any:
        U, T, h = ctx.saved_tensors[:3]
        dy = KJ.lowrank_jvp(U, T, h, dU, dT, dh, _xp, transpose=ctx.transpose, mode=ctx.mode)
        return dy, None, None  # a and b are not differentiable outputs

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor, _a: Any, _b: Any) -> Any:
        U, T, h, a, b = ctx.saved_tensors
        parts = None if torch.is_grad_enabled() else (a, b)
        return (*_lowrank_cotangents(ctx, U, T, h, g, parts), None, None)


def _lowrank(xp: Any, U: Any, T: Any, h: Any, transpose: bool, mode: str, out: Any = None) -> Any:
    if out is None and h is not None and h.dtype == U.dtype == T.dtype:
        return with_jvp(LowRankApplyKept).apply(U, T, h, transpose, mode)[0]
    return with_jvp(LowRankApply).apply(U, T, h, transpose, mode, out)


class CWYLinear(torch.autograd.Function):
    """(V, x, trapezoidal, formed, block) ↦ x Qᵀ for rows x (B, N) and Q = H(v₁)…H(v_N) the
    square CWY map of V (N, N) (of its lower trapezoid with ``trapezoidal``), by the
    unnormalised form of :mod:`householderla._agnostic.cwy_rows` in column blocks of
    ``block`` reflectors (one block when ``block`` ≥ N): an orthogonal layer's Grams,
    products and their backward as one autograd node (``householderla.torch._layer``),
    where composed nodes' Python, dispatch, normalisation passes and copies outweigh the
    GEMMs. ``formed``: W is formed and x Wᵀ taken. The same math as ``cwy_rows``'
    ``layer_forward`` / ``layer_vjp``, written in torch calls (``_node_forward``,
    ``_node_vjp``: no namespace wrappers, masks instead of ``triu``). The products update
    one copy of x inside the GEMMs (``addmm_``); the backward reads the S_b and the kept
    products. Under double backward (grad mode on in the backward) they are recomputed from
    the saved V and x by the same torch operations, out of place, which autograd then
    records."""

    @staticmethod
    def forward(ctx: Any, V: Any, x: Any, trapezoidal: bool, formed: bool, block: int) -> Any:
        Vt = _tril(V) if trapezoidal else V
        blocks = R.column_blocks(V.shape[-1], block, trapezoidal)
        acc = accumulation_dtype_for(_xp, V)
        y, (Ss, kept) = _node_forward(Vt, x, blocks, formed, acc, inplace=True)
        ctx.trapezoidal, ctx.formed, ctx.blocks, ctx.acc = trapezoidal, formed, blocks, acc
        flat, ctx.spec = _flatten(kept)
        ctx.save_for_backward(V, x, Vt, *Ss, *flat)
        return y

    @staticmethod
    def backward(ctx: Any, g: Any) -> Any:
        V, x, Vt, *rest = ctx.saved_tensors
        m = len(ctx.blocks)
        if torch.is_grad_enabled():
            Vt = _tril(V) if ctx.trapezoidal else V
            _, state = _node_forward(Vt, x, ctx.blocks, ctx.formed, ctx.acc)
            inplace = False
        else:
            state = (rest[:m], _unflatten(rest[m:], ctx.spec))
            inplace = True
        need_x = ctx.needs_input_grad[1]
        V_bar, x_bar = _node_vjp(Vt, x, g, state, ctx.blocks, ctx.formed, need_x, inplace)
        return (V_bar.tril_() if ctx.trapezoidal else V_bar), x_bar, None, None, None


# -- the layer node's math in torch calls (``cwy_rows``' functions, without the wrappers) ---


def _tril(V: Any) -> Any:
    """tril(V) as a copy then ``tril_`` (torch's out-of-place ``tril`` took 2–3× as long)."""
    return V.clone(memory_format=torch.contiguous_format).tril_()


@functools.lru_cache(maxsize=8)
def _masks(n: int, dtype: Any, device: Any) -> tuple[Any, Any]:
    """(H, U) for n × n blocks: H = ½ on the diagonal, 1 above it, 0 below (S = G ∘ H for
    nonzero columns), U the boolean upper triangle with its diagonal (E(M) below). Built as
    normal tensors also when the first call is under ``torch.inference_mode`` (an inference
    tensor in the cache would make every later recorded use, a double backward's, raise)."""
    with torch.inference_mode(False):
        U = torch.ones(n, n, dtype=torch.bool, device=device).triu_()
        H = U.to(dtype)
        H.diagonal().fill_(0.5)
    return H, U


def _factor(Vb: Any, acc: Any) -> Any:
    """S = ½ diag(δ) + striu(VᵀV) in ``acc`` (``cwy_rows.rows_factor``; δ_j := 2 for a zero
    column, which the last reflector of a QR often is; NaN/Inf raise there): a Gram, one
    reduction read on the host (min and max of δ), and S = G ∘ H from a cached mask."""
    Va = Vb.to(acc)
    G = Va.mT @ Va
    n = G.shape[-1]
    delta = G.diagonal()
    lo, hi = torch.stack(torch.aminmax(delta)).tolist()  # one sync on a GPU
    if not math.isfinite(hi):
        R.rows_factor(Vb, _xp)  # raises, naming the columns
    if n <= MASKED_MAX_N:
        S = G * _masks(n, acc, G.device)[0]
    else:
        S = G.triu()
        S.diagonal().mul_(0.5)
    if lo <= 0:  # zero columns: S_jj = 1
        S.diagonal().add_(delta == 0)
    return S


def _sym_upper(M: Any) -> Any:
    """E(M) = triu(M) + striu(M)ᵀ, the Gram's cotangent map (``cwy_rows._gram_vjp``), by
    one ``where`` on a cached mask (half the time of ``triu`` + transposed add)."""
    n = M.shape[-1]
    if n > MASKED_MAX_N:
        return M.triu() + M.triu(1).mT
    return torch.where(_masks(n, M.dtype, M.device)[1], M, M.mT)


def _solve(S: Any, r: Any, dt: Any, adjoint: bool = False, own: bool = False) -> Any:
    """S⁻¹ r (``adjoint``: S⁻ᵀ r) in S's dtype, rounded to ``dt``. r is solved in place (no
    copy, ``out=``) where the node owns it (``own``, or cast here) and autograd records
    nothing."""
    if r.dtype != S.dtype:
        r, own = r.to(S.dtype), True
    A = S.mT if adjoint else S
    if own and not torch.is_grad_enabled():
        return torch.linalg.solve_triangular(A, r, upper=not adjoint, out=r).to(dt)
    return torch.linalg.solve_triangular(A, r, upper=not adjoint).to(dt)


def _contiguous(x: Any) -> Any:
    return x.clone(memory_format=torch.contiguous_format)


def _part(M: Any, r: int, c: int, e: int | None = None) -> Any:
    """M[r:, c:e] (e None: to the end), M itself where that is all of it: one block has no
    slicing ops (each a dispatched op, microseconds a step at small N)."""
    if r == 0 and c == 0 and (e is None or e == M.shape[-1]):
        return M
    return M[r:, c:e]


def _node_product(
    V: Any,
    Ss: list,
    x: Any,
    blocks: list,
    acc: Any,
    inplace: bool,
    identity: bool = False,
    keep: bool = True,
) -> tuple[Any, list]:
    """``cwy_rows.blocks_product`` for 2-D x: y = x Q_mᵀ⋯Q₁ᵀ, the last block first, each
    a = z V_b, b = a S_b⁻ᵀ, z −= b V_bᵀ on columns row…; kept: each block's input columns
    and b. ``inplace``: on one copy of x (one block: y = x − b Vᵀ, no copy). ``identity``
    (x = I, in place): block b also reads and updates rows row… only (``?orgqr``'s order:
    the blocks after it changed the trailing rows and columns only, so the rows above are
    zero in its columns); its kept input and b then have those rows only. ``keep=False``
    (a forward nothing records): the blocks' inputs are not copied for ``kept``."""
    dt, last = V.dtype, len(blocks) - 1
    z = _contiguous(x) if inplace and last else x
    trailing = identity and inplace and last
    kept = []
    for i in range(last, -1, -1):
        row, s, e = blocks[i]
        r0 = row if trailing else 0
        Vb, zt = _part(V, row, s, e), _part(z, r0, row)
        if not inplace or not last or not keep:
            zin = zt
        else:
            zin = _part(x, r0, row) if i == last else _contiguous(zt)
        b = _solve(Ss[i], (zt @ Vb).mT, dt, own=True).mT
        if inplace and last:
            zt.addmm_(b, Vb.mT, alpha=-1)
        else:
            tail = torch.addmm(zt, b, Vb.mT, alpha=-1)
            z = torch.cat([z[:, :row], tail], 1) if row else tail
        kept.append((zin, b))
    return z, kept[::-1]


def _node_blocks_vjp(
    V: Any, Ss: list, g: Any, kept: list, blocks: list, need_x: bool, inplace: bool
) -> tuple[Any, Any]:
    """``cwy_rows.blocks_vjp``: the first block first, c = ḡ V_b, d = c S_b⁻¹,
    V̄_b = V_b E(dᵀb) − ḡᵀb − zᵀd, ḡ −= d V_bᵀ on columns row…; x̄ = ḡ at the end. Without
    x̄ the update covers the columns the next block reads (row of the next block…) only."""
    dt, m = V.dtype, len(blocks)
    update = inplace and m > 1
    gb = _contiguous(g) if update else g
    out = V.new_zeros(V.shape) if m > 1 else None
    for i, ((row, s, e), S, (z, b)) in enumerate(zip(blocks, Ss, kept, strict=True)):
        Vb, gt = _part(V, row, s, e), _part(gb, 0, row)
        d = _solve(S, (gt @ Vb).mT, dt, adjoint=True, own=True).mT
        off = gt.shape[0] - b.shape[0]  # the rows that ``identity`` left out (zero in b, z)
        dr, gr = (d[off:], gt[off:]) if off else (d, gt)
        Vbar = torch.addmm(Vb @ _sym_upper(dr.mT @ b), gr.mT, b, alpha=-1)
        Vbar = torch.addmm(Vbar, z.mT, dr, alpha=-1)
        if m == 1:
            out = Vbar
        else:
            out[row:, s:e] = Vbar
        if need_x or i < m - 1:  # without x̄, only the columns the next blocks read
            c0 = row if need_x else blocks[i + 1][0]
            Vc = V[c0:, s:e]
            if update:
                gb[:, c0:].addmm_(d, Vc.mT, alpha=-1)
            else:
                tail = torch.addmm(gb[:, c0:], d, Vc.mT, alpha=-1)
                gb = torch.cat([gb[:, :c0], tail], 1) if c0 else tail
    return out, (gb if need_x else None)


def node_forward(V: Any, x: Any, trapezoidal: bool, formed: bool, block: int) -> Any:
    """:class:`CWYLinear`'s forward x Qᵀ where nothing records it (no grad, inference mode:
    the planner's ``node_forward`` paths): the same blocks and rounding, no autograd node,
    nothing kept for a backward. A new tensor; V and x are not modified."""
    Vt = _tril(V) if trapezoidal else V
    blocks = R.column_blocks(V.shape[-1], block, trapezoidal)
    acc = accumulation_dtype_for(_xp, V)
    return _node_forward(Vt, x, blocks, formed, acc, inplace=True, keep=False)[0]


def _node_forward(
    V: Any, x: Any, blocks: list, formed: bool, acc: Any, inplace: bool = False, keep: bool = True
) -> tuple[Any, tuple[list, Any]]:
    """``cwy_rows.layer_forward``: (y, (S_b, kept)); formed from one block W = I − V Z with
    Z = S⁻¹Vᵀ (kept: W, Z), from several P = the blocks applied to I (kept: P and theirs);
    ``keep=False``: no copies for ``kept`` (:func:`_node_product`)."""
    Ss = [_factor(_part(V, row, s, e), acc) for row, s, e in blocks]
    if not formed:
        y, kept = _node_product(V, Ss, x, blocks, acc, inplace, keep=keep)
        return y, (Ss, kept)
    eye = torch.eye(V.shape[-2], dtype=V.dtype, device=V.device)
    if len(blocks) == 1:
        Z = _solve(Ss[0], V.mT, V.dtype)
        W = torch.addmm(eye, V, Z, alpha=-1)
        return x @ W.mT, (Ss, (W, Z))
    P, kept = _node_product(V, Ss, eye, blocks, acc, inplace, identity=True, keep=keep)
    return x @ P, (Ss, (P, kept))


def _node_vjp(
    V: Any, x: Any, g: Any, state: Any, blocks: list, formed: bool, need_x: bool, inplace: bool
) -> tuple[Any, Any]:
    """``cwy_rows.layer_vjp``: applied, the blocks' rule; formed from one block
    W̄ = gᵀx, C = S⁻ᵀVᵀW̄, V̄ = V E(C Zᵀ) − W̄ Zᵀ − Cᵀ, x̄ = g W; from several, the blocks'
    rule for P̄ = xᵀg and x̄ = g Pᵀ."""
    Ss, kept = state
    if not formed:
        return _node_blocks_vjp(V, Ss, g, kept, blocks, need_x, inplace)
    if len(blocks) == 1:  # Cᵀ = W̄ᵀV S⁻¹ (C = S⁻ᵀ (W̄ᵀV)ᵀ solved in place: Cᵀ row-major)
        W, Z = kept
        Wbar = g.mT @ x
        Ct = _solve(Ss[0], (Wbar.mT @ V).mT, V.dtype, adjoint=True, own=True).mT
        Vbar = torch.addmm(Ct, Wbar, Z.mT, beta=-1, alpha=-1)
        Vbar = torch.addmm(Vbar, V, _sym_upper(Ct.mT @ Z.mT))
        return Vbar, (g @ W if need_x else None)
    P, kept = kept
    Vbar, _ = _node_blocks_vjp(V, Ss, x.mT @ g, kept, blocks, False, inplace)
    return Vbar, (g @ P.mT if need_x else None)


def _flatten(tree: Any) -> tuple[list[torch.Tensor], Any]:
    """The tensors of a nest of tuples/lists (``save_for_backward`` takes a flat list) and
    the nest's structure for :func:`_unflatten`."""
    if isinstance(tree, torch.Tensor):
        return [tree], None
    flat, spec = [], []
    for t in tree:
        f, s = _flatten(t)
        flat += f
        spec.append((len(f), s))
    return flat, (type(tree), spec)


def _unflatten(flat: Any, spec: Any) -> Any:
    if spec is None:
        return flat[0]
    kind, parts = spec
    out, i = [], 0
    for n, s in parts:
        out.append(_unflatten(flat[i : i + n], s))
        i += n
    return kind(out)


# -- sequential Householder products -----------------------------------------------------------


class HouseholderApply(torch.autograd.Function):
    """(V, h) ↦ H(v₁)(H(v₂)(…H(v_L) h)) for h (..., N, B), one reflection at a time."""

    generate_vmap_rule = True

    @staticmethod
    def forward(V: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        U, _ = K.normalize_columns(V, _xp)
        return reflect_all(U, h, _xp)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.save_for_backward(*inputs)
        ctx.save_for_forward(*inputs)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        V, h = ctx.saved_tensors
        return householder_apply_vjp(V, h, g, _xp)

    @staticmethod
    def _jvp(ctx: Any, dV: Any, dh: Any) -> Any:
        return _sequential_jvp(*ctx.saved_tensors, dV, dh)


def _sequential_jvp(V: Any, h: Any, dV: Any, dh: Any) -> Any:
    """The tangent of H(v₁)…H(v_L) h: the product is the compact WY map (Likhosherstov et
    al., AISTATS 2021, Theorem 2), so its JVP is that of the factors and the low-rank apply
    (N·L² + 4·N·L·B flops, against the sequential 4·N·L·B forward)."""
    U, T, r = K.cwy_factors(V, _xp, check=False)
    if dV is None:
        dU = dT = None
    else:
        dU, dT, _ = KJ.factor_tangents(U, T, r, dV, _xp)
    return KJ.lowrank_jvp(U, T, h, dU, dT, dh, _xp, transpose=False, mode="square")


class HouseholderApplyNumba(torch.autograd.Function):
    """(V, h) ↦ H(v₁)…H(v_L) h on CPU by the Numba kernels (``_numba_kernels.hprod`` /
    ``hgrad``), the tensors handed over by DLPack without copies.

    The backward is an opaque kernel, so it is ``once_differentiable``: first derivatives
    only (a second differentiation raises), and no ``torch.func`` transforms (use
    ``HouseholderApply`` for those)."""

    @staticmethod
    def forward(V: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        NK = load_numba()
        return from_numpy(NK.hprod(to_numpy(V, name="V"), to_numpy(h, name="h")), like=V)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.save_for_backward(*inputs)
        ctx.save_for_forward(*inputs)

    @staticmethod
    def _jvp(ctx: Any, dV: Any, dh: Any) -> Any:
        return _sequential_jvp(*ctx.saved_tensors, dV, dh)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        NK = load_numba()
        V, h = ctx.saved_tensors
        V_bar, h_bar = NK.hgrad(to_numpy(V), to_numpy(g, name="g"), h=to_numpy(h))
        return from_numpy(V_bar, like=V), from_numpy(h_bar, like=h)


# -- retractions -------------------------------------------------------------------------


class Polar(torch.autograd.Function):
    """X ↦ polar(X) by Newton–Schulz; ``box`` (a dict or None) receives the forward's info."""

    @staticmethod
    def forward(X: torch.Tensor, num_iters: Any, restart: Any, box: Any) -> torch.Tensor:
        Q, info = polar_forward(X, _xp, num_iters, restart)
        if box is not None:
            box.update(info)
        return Q

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def backward(ctx: Any, G: torch.Tensor) -> Any:
        (X,) = ctx.saved_tensors
        return polar_backward(X, G, _xp), None, None, None

    @staticmethod
    def _jvp(ctx: Any, dX: Any, *_: Any) -> Any:
        (X,) = ctx.saved_tensors
        work = torch.float64 if X.dtype == torch.float32 and X.device.type == "cpu" else X.dtype
        work = torch.complex128 if X.dtype == torch.complex64 and work != X.dtype else work
        dQ = RK.polar_jvp(X.to(work), dX.to(work), _xp)
        return dQ.to(X.dtype)

    @staticmethod
    def vmap(info: Any, in_dims: tuple, X: torch.Tensor, num_iters: Any, restart: Any, box: Any):
        # polar is batched over leading axes: run it once on the real (unbatched) tensor
        return with_jvp(Polar).apply(X.movedim(in_dims[0], 0), num_iters, restart, box), 0


class CayleySMW(torch.autograd.Function):
    """(X, Z, t) ↦ (Cayley(tW) X along Z by SMW, max ‖XᵀX − I‖_F); the drift is not
    differentiable. ``step`` is a Python float or a tensor of shape (..., 1, 1)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(X: Any, Z: Any, step: Any) -> tuple[Any, Any]:
        return RK.cayley_along(X, Z, step, _xp)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:
        X, Z, step = inputs
        ctx.mark_non_differentiable(output[1])
        ctx.step_is_tensor = isinstance(step, torch.Tensor)
        if ctx.step_is_tensor:
            ctx.save_for_backward(X, Z, step)
            ctx.save_for_forward(X, Z, step)
        else:
            ctx.save_for_backward(X, Z)
            ctx.save_for_forward(X, Z)
            ctx.step = step

    @staticmethod
    def _jvp(ctx: Any, dX: Any, dZ: Any, dstep: Any) -> Any:
        if ctx.step_is_tensor:
            X, Z, step = ctx.saved_tensors
        else:
            (X, Z), step, dstep = ctx.saved_tensors, ctx.step, None
        return RK.cayley_along_jvp(X, Z, step, dX, dZ, dstep, _xp), None  # the drift: none

    @staticmethod
    def backward(ctx: Any, Ybar: torch.Tensor, _drift_bar: Any) -> Any:
        if ctx.step_is_tensor:
            X, Z, step = ctx.saved_tensors
        else:
            (X, Z), step = ctx.saved_tensors, ctx.step
        Xbar, Zbar, sb = RK.cayley_along_vjp(X, Z, step, Ybar, _xp)
        step_bar = None
        if ctx.step_is_tensor:
            step_bar = torch.reshape(sum_to_shape(sb, tuple(step.shape[:-2]), _xp), step.shape)
        return Xbar, Zbar, step_bar


class QRPositive(torch.autograd.Function):
    """Y ↦ qf(Y), the Q factor of the thin QR with diag(R) ≥ 0."""

    generate_vmap_rule = True

    @staticmethod
    def forward(Y: torch.Tensor) -> torch.Tensor:
        return RK.qr_positive(Y, _xp)[0]

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        # the backward recomputes Q, R from Y (one more QR) so that double backward sees
        # R's dependence on Y through torch.linalg.qr's own derivative
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def backward(ctx: Any, Qbar: torch.Tensor) -> Any:
        (Y,) = ctx.saved_tensors
        return RK.qr_vjp(Y, Qbar, _xp)

    @staticmethod
    def _jvp(ctx: Any, dY: Any) -> Any:
        (Y,) = ctx.saved_tensors
        return RK.qr_jvp(Y, dY, _xp)


# -- forward mode: the same Functions with their ``jvp`` ----------------------------------------

#: Dynamo cannot trace a Function that defines ``jvp`` (torch 2.13: "Unsupported custom jvp"):
#: eager calls take these twins (forward mode works: ``torch.func.jvp``, dual tensors), calls
#: traced by ``torch.compile`` the Functions above (one graph, no forward mode there).
_FORWARD = {
    cls: type(cls.__name__, (cls,), {"jvp": staticmethod(cls._jvp), "__module__": __name__})
    for cls in (
        CWYFactors,
        CWYFactorsDiag,
        LowRankApply,
        LowRankApplyKept,
        HouseholderApply,
        HouseholderApplyNumba,
        Polar,
        CayleySMW,
        QRPositive,
    )
}


def with_jvp(cls: Any) -> Any:
    """``cls`` with its ``jvp`` outside ``torch.compile``, ``cls`` itself while tracing."""
    return cls if torch.compiler.is_compiling() else _FORWARD[cls]


# -- the rule table ---------------------------------------------------------------------------


def _polar(xp: Any, X: Any, num_iters: Any, restart: Any) -> tuple[Any, dict[str, Any]]:
    box: dict[str, Any] = {}
    return with_jvp(Polar).apply(X, num_iters, restart, box), box


RULES = {
    "cwy_factors": lambda xp, V, sdiag=None: (
        with_jvp(CWYFactors).apply(V) if sdiag is None else with_jvp(CWYFactorsDiag).apply(V, sdiag)
    ),
    "lowrank": _lowrank,
    "householder_apply": lambda xp, V, h: with_jvp(HouseholderApply).apply(V, h),
    "polar": _polar,
    "cayley": lambda xp, X, Z, step: with_jvp(CayleySMW).apply(X, Z, step),
    "qr_q": lambda xp, Y: with_jvp(QRPositive).apply(Y),
}
