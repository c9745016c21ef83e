"""A rank that dies, hangs or falls behind on two GPUs (issue 41; the CPU's twin is
tests/test_distributed_faults.py): one minidl line naming the rank, its step and the last good
checkpoint, exit status non-zero within 10 s of the fault; a slower rank one warning; a normal run
with slow saves none. The fault comes from tests/helpers/faults.py; the launcher from $MINIDL_MPIEXEC
(Open MPI's mpirun on the GPU machines: it ends the other ranks 1-2 s after a death and does not wait
for the sentinels, which speak 0.3 s after it).

    NCCL_NVLS_ENABLE=0 MINIDL_MPIEXEC="mpirun --allow-run-as-root" \
        python -m pytest -q -s tests/gpu/test_distributed_faults.py
"""
import os
import pathlib
import re
import shlex
import subprocess
import sys
import time

import pytest
from tests.helpers import mpi_ranks

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")
pytest.importorskip("mpi4py.MPI")

ROOT = pathlib.Path(__file__).resolve().parents[2]
FAULTS = ROOT / "tests" / "helpers" / "faults.py"


_gpus = mpi_ranks.gpu_count


pytestmark = [pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs"),
              pytest.mark.skipif(not os.environ.get("MINIDL_DATA"), reason="MINIDL_DATA (real MNIST) is not set")]
TRAIN = ["-n", "100000", "-m", "10", "-b", "16", "--save-every", "20", "-x", "100", "-y", "1"]


def faulty(tmp_path, fault, rank, step, *args, env=None):
    """The launcher's 2 ranks of python -m minidl.train ARGS on the GPUs, rank `rank` doing `fault` after
    step `step` -> (process, stderr's minidl lines, seconds from the fault to the job's end)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               NCCL_NVLS_ENABLE="0", FAULT_NOTE=str(tmp_path / "n"), **(env or {}))
    cmd = shlex.split(os.environ.get("MINIDL_MPIEXEC", "mpiexec")) + ["-n", "2", sys.executable, str(FAULTS),
                                                                       fault, str(rank), str(step), "train",
                                                                       *map(str, args)]
    t0 = time.time()
    p = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    note = tmp_path / "n.killed"
    since = float(note.read_text()) if note.exists() else t0
    return p, [line for line in p.stderr.splitlines() if line.startswith("minidl:")], time.time() - since


def test_two_gpus_a_rank_killed_is_named_with_its_step_and_the_last_checkpoint(tmp_path):
    p, said, seconds = faulty(tmp_path, "kill", 1, 30, *TRAIN, "--checkpoint", tmp_path / "ck.npz")
    print(f"killed: the job ended {seconds:.2f} s after the kill; {said}")
    assert p.returncode != 0 and seconds < 10, p.stderr[-3000:]
    assert len(said) == 1 and said[0].startswith("minidl: rank 1 died after step 30 ("), p.stderr[-3000:]
    assert said[0].endswith(f"last good checkpoint: {tmp_path / 'ck.npz'} at step 20")


def test_two_gpus_a_rank_that_sleeps_for_ever_is_named_and_the_job_ends(tmp_path):
    p, said, seconds = faulty(tmp_path, "hang", 1, 30, *TRAIN, "--checkpoint", tmp_path / "ck.npz")
    print(f"hung: the job ended {seconds:.2f} s after the hang; {said}")
    assert p.returncode != 0 and seconds < 10, p.stderr[-3000:]
    assert len(said) == 1 and said[0].startswith("minidl: rank 1 stopped answering after step 30 ("), \
        p.stderr[-3000:]
    assert said[0].endswith(f"last good checkpoint: {tmp_path / 'ck.npz'} at step 20")


def test_two_gpus_a_rank_slower_each_step_is_named_once(tmp_path):
    p, said, _ = faulty(tmp_path, "slow:30", 1, 5, "-n", "600", "-m", "100", "-b", "16", "-x", "100", "-y", "1")
    said = [line for line in p.stderr.splitlines() if "slower than the others" in line]
    print(said)
    assert p.returncode == 0, p.stderr[-3000:]
    assert len(said) == 1 and re.fullmatch(r"warning: rank 1 is \d+\.\dx slower than the others \(\d+ ms a "
                                           r"step against \d+\)", said[0]), p.stderr[-3000:]


def test_two_gpus_a_normal_run_with_slow_saves_says_none_of_it(tmp_path):
    """The first step (compiling, capturing) and saves 4 s long at MINIDL_WATCHDOG_S=2 are no hang."""
    p, said, _ = faulty(tmp_path, "slowsave:4", 0, 0, "-n", "450", "-m", "150", "-b", "16", "--save-every", "200",
                        "-x", "100", "-y", "1", "--checkpoint", tmp_path / "ck.npz", env={"MINIDL_WATCHDOG_S": "2"})
    assert p.returncode == 0 and said == [] and "slower than the others" not in p.stderr, p.stderr[-3000:]
