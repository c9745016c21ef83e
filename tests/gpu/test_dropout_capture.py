"""Dropout inside the captured training step: new masks at every replay, the same run as eager and
as the CPU's masks, and an exact resume on the GPU."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl as dl  # noqa: E402
from minidl import layers as L, optim  # noqa: E402


def net(device, seed=0):
    x = L.Input((1, 12, 12))
    h = L.Dropout(0.3)(L.ReLU()(L.Dense(64)(L.Flatten()(x))))
    return dl.Model(x, L.Dense(10)(h), device=device, seed=seed)


def data(n=256, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 12, 12), dtype=np.uint8), rng.integers(0, 10, n).astype(np.uint8)


def run(graph, steps, seed=0, resume_from=None, save_to=None):
    model = net(dl.get_device("cuda", seed=seed), seed)
    trainer = dl.Trainer(model, optim.SGD(0.05), seed=seed, graph=graph, progress=False, log=lambda s: None)
    if resume_from:
        trainer.resume(resume_from)
    trainer.fit(data(), more_steps=steps, batch_size=32, monitor=steps)
    if save_to:
        trainer.save(save_to)
    return trainer


def test_dropout_model_trains_captured_like_eager():
    captured, eager = run(True, 12), run(False, 12)
    assert captured.graph and captured._step._captured, "the dropout model did not run captured"
    assert int(captured.device.rng.offset) == int(eager.device.rng.offset) == 12 * 32 * 64
    for k, w in eager.model.get_weights().items():
        np.testing.assert_allclose(captured.model.get_weights()[k], w, rtol=1e-5, atol=1e-6, err_msg=k)


def test_a_resumed_dropout_run_on_the_gpu_is_the_straight_run(tmp_path):
    straight = run(True, 12)
    run(True, 5, save_to=str(tmp_path / "c.npz"))
    resumed = run(True, 7, resume_from=str(tmp_path / "c.npz"))
    for k, w in straight.model.get_weights().items():
        np.testing.assert_array_equal(resumed.model.get_weights()[k], w, err_msg=k)
