"""The loss is a parameter (minidl.losses): softmax cross-entropy unless told, label_smoothing its
shorthand, and a loss the user writes (a mean squared error on one-hot targets, the same cross-entropy
in NumPy) trains and is what evaluate reports. Trainer's options after model and optimizer are keywords."""
import numpy as np
import pytest
from tests.conftest import mnist_lookalike

import minidl as dl
from minidl import layers as L, losses, optim


class MeanSquaredError(losses.Loss):
    """sum over rows of mean_k (z_k - onehot_k)²;  d(batch mean)/dz = 2 (z - onehot) / (N K)."""

    def value_and_grad(self, logits, labels, gz):
        N, K = logits.shape
        diff = logits - np.eye(K, dtype=logits.dtype)[labels]
        np.multiply(diff, 2.0 / (N * K), out=gz)
        return np.asarray((diff * diff).mean(axis=1).sum())


class CrossEntropy(losses.Loss):
    """-log softmax(z)_label written out;  d(batch mean)/dz = (softmax(z) - onehot) / N."""

    def value_and_grad(self, logits, labels, gz):
        rows = np.arange(len(labels))
        shifted = logits - logits.max(axis=1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        np.exp(logp, out=gz)
        gz[rows, labels] -= 1
        gz /= len(labels)
        return np.asarray(-logp[rows, labels].sum())


def trainer(seed=0, **kw):
    model = dl.Sequential([L.Flatten(), L.Dense(32), L.ReLU(), L.Dense(10)], (1, 28, 28), seed=seed)
    return dl.Trainer(model, optim.SGD(lr=0.1), device="cpu", progress=False, log=lambda s: None, **kw)


def test_a_user_written_mean_squared_error_trains_and_is_what_evaluate_reports():
    images, labels = mnist_lookalike(512)
    t = trainer(loss=MeanSquaredError())
    first = t.fit((images, labels), steps=8, batch_size=32, monitor=8)
    last = t.fit((images, labels), steps=120, batch_size=32, monitor=40)
    assert last.loss < first.loss / 2 and last.accuracy > 0.5
    score = t.evaluate((images, labels))
    x = t.model.prepare_input(images[:, None] / np.float32(255))   # as the Loader feeds a net without Normalize
    z = t.model.forward(x)                        # no Softmax: the model's output is the logits
    want = ((z - np.eye(10, dtype=z.dtype)[labels]) ** 2).mean(axis=1).mean()
    assert score.loss == pytest.approx(float(want), rel=1e-5)


def test_the_users_cross_entropy_trains_as_the_default_does():
    images, labels = mnist_lookalike(256)
    mine, default = trainer(loss=CrossEntropy()), trainer()
    scores = [t.fit((images, labels), steps=16, batch_size=32, monitor=8) for t in (mine, default)]
    np.testing.assert_allclose(mine.model.flat, default.model.flat, rtol=1e-4, atol=1e-6)
    assert scores[0].loss == pytest.approx(scores[1].loss, rel=1e-5) and scores[0].accuracy == scores[1].accuracy
    assert mine.evaluate((images, labels)).loss == pytest.approx(default.evaluate((images, labels)).loss, rel=1e-5)


def test_label_smoothing_is_the_default_losss_shorthand_and_evaluation_reports_the_plain_loss():
    images, labels = mnist_lookalike(256)
    short, spelled, plain = trainer(label_smoothing=0.1), trainer(loss=losses.SoftmaxCrossEntropy(0.1)), trainer()
    for t in (short, spelled):
        t.fit((images, labels), steps=8, batch_size=32, monitor=8)
    np.testing.assert_array_equal(short.model.flat, spelled.model.flat)
    plain.model.set_weights(short.model.get_weights())
    assert short.evaluate((images, labels)) == plain.evaluate((images, labels))     # no smoothing in the score
    assert losses.SoftmaxCrossEntropy(0.1).plain().smoothing == 0.0


def test_what_the_loss_parameter_refuses():
    with pytest.raises(ValueError, match="SoftmaxCrossEntropy"):
        trainer(loss=losses.SoftmaxCrossEntropy(0.1), label_smoothing=0.1)       # one place for the smoothing
    with pytest.raises(ValueError, match=r"label smoothing must be in \[0, 1\)"):
        losses.SoftmaxCrossEntropy(1.0)
    z, labels = np.zeros((4, 3), np.float32), np.array([0, 1, 2, 0])
    with pytest.raises(NotImplementedError, match="value_and_grad"):
        losses.Loss()(z, labels, np.empty_like(z))
    with pytest.raises(ValueError, match=r"MeanSquaredError: logits must be \(N, classes\)"):
        MeanSquaredError()(z, labels[:3], np.empty_like(z))


def test_trainers_options_are_keywords():
    model = dl.Sequential([L.Flatten(), L.Dense(10)], (1, 8, 8))
    with pytest.raises(TypeError):
        dl.Trainer(model, optim.SGD(lr=0.1), "cpu")          # once the device, now refused: name it
    t = dl.Trainer(model, optim.SGD(lr=0.1), device="cpu", progress=False)
    assert isinstance(t._step.loss, losses.SoftmaxCrossEntropy) and t._step.loss.smoothing == 0.0
