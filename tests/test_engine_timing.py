"""kernels/gpu/timing.py's logic without a GPU: a stand-in CuPy (in a child process, so no other test
sees it) records what time_queued asks of the stream (the hold kernel's cycles, the events, the
runs); tests/gpu/test_timing.py times real kernels."""
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

_CHILD = """
import json, sys
from unittest import mock
for name in ("cupy", "cupy.cuda"):
    sys.modules[name] = mock.MagicMock(name=name)
cp = sys.modules["cupy"]
from minidl.kernels.gpu import timing

log, answers = [], json.loads(sys.argv[1])      # per timed attempt: had the GPU reached `start` already?
fail_at = int(sys.argv[2])                      # the call of fn that raises (0: none)


class Event:
    def __init__(self, name):
        self.name = name

    def record(self, stream):
        log.append(self.name)

    def synchronize(self):
        pass

    @property
    def done(self):
        return answers.pop(0) if answers else False


made = []
cp.cuda.Event.side_effect = lambda: made.append(Event("start" if not made else "stop")) or made[-1]
cp.cuda.runtime.getDevice.return_value = 0
cp.cuda.get_current_stream.return_value.ptr = 7
timing._HOLD = type("Hold", (), {"get": lambda self, name: lambda grid, block, args: log.append(int(args[0]))})()
cp.cuda.runtime.streamBeginCapture.side_effect = lambda *a: log.append("begin capture")
cp.cuda.runtime.streamEndCapture.side_effect = lambda *a: log.append("end capture") or 99
cp.cuda.get_elapsed_time.return_value = 5.0
calls = [0]


def fn():
    calls[0] += 1
    if calls[0] == fail_at:
        raise RuntimeError("not capturable")
    log.append("run")


out = []
for _ in range(2):
    log.clear()
    out.append({"ms": timing.time_queued(fn, 10), "log": log[:],
                "cycles_now": timing._clocks[0].cycles})
print(json.dumps(out))
"""


def _run(answers, fail_at=0):
    p = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(answers), str(fail_at)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _attempts(log):
    """The hold's cycles before each timed attempt (each attempt ends with `stop`)."""
    return [item for item in log if isinstance(item, int)]


H = 1 << 18                                                     # timing.HOLD_CYCLES


def test_the_runs_are_queued_behind_the_hold_and_timed_once_the_host_got_there_first():
    first, second = _run([False])
    assert first["ms"] == 0.5                                   # 5 ms between the events over 10 runs
    assert first["log"][:4] == ["run", "begin capture", "run", "end capture"]   # untimed, then captured once
    assert first["log"][4:] == [H, "start"] + ["run"] * 10 + ["stop"]
    assert second["ms"] == 0.5 and _attempts(second["log"]) == [H]


def test_where_the_gpu_got_to_the_first_event_early_the_hold_doubles_and_stays_doubled():
    first, second = _run([True, True, False])
    assert _attempts(first["log"]) == [H, 2 * H, 4 * H]
    assert first["log"].count("stop") == 3 and first["cycles_now"] == 4 * H
    assert _attempts(second["log"]) == [4 * H]                  # the next candidate starts where it ended


def test_the_hold_stops_doubling_at_its_cap():
    first, _ = _run([True] * 20)
    assert _attempts(first["log"]) == [H << k for k in range(11)]      # up to MAX_CYCLES, 1 << 28
    assert first["ms"] == 0.5


def test_what_fails_while_captured_is_no_candidate_and_the_capture_is_ended():
    first, _ = _run([False], fail_at=2)                        # the untimed run passes, the captured one raises
    assert first["ms"] is None
    assert first["log"] == ["run", "begin capture", "end capture"]
