"""kernels/gpu/_cublaslt.py's two bindings (issue 40): nvmath-python's where it imports, its own ctypes ones
otherwise. The ctypes ones serve without nvmath; where nvmath is installed, the same GEMM through both is
bit for bit the same, its values are nvmath's, and a CUDA graph recorded through nvmath's replays it."""
import sys

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minidl.kernels.gpu import _cublaslt  # noqa: E402
from minidl.precision import dtype_of  # noqa: E402

EPILOGUES = [(True, True, True), (True, False, False), (False, True, False), (False, False, True)]   # bias, relu, z


@pytest.fixture
def bindings_back():
    """Whatever a test chooses, the module's own choice comes back after it."""
    yield
    _cublaslt._state["lt"] = None
    _cublaslt._handles.clear()
    _cublaslt._plans.clear()


def _nvmath_or_skip():
    try:
        _cublaslt.use_bindings("nvmath")
    except ImportError as e:
        pytest.skip(f"nvmath-python is not installed: {e}")


def _arrays(dtype, M=96, C=64, K=40):
    rng = np.random.default_rng(0)
    host = [(rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32).astype(dtype_of(dtype))
            for s in ((M, C), (K, C), (K,), (M, K))]
    return host, [cp.asarray(a) for a in host]


def _gemm(d, bias, relu, shortcut):
    x, w, b, z = d
    y = cp.zeros((x.shape[0], w.shape[0]), x.dtype)
    return _cublaslt.matmul(x, w, y, b if bias else None, z if shortcut else None, relu, tf32=False)


def test_without_nvmath_the_ctypes_bindings_serve(monkeypatch, bindings_back):
    for name in ("nvmath", "nvmath.bindings"):
        monkeypatch.setitem(sys.modules, name, None)     # `from nvmath.bindings import cublasLt` raises ImportError
    _cublaslt._state["lt"] = None
    assert isinstance(_cublaslt.bindings(), _cublaslt._Ctypes)
    (x, w, b, z), d = _arrays("float32")
    got = _gemm(d, True, True, True).get()
    want = np.maximum(x.astype(np.float64) @ w.T + b + z, 0)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    with pytest.raises(ImportError, match="nvmath"):
        _cublaslt.use_bindings("nvmath")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("bias,relu,shortcut", EPILOGUES)
def test_nvmath_and_ctypes_give_the_same_bits(dtype, bias, relu, shortcut, bindings_back):
    _nvmath_or_skip()
    _, d = _arrays(dtype)
    got = {}
    for name in ("ctypes", "nvmath"):
        _cublaslt.use_bindings(name)
        got[name] = _gemm(d, bias, relu, shortcut).get()
    assert np.array_equal(got["ctypes"].view(np.uint8), got["nvmath"].view(np.uint8))


def test_the_ctypes_values_are_nvmath_s(bindings_back):
    _nvmath_or_skip()
    lt, fallback = _cublaslt.bindings(), _cublaslt._Ctypes
    for group in ("MatmulDescAttribute", "Epilogue", "MatmulPreferenceAttribute"):
        for name, value in vars(getattr(fallback, group)).items():
            if not name.startswith("_"):
                assert value == int(getattr(getattr(lt, group), name)), f"{group}.{name}"
    assert fallback.matmul_heuristic_result_dtype.itemsize == lt.matmul_heuristic_result_dtype.itemsize


def test_a_graph_recorded_through_nvmath_replays_the_eager_result(bindings_back):
    _nvmath_or_skip()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:                                             # every array on the stream the graph records
        _, (x, w, b, z) = _arrays("float32")
        y = cp.zeros((x.shape[0], w.shape[0]), np.float32)
        _cublaslt.matmul(x, w, y, b, z, True, False)           # plans, handle and workspace made here
        stream.synchronize()
        eager = y.get()
        stream.begin_capture()
        _cublaslt.matmul(x, w, y, b, z, True, False)
        graph = stream.end_capture()
        y.data.memset_async(0, y.nbytes)
        graph.launch(stream)
        stream.synchronize()
        assert np.array_equal(y.get(), eager) and np.abs(eager).max() > 0
