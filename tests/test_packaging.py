"""The wheel works from any folder: built from the checkout, installed into a fresh virtual
environment, it imports, trains on the CPU and answers through its console script (issue 29).

The wheel is built from a copy of the sources (pip builds in the tree it is given: a copy keeps
build/ and *.egg-info out of the checkout), with pip's build isolation only where setuptools here
cannot make wheels itself (setuptools < 70.1 without the `wheel` package): then pip takes
setuptools and wheel from the configured index. The fresh venv gets the wheel alone; its
dependencies (NumPy, ...) are read from this interpreter's site-packages through a .pth line,
which puts them after the venv's own site-packages and runs no .pth file there, so an editable
install of the checkout stays invisible and the minidl that runs is the wheel's.
"""
import importlib.util
import json
import os
import pathlib
import shutil
import site
import subprocess
import sys
import zipfile

import pytest

import minidl

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCES = ("setup.cfg", "pyproject.toml", "README.md", "minidl")
# what pip prints when the build isolation cannot reach setuptools or wheel: no index, no network
OFFLINE = ("No matching distribution", "Could not find a version", "Network is unreachable",
           "Failed to establish a new connection", "Temporary failure in name resolution")


def _setuptools_makes_wheels():
    """Whether setuptools here has bdist_wheel: built in from 70.1, from the `wheel` package before."""
    import setuptools
    major, minor = (int(p) for p in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


def _run(cmd, timeout=120, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def _build_wheel(tmp_path):
    """Build minidl's wheel from a copy of the sources -> its path; skip if pip can reach no setuptools."""
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path / "wheels"
    isolation = ["--no-build-isolation"] if _setuptools_makes_wheels() else []
    r = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-w", str(out), str(src)])
    if r.returncode != 0 and not isolation and any(s in r.stdout + r.stderr for s in OFFLINE):
        pytest.skip("no setuptools/wheel to build with: this setuptools cannot build wheels and pip's "
                    "build isolation reached no index")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    wheel, = out.glob("minidl-*.whl")
    return wheel


def _fresh_venv(path):
    """A venv without pip (fast) whose dependencies are this interpreter's site-packages, after its own."""
    r = _run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    assert r.returncode == 0, r.stderr
    python = path / "bin" / "python"
    own = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    deps = [p for p in site.getsitepackages() if os.path.isdir(p)]
    pathlib.Path(own, "minidl_test_deps.pth").write_text("".join(p + "\n" for p in deps))
    return python


def test_the_wheel_holds_every_module_installs_and_trains_from_another_folder(tmp_path):
    wheel = _build_wheel(tmp_path)
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("minidl/")}
    in_tree = {p.relative_to(ROOT).as_posix() for p in (ROOT / "minidl").rglob("*.py")}
    assert in_tree - shipped == set(), "modules missing from the wheel (a folder without __init__.py?)"

    venv = tmp_path / "venv"
    python = _fresh_venv(venv)
    r = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    elsewhere = tmp_path / "elsewhere"           # no minidl/ beside the script, no checkout on the path
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["OPENBLAS_NUM_THREADS"] = "1"
    script = """
import json, math
import numpy as np
import minidl as dl
import minidl.kernels.gpu                      # a folder that once had no __init__.py
from minidl import models, optim
rng = np.random.default_rng(0)
images, labels = rng.integers(0, 256, (320, 28, 28), dtype=np.uint8), rng.integers(0, 10, 320)
trainer = dl.Trainer(models.lenet5(), optim.Adam(lr=1e-3), device="cpu", progress=False, log=lambda s: None)
loss, acc = trainer.fit((images, labels), steps=20, batch_size=16, monitor=10)
print(json.dumps({"file": dl.__file__, "step": trainer.step, "loss": loss}))
"""
    r = _run([str(python), "-c", script], cwd=elsewhere, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert pathlib.Path(got["file"]).resolve().is_relative_to(venv.resolve()), got["file"]
    assert got["step"] == 20 and 0 < got["loss"] < 10

    for cmd in ([str(venv / "bin" / "minidl"), "--version"], [str(python), "-m", "minidl", "--version"]):
        r = _run(cmd, cwd=elsewhere, env=env)
        assert (r.returncode, r.stdout) == (0, f"minidl {minidl.__version__}\n"), r.stderr
    r = _run([str(venv / "bin" / "minidl"), "plot", "-h"], cwd=elsewhere, env=env)
    assert r.returncode == 0 and "RUN.jsonl" in r.stdout, r.stderr


def test_every_install_hint_is_the_one_wording():
    """minidl is installed from its checkout: no hint may send users to `pip install minidl[...]`."""
    from minidl.install_hint import install_hint
    assert install_hint("plot", "matplotlib") == ("install the plot extra: pip install '.[plot]' in "
                                                  "minidl's checkout, or pip install matplotlib")
    # files/checkpoint.py's safetensors hint is another engineer's line (issue 29): drop it from here once
    # it calls install_hint
    left = {"files/checkpoint.py"}
    elsewhere = sorted(str(p.relative_to(ROOT / "minidl")) for p in (ROOT / "minidl").rglob("*.py")
                       if "pip install" in p.read_text() and p.name != "install_hint.py")
    assert set(elsewhere) <= left, elsewhere


@pytest.mark.parametrize("argv, status, words", [
    ([], 2, "usage: minidl COMMAND"),
    (["-h"], 0, "plot"),
    (["--version"], 0, f"minidl {minidl.__version__}"),
    (["fit"], 2, "unknown command 'fit'; the commands are train, infer, export, plot"),
])
def test_the_dispatcher_answers_without_a_command(argv, status, words, capsys):
    from minidl import cli
    assert cli.main(argv) == status
    out = capsys.readouterr()
    assert words in out.out + out.err


def test_a_command_runs_its_modules_main(monkeypatch):
    from minidl import cli
    from minidl.cli import plot
    seen = []
    monkeypatch.setattr(plot, "main", lambda argv: seen.append(argv) or 7)
    assert cli.main(["plot", "a.jsonl", "-o", "x.png"]) == 7 and seen == [["a.jsonl", "-o", "x.png"]]


def test_every_command_of_the_dispatcher_is_a_module_with_a_main():
    """minidl COMMAND runs minidl.COMMAND.main: each listed command exists (warmup included)."""
    import importlib
    from minidl import cli
    assert "warmup" in cli.COMMANDS
    for name in cli.COMMANDS:
        assert callable(importlib.import_module(f"minidl.{name}").main)
