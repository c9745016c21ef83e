"""Fused and overwrite-mode GPU kernels against the CPU kernels: BN (+ ReLU) in one kernel per
direction, accumulate=False parameter gradients, add + ReLU; their capture into a CUDA graph; and a
timing print of the one-kernel BN against cuDNN's BN + a ReLU kernel for ResNet-50's shapes."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl  # noqa: E402
from minidl.backend import CapturedCall  # noqa: E402
from minidl.kernels.cpu import conv as cconv, dense as cdense, merge as cmerge, norm as cnorm  # noqa: E402
from minidl.kernels.gpu import _util, cudnn_graphs as cudnn  # noqa: E402
from minidl.kernels.gpu import conv as gconv, dense as gdense, merge as gmerge, norm as gnorm  # noqa: E402

TOL = {"bn": (1e-4, 1e-5), "conv": (1e-4, 1e-5), "dense": (1e-5, 1e-5), "exact": (0, 0)}
# ResNet-50's BN layers at batch 32 on its small images: (C, H, W)
RESNET = [(64, 14, 14), (64, 7, 7), (256, 7, 7), (128, 7, 7), (128, 4, 4), (512, 4, 4), (256, 4, 4),
          (256, 2, 2), (1024, 2, 2), (512, 2, 2), (512, 1, 1), (2048, 1, 1)]


def close(got, want, op):
    rtol, atol = TOL[op]
    want = np.asarray(want)
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=rtol, atol=atol * scale, err_msg=op)


def _bn_case(shape, seed=0):
    rng = np.random.default_rng(seed)
    C = shape[1]
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    return dict(x=2 * f(*shape) + 0.5, gamma=f(C), beta=f(C), rm=0.1 * f(C), rv=np.abs(f(C)) + 0.5,
                gy=f(*shape), gg=f(C), gb=f(C))


def _check_bn(shape, relu, accumulate):
    """One fprop + bprop on the GPU against the CPU kernels in float64 on the same float32 inputs."""
    h = _bn_case(shape)
    d = {k: cp.asarray(v) for k, v in h.items()}
    c = {k: v.astype(np.float64) for k, v in h.items()}
    c4 = shape + (1,) * (4 - len(shape))         # the CPU kernels take (N, C, H, W) only
    c["x"], c["gy"] = c["x"].reshape(c4), c["gy"].reshape(c4)
    y, mean, invstd = gnorm.bn_fprop_train(d["x"], d["gamma"], d["beta"], d["rm"], d["rv"], 0.1, 1e-5, relu=relu)
    cy, cmean, cinv = cnorm.bn_fprop_train(c["x"], c["gamma"], c["beta"], c["rm"], c["rv"], 0.1, 1e-5, relu=relu)
    for got, want in ((y, cy.reshape(shape)), (mean, cmean), (invstd, cinv), (d["rm"], c["rm"]), (d["rv"], c["rv"])):
        close(got, want, "bn")
    if not accumulate:                           # garbage in the gradients: overwriting must not read it
        d["gg"].fill(np.nan)
        d["gb"].fill(np.nan)
        c["gg"][...], c["gb"][...] = 0, 0
    # The ReLU mask comes from the GPU's y on both sides: a value within rounding of 0 may fall either way.
    ymask = cp.asnumpy(y).astype(np.float64).reshape(c4)
    gx = gnorm.bn_bprop(d["x"], d["gy"], d["gamma"], mean, invstd, d["gg"], d["gb"], y=y, relu=relu,
                        accumulate=accumulate)
    cgx = cnorm.bn_bprop(c["x"], c["gy"], c["gamma"], cmean, cinv, c["gg"], c["gb"], y=ymask, relu=relu)
    for got, want in ((gx, cgx.reshape(shape)), (d["gg"], c["gg"]), (d["gb"], c["gb"])):
        close(got, want, "bn")


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("accumulate", [True, False])
@pytest.mark.parametrize("chw", RESNET)
def test_bn_resnet_shapes_match_cpu(chw, relu, accumulate):
    assert 32 * chw[1] * chw[2] <= gnorm._KERNEL_MAX_M          # these run the one-kernel path
    _check_bn((32,) + chw, relu, accumulate)


# odd S and C, 2-D, several channels a block (CB > 1), values re-read from memory (R = 0) with CB = 1 and 8
@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (8, 16, 4, 4), (32, 10, 1, 1), (3, 6, 5, 7), (64, 12),
                                   (2, 48, 2, 2), (16, 6, 2, 2), (8, 3, 50, 50), (4096, 16)])
@pytest.mark.parametrize("relu", [False, True])
def test_bn_other_shapes_match_cpu(shape, relu):
    _check_bn(shape, relu, accumulate=relu)


@pytest.mark.parametrize("row,per_thread", [(8, 4), (8, 8), (32, 2), (32, 4)])
@pytest.mark.parametrize("chw", [(64, 14, 14), (256, 7, 7), (512, 4, 4), (256, 2, 2), (2048, 1, 1)])
def test_bn_other_launch_shapes_match_cpu(monkeypatch, chw, row, per_thread):
    """Other block shapes (channels a block, values a thread) give the same numbers: free to retune."""
    monkeypatch.setattr(gnorm, "_ROW", row)
    monkeypatch.setattr(gnorm, "_PER_THREAD", per_thread)
    _check_bn((32,) + chw, relu=True, accumulate=False)


@pytest.mark.parametrize("shape", [(8, 16, 4, 4), (32, 64, 7, 7), (8, 64, 24, 24)])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("accumulate", [True, False])
def test_bn_cudnn_path_matches_cpu(monkeypatch, shape, relu, accumulate):
    """Above _KERNEL_MAX_M values a channel cuDNN runs (plus ReLU, mask, add kernels): same numbers."""
    monkeypatch.setattr(gnorm, "_KERNEL_MAX_M", 0)
    before = dict(cudnn.calls)
    _check_bn(shape, relu, accumulate)
    assert cudnn.calls["bn_fprop_train"] == before.get("bn_fprop_train", 0) + 1
    assert cudnn.calls["bn_bprop"] == before.get("bn_bprop", 0) + 1


def test_bn_infer_relu_matches_cpu():
    h = _bn_case((4, 8, 3, 3))
    args = [h[k] for k in ("x", "gamma", "beta", "rm", "rv")]
    for relu in (False, True):
        got = gnorm.bn_fprop_infer(*map(cp.asarray, args), 1e-5, relu=relu)
        close(got, cnorm.bn_fprop_infer(*args, 1e-5, relu=relu), "bn")


def _param_view(flat, offset, shape):
    """A gradient as minidl lays it out: a view into a flat buffer at a 256-byte aligned offset."""
    n = int(np.prod(shape))
    return flat[offset:offset + n].reshape(shape)


@pytest.mark.parametrize("accumulate", [False, True])      # False first: it must make no scratch buffer
def test_param_gradients_overwrite_or_add(no_tf32, accumulate):
    rng = np.random.default_rng(1)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    plan = cconv.conv2d_plan((None, 16, 6, 6), (24, 16, 3, 3), (1, 1), 1, (1, 1))
    x, gy, xd, gyd = f(4, 16, 6, 6), f(4, 24, 6, 6), f(9, 7), f(9, 5)
    flat = cp.full(8192, np.nan if not accumulate else 0.5, np.float32)
    gw, gwd, gb = _param_view(flat, 0, (24, 16, 3, 3)), _param_view(flat, 3520, (5, 7)), _param_view(flat, 3584, (24,))
    host = {k: cp.asnumpy(a).astype(np.float64) for k, a in (("gw", gw), ("gwd", gwd), ("gb", gb))}
    if not accumulate:
        for a in host.values():
            a[...] = 0
    had_scratch = any(k[1] == "conv_wgrad" and k[2] == gw.shape for k in _util._buffers)
    gconv.conv2d_wgrad(plan, cp.asarray(x), cp.asarray(gy), gw, accumulate=accumulate)
    gdense.dense_wgrad(cp.asarray(xd), cp.asarray(gyd), gwd, accumulate=accumulate)
    gdense.bias_grad(cp.asarray(gy), gb, accumulate=accumulate)
    cconv.conv2d_wgrad(plan, x.astype(np.float64), gy.astype(np.float64), host["gw"])
    cdense.dense_wgrad(xd.astype(np.float64), gyd.astype(np.float64), host["gwd"])
    cdense.bias_grad(gy.astype(np.float64), host["gb"])
    close(gw, host["gw"], "conv")
    close(gwd, host["gwd"], "dense")
    close(gb, host["gb"], "dense")
    if not accumulate and not had_scratch:       # overwriting writes gw itself: no scratch buffer, no add
        assert not any(k[1] == "conv_wgrad" and k[2] == gw.shape for k in _util._buffers)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_add_relu_matches_cpu(n):
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((4, 8, 3, 3)).astype(np.float32) for _ in range(n)]
    for relu in (False, True):
        want = cmerge.add_fprop(xs, relu=relu)
        close(gmerge.add_fprop([cp.asarray(x) for x in xs], relu=relu), want, "bn")
        dxs = [cp.asarray(x) for x in xs]
        assert gmerge.add_fprop(dxs, out=dxs[-1], relu=relu) is dxs[-1]        # in place into an input
        close(dxs[-1], want, "bn")


def test_fused_step_captures_into_a_cuda_graph(no_tf32):
    """BN + ReLU forward and backward, add + ReLU, overwrite-mode conv/dense/bias gradients: one CUDA
    graph whose replay gives the eager numbers (bit for bit from the deterministic BN and add kernels)."""
    device = minidl.get_device("cuda")
    h = _bn_case((32, 64, 7, 7), seed=3)
    d = {k: cp.asarray(v) for k, v in h.items()}
    rm0, rv0 = d["rm"].copy(), d["rv"].copy()
    plan = gconv.conv2d_plan((None, 64, 7, 7), (64, 64, 1, 1), (1, 1), 0, (1, 1))
    flat = cp.zeros(64 * 64 + 64 + 10 * 64, np.float32)
    gw, gb, gwd = flat[:4096].reshape(64, 64, 1, 1), flat[4096:4160], flat[4160:].reshape(10, 64)
    xd, gyd = cp.asarray(h["x"][:, :, 0, 0].copy()), cp.asarray(h["gy"][:, :10, 0, 0].copy())
    y, s, gx = (cp.empty((32, 64, 7, 7), np.float32) for _ in range(3))
    mean, invstd = cp.empty(64, np.float32), cp.empty(64, np.float32)

    def step():
        cp.copyto(d["rm"], rm0)                  # device-to-device: replays read the same start
        cp.copyto(d["rv"], rv0)
        gnorm.bn_fprop_train(d["x"], d["gamma"], d["beta"], d["rm"], d["rv"], 0.1, 1e-5, out=(y, mean, invstd),
                             relu=True)
        gmerge.add_fprop([y, d["x"]], out=s, relu=True)
        gnorm.bn_bprop(d["x"], s, d["gamma"], mean, invstd, d["gg"], d["gb"], out=gx, y=y, relu=True,
                       accumulate=False)
        gconv.conv2d_wgrad(plan, y, gx, gw, accumulate=False)
        gdense.bias_grad(gx, gb, accumulate=False)
        gdense.dense_wgrad(xd, gyd, gwd, accumulate=False)

    outs = (y, s, gx, mean, invstd, d["rm"], d["rv"], d["gg"], d["gb"], flat)
    with device.stream:
        step()
        device.stream.synchronize()
        eager = [cp.asnumpy(a) for a in outs]
        graph = CapturedCall(device, step)
        for a in outs:
            a.fill(np.nan)
        graph.replay()
        device.stream.synchronize()
    for got, want in zip(outs[:-1], eager[:-1]):
        np.testing.assert_array_equal(cp.asnumpy(got), want)
    np.testing.assert_allclose(cp.asnumpy(flat), eager[-1], rtol=1e-6, atol=1e-6)   # cuDNN and cuBLAS
    assert np.isfinite(eager[-1]).all()


def _graph_us(device, fn, reps=20, launches=20):
    """GPU microseconds per call of fn, replayed `reps` times inside one CUDA graph (no launch gaps)."""
    st = device.stream
    with st:
        fn()
        st.synchronize()
        st.begin_capture()
        for _ in range(reps):
            fn()
        g = st.end_capture()
        g.launch(st)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(st)
        for _ in range(launches):
            g.launch(st)
        end.record(st)
        end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) * 1e3 / (reps * launches)


def test_print_bn_timings():
    """Per-call GPU time (us, CUDA events over graph replays): one-kernel BN(+ReLU) vs cuDNN (+ReLU)."""
    device = minidl.get_device("cuda")
    extra = [(128, 16, 16), (256, 14, 14), (64, 28, 28), (64, 56, 56)]   # more values a channel: _KERNEL_MAX_M
    tiny = cp.zeros(32, np.float32)
    print(f"\nfloor: one tiny elementwise kernel {_graph_us(device, lambda: _util.RELU(tiny, tiny)):.2f} us")
    print(f"\n{'N,C,H,W':>18} {'M':>7} | fwd: kern kern+relu cudnn cudnn+relu | "
          f"bwd: kern+relu kern cudnn mask+cudnn+add")
    for chw in RESNET + extra:
        shape = (32,) + chw
        d = {k: cp.asarray(v) for k, v in _bn_case(shape).items()}
        x, gamma, beta, rm, rv, gy, gg, gb = (d[k] for k in ("x", "gamma", "beta", "rm", "rv", "gy", "gg", "gb"))
        y, gx, gym = cp.empty_like(x), cp.empty_like(x), cp.empty_like(x)
        mean, invstd, dg, db = (cp.empty_like(gamma) for _ in range(4))
        fw = (x, gamma, beta, rm, rv, 0.1, 1e-5, y, mean, invstd)

        def cudnn_relu():
            gnorm._cudnn_fprop(*fw)
            _util.RELU(y, y)

        def mask_cudnn_add():
            _util.RELU_BPROP(y, gy, gym)
            gnorm._cudnn_bprop(x, gym, gamma, mean, invstd, dg, db, gx)
            gnorm._add2(dg, db, gg, gb)

        times = [_graph_us(device, fn) for fn in (
            lambda: gnorm._kernel_fprop(*fw, False), lambda: gnorm._kernel_fprop(*fw, True),
            lambda: gnorm._cudnn_fprop(*fw), cudnn_relu,
            lambda: gnorm._kernel_bprop(x, gy, y, gamma, mean, invstd, gg, gb, gx, True, False),
            lambda: gnorm._kernel_bprop(x, gy, y, gamma, mean, invstd, gg, gb, gx, False, True),
            lambda: gnorm._cudnn_bprop(x, gy, gamma, mean, invstd, gg, gb, gx), mask_cudnn_add)]
        print(f"{str(shape):>18} {32 * chw[1] * chw[2]:>7} | fwd: " + " ".join(f"{t:6.2f}" for t in times[:4])
              + " | bwd: " + " ".join(f"{t:6.2f}" for t in times[4:]))

        def fused_step():
            gnorm._kernel_fprop(*fw, True)
            gnorm._kernel_bprop(x, gy, y, gamma, mean, invstd, gg, gb, gx, True, False)

        sweep = []                               # fused fwd + bwd (ReLU) for other launch shapes
        for row, per_thread in [(8, 2), (8, 4), (8, 8), (32, 2), (32, 4)]:
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(gnorm, "_ROW", row)
                mp.setattr(gnorm, "_PER_THREAD", per_thread)
                sweep.append(f"row{row}/pt{per_thread} {_graph_us(device, fused_step):6.2f}")
        print(f"{'':>18} {'':>7} | fused fwd+bwd: " + "  ".join(sweep))
