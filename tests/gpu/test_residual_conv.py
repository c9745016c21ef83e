"""A residual conv, act(conv(x, w) + b + z), on the GPU: cuBLASLt's GEMM with the shortcut in its epilogue
(kernels/gpu/_cublaslt.py) against the formula, the conv kernel's residual entry against the CPU (the GEMM
where the conv is one, the conv and an add elsewhere), and ResNet-50's compiled inference, whose 16
shortcut adds run in those epilogues, replayed from its CUDA graph against the CPU."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

from minidl import inference, models  # noqa: E402
from minidl.kernels.cpu import conv as cpu  # noqa: E402
from minidl.kernels.gpu import _cublaslt, _util, conv, engines  # noqa: E402
from minidl.precision import dtype_of  # noqa: E402
from minidl.testing import randomize_weights  # noqa: E402


def host(m, y):
    m.device.sync()                        # predict returns before the graph has run
    return cp.asnumpy(y)


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max()) / float(np.abs(want).max())


TOL = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 4e-3}      # TF32 off; half: their rounding of y


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("bias,relu", [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("M,C,K", [(300, 64, 96), (7, 24, 40), (1, 256, 512)])
def test_gemm_adds_bias_and_shortcut_before_the_relu(no_tf32, rand, dtype, bias, relu, M, C, K):
    dt = dtype_of(dtype)
    x, w, b, z = rand(M, C), rand(K, C) / np.sqrt(C), rand(K), rand(M, K)
    x, w, b, z = (a.astype(dt).astype(np.float64) for a in (x, w, b, z))     # what the device holds
    want = x @ w.T + z + (b if bias else 0)
    want = np.maximum(want, 0) if relu else want
    d = [cp.asarray(a.astype(dt)) for a in (x, w, b, z)]
    y = cp.full((M, K), np.nan, dt)
    got = _cublaslt.matmul(d[0], d[1], y, d[2] if bias else None, d[3], relu, tf32=False)
    assert got is y and rel_err(cp.asnumpy(y.astype(np.float32)), want) < TOL[dtype]
    y2 = cp.full((M, K), np.nan, dt)                                      # without z: beta 0, C not read
    _cublaslt.matmul(d[0], d[1], y2, d[2] if bias else None, None, relu, tf32=False)
    want2 = x @ w.T + (b if bias else 0)
    assert rel_err(cp.asnumpy(y2.astype(np.float32)), np.maximum(want2, 0) if relu else want2) < TOL[dtype]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("x_shape,w_shape,cl", [((6, 32, 5, 5), (48, 32, 1, 1), True),     # one GEMM
                                                 ((6, 64, 1, 1), (128, 64, 1, 1), False),   # H = W = 1
                                                 ((6, 32, 5, 5), (48, 32, 1, 1), False),    # NCHW: conv + add
                                                 ((4, 16, 6, 6), (24, 16, 3, 3), True)])    # 3x3: conv + add
def test_residual_conv_equals_the_cpu_and_keeps_its_layout(no_tf32, rand, monkeypatch, dtype, x_shape, w_shape, cl):
    dt = dtype_of(dtype)
    pad = w_shape[2] // 2
    plan = conv.conv2d_plan((None, *x_shape[1:]), w_shape, (1, 1), pad, (1, 1))
    x, w, b = rand(*x_shape), rand(*w_shape) / np.sqrt(np.prod(w_shape[1:])), rand(w_shape[0])
    z = rand(x_shape[0], *plan.out_shape[1:])
    x, w, b, z = (a.astype(dt).astype(np.float32) for a in (x, w, b, z))
    want = np.maximum(cpu.conv2d_fprop(plan, x, w, b) + z, 0)
    dx, dz = (_util.in_order(cp.asarray(a.astype(dt)), cl) for a in (x, z))
    chosen = []
    fastest = engines.fastest
    monkeypatch.setattr(engines, "fastest", lambda key, cands: chosen.append(sorted(cands)) or fastest(key, cands))
    for _ in range(2):                                  # the first call times both ways, the second runs one
        y = conv.conv2d_bias_add_act_fprop(plan, dx, cp.asarray(w.astype(dt)), cp.asarray(b.astype(dt)), dz, cl=cl)
        assert _util.channels_last(y) == (cl and x_shape[2] * x_shape[3] > 1)
        assert rel_err(cp.asnumpy(y.astype(np.float32)), want) < TOL[dtype]
    gemm = w_shape[2] == 1 and (cl or x_shape[2] * x_shape[3] == 1)
    assert (["conv", "gemm"] in chosen) == gemm


@pytest.mark.parametrize("precision,tol", [("fp32", 1e-3), ("bf16", 5e-2)])
def test_resnet50_inference_with_its_shortcuts_in_the_gemms_equals_the_unfused(no_tf32, monkeypatch, precision, tol):
    """Replayed from its CUDA graph: fp32 against the CPU; bf16 against the GPU's bf16 model compiled
    without the fusion (the same roundings but the one of conv + b before z is added)."""
    from minidl.graph import passes
    model = randomize_weights(models.resnet(50))
    x = np.random.default_rng(5).random((32, 1, 28, 28), dtype=np.float32)
    gpu = inference.compile(model, device="cuda", precision=precision, probabilities=False)   # logits: a
    assert gpu.stats["add_fused"] == 16                 # random ResNet-50's softmax saturates, hiding the rest
    y = host(gpu, gpu.predict(x))                       # warm-ups, then the capture, checked against eager
    again = host(gpu, gpu.predict(x))                   # a replay
    assert np.array_equal(again, y)
    if precision == "fp32":
        want = inference.compile(model, device="cpu", probabilities=False).predict(x)
    else:
        monkeypatch.setattr(passes, "fuse_residual_adds", lambda g: g)
        plain = inference.compile(model, device="cuda", precision=precision, probabilities=False)
        assert not plain.stats.get("add_fused")
        want = host(plain, plain.predict(x))
    assert rel_err(y, want) < tol
