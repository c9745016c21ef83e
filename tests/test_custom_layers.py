"""A user's own layer, as docs/custom-layers.md writes one: its config recorded without a decorator,
the public gradient checker, and its ONNX mapping."""
import numpy as np
import pytest

import minidl as dl
from minidl import layers as L
from minidl.layers.base import record_config
from minidl.testing import GradientError, check_gradients, check_model_gradients


class Scaled(L.Layer):
    """y = k x: a hyper-parameter and no decorator (the issue's k=3.0 that came back 2.0)."""

    def __init__(self, k=2.0, name=None):
        super().__init__(name)
        self.k = k

    def build(self, in_shapes, device):
        return in_shapes[0]

    def forward(self, xs, training):
        return self.k * xs[0]

    def backward(self, gy, need=None):
        return (self.k * gy,)


class Shifted(Scaled):
    """y = k x + c: a subclass records its own arguments, not those of the super().__init__ it calls."""

    def __init__(self, c, k=2.0, **kw):
        super().__init__(k, **kw)
        self.c = c

    def forward(self, xs, training):
        return self.k * xs[0] + self.c


class Nameless(Scaled):
    def __init__(self, k):                     # no `name` argument: the model's name is taken anyway
        super().__init__(k)


class Decorated(Scaled):
    @record_config                             # the decorator older layers wear: still fine, twice too
    @record_config
    def __init__(self, k=2.0, name=None):
        super().__init__(k, name)


def test_a_layers_arguments_are_recorded_without_a_decorator_and_reload(tmp_path):
    assert Scaled(3.0).config() == {"k": 3.0} and Scaled().config() == {"k": 2.0}      # defaults applied
    assert Shifted(1, k=(1, 2), name="s").config() == {"c": 1, "k": [1, 2]}           # tuples as lists
    assert Decorated(5).config() == {"k": 5}
    assert Scaled(np.float32(0.5)).config() == {"k": 0.5} and type(Scaled(np.float32(0.5)).config()["k"]) is float
    n = Nameless(4, name="mine")
    assert (n.name, n.config()) == ("mine", {"k": 4})
    model = dl.Sequential([L.Flatten(), Scaled(3.0, name="scale"), Shifted(0.5, k=4.0)], (2, 2))
    dl.checkpoint.save(tmp_path / "m.npz", model)
    loaded = dl.checkpoint.load_model(tmp_path / "m.npz")
    assert [(type(n.layer).__name__, n.layer.config()) for n in loaded.nodes][1:] == [
        ("Scaled", {"k": 3.0}), ("Shifted", {"c": 0.5, "k": 4.0})]
    x = np.arange(8.0).reshape(2, 2, 2)
    assert np.allclose(loaded.forward(x), 12 * x.reshape(2, 4) + 0.5)
    clone = model.nodes[1].layer.clone()
    assert (type(clone), clone.k, clone.name) == (Scaled, 3.0, "scale")


def test_an_argument_a_config_cannot_hold_is_refused_in_one_line_naming_layer_and_argument():
    with pytest.raises(TypeError, match=r"^layer mine \(Scaled\): hyper-parameter k=.*cannot be recorded") as e:
        Scaled(k=lambda x: x, name="mine")
    assert "\n" not in str(e.value)
    with pytest.raises(TypeError, match="Scaled: got an unexpected keyword argument 'q'"):
        Scaled(q=1)

    class Star(Scaled):
        def __init__(self, *ks, name=None):
            super().__init__(ks[0] if ks else 1.0, name)
    assert Star().config() == {}
    with pytest.raises(TypeError, match=r"\(Star\): takes \*ks"):
        Star(1.0, 2.0)


class Square(L.Layer):
    """y = x² w, with a deliberately wrong input gradient where `wrong`."""

    def __init__(self, wrong=False, name=None):
        super().__init__(name)
        self.wrong = wrong

    def build(self, in_shapes, device):
        self.w = self.param("w", (in_shapes[0][1],), "ones")
        return in_shapes[0]

    def forward(self, xs, training):
        self.saved = xs[0]
        return xs[0] ** 2 * self.w.data

    def backward(self, gy, need=None):
        x = self.saved
        self.w.grad += (gy * x ** 2).sum(axis=0)
        return (gy * (1.0 if self.wrong else 2.0) * x * self.w.data,)


def test_the_public_gradient_checker_passes_a_right_backward_and_names_the_worst_of_a_wrong_one():
    errors = check_gradients(Square(), in_shapes=[(3, 4)])
    assert set(errors) == {"x0", "w"} and max(errors.values()) < 1e-8
    with pytest.raises(GradientError, match=r"layer sq \(Square\): the gradient of x0 differs .* error 0\.[0-9]") as e:
        check_gradients(Square(wrong=True, name="sq"), in_shapes=[(3, 4)])
    assert e.value.errors["x0"] > 0.3 and e.value.errors["sq/w"] < 1e-8
    x = L.Input((4,))
    with pytest.raises(ValueError, match="needs a float64 model"):
        check_model_gradients(dl.Model(x, Square()(x)), [np.ones((2, 4))])


def _with_onnx(builder, ins, out, weights):
    return builder.op("Mul", [ins[0], builder.const(out + "/k", np.array(weights.get("k", 3.0), np.float32))], out)


def test_a_custom_layer_exports_to_onnx_through_its_onnx_method_and_is_named_without_one():
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from minidl.inference.onnx_export import to_onnx
    model = dl.Sequential([L.Flatten(), Scaled(3.0, name="scale")], (2, 2))
    with pytest.raises(ValueError, match=r"layer scale of kind None has no ONNX mapping \(.*onnx\(builder, ins"):
        to_onnx(model)

    class Exported(Scaled):
        def onnx(self, builder, ins, out, weights):
            return _with_onnx(builder, ins, out, {"k": self.k})
    model = dl.Sequential([L.Flatten(), Exported(3.0, name="scale")], (2, 2))
    x = np.random.default_rng(0).standard_normal((5, 2, 2)).astype(np.float32)
    session = ort.InferenceSession(to_onnx(model).SerializeToString(), providers=["CPUExecutionProvider"])
    assert np.allclose(session.run(None, {"input": x})[0], 3 * x.reshape(5, 4))
