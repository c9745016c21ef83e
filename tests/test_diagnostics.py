"""The library's diagnostics go through logging and warnings, never print (issue 40): silent unless the
application configures logging (a NullHandler on "minidl"), warnings for what the user should act on, and
the command lines show both as the lines they showed before (minidl/cli/output.py)."""
import ast
import logging
import os
import pathlib
import subprocess
import sys
import warnings

import pytest

import minidl
from minidl.cli import output

PKG = pathlib.Path(minidl.__file__).parent
# print is a command line's output: the commands, the bar and preparing line of a run, and what every rank
# of a command line prints while the ranks agree on its flags or just before the job is aborted (the watchdog's
# line naming a hung rank too: the job ends right after it, in Python as on the command line).
PRINTS = {"cli/", "training/progress.py", "distributed/agreement.py", "distributed/__init__.py",
          "distributed/watchdog.py"}


def test_the_library_prints_nothing_outside_the_command_lines():
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in PRINTS):
            continue
        found += [f"{rel}:{n.lineno}" for n in ast.walk(ast.parse(path.read_text()))
                  if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "print"]
    assert not found, "a diagnostic printed: log it (logging.getLogger(__name__)) or warnings.warn it: " + str(found)


def test_the_package_logger_is_silent_unless_the_application_configures_logging(capsys, caplog):
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("minidl").handlers)
    with caplog.at_level(logging.INFO, logger="minidl"):
        minidl.get_device("auto", verbose=True)
    assert capsys.readouterr() == ("", "")                       # nothing printed ...
    record, = [r for r in caplog.records if r.name == "minidl.backend"]
    assert record.levelno == logging.INFO and record.getMessage().startswith("device: ")    # ... but logged
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="minidl"):
        minidl.get_device("auto")
    assert [r.levelno for r in caplog.records if r.name == "minidl.backend"] == [logging.DEBUG]


_SHOWN = """
import logging, warnings
from minidl.cli import output
formatwarning = warnings.formatwarning
with output.shown():
    logging.getLogger("minidl.backend").info("device: cpu (%s)", "why")
    logging.getLogger("minidl.files.metrics_log").warning("m.jsonl: cut short")
    logging.getLogger("minidl.backend").debug("not shown")
    warnings.warn("x is wrong")
assert warnings.formatwarning is formatwarning                # put back: a command run in-process leaves
assert not [h for h in logging.getLogger("minidl").handlers if isinstance(h, output._Lines)]   # no trace
logging.getLogger("minidl.backend").warning("after the command: not shown")
"""


def test_a_command_line_shows_records_and_warnings_as_one_line_each():
    p = subprocess.run([sys.executable, "-c", _SHOWN], cwd=PKG.parent, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(PKG.parent)))
    assert p.returncode == 0, p.stderr
    assert p.stdout == "device: cpu (why)\n"
    assert p.stderr == "warning: m.jsonl: cut short\nwarning: x is wrong\n"


def test_a_test_recording_warnings_still_records_them_under_a_command_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with output.shown():
            warnings.warn("recorded", RuntimeWarning)
    assert [str(w.message) for w in caught] == ["recorded"]


DATA = os.environ.get("MINIDL_DATA")


@pytest.mark.skipif(not (DATA and os.path.isdir(os.path.join(DATA, "mnist"))), reason="needs MNIST under $MINIDL_DATA")
def test_the_train_command_still_says_which_device_auto_chose_and_warns_in_one_line(tmp_path):
    (tmp_path / "m.jsonl").write_text('{"step": 2, "epoch": 0, "loss": 1.0}\n{"step": 4, "ep')
    p = subprocess.run([sys.executable, "-m", "minidl.train", "-n", "2", "-m", "1", "-y", "1", "-x", "100", "--device",
                        "auto", "--metrics", "m.jsonl"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(PKG.parent), OPENBLAS_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr
    assert [line for line in p.stdout.splitlines() if line.startswith("device: ")] == [
        f"device: {minidl.backend._preferred()[0]} ({minidl.backend._preferred()[1]})"]
    assert p.stderr.strip() == ("warning: m.jsonl: its last line was cut short (15 bytes, a run stopped mid-write); "
                                "dropped it")


_UNDER_BAR = """
import io, logging, sys, warnings
from tqdm import tqdm
from minidl.cli import output
err = sys.stderr = io.StringIO()
bar = tqdm(total=10, file=err, leave=False, ncols=60)
bar.update(3)
with output.shown():
    warnings.warn("x is wrong")
    logging.getLogger("minidl.test").warning("y is odd")
bar.close()
sys.__stdout__.write(repr(err.getvalue().split(chr(10))))
"""


def test_a_warning_during_the_progress_bar_gets_a_line_of_its_own():
    p = subprocess.run([sys.executable, "-c", _UNDER_BAR], cwd=PKG.parent, capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=str(PKG.parent)))
    assert p.returncode == 0, p.stderr
    lines = eval(p.stdout)
    # each message starts where the bar's line was cleared (a carriage return), never after the bar's text
    assert any(line.endswith("\rwarning: x is wrong") for line in lines), lines
    assert any(line.endswith("\rwarning: y is odd") for line in lines), lines
