"""Device probe (not a test): versions, TF32 effect, BN running variance, host time per call.

python3 tests/gpu/probe.py      (on a machine with CuPy, a CUDA GPU and the cuDNN Frontend)
"""
import time
import traceback

import cupy as cp
import numpy as np

from minidl.kernels.cpu import conv as cconv
from minidl.kernels.gpu import activation, conv, cudnn, dense, norm


def section(fn):
    print(f"== {fn.__name__}", flush=True)
    try:
        fn()
    except Exception:
        traceback.print_exc()
    return fn


@section
def versions():
    import cudnn as fe
    props = cp.cuda.runtime.getDeviceProperties(0)
    print("gpu", props["name"].decode(), "cupy", cp.__version__, "cudnn backend", fe.backend_version(),
          "frontend", fe.__version__)


@section
def tf32_effect():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((8, 64, 16, 16)), rng.standard_normal((64, 64, 3, 3))
    plan = cconv.conv2d_plan((None, 64, 16, 16), w.shape, (1, 1), 1, (1, 1))
    want = cconv.conv2d_fprop(plan, x, w)                    # float64 reference
    for on in (True, False):
        cudnn.set_tf32(on)
        y = conv.conv2d_fprop(plan, cp.asarray(x, np.float32), cp.asarray(w, np.float32)).get()
        gx = conv.conv2d_dgrad(plan, cp.asarray(want, np.float32), cp.asarray(w, np.float32)).get()
        print(f"tf32={on}: fprop max rel err {np.abs(y - want).max() / np.abs(want).max():.2e}, "
              f"dgrad finite {np.isfinite(gx).all()}")
    cudnn.set_tf32(True)


@section
def bn_running_var():
    rng = np.random.default_rng(0)
    for C in (3, 16):
        x = rng.standard_normal((4, C, 5, 5)) * 2 + 1
        rm, rv = cp.zeros(C, np.float32), cp.ones(C, np.float32)
        g, b = cp.ones(C, np.float32), cp.zeros(C, np.float32)
        before = cudnn.calls["bn_fprop_train"]
        y, mean, invstd = norm.bn_fprop_train(cp.asarray(x, np.float32), g, b, rm, rv, 0.1, 1e-5)
        var_b, var_u = x.var(axis=(0, 2, 3)), x.var(axis=(0, 2, 3), ddof=1)
        print(f"C={C} cudnn={cudnn.calls['bn_fprop_train'] > before}: running_var err vs unbiased "
              f"{np.abs(rv.get() - (0.9 + 0.1 * var_u)).max():.1e}, vs biased {np.abs(rv.get() - (0.9 + 0.1 * var_b)).max():.1e}, "
              f"invstd err {np.abs(invstd.get() - 1 / np.sqrt(var_b + 1e-5)).max():.1e}")


def _time(name, fn, n=50):
    fn()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    cp.cuda.Device().synchronize()
    t2 = time.perf_counter()
    print(f"{name}: host {1e6 * (t1 - t0) / n:.1f} us/call, wall {1e6 * (t2 - t0) / n:.1f} us/call")


@section
def bn_speed():
    """ResNet-50's first BN at batch 32: cuDNN graph (C=64 has engines) against the CuPy kernels."""
    x = cp.random.standard_normal((32, 64, 112, 112), dtype=np.float32)
    g, b, rm, rv = (cp.ones(64, np.float32) for _ in range(4))
    gg, gb = cp.zeros(64, np.float32), cp.zeros(64, np.float32)
    y, mean, inv = norm.bn_fprop_train(x, g, b, rm, rv, 0.1, 1e-5)
    gx = cp.empty_like(x)
    print("cudnn calls after C=64:", dict(cudnn.calls))
    _time("bn train fprop (public)", lambda: norm.bn_fprop_train(x, g, b, rm, rv, 0.1, 1e-5, out=(y, mean, inv)))
    _time("bn bprop (public)", lambda: norm.bn_bprop(x, x, g, mean, inv, gg, gb, out=gx))
    stats = norm._MOD.get("bn_stats<float>")
    args = (x, mean, inv, rm, rv, np.int64(32), np.int64(64), np.int64(112 * 112), 1e-5, 0.1)
    _time("bn_stats CuPy kernel", lambda: stats((64,), (512,), args))
    _time("bn apply CuPy kernel", lambda: norm._apply(x, mean, inv, g, b, np.int32(64), np.int32(112 * 112), y))


@section
def host_time_per_call():
    x = cp.random.standard_normal((32, 64, 28, 28), dtype=np.float32)
    w = cp.random.standard_normal((64, 64, 3, 3), dtype=np.float32)
    plan = conv.conv2d_plan((None, 64, 28, 28), w.shape, (1, 1), 1, (1, 1))
    y = cp.empty((32, 64, 28, 28), np.float32)
    _time("conv2d_fprop 32x64x28x28 k3", lambda: conv.conv2d_fprop(plan, x, w, out=y), 200)
    _time("relu_fprop", lambda: activation.relu_fprop(x, out=y), 200)
    a, wd, z = (cp.random.standard_normal(s, dtype=np.float32) for s in ((32, 400), (120, 400), (32, 120)))
    _time("dense_fprop 32x400->120 (ctypes cuBLAS)", lambda: dense.dense_fprop(a, wd, out=z), 200)
    print("cudnn calls", dict(cudnn.calls))
