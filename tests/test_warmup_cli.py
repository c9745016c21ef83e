"""python -m minidl.warmup and benchmarks/profile_startup.py without a GPU: flags, help, exit status 2."""
import importlib.util
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from minidl.cli import recipes, warmup

ROOT = pathlib.Path(__file__).resolve().parents[1]
NO_CUPY = importlib.util.find_spec("cupy") is None


def _run(*argv):
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_help_names_the_command_and_takes_the_training_flags():
    out = _run("-m", "minidl.warmup", "--help")
    assert out.returncode == 0
    assert "python -m minidl.warmup" in out.stdout and "--precision" in out.stdout and "-r" in out.stdout


def test_a_bad_flag_is_refused_like_minidl_train():
    out = _run("-m", "minidl.warmup", "-r50", "-b0")
    assert out.returncode == 2 and "argument -b" in out.stderr


def test_cpu_is_refused_in_one_line_with_status_2():
    out = _run("-m", "minidl.warmup", "--model", "lenet", "--device", "cpu")
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "needs a usable CUDA GPU" in out.stderr


@pytest.mark.skipif(not NO_CUPY, reason="CuPy is installed: the no-GPU path is not taken")
def test_without_cupy_warmup_says_so_in_one_line_with_status_2():
    out = _run("-m", "minidl.warmup", "--model", "resnet", "-r50", "-b32", "--precision", "bf16")
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "needs a usable CUDA GPU" in out.stderr


def test_profile_startup_help_and_its_no_gpu_exit():
    out = _run("benchmarks/profile_startup.py", "--help")
    assert out.returncode == 0 and "--cold" in out.stdout and "--warm" in out.stdout
    if NO_CUPY:
        out = _run("benchmarks/profile_startup.py", "--cold", "--warm", "-r50", "-b32")
        assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "needs CuPy" in out.stderr
        out = _run("benchmarks/profile_startup.py", "--child", str(ROOT / "no-such.json"), "-r50")
        assert out.returncode == 2 and "needs CuPy" in out.stderr


def test_synthetic_images_have_mnist_shapes_and_every_class():
    x, y = warmup.synthetic(20)
    assert x.shape == (20, 28, 28) and x.dtype == np.uint8 and y.dtype == np.uint8
    assert set(y.tolist()) == set(range(10))


def test_build_trainer_follows_the_recipe_as_minidl_train_does():
    from minidl.backend import get_device
    args = warmup.parser().parse_args(["--model", "lenet", "-b", "8", "--device", "cpu"])
    trainer = warmup.build_trainer(args, get_device("cpu"))
    plan = recipes.plan(args)
    assert type(trainer.optimizer).__name__.lower().startswith(plan.optimizer[:3])
    assert trainer.graph is False                      # the CPU does not capture
    x, y = warmup.synthetic(16)
    trainer.fit((x, y), steps=1, batch_size=8, monitor=1)
    assert trainer.step == 1
