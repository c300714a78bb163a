"""The device kind paths are chosen by, and its emulation on the CPU (_lib/device.py)."""

import numpy as np
import pytest

from householderla._lib.device import device_kind, emulate_device, emulated_kind


def test_cpu_arrays_are_cpu_and_emulation_is_scoped():
    x = np.zeros(3)
    assert device_kind(x) == "cpu" and emulated_kind() is None
    with emulate_device("cuda"):
        assert device_kind(x) == "cuda"
        with emulate_device("cpu"):
            assert device_kind(x) == "cpu"
        assert device_kind(x) == "cuda"
    assert device_kind(x) == "cpu" and emulated_kind() is None


def test_emulation_is_restored_after_an_error():
    with pytest.raises(RuntimeError), emulate_device("cuda"):
        raise RuntimeError("inside")
    assert emulated_kind() is None


def test_unknown_kind_is_named():
    with pytest.raises(ValueError, match="kind must be one of"), emulate_device("tpu"):
        pass


def test_torch_and_jax_cpu_arrays_are_cpu():
    torch = pytest.importorskip("torch")
    assert device_kind(torch.zeros(2)) == "cpu"
    jnp = pytest.importorskip("jax.numpy")
    assert device_kind(jnp.zeros(2)) == "cpu"
