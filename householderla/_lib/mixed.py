"""Products of half-precision matrices accumulated, and returned, in float32.

A Gram matrix rounded back to bfloat16 has lost what it is needed for (‖XᵀX − I‖ of an
orthonormal X is ~2⁻⁸ after that rounding). :func:`matmul_acc` keeps half-precision operands and
a float32 result where the backend hands out its accumulator (JAX ``preferred_element_type``,
torch CUDA ``out_dtype``), else multiplies exact float32 copies. :func:`matmul_split` multiplies
by a float32 matrix as B_hi + B_lo, both halves in the half dtype. The device is read by
:func:`~householderla._lib.device.device_kind`: under ``emulate_device("cuda")`` CPU tensors
take the CUDA path, whose ``out_dtype`` product (CUDA-only, and without a derivative in
torch ≤ 2.13) runs through :class:`_WideMatmul` with exact float32 copies instead.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import array_api_compat as aac

from .device import device_kind
from .namespace import is_half

__all__ = ["addmm", "has_wide_matmul", "matmul_acc", "matmul_split", "widen"]


def widen(x: Any, xp: Any) -> Any:
    """``x`` itself, or a float32 copy of a half-precision (bfloat16/float16) ``x``: what the
    compact WY factors of half-precision V are computed from (``docs/theory/lowprec.rst``:
    rounding the Gram matrix, the norms or T = S⁻¹ to half precision would cost the
    orthogonality). The cast is exact, and torch and JAX differentiate it natively (its
    backward rounds the cotangent once to ``x``'s dtype)."""
    return xp.astype(x, xp.float32) if is_half(xp, x.dtype) else x


def has_wide_matmul(xp: Any, x: Any) -> bool:
    """Whether half-precision products with a float32 result run natively for arrays like
    ``x`` (JAX on every device; torch on CUDA where ``torch.mm`` takes ``out_dtype``, torch
    ≥ 2.8; CPU tensors under ``emulate_device("cuda")``)."""
    if aac.is_jax_namespace(xp):
        return True
    if aac.is_torch_namespace(xp):
        if x.device.type == "cuda":
            return _torch_out_dtype(x.dtype)
        return device_kind(x) == "cuda"  # emulated: exact float32 copies (_WideMatmul)
    return False


@functools.cache
def _torch_out_dtype(dtype: Any) -> bool:  # pragma: no cover - needs a GPU
    torch = sys.modules["torch"]
    try:
        a = torch.ones((2, 2), dtype=dtype, device="cuda")
        return torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
    except (TypeError, RuntimeError, NotImplementedError):
        return False


def _torch_wide_matmul(a: Any, b: Any, acc: Any) -> Any:
    """a @ b (batched, broadcast like ``@``) of one half dtype, returned in ``acc``:
    ``out_dtype`` on CUDA (mm, or bmm over the broadcast batch), exact ``acc`` copies on the
    CPU (emulated CUDA)."""
    torch = sys.modules["torch"]
    if a.device.type != "cuda":
        return a.to(acc) @ b.to(acc)
    if a.ndim == 2 and b.ndim == 2:  # pragma: no cover - needs a GPU
        return torch.mm(a, b, out_dtype=acc)
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])  # pragma: no cover - GPU
    a3 = a.expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])  # pragma: no cover
    b3 = b.expand(*batch, *b.shape[-2:]).reshape(-1, *b.shape[-2:])  # pragma: no cover
    out = torch.bmm(a3, b3, out_dtype=acc)  # pragma: no cover - needs a GPU
    return out.reshape(*batch, *out.shape[-2:])  # pragma: no cover - needs a GPU


def _wide_matmul_function() -> Any:
    """The autograd Function of the wide product (built on first use: torch may be absent).
    ``mm``/``bmm`` with ``out_dtype`` have no derivative in torch (2.13: "derivative for
    aten::mm is not implemented"), which a double backward, or any product recorded by
    autograd, would reach: the backward is Ā = Ḡ Bᵀ, B̄ = Aᵀ Ḡ in the accumulation dtype,
    summed over broadcast batch axes there, and rounded once to the operands' dtype (torch
    ops: differentiable again)."""
    torch = sys.modules["torch"]

    class _WideMatmul(torch.autograd.Function):
        generate_vmap_rule = True  # torch ops only: torch.func.vmap batches them

        @staticmethod
        def forward(a: Any, b: Any, acc: Any) -> Any:
            return _torch_wide_matmul(a, b, acc)

        @staticmethod
        def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
            a, b, _ = inputs
            ctx.save_for_backward(a, b)

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            a, b = ctx.saved_tensors
            ga = gb = None
            if ctx.needs_input_grad[0]:
                ga = (g @ b.to(g.dtype).mT).sum_to_size(a.shape).to(a.dtype)
            if ctx.needs_input_grad[1]:
                gb = (a.to(g.dtype).mT @ g).sum_to_size(b.shape).to(b.dtype)
            return ga, gb, None

    return _WideMatmul


_WIDE: list[Any] = []


def matmul_acc(xp: Any, a: Any, b: Any, acc: Any) -> Any:
    """a @ b for ``a``, ``b`` of one half-precision dtype, accumulated and returned in ``acc``
    (batched over leading axes like ``@``)."""
    if aac.is_jax_namespace(xp):
        import jax.numpy as jnp

        return jnp.matmul(a, b, preferred_element_type=acc)
    if has_wide_matmul(xp, a):  # torch on CUDA (or emulated CUDA: see the module docstring)
        if not _WIDE:
            _WIDE.append(_wide_matmul_function())
        return _WIDE[0].apply(a, b, acc)
    return xp.astype(a, acc) @ xp.astype(b, acc)


def addmm(xp: Any, C: Any, A: Any, B: Any, beta: float, alpha: float) -> Any:
    """beta·C + alpha·(A @ B): torch's fused ``addmm`` / ``baddbmm`` (one pass over the
    output instead of three elementwise ones: 10–25% of a bfloat16 Muon step on CPU at
    512 × 2048), the plain expression elsewhere (XLA fuses it under jit)."""
    if aac.is_torch_namespace(xp) and C.ndim == A.ndim == B.ndim and C.ndim in (2, 3):
        torch = sys.modules["torch"]
        fn = torch.addmm if C.ndim == 2 else torch.baddbmm
        return fn(C, A, B, beta=beta, alpha=alpha)
    return beta * C + alpha * (A @ B)


def matmul_split(xp: Any, a: Any, B: Any) -> Any:
    """a @ B for half-precision ``a`` and ``B`` in the accumulation dtype, returned in B's
    dtype: two half-precision products a @ B_hi + a @ B_lo (relative error of B's split
    ~2⁻¹⁶ for bfloat16), or one product of a float32 copy where products are not native."""
    if not has_wide_matmul(xp, a):
        return xp.astype(a, B.dtype) @ B
    hi = xp.astype(B, a.dtype)
    lo = xp.astype(B - xp.astype(hi, B.dtype), a.dtype)
    return matmul_acc(xp, a, hi, B.dtype) + matmul_acc(xp, a, lo, B.dtype)
