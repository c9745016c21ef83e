"""The public Python API as a README shows it: build, set weights, run, differentiate, describe."""
import json

import numpy as np
import pytest

import minidl as dl
from minidl import layers as L, models


def design_net(shape=(1, 12, 12), **kw):
    """DESIGN.md's example, on small images."""
    x = L.Input(shape)
    h = L.ReLU()(L.BatchNorm2D()(L.Conv2D(4, 3, padding=1)(x)))
    h = L.MaxPool2D(2)(h)
    y = L.Softmax()(L.Dense(10)(L.Flatten()(h)))
    return dl.Model(x, y, **kw)


def images(n=4, shape=(1, 12, 12), seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal((n, *shape)).astype(dtype)


# -- building -----------------------------------------------------------------------------------

def test_functional_model_names_shapes_and_output():
    model = design_net()
    assert [layer.name for layer in model.layers] == ["conv2d", "fbn", "relu", "pool", "flatten", "dense", "softmax"]
    assert set(model.params) == {"conv2d/w", "conv2d/b", "fbn/gamma", "fbn/beta", "fbn/running_mean",
                                 "fbn/running_var", "dense/w", "dense/b"}
    assert model.n_params == 4 * 9 + 4 + 4 + 4 + 10 * 4 * 6 * 6 + 10
    y = model(images())                                       # __call__ is forward
    assert y.shape == (4, 10) and y.dtype == np.float32
    np.testing.assert_allclose(y.sum(axis=1), 1, rtol=1e-6)
    assert dl.Input is L.Input


def test_sequential_equals_the_functional_chain():
    def layers():
        return [L.Conv2D(4, 3, padding=1), L.BatchNorm2D(), L.ReLU(), L.MaxPool2D(2),
                L.Flatten(), L.Dense(10), L.Softmax()]

    seq = dl.Sequential(layers(), input_shape=(1, 12, 12), seed=3)
    fun = design_net(seed=3)
    assert [layer.name for layer in seq.layers] == [layer.name for layer in fun.layers]
    assert seq.config()["layers"] == fun.config()["layers"]
    x = images()
    assert np.array_equal(seq.forward(x), fun.forward(x))    # same seed, same weights
    with pytest.raises(TypeError):
        dl.Sequential([L.Dense(3), "relu"], input_shape=(4,))


def test_a_layer_is_used_once_and_a_wrong_input_shape_is_named():
    dense = L.Dense(3)
    x = L.Input((4,))
    dense(x)
    with pytest.raises(ValueError, match="already used"):
        dense(x)
    model = dl.Sequential([L.Dense(3)], input_shape=(4,))
    with pytest.raises(ValueError, match=r"\(N, 4\).*\(2, 5\)"):
        model.forward(np.zeros((2, 5), np.float32))


# -- weights from arrays ------------------------------------------------------------------------

def test_layer_set_weights_and_get_weights():
    model = dl.Sequential([L.Dense(3, name="fc")], input_shape=(4,))
    fc = model.layer("fc")
    w = np.arange(12, dtype=np.float64).reshape(3, 4) / 10
    b = np.array([1.0, -1.0, 0.5])
    fc.set_weights({"w": w, "b": b})
    x = images(5, (4,))
    np.testing.assert_allclose(model.forward(x), x @ w.T + b, rtol=1e-6)
    np.testing.assert_array_equal(model.get_weights()["fc/w"], w.astype(np.float32))   # a view of the arena
    np.testing.assert_array_equal(model.flat[:12].reshape(3, 4), w.astype(np.float32))
    got = fc.get_weights()
    got["w"][...] = 0                                         # a copy: the layer keeps its weights
    np.testing.assert_array_equal(fc.get_weights()["w"], w.astype(np.float32))
    with pytest.raises(ValueError, match=r"fc.*'gamma'"):
        fc.set_weights({"gamma": np.ones(3)})
    with pytest.raises(ValueError, match=r"fc.*\(3, 4\).*\(4, 3\)"):
        fc.set_weights({"w": w.T})


def test_model_set_weights_by_name():
    model = design_net()
    weights = {k: np.random.default_rng(1).standard_normal(v.shape) for k, v in model.get_weights().items()}
    weights["fbn/running_var"] = np.abs(weights["fbn/running_var"]) + 0.5
    model.set_weights(weights)
    got = model.get_weights()
    for k in weights:
        np.testing.assert_array_equal(got[k], weights[k].astype(np.float32))
    partial = {"dense/b": np.full(10, 7.0)}
    with pytest.raises(ValueError, match="missing"):
        model.set_weights(partial)
    model.set_weights(partial, strict=False)
    assert (model.get_weights()["dense/b"] == 7).all()
    with pytest.raises(ValueError, match="dense/bias"):
        model.set_weights({"dense/bias": np.zeros(10)}, strict=False)
    with pytest.raises(ValueError, match=r"dense/w.*\(10, 144\).*\(10, 3\)"):
        model.set_weights({"dense/w": np.zeros((10, 3))}, strict=False)


def test_same_seed_same_weights_other_seed_other_weights():
    a, b, c = design_net(seed=0), design_net(seed=0), design_net(seed=1)
    assert np.array_equal(a.flat, b.flat)
    assert not np.array_equal(a.flat, c.flat)


# -- training vs evaluation mode ----------------------------------------------------------------

def test_batchnorm_uses_batch_statistics_only_in_training():
    model = dl.Sequential([L.BatchNorm2D(momentum=0.5)], input_shape=(2, 3, 3))
    x = images(8, (2, 3, 3)) * 3 + 5
    y_eval = model.forward(x, training=False)
    np.testing.assert_allclose(y_eval, x / np.sqrt(1 + 1e-5), rtol=1e-5)  # running mean 0, var 1
    assert np.array_equal(model.get_weights()["fbn/running_mean"], np.zeros(2))  # eval: no update
    y_train = model.forward(x, training=True)
    np.testing.assert_allclose(y_train.mean(axis=(0, 2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(y_train.var(axis=(0, 2, 3)), 1, rtol=1e-3)
    rm = model.get_weights()["fbn/running_mean"]
    np.testing.assert_allclose(rm, 0.5 * x.mean(axis=(0, 2, 3)), rtol=1e-5)
    assert not np.allclose(model.forward(x, training=False), y_eval)   # new statistics in eval


def test_dropout_only_in_training():
    model = dl.Sequential([L.Dropout(0.25)], input_shape=(1000,), seed=0)
    x = np.ones((4, 1000), np.float32)
    assert np.array_equal(model.forward(x, training=False), x)
    y = model.forward(x, training=True)
    assert set(np.unique(y)) == {0.0, np.float32(1 / 0.75)}
    assert 0.2 < np.mean(y == 0) < 0.3
    assert not np.array_equal(y, model.forward(x, training=True))       # a new mask each call


# -- backward and gradients by name ---------------------------------------------------------------

def test_backward_returns_the_input_gradient_of_a_dense_layer():
    model = dl.Sequential([L.Dense(3)], input_shape=(4,))
    w = model.get_weights()["dense/w"]
    x = images(5, (4,))
    model.forward(x, training=True)
    gy = images(5, (3,), seed=1)
    model.zero_grad()
    gx = model.backward(gy)
    np.testing.assert_allclose(gx, gy @ w, rtol=1e-5)
    g = model.get_grads()
    assert set(g) == {"dense/w", "dense/b"}
    np.testing.assert_allclose(g["dense/w"], gy.T @ x, rtol=1e-5)
    np.testing.assert_allclose(g["dense/b"], gy.sum(axis=0), rtol=1e-5)
    model.backward(gy)                                        # gradients add up until zero_grad
    np.testing.assert_allclose(model.get_grads()["dense/w"], 2 * gy.T @ x, rtol=1e-5)
    model.zero_grad()
    assert not model.grads.any()


def tiny_f64_model():
    x = L.Input((2, 5, 5))
    h = L.Tanh()(L.BatchNorm2D()(L.Conv2D(3, 3, padding=1)(x)))
    s = L.Conv2D(3, 1, bias=False)(x)
    h = L.MaxPool2D(2)(L.Add()(s, h))
    y = L.Softmax()(L.Dense(4)(L.Flatten()(h)))
    return dl.Model(x, y, dtype="float64", seed=0)


def test_named_gradients_match_central_differences_float64():
    model = tiny_f64_model()
    rng = np.random.default_rng(0)
    weights = model.get_weights()
    weights["fbn/gamma"] = 1 + 0.3 * rng.standard_normal(3)        # away from the initial values
    weights["fbn/beta"] = 0.3 * rng.standard_normal(3)
    weights["dense/b"] = 0.3 * rng.standard_normal(4)
    model.set_weights(weights)
    x = rng.standard_normal((3, 2, 5, 5))
    r = rng.standard_normal((3, 4))

    def loss():
        return float(np.sum(model.forward(x, training=True) * r))

    model.forward(x, training=True)
    model.zero_grad()
    gx = model.backward(r)
    grads = model.get_grads()
    # the Add's first input (the 1x1 shortcut) is ordered, and so named, first
    assert set(grads) == {"conv2d/w", "conv2d_1/w", "conv2d_1/b", "fbn/gamma", "fbn/beta",
                          "dense/w", "dense/b"}

    eps = 1e-6
    for name, g in grads.items():
        base = model.get_weights()[name]
        num = np.zeros_like(base)
        for i in np.ndindex(base.shape):
            for sign in (1, -1):
                w = base.copy()
                w[i] += sign * eps
                model.set_weights({name: w}, strict=False)
                num[i] += sign * loss() / (2 * eps)
        model.set_weights({name: base}, strict=False)
        np.testing.assert_allclose(g, num, rtol=1e-5, atol=1e-8, err_msg=name)

    num = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        for sign in (1, -1):
            x[i] += sign * eps
            num[i] += sign * loss() / (2 * eps)
            x[i] -= sign * eps
    np.testing.assert_allclose(gx, num, rtol=1e-5, atol=1e-8, err_msg="input")


# -- describing and rebuilding --------------------------------------------------------------------

def test_summary_prints_every_layer_and_the_totals(capsys):
    models.lenet5().summary()
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "total params: 61,706 trainable, 0 non-trainable"
    assert any(line.split()[:2] == ["layer", "(type)"] for line in out)
    rows = {line.split()[0]: line for line in out if "(" in line and not line.startswith(("layer", "total"))}
    assert list(rows) == ["normalize", "conv2d", "relu", "pool", "conv2d_1", "relu_1", "pool_1", "flatten",
                          "dense", "relu_2", "dense_1", "relu_3", "dense_2", "softmax"]
    assert rows["dense"].split()[-1] == "48,120" and "(N, 120)" in rows["dense"]
    assert "(N, 16, 10, 10)" in rows["conv2d_1"]

    lines = []
    design_net().summary(print_fn=lines.append)
    assert lines[-1] == "total params: 1,498 trainable, 8 non-trainable"


def test_config_round_trips_through_json():
    model = tiny_f64_model()
    model.forward(images(6, (2, 5, 5), dtype=np.float64), training=True)   # move BN statistics
    cfg = model.config()
    text = json.dumps(cfg)
    assert json.loads(text) == cfg
    rebuilt = dl.Model.from_config(json.loads(text), dtype="float64", seed=9)
    assert rebuilt.config() == cfg
    assert [layer.name for layer in rebuilt.layers] == [layer.name for layer in model.layers]
    assert not np.array_equal(rebuilt.flat, model.flat)
    rebuilt.set_weights(model.get_weights())
    x = images(3, (2, 5, 5), seed=4, dtype=np.float64)
    assert np.array_equal(rebuilt.forward(x), model.forward(x))
    bad = json.loads(text)
    bad["layers"][0]["class"] = "Conv9D"
    with pytest.raises(ValueError, match="Conv9D"):
        dl.Model.from_config(bad)
