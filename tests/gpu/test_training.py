"""Whole training steps on the GPU against the CPU, captured against eager, and reproducibility."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl as dl  # noqa: E402
from minidl import layers as L  # noqa: E402
from minidl import models, optim  # noqa: E402


def branchy_net(device, seed=0):
    """Every trainable layer family once, with a shortcut: conv, BN, pool, pad, LRN, add, dense."""
    x = L.Input((1, 12, 12))
    h = L.ReLU()(L.BatchNorm2D()(L.Conv2D(16, 3, padding=1, bias=False)(x)))
    s = L.Conv2D(16, 1)(h)
    r = L.Tanh()(L.Conv2D(16, 3, stride=2)(L.Pad2D(1)(h)))
    h = L.Add()(L.MaxPool2D(2)(s), r)                                 # (N, 16, 6, 6)
    h = L.LRN(5)(L.AvgPool2D(2)(L.LeakyReLU(0.1)(h)))                  # (N, 16, 3, 3)
    h = L.Sigmoid()(L.Dense(32)(L.Flatten()(h)))
    y = L.Softmax()(L.Dense(10)(h))
    return dl.Model(x, y, device=device, seed=seed)


def data(n=256, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 12, 12), dtype=np.uint8), rng.integers(0, 10, n).astype(np.uint8)


def train(device, opt, graph, steps=12, seed=0):
    model = branchy_net(dl.get_device(device, seed=seed), seed)
    trainer = dl.Trainer(model, opt, seed=seed, graph=graph, progress=False, log=lambda s: None)
    result = trainer.fit(data(), steps=steps, batch_size=32, monitor=steps)
    return model.get_weights(), result, trainer


def test_one_step_gradients_match_cpu(no_tf32):
    """Forward and backward of the branchy net: every layer's output and every gradient."""
    images, labels = data(32)
    grads, outs = {}, {}
    for name in ("cpu", "cuda"):
        dev = dl.get_device(name)
        model = branchy_net(dev)
        loader = dl.data.Loader(images, labels, 32, dev, shuffle=False)
        x, y = loader.batch(0, 0)
        trainer = dl.Trainer(model, optim.SGD(0.0), graph=False, progress=False, log=lambda s: None)
        net = trainer._step.net             # the training lowering: fused outputs are post-ReLU
        net.releases = False                # keep every layer's output to compare
        trainer._step.forward_backward(x, y)
        outs[name] = {n.layer.name: dev.to_host(net._values[id(n)]) for n in net.nodes}
        grads[name] = model.get_grads()
    for k, want in outs["cpu"].items():
        scale = np.abs(want).max() + 1e-12
        assert np.abs(outs["cuda"][k] - want).max() / scale < 1e-4, f"forward {k}"
    for k, want in grads["cpu"].items():
        scale = np.abs(want).max() + 1e-12
        err = np.abs(grads["cuda"][k] - want).max() / scale
        assert err < 1e-3, f"gradient {k}: max error {err:.2e} of its largest value"


@pytest.mark.parametrize("make_opt", [lambda: optim.Adam(1e-3),
                                      lambda: optim.Momentum(0.05, nesterov=True, weight_decay=1e-4),
                                      lambda: optim.RMSprop(1e-3, schedule=optim.schedules.inverse_time(0.1))])
def test_gpu_training_matches_cpu(no_tf32, make_opt):
    """12 steps of a graph with branches: GPU (captured) weights within float32 drift of the CPU's."""
    w_cpu, r_cpu, _ = train("cpu", make_opt(), graph=False)
    w_gpu, r_gpu, _ = train("cuda", make_opt(), graph=True)
    for k in w_cpu:
        np.testing.assert_allclose(w_gpu[k], w_cpu[k], rtol=2e-3, atol=2e-4, err_msg=k)
    assert r_gpu[0] == pytest.approx(r_cpu[0], rel=1e-3)


def test_captured_step_equals_eager_step():
    w_eager, r_eager, _ = train("cuda", optim.Adam(1e-3), graph=False)
    w_graph, r_graph, trainer = train("cuda", optim.Adam(1e-3), graph=True)
    assert trainer._step._captured, "the captured path did not run"
    for k in w_eager:
        np.testing.assert_allclose(w_graph[k], w_eager[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert r_graph[1] == r_eager[1]


def test_two_seeded_runs_are_identical():
    a, ra, _ = train("cuda", optim.Adam(1e-3), graph=True)
    b, rb, _ = train("cuda", optim.Adam(1e-3), graph=True)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert ra == rb


def test_eager_step_allocates_nothing_after_the_first():
    model = models.lenet5(device=dl.get_device("cuda"))
    trainer = dl.Trainer(model, optim.Adam(1e-3), graph=False, progress=False, log=lambda s: None)
    images = np.random.default_rng(0).integers(0, 256, (256, 28, 28), dtype=np.uint8)
    labels = np.random.default_rng(1).integers(0, 10, 256).astype(np.uint8)
    trainer.fit((images, labels), steps=2, batch_size=32, monitor=1000)
    pool = cp.get_default_memory_pool()
    before = pool.total_bytes()
    trainer.fit((images, labels), more_steps=5, batch_size=32, monitor=1000)
    assert pool.total_bytes() == before


def test_resnet18_step_runs_captured_and_learns_on_mnist():
    train_set = dl.data.mnist("train")
    subset = (train_set[0][:3200], train_set[1][:3200])
    model = models.resnet(18, device=dl.get_device("cuda"))
    trainer = dl.Trainer(model, optim.Adam(1e-3), progress=False, log=lambda s: None)
    first = trainer.fit(subset, steps=20, batch_size=32, monitor=20)
    last = trainer.fit(subset, more_steps=80, batch_size=32, monitor=80)
    assert trainer._step._captured and last.loss < first.loss and last.accuracy > 0.80
