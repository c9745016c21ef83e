"""float64 on the GPU: every kernel family against its CPU twin in float64, the build-time verdicts of
the support table (Device.dtype_problem), inference, and training steps against the CPU's.

Float64 on both sides leaves only the order of sums and libm's last ulp between them: TOL["float64"].
The first test says whether this cuDNN convolves in double at all; the conv tests skip if it does not.
"""
import importlib

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl as dl  # noqa: E402
from minidl import inference, layers as L, models, optim  # noqa: E402
from minidl.backend import KERNEL_FAMILIES, CounterRNG, DtypeError  # noqa: E402
from minidl.kernels.gpu import cudnn_graphs as cudnn  # noqa: E402
from tests.helpers import optim_rules  # noqa: E402
from tests.helpers.tolerance import close  # noqa: E402

F64 = "float64"


def families(name):
    """(cpu, gpu) modules of one kernel family."""
    return importlib.import_module(f"minidl.kernels.cpu.{name}"), importlib.import_module(f"minidl.kernels.gpu.{name}")


def d(a):
    """A host array on the GPU (float64 stays float64)."""
    return cp.asarray(a)


def f64(got, want):
    """The device result is float64 and equals the CPU's float64 result within TOL['float64']."""
    assert got.dtype == np.float64, got.dtype
    close(got, want, F64)


@pytest.fixture
def rand64():
    rng = np.random.default_rng(0)
    return lambda *shape: rng.standard_normal(shape)          # float64


def _conv_verdict():
    return families("conv")[1].dtype_problem(F64)


def test_float64_convolutions_run_right_or_are_refused_by_name():
    """The verdict every float64 Conv2D gets at build: None (cuDNN's double convolutions ran and
    agreed with the CPU), or one line, which a float64 Conv2D on the GPU is refused with."""
    why = _conv_verdict()
    x = dl.Input((3, 8, 8))
    build = lambda: dl.Model(x, L.Conv2D(4, 3, name="conv1")(x), device=dl.get_device("cuda", dtype=F64))  # noqa: E731
    if why is None:
        build()
        return
    assert "\n" not in why and why.startswith(f"cuDNN {cudnn.version()}")
    with pytest.raises(DtypeError) as e:
        build()
    assert str(e.value).startswith("layer conv1 (Conv2D): float64 is not supported on the GPU (cuDNN ")


CONVS = [  # x shape, w shape, stride, padding, dilation
    ((2, 3, 8, 8), (4, 3, 3, 3), (1, 1), 1, (1, 1)),
    ((2, 4, 9, 7), (6, 4, 3, 3), (2, 2), "same", (1, 1)),
    ((3, 2, 8, 8), (5, 2, 2, 2), (1, 1), "same", (1, 1)),      # pads (0, 1, 0, 1): asymmetric
    ((2, 3, 10, 10), (4, 3, 3, 3), (1, 1), 2, (2, 2)),
    ((2, 8, 7, 7), (16, 8, 1, 1), (2, 2), 0, (1, 1)),
]


@pytest.mark.parametrize("x_shape,w_shape,stride,padding,dilation", CONVS)
def test_conv2d_matches_cpu(rand64, x_shape, w_shape, stride, padding, dilation):
    if _conv_verdict():
        pytest.skip(_conv_verdict())
    c, g = families("conv")
    plan = c.conv2d_plan((None,) + x_shape[1:], w_shape, stride, padding, dilation)
    x, w, b = rand64(*x_shape), rand64(*w_shape), rand64(w_shape[0])
    y = c.conv2d_fprop(plan, x, w, b)
    gy, gw0 = rand64(*y.shape), rand64(*w_shape)
    before = dict(cudnn.calls)
    f64(g.conv2d_fprop(plan, d(x), d(w), d(b)), y)
    f64(g.conv2d_fprop(plan, d(x), d(w)), c.conv2d_fprop(plan, x, w))
    f64(g.conv2d_bias_relu_fprop(plan, d(x), d(w), d(b)), np.maximum(y, 0))
    f64(g.conv2d_dgrad(plan, d(gy), d(w)), c.conv2d_dgrad(plan, gy, w))
    for accumulate in (True, False):
        want, gw = gw0.copy(), d(gw0)
        c.conv2d_wgrad(plan, x, gy, want, accumulate=accumulate)
        g.conv2d_wgrad(plan, d(x), d(gy), gw, accumulate=accumulate)
        f64(gw, want)
    moved = {op: cudnn.calls[op] - before.get(op, 0) for op in ("conv_fprop", "conv_bias_relu_fprop", "conv_dgrad",
                                                                  "conv_wgrad")}
    assert moved == {"conv_fprop": 3, "conv_bias_relu_fprop": 0, "conv_dgrad": 1, "conv_wgrad": 2}   # cuDNN ran


def test_dense_matches_cpu(rand64):
    c, g = families("dense")
    x, w, b, gy, gw0 = rand64(7, 5), rand64(4, 5), rand64(4), rand64(7, 4), rand64(4, 5)
    f64(g.dense_fprop(d(x), d(w), d(b)), c.dense_fprop(x, w, b))
    f64(g.dense_fprop(d(x), d(w)), c.dense_fprop(x, w))
    f64(g.dense_dgrad(d(gy), d(w)), c.dense_dgrad(gy, w))
    for accumulate in (True, False):
        gw, want = d(gw0), gw0.copy()
        g.dense_wgrad(d(x), d(gy), gw, accumulate=accumulate)
        c.dense_wgrad(x, gy, want, accumulate=accumulate)
        f64(gw, want)
        for shape in ((7, 4), (2, 4, 3, 3), (300, 4)):
            gyb, gb0 = rand64(*shape), rand64(4)
            gb, want = d(gb0), gb0.copy()
            g.bias_grad(d(gyb), gb, accumulate=accumulate)
            c.bias_grad(gyb, want, accumulate=accumulate)
            f64(gb, want)


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (8, 16, 4, 4), (32, 10, 1, 1), (4, 16, 48, 48)])
def test_batchnorm_matches_cpu_on_the_kernels(rand64, shape, relu):
    """Every size on the RawKernels, (4, 16, 48, 48) included (9216 values a channel: cuDNN's in float32)."""
    c, g = families("norm")
    C = shape[1]
    x = 2 * rand64(*shape) + 0.5
    gamma, beta, rm, rv = rand64(C), rand64(C), 0.1 * rand64(C), np.abs(rand64(C)) + 0.5
    crm, crv, grm, grv = rm.copy(), rv.copy(), d(rm), d(rv)
    before = dict(cudnn.calls)
    y, mean, invstd = c.bn_fprop_train(x, gamma, beta, crm, crv, 0.1, 1e-5, relu=relu)
    gyo, gmean, ginv = g.bn_fprop_train(d(x), d(gamma), d(beta), grm, grv, 0.1, 1e-5, relu=relu)
    for got, want in ((gyo, y), (gmean, mean), (ginv, invstd), (grm, crm), (grv, crv)):
        f64(got, want)
    f64(g.bn_fprop_infer(d(x), d(gamma), d(beta), grm, grv, 1e-5, relu=relu),
        c.bn_fprop_infer(x, gamma, beta, crm, crv, 1e-5, relu=relu))
    gy, gg0, gb0 = rand64(*shape), rand64(C), rand64(C)
    for accumulate in (True, False):
        gg, gb, cgg, cgb = d(gg0), d(gb0), gg0.copy(), gb0.copy()
        kw = dict(relu=relu, accumulate=accumulate)
        want = c.bn_bprop(x, gy, gamma, mean, invstd, cgg, cgb, y=y, **kw)
        f64(g.bn_bprop(d(x), d(gy), d(gamma), gmean, ginv, gg, gb, y=gyo, **kw), want)
        f64(gg, cgg)
        f64(gb, cgb)
    assert cudnn.calls["bn_fprop_train"] == before.get("bn_fprop_train", 0)
    assert cudnn.calls["bn_bprop"] == before.get("bn_bprop", 0)


@pytest.mark.parametrize("x_shape,ksize,stride,padding", [((2, 3, 8, 8), 2, 2, 0), ((2, 3, 9, 9), 3, 2, 1),
                                                          ((2, 2, 8, 9), (2, 3), (1, 2), (1, 1))])
def test_pooling_matches_cpu(rand64, x_shape, ksize, stride, padding):
    c, g = families("pool")
    plan = c.pool2d_plan((None,) + x_shape[1:], ksize, stride, padding)
    x = rand64(*x_shape)
    gy = rand64(x_shape[0], x_shape[1], *plan.out_shape[2:])
    y = c.maxpool2d_fprop(plan, x)
    gyo = g.maxpool2d_fprop(plan, d(x))
    f64(gyo, y)
    f64(g.maxpool2d_bprop(plan, d(x), gyo, d(gy)), c.maxpool2d_bprop(plan, x, y, gy))
    f64(g.avgpool2d_fprop(plan, d(x)), c.avgpool2d_fprop(plan, x))
    f64(g.avgpool2d_bprop(plan, d(gy)), c.avgpool2d_bprop(plan, gy))
    gy1 = rand64(x_shape[0], x_shape[1], 1, 1)
    f64(g.global_avgpool_fprop(d(x)), c.global_avgpool_fprop(x))
    f64(g.global_avgpool_bprop(d(gy1), x.shape), c.global_avgpool_bprop(gy1, x.shape))


@pytest.mark.parametrize("name,args", [("relu_fprop", "x"), ("relu_bprop", "y gy")])
# (the other activations' fused kernels: tests/gpu/test_activation_xp.py, against the layers' expressions)
def test_activations_match_cpu(rand64, name, args):
    c, g = families("activation")
    values = {"x": rand64(3, 4, 5), "y": rand64(3, 4, 5), "gy": rand64(3, 4, 5), "a": 0.1}
    host = [values[a] for a in args.split()]
    f64(getattr(g, name)(*[d(v) if isinstance(v, np.ndarray) else v for v in host]), getattr(c, name)(*host))


def test_merge_pad_lrn_match_cpu(rand64):
    cm, gm = families("merge")
    xs = [rand64(2, 3, 4) for _ in range(3)]
    f64(gm.add_fprop([d(x) for x in xs]), cm.add_fprop(xs))
    f64(gm.add_fprop([d(x) for x in xs[:2]], relu=True), cm.add_fprop(xs[:2], relu=True))
    cpd, gpd = families("pad")
    x, pads = rand64(2, 3, 4, 5), (1, 2, 0, 3)
    y = cpd.pad2d_fprop(x, pads, 0.5)
    f64(gpd.pad2d_fprop(d(x), pads, 0.5), y)
    gy = rand64(*y.shape)
    f64(gpd.pad2d_bprop(d(gy), pads), cpd.pad2d_bprop(gy, pads))
    cl, gl = families("lrn")
    x, gy, args = rand64(2, 7, 3, 4), rand64(2, 7, 3, 4), (4, 0.5, 0.75, 2.0)
    y, scale = cl.lrn_fprop(x, *args)
    gyo, gscale = gl.lrn_fprop(d(x), *args)
    f64(gyo, y)
    f64(gscale, scale)
    f64(gl.lrn_bprop(d(x), gyo, gscale, d(gy), *args), cl.lrn_bprop(x, y, scale, gy, *args))


def test_dropout_masks_equal_the_cpus(rand64):
    c, g = families("dropout")
    x, gy = rand64(4, 5, 6, 7), rand64(4, 5, 6, 7)
    grng, crng = CounterRNG(cp, 3), CounterRNG(np, 3)
    y, mask = g.dropout_fprop(d(x), 0.3, grng)
    cy, cmask = c.dropout_fprop(x, 0.3, crng)
    np.testing.assert_array_equal(cp.asnumpy(mask), cmask)
    np.testing.assert_array_equal(cp.asnumpy(y), cy)
    assert mask.dtype == y.dtype == np.float64
    f64(g.dropout_bprop(d(gy), mask), c.dropout_bprop(gy, cmask))


def test_softmax_and_cross_entropy_match_cpu(rand64):
    c, g = families("softmax")
    x, gy = 3 * rand64(37, 10), rand64(37, 10)
    y = c.softmax_fprop(x)
    f64(g.softmax_fprop(d(x)), y)
    f64(g.softmax_bprop(d(y), d(gy)), c.softmax_bprop(y, gy))
    labels = np.random.default_rng(1).integers(0, 10, 37).astype(np.int32)
    labels[::2] = x[::2].argmax(axis=1)
    loss, correct, gz = c.softmax_xent(x, labels)
    gloss, gcorrect, ggz = g.softmax_xent(d(x), d(labels))
    f64(gloss, loss)
    assert int(gcorrect) == int(correct)
    f64(ggz, gz)


@pytest.mark.parametrize("name", ["sgd", "momentum", "nesterov", "adam", "rmsprop"])
def test_optimizers_update_float64_weights_like_their_rules(rand64, name):
    c, g = optim_rules, families("optim")[1]        # the optimizers' rules, the GPU's fused kernels
    p, states = rand64(1000), [np.abs(rand64(1000)) for _ in range(2)]
    dp, dstates = d(p), [d(s) for s in states]
    for t in range(1, 6):
        grad = rand64(1000)
        for mod, pp, ss, gg in ((c, p, states, grad), (g, dp, dstates, d(grad))):
            if name == "sgd":
                mod.sgd_update(pp, gg, 0.1, 0.01)
            elif name in ("momentum", "nesterov"):
                mod.momentum_update(pp, gg, ss[0], 0.1, 0.9, 0.01, name == "nesterov")
            elif name == "adam":
                mod.adam_update(pp, gg, ss[0], ss[1], 1e-2, 0.9, 0.999, 1e-8, 0.01, t)
            else:
                mod.rmsprop_update(pp, gg, ss[0], 1e-2, 0.9, 1e-8, 0.01)
    f64(dp, p)
    for ds, s in zip(dstates, states):
        f64(ds, s)


# -- the table at build ---------------------------------------------------------------------------------
def every_layer(device, seed=0):
    """Every layer family once, with a shortcut and dropout: conv, BN, pool, pad, LRN, add, dense, softmax."""
    x = L.Input((1, 12, 12))
    h = L.ReLU()(L.BatchNorm2D()(L.Conv2D(8, 3, padding=1, bias=False)(x)))
    s = L.Conv2D(8, 1)(h)
    r = L.Tanh()(L.Conv2D(8, 3, stride=2)(L.Pad2D(1)(h)))
    h = L.Add()(L.MaxPool2D(2)(s), r)                                   # (N, 8, 6, 6)
    h = L.LRN(5)(L.AvgPool2D(2)(L.LeakyReLU(0.1)(h)))                    # (N, 8, 3, 3)
    z = L.Dense(10)(L.Dropout(0.25)(L.Sigmoid()(L.Dense(32)(L.Flatten()(h)))))
    g = L.GlobalAvgPool2D()(L.Conv2D(4, 1)(L.ReLU()(x)))                 # (N, 4, 1, 1): a second branch
    return dl.Model(x, L.Softmax()(L.Add()(z, L.Dense(10)(L.Flatten()(g)))), device=device, seed=seed)


def mlp(device, seed=0):
    """Dense layers only: trains in float64 whatever cuDNN offers."""
    x = L.Input((1, 12, 12))
    h = L.Dropout(0.25)(L.ReLU()(L.Dense(32)(L.Flatten()(x))))
    return dl.Model(x, L.Softmax()(L.Dense(10)(L.Tanh()(L.Dense(16)(h)))), device=device, seed=seed)


def test_float64_models_build_on_the_gpu_where_the_table_says():
    dev = dl.get_device("cuda", dtype=F64)
    assert dev.dtype_problem([f for f in KERNEL_FAMILIES if f not in ("direct", "conv")]) is None
    assert dev.dtype_problem(["direct"]) == ("float64 is not supported on the GPU (the direct kernels compute in "
                                             "float32 only); use float32, or --device cpu")
    if _conv_verdict() is None:
        every_layer(dev)
    else:                                            # no double engines: the first conv is refused, by name
        with pytest.raises(DtypeError, match=r"^layer conv2d\S* \(Conv2D\): float64 is not supported on the GPU"):
            every_layer(dev)


def test_a_conv_verdict_refuses_the_layer_by_name(monkeypatch):
    conv = families("conv")[1]
    key = (cp.cuda.runtime.getDevice(), cudnn.deterministic_only())
    monkeypatch.setitem(conv._verdicts, key, "cuDNN 0 builds no float64 convolution on this GPU: test")
    x = L.Input((1, 8, 8))
    with pytest.raises(DtypeError) as e:
        dl.Model(x, L.Conv2D(4, 3, name="conv1")(x), device=dl.get_device("cuda", dtype=F64))
    assert str(e.value) == ("layer conv1 (Conv2D): float64 is not supported on the GPU (cuDNN 0 builds no float64 "
                            "convolution on this GPU: test); use float32, or --device cpu")


def test_a_half_dtype_a_family_lacks_is_refused_at_build_naming_the_layer():
    """BN computes in float32 and float64 only (a precision policy keeps it in float32)."""
    x = L.Input((3, 8, 8))
    with pytest.raises(DtypeError) as e:
        dl.Model(x, L.BatchNorm2D(name="bn")(x), device=dl.get_device("cuda", dtype="float16"))
    assert str(e.value) == ("layer bn (BatchNorm2D): float16 is not supported on the GPU (the norm kernels compute in "
                            "float32 and float64 only); use --precision fp32, or --device cpu")


# -- inference and training, end to end -------------------------------------------------------------------
@pytest.mark.parametrize("make", [lambda: models.lenet5(dtype=F64, seed=1),
                                  lambda: models.resnet(18, dtype=F64, seed=1)])
def test_float64_inference_runs_layer_steps_in_a_cuda_graph(make):
    if _conv_verdict():
        pytest.skip(_conv_verdict())
    model = make()                                                     # float64 on the CPU
    x = np.random.default_rng(0).random((3, 1, 28, 28))                 # images in [0, 1]
    want = inference.compile(model, device="cpu", dtype=F64).predict(x)
    m = inference.compile(model, device="cuda", dtype=F64)
    assert m.chain is None and not {"conv_pool", "mlp", "add_relu"} & {st.kind for st in m.steps}
    got = m.predict(x)
    assert m.cuda_graphs and m._entries[3][1] is not None             # (bufs, captured call) at N = 3
    assert got.dtype == np.float64
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-10, atol=1e-12 * np.abs(want).max())


def _train(net, device, make_opt, graph, steps=4):
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (128, 12, 12), dtype=np.uint8), rng.integers(0, 10, 128).astype(np.uint8)
    model = net(dl.get_device(device, dtype=F64, seed=0))
    trainer = dl.Trainer(model, make_opt(), seed=0, graph=graph, progress=False, log=lambda s: None)
    result = trainer.fit((images, labels), steps=steps, batch_size=32, monitor=steps)
    return model.get_weights(), result, trainer


@pytest.mark.parametrize("make_opt", [lambda: optim.Adam(1e-3),
                                      lambda: optim.Momentum(0.05, nesterov=True, weight_decay=1e-4)])
@pytest.mark.parametrize("graph", [True, False])
@pytest.mark.parametrize("net", [mlp, every_layer])
def test_float64_training_matches_the_cpu(net, make_opt, graph):
    """A few float64 steps on the GPU, captured or eager, against the CPU: an MLP, and every layer family."""
    if net is every_layer and _conv_verdict():
        pytest.skip(_conv_verdict())
    w_cpu, r_cpu, _ = _train(net, "cpu", make_opt, graph=False)
    w_gpu, r_gpu, trainer = _train(net, "cuda", make_opt, graph=graph)
    assert bool(trainer._step._captured) == graph
    for k, want in w_cpu.items():
        assert w_gpu[k].dtype == np.float64
        np.testing.assert_allclose(w_gpu[k], want, rtol=1e-10, atol=1e-12 * max(1.0, np.abs(want).max()), err_msg=k)
    assert r_gpu[0] == pytest.approx(r_cpu[0], rel=1e-10) and r_gpu[1] == r_cpu[1]
