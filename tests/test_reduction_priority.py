"""The reduction stream's priority (kernels/gpu/collectives.py) without a GPU: a stand-in CuPy in a
child process records the stream made, a stand-in driver answers the priority range. The GPU's highest
priority by default, the default one under MINIDL_REDUCE_PRIORITY=normal (the stream was once made with
none, whatever the docs said; then the range was asked of a CuPy call that does not exist)."""
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
import ctypes
def range_of(least, greatest):                # the driver's cuCtxGetStreamPriorityRange on this GPU
    ctypes.cast(least, ctypes.POINTER(ctypes.c_int))[0] = 0          # (least, greatest): CUDA's order
    ctypes.cast(greatest, ctypes.POINTER(ctypes.c_int))[0] = -5
    return 0
real_cdll = ctypes.CDLL
ctypes.CDLL = lambda name, *a, **k: (mock.Mock(cuCtxGetStreamPriorityRange=range_of) if name == "libcuda.so.1"
                                     else real_cdll(name, *a, **k))
from minidl.kernels.gpu.collectives import ReductionStream
ReductionStream()
print(json.dumps(cp.cuda.Stream.call_args.kwargs))
"""


@pytest.mark.parametrize("setting, priority", [(None, -5), ("high", -5), ("normal", 0)])
def test_the_reduction_stream_runs_at_the_gpus_highest_priority_unless_asked_not_to(setting, priority):
    env = {k: v for k, v in os.environ.items() if k != "MINIDL_REDUCE_PRIORITY"}
    env.update(PYTHONPATH=str(ROOT), **({"MINIDL_REDUCE_PRIORITY": setting} if setting else {}))
    p = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.splitlines()[-1]) == {"non_blocking": True, "priority": priority}
