"""The GPU communicator (kernels/gpu/collectives.py) without a GPU: a stand-in CuPy in a child process.

- Its priority: the GPU's highest by default, the default one under MINIDL_REDUCE_PRIORITY=normal (the
  stream was once made with none, whatever the docs said; then the range was asked of a CuPy call that
  does not exist, which a stand-in CuPy answered anyway: the range now comes from a stand-in driver).
- Which stream a bucket's reduction runs on: inside a capture the reduction stream, forked from the
  current stream and joined back; outside one the current stream, in order, with no event (kernels run
  on another stream outside a graph left the process replaying every captured step slower,
  docs/distributed.md).
- Ranks given one GPU: every rank refuses together, naming the two ranks, the GPU and the host, before
  NCCL is asked for anything (it failed at the first collective, in its own words)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

_STAND_IN = """
import ctypes, json, sys
from unittest import mock
for name in ("cupy", "cupy.cuda", "cupy.cuda.nccl"):
    sys.modules[name] = mock.MagicMock(name=name)
cp = sys.modules["cupy"]
cp.cuda.nccl = sys.modules["cupy.cuda.nccl"]
def range_of(least, greatest):                # the driver's cuCtxGetStreamPriorityRange on this GPU
    ctypes.cast(least, ctypes.POINTER(ctypes.c_int))[0] = 0          # (least, greatest): CUDA's order
    ctypes.cast(greatest, ctypes.POINTER(ctypes.c_int))[0] = -5
    return 0
real_cdll = ctypes.CDLL
ctypes.CDLL = lambda name, *a, **k: (mock.Mock(cuCtxGetStreamPriorityRange=range_of) if name == "libcuda.so.1"
                                     else real_cdll(name, *a, **k))
"""

_PRIORITY = _STAND_IN + """
from minidl.kernels.gpu.collectives import ReductionStream
ReductionStream()
print(json.dumps(cp.cuda.Stream.call_args.kwargs))
"""

_FORKS = _STAND_IN + """
current, reduction = mock.MagicMock(name="current"), mock.MagicMock(name="reduction")
current.is_capturing.return_value = sys.argv[1] == "captured"
cp.cuda.get_current_stream.return_value = current
cp.cuda.Stream.return_value = reduction
cp.cuda.Event.side_effect = lambda **kw: mock.MagicMock(name="event")
from minidl.kernels.gpu.collectives import ReductionStream

class Recorded(ReductionStream):
    def _reduce(self, a, op, stream):
        ran.append("current" if stream is current else "reduction" if stream is reduction else repr(stream))

ran, r = [], Recorded()
for step in range(2):
    r.start("bucket 1", "sum"); r.start("bucket 0", "sum"); r.wait()
print(json.dumps({"ran": ran, "events": len(r._forks), "forks_recorded": sum(e.record.call_count for e in r._forks),
                  "reduction_waited": reduction.wait_event.call_count, "joins": r._join.record.call_count,
                  "current_waited": current.wait_event.call_count}))
"""


def _child(code, *args, setting=None):
    env = {k: v for k, v in os.environ.items() if k != "MINIDL_REDUCE_PRIORITY"}
    env.update(PYTHONPATH=str(ROOT), **({"MINIDL_REDUCE_PRIORITY": setting} if setting else {}))
    p = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.splitlines()[-1])


@pytest.mark.parametrize("setting, priority", [(None, -5), ("high", -5), ("normal", 0)])
def test_the_reduction_stream_runs_at_the_gpus_highest_priority_unless_asked_not_to(setting, priority):
    assert _child(_PRIORITY, setting=setting) == {"non_blocking": True, "priority": priority}


@pytest.mark.parametrize("mode, expected", [
    ("eager", {"ran": ["current"] * 4, "events": 2, "forks_recorded": 0, "reduction_waited": 0, "joins": 0,
               "current_waited": 0}),
    ("captured", {"ran": ["reduction"] * 4, "events": 2, "forks_recorded": 4, "reduction_waited": 4, "joins": 2,
                  "current_waited": 2}),
])
def test_a_reduction_forks_to_the_reduction_stream_only_inside_a_capture(mode, expected):
    assert _child(_FORKS, mode) == expected


_SHARED = _STAND_IN + """
from minidl.kernels.gpu import collectives
cp.cuda.Device.return_value.pci_bus_id = "0000:1B:00.0"
import platform
here = {"a": platform.node(), "A": collectives._boot_id()}         # "a", "A": this host's name and boot
class Ranks:                      # rank 1 of three; sys.argv[1]: every rank's (host, boot, GPU), as JSON
    rank, size = 1, 3
    def allgather(self, mine):
        gpus = [tuple(here.get(x, x) for x in g) for g in json.loads(sys.argv[1])]
        assert gpus[self.rank] == mine, (gpus, mine)
        return gpus
    def bcast(self, value, root=0):
        return value
try:
    collectives.Communicator(Ranks())._setup.join()
    said = None
except collectives.SharedGPU as e:
    said = [str(e), e.collective, e.exit_status]
print(json.dumps({"said": said, "nccl_asked": collectives.nccl.NcclCommunicator.called}))
"""


@pytest.mark.parametrize("others, said", [
    ([["a", "A", "0000:1A:00.0"], ["a", "A", "0000:1C:00.0"]], None),
    ([["b", "B", "0000:1B:00.0"], ["c", "C", "0000:1B:00.0"]], None),       # one bus id on other hosts
    ([["a", "B", "0000:1B:00.0"], ["a", "C", "0000:1B:00.0"]], None),       # ... hosts of one name
    ([["a", "A", "0000:1A:00.0"], ["a", "A", "0000:1B:00.0"]], "ranks 1 and 2 share GPU 0000:1B:00.0 on host a"),
    ([["a", "A", "0000:1B:00.0"], ["a", "A", "0000:1B:00.0"]], "ranks 0 and 1 share GPU 0000:1B:00.0 on host a"),
])
def test_ranks_on_one_gpu_are_refused_together_before_nccl(others, said):
    import platform
    out = _child(_SHARED, json.dumps([others[0], ["a", "A", "0000:1B:00.0"], others[1]]))
    if said is None:
        assert out == {"said": None, "nccl_asked": True}
    else:
        line, collective, status = out["said"]
        assert line.startswith(said.replace("host a", f"host {platform.node()}")) and "CUDA_VISIBLE_DEVICES" in line
        assert (collective, status, out["nccl_asked"]) == (True, 1, False)
