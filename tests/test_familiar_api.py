"""The names users bring from Keras and PyTorch (issue 29, point 3): predict, parameters(),
named_parameters(), Adam(betas=), SGD(momentum=, nesterov=), fit(x, y), a Score whose accuracy is a
fraction, a repr that says what a model is, and partial set_weights."""
import numpy as np
import pytest
from tests.conftest import mnist_lookalike
from tests.test_optim import STEPS, ref_adam, ref_momentum, run_both

import minidl as dl
from minidl import layers as L, models, optim
from minidl.data import DataError
from minidl.metrics import Score


def quiet(model, opt=None, **kw):
    return dl.Trainer(model, opt or optim.Adam(lr=3e-3), device="cpu", progress=False, log=lambda *a: None, **kw)


def bn_net(**kw):
    """A net with BN: running statistics that are state, not parameters."""
    x = L.Input((1, 8, 8))
    h = L.MaxPool2D(2)(L.ReLU()(L.BatchNorm2D()(L.Conv2D(3, 3, padding=1)(x))))
    return dl.Model(x, L.Softmax()(L.Dense(10)(L.Flatten()(h))), name="bn_net", **kw)


@pytest.fixture(scope="module")
def trained():
    """A LeNet-5 trained 40 steps on look-alikes, and 600 held-out images."""
    images, labels = mnist_lookalike(1600)
    trainer = quiet(models.lenet5(seed=0))
    trainer.fit(images[:1000], labels[:1000], steps=40, batch_size=32, monitor=40)
    return trainer, images[1000:], labels[1000:]


# -- predict ------------------------------------------------------------------------------------

def test_predict_gives_class_probabilities_that_score_as_evaluate_does(trained):
    trainer, images, labels = trained
    p = trainer.model.predict(images, batch_size=128)              # 600 = 4 x 128 + a short batch
    assert isinstance(p, np.ndarray) and p.shape == (600, 10) and p.dtype == np.float32
    np.testing.assert_allclose(p.sum(axis=1), 1, rtol=1e-5)          # the zoo's nets end in a Softmax
    score = trainer.evaluate(images, labels)
    assert np.mean(p.argmax(axis=1) == labels) == pytest.approx(score.accuracy, abs=1e-12)
    assert score.accuracy > 0.5                                      # trained, not chance


def test_predict_normalises_as_the_loader_and_takes_floats_in_0_1(trained):
    trainer, images, _ = trained
    model = trainer.model
    x = images[:50]
    by_hand = model.forward((x / 255).astype(np.float32)[:, None], training=False)    # its Normalize does the rest
    np.testing.assert_allclose(model.predict(x), by_hand, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(model.predict(x.astype(np.float32) / 255), model.predict(x), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(model.predict(x[:, None], batch_size=7), model.predict(x), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("bad,found", [
    (lambda x: x.astype(np.float32), "0-255 values"),                    # 0-255 floats: the input trap
    (lambda x: x.astype(np.int64), "dtype int64"),
    (lambda x: x[0], "shape"),                                           # one image without its batch axis
])
def test_predict_refuses_what_fit_refuses_naming_predict(bad, found, trained):
    trainer, images, _ = trained
    with pytest.raises(DataError, match=found) as e:
        trainer.model.predict(bad(images[:8]))
    assert str(e.value).startswith("lenet5.predict images: ")


def test_predict_runs_in_evaluation_mode():
    x = L.Input((1, 6, 6))
    model = dl.Model(x, L.Dense(4)(L.Dropout(0.5)(L.Flatten()(x))))   # no Softmax: its logits
    images = np.random.default_rng(0).integers(0, 256, (5, 6, 6), dtype=np.uint8)
    np.testing.assert_array_equal(model.predict(images), model.predict(images))


# -- parameters ----------------------------------------------------------------------------------

def test_named_parameters_are_the_trainable_weights_as_views():
    model = bn_net()
    names = [k for k, _ in model.named_parameters()]
    assert names == ["conv2d/w", "conv2d/b", "fbn/gamma", "fbn/beta", "dense/w", "dense/b"]   # no running stats
    assert sum(a.size for a in model.parameters()) == model.n_params
    w = dict(model.named_parameters())["dense/w"]
    assert np.shares_memory(w, model.flat)
    w[...] = 0.5                                                     # in place: the model changes
    assert np.all(model.get_weights()["dense/w"] == 0.5)


# -- optimizers ----------------------------------------------------------------------------------

def test_adam_takes_torchs_betas():
    run_both(optim.Adam(0.01, betas=(0.8, 0.99), eps=1e-6), ref_adam, {"b1": 0.8, "b2": 0.99, "eps": 1e-6})
    opt = optim.Adam(betas=[0.5, 0.6])
    assert (opt.b1, opt.b2, opt.betas) == (0.5, 0.6, (0.5, 0.6))
    assert optim.Adam().betas == (0.9, 0.999) and optim.Adam(b2=0.9).betas == (0.9, 0.9)
    assert optim.get("adam", **optim.Adam(betas=(0.8, 0.9)).config()).betas == (0.8, 0.9)   # a checkpoint's rebuild
    with pytest.raises(ValueError, match="not both"):
        optim.Adam(b1=0.9, betas=(0.9, 0.99))
    for bad in ((0.9,), (0.9, "0.99"), 0.9, (1.0, 0.9)):
        with pytest.raises(ValueError, match="betas|b1"):
            optim.Adam(betas=bad)


@pytest.mark.parametrize("kw,ref_kw", [({"momentum": 0.8}, {"mu": 0.8}),
                                       ({"momentum": 0.9, "nesterov": True, "weight_decay": 0.02},
                                        {"nesterov": True, "wd": 0.02})])
def test_sgd_with_momentum_is_torchs_sgd_on_the_momentum_kernel(kw, ref_kw):
    _, opt = run_both(optim.SGD(0.05, **kw), ref_momentum, ref_kw)
    assert set(opt.state) == {"v"} and opt.t == STEPS
    same, _ = run_both(optim.Momentum(0.05, **kw), ref_momentum, ref_kw)
    sgd_model, _ = run_both(optim.SGD(0.05, **kw), ref_momentum, ref_kw)
    np.testing.assert_array_equal(sgd_model.flat, same.flat)          # bit for bit: one kernel


def test_sgd_momentum_state_round_trips_and_plain_sgd_keeps_none():
    assert optim.SGD(0.1).slots == () and optim.SGD(0.1, momentum=0.5).slots == ("v",)
    assert optim.Momentum(0.1, momentum=0.0).slots == ("v",)            # as its checkpoints always held
    _, opt = run_both(optim.SGD(0.05, momentum=0.9), ref_momentum, {})
    again = optim.get("sgd", **opt.config())
    _, other = run_both(again, ref_momentum, {}, steps=0)
    other.load_state_dict(opt.state_dict())
    np.testing.assert_array_equal(other.state["v"], opt.state["v"])
    with pytest.raises(ValueError, match="state arrays"):               # plain SGD has no velocity to load
        run_both(optim.SGD(0.05), None, {}, steps=0)[1].load_state_dict(opt.state_dict())


def test_sgd_refuses_what_torch_refuses_and_positional_weight_decay():
    with pytest.raises(ValueError, match="nesterov=True needs a momentum"):
        optim.SGD(0.1, nesterov=True)
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\)"):
        optim.SGD(0.1, momentum=1.0)
    with pytest.raises(TypeError):            # was weight_decay; torch's second is momentum: neither guessed
        optim.SGD(0.1, 0.01)


# -- fit and evaluate ----------------------------------------------------------------------------

def test_fit_takes_keras_order_and_the_pair_alike():
    images, labels = mnist_lookalike(256)
    pair, apart = quiet(models.lenet5(seed=1)), quiet(models.lenet5(seed=1))
    r1 = pair.fit((images, labels), steps=6, batch_size=32, monitor=3)
    r2 = apart.fit(images, labels, steps=6, batch_size=32, monitor=3)
    np.testing.assert_array_equal(pair.model.flat, apart.model.flat)
    assert r1 == r2
    assert pair.evaluate((images, labels), batch_size=100) == apart.evaluate(images, labels, batch_size=100)


def test_fit_refuses_labels_twice_and_a_positional_steps():
    images, labels = mnist_lookalike(64)
    trainer = quiet(models.lenet5())
    with pytest.raises(ValueError, match="labels given twice"):
        trainer.fit((images, labels), labels, steps=1)
    with pytest.raises(ValueError, match="labels given twice"):
        trainer.evaluate((images, labels), labels)
    with pytest.raises(TypeError):            # Keras's third positional is batch_size: not read as steps
        trainer.fit(images, labels, 5)
    assert trainer.step == 0


def test_fit_and_evaluate_return_a_score_with_accuracy_as_a_fraction(trained):
    trainer, images, labels = trained
    score = trainer.evaluate(images, labels)
    assert isinstance(score, Score) and isinstance(score, tuple)
    loss, accuracy = score                                           # unpacks as before
    assert (loss, accuracy) == (score.loss, score.accuracy) and 0 <= accuracy <= 1
    assert score.percent == pytest.approx(100 * accuracy)
    fit = quiet(models.lenet5()).fit(images, labels, steps=2, batch_size=32)
    assert isinstance(fit, Score) and 0 <= fit.accuracy <= 1


# -- describing and loading ----------------------------------------------------------------------

def test_repr_names_the_model_its_input_size_and_device():
    assert repr(models.lenet5()) == ("Model('lenet5': input (1, 28, 28), 14 layers, 61,706 parameters, "
                                     "cpu float32)")
    assert repr(bn_net(dtype="float64")) == "Model('bn_net': input (1, 8, 8), 7 layers, 526 parameters, cpu float64)"


def test_set_weights_loads_part_of_the_weights_as_the_readme_shows():
    model, w0 = models.lenet5(seed=0), np.full((6, 1, 5, 5), 0.25, np.float32)
    before = model.get_weights()
    left = model.set_weights({"conv2d/w": w0}, strict=False)
    after = model.get_weights()
    assert np.all(after["conv2d/w"] == 0.25)
    assert left == sorted(set(before) - {"conv2d/w"})
    assert all(np.array_equal(after[k], before[k]) for k in left)
    with pytest.raises(ValueError, match="missing"):                   # strict by default, as torch
        model.set_weights({"conv2d/w": w0})
    with pytest.raises(ValueError, match="unknown"):                   # a typo is never skipped
        model.set_weights({"conv2d/W": w0}, strict=False)
    assert model.set_weights(before) == []
