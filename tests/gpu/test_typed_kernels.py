"""A cuda device's kernels: a Kernels (minidl/kernels/families.py) holding every family of kernels/gpu,
one module a family, kept in every dtype (the GPU's families take the half types themselves)."""
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

from minidl.backend import Device, kernels_for  # noqa: E402
from minidl.kernels.families import KERNEL_FAMILIES, Kernels  # noqa: E402


def test_the_cuda_devices_kernels_are_the_gpu_families():
    dev = Device("cuda")
    assert isinstance(dev.kernels, Kernels)
    assert {n: getattr(dev.kernels, n).__name__ for n in KERNEL_FAMILIES} == {
        n: f"minidl.kernels.gpu.{n}" for n in KERNEL_FAMILIES}
    assert dev.with_dtype("float16").kernels is dev.kernels
    assert kernels_for(cp.zeros(2, cp.float32)).conv is dev.kernels.conv
    assert dev.has("direct") and dev.has("conv", "conv2d_bias_relu_fprop")
