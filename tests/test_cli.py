"""`python -m minidl.train`: a smoke run, save and resume, and clean errors (run as a subprocess)."""
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = os.environ.get("MINIDL_DATA")
STEP_LINE = re.compile(r"step: +\d+, loss: \d+\.\d{3}, accuracy: \d+\.\d{3}%")
RESULT_LINE = re.compile(r"loss: \d+\.\d{3}, accuracy: \d+\.\d{3}%.*")

needs_mnist = pytest.mark.skipif(not (DATA and os.path.isdir(os.path.join(DATA, "mnist"))),
                                 reason="real MNIST not found: $MINIDL_DATA/mnist/ is missing")


def train(*args, cwd, data=True, **env_extra):
    """Run the CLI in `cwd`; data=False unsets $MINIDL_DATA."""
    env = {k: v for k, v in os.environ.items() if k != "MINIDL_DATA"}
    env.update(PYTHONPATH=str(ROOT), **env_extra)
    if data and DATA:
        env["MINIDL_DATA"] = DATA
    return subprocess.run([sys.executable, "-m", "minidl.train", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def lines_of(proc):
    return [l.rstrip() for l in proc.stdout.splitlines()]


SMOKE = ("-n", "20", "-m", "10", "-y", "1", "-x", "500", "--device", "cpu")


@needs_mnist
def test_smoke_run_prints_the_seed_lines(tmp_path):
    p = train(*SMOKE, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    out = lines_of(p)
    for needed in ("[TRAIN]", "[INFERENCE]", "Done."):
        assert needed in out, f"{needed!r} missing from:\n{p.stdout}"
    steps = [l for l in out if STEP_LINE.fullmatch(l)]
    assert [l[:10] for l in steps] == ["step:   10", "step:   20"]
    results = [l for l in out if RESULT_LINE.fullmatch(l)]
    assert len(results) == 1 and "first 500 of 10000" in results[0]
    order = [out.index("[TRAIN]"), out.index(steps[0]), out.index(steps[1]), out.index("[INFERENCE]"),
             out.index(results[0]), out.index("Done.")]
    assert order == sorted(order)
    assert out[-1] == "Done."
    assert any(l.startswith("loaded 60000 items") for l in out)
    assert any(l.startswith("loaded 10000 items") for l in out)
    assert not (tmp_path / "checkpoints").exists()           # no -s, no checkpoint


@needs_mnist
def test_save_then_resume_continues_the_step_count(tmp_path):
    p = train(*SMOKE, "-s", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    ckpt = tmp_path / "checkpoints" / "lenet5.npz"
    assert ckpt.is_file()
    assert any("saved" in l and "lenet5.npz" in l for l in lines_of(p))

    p = train("--resume", "-n", "10", "-m", "10", "-y", "1", "-x", "500", "--device", "cpu", "-s",
              cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    out = lines_of(p)
    assert any(re.fullmatch(r"resumed from \S*lenet5\.npz at step 20", l) for l in out), p.stdout
    assert [l[:10] for l in out if STEP_LINE.fullmatch(l)] == ["step:   30"]
    assert "Done." in out
    with np.load(ckpt, allow_pickle=False) as z:
        info = json.loads(z["__meta__"].tobytes())
    assert info["meta"]["step"] == 30 and info["optimizer"]["t"] == 30


@pytest.mark.parametrize("args,message", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["-b0"], "argument -b"),
    (["-r", "20"], "argument -r"),
    (["-n", "-5"], "argument -n"),
])
def test_bad_flags_exit_2_with_usage(args, message, tmp_path):
    p = train(*args, "--device", "cpu", cwd=tmp_path)
    assert p.returncode == 2
    assert p.stderr.startswith("usage: python -m minidl.train")
    assert message in p.stderr
    assert "Traceback" not in p.stderr
    assert p.stdout == ""


def test_missing_data_is_a_one_line_error(tmp_path):
    # --data-dir names a folder that does not exist (under tmp_path, so that the download folder the
    # CLI creates there stays inside the test), $MINIDL_DATA is unset, ./dataset is absent, and the
    # only mirror refuses connections at once
    missing = tmp_path / "nonexistent"
    p = train("--data-dir", str(missing), "--device", "cpu", cwd=tmp_path, data=False,
              MINIDL_MIRRORS="http://127.0.0.1:9/")
    assert p.returncode not in (0, 2)
    assert "Traceback" not in p.stderr
    errors = [l for l in p.stderr.splitlines() if "error" in l.lower()]
    assert len(errors) == 1, p.stderr
    line = errors[0][errors[0].index("error:"):]
    assert line.startswith("error: ") and "mnist" in line
    assert "train-images-idx3-ubyte" in line
    assert "[INFERENCE]" not in p.stdout
    assert not list(missing.rglob("*ubyte*"))                 # nothing half-downloaded is left


@needs_mnist
def test_resume_without_checkpoint_names_the_file(tmp_path):
    p = train("--resume", "-n", "5", "--device", "cpu", cwd=tmp_path)
    assert p.returncode == 1
    assert "Traceback" not in p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert os.path.join("checkpoints", "lenet5.npz") in err[0]
    assert not STEP_LINE.search(p.stdout)                     # it did not train from scratch


@needs_mnist
def test_resume_from_an_explicit_checkpoint_path(tmp_path):
    p = train("--resume", "--checkpoint", "elsewhere/x.npz", "--device", "cpu", cwd=tmp_path)
    assert p.returncode == 1
    assert "elsewhere/x.npz" in p.stderr and "Traceback" not in p.stderr
