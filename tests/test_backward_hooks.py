"""Model.backward as the reverse walk plus hooks after each layer (graph/model.py, graph/liveness.py):
the order they run in, and the same gradients whichever are on."""
import numpy as np

import minidl as dl
from minidl import layers as L


def _net():
    x = L.Input((6,))
    return dl.Model(x, L.Dense(3, name="out")(L.ReLU(name="act")(L.Dense(5, name="hidden")(x))), seed=0)


def _grads(model, **kw):
    rng = np.random.default_rng(0)
    x, gy = rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    model.zero_grad()
    model.forward(x, training=True)
    model.backward(gy, input_grads=False, **kw)
    return model.grads.copy()


def test_ready_hears_each_layer_in_backward_order_after_its_saved_values_are_released():
    model, heard = _net(), []
    model.releases = True
    _grads(model, ready=lambda layer: heard.append((layer.name, layer.saved is None)))
    assert heard == [("out", True), ("act", True), ("hidden", True)]


def test_the_hooks_leave_the_gradients_as_the_plain_walk_does():
    plain = _grads(_net())
    model = _net()
    model.releases = True
    np.testing.assert_array_equal(_grads(model, ready=lambda layer: None), plain)
    np.testing.assert_array_equal(_grads(_net(), accumulate=False), plain)      # Dense overwrites: no zero_grad
