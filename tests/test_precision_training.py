"""LeNet-5 trained and compiled under bf16 and fp16 on the CPU: accuracy, float32 checkpoints that
load under any precision, inference agreement with fp32, half-size artifacts, the command lines."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import minidl as dl
from minidl import checkpoint
from minidl import inference, models, optim
from minidl.checkpoint import read_npz, write_npz
from minidl.data.loader import Loader
from minidl.precision import BFLOAT16

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = os.environ.get("MINIDL_DATA")
needs_mnist = pytest.mark.skipif(not (DATA and os.path.isdir(os.path.join(DATA, "mnist"))),
                                 reason="real MNIST not found: $MINIDL_DATA/mnist/ is missing")


@pytest.fixture(scope="module")
def mnist_test():
    """MNIST's test split when a lookup root holds it, else 2,000 look-alikes."""
    from conftest import mnist_lookalike
    try:
        return dl.data.mnist("test", download=False)
    except dl.data.DataError:
        return mnist_lookalike(2000, seed=1)


def _trained(precision, mnist_train, steps=300):
    model = models.lenet5(seed=0)
    trainer = dl.Trainer(model, optim.Adam(lr=1e-3), device="cpu", progress=False, log=lambda s: None,
                         precision=precision)
    trainer.fit(mnist_train, steps=steps, batch_size=32, monitor=steps)
    return trainer


@pytest.fixture(scope="module")
def bf16_run(mnist_train):
    return _trained("bf16", mnist_train)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_lenet_trains_300_steps_under_half_precision(precision, bf16_run, mnist_train, mnist_test):
    trainer = bf16_run if precision == "bf16" else _trained(precision, mnist_train)
    _, acc = trainer.evaluate(mnist_test)
    assert acc >= 0.90, acc
    flat = trainer.model.flat                     # the master weights stay float32, and keep their low bits
    assert flat.dtype == np.float32 and not np.array_equal(flat.astype(BFLOAT16).astype(np.float32), flat)
    if precision == "fp16":
        assert trainer.loss_scale["scale"] > 0 and trainer.optimizer.t == 300 - trainer.loss_scale["skipped"]


def test_a_bf16_checkpoint_is_float32_and_loads_under_any_precision(bf16_run, mnist_test, tmp_path):
    path = bf16_run.save(tmp_path / "bf16.npz")
    _, acc = bf16_run.evaluate(mnist_test, steps=2)                     # 2,000 images
    info, arrays = checkpoint.read(path)
    assert {a.dtype for a in arrays.values()} == {np.dtype(np.float32)}
    assert info["meta"].get("loss_scale") is None                      # bf16 scales nothing
    for precision in ("fp32", "fp16"):
        model = checkpoint.load_model(path, device="cpu")
        trainer = dl.Trainer(model, optim.Adam(lr=1e-3), device="cpu", progress=False, precision=precision)
        trainer.resume(path)
        assert np.array_equal(model.flat, bf16_run.model.flat)
        assert abs(trainer.evaluate(mnist_test, steps=2).accuracy - acc) < 0.005, precision


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_inference_agrees_with_fp32_on_the_whole_test_set(precision, bf16_run, mnist_test):
    model = bf16_run.model
    loader = Loader(*mnist_test, 1000, model.device, shuffle=False, drop_last=False, normalize=False)  # [0, 1]
    fp32, half = inference.compile(model), inference.compile(model, precision=precision)
    assert half.precision == precision and half.stats[f"cast_to_{half.model.nodes[0].dtype.name}"] == 1
    same = sum(int((fp32.predict(x).argmax(1) == half.predict(x).argmax(1)).sum()) for x, _ in loader)
    assert same / loader.N >= 0.999, same


def test_a_bf16_artifact_is_half_the_size_and_loads_checked(bf16_run, tmp_path):
    x = np.random.default_rng(0).random((16, 1, 28, 28), dtype=np.float32)     # images in [0, 1]
    sizes = {}
    for precision in ("fp32", "bf16"):
        compiled = inference.compile(bf16_run.model, precision=precision)
        path = compiled.save(tmp_path / f"{precision}.npz")
        sizes[precision] = os.path.getsize(path)
        loaded = inference.load(path, device="cpu")
        assert loaded.precision == precision and np.array_equal(loaded.predict(x), compiled.predict(x))
    assert sizes["bf16"] < 0.55 * sizes["fp32"]
    info, arrays = read_npz(tmp_path / "bf16.npz")
    assert info["format"] == "minidl-artifact-3" and "conv2d/w" in info["bfloat16_bits"]
    assert arrays["conv2d/w"].dtype == np.uint16 and any(layer["class"] == "Cast" for layer in info["model"]["layers"])
    write_npz(tmp_path / "bad.npz", arrays, dict(info, bfloat16_bits=[]))        # the bits read as integers
    with pytest.raises(inference.ArtifactError, match="tensor .* is uint16"):
        inference.load(tmp_path / "bad.npz", device="cpu")
    arrays = dict(arrays, **{"conv2d/w": arrays["conv2d/w"].view(BFLOAT16).astype(np.float32)})
    write_npz(tmp_path / "bad.npz", arrays, dict(info, bfloat16_bits=[k for k in info["bfloat16_bits"]
                                                                       if k != "conv2d/w"]))
    with pytest.raises(inference.ArtifactError, match="conv2d/w is float32, but its layer computes in bfloat16"):
        inference.load(tmp_path / "bad.npz", device="cpu")


def _cli(module, *args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


@needs_mnist
def test_the_command_lines_take_a_precision(tmp_path):
    run = ("-n", "20", "-m", "10", "-y", "1", "-x", "500", "--device", "cpu", "-s")
    p = _cli("minidl.train", *run, "--precision", "fp16", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert ", batch 32, fp16, 1 thread .." in p.stdout and "fp16 loss scale 65536, 0 steps skipped" in p.stdout
    ckpt = tmp_path / "checkpoints" / "lenet5.npz"
    with np.load(ckpt, allow_pickle=False) as z:
        meta = json.loads(z["__meta__"].tobytes())["meta"]
    assert meta["plan"]["precision"] == "fp16" and meta["loss_scale"]["scale"] == 65536.0
    p = _cli("minidl.train", *run, "--precision", "bf16", "--resume", cwd=tmp_path)
    assert p.returncode == 2 and "--precision bf16 (the checkpoint's run: fp16)" in p.stderr, p.stderr

    art = tmp_path / "bf16.npz"
    p = _cli("minidl.infer", "--checkpoint", str(ckpt), "--device", "cpu", "--precision", "bf16",
             "--save-artifact", str(art), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "bf16 agrees with fp32 on " in p.stdout and "of the 10000 test predictions" in p.stdout
    p = _cli("minidl.infer", "--artifact", str(art), "--device", "cpu", "--precision", "fp16", cwd=tmp_path)
    assert p.returncode == 1 and "was compiled in bf16" in p.stderr and "Traceback" not in p.stderr


def test_a_plan_saved_before_precision_existed_resumes_as_fp32():
    from minidl.cli.runplan import RunPlan
    plan = RunPlan("lenet5", "mnist", 32, 100, None, "adam", 1e-3, 0.0, "cosine", 0)
    old = {k: v for k, v in plan.to_json().items() if k != "precision"}
    assert plan.precision == "fp32" and plan.differences(old) == []
    assert RunPlan(**dict(old, precision="bf16")).differences(old) == ["--precision bf16 (the checkpoint's run: fp32)"]
