"""The activations written once over the array module (minidl/layers/activation.py) on the GPU: every
activation minidl.layers exports (found by class, no list), its expressions run by CuPy through the GPU
family's `elementwise` against NumPy's on the CPU (float32, float64, the half types, channels-last);
the GPU's fused kernels (ReLU, LeakyReLU, Sigmoid, Tanh) against the same expressions on the CPU; and
a model of each activation, made to run its expressions, trains in the captured step as in eager
steps and as on the CPU."""
import importlib

import ml_dtypes
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl as dl  # noqa: E402
from minidl import layers as L, optim  # noqa: E402
from minidl.layers.activation import _Activation  # noqa: E402
from tests.conftest import mnist_lookalike  # noqa: E402
from tests.helpers.tolerance import close  # noqa: E402

ACTIVATIONS = sorted(n for n in L.__all__ if isinstance(getattr(L, n), type) and issubclass(getattr(L, n), _Activation))
BF16 = np.dtype(ml_dtypes.bfloat16)


def families():
    return (importlib.import_module("minidl.kernels.cpu.activation"),
            importlib.import_module("minidl.kernels.gpu.activation"))


def values(shape=(4, 3, 5, 6), seed=0):
    """x away from 0 (no kink between the two sides' roundings), gy; float64 on the host."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.05, 3.0, shape) * rng.choice([-1.0, 1.0], shape)
    return x, rng.standard_normal(shape)


def test_every_exported_activation_is_found():
    assert {"ReLU", "LeakyReLU", "Sigmoid", "Tanh"} <= set(ACTIVATIONS)


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("dtype,op", [(np.float32, "ulp"), (np.float64, "float64")])
def test_the_expressions_on_the_gpu_equal_them_on_the_cpu(name, dtype, op):
    c, g = families()
    layer = getattr(L, name)()
    x, gy = (v.astype(dtype) for v in values())
    y = c.elementwise(layer.f, x)
    s = x if layer.needs_input else y
    dy = g.elementwise(layer.f, cp.asarray(x))
    assert dy.dtype == dtype and dy.shape == x.shape
    close(dy, y, op)
    ds = cp.asarray(x) if layer.needs_input else dy
    close(g.elementwise(layer.df, ds, cp.asarray(gy)), c.elementwise(layer.df, s, gy), op)


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_expressions_in_half_precision_compute_in_float32_and_round_once(name, dtype):
    c, g = families()
    layer = getattr(L, name)()
    dt = BF16 if dtype == "bfloat16" else np.dtype(np.float16)
    x, gy = (v.astype(dt) for v in values())
    want = c.elementwise(layer.f, x.astype(np.float32))                  # float32 on the same rounded inputs
    got = g.elementwise(layer.f, cp.asarray(x))
    assert got.dtype == dt
    close(got, want, dtype)
    s = x if layer.needs_input else want.astype(dt)
    close(g.elementwise(layer.df, cp.asarray(s), cp.asarray(gy)),
          c.elementwise(layer.df, s.astype(np.float32), gy.astype(np.float32)), dtype)


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_the_expressions_keep_a_channels_last_batch_channels_last(name):
    c, g = families()
    layer = getattr(L, name)()
    x, gy = (v.astype(np.float32) for v in values())
    xd = cp.ascontiguousarray(cp.asarray(x).transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)   # NCHW shape, NHWC memory
    y = g.elementwise(layer.f, xd)
    assert y.shape == x.shape and y.transpose(0, 2, 3, 1).flags.c_contiguous
    close(y, c.elementwise(layer.f, x), "ulp")
    s = xd if layer.needs_input else y
    gx = g.elementwise(layer.df, s, cp.asarray(gy))                      # gy NCHW: copied into x's order
    assert gx.transpose(0, 2, 3, 1).flags.c_contiguous
    close(gx, c.elementwise(layer.df, x if layer.needs_input else c.elementwise(layer.f, x), gy), "ulp")


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
def test_the_fused_gpu_kernels_compute_the_layers_expressions(name, dtype):
    """The extras an activation's `kernel` names, where the GPU family has them, against the layer's own
    expressions on the CPU (the reference the CPU twins were): the same values, and `out` honoured."""
    c, g = families()
    layer = getattr(L, name)()
    if not layer.kernel or not hasattr(g, f"{layer.kernel}_fprop"):
        pytest.skip(f"{name} has no fused GPU kernels: the expressions run")
    dt = BF16 if dtype == "bfloat16" else np.dtype(dtype)
    op = {"float32": "ulp", "float64": "float64"}.get(dtype, dtype)
    fprop, bprop = getattr(g, f"{layer.kernel}_fprop"), getattr(g, f"{layer.kernel}_bprop")
    args = layer.kernel_args()
    x, gy = (v.astype(dt) for v in values())
    wide = np.float64 if dtype == "float64" else np.float32
    y = c.elementwise(layer.f, x.astype(wide))
    dy = fprop(cp.asarray(x), *args)
    close(dy, y, op)
    s = x if layer.needs_input else y.astype(dt)
    close(bprop(cp.asarray(s), cp.asarray(gy), *args), c.elementwise(layer.df, s.astype(wide), gy.astype(wide)), op)
    out = cp.empty(x.shape, dt)
    assert fprop(cp.asarray(x), *args, out=out) is out


def _expressions_only(cls):
    """`cls` made to run its expressions on the GPU too (no fused kernel, no fusion into a producer)."""
    return type(f"Xp{cls.__name__}", (cls,), {"kernel": None, "fusable_activation": None})


def _train(cls, device, graph):
    images, labels = mnist_lookalike(512)
    model = dl.Sequential([L.Conv2D(4, 3, padding=1), cls(), L.MaxPool2D(2), L.Flatten(), L.Dense(10), L.Softmax()],
                          (1, 28, 28), seed=0, device=dl.get_device(device, seed=0))
    t = dl.Trainer(model, optim.SGD(lr=0.05), progress=False, log=lambda s: None, graph=graph)
    first = t.fit((images, labels), steps=8, batch_size=32, monitor=8)
    last = t.fit((images, labels), more_steps=40, batch_size=32, monitor=40)
    return first, last, model.device.to_host(model.flat)


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_an_activations_expressions_train_captured_as_eager_and_as_on_the_cpu(name, no_tf32):
    cls = _expressions_only(getattr(L, name))
    first, last, w_graph = _train(cls, "cuda", graph=True)
    assert np.isfinite(last.loss) and last.loss < first.loss
    _, _, w_eager = _train(cls, "cuda", graph=False)
    np.testing.assert_allclose(w_graph, w_eager, rtol=1e-4, atol=1e-6)
    _, _, w_cpu = _train(cls, "cpu", graph=False)
    np.testing.assert_allclose(w_graph, w_cpu, rtol=1e-2, atol=1e-3)
