"""A command's usage line names it as it was invoked (issue 40): `minidl train` through the console script,
`python -m minidl train` through the package's door, `python -m minidl.train` through the module's."""
import os
import pathlib
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _console_script(folder):
    """The `minidl` script pip writes for pyproject.toml's [project.scripts] entry, in `folder`."""
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["minidl"]
    module, func = entry.split(":")
    script = folder / "minidl"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom {module} import {func}\n"
                      f"if __name__ == '__main__':\n    sys.exit({func}())\n")
    script.chmod(0o755)
    return [str(script)]


def _run(cmd, *args):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([*cmd, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


DOORS = {"console script": (None, "minidl train"),
         "package": ([sys.executable, "-m", "minidl", "train"], "python -m minidl train"),
         "module": ([sys.executable, "-m", "minidl.train"], "python -m minidl.train")}


@pytest.mark.parametrize("door", DOORS)
def test_train_help_and_a_refused_flag_name_the_command_as_invoked(door, tmp_path):
    cmd, name = DOORS[door]
    cmd = cmd or [*_console_script(tmp_path), "train"]
    helped = _run(cmd, "-h")
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith(f"usage: {name} [-h] "), helped.stdout[:200]
    refused = _run(cmd, "-n", "zero")
    assert refused.returncode == 2
    assert refused.stderr.startswith(f"usage: {name} [-h] "), refused.stderr[:200]
    assert f"{name}: error: argument -n" in refused.stderr


@pytest.mark.parametrize("command", ["warmup", "infer", "export", "plot"])
def test_every_command_through_the_dispatcher_names_itself_so_too(tmp_path, command):
    p = _run(_console_script(tmp_path), command, "-h")
    assert p.returncode == 0 and p.stdout.startswith(f"usage: minidl {command} [-h]"), p.stdout[:200]
    p = _run([sys.executable, "-m", f"minidl.{command}"], "-h")
    assert p.returncode == 0 and p.stdout.startswith(f"usage: python -m minidl.{command} [-h]"), p.stdout[:200]


def test_the_dispatcher_forgets_its_door_once_the_command_returns():
    from minidl import cli
    assert cli.prog("train") == "python -m minidl.train"
    with pytest.raises(SystemExit):
        cli.main(["train", "-h"], invoked="python -m minidl")
    assert cli.prog("train") == "python -m minidl.train" and not cli._door
