"""Training controls in the captured GPU step (docs/training.md): frozen weights, parameter groups,
clipping and AdamW. The update kernels' controlled twins against the optimizers' rules, and whole captured steps
against the CPU run; a weight frozen after the capture stays bit-identical without a new capture."""
import importlib

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl as dl  # noqa: E402
from minidl import optim  # noqa: E402
from tests.helpers import optim_rules  # noqa: E402
from tests.helpers.control_net import data, net  # noqa: E402
from minidl.kernels.contract import Controls  # noqa: E402

gpu = importlib.import_module("minidl.kernels.gpu.optim")
cpu = importlib.import_module("minidl.kernels.cpu.optim")     # sq_norm; the updates: the optimizers' rules

UPDATES = {   # name: (state slots, hyper-parameters after lr)
    "sgd": (0, lambda t: dict(wd=0.01)),
    "momentum": (1, lambda t: dict(mu=0.9, wd=0.01, nesterov=True)),
    "adam": (2, lambda t: dict(b1=0.9, b2=0.999, eps=1e-8, wd=0.01, t=t)),
    "rmsprop": (1, lambda t: dict(rho=0.99, eps=1e-8, wd=0.01)),
}


@pytest.mark.parametrize("decoupled", [False, True])
@pytest.mark.parametrize("name", list(UPDATES))
def test_controlled_updates_match_the_rules_and_leave_frozen_elements_alone(name, decoupled):
    slots, hyper = UPDATES[name]
    rng = np.random.default_rng(0)
    P = 4099
    p0 = rng.standard_normal(P).astype(np.float32)
    lrs = rng.choice([0.0, 1.0, 0.1], P).astype(np.float32)          # a third frozen
    wds = rng.choice([0.0, 0.05], P).astype(np.float32)
    host = [p0.copy()] + [np.abs(rng.standard_normal(P)).astype(np.float32) for _ in range(slots)]
    dev = [cp.asarray(a) for a in host]
    for t in range(1, 5):
        g = (3 * rng.standard_normal(P)).astype(np.float32)
        gmul = 0.5 * min(1.0, 20.0 / (0.5 * float(np.sqrt(np.sum(g.astype(np.float64) ** 2 * (lrs != 0)))) + 1e-6))
        ctl_h = Controls(lrs, wds, np.float64(gmul), 0.4, decoupled)
        norm = gpu.sq_norm(cp.asarray(g), cp.asarray(lrs))
        assert norm.shape == () and float(norm) == pytest.approx(float(cpu.sq_norm(g, lrs)), rel=1e-6)
        gm = cp.multiply(cp.minimum(cp.divide(20.0, cp.add(cp.multiply(cp.sqrt(norm), 0.5), 1e-6)), 1.0), 0.5)
        ctl_d = Controls(cp.asarray(lrs), cp.asarray(wds), gm, 0.4, decoupled)
        getattr(optim_rules, f"{name}_update")(*host[:1], g, *host[1:], 0.01, **hyper(t), ctl=ctl_h)
        getattr(gpu, f"{name}_update")(*dev[:1], cp.asarray(g), *dev[1:], cp.asarray(0.01, np.float64),
                                       **hyper(cp.asarray(float(t), np.float64)), ctl=ctl_d)
    frozen = lrs == 0
    for h, d in zip(host, dev):
        np.testing.assert_allclose(cp.asnumpy(d), h, rtol=1e-4, atol=1e-6)
        assert np.array_equal(cp.asnumpy(d)[frozen], h[frozen])
    assert np.array_equal(cp.asnumpy(dev[0])[frozen], p0[frozen])


def controlled():
    return optim.AdamW(3e-3, weight_decay=0.05, clip_norm=0.5, clip_value=0.02,
                       groups=[{"params": ["fc"], "lr": 1e-3, "weight_decay": 0.0}])


def train(device, graph, steps=10, freeze=("conv2d",)):
    model = net(dl.get_device(device, seed=0))
    model.freeze(*freeze)
    trainer = dl.Trainer(model, controlled(), seed=0, graph=graph, progress=False, log=lambda s: None)
    before = model.get_weights()
    result = trainer.fit(data(), steps=steps, batch_size=32, monitor=steps, validation_data=data(64, seed=1),
                         validation_freq=5)
    return before, model.get_weights(), result, trainer


def test_captured_adamw_groups_clipping_and_freezing_match_the_cpu(no_tf32):
    b_cpu, w_cpu, r_cpu, _ = train("cpu", graph=False)
    b_gpu, w_gpu, r_gpu, trainer = train("cuda", graph=True)
    assert trainer._step._captured, "the captured path did not run"
    assert trainer.optimizer.ctl is not None
    for k in w_cpu:
        np.testing.assert_allclose(w_gpu[k], w_cpu[k], rtol=2e-3, atol=2e-4, err_msg=k)
    assert np.array_equal(w_gpu["conv2d/w"], b_gpu["conv2d/w"])            # frozen: bit-identical
    assert not np.array_equal(w_gpu["fc/w"], b_gpu["fc/w"])
    assert r_gpu.history["step"] == [5, 10]
    np.testing.assert_allclose(r_gpu.history["val_loss"], r_cpu.history["val_loss"], rtol=2e-3)


def test_a_weight_frozen_after_the_capture_stays_without_a_new_capture(no_tf32):
    model = net(dl.get_device("cuda", seed=0))
    model.freeze("head/b")                    # the controlled kernels from the start
    trainer = dl.Trainer(model, optim.Adam(1e-2), graph=True, progress=False, log=lambda s: None)
    d = data()                                # one loader: one captured step
    trainer.fit(d, steps=3, batch_size=32, monitor=3)
    (captured,) = trainer._step._captured.values()
    model.layer("fc").trainable = False       # after the capture: read from the device arrays
    frozen, state = model.get_weights()["fc/w"], {k: cp.asnumpy(s).copy() for k, s in trainer.optimizer.state.items()}
    trainer.fit(d, more_steps=3, batch_size=32, monitor=3)
    (again,) = trainer._step._captured.values()
    assert again is captured                  # the same graph replayed
    assert np.array_equal(model.get_weights()["fc/w"], frozen)
    fc = model.params["fc/w"]
    for k, s in trainer.optimizer.state.items():
        sl = slice(fc.offset, fc.offset + fc.size)
        assert np.array_equal(cp.asnumpy(s)[sl], state[k][sl]), k
    model.unfreeze("fc")
    trainer.fit(d, more_steps=2, batch_size=32, monitor=2)
    assert not np.array_equal(model.get_weights()["fc/w"], frozen)


def test_the_first_freeze_after_a_plain_capture_captures_the_controlled_step(no_tf32):
    model = net(dl.get_device("cuda", seed=0))
    trainer = dl.Trainer(model, optim.SGD(0.05, momentum=0.9), graph=True, progress=False, log=lambda s: None)
    trainer.fit(data(), steps=2, batch_size=32, monitor=2)
    assert trainer.optimizer.ctl is None      # the plain kernels, as before any control
    model.freeze("conv2d")
    w = model.get_weights()["conv2d/w"]
    trainer.fit(data(), more_steps=3, batch_size=32, monitor=3)
    assert trainer.optimizer.ctl is not None and trainer._step._captured
    assert np.array_equal(model.get_weights()["conv2d/w"], w)
