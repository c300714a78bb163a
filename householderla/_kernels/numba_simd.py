"""SIMD for the SIMD-lane kernel: LLVM's SLP vectoriser, and an 8 × 8 transpose in registers.

:func:`slp_njit` compiles a kernel with LLVM's SLP vectoriser on (Numba leaves it off).
:func:`tile_in`, :func:`operands_in` and :func:`tile_out` move a tile of eight matrices into
and out of the lanes kernel's (N, ·, 8) scratch by :func:`transpose8`: eight vector loads,
three rounds of ``shufflevector`` and eight vector stores instead of 64 scalar ones. With
``nontemporal`` the stores bypass the caches (no write-allocate read of the output); the
destination must be aligned to the vector, which :func:`address` lets the caller check.
"""

from __future__ import annotations

import platform
from typing import Any

from .numba_loops import HAVE_NUMBA, njit

__all__ = [
    "LANES",
    "NONTEMPORAL",
    "address",
    "operands_in",
    "slp_njit",
    "store_fence",
    "tile_in",
    "tile_in_columns",
    "tile_out",
    "transpose8",
    "transpose8_nt",
]

#: A hash of the sibling kernel modules this one imports: Numba's on-disk cache keys a
#: compiled function on its own file only, so changing this line when one of them changes
#: makes the cache recompile (tests/test_numba_kernels.py checks it).
KERNEL_DEPS = "b0a0beb634880961"

#: Matrices per tile of the lanes kernel (:mod:`~householderla._kernels.numba_lanes`): one
#: 512-bit vector of float64; the transposes below are written for eight.
LANES = 8

#: Whether :func:`transpose8_nt` really bypasses the caches: x86-64, where the
#: ``sfence`` that orders such stores before the kernel returns exists (elsewhere it is
#: :func:`transpose8`).
NONTEMPORAL = platform.machine().lower() in ("x86_64", "amd64")

# (a, b) → the shufflevector masks of each round; round r pairs vector q with q + 2^r
_ROUNDS = (
    (1, [0, 8, 2, 10, 4, 12, 6, 14], [1, 9, 3, 11, 5, 13, 7, 15]),
    (2, [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]),
    (4, [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]),
)


def _transposed(builder: Any, rows: list[Any]) -> list[Any]:
    """cols[w][q] = rows[q][w] for eight 8-vectors (the masks above, checked in the tests)."""
    from llvmlite import ir

    mask = ir.VectorType(ir.IntType(32), 8)
    v = list(rows)
    for d, lo, hi in _ROUNDS:
        out = list(v)
        for q in range(8):
            if q & d:
                continue
            a, b = v[q], v[q + d]
            out[q] = builder.shuffle_vector(a, b, ir.Constant(mask, lo))
            out[q + d] = builder.shuffle_vector(a, b, ir.Constant(mask, hi))
        v = out
    return v


def slp_njit(sigs: Any) -> Any:
    """:func:`~householderla._kernels.numba_loops.njit` with LLVM's SLP vectoriser on for this
    compilation only (Numba's ``config.SLP_VECTORIZE``, read when the pass manager is built),
    under Numba's compiler lock so that no other compilation sees the switch; the cached
    machine code is what this compilation produced."""

    def deco(fn: Any) -> Any:
        if not HAVE_NUMBA:
            return fn
        from numba.core import config
        from numba.core.compiler_lock import global_compiler_lock

        with global_compiler_lock:
            old = config.SLP_VECTORIZE
            config.SLP_VECTORIZE = 1
            try:
                return njit(sigs)(fn)
            finally:
                config.SLP_VECTORIZE = old

    return deco


def _make(nontemporal: bool) -> Any:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def transpose8(typingctx: Any, src: Any, s0: Any, ss: Any, dst: Any, d0: Any, ds: Any) -> Any:
        """dst.flat[d0 + w·ds + q] = src.flat[s0 + q·ss + w] for q, w < 8 (C-contiguous
        arrays of one dtype; flat element offsets and strides; unchecked bounds)."""
        i64t = types.int64
        sig = types.void(src, i64t, i64t, dst, i64t, i64t)

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            a = signature.args
            sv, dv = args[0], args[3]
            s0v, ssv, d0v, dsv = (context.cast(builder, args[n], a[n], i64t) for n in (1, 2, 4, 5))
            i64 = ir.IntType(64)
            sp = context.make_array(a[0])(context, builder, sv).data
            dp = context.make_array(a[3])(context, builder, dv).data
            elt = context.get_data_type(a[0].dtype)
            vty = ir.VectorType(elt, 8)
            size = context.get_abi_sizeof(elt)
            rows = []
            for q in range(8):
                off = builder.add(s0v, builder.mul(ssv, ir.Constant(i64, q)))
                p = builder.bitcast(builder.gep(sp, [off]), vty.as_pointer())
                rows.append(builder.load(p, align=size))
            for w, col in enumerate(_transposed(builder, rows)):
                off = builder.add(d0v, builder.mul(dsv, ir.Constant(i64, w)))
                p = builder.bitcast(builder.gep(dp, [off]), vty.as_pointer())
                st = builder.store(col, p, align=8 * size if nontemporal else size)
                if nontemporal:
                    md = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
                    st.set_metadata("nontemporal", md)
            return context.get_dummy_value()

        return sig, codegen

    return transpose8


def _make_address() -> Any:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def address(typingctx: Any, arr: Any) -> Any:
        """The address of ``arr``'s first element (to check its alignment)."""

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            data = context.make_array(signature.args[0])(context, builder, args[0]).data
            return builder.ptrtoint(data, ir.IntType(64))

        return types.int64(arr), codegen

    return address


def _make_fence() -> Any:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def store_fence(typingctx: Any) -> Any:
        """``sfence`` (x86-64; nothing elsewhere): the non-temporal stores made so far are
        visible to every core before anything stored after it."""

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            if NONTEMPORAL:
                fty = ir.FunctionType(ir.VoidType(), [])
                fn = cgutils.get_or_insert_function(builder.module, fty, "llvm.x86.sse.sfence")
                builder.call(fn, [])
            return context.get_dummy_value()

        return types.void(), codegen

    return store_fence


if HAVE_NUMBA:
    transpose8 = _make(False)
    transpose8_nt = _make(True) if NONTEMPORAL else transpose8
    address = _make_address()
    store_fence = _make_fence()
else:  # pragma: no cover - the kernels are not compiled without Numba
    transpose8 = transpose8_nt = address = store_fence = None


@njit(inline="always")
def _flat_in(X: Any, p0: int, Xt: Any) -> None:
    """Xt.flat[8q + w] = X[p0 + w].flat[q]: matrices p0…p0+7 of X (P, N, n), each read as
    one row of N·n, transposed into scratch whose rows are n lanes long (tiny N: one
    transpose per eight entries instead of a row-by-row walk)."""
    _, N, n = X.shape
    size = N * n
    q8 = size - size % 8
    for q0 in range(0, q8, 8):
        transpose8(X, p0 * size + q0, size, Xt, q0 * LANES, LANES)
    for q in range(q8, size):
        i, k = q // n, q % n
        for w in range(LANES):
            Xt[i, k, w] = X[p0 + w, i, k]


@njit(inline="always")
def _flat_out(Yt: Any, Y: Any, p0: int) -> None:
    """Y[p0 + w].flat[q] = Yt.flat[8q + w]: :func:`_flat_in` backwards."""
    _, N, C = Y.shape
    size = N * C
    q8 = size - size % 8
    for q0 in range(0, q8, 8):
        transpose8(Yt, q0 * LANES, LANES, Y, p0 * size + q0, size)
    for q in range(q8, size):
        i, j = q // C, q % C
        for w in range(LANES):
            Y[p0 + w, i, j] = Yt[i, j, w]


@njit(inline="always")
def tile_in(V: Any, p0: int, L: int, trap: bool, unit: bool, tau_in: Any, Vt: Any, Ls: int):
    """Vt[i, k, w] ← column k of matrix p0 + w's reflectors (a full tile of eight): blocks
    of eight columns by :func:`transpose8`, the entries above the diagonal (``trap``)
    zeroed after, LAPACK's unit diagonal and τ = 0 columns (``unit``) set after; the last
    L mod 8 columns one by one."""
    _, N, n = V.shape
    if Ls == n:  # rows as long as the scratch's: the tile is one flat (N·n) × 8 transpose
        _flat_in(V, p0, Vt)
        if trap:
            for i in range(min(N, L)):
                for k in range(i + 1, L):
                    for w in range(LANES):
                        Vt[i, k, w] = 0
    else:
        k8 = L - L % 8
        for i in range(N):
            for k0 in range(0, min(k8, i + 1) if trap else k8, 8):
                transpose8(V, (p0 * N + i) * n + k0, N * n, Vt, (i * Ls + k0) * LANES, LANES)
                if trap:
                    for k in range(i + 1, min(k0 + 8, L)):
                        for w in range(LANES):
                            Vt[i, k, w] = 0
            for w in range(LANES):
                for k in range(k8, min(i + 1, L) if trap else L):
                    Vt[i, k, w] = V[p0 + w, i, k]
    if unit:
        for w in range(LANES):
            for k in range(min(N, L)):
                Vt[k, k, w] = 1
                if tau_in[p0 + w, k] == 0:  # H = I
                    for i in range(k, N):
                        Vt[i, k, w] = 0


@njit(inline="always")
def tile_in_columns(
    Vc: Any, p0: int, L: int, trap: bool, unit: bool, tau_in: Any, Vt: Any, Ls: int
) -> None:
    """:func:`tile_in` for reflectors given column by column: Vc (P, n, N) C-contiguous
    holds each matrix transposed (row k of Vc[p] is column k, as a column-major ``a`` of
    ``?geqrf`` is laid out), so column k of eight matrices goes in by one
    :func:`transpose8` per eight rows, no copy to row-major order first; with ``trap`` from
    the block holding row k on, its entries above row k zeroed after; the last N mod 8 rows
    one by one; ``unit`` as :func:`tile_in`."""
    _, n, N = Vc.shape
    i8 = N - N % 8
    for k in range(L):
        lo = k - k % 8 if trap else 0  # the first block of eight rows with a row ≥ k
        for i0 in range(lo, i8, 8):
            transpose8(Vc, (p0 * n + k) * N + i0, n * N, Vt, (i0 * Ls + k) * LANES, Ls * LANES)
        if trap:
            for i in range(lo, min(k, i8)):
                for w in range(LANES):
                    Vt[i, k, w] = 0
        for w in range(LANES):
            for i in range(max(i8, k) if trap else i8, N):
                Vt[i, k, w] = Vc[p0 + w, k, i]
    if unit:
        for w in range(LANES):
            for k in range(min(N, L)):
                Vt[k, k, w] = 1
                if tau_in[p0 + w, k] == 0:  # H = I
                    for i in range(k, N):
                        Vt[i, k, w] = 0


@njit(inline="always")
def tile_out(Yt: Any, Y: Any, p0: int, Cs: int, nt: bool) -> None:
    """The full tile Yt (matrices p0…p0+7) into Y: 8 × 8 blocks transposed in registers
    (past the caches with ``nt``), the last C mod 8 columns one by one."""
    _, N, C = Y.shape
    if Cs == C:  # (C odd, never ``nt``) one flat transpose
        _flat_out(Yt, Y, p0)
        return
    for i in range(N):
        j0 = 0
        while j0 + 8 <= C:
            s0, d0 = (i * Cs + j0) * LANES, (p0 * N + i) * C + j0
            if nt:
                transpose8_nt(Yt, s0, LANES, Y, d0, N * C)
            else:
                transpose8(Yt, s0, LANES, Y, d0, N * C)
            j0 += 8
        for w in range(LANES):
            for j in range(j0, C):
                Y[p0 + w, i, j] = Yt[i, j, w]


@njit(inline="always")
def operands_in(H: Any, p0: int, Yt: Any, Cs: int) -> None:
    """Yt[i, j, w] ← H[p0 + w, i, j] (eight operands of a full tile): 8 × 8 blocks by
    :func:`transpose8`, the last C mod 8 columns one by one."""
    _, N, C = H.shape
    if Cs == C:
        _flat_in(H, p0, Yt)
        return
    for i in range(N):
        j0 = 0
        while j0 + 8 <= C:
            transpose8(H, (p0 * N + i) * C + j0, N * C, Yt, (i * Cs + j0) * LANES, LANES)
            j0 += 8
        for w in range(LANES):
            for j in range(j0, C):
                Yt[i, j, w] = H[p0 + w, i, j]
