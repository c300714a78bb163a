"""Zero-copy hand-over by DLPack (householderla._interop.dlpack).

Memory sharing is asserted directly: ``np.shares_memory`` against the tensor's own NumPy
view, and a write through one side observed on the other. Read-only sources (JAX arrays,
read-only NumPy) must give read-only views, and every refusal names the argument. The CUDA
path needs a GPU and CuPy: it is skipped (reported) without them.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require

from householderla._interop.dlpack import JAX_ALIGNMENT, aligned_empty, from_numpy, to_numpy

torch = require("torch")


def _jax():
    jax = require("jax")
    jax.config.update("jax_enable_x64", True)
    return jax


# -- to_numpy ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_cpu_tensor_is_shared_not_copied(dtype):
    t = torch.arange(12, dtype=dtype).reshape(3, 4)
    a = to_numpy(t, writable=True)
    assert a.dtype == {torch.float32: np.float32, torch.float64: np.float64}[dtype]
    assert a.shape == (3, 4) and np.shares_memory(a, t.numpy())
    a[1, 2] = -7.0  # the write shows up in the tensor: same memory
    assert t[1, 2].item() == -7.0


def test_torch_default_view_is_read_only_but_shared():
    t = torch.ones(4, 3, dtype=torch.float64)
    a = to_numpy(t)
    assert not a.flags.writeable and np.shares_memory(a, t.numpy())
    with pytest.raises(ValueError, match="read-only"):
        a[0, 0] = 2.0
    t[0, 0] = 5.0  # a view, not a snapshot
    assert a[0, 0] == 5.0


def test_requires_grad_is_detached_and_never_writable():
    t = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    a = to_numpy(t)
    assert np.shares_memory(a, t.detach().numpy()) and not a.flags.writeable
    with pytest.raises(ValueError, match="x requires grad"):
        to_numpy(t, writable=True)


def test_non_contiguous_is_made_contiguous():
    base = torch.arange(20, dtype=torch.float64).reshape(4, 5)
    t = base.mT  # a strided view
    a = to_numpy(t)
    assert a.flags.c_contiguous and np.array_equal(a, base.numpy().T)
    assert not np.shares_memory(a, base.numpy())  # the contiguous copy
    with pytest.raises(ValueError, match="not contiguous"):
        to_numpy(t, writable=True, name="h")  # the write would be lost
    c = base[1:3]  # contiguous slice: still zero-copy
    assert np.shares_memory(to_numpy(c), base.numpy())


def test_neg_view_is_resolved():
    t = torch.arange(3.0, dtype=torch.float64)
    n = torch._neg_view(t)
    assert n.is_neg()
    np.testing.assert_array_equal(to_numpy(n), -np.arange(3.0))


def test_numpy_passes_through_and_read_only_stays_read_only():
    a = np.arange(6.0).reshape(2, 3)
    v = to_numpy(a)
    assert np.shares_memory(v, a) and not v.flags.writeable and a.flags.writeable
    assert to_numpy(a, writable=True) is a
    ro = a.copy()
    ro.flags.writeable = False
    assert to_numpy(ro) is ro and not ro.flags.writeable
    with pytest.raises(ValueError, match="Q is a read-only NumPy array"):
        to_numpy(ro, writable=True, name="Q")


def _jax_cpu(jax):
    """The JAX CPU device: on a GPU machine JAX puts new arrays on the GPU by default."""
    return jax.default_device(jax.devices("cpu")[0])


def test_jax_cpu_array_is_shared_and_read_only():
    jax = _jax()
    with _jax_cpu(jax):
        x = jax.numpy.arange(6.0).reshape(2, 3)
    a = to_numpy(x)
    assert a.dtype == np.float64 and not a.flags.writeable
    assert a.ctypes.data == x.unsafe_buffer_pointer()  # the same buffer
    with pytest.raises(ValueError, match="read-only"):
        a[0, 0] = 1.0
    with pytest.raises(ValueError, match="JAX array"):
        to_numpy(x, writable=True)


def test_jax_tracer_is_refused():
    jax = _jax()
    with pytest.raises(TypeError, match="tracer"):
        jax.jit(lambda x: to_numpy(x).sum())(jax.numpy.ones(3))


def test_unsupported_type_is_refused():
    with pytest.raises(TypeError, match="must be a NumPy array"):
        to_numpy([1.0, 2.0])


# -- from_numpy --------------------------------------------------------------------------------


def test_from_numpy_into_torch_is_zero_copy():
    a = np.random.default_rng(0).standard_normal((4, 3))
    t = from_numpy(a, like=torch.empty(0, dtype=torch.float64))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float64
    assert np.shares_memory(t.numpy(), a)
    f32 = a.astype(np.float32)
    assert from_numpy(f32, like=torch.empty(0)).dtype == torch.float32


def test_from_numpy_read_only_into_torch_is_copied():
    """torch has no read-only tensors: aliasing read-only memory would let torch write it."""
    a = np.ones((3, 3))
    a.flags.writeable = False
    t = from_numpy(a, like=torch.empty(0))
    assert not np.shares_memory(t.numpy(), a)
    t += 1.0
    assert np.all(a == 1.0)


def test_from_numpy_into_jax_is_zero_copy_when_aligned():
    jax = _jax()
    a = aligned_empty((8, 5), np.float64)
    assert a.ctypes.data % JAX_ALIGNMENT == 0 and a.shape == (8, 5)
    a[...] = np.arange(40.0).reshape(8, 5)
    with _jax_cpu(jax):  # a CPU ``like``: zero-copy (a GPU one gets one host-to-device copy)
        x = from_numpy(a, like=jax.numpy.zeros(1))
    assert isinstance(x, jax.Array) and x.dtype == np.float64
    np.testing.assert_array_equal(np.asarray(x), a)
    # sharing shows as a write seen through the JAX array (test-only: the contract forbids it)
    a[0, 0] = 123.0
    assert float(x[0, 0]) == 123.0


def test_from_numpy_into_jax_copies_misaligned_and_read_only():
    jax = _jax()
    buf = aligned_empty((17,), np.float64)
    a = buf[1:]  # 8 bytes past a 64-byte boundary
    a[...] = 1.0
    x = from_numpy(a, like=jax.numpy.zeros(1))
    a[0] = 5.0
    assert float(x[0]) == 1.0  # a copy
    ro = np.ones(4)
    ro.flags.writeable = False
    assert float(from_numpy(ro, like=jax.numpy.zeros(1)).sum()) == 4.0


def test_from_numpy_like_numpy_and_bad_input():
    a = np.ones(3)
    assert from_numpy(a, like=np.zeros(1)) is a and from_numpy(a, like=None) is a
    with pytest.raises(TypeError, match="a must be a NumPy array"):
        from_numpy(torch.ones(3), like=torch.ones(1))
    with pytest.raises(TypeError, match="like must be"):
        from_numpy(a, like=[1.0])


def test_round_trip_through_a_numpy_kernel_shares_both_ways():
    """A kernel reads a tensor through to_numpy and writes its result into an output the
    caller allocated: nothing is copied on the way in or out."""
    x = torch.randn(5, 4, dtype=torch.float64)
    out = torch.empty(5, 4, dtype=torch.float64)
    np.multiply(to_numpy(x), 2.0, out=to_numpy(out, writable=True))
    torch.testing.assert_close(out, 2.0 * x, rtol=0, atol=0)


# -- CUDA (needs a GPU and CuPy) ------------------------------------------------------------------


def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return require("cupy")


def test_cuda_tensor_to_cupy_is_zero_copy_on_torch_stream():  # pragma: no cover - GPU
    cupy = _cuda()
    from householderla._interop.dlpack import cuda_stream, from_cupy, to_cupy

    t = torch.arange(6.0, device="cuda").reshape(2, 3)
    c = to_cupy(t)
    assert c.data.ptr == t.data_ptr()
    with cuda_stream(t):
        c *= 2.0
    torch.cuda.synchronize()
    assert t[1, 2].item() == 10.0
    back = from_cupy(c, like=t)
    assert back.data_ptr() == t.data_ptr() and isinstance(cupy.asarray(c), cupy.ndarray)
    with pytest.raises(ValueError, match="use to_cupy"):
        to_numpy(t)
