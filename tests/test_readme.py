"""The README's examples as written: every ```python block runs, every `python -m minidl` line parses.

The Python blocks run in order, each in a fresh interpreter, in one temporary folder (a later block
may read what an earlier one saved), on the CPU (CUDA_VISIBLE_DEVICES empty, so device="auto" takes
the CPU) with one BLAS thread. They read MNIST from $MINIDL_DATA (conftest.py points it at the
shared datasets beside the checkout); where MNIST is not there, they are skipped, not downloaded.
The command lines in ```bash blocks are only parsed, by the command's own parser, so a renamed or
removed flag fails here without training anything.
"""
import importlib
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(lang):
    """The bodies of the README's fenced blocks tagged `lang`, in order."""
    return [body for tag, body in FENCE.findall(README) if tag == lang]


def commands():
    """Each `python -m minidl...` or `minidl ...` command in the README's bash blocks, as an argv list
    starting at the module name (comments dropped, `&&` chains split)."""
    found = []
    for body in blocks("bash"):
        for line in body.splitlines():
            for part in re.split(r"&&|;", line.split(" #", 1)[0]):
                argv = shlex.split(part)
                if argv[:2] == ["python", "-m"] and argv[2:3] and argv[2].startswith("minidl"):
                    argv = argv[2:]
                elif argv[:1] != ["minidl"]:
                    continue
                if argv[0] == "minidl" and argv[1:2] and not argv[1].startswith("-"):   # the dispatcher
                    argv = [f"minidl.{argv[1]}"] + argv[2:]
                found.append(argv)
    return found


def test_readme_has_examples_and_the_ci_test_command():
    assert len(blocks("python")) >= 2
    assert len(commands()) >= 3
    # .ci/run runs the README's test command (quietly, -q): it must stay in both, word for word
    line = "pip install -e '.[test]' && python -m pytest -q"
    assert line in README
    assert line in (ROOT / ".ci" / "run").read_text().replace("pip install -q ", "pip install ")


@pytest.mark.parametrize("argv", commands(), ids=lambda a: " ".join(a))
def test_readme_command_line_parses(argv):
    module, args = argv[0], argv[1:]
    if module == "minidl":               # `minidl --version` / `python -m minidl --help`
        assert args and args[0] in ("--version", "-h", "--help"), argv
        return
    importlib.import_module(module)                 # the door that `python -m` runs
    mod = importlib.import_module(module.replace("minidl.", "minidl.cli.", 1))   # the command
    parser = getattr(mod, "parser", None)
    assert parser is not None, f"{module} has no parser() to check the README's flags with"
    p = parser()
    p.allow_abbrev = False               # the README spells flags out: an abbreviation would hide a rename
    try:
        p.parse_args(args)
    except SystemExit as e:
        pytest.fail(f"README: `{' '.join(argv)}` does not parse (exit {e.code})")


def _mnist_folder():
    """The folder holding MNIST's IDX files here, or None (nothing is downloaded)."""
    from minidl.data import DataError, find_dataset
    try:
        return str(next(iter(find_dataset("mnist", download=False, progress=False).values())).resolve().parent)
    except (DataError, OSError):
        return None


def test_readme_python_blocks_run(tmp_path):
    folder = _mnist_folder()
    if folder is None:
        pytest.skip("MNIST not found under $MINIDL_DATA or the other local roots (not downloaded)")
    env = dict(os.environ, MINIDL_DATA=folder, CUDA_VISIBLE_DEVICES="", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for i, code in enumerate(blocks("python"), 1):
        r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, f"README python block {i} failed:\n{code}\n--- stderr:\n{r.stderr[-3000:]}"
    assert (tmp_path / "checkpoints" / "lenet5.npz").is_file()
