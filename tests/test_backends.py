"""Backends are plug-ins (minidl/backends/): found by name or by an array through the registry, and a
Device asks its backend every question, so a backend registered from outside the package runs a model
with no edit to Device."""
import numpy as np
import pytest

import minidl as dl
from minidl import backends, layers as L
from minidl.backend import Device, DeviceError, get_device, kernels_for
from minidl.backends.cpu import CPU


def test_the_built_in_backends_are_registered_and_found_by_name_and_alias():
    assert backends.names()[:2] == ("cpu", "cuda")
    assert backends.find("gpu") is backends.find("cuda")
    assert backends.find("cpu").kernels_package == "minidl.kernels.cpu"
    with pytest.raises(ValueError, match=r"^unknown device 'tpu': expected 'cpu', 'cuda' or 'auto'$"):
        Device("tpu")


def test_an_array_finds_its_backend_through_the_registry():
    a = np.zeros(3, np.float32)
    assert backends.of_array(a) is backends.find("cpu")
    assert kernels_for(a).softmax.__name__ == "minidl.kernels.cpu.softmax"
    with pytest.raises(TypeError, match="no registered backend holds a builtins.list"):
        backends.of_array([1.0])


def test_a_cpu_device_answers_through_its_backend():
    dev = get_device("cpu")
    assert dev.backend is backends.find("cpu") and dev.name == "cpu" and dev.stream is None
    assert not dev.can_capture and not dev.channels_last("bfloat16") and dev.memory_bytes() is None
    assert not dev.is_out_of_memory(MemoryError("out of memory"))
    with pytest.raises(DeviceError, match="CUDA graphs need a cuda device"):
        dev.capture(lambda: None)
    a = np.arange(4.0)
    assert dev.to_host(a) is a and dev.elapsed_ms(lambda: None, repeats=3) >= 0.0
    assert dev.with_dtype("float16").kernels.conv is not dev.kernels.conv       # half storage wraps the families
    assert dev.compute_in("float32") is dev


class _Twin(CPU):
    """A third backend: NumPy arrays held in a subclass, so the registry can tell them apart."""

    name, label, prefer = "numpy-twin", "twin", -1
    started = 0

    def owns(self, a):
        return isinstance(a, _TwinArray)

    def start(self, gpu):
        _Twin.started += 1
        return np, None

    def to_host(self, a):
        return np.asarray(a)


class _TwinArray(np.ndarray):
    pass


@pytest.mark.parametrize("shape,dtype,value", [((), bool, True), ((), np.float64, 0.25), ((3, 2), np.int64, 7)])
def test_device_fill_sets_every_element_in_place(shape, dtype, value):
    """Device.fill: a run's counters and flags set from the host (on the GPU: no fill kernel to compile)."""
    dev = get_device("cpu")
    a = np.zeros(shape, dtype)
    before = a.__array_interface__["data"][0]
    dev.fill(a, value)
    assert a.__array_interface__["data"][0] == before and a.dtype == dtype and a.shape == shape
    np.testing.assert_array_equal(a, np.full(shape, value, dtype))


def test_a_backend_registered_from_outside_runs_a_model(monkeypatch):
    monkeypatch.setattr(backends, "_REGISTRY", dict(backends._REGISTRY))    # the registration ends with the test
    twin = backends.register(_Twin())
    assert "numpy-twin" in backends.names() and backends.find("numpy-twin") is twin
    dev = get_device("numpy-twin", seed=3)
    assert dev.backend is twin and _Twin.started == 1 and repr(dev) == "Device('numpy-twin', dtype=float32)"
    assert twin.owns(np.zeros(2).view(_TwinArray)) and not twin.owns(np.zeros(2))   # asked in registration order
    x = L.Input((1, 6, 6))
    model = dl.Model(x, L.Softmax()(L.Dense(3)(L.Flatten()(L.Conv2D(2, 3, activation="relu")(x)))), device=dev)
    y = model(np.random.default_rng(0).random((2, 1, 6, 6)))
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)
    assert get_device("auto").name != "numpy-twin"                 # 'auto' takes the most preferred usable one
    with pytest.raises(DeviceError, match="twin refuses"):
        monkeypatch.setattr(_Twin, "status", lambda self: (False, "twin refuses"))
        get_device("numpy-twin")
