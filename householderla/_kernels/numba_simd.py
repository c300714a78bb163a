"""SIMD for the SIMD-lane kernel: LLVM's SLP vectoriser, and an 8 × 8 transpose in registers.

:func:`slp_njit` compiles a kernel with LLVM's SLP vectoriser on (Numba leaves it off).

The lanes kernel (:mod:`householderla._kernels.numba_lanes`) ends each tile of eight
matrices by writing lane w of its scratch Yt (N, C, 8) to matrix w of the output. Written as
loops, LLVM turns that into 64 scalar loads and stores per 8 × 8 block; here the block is
loaded as eight vectors, transposed by three rounds of ``shufflevector`` (the classic
unpack / 2-block / 4-block network, which x86 lowers to ``vunpck*pd`` and ``vperm*``
instructions) and stored as eight vectors. With ``nontemporal`` the stores bypass the
caches (``vmovntpd``): for an output larger than the last-level cache, no line of it is read
first to be written (the write-allocate), which saves a third of the memory traffic; the
destination must then be aligned to the vector's size, which :func:`address` lets the caller
check.
"""

from __future__ import annotations

import platform
from typing import Any

from .numba_loops import HAVE_NUMBA, njit

__all__ = [
    "NONTEMPORAL",
    "address",
    "slp_njit",
    "store_fence",
    "store_transposed8",
    "store_transposed8_nt",
]

#: Whether :func:`store_transposed8_nt` really bypasses the caches: x86-64, where the
#: ``sfence`` that orders such stores before the kernel returns exists (elsewhere it is
#: :func:`store_transposed8`).
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
    def store(typingctx: Any, src: Any, s0: Any, dst: Any, d0: Any, stride: Any) -> Any:
        """dst.flat[d0 + w·stride + q] = src.flat[s0 + 8q + w] for q, w < 8 (C-contiguous
        arrays of one dtype; flat element offsets)."""
        sig = types.void(src, types.int64, dst, types.int64, types.int64)

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            sv, s0v, dv, d0v, stv = args
            i64 = ir.IntType(64)
            a = signature.args
            s0v = context.cast(builder, s0v, a[1], types.int64)
            d0v = context.cast(builder, d0v, a[3], types.int64)
            stv = context.cast(builder, stv, a[4], types.int64)
            sp = context.make_array(signature.args[0])(context, builder, sv).data
            dp = context.make_array(signature.args[2])(context, builder, dv).data
            elt = context.get_data_type(signature.args[0].dtype)
            vty = ir.VectorType(elt, 8)
            size = context.get_abi_sizeof(elt)
            rows = []
            for q in range(8):
                p = builder.gep(sp, [builder.add(s0v, ir.Constant(i64, 8 * q))])
                rows.append(builder.load(builder.bitcast(p, vty.as_pointer()), align=size))
            for w, col in enumerate(_transposed(builder, rows)):
                off = builder.add(d0v, builder.mul(stv, ir.Constant(i64, w)))
                p = builder.bitcast(builder.gep(dp, [off]), vty.as_pointer())
                st = builder.store(col, p, align=8 * size if nontemporal else size)
                if nontemporal:
                    md = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
                    st.set_metadata("nontemporal", md)
            return context.get_dummy_value()

        return sig, codegen

    return store


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
    store_transposed8 = _make(False)
    store_transposed8_nt = _make(True) if NONTEMPORAL else store_transposed8
    address = _make_address()
    store_fence = _make_fence()
else:  # pragma: no cover - the kernels are not compiled without Numba
    store_transposed8 = store_transposed8_nt = address = store_fence = None
