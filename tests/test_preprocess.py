"""layers.Normalize, the preprocessing a model carries: its gradient, config, and what the passes and the
Loader read from its declaration (dropped in training, folded into an unpadded first conv in inference)."""
import numpy as np
import pytest

import minidl as dl
from minidl import checkpoint
from minidl import inference, layers as L, models
from minidl.backend import Device
from minidl.data import DataError, Loader
from minidl.data import loader as data_loader
from minidl.graph import Graph, Model, Sequential, passes
from minidl.testing import randomize_weights
from tests.helpers.gradcheck import gradcheck


@pytest.mark.parametrize("mean, std, shape", [(0.1307, 0.3081, (2, 1, 5, 4)), ([0.2, 0.5, 0.7], [0.3, 0.25, 2.0],
                                                                                 (2, 3, 3, 3)), (0.5, 0.5, (3, 6))])
def test_normalize_checks_its_gradient_in_float64(mean, std, shape):
    gradcheck(L.Normalize(mean, std), [shape], low=0.05, high=0.95)      # images: the range it takes


def test_normalize_computes_the_loaders_values_bit_for_bit():
    images = np.random.default_rng(0).integers(0, 256, (8, 1, 28, 28), dtype=np.uint8)
    loader = Loader(images, np.zeros(8, np.int64), 8, Device("cpu"), shuffle=False)
    model = Sequential([L.Normalize()], (1, 28, 28))
    unit = Loader(images, np.zeros(8, np.int64), 8, Device("cpu"), shuffle=False, normalize=False).x
    assert np.array_equal(model.forward(unit, training=True), loader.x)
    np.testing.assert_allclose(model.forward(unit), loader.x, rtol=0, atol=1e-6)    # the norm family's kernel


@pytest.mark.parametrize("bad, words", [({"std": 0.0}, "std must be positive"), ({"mean": "a"}, "mean must be"),
                                        ({"mean": [0.1, 0.2], "std": [1, 2, 3]}, "2 and 3 channels")])
def test_normalize_refuses_bad_arguments_by_name(bad, words):
    with pytest.raises(ValueError, match=words):
        L.Normalize(**bad)


def test_normalize_refuses_a_channel_count_its_input_lacks():
    with pytest.raises(ValueError, match="3 channels of mean/std, its input 1"):
        Sequential([L.Normalize([0.1, 0.2, 0.3], 0.5)], (1, 4, 4))


def test_normalize_round_trips_through_config_and_checkpoints(tmp_path):
    model = randomize_weights(models.lenet5(seed=1))
    back = Model.from_config(model.config(), weights=model.get_weights())
    assert back.layers[0].mean == (0.1307,) and back.layers[0].std == (0.3081,)
    path = checkpoint.save(tmp_path / "l.npz", model)
    x = np.random.default_rng(0).random((3, 1, 28, 28), dtype=np.float32)
    np.testing.assert_array_equal(checkpoint.load_model(path).forward(x), model.forward(x))


# -- the passes -----------------------------------------------------------------------------------------
def test_training_lowering_drops_the_preprocessing_the_loader_applies():
    g = passes.training(Graph.of(models.lenet5()))
    assert [n.kind for n in g.nodes][0] == "conv2d" and g.stats["normalize_by_loader"] == 1
    x = L.Input((1, 8, 8))
    h = L.Normalize()(L.ReLU()(x))                          # not at the input: a layer like any other
    g = passes.training(Graph.of(Model(x, L.Dense(2)(L.Flatten()(h)))))
    assert "normalize" in [n.kind for n in g.nodes]


@pytest.mark.parametrize("padding, folded", [(0, True), (1, False), ("valid", True), ("same", False)])
def test_inference_folds_it_into_an_unpadded_first_conv_only(padding, folded):
    x = L.Input((3, 9, 9))
    h = L.Conv2D(4, 3, padding=padding, bias=padding != 0)(L.Normalize([0.2, 0.4, 0.6], [0.5, 0.25, 0.3])(x))
    model = randomize_weights(Model(x, L.Dense(5)(L.Flatten()(L.ReLU()(h))), dtype="float64"))
    m = inference.compile(model, dtype="float64")
    assert ("normalize" in [n.kind for n in m.nodes]) != folded and m.stats.get("normalize_folded", 0) == folded
    images = np.random.default_rng(1).random((4, 3, 9, 9))
    np.testing.assert_allclose(m.predict(images), model.forward(images), rtol=1e-12, atol=1e-12)


def test_a_model_without_the_layer_takes_the_images_as_they_are():
    """Nothing normalises what a model does not declare (docs/input.md): fit's Loader leaves [0, 1] as it
    is, and the compiled model takes the same images; LeNet stays one chain kernel (then its Softmax)."""
    model = models.lenet5(preprocess=False)
    assert data_loader.preprocessing(model) is None and data_loader.normalization(model) is False
    m = inference.compile(model, probabilities=False)
    assert m.images and [st.kind for st in m.schedule(1)[0]] == ["chain"] and m.schedule(1)[0][0].kernels == 1


# -- what the Loader reads ------------------------------------------------------------------------------
def test_the_loader_applies_what_the_model_declares():
    x = L.Input((3, 4, 4))
    model = Model(x, L.Flatten()(L.Normalize([0.1, 0.2, 0.3], [0.5, 0.5, 2.0])(x)))
    norm = data_loader.normalization(model)
    assert norm == ([0.1, 0.2, 0.3], [0.5, 0.5, 2.0])
    images = np.random.default_rng(0).random((6, 3, 4, 4), dtype=np.float32)
    loader = Loader(images, np.zeros(6, np.int64), 6, Device("cpu"), shuffle=False, normalize=norm)
    np.testing.assert_allclose(loader.x.reshape(6, -1), model.forward(images, training=True), rtol=1e-6)
    assert loader.blank == 0.0                              # per-channel statistics: shifts fill with the mean
    data_loader.check_normalization(model, loader)
    with pytest.raises(DataError, match="the Loader normalises with .* declares"):
        data_loader.check_normalization(model, Loader(images, np.zeros(6, np.int64), 6, Device("cpu")))
    assert data_loader.normalization(models.lenet5()) == (0.1307, 0.3081)
    plain = models.lenet5(preprocess=False)                 # declares nothing: a Loader that normalises is refused
    with pytest.raises(DataError, match="the Loader normalises with .* lenet5 carries no Normalize"):
        data_loader.check_normalization(plain, loader)
    data_loader.check_normalization(plain, Loader(images, np.zeros(6, np.int64), 6, Device("cpu"), normalize=False))


def test_a_host_loader_applies_what_the_model_declares_as_the_loader_does():
    """fit's host loaders (a dataset, batches: data/host_loader.py) normalise each batch with the
    model's per-channel statistics, the Loader's values bit for bit, and fill shifts with its blank."""
    from minidl.data.host_loader import BatchLoader
    x = L.Input((3, 4, 4))
    model = Model(x, L.Flatten()(L.Normalize([0.1, 0.2, 0.3], [0.5, 0.5, 2.0])(x)))
    norm = data_loader.normalization(model)
    images = (np.random.default_rng(0).random((6, 3, 4, 4)) * 255).astype(np.uint8)
    want = Loader(images, np.zeros(6, np.int64), 6, Device("cpu"), shuffle=False, normalize=norm)
    host = BatchLoader([(images, np.zeros(6, np.int64))], Device("cpu"), per_epoch=1, normalize=norm)
    (got, _), = list(host)
    np.testing.assert_array_equal(got, want.x)
    host.indices(0, 0)                                    # the captured step's fixed buffer: the same values
    np.testing.assert_array_equal(host.x, want.x)
    assert host.blank == want.blank == 0.0
    mnist = BatchLoader([(images[:, :1], np.zeros(6, np.int64))], Device("cpu"), per_epoch=1, normalize=True)
    assert mnist.blank == Loader(images[:, :1], np.zeros(6, np.int64), 6, Device("cpu")).blank != 0.0


def test_a_zoo_model_trains_the_same_weights_with_the_layer_as_without():
    """The trainer's Loader normalises (MNIST's values, what the zoo declares) and the training lowering
    drops the layer: the same steps as the net without it fed the normalised batches, bit for bit."""
    rng = np.random.default_rng(3)
    images, labels = rng.integers(0, 256, (64, 28, 28), dtype=np.uint8), rng.integers(0, 10, 64)
    flats = []
    for preprocess in (True, False):
        trainer = dl.Trainer(models.lenet5(seed=0, preprocess=preprocess), dl.optim.Adam(lr=1e-3), device="cpu",
                             progress=False, log=lambda s: None)
        if preprocess:
            trainer.fit((images, labels), steps=4, batch_size=16, monitor=4)
        else:                                                   # the very batches fit drew, normalised
            loader = Loader(images, labels, 16, trainer.device, seed=trainer.seed, normalize=True)
            for k in range(4):
                trainer.train_step(*loader.batch(0, k))
        flats.append(trainer.model.flat.copy())
    np.testing.assert_array_equal(*flats)


def test_checkpoints_with_and_without_the_zoos_normalize_load_into_each_other(tmp_path):
    """MNIST's Normalize is what the Loader applied to a model from before it: the same model either way.
    Another mean or std is another model, refused by name."""
    new = randomize_weights(models.lenet5(seed=4))
    path = checkpoint.save(tmp_path / "new.npz", new)
    old = models.lenet5(seed=5, preprocess=False)
    checkpoint.load(path, old)
    np.testing.assert_array_equal(old.flat, new.flat)
    shifted = Model.from_config({**new.config(), "layers": [
        {**new.config()["layers"][0], "config": {"mean": 0.5, "std": 0.5}}, *new.config()["layers"][1:]]})
    with pytest.raises(checkpoint.CheckpointError, match="saved from another model: layer 0 .* mean=0.1307"):
        checkpoint.load(path, shifted)
