"""Issue 38.5/38.7 on the GPU: a user's layer is held to the contract on CuPy arrays, in the eager and the
captured step and under bf16; a GPU model pickles and copies; model.to and two models of one graph."""
import copy
import pickle

import numpy as np
import pytest

pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl as dl
from minidl import layers as L
from minidl import optim


class Twice(L.Layer):
    """y = 2 x, or with `fault` a result that breaks the contract."""

    def __init__(self, fault=None, name=None):
        super().__init__(name)
        self.fault = fault

    def build(self, in_shapes, device):
        return in_shapes[0]

    def forward(self, xs, training):
        x = xs[0]
        return x.astype("int32") if self.fault == "int" else x.get() if self.fault == "host" else 2 * x

    def backward(self, gy, need=L.Need()):
        return () if self.fault == "empty" else (2 * gy,)


def net(fault=None, device="cuda"):
    x = L.Input((1, 8, 8))
    return dl.Model(x, L.Dense(4)(Twice(fault, name="mine")(L.Dense(6)(L.Flatten()(x)))), device=device)


def data(n=128):
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (n, 1, 8, 8), dtype=np.uint8), rng.integers(0, 4, n)


@pytest.mark.parametrize("fault,match", [("int", "forward returned dtype int32"),
                                         ("host", "forward returned ndarray, expected one cupy array"),
                                         ("empty", r"backward returned 0 gradient\(s\)")])
@pytest.mark.parametrize("graph", [False, True])
def test_a_users_layer_is_checked_on_the_gpu(fault, match, graph):
    trainer = dl.Trainer(net(fault), optim.SGD(0.1), device="cuda", progress=False, graph=graph)
    with pytest.raises(ValueError, match=r"layer mine \(Twice\): " + match):
        trainer.fit(data(), steps=2, batch_size=32)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("graph", [False, True])
def test_a_users_layer_that_keeps_the_contract_trains_on_the_gpu(precision, graph):
    model = net()
    trainer = dl.Trainer(model, optim.SGD(0.1), device="cuda", progress=False, graph=graph, precision=precision)
    w = model.get_weights()["dense/w"]
    trainer.fit(data(), steps=4, batch_size=32)
    assert not np.array_equal(model.get_weights()["dense/w"], w)


@pytest.mark.parametrize("twin", [lambda m: pickle.loads(pickle.dumps(m)), copy.deepcopy])
def test_a_gpu_model_pickles_and_copies(twin):
    model = net()
    other = twin(model)
    assert other.device.name == "cuda" and other.flat is not model.flat
    x = np.random.default_rng(1).random((3, 1, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(other.forward(x).get(), model.forward(x).get())


def test_to_where_the_model_is_and_moving_under_a_trainer():
    model = net(device="cpu")
    trainer = dl.Trainer(model, optim.SGD(0.1), device="cuda", progress=False)     # the trainer moves it
    assert model.device.name == "cuda" and model.to("cuda") is model
    with pytest.raises(ValueError, match=r"a Trainer trains this model"):
        model.to("cpu")
    trainer.fit(data(), steps=2, batch_size=32)
    second = dl.Model(model.inputs[0], model.outputs[0], device="cuda")           # the same nodes: a copy
    np.testing.assert_array_equal(second.get_weights()["dense/w"], model.get_weights()["dense/w"])
    assert second.flat is not model.flat
