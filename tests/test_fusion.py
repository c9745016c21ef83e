"""Model.fuse (ReLU applied by the BN or Add before it) and overwrite-mode gradients change the
number of kernels, never the numbers."""
import numpy as np

import minidl as dl
from minidl import layers as L
from minidl import optim


def net(seed=0):
    x = L.Input((2, 6, 6))
    h = L.ReLU()(L.BatchNorm2D()(L.Conv2D(4, 3, padding=1, bias=False)(x)))
    r = L.BatchNorm2D()(L.Conv2D(4, 3, padding=1)(h))
    h = L.ReLU()(L.Add()(h, r))
    h = L.ReLU()(L.Conv2D(4, 1)(h))                  # a ReLU after a conv: not fused
    y = L.Softmax()(L.Dense(3)(L.Flatten()(h)))
    model = dl.Model(x, y, dtype="float64", seed=seed)
    rng = np.random.default_rng(seed)
    for p in model.params.values():
        p.data[...] += rng.uniform(-0.3, 0.3, p.shape)
    return model


def run(model, x, gy, training):
    y = model.forward(x, training=training)
    model.zero_grad()
    gx = model.backward(gy)
    return y, gx, model.get_grads()


def test_fuse_marks_only_sole_consumer_relus():
    model = net()
    assert model.fuse() == 2
    fused = [l.name for l in model.layers if getattr(l, "fuse_relu", False)]
    assert fused == ["fbn", "add_1"]
    assert [l.name for l in model.layers if getattr(l, "identity", False)] == ["relu", "relu_1"]


def test_fused_model_equals_unfused_in_training_and_eval():
    x = np.random.default_rng(1).standard_normal((5, 2, 6, 6))
    gy = np.random.default_rng(2).standard_normal((5, 3))
    for training in (True, False):
        plain, fused = net(), net()
        fused.fuse()
        for a, b in zip(run(plain, x, gy, training), run(fused, x, gy, training)):
            if isinstance(a, dict):
                for k in a:
                    np.testing.assert_allclose(b[k], a[k], rtol=1e-12, atol=1e-14, err_msg=k)
            else:
                np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)
        np.testing.assert_array_equal(fused.state_flat, plain.state_flat)   # running statistics


def test_overwrite_mode_equals_zero_grad_then_accumulate():
    x = np.random.default_rng(1).standard_normal((5, 2, 6, 6))
    gy = np.random.default_rng(2).standard_normal((5, 3))
    model = net()
    assert model.can_overwrite
    _, _, want = run(model, x, gy, True)
    model.grads[...] = 123.0                          # stale values must not survive
    model.forward(x, training=True)
    model.backward(gy, accumulate=False)
    for k, g in model.get_grads().items():
        np.testing.assert_allclose(g, want[k], rtol=1e-12, err_msg=k)


def test_trainer_overwrites_gradients_and_trains_like_the_reference_loop():
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (64, 6, 6), dtype=np.uint8), rng.integers(0, 3, 64).astype(np.uint8)
    images = np.repeat(images[:, None], 2, axis=1)    # (N, 2, 6, 6)
    a, b = net(), net()
    trainer = dl.Trainer(a, optim.Momentum(0.05), progress=False, log=lambda s: None)
    assert trainer.overwrite
    trainer.fit((images, labels), steps=6, batch_size=16, monitor=100)
    ref = dl.Trainer(b, optim.Momentum(0.05), progress=False, log=lambda s: None)
    ref.overwrite = False
    ref.fit((images, labels), steps=6, batch_size=16, monitor=100)
    for k, w in b.get_weights().items():
        np.testing.assert_allclose(a.get_weights()[k], w, rtol=1e-12, atol=1e-15, err_msg=k)
