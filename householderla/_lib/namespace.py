"""Namespace, device and dtype resolution shared by every public function.

:func:`resolve` finds the common Array API namespace of a call's arrays (or takes ``xp=``),
converts non-array arguments into it on the same device, promotes integers, and rejects
unsupported dtypes naming the argument. ``half=True`` functions accept bfloat16 / float16,
compute in float32 (:func:`accumulation_dtype`) and round once. Nothing here imports torch, jax,
cupy or dask: backends are recognised by :mod:`array_api_compat`'s ``is_*`` helpers.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import Any

import array_api_compat as aac
import numpy as np

from .device import device_kind
from .tracing import is_eager

__all__ = [
    "accumulation_dtype",
    "complex_dtype",
    "conj",
    "default_float",
    "device_of",
    "is_complex",
    "is_half",
    "mH",
    "mT",
    "real_dtype",
    "resolve",
]


@functools.cache
def _namespace_of(xp: Any) -> Any:
    """The array-api-compat namespace for a user-given ``xp`` (numpy, torch, ...), once per
    namespace."""
    probe = xp.asarray(0.0)
    return aac.array_namespace(probe)


#: Array types whose namespace, float dtypes and devices are known after their first call:
#: ``type -> (namespace, (float32, float64, complex64, complex128))``. Filled by
#: :func:`resolve` for NumPy arrays, torch tensors and concrete JAX arrays only (not tracers,
#: subclasses or other libraries).
_KNOWN_TYPES: dict[type, tuple[Any, tuple[Any, ...]]] = {}


def _register_fast_type(x: Any, xp: Any) -> None:
    if (
        aac.is_numpy_namespace(xp)
        or aac.is_torch_namespace(xp)
        or (aac.is_jax_namespace(xp) and is_eager(x))
    ):
        if type(x).__name__ in ("ndarray", "Tensor", "Parameter", "ArrayImpl"):
            _KNOWN_TYPES[type(x)] = (xp, (xp.float32, xp.float64, xp.complex64, xp.complex128))


def _resolve_fast(arrays: Sequence[tuple[str, Any]], xp: Any, complex_ok: bool) -> Any:
    """:func:`resolve` for the common call: every argument an array of one known type
    (NumPy, torch, concrete JAX), one float32/float64 dtype (or complex64/complex128 with
    ``complex_ok``), one device. None otherwise (the general path then gives the answer, or
    the error)."""
    first = arrays[0][1]
    t = type(first)
    known = _KNOWN_TYPES.get(t)
    if known is None:
        return None
    ns, floats = known
    if xp is not None and _namespace_of(xp) is not ns:
        return None
    dtype = first.dtype
    if dtype != floats[0] and dtype != floats[1]:
        if not (complex_ok and (dtype == floats[2] or dtype == floats[3])):
            return None
    if len(arrays) == 1:
        return ns, device_of(first), dtype, [first]
    device = device_of(first)
    for _, a in arrays[1:]:
        if type(a) is not t or a.dtype != dtype or device_of(a) != device:
            return None
    return ns, device, dtype, [a for _, a in arrays]


def _is_array(x: Any) -> bool:
    return aac.is_array_api_obj(x) and not isinstance(x, (int, float, complex, bool))


def default_float(xp: Any, device: Any = None) -> Any:
    """The namespace's default real floating dtype (float32 for torch, float64 for NumPy)."""
    info = getattr(xp, "__array_namespace_info__", None)
    if info is not None:
        try:
            return info().default_dtypes(device=device)["real floating"]
        except TypeError:  # namespaces whose default_dtypes takes no device
            return info().default_dtypes()["real floating"]
    return xp.float64  # pragma: no cover - every supported namespace has the info object


def is_half(xp: Any, dtype: Any) -> bool:
    """Whether ``dtype`` is a half-precision float of ``xp`` (bfloat16 or float16; NumPy has
    float16 only)."""
    return any(
        dtype == h
        for h in (getattr(xp, "bfloat16", None), getattr(xp, "float16", None))
        if h is not None
    )


def _float_dtype_of(
    xp: Any, x: Any, name: str, device: Any, complex_ok: bool = False, half: bool = False
) -> Any:
    dtype = x.dtype
    try:
        xp.isdtype(dtype, "bool")
    except TypeError as exc:  # e.g. ml_dtypes' bfloat16 in a NumPy array: not a NumPy dtype
        raise TypeError(
            f"{name} has dtype {dtype}, which is not a dtype of its array library; use "
            "float32/float64 (or a bfloat16 array of torch or JAX)"
        ) from exc
    if xp.isdtype(dtype, "bool"):
        raise TypeError(f"{name} has boolean dtype; expected a real floating or integer array")
    if xp.isdtype(dtype, "complex floating"):
        if complex_ok:
            return dtype  # complex64 or complex128: the standard has no other
        raise TypeError(
            f"{name} has complex dtype {dtype}; this function implements the real case only "
            "(complex input is supported by the Householder, CWY and T-CWY maps, polar, the "
            "retractions, riemannian_gradient and their VJPs)"
        )
    if xp.isdtype(dtype, "integral"):
        return default_float(xp, device)
    if dtype == xp.float32 or dtype == xp.float64 or (half and is_half(xp, dtype)):
        return dtype
    if is_half(xp, dtype):
        raise TypeError(
            f"{name} has dtype {dtype}; this function supports float32 and float64 (half "
            "precision is supported by cwy, tcwy, householder_apply, householder_product, "
            "polar, the retractions, riemannian_gradient and their VJPs). Cast it to float32 "
            "first."
        )
    raise TypeError(
        f"{name} has dtype {dtype}; supported are float32 and float64 (integers are promoted "
        "to the default float; bfloat16/float16 where a function says so)"
    )


def resolve(
    arrays: Sequence[tuple[str, Any]],
    xp: Any = None,
    *,
    complex_ok: bool = False,
    half: bool = False,
) -> tuple[Any, Any, Any, list[Any]]:
    """Common namespace, device and floating dtype of named arguments.

    Parameters
    ----------
    arrays : sequence of (name, value)
        The arguments, named as in the caller's signature (used in error messages). Values may
        be arrays of any Array API namespace, or array-likes (lists, scalars) that are
        converted into the namespace of the others (NumPy if there are none).
    xp : namespace, optional
        Force this namespace instead of inferring it.
    complex_ok : bool, default False
        Accept complex64/complex128 arguments (the result dtype is then the common complex
        dtype, e.g. float64 with complex64 gives complex128); otherwise they raise
        ``TypeError`` naming the argument.
    half : bool, default False
        Accept bfloat16 / float16 (the caller computes in :func:`accumulation_dtype`);
        otherwise they raise ``TypeError`` naming the argument.

    Returns
    -------
    xp, device, dtype, values
        ``values`` are the inputs as arrays of ``xp`` on ``device`` with floating ``dtype``
        (the result type of all inputs after integer promotion). Arrays already of that dtype
        are returned as they are: never copied, never written.
    """
    if arrays:
        fast = _resolve_fast(arrays, xp, complex_ok)
        if fast is not None:
            return fast
    real = [(n, a) for n, a in arrays if _is_array(a)]
    if xp is None and _numpy_with_jax(real):
        # JAX code mixes in NumPy constants routinely (e.g. ``jax.grad`` over one argument):
        # they join JAX's namespace, as jnp functions would treat them
        jnp = aac.array_namespace(next(a for _, a in real if aac.is_jax_array(a)))
        arrays = [(n, jnp.asarray(a) if aac.is_numpy_array(a) else a) for n, a in arrays]
        real = [(n, a) for n, a in arrays if _is_array(a)]
    if xp is not None:
        xp = _namespace_of(xp)
        if aac.is_jax_namespace(xp) and any(aac.is_numpy_array(a) for _, a in real):
            # NumPy arrays handed to a JAX call (check_grads does) join JAX, as jnp would
            arrays = [(n, xp.asarray(a) if aac.is_numpy_array(a) else a) for n, a in arrays]
            real = [(n, a) for n, a in arrays if _is_array(a)]
    elif real:
        try:
            xp = aac.array_namespace(*(a for _, a in real))
        except TypeError as exc:
            kinds = ", ".join(f"{n}: {type(a).__module__}.{type(a).__name__}" for n, a in real)
            raise TypeError(
                f"arguments come from different array libraries ({kinds}); convert them to one "
                "namespace first (e.g. with from_dlpack)"
            ) from exc
    else:
        import numpy as np

        xp = aac.array_namespace(np.empty(0))
    # None (JAX tracers and literals) means "placed by the framework": it never conflicts
    devices = [(n, device_of(a)) for n, a in real]
    known = [(n, d) for n, d in devices if d is not None]
    device = known[0][1] if known else None
    for n, d in known[1:]:
        if d != device:
            raise ValueError(
                f"{n} is on device {d} but {known[0][0]} is on {device}; move them to one device"
            )
    values = []
    for n, a in arrays:
        if not _is_array(a):
            try:
                a = xp.asarray(a, device=device)
            except Exception as exc:
                raise TypeError(f"{n} must be an array, got {type(a).__name__}") from exc
        values.append(a)
    dtypes = [
        _float_dtype_of(xp, a, n, device, complex_ok, half)
        for (n, _), a in zip(arrays, values, strict=True)
    ]
    dtype = xp.result_type(*dtypes)
    values = [a if a.dtype == dtype else xp.astype(a, dtype) for a in values]
    if real and not _KNOWN_TYPES.get(type(real[0][1])):
        _register_fast_type(real[0][1], xp)
    return xp, device, dtype, values


def _numpy_with_jax(real: list[tuple[str, Any]]) -> bool:
    """Whether the arrays are JAX arrays (or tracers) mixed with NumPy arrays, nothing else."""
    kinds = {
        "jax" if aac.is_jax_array(a) else "numpy" if aac.is_numpy_array(a) else "other"
        for _, a in real
    }
    return kinds == {"jax", "numpy"}


def device_of(x: Any) -> Any:
    """The device of ``x`` for creating arrays next to it (None for JAX tracers and literals,
    where array-api-compat reports a placeholder that creation functions reject)."""
    if type(x) is np.ndarray:
        return "cpu"  # what array_api_compat.device says, without its checks
    if aac.is_torch_array(x):
        return x.device  # the fast path; also what torch.compile traces without a break
    if aac.is_jax_array(x) or type(x).__module__.startswith(("jax", "jaxlib")):
        # tracers, and literals JAX hands to custom rules (jax._src.literals), have no
        # device a creation function accepts: let JAX place new arrays itself
        return aac.device(x) if aac.is_jax_array(x) and is_eager(x) else None
    return aac.device(x)


def accumulation_dtype(xp: Any, dtype: Any) -> Any:
    """Precision for Gram matrices, norms and T = S⁻¹ (DESIGN: "float64 for float32 inputs
    where it is cheap"; complex64 likewise accumulates in complex128).

    float64 (complex128) on CPU backends (NumPy, array-api-strict, Dask, torch on CPU, JAX on
    CPU with x64 enabled); the input dtype on accelerators, whose float64 rate varies by card.
    float32 for bfloat16 / float16 everywhere: its rounding is 2¹⁶ (2¹³) times finer than the
    input's.
    """
    if dtype == xp.float64 or dtype == xp.complex128:
        return dtype
    if is_half(xp, dtype):
        return xp.float32
    wide = xp.complex128 if dtype == xp.complex64 else xp.float64
    if aac.is_cupy_namespace(xp):
        return dtype
    if aac.is_torch_namespace(xp):
        return dtype  # refined per array by ``accumulation_dtype_for``
    if aac.is_jax_namespace(xp):
        jax = sys.modules["jax"]
        if jax.config.jax_enable_x64 and jax.default_backend() == "cpu":
            return wide
        return dtype
    return wide


def accumulation_dtype_for(xp: Any, x: Any) -> Any:
    """:func:`accumulation_dtype` for the array ``x`` (torch decides by the tensor's device:
    a GPU, or any device but the CPU (MPS has no float64), accumulates in the tensor's own
    dtype, also under ``emulate_device("cuda")``)."""
    if aac.is_torch_namespace(xp) and (x.dtype == xp.float32 or x.dtype == xp.complex64):
        if x.device.type != "cpu" or device_kind(x) != "cpu":
            return x.dtype
        return xp.float64 if x.dtype == xp.float32 else xp.complex128
    return accumulation_dtype(xp, x.dtype)


def mT(x: Any) -> Any:
    """Matrix transpose of the last two axes (a view where the backend has views)."""
    return x.mT


def is_complex(dtype: Any) -> bool:
    """Whether ``dtype`` (of any namespace) is complex, without a namespace lookup: NumPy and
    JAX dtypes by ``kind``, torch by ``is_complex``, others by name."""
    kind = getattr(dtype, "kind", None)
    if isinstance(kind, str):
        return kind == "c"
    flag = getattr(dtype, "is_complex", None)
    if isinstance(flag, bool):
        return flag
    return "complex" in str(dtype)


def real_dtype(xp: Any, dtype: Any) -> Any:
    """The real dtype of the same precision: complex64 -> float32, complex128 -> float64;
    real dtypes are returned as they are."""
    if not is_complex(dtype):
        return dtype
    return xp.float32 if dtype == xp.complex64 else xp.float64


def complex_dtype(xp: Any, dtype: Any) -> Any:
    """The complex dtype of the same precision: float32 -> complex64, float64 -> complex128,
    bfloat16/float16 -> complex64 (the narrowest complex dtype of the standard); complex
    dtypes are returned as they are."""
    if is_complex(dtype):
        return dtype
    return xp.complex128 if dtype == xp.float64 else xp.complex64


def conj(x: Any, xp: Any) -> Any:
    """Complex conjugate; real arrays are returned as they are (no copy, no operation)."""
    return xp.conj(x) if is_complex(x.dtype) else x


def mH(x: Any, xp: Any) -> Any:
    """Conjugate transpose of the last two axes: ``mT`` for real arrays; for complex ones
    ``conj(x.mT)`` (a lazy view on torch, a copy on NumPy)."""
    return xp.conj(x.mT) if is_complex(x.dtype) else x.mT
