"""Issue 39's new-user session: the scripts of examples/new_user/ run, as a user runs them, and say
what they show (each asserts its own claims; here they must exit 0 and print their key lines).

The quick ones (< 20 s each on the 2-core CPU) always run; the others (a CPU-speed comparison with the
command line, SIGINT to child processes, several command-line runs: 12-20 s each) with MINIDL_SLOW=1. They need the
real MNIST (and task 7 Fashion-MNIST) files in a lookup root: never downloaded here.
Also the small fixes the session led to: Model.predict / evaluate on NHWC images, and a Python run
naming its dataset in its checkpoints (Trainer.save(path, dataset=...)).
"""
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import minidl as dl
from minidl import data

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "examples" / "new_user"
SLOW = pytest.mark.skipif(os.environ.get("MINIDL_SLOW", "0") in ("", "0"), reason="set MINIDL_SLOW=1 to run")


def _have(name):
    try:
        data.load(name, "test", download=False)
        return True
    except data.DataError:
        return False


def run(script, tmp_path, *shows):
    if not _have("mnist") or (script.startswith("task7") and not _have("fashion-mnist")):
        pytest.skip("the real MNIST / Fashion-MNIST files are not in a lookup root")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, str(SCRIPTS / script)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    for line in shows:
        assert line in p.stdout, f"{script} did not print {line!r}:\n{p.stdout[-3000:]}"
    return p.stdout


def test_task1_one_contract_for_every_entry_point(tmp_path):
    out = run("task1_contract.py", tmp_path, "custom net: predict", "zoo lenet5: predict", "ONNX --uint8 (uint8)",
              "floats in [0, 255] refused")
    assert out.count("argmax agrees 100%") == 14


@SLOW
def test_task2_the_api_runs_at_the_command_lines_speed(tmp_path):
    run("task2_cpu_speed.py", tmp_path, "BLAS threads after the first CPU device: [1]", "API / CLI:")


def test_task3_a_layer_of_your_own(tmp_path):
    run("task3_custom_layer.py", tmp_path, "config recorded without a decorator: {'k': 3.0}", "reloaded: k = 3.0",
        "unknown layer class 'SoftClip'")


def test_task4_training_controls(tmp_path):
    run("task4_training_controls.py", tmp_path, "frozen conv2d/w unchanged: True", "early stopping at step",
        "missing=['dense_2/b', 'dense_2/w']")


def test_task5_data_as_it_comes(tmp_path):
    run("task5_data.py", tmp_path, "a map-style dataset", "augment was called on 50 batches")


@SLOW
def test_task6_stops_and_resumes(tmp_path):
    run("task6_stops_resume.py", tmp_path, "a KeyboardInterrupt: True", "bit for bit: True", "exit 130")


@SLOW
def test_task7_checkpoints_that_know_their_data(tmp_path):
    run("task7_data_checkpoints.py", tmp_path, "still the MNIST run: mnist True", "fashion-mnist test images")


def test_the_readmes_custom_net_learns_in_its_20_steps(tmp_path):
    """The README's "net of your own" block as written: at Momentum(lr=0.05) it ended at 12.6% (loss
    2.30: the run blew up in its first steps on [0, 1] images); at 0.01, 76%."""
    import re
    if not _have("mnist"):
        pytest.skip("the real MNIST files are not in a lookup root")
    readme = (ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"^```python\n(.*?)^```", readme, re.M | re.S) if "L.Input" in b)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    accuracy = float(re.search(r"accuracy=([\d.]+)", p.stdout).group(1))
    assert accuracy > 0.5, p.stdout[-1000:]


# -- the fixes -------------------------------------------------------------------------------------------
def test_predict_and_evaluate_take_nhwc_as_fit_does():
    model = dl.models.lenet5()
    x = np.random.default_rng(0).integers(0, 256, (6, 28, 28), dtype=np.uint8)
    y = np.arange(6) % 10
    assert np.array_equal(model.predict(x[..., None]), model.predict(x))
    assert np.array_equal(model.predict(x[..., None], data_format="channels_last"), model.predict(x[:, None]))
    assert model.evaluate(x[..., None], y) == model.evaluate(x, y)
    with pytest.raises(ValueError, match=r"lenet5.predict images: images of shape \(6, 28, 28, 2\).*"
                                         "data_format='channels_last'"):
        model.predict(np.repeat(x[..., None], 2, -1))
    with pytest.raises(ValueError, match="data_format must be"):
        model.evaluate(x, y, data_format="nhwc")


def test_compiled_predict_takes_the_layouts_model_predict_takes():
    model = dl.models.lenet5()
    compiled = dl.inference.compile(model)
    x = np.random.default_rng(1).integers(0, 256, (5, 28, 28), dtype=np.uint8)
    want = model.predict(x)
    for images in (x, x[:, None], x[..., None]):                  # (N, H, W), NCHW, NHWC
        assert np.array_equal(np.asarray(compiled.predict(images)), want), images.shape
    with pytest.raises(ValueError, match=r"inputs must be \(N, \*\(1, 28, 28\)\).*\(5, 28, 28, 2\)"):
        compiled.predict(np.repeat(x[..., None], 2, -1))


def test_a_python_run_names_its_dataset_for_infer(tmp_path):
    from tests.conftest import mnist_lookalike
    trainer = dl.Trainer(dl.models.lenet5(), dl.optim.Adam(3e-3), device="cpu", seed=0)
    trainer.fit(mnist_lookalike(64), steps=2, monitor=2)
    trainer.save(tmp_path / "a.npz")
    assert dl.checkpoint.dataset_of(dl.checkpoint.read_info(tmp_path / "a.npz")) is None
    trainer.save(tmp_path / "f.npz", dataset="fashion-mnist")
    assert dl.checkpoint.dataset_of(dl.checkpoint.read_info(tmp_path / "f.npz")) == "fashion-mnist"
    trainer.save(tmp_path / "g.npz")                                       # kept for the later saves
    assert dl.checkpoint.read_info(tmp_path / "g.npz")["data"]["dataset"] == "fashion-mnist"
    with pytest.raises(ValueError, match="Trainer.save: dataset must be one of 'mnist', 'fashion-mnist', got 'cifar'"):
        trainer.save(tmp_path / "c.npz", dataset="cifar")
    assert not (tmp_path / "c.npz").exists()
    again = dl.Trainer(dl.models.lenet5(), dl.optim.Adam(3e-3), device="cpu")
    again.resume(tmp_path / "f.npz")
    assert again.dataset == "fashion-mnist" and again.step == 2


def test_a_generator_short_of_steps_warns_at_the_users_fit_line():
    from tests.conftest import mnist_lookalike
    x, y = mnist_lookalike(96)
    trainer = dl.Trainer(dl.models.lenet5(), dl.optim.Adam(1e-3), device="cpu", seed=0)
    with pytest.warns(UserWarning, match="the data ran out after 3 batches, short of the 5 steps") as caught:
        trainer.fit(((x[i:i + 32], y[i:i + 32]) for i in range(0, 96, 32)), steps=5, monitor=5)
    assert caught[0].filename == __file__, caught[0].filename            # this line, not minidl's
    assert trainer.step == 3
