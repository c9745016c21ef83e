"""minidl.inference on the GPU: CUDA-graph replays equal the CPU inference model (TF32 off)."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl as dl  # noqa: E402
from minidl import inference, models  # noqa: E402
from minidl.inference import schedule  # noqa: E402
from minidl.backend import CaptureError, CapturedCall  # noqa: E402
from minidl.testing import randomize_weights  # noqa: E402

# max |GPU - CPU| / max |CPU|, FP32 with TF32 off: cuDNN's engines (implicit GEMM, Winograd, FFT)
# sum in other orders than im2col; ResNet-18 stacks 21 convs, so it gets more room.
TOL = {"lenet5": 1e-4, "resnet18": 5e-4}


randomize = randomize_weights          # non-trivial BN statistics, gamma, beta and biases


def host(m, y):
    m.device.sync()                        # predict returns before the graph has run
    return cp.asnumpy(y)


def assert_close(got, want, tol):
    err, scale = float(np.abs(got - want).max()), float(np.abs(want).max())
    assert err <= tol * scale, f"max error {err:.3g} is more than {tol:g} of max |y| {scale:.3g}"


def batch(n, seed):
    return np.random.default_rng(seed).random((n, 1, 28, 28), dtype=np.float32)     # images in [0, 1]


@pytest.fixture(scope="module")
def compiled():
    """{name: (cpu InferenceModel, cuda InferenceModel)} of LeNet-5 and ResNet-18 (random BN stats)."""
    out = {"models": {}}
    for name, model in (("lenet5", randomize(models.lenet5())), ("resnet18", randomize(models.resnet(18)))):
        out[name] = inference.compile(model, device="cpu"), inference.compile(model, device="cuda")
        out["models"][name] = model
    return out


@pytest.mark.parametrize("name", ["lenet5", "resnet18"])
@pytest.mark.parametrize("N", [1, 64])
def test_graph_replay_equals_cpu_inference(no_tf32, compiled, name, N):
    cpu, gpu = compiled[name]
    x = batch(N, seed=N)
    y = gpu.predict(x)                                     # host input: copied into the buffer
    assert isinstance(y, cp.ndarray) and y.shape == (N, 10)
    assert gpu._entries[N][1] is not None                  # a CapturedCall for this batch size
    assert_close(host(gpu, y), cpu.predict(x), TOL[name])


def test_replays_with_new_inputs_give_new_outputs(no_tf32, compiled):
    from minidl.kernels.gpu import cudnn_graphs as cudnn
    cpu, gpu = compiled["resnet18"]
    x1, x2 = batch(8, seed=11), batch(8, seed=12)
    y1 = host(gpu, gpu.predict(x1)).copy()                 # first call at N=8: warm-up + capture
    executes = sum(cudnn.calls.values())
    y2 = host(gpu, gpu.predict(cp.asarray(x2))).copy()     # device input: a device-to-device copy
    assert sum(cudnn.calls.values()) == executes           # a replay runs no Python kernel call
    assert not np.allclose(y1, y2)
    assert_close(y1, cpu.predict(x1), TOL["resnet18"])
    assert_close(y2, cpu.predict(x2), TOL["resnet18"])
    buf = gpu.input_buffer(8)                              # written in place: predict skips the copy
    buf[...] = cp.asarray(x1)
    np.testing.assert_array_equal(host(gpu, gpu.predict(buf)), y1)


def test_nhwc_and_nchw_images_replay_to_the_same_outputs(no_tf32, compiled):
    """Compiled predict takes (N, H, W), NCHW and NHWC as Model.predict does, from the host and from
    the device: the same buffer, the same graph, the same outputs bit for bit, and the CPU's."""
    cpu, gpu = compiled["lenet5"]
    x = batch(6, seed=21)
    want = host(gpu, gpu.predict(x)).copy()
    assert_close(want, cpu.predict(x), TOL["lenet5"])
    nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    for images in (x[:, 0], nhwc, cp.asarray(nhwc), cp.asarray(x[:, 0])):
        np.testing.assert_array_equal(host(gpu, gpu.predict(images)), want)


@pytest.mark.parametrize("tf32", [False, True])
def test_batch_1000_replay_equals_eager_and_cpu(compiled, tf32):
    """What `python -m minidl.infer` runs: batch 1000, TF32 on by default (a fresh model: graphs are
    captured with the TF32 setting of their first call)."""
    from minidl.kernels.gpu import cudnn_graphs as cudnn
    cpu, _ = compiled["lenet5"]
    lenet = compiled["models"]["lenet5"]
    was = cudnn.tf32_enabled()
    cudnn.set_tf32(tf32)
    try:
        gpu = inference.compile(lenet, device="cuda")
        x = batch(1000, seed=7)
        graphed = host(gpu, gpu.predict(x))                # the capture checks itself against eager
        gpu.cuda_graphs = False
        eager = host(gpu, gpu.predict(x))
    finally:
        cudnn.set_tf32(was)
    want = cpu.predict(x)
    assert_close(graphed, eager, 1e-5)
    assert_close(eager, want, 2e-2 if tf32 else TOL["lenet5"])     # TF32: 10-bit mantissas
    assert (eager.argmax(axis=1) == want.argmax(axis=1)).mean() >= 0.99


@pytest.mark.parametrize("x_shape,w_shape,padding", [((1000, 1, 28, 28), (6, 1, 5, 5), 2),
                                                     ((1000, 6, 14, 14), (16, 6, 5, 5), 0)])
def test_fused_conv_bias_relu_at_batch_1000_with_tf32(x_shape, w_shape, padding):
    """Inference relies on the conv kernels' fused conv+bias+ReLU (LeNet's shapes, TF32 on)."""
    from minidl.kernels.cpu import conv as cpu_conv
    from minidl.kernels.gpu import conv as gpu_conv, cudnn_graphs as cudnn
    fused = getattr(gpu_conv, "conv2d_bias_relu_fprop", None)
    if fused is None:
        pytest.skip("the GPU conv kernels have no conv2d_bias_relu_fprop")
    assert cudnn.tf32_enabled()
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in (x_shape, w_shape, w_shape[:1]))
    plan = cpu_conv.conv2d_plan((None, *x_shape[1:]), w_shape, (1, 1), padding, (1, 1))
    want = np.maximum(cpu_conv.conv2d_fprop(plan, x, w, b), 0)
    got = fused(plan, cp.asarray(x), cp.asarray(w), cp.asarray(b))
    assert_close(cp.asnumpy(got), want, 2e-2)


@pytest.mark.parametrize("N", [2, 64])
def test_profile_times_every_kernel_call(compiled, N):
    _, gpu = compiled["lenet5"]
    rows = gpu.profile(batch(N, seed=3), repeats=5)
    steps = gpu.schedule(N)[0]
    assert [r.name for r in rows] == [st.name for st in steps]
    assert [n for st in steps for n in st.nodes] == gpu.nodes
    assert all(r.ms > 0 for r in rows if r.kind != "flatten")


def test_captured_call_replays_on_fixed_buffers():
    dev = dl.get_device("cuda")
    x = cp.zeros(1000, dtype=cp.float32)                   # allocated before the capture, kept
    call = CapturedCall(dev, lambda: cp.tanh(x * 2 + 1))   # the temporary comes from the private pool
    assert call.nbytes > 0
    for value in (np.linspace(-1, 1, 1000), np.full(1000, 0.25)):
        with dev.stream:
            x.set(value.astype(np.float32))
        y = call.replay()
        dev.sync()
        np.testing.assert_allclose(cp.asnumpy(y), np.tanh(value * 2 + 1), rtol=1e-6, atol=1e-6)


def test_a_host_sync_inside_the_function_is_reported():
    dev = dl.get_device("cuda")
    x = cp.ones(16, dtype=cp.float32)

    def syncs():
        y = x + 1
        return y, float(y.sum())                           # reads the device: not capturable

    with pytest.raises(CaptureError, match="captured"):
        CapturedCall(dev, syncs, warmup=1)
    ok = CapturedCall(dev, lambda: x * 3)                  # the stream is usable afterwards
    ok.replay()
    dev.sync()
    np.testing.assert_array_equal(cp.asnumpy(ok.result), np.full(16, 3, np.float32))


# -- the direct kernel family against the CPU reference (float64) ---------------------------------------
def _rand(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def _ref(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


DIRECT_TOL = 1e-5        # full FP32 sums of at most a few hundred terms against float64


@pytest.mark.parametrize("N,C,H,W,K,kH,kW,pads,pool,relu,bias,config", [
    (1, 1, 28, 28, 6, 5, 5, 2, 2, True, True, None),                        # LeNet conv1, batch 1
    (1000, 1, 28, 28, 6, 5, 5, 2, 2, True, True, None),                     # ... batch 1000
    (1, 6, 14, 14, 16, 5, 5, 0, 2, True, True, None),                       # LeNet conv2
    (333, 6, 14, 14, 16, 5, 5, 0, 2, True, True, None),                     # a partial last block
    (333, 6, 14, 14, 16, 5, 5, 0, 2, True, True, (16, 10, 256)),            # throughput configuration
    (5, 3, 11, 10, 5, 3, 4, (1, 2, 0, 3), 2, False, False, None),           # asymmetric pads, no bias, no ReLU
    (7, 2, 9, 9, 7, 3, 3, 1, 1, True, True, None),                          # no pool
    (4, 4, 13, 17, 12, 5, 3, (2, 1, 1, 2), 2, True, True, (4, 3, 64)),
    (4, 4, 13, 17, 12, 5, 3, (2, 1, 1, 2), 2, True, True, (5, 3, 64)),      # K not a multiple of KT
])
def test_direct_conv_equals_cpu(N, C, H, W, K, kH, kW, pads, pool, relu, bias, config):
    from minidl.kernels.cpu import direct as cpu
    from minidl.kernels.gpu import direct as gpu
    rng = np.random.default_rng(N + C + K)
    x, w = _rand(rng, (N, C, H, W)), _rand(rng, (K, C, kH, kW))
    b = _rand(rng, (K,)) if bias else None
    f = "conv2d_bias_relu_maxpool2x2_fprop" if pool == 2 else "conv2d_bias_relu_fprop"
    want = getattr(cpu, f)(_ref(x), _ref(w), _ref(b), pads, relu)
    got = getattr(gpu, f)(cp.asarray(x), cp.asarray(w), None if b is None else cp.asarray(b), pads, relu,
                          config=config)
    assert got.shape == want.shape
    assert_close(cp.asnumpy(got), want, DIRECT_TOL)


def _lenet_stages(rng, xp=np):
    shapes = [("conv", (6, 1, 5, 5), 2), ("conv", (16, 6, 5, 5), 0), ("dense", (120, 400), True),
              ("dense", (84, 120), True), ("dense", (10, 84), False)]
    stages = []
    for kind, shape, extra in shapes:
        w, b = xp.asarray(_rand(rng, shape) * 0.3), xp.asarray(_rand(rng, shape[:1]) * 0.1)
        stages.append((kind, w, b, extra, 2, True) if kind == "conv" else (kind, w, b, extra))
    return stages


def _to(stages, f):
    return [tuple(f(a) if hasattr(a, "shape") else a for a in st) for st in stages]


@pytest.mark.parametrize("N,blocks", [(1, None), (1, 1), (1, 7), (1, 120), (3, None), (8, None), (40, None),
                                      (200, None)])
def test_chain_kernel_equals_cpu_and_repeats(N, blocks):
    from minidl.kernels.cpu import direct as cpu
    from minidl.kernels.gpu import direct as gpu
    rng = np.random.default_rng(N)
    stages = _lenet_stages(rng)
    x = _rand(rng, (N, 1, 28, 28))
    want = cpu.chain_fprop(_ref(x), _to(stages, _ref))
    gstages, xg = _to(stages, cp.asarray), cp.asarray(x)
    first = cp.asnumpy(gpu.chain_fprop(xg, gstages, blocks=blocks))
    again = cp.asnumpy(gpu.chain_fprop(xg, gstages, blocks=blocks))      # the tickets were reset
    assert_close(first, want, DIRECT_TOL)
    np.testing.assert_array_equal(first, again)


def test_chain_kernel_replays_in_a_cuda_graph():
    from minidl.kernels.gpu import direct as gpu
    dev = dl.get_device("cuda")
    rng = np.random.default_rng(5)
    stages = _to(_lenet_stages(rng), cp.asarray)
    x = cp.asarray(_rand(rng, (2, 1, 28, 28)))
    call = CapturedCall(dev, lambda: gpu.chain_fprop(x, stages))
    for seed in (6, 7):
        with dev.stream:
            x[...] = cp.asarray(_rand(np.random.default_rng(seed), x.shape))
        y = cp.asnumpy(call.replay()).copy()
        with dev.stream:
            want = cp.asnumpy(gpu.chain_fprop(x, stages))
        np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("N", [1, 3, 300])                  # 300: beyond MLP_CHAIN_MAX, cuBLAS
def test_mlp_and_dense_only_chains_equal_cpu(N):
    from minidl.kernels.cpu import direct as cpu
    from minidl.kernels.gpu import direct as gpu
    rng = np.random.default_rng(N)
    x = _rand(rng, (N, 2048))
    ws = [_rand(rng, (96, 2048)) * 0.05, _rand(rng, (10, 96))]
    bs = [None, _rand(rng, (10,))]
    want = cpu.mlp_fprop(_ref(x), [_ref(w) for w in ws], [_ref(b) for b in bs], [True, False])
    got = gpu.mlp_fprop(cp.asarray(x), [cp.asarray(w) for w in ws], [None if b is None else cp.asarray(b) for b in bs],
                        [True, False])
    assert_close(cp.asnumpy(got), want, DIRECT_TOL)
    one = gpu.chain_fprop(cp.asarray(x), [("dense", cp.asarray(ws[0]), None, False)])      # one layer, split
    assert_close(cp.asnumpy(one), _ref(x) @ _ref(ws[0]).T, DIRECT_TOL)


def test_add_relu_and_bias_act():
    from minidl.kernels.gpu import direct as gpu
    rng = np.random.default_rng(0)
    xs = [_rand(rng, (4, 8, 3, 3)) for _ in range(3)]
    got = gpu.add_relu_fprop([cp.asarray(x) for x in xs])
    np.testing.assert_allclose(cp.asnumpy(got), np.maximum(xs[0] + xs[1] + xs[2], 0), rtol=1e-6, atol=1e-6)
    got = gpu.add_relu_fprop([cp.asarray(x) for x in xs[:2]])
    np.testing.assert_allclose(cp.asnumpy(got), np.maximum(xs[0] + xs[1], 0), rtol=1e-6, atol=1e-6)
    y, b = _rand(rng, (5, 7)), _rand(rng, (7,))
    np.testing.assert_allclose(cp.asnumpy(gpu.bias_act_fprop(cp.asarray(y), cp.asarray(b), True)),
                               np.maximum(y + b, 0), rtol=1e-6)


def test_lenet_schedules_on_the_gpu(no_tf32, compiled):
    cpu, gpu = compiled["lenet5"]
    assert [st.kind for st in gpu.schedule(1)[0]] == ["chain"]
    assert [st.kind for st in gpu.schedule(1000)[0]] == ["conv_pool", "conv_pool", "flatten", "mlp", "softmax"]
    staged = getattr(schedule.direct_family(gpu.device), "X_AFFINE", False)     # the Normalize inside the chain
    assert gpu.schedule(1)[0][0].kernels == (2 if staged else 3)                  # and the model's Softmax after
    x = batch(1, seed=21)
    buf = gpu.input_buffer(1)
    buf[...] = cp.asarray(x)
    y = gpu.predict(buf)                                   # the fast path: the graph's output buffer
    assert y is gpu.predict(buf)
    assert_close(host(gpu, y), cpu.predict(x), TOL["lenet5"])
    plain = inference.compile(compiled["models"]["lenet5"], device="cuda", direct=False)
    assert [st.kind for st in plain.schedule(1)[0]] == [n.kind for n in cpu.nodes]
    assert_close(host(plain, plain.predict(x)), cpu.predict(x), TOL["lenet5"])
