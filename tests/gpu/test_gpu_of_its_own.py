"""A rank touches its own GPU only: a process on GPU 1 that builds, compiles for and trains a net and
connects an NCCL communicator holds no CUDA context on GPU 0. A rank > 0 held one there (518 MiB, 2
H200s, 2026-11-27): a new thread's current GPU is GPU 0, and leaving `with Device(dev)` in the compile
pool's threads or the communicator's set-up thread made GPU 0 current again, which makes a context
since CUDA 12. Checked in a child process (this one has used GPU 0 already) through the driver's
primary-context state."""
import os
import pathlib
import subprocess
import sys

import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")
pytest.importorskip("mpi4py.MPI")

ROOT = pathlib.Path(__file__).resolve().parents[2]

_CHILD = r"""
import ctypes, sys
import numpy as np
import minidl as dl
from minidl import models, optim

dev = dl.get_device("cuda", gpu=1)
rng = np.random.default_rng(0)
x, y = rng.integers(0, 256, (512, 28, 28), dtype=np.uint8), rng.integers(0, 10, 512)
trainer = dl.Trainer(models.get("lenet", device=dev, seed=0), optim.get("adam", lr=1e-3), progress=False,
                     log=lambda s: None)
trainer.fit((x, y), more_steps=6, batch_size=64)
from minidl.kernels.gpu import _cuda
from minidl.kernels.gpu.collectives import Communicator
from mpi4py import MPI
_cuda.wait()                                       # the compile pool's threads are done too
comm = Communicator(MPI.COMM_SELF)                 # connected in a thread of its own
comm._ready()
comm.close()
cuda = ctypes.CDLL("libcuda.so.1")
active = []
for ordinal in (0, 1):
    device, flags, on = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    assert cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0
    assert cuda.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(on)) == 0
    active.append(on.value)
print(active)
"""


@pytest.mark.skipif(cp.cuda.runtime.getDeviceCount() < 2, reason="needs 2 GPUs")
def test_a_process_on_gpu_1_makes_no_context_on_gpu_0(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    p = subprocess.run([sys.executable, "-c", _CHILD], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "[0, 1]", p.stdout      # GPU 0: none; GPU 1: its own
