"""Issue 38.5 and 38.7 (and 39.3's hint): the Python API's silent and late failures, each now supported
or refused with one line naming it: two Models of the same nodes, model.to under a Trainer, a user's class
named like minidl's, a negative BatchNorm variance, evaluate(steps=0), clashing layer names, pickle and
deepcopy, and a user's layer that breaks the layer contract."""
import copy
import gc
import pickle

import numpy as np
import pytest

import minidl as dl
from minidl import layers as L
from minidl import models, optim
from minidl import checkpoint as ckpt
from minidl.layers import registry


def quiet(model, opt=None):
    return dl.Trainer(model, opt or optim.SGD(0.1), device="cpu", progress=False, log=lambda *a: None)


def blobs(n=256, seed=0):
    """Four classes a linear model learns: the class's quarter of the image is bright."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    x = rng.integers(0, 60, (n, 1, 8, 8)).astype(np.uint8)
    for i, c in enumerate(y):
        r, q = divmod(int(c), 2)
        x[i, 0, 4 * r:4 * r + 4, 4 * q:4 * q + 4] += 150
    return x, y


def dense_net():
    x = L.Input((1, 8, 8))
    return x, L.Dense(4)(L.Flatten()(x))


# -- 1: two Models of the same nodes ------------------------------------------------------------------------
def test_a_second_model_of_the_same_nodes_leaves_the_first_training():
    x, y = dense_net()
    first = dl.Model(x, y)
    before = first.get_weights()
    second = dl.Model(x, y)
    assert second.layers[-1] is not first.layers[-1]             # a copy of the layer, its own arena
    for k, a in second.get_weights().items():                     # ...starting from the first's weights
        np.testing.assert_array_equal(a, before[k])
    trainer = quiet(first)
    start = trainer.evaluate(blobs()).loss
    trainer.fit(blobs(), steps=40, batch_size=32)
    assert trainer.evaluate(blobs()).loss < 0.5 * start             # the first trains
    assert not np.array_equal(first.get_weights()["dense/w"], before["dense/w"])
    for k, a in second.get_weights().items():                     # the second is untouched
        np.testing.assert_array_equal(a, before[k])
    quiet(second).fit(blobs(), steps=5, batch_size=32)            # and training it leaves the first alone
    after = first.get_weights()
    assert not np.array_equal(second.get_weights()["dense/w"], after["dense/w"])


def test_a_model_of_a_trained_models_inner_nodes_starts_from_its_weights():
    x = L.Input((1, 8, 8))
    h = L.Dense(8, activation="relu")(L.Flatten()(x))
    model = dl.Model(x, L.Dense(4)(h))
    quiet(model).fit(blobs(), steps=10, batch_size=32)
    features = dl.Model(x, h)                                     # Keras's feature extractor
    images = np.random.default_rng(1).random((3, 1, 8, 8)).astype(np.float32)
    w = model.get_weights()
    want = np.maximum(images.reshape(3, -1) @ w["dense/w"].T + w["dense/b"], 0)
    np.testing.assert_allclose(features.forward(images), want, rtol=1e-5, atol=1e-6)


def test_a_layer_of_a_model_let_go_is_taken_over_not_copied():
    x, y = dense_net()
    layer = y.layer
    dl.Model(x, y)
    gc.collect()
    assert dl.Model(x, y).layers[-1] is layer


# -- 2: model.to under a Trainer -------------------------------------------------------------------------------
def test_to_where_the_model_is_changes_nothing_and_training_goes_on(tmp_path):
    model = dl.Model(*dense_net())
    trainer = quiet(model)
    trainer.fit(blobs(), steps=5, batch_size=32)
    flat = model.flat
    assert model.to("cpu") is model and model.flat is flat
    w = model.get_weights()["dense/w"]
    trainer.fit(blobs(), more_steps=5, batch_size=32)
    assert not np.array_equal(model.get_weights()["dense/w"], w)
    trainer.save(tmp_path / "m.npz")
    loaded = ckpt.load_model(tmp_path / "m.npz")
    np.testing.assert_array_equal(loaded.get_weights()["dense/w"], model.get_weights()["dense/w"])


def test_to_another_dtype_under_a_trainer_is_refused_and_free_once_it_is_gone():
    model = dl.Model(*dense_net())
    trainer = quiet(model)
    with pytest.raises(ValueError, match=r"model.to\(cpu, float64\): a Trainer trains this model"):
        model.to("cpu", "float64")
    del trainer
    assert model.to("cpu", "float64").device.dtype == np.float64
    trainer = quiet(model)                    # a new Trainer trains the rebuilt model
    w = model.get_weights()["dense/w"]
    trainer.fit(blobs(), steps=3, batch_size=32)
    assert not np.array_equal(model.get_weights()["dense/w"], w)


# -- 3: the layer-class registry ------------------------------------------------------------------------
class ReLU(L.Layer):
    """A user's layer named like minidl's: y = 3 x (nothing like a ReLU)."""

    def build(self, in_shapes, device):
        return in_shapes[0]

    def forward(self, xs, training):
        return 3 * xs[0]

    def backward(self, gy, need=L.Need()):
        return (3 * gy,)


def test_a_users_class_named_relu_does_not_take_over_loading(tmp_path):
    x = L.Input((1, 8, 8))
    minidls = dl.Model(x, L.ReLU()(L.Dense(4)(L.Flatten()(x))))
    trainer = quiet(minidls)
    trainer.save(tmp_path / "m.npz")
    assert type(ckpt.load_model(tmp_path / "m.npz").layers[-1]) is L.ReLU
    x = L.Input((1, 8, 8))
    mine = dl.Model(x, ReLU()(L.Dense(4)(L.Flatten()(x))))
    quiet(mine).save(tmp_path / "mine.npz")
    assert type(ckpt.load_model(tmp_path / "mine.npz").layers[-1]) is ReLU
    old = minidls.config()                              # a config from before the module was recorded
    for spec in old["layers"]:
        spec.pop("module")
    assert type(dl.Model.from_config(old).layers[-1]) is L.ReLU
    with pytest.raises(ckpt.CheckpointError, match=r"saved from another model: layer \d \(relu\) is ReLU of module "
                                                    r"'minidl\.layers\..*' in it, of '.*test_api_faults' in the model"):
        ckpt.load(tmp_path / "m.npz", mine)            # minidl's ReLU does not load into the user's
    with pytest.raises(ckpt.CheckpointError, match=r"is ReLU of module '.*test_api_faults' in it"):
        ckpt.load(tmp_path / "mine.npz", minidls)


def test_loading_a_layer_class_not_imported_says_which_and_what_to_import(tmp_path, monkeypatch):
    x = L.Input((1, 8, 8))
    quiet(dl.Model(x, ReLU()(L.Flatten()(x)))).save(tmp_path / "mine.npz")
    monkeypatch.delitem(registry._classes, (__name__, "ReLU"))
    with pytest.raises(ckpt.CheckpointError, match=rf"unknown layer class 'ReLU' \(module '{__name__}'\): "
                                                    rf"import {__name__}, the module that defines it"):
        ckpt.load_model(tmp_path / "mine.npz")
    with pytest.raises(ValueError, match=r"unknown layer class 'Nope' \(module '__main__', the script that saved "
                                         r"it\): define it \(or import the module that defines it\)"):
        registry.find("Nope", "__main__")
    with pytest.raises(ValueError, match=r"unknown layer class 'Nope': it is not one of minidl's layers: import"):
        registry.find("Nope")


# -- 4: weights no layer can hold --------------------------------------------------------------------------
def bn_net():
    x = L.Input((1, 8, 8))
    return dl.Model(x, L.Dense(4)(L.Flatten()(L.BatchNorm2D()(L.Conv2D(2, 3)(x)))))


def test_a_negative_batchnorm_variance_is_refused_on_every_path(tmp_path):
    model = bn_net()
    w = model.get_weights()
    w["fbn/running_var"] = np.array([1.0, -0.5], np.float32)
    message = r"layer fbn \(BatchNorm2D\): running_var holds 1 negative value\(s\)"
    with pytest.raises(ValueError, match=message):
        model.set_weights(w)
    with pytest.raises(ValueError, match=message):
        dl.Model.from_config(model.config(), weights=w)
    with pytest.raises(ValueError, match=message):
        model.layer("fbn").set_weights({"running_var": w["fbn/running_var"]})
    model.layer("fbn").running_var.data[...] = w["fbn/running_var"]       # past the checks, then saved
    quiet(model).save(tmp_path / "bad.npz")
    with pytest.raises(ckpt.CheckpointError, match=rf"bad.npz.*{message}"):
        ckpt.load_model(tmp_path / "bad.npz")
    with pytest.raises(ckpt.CheckpointError, match=message):
        ckpt.load(tmp_path / "bad.npz", bn_net())
    np.testing.assert_array_equal(bn_net().get_weights()["fbn/running_var"], [1, 1])    # zero variance is fine
    model.set_weights({"fbn/running_var": np.zeros(2, np.float32)}, strict=False)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_weights_are_refused(bad):
    model = bn_net()
    w = model.get_weights()["conv2d/w"]
    w[0, 0, 0, 0] = bad
    with pytest.raises(ValueError, match=r"conv2d/w holds 1 non-finite value\(s\)"):
        model.set_weights({"conv2d/w": w}, strict=False)
    with pytest.raises(ValueError, match=r"layer conv2d \(Conv2D\): parameter w holds non-finite"):
        model.layer("conv2d").set_weights({"w": w})


# -- 5: evaluate's arguments --------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,what", [({"steps": 0}, "steps"), ({"steps": -1}, "steps"), ({"steps": True}, "steps"),
                                     ({"steps": 2.5}, "steps"), ({"batch_size": 2.5}, "batch_size"),
                                     ({"batch_size": 0}, "batch_size")])
def test_evaluate_arguments_are_checked(kw, what):
    with pytest.raises(ValueError, match=rf"evaluate: {what} must be a positive int, got"):
        quiet(dl.Model(*dense_net())).evaluate(blobs(), **kw)


def test_evaluate_over_some_steps_scores_those_batches():
    trainer = quiet(dl.Model(*dense_net()))
    images, labels = blobs(64)
    assert trainer.evaluate((images, labels), batch_size=16, steps=1) == trainer.evaluate(
        (images[:16], labels[:16]), batch_size=16)


# -- 6: layer names ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("names,match", [
    (("output", None), r"layer output \(Dense\): the name 'output' is reserved"),
    (("input", None), r"layer input \(Dense\): the name 'input' is reserved"),
    (("input_1", None), r"the name 'input_1' is reserved"),
    ((None, "output/x"), r"the name 'output' is reserved"),
    (("d", "d/w"), r"layer names 'd' \(Dense\) and 'd/w' \(Dense\) clash"),
    (("d", "d/x"), r"layer names 'd' \(Dense\) and 'd/x' \(Dense\) clash"),
    (("d/x/y", "d"), r"layer names 'd' \(Dense\) and 'd/x/y' \(Dense\) clash"),
    (("d", "d/"), r"layer names 'd' \(Dense\) and 'd/' \(Dense\) clash"),
    (("d", "d"), r"two layers are named 'd'"),
])
def test_clashing_layer_names_are_refused_when_the_model_is_made(names, match):
    x = L.Input((1, 8, 8))
    y = L.Dense(4, name=names[1])(L.Dense(4, name=names[0])(L.Flatten()(x)))
    with pytest.raises(ValueError, match=match):
        dl.Model(x, y)


def test_names_that_only_look_alike_are_fine_and_a_class_named_output_is_named_apart():
    class Output(ReLU):
        pass
    x = L.Input((1, 8, 8))
    y = Output()(L.Dense(4, name="d_w")(L.Dense(4, name="dw")(L.Dense(4, name="d")(L.Flatten()(x)))))
    assert [layer.name for layer in dl.Model(x, y).layers] == ["flatten", "d", "dw", "d_w", "output_layer"]


# -- 7: pickle and deepcopy ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("twin", [lambda m: pickle.loads(pickle.dumps(m)), copy.deepcopy, copy.copy])
def test_a_model_pickles_and_copies_as_an_independent_model_with_equal_weights(twin):
    model = bn_net()
    quiet(model).fit(blobs(), steps=3, batch_size=32)           # running statistics away from their start
    other = twin(model)
    assert other is not model and other.flat is not model.flat and other.name == model.name
    images = np.random.default_rng(2).random((3, 1, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(other.forward(images), model.forward(images))
    for k, a in model.get_weights().items():
        np.testing.assert_array_equal(other.get_weights()[k], a)
    quiet(other).fit(blobs(), steps=2, batch_size=32)
    assert not np.array_equal(other.get_weights()["conv2d/w"], model.get_weights()["conv2d/w"])


def test_a_model_with_a_users_layer_pickles():
    x = L.Input((1, 8, 8))
    model = dl.Model(x, ReLU()(L.Dense(4)(L.Flatten()(x))))
    other = pickle.loads(pickle.dumps(model))
    assert type(other.layers[-1]) is ReLU
    images = np.ones((2, 1, 8, 8), np.float32)
    np.testing.assert_array_equal(other.forward(images), model.forward(images))


# -- 8: a user's layer that breaks the contract ----------------------------------------------------------------
class Faulty(L.Layer):
    """Returns what `fault` says: a wrong shape, an int dtype, a list; or from backward a bare array,
    (None,), () or a gradient of the wrong shape."""

    def __init__(self, fault, name=None):
        super().__init__(name)
        self.fault = fault

    def build(self, in_shapes, device):
        return in_shapes[0]

    def forward(self, xs, training):
        x = xs[0]
        return {"shape": x[:, :2], "int": x.astype("int32"), "list": [x], "float64": x.astype("float64")}.get(
            self.fault, 2 * x)

    def backward(self, gy, need=L.Need()):
        return {"bare": 2 * gy, "none": (None,), "empty": (), "gshape": (gy[:1],)}.get(self.fault, (2 * gy,))


def faulty_model(fault):
    x = L.Input((1, 8, 8))
    return dl.Model(x, L.Dense(4)(Faulty(fault, name="mine")(L.Dense(6)(L.Flatten()(x)))))


@pytest.mark.parametrize("fault,match", [
    ("shape", r"forward returned shape \(2, 2\), but its build declared \(N, 6\) \(\(2, 6\) for this batch\)"),
    ("int", r"forward returned dtype int32, expected float32"),
    ("float64", r"forward returned dtype float64, expected float32"),
    ("list", r"forward returned list, expected one numpy array of shape \(N, 6\)"),
])
def test_a_users_forward_is_checked_against_its_build(fault, match):
    with pytest.raises(ValueError, match=r"layer mine \(Faulty\): " + match):
        faulty_model(fault).forward(np.ones((2, 1, 8, 8), np.float32))


@pytest.mark.parametrize("fault,match", [
    ("bare", r"backward returned a bare ndarray; it must return a tuple of 1"),
    ("none", r"backward returned None for input 0, whose gradient the graph reads"),
    ("empty", r"backward returned 0 gradient\(s\); it must return a tuple of 1"),
    ("gshape", r"backward's gradient for input 0 is shape \(1, 6\), float32; expected an array of its input's "
              r"shape \((2|32), 6\), float32"),
])
def test_a_users_backward_is_checked_in_the_model_and_in_fit(fault, match):
    model = faulty_model(fault)
    model.forward(np.ones((2, 1, 8, 8), np.float32), training=True)
    with pytest.raises(ValueError, match=r"layer mine \(Faulty\): " + match):
        model.backward(np.ones((2, 4), np.float32))
    with pytest.raises(ValueError, match=r"layer mine \(Faulty\): " + match):
        quiet(faulty_model(fault)).fit(blobs(), steps=1, batch_size=32)


def test_a_users_layer_that_keeps_the_contract_trains():
    model = faulty_model(None)
    trainer = quiet(model)
    start = trainer.evaluate(blobs()).loss
    trainer.fit(blobs(), steps=30, batch_size=32)
    assert trainer.evaluate(blobs()).loss < start


@pytest.mark.parametrize("make", [models.lenet5, models.simplenet,
                                  lambda: models.build_resnet("basic", [1, 1, 1, 1], input_shape=(1, 16, 16))])
def test_minidls_own_layers_keep_the_contract_the_checks_hold_users_to(make, monkeypatch):
    monkeypatch.setattr(dl.Model, "checks_every_layer", True)
    model = make()
    assert all(model._checked)
    shape = model.inputs[0].shape[1:]
    y = model.forward(np.random.default_rng(0).random((2, *shape)).astype(np.float32), training=True)
    model.backward(np.ones_like(y))
    trainer = quiet(model)
    assert all(trainer._step.net._checked)
    images = np.random.default_rng(0).integers(0, 256, (8, *shape), dtype=np.uint8)
    trainer.fit((images, np.arange(8) % 10), steps=1, batch_size=4)


@pytest.mark.parametrize("shape", [None, (), (None, -1), (None, 2.5)])
def test_a_users_build_that_returns_no_shape_is_named(shape):
    class NoShape(ReLU):
        def build(self, in_shapes, device):
            return shape
    x = L.Input((1, 8, 8))
    with pytest.raises(ValueError, match=r"layer noshape \(NoShape\): build returned .*; it must return the output "
                                         r"shape"):
        dl.Model(x, NoShape()(x))


def test_an_unbuilt_layer_copies_and_a_built_one_is_refused_naming_the_model_as_the_way():
    layer = L.Conv2D(3, 3, padding=1, name="c")
    twin = copy.deepcopy(layer)
    assert type(twin) is L.Conv2D and twin.config() == layer.config() and twin.name == "c"
    assert pickle.loads(pickle.dumps(layer)).config() == layer.config()
    x = L.Input((1, 8, 8))
    dl.Model(x, layer(x))
    for how in (copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match=r"layer c \(Conv2D\) is built into a model.*pickle or copy.deepcopy "
                                            r"the model"):
            how(layer)
