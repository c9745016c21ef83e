"""Which stream a bucket's reduction runs on (kernels/gpu/collectives.py), without a GPU: a stand-in CuPy in
a child process. Inside a capture the reduction stream, forked from the current stream and joined back;
outside one the current stream, in order, with no event: kernels run on another stream outside a graph
left the process replaying every captured step slower (docs/distributed.md)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

_CHILD = """
import json, sys
from unittest import mock
for name in ("cupy", "cupy.cuda", "cupy.cuda.nccl"):
    sys.modules[name] = mock.MagicMock(name=name)
cp = sys.modules["cupy"]
cp.cuda.nccl = sys.modules["cupy.cuda.nccl"]
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


@pytest.mark.parametrize("mode, expected", [
    ("eager", {"ran": ["current"] * 4, "events": 2, "forks_recorded": 0, "reduction_waited": 0, "joins": 0,
               "current_waited": 0}),
    ("captured", {"ran": ["reduction"] * 4, "events": 2, "forks_recorded": 4, "reduction_waited": 4, "joins": 2,
                  "current_waited": 2}),
])
def test_a_reduction_forks_to_the_reduction_stream_only_inside_a_capture(mode, expected):
    env = dict(os.environ, PYTHONPATH=str(ROOT), MINIDL_REDUCE_PRIORITY="normal")
    p = subprocess.run([sys.executable, "-c", _CHILD, mode], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.splitlines()[-1]) == expected
