"""GPU tests run only where CuPy, a CUDA device and the cuDNN Frontend are all usable; else skipped.

Test modules here begin with `pytest.importorskip("cupy")` and `pytest.importorskip("cudnn")`;
this file skips their tests when no CUDA device answers (it must not raise: pytest loads it
before collecting, also when asked for tests/gpu alone).
"""
import pathlib

import numpy as np
import pytest

HERE = pathlib.Path(__file__).parent


def _why_not():
    try:
        import cupy
    except Exception as e:  # noqa: BLE001  a broken install raises more than ImportError, and must skip
        return f"GPU tests need CuPy: {e}"
    try:
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return None
    except Exception as e:  # noqa: BLE001  no driver: CUDA errors surface as several types
        return f"GPU tests need a CUDA device: {type(e).__name__}: {e}"
    return "GPU tests need a CUDA device"


REASON = _why_not()


def pytest_collection_modifyitems(config, items):
    if REASON:
        for item in items:
            if HERE in pathlib.Path(str(item.fspath)).parents:
                item.add_marker(pytest.mark.skip(reason=REASON))


@pytest.fixture
def no_tf32():
    """Full FP32 convolutions, for comparisons with the CPU at tight tolerances."""
    from minidl.kernels.gpu import cudnn_graphs as cudnn
    was = cudnn.tf32_enabled()
    cudnn.set_tf32(False)
    yield
    cudnn.set_tf32(was)


@pytest.fixture
def rand():
    """rand(*shape): float32 standard normals from a generator seeded per test."""
    rng = np.random.default_rng(0)
    return lambda *shape: rng.standard_normal(shape).astype(np.float32)
