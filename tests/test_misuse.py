"""API misuse gets one clear message naming the layer and the shapes (or is made right)."""
import re

import numpy as np
import pytest

import minidl as dl
from minidl import layers as L
from minidl import models, optim
from minidl.data.loader import Loader


def quiet(model, opt=None):
    return dl.Trainer(model, opt or optim.SGD(0.01), device="cpu", progress=False, log=lambda s: None)


def data(n=64, classes=10, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, classes, n).astype(np.uint8)


def test_too_few_outputs_for_the_labels_names_the_last_layer():
    model = dl.Sequential([L.Flatten(), L.Dense(5)], (1, 28, 28))
    with pytest.raises(ValueError, match=r"layer dense \(Dense\): the model outputs shape \(N, 5\).*\(N, 10\)"):
        quiet(model).fit(data(), steps=1)
    with pytest.raises(ValueError, match=r"dense \(Dense\)"):
        quiet(model).evaluate(data())


def test_a_loader_s_labels_are_checked_against_the_model_from_the_host_each_evaluation():
    """The largest label is read once, where the Loader is made: an evaluation of a Loader (StopAtAccuracy
    scores one every few steps) reads nothing of its labels from the device."""
    model = dl.Sequential([L.Flatten(), L.Dense(5)], (1, 28, 28))
    trainer = quiet(models.lenet5())
    loader = Loader(*data(), 32, trainer.device, shuffle=False, drop_last=False)

    class Unread(np.ndarray):
        def max(self, *a, **k):
            raise AssertionError("the labels' maximum read again")
    loader.y = loader.y.view(Unread)
    assert loader.label_max == data()[1].max()
    trainer.evaluate(loader)
    with pytest.raises(ValueError, match=r"layer dense \(Dense\): the model outputs shape \(N, 5\).*\(N, 10\)"):
        quiet(model).evaluate(loader)


def test_an_empty_batch_and_an_empty_input_shape_are_named():
    model = models.lenet5()
    with pytest.raises(ValueError, match=r"input expects shape \(N, 1, 28, 28\)|empty batch \(0, 1, 28, 28\)"):
        model.forward(np.zeros((0, 1, 28, 28), np.float32))
    with pytest.raises(ValueError, match=r"Input shape must be positive sizes, got \(1, 0, 28\)"):
        L.Input((1, 0, 28))
    with pytest.raises(ValueError, match=r"inputs must be \(N, \*\(1, 28, 28\)\) with one N >= 1"):
        dl.inference.compile(model).predict(np.zeros((0, 1, 28, 28), np.float32))


@pytest.mark.parametrize("kw,what", [({"monitor": 0}, "monitor"), ({"steps": 0}, "steps"), ({"epochs": -1}, "epochs"),
                                     ({"batch_size": 0}, "batch_size"), ({"steps": 2.5}, "steps"),
                                     ({"save_every": 0}, "save_every")])
def test_fit_arguments_are_checked(kw, what):
    with pytest.raises(ValueError, match=rf"fit: {what} must be a positive int"):
        quiet(models.lenet5()).fit(data(), **{"steps": 1, **kw})


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.uint8])
def test_input_batches_of_other_dtypes_are_cast_to_the_models(dtype):
    model = models.lenet5(preprocess=False)          # a model without Normalize: forward casts its numbers
    x = np.random.default_rng(0).integers(0, 3, (2, 1, 28, 28)).astype(dtype)
    y = model.forward(x)
    assert y.dtype == np.float32
    scale = 255 if dtype == np.uint8 else 1          # uint8 images are divided by 255 (docs/input.md)
    np.testing.assert_array_equal(y, model.forward(x.astype(np.float32) / np.float32(scale)))


def test_non_numeric_input_is_rejected():
    with pytest.raises(ValueError, match="dtype <U1, expected "):
        models.lenet5().forward(np.full((1, 1, 28, 28), "a"))


def test_labels_out_of_range_and_mismatched_lengths_are_named():
    images, labels = data()
    bad = labels.astype(np.int64)
    bad[3] = -1
    with pytest.raises(ValueError, match="labels"):
        quiet(models.lenet5()).fit((images, bad), steps=1)
    with pytest.raises(ValueError, match="labels"):
        quiet(models.lenet5()).fit((images, labels[:10]), steps=1)
    with pytest.raises(ValueError, match="a Loader or a pair"):
        quiet(models.lenet5()).fit(images, steps=1)


def test_a_wrong_optimizer_hyper_parameter_is_named():
    for bad in (-1, float("nan"), float("inf"), "0.1"):
        with pytest.raises(ValueError, match="lr must be a finite number >= 0"):
            optim.Adam(lr=bad)


# -- issue 26: the Python API's misuse, one ValueError each -------------------------------------------------
def _tiny():
    x = L.Input((1, 8, 8))
    return dl.Model(x, L.Softmax()(L.Dense(10)(L.Flatten()(x))))


def test_one_optimizer_for_two_trainers_is_refused():
    opt = optim.Adam()
    quiet(_tiny(), opt)
    with pytest.raises(ValueError, match="this Adam already trains model 'model' .*an optimizer of its own"):
        quiet(_tiny(), opt)


def test_backward_before_forward_and_a_wrong_gradient_shape_name_the_layer():
    model = _tiny()
    with pytest.raises(ValueError, match=r"backward before forward: .*layer flatten"):
        model.backward(np.ones((2, 10), np.float32))
    model.forward(np.ones((2, 1, 8, 8), np.float32), training=True)
    want = r"gradient of output softmax has shape \(3, 10\), the output has shape \(2, 10\)"
    with pytest.raises(ValueError, match=want):
        model.backward(np.ones((3, 10), np.float32))


def test_a_model_with_no_layer_is_refused():
    x = L.Input((1, 8, 8))
    with pytest.raises(ValueError, match=r"no layer between the inputs and the outputs \(Model\(x, x\)\)"):
        dl.Model(x, x)


def test_more_threads_than_cpus_warns():
    from minidl import threads
    with pytest.warns(UserWarning, match=f"{threads.cpus() + 1} threads on the {threads.cpus()} CPU"):
        threads.set_threads(threads.cpus() + 1)
    threads.set_threads(1)


def test_cpu_out_of_memory_is_one_line(monkeypatch, capsys):
    from minidl.cli import train
    model = _tiny()
    trainer = quiet(model)

    def no_memory(*a, **k):
        raise MemoryError
    monkeypatch.setattr(trainer, "_run_step", no_memory)
    rng = np.random.default_rng(0)
    status = train.run_cli(lambda args: trainer.fit((rng.integers(0, 256, (64, 1, 8, 8), dtype=np.uint8),
                                                     rng.integers(0, 10, 64)), steps=2, batch_size=8), None)
    err = capsys.readouterr().err
    assert status == 1 and err == "error: out of CPU memory: try a smaller batch (-b, -x, --batch-size)\n"


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "32"])
def test_predict_batch_size_is_checked_as_fits_is(bad):
    """predict(batch_size=2.5 or "32") ran, and 0 or -1 said "gives no batch": one line naming it."""
    said = rf"lenet5\.predict: batch_size must be a positive int, got {re.escape(repr(bad))}"
    with pytest.raises(ValueError, match=said):
        models.lenet5().predict(data(4)[0], batch_size=bad)


@pytest.mark.parametrize("bad", [None, optim.Adam], ids=["None", "the class"])
def test_a_trainer_takes_an_optimizer_instance_and_names_what_it_got(bad):
    """Trainer(model, None) was an AttributeError deep in the optimizer check."""
    with pytest.raises(TypeError, match=r"Trainer: optimizer must be an Optimizer instance .*, got (None|<class)"):
        dl.Trainer(models.lenet5(), bad, device="cpu")


def test_a_diverging_fit_ends_in_its_one_line_without_numpy_warnings():
    """An exploding run overflowed NumPy's matmul first: `RuntimeWarning: overflow encountered` lines of
    the kernels' files printed ahead of the NaN stop's one line (on the command line too)."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(dl.TrainingDiverged, match="loss is nan at step"):
            quiet(models.lenet5(), optim.SGD(1e9)).fit(data(), steps=20, batch_size=16)


def test_predict_of_nan_images_passes_them_without_a_numpy_warning():
    """NaN images pass the input contract (docs/input.md); the range check said `All-NaN slice` on the way."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = models.lenet5(preprocess=False).predict(np.full((2, 1, 28, 28), np.nan, np.float32))
    assert out.shape == (2, 10) and np.isnan(out).all()
