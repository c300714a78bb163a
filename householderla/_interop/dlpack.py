"""Zero-copy hand-over of torch / JAX / NumPy / CuPy buffers to kernels, by DLPack.

NumPy-only kernels take a CPU tensor through :func:`to_numpy` and return through
:func:`from_numpy`; CuPy kernels use :func:`to_cupy` / :func:`from_cupy` on torch's current
stream. Only ``from_dlpack`` is used; export detaches, resolves lazy conj/neg bits and makes
contiguous (no-ops for an ordinary tensor). Read-only stays read-only, and ``writable=True``
refuses every case where a write would be lost or corrupt something. :func:`from_numpy` wraps a
fresh output without a copy where the consumer allows it (JAX: 64-byte aligned). Nothing here
imports a framework the caller has not already imported.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import array_api_compat as aac
import numpy as np

__all__ = [
    "aligned_empty",
    "cuda_stream",
    "from_cupy",
    "from_numpy",
    "numpy_dtype",
    "plain_cpu_tensor",
    "plain_cpu_views",
    "to_cupy",
    "to_numpy",
    "writable_numpy",
]

#: Alignment (bytes) under which XLA's CPU client imports a DLPack buffer without a copy.
JAX_ALIGNMENT = 64


def _torch_export(x: Any) -> Any:
    """The tensor DLPack can export: detached, conj/neg bits resolved, C-contiguous."""
    return x.detach().resolve_conj().resolve_neg().contiguous()


def _device_kind(x: Any) -> str:
    dev = aac.device(x)
    if aac.is_torch_array(x):
        return dev.type
    if aac.is_jax_array(x):
        return dev.platform
    return str(dev)


def to_numpy(x: Any, *, writable: bool = False, name: str = "x") -> np.ndarray:
    """A NumPy view of the CPU array ``x`` (torch tensor, JAX array or NumPy array), zero-copy.

    Parameters
    ----------
    x : array
        On the CPU. Non-contiguous tensors are made C-contiguous first (a copy, which the
        result then views); tensors that require grad are detached.
    writable : bool
        Return a view that writes through into ``x``. Refused (``ValueError``) when ``x`` is a
        JAX array or a read-only NumPy array, when autograd tracks ``x`` (the write would
        bypass its version counter), and when ``x`` is not contiguous (the write would land in
        a copy). Default: the view is read-only.
    name : str
        The argument name used in error messages.

    Returns
    -------
    numpy.ndarray
        Shares memory with ``x`` (``np.shares_memory`` is true) whenever no contiguous copy
        was needed; same shape and dtype.
    """
    if isinstance(x, np.ndarray):
        if writable and not x.flags.writeable:
            raise ValueError(f"{name} is a read-only NumPy array; writable=True is impossible")
        if writable and not x.flags.c_contiguous:
            raise ValueError(
                f"{name} is not C-contiguous; a writable contiguous view is impossible"
            )
        out = np.ascontiguousarray(x)
        if not writable and out.flags.writeable:
            out = out.view()
            out.flags.writeable = False
        return out
    if aac.is_torch_array(x):
        if x.device.type != "cpu":
            raise ValueError(
                f"{name} is on {x.device}; use to_cupy for CUDA tensors (no silent copies to host)"
            )
        if writable and x.requires_grad:
            raise ValueError(
                f"{name} requires grad: writing into its memory would bypass autograd; "
                "pass x.detach() if that is really meant"
            )
        t = x.detach()
        if t.is_contiguous() and not (t.is_conj() or t.is_neg()):
            try:  # the common call: a zero-copy view, cheaper than DLPack's, and writable
                # where DLPack's is not (torch < 2.5 exports unversioned DLPack, whose
                # arrays NumPy marks read-only)
                out = t.numpy()
            except TypeError:  # a dtype NumPy lacks (bfloat16): DLPack below names it
                pass
            else:
                if not writable:
                    out.flags.writeable = False
                return out
        t = _torch_export(x)
        if writable and t.data_ptr() != x.data_ptr():
            raise ValueError(f"{name} is not contiguous; a writable view would write into a copy")
        out = np.from_dlpack(t)
        if not writable:
            out = out.view()
            out.flags.writeable = False
        return out
    if aac.is_jax_array(x):
        if writable:
            raise ValueError(f"{name} is a JAX array (immutable); writable=True is impossible")
        from .._lib.tracing import is_eager

        if not is_eager(x):
            raise TypeError(
                f"{name} is a JAX tracer: NumPy kernels need concrete arrays "
                "(wrap the kernel in jax.pure_callback)"
            )
        if _device_kind(x) != "cpu":
            raise ValueError(f"{name} is on {aac.device(x)}; use to_cupy for GPU arrays")
        return np.from_dlpack(x)  # read-only: JAX signals it through DLPack 1.0
    raise TypeError(f"{name} must be a NumPy array, a torch tensor or a JAX array on the CPU")


def writable_numpy(x: Any) -> np.ndarray:
    """``x`` as a NumPy array that its receiver may write into: ``x`` itself when it is a
    writable NumPy array, else a copy (torch, JAX, CuPy, other DLPack arrays)."""
    if isinstance(x, np.ndarray):
        return x if x.flags.writeable else x.copy()
    if aac.is_cupy_array(x):  # pragma: no cover - needs a GPU
        return x.get()
    if aac.is_torch_array(x) or aac.is_jax_array(x):
        return to_numpy(x).copy()
    return np.from_dlpack(x).copy()


_NUMPY_DTYPES: dict[tuple[type, Any], np.dtype] = {}


def numpy_dtype(dtype: Any) -> np.dtype:
    """The NumPy dtype of the same name as a torch, JAX, array-api-strict or NumPy dtype
    (remembered per type and dtype: a torch dtype's name is parsed once, not on every call;
    the type in the key keeps dtypes of different libraries from being compared, which
    array-api-strict's refuse)."""
    key = (type(dtype), dtype)
    try:
        return _NUMPY_DTYPES[key]
    except (KeyError, TypeError):  # (TypeError: an unhashable dtype-like)
        pass
    try:
        out = np.dtype(dtype)
    except TypeError:
        out = np.dtype(str(dtype).rsplit(".", 1)[-1].lower())
    try:
        _NUMPY_DTYPES[key] = out
    except TypeError:
        pass
    return out


def plain_cpu_views(*tensors: Any) -> list[np.ndarray] | None:
    """NumPy views of plain CPU torch tensors for a Numba kernel, or None.

    The fast way of an eager torch call into a kernel: every argument an
    exact ``torch.Tensor`` (no subclass, no Parameter) on the CPU that does not require grad,
    without lazy conj/neg bits (``Tensor.numpy`` refuses all the others, which then get
    None); no ``torch.func`` transform active and ``torch.compile`` not tracing. Dtype and
    layout are the kernel wrapper's to check. The views are writable (setting the flag costs
    half a microsecond each): hand them only to kernels whose signatures declare their
    inputs read-only, as those of :mod:`householderla._kernels.numba` do.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    for t in tensors:
        if type(t) is not torch.Tensor:
            return None
    if torch.compiler.is_compiling() or torch._C._functorch.maybe_current_level() is not None:
        return None
    try:  # numpy() raises for CUDA tensors, tensors that require grad, conj/neg bits
        return [t.numpy() for t in tensors]
    except (RuntimeError, TypeError):
        return None


def plain_cpu_tensor(a: np.ndarray) -> Any:
    """A kernel's fresh, writable NumPy result as a CPU tensor sharing its memory (the return
    way of :func:`plain_cpu_views`; :func:`from_numpy` without its dispatch)."""
    return sys.modules["torch"].from_numpy(a)


def aligned_empty(shape: tuple[int, ...], dtype: Any, align: int = JAX_ALIGNMENT) -> np.ndarray:
    """``np.empty(shape, dtype)`` whose data pointer is a multiple of ``align`` bytes (NumPy
    only guarantees 16): kernel outputs allocated here reach JAX by :func:`from_numpy`
    without a copy."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buf = np.empty(n + align, dtype=np.uint8)
    off = (-buf.ctypes.data) % align
    return buf[off : off + n].view(dtype).reshape(shape)


def from_numpy(a: np.ndarray, like: Any) -> Any:
    """The NumPy array ``a`` (a kernel's fresh result) as an array of ``like``'s type and
    device, without a copy where possible.

    torch CPU: ``torch.from_numpy`` (shares memory, as DLPack would, in a quarter of the time; a
    read-only ``a`` is copied, since torch has no read-only tensors). JAX CPU:
    ``jax.numpy.from_dlpack`` (shares memory when ``a`` is 64-byte aligned and writable, e.g. from
    :func:`aligned_empty`; copies otherwise). NumPy: ``a`` itself. Other devices: one host-to-device
    copy (``torch.asarray`` / ``jax.device_put`` / ``cupy.asarray``). The caller must not write into
    ``a`` afterwards.
    """
    if not isinstance(a, np.ndarray):
        raise TypeError(f"a must be a NumPy array; got {type(a).__module__}.{type(a).__name__}")
    if like is None or isinstance(like, np.ndarray):
        return a
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(like, torch.Tensor):
        if not like.is_cpu:
            return torch.asarray(a, device=like.device)
        return torch.from_numpy(a if a.flags.writeable else a.copy())  # shares memory
    if aac.is_jax_array(like):
        jax = sys.modules["jax"]
        if _device_kind(like) != "cpu":
            return jax.device_put(a, aac.device(like))
        if a.flags.writeable and a.ctypes.data % JAX_ALIGNMENT == 0 and a.flags.c_contiguous:
            return jax.numpy.from_dlpack(a, copy=False)
        return jax.numpy.array(a)
    if aac.is_cupy_array(like):  # pragma: no cover - needs a GPU
        return sys.modules["cupy"].asarray(a)
    if aac.is_array_api_obj(like):  # another Array API library on the CPU (array-api-strict)
        return aac.array_namespace(like).from_dlpack(a)
    raise TypeError(
        f"like must be a NumPy, torch, JAX or CuPy array; got {type(like).__module__}."
        f"{type(like).__name__}"
    )


@contextlib.contextmanager
def cuda_stream(x: Any) -> Iterator[Any]:  # pragma: no cover - needs a GPU
    """CuPy's current stream set to torch's current stream on ``x``'s device (a no-op for
    non-torch ``x``), so that CuPy kernels launched inside are ordered with torch's work and
    the DLPack exchange needs no synchronisation."""
    import cupy

    if not aac.is_torch_array(x):
        yield cupy.cuda.get_current_stream()
        return
    torch = sys.modules["torch"]
    stream = torch.cuda.current_stream(x.device)
    with cupy.cuda.Device(x.device.index), cupy.cuda.ExternalStream(stream.cuda_stream) as s:
        yield s


def to_cupy(x: Any, name: str = "x") -> Any:  # pragma: no cover - needs a GPU
    """A CuPy view of the CUDA array ``x`` (torch tensor or JAX array), zero-copy.

    For torch, the exchange runs on torch's current stream (:func:`cuda_stream`): CuPy
    passes its current stream to ``__dlpack__``, torch orders the export after its pending
    work. Detached, conj/neg resolved and made contiguous first, as :func:`to_numpy`. Run the
    kernels that use the result inside ``with cuda_stream(x):`` as well.
    """
    import cupy

    if aac.is_torch_array(x):
        if x.device.type != "cuda":
            raise ValueError(f"{name} is on {x.device}; use to_numpy for CPU tensors")
        with cuda_stream(x):
            return cupy.from_dlpack(_torch_export(x))
    if aac.is_cupy_array(x):
        return x
    if aac.is_jax_array(x):
        return cupy.from_dlpack(x)
    raise TypeError(f"{name} must be a CUDA torch tensor, a CuPy array or a JAX GPU array")


def from_cupy(a: Any, like: Any) -> Any:  # pragma: no cover - needs a GPU
    """The CuPy array ``a`` as ``like``'s type, zero-copy (``torch.from_dlpack`` /
    ``jax.numpy.from_dlpack``; the consumer passes its stream, CuPy orders the export)."""
    if like is None or aac.is_cupy_array(like):
        return a
    if aac.is_torch_array(like):
        torch = sys.modules["torch"]
        with cuda_stream(like):
            return torch.from_dlpack(a)
    if aac.is_jax_array(like):
        return sys.modules["jax"].numpy.from_dlpack(a)
    raise TypeError(f"like must be a torch, JAX or CuPy array; got {type(like).__name__}")
