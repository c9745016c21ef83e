"""Label smoothing in the fused softmax cross-entropy: the loss against its definition, the
gradient against central differences in float64."""
import numpy as np
import pytest
from tests.helpers.gradcheck import numeric_grad, rel_error

from minidl import losses
from minidl.kernels.cpu import softmax as ksoftmax

rng = np.random.default_rng(3)


def _reference(z, labels, eps):
    """-sum_k q_k log p_k per row, q = (1 - eps) onehot + eps / K, written out."""
    N, K = z.shape
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    q = (1 - eps) * np.eye(K)[labels] + eps / K
    return -(q * logp).sum(axis=1)


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_smoothed_loss_matches_the_definition(eps):
    z, labels = rng.standard_normal((7, 5)) * 3, rng.integers(0, 5, 7)
    loss_sum, correct, gz = ksoftmax.softmax_xent(z, labels, smoothing=eps)
    assert float(loss_sum) == pytest.approx(_reference(z, labels, eps).sum(), rel=1e-12)
    assert int(correct) == np.sum(z.argmax(1) == labels)       # accuracy ignores the smoothing
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    q = (1 - eps) * np.eye(5)[labels] + eps / 5
    np.testing.assert_allclose(gz, (p - q) / 7, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("eps", [0.1, 0.25])
def test_smoothed_gradient_matches_central_differences(eps):
    z, labels = rng.standard_normal((4, 6)) * 2, rng.integers(0, 6, 4)
    _, _, gz = ksoftmax.softmax_xent(z.copy(), labels, smoothing=eps)
    num = numeric_grad(lambda: float(ksoftmax.softmax_xent(z, labels, smoothing=eps)[0]) / len(z), z)
    assert rel_error(gz, num) < 1e-7


def test_smoothed_loss_is_stable_for_far_apart_logits():
    z = np.array([[0.0, 1000.0, -1000.0]], np.float32)
    loss_sum, _, gz = ksoftmax.softmax_xent(z, np.array([0]), smoothing=0.3)
    # -(0.8 log p0 + 0.1 log p1 + 0.1 log p2) with log p0 = -1000, log p1 = 0, log p2 = -2000
    assert float(loss_sum) == pytest.approx(0.8 * 1000 + 0.1 * 2000, rel=1e-6)
    assert np.all(np.isfinite(gz))


def test_loss_rejects_smoothing_outside_0_1():
    z, labels = np.zeros((2, 3)), np.array([0, 1])
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="label smoothing must be in"):
            losses.softmax_cross_entropy(z, labels, smoothing=bad)
