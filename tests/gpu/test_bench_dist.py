"""bench_dist's minidl worker on two GPUs (skipped with fewer): in one launch, the step with its
collectives, the step with them skipped, the sharded optimizer's step (where the Trainer has it), each
rank training alone, and the collectives alone captured in a CUDA graph (all-reduce over the wire's
bytes in the step's buckets; reduce-scatter + all-gather), for a float32 and a bfloat16 wire.

    NCCL_NVLS_ENABLE=0 MINIDL_MPIEXEC="mpirun --allow-run-as-root" python -m pytest -q tests/gpu/test_bench_dist.py
"""
import json
import os
import pathlib
import shlex
import subprocess
import sys

import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")
pytest.importorskip("mpi4py.MPI")

from benchmarks import dist_worker  # noqa: E402
from tests.helpers import mpi_ranks  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


_gpus = mpi_ranks.gpu_count


@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("wire", ["fp32", "bf16"])
def test_two_gpus_measure_the_step_with_and_without_collectives_and_the_collectives_alone(wire):
    from minidl import data
    try:
        data.mnist("train", download=False)
    except data.DataError:
        pytest.skip("MNIST is not on this machine (MINIDL_DATA)")
    launcher = shlex.split(os.environ.get("MINIDL_MPIEXEC", "mpiexec"))
    cmd = launcher + ["-n", "2", sys.executable, dist_worker.__file__, "minidl", "lenet-b256", "--steps",
                      "5", "--warmup", "3", "--precision", "bf16", "--grad-reduce", wire,
                      "--variants", "reduce", "none", "shard", "lone"]
    path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))     # the device's too (cuDNN FE)
    env = dict(os.environ, PYTHONPATH=path, NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0"))
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    with_, without, shard, lone = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert lone["lone"] and len(lone["ms_ranks"]) == 2 and min(lone["ms_ranks"]) > 0     # each GPU alone
    assert with_["collectives"] and not without["collectives"]
    assert with_.get("alone_how") == "graph", with_.get("alone_error") or with_.get("alone_how")
    assert 0 < with_["allreduce_ms"] < 5 and 0 < with_["rs_ag_ms"] < 5       # LeNet's 0.24 MiB over NVLink
    assert with_["wire_mib"] == pytest.approx(without["wire_mib"]) and with_["buckets"] == 1
    assert with_["wire_mib"] == pytest.approx(0.2368 / (2 if wire == "bf16" else 1), rel=1e-3)
    assert with_["ms_step"] > 0 and without["ms_step"] > 0
    if dist_worker.has_shard_optimizer():
        assert shard["shard"] and shard["ms_step"] > 0
    else:
        assert shard["skipped"] == dist_worker.NO_SHARD
