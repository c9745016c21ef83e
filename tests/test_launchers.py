"""Which launcher started this process (minidl.distributed.launch_from_env): MPI's launchers and
Slurm's srun, read from the environment before MPI is set up; and the one line where MPI did not
join the processes the launcher started (each would otherwise train a run of its own)."""
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from minidl import distributed
from minidl.distributed import Launch

ROOT = pathlib.Path(__file__).resolve().parents[1]
# a task of `srun -N2 --ntasks-per-node=4 ...`: the 7th of 8, the 4th on its node
SRUN = {"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "2",
        "SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_JOB_ID": "4242"}
# the batch script itself (sbatch --ntasks=8): Slurm's job variables, no step
BATCH = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "4242"}


@pytest.mark.parametrize("env,launch", [
    ({}, None),
    (BATCH, None),                                                       # python in the batch script: one process
    (SRUN, Launch(6, 8, 2, "SLURM_PROCID")),
    ({**SRUN, "SLURM_STEP_NUM_TASKS": "4"}, Launch(6, 4, 2, "SLURM_PROCID")),   # the step's tasks, not the job's
    ({k: v for k, v in SRUN.items() if k != "SLURM_STEP_NUM_TASKS"}, Launch(6, 8, 2, "SLURM_PROCID")),
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1"}, Launch(3, 4, 1, "PMI_RANK")),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, Launch(1, 2, None, "OMPI_COMM_WORLD_RANK")),
    ({**SRUN, "PMIX_RANK": "6"}, Launch(6, 8, 2, "PMIX_RANK")),         # srun --mpi=pmix: the size is srun's
    ({"PMIX_RANK": "0"}, Launch(0, None, None, "PMIX_RANK")),            # a launcher that does not say how many
    # mpiexec inside a Slurm job starts its proxies through srun: SLURM_* describe the proxy, PMI_* the rank
    ({**SRUN, "PMI_RANK": "13", "PMI_SIZE": "16", "MPI_LOCALRANKID": "5"}, Launch(13, 16, 5, "PMI_RANK")),
])
def test_the_launch_is_read_from_mpi_launchers_and_srun(env, launch):
    assert distributed.launch_from_env(env) == launch


@pytest.mark.parametrize("env,launched,size", [
    ({}, False, 1), (BATCH, False, 1), (SRUN, True, 8),
    ({**SRUN, "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}, False, 1),   # srun -n1
    ({"PMI_RANK": "0", "PMI_SIZE": "1"}, False, 1), ({"PMI_RANK": "0", "PMI_SIZE": "2"}, True, 2),
    ({"PMIX_RANK": "0"}, True, 1),       # started by a launcher, its number unknown: MPI is set up and tells
])
def test_a_launch_of_several_ranks_sets_up_mpi_and_one_runs_alone(env, launched, size):
    assert distributed.launched_by_mpi(env) is launched
    assert distributed.size_from_env(env) == size


def test_a_launcher_variable_that_is_no_number_is_named():
    with pytest.raises(ValueError, match=r"^the launcher's SLURM_STEP_NUM_TASKS must be a whole number, got 'x'$"):
        distributed.launch_from_env({**SRUN, "SLURM_STEP_NUM_TASKS": "x"})


def test_processes_mpi_did_not_join_are_one_line_naming_the_launcher_and_the_fix():
    assert distributed.not_joined(8, SRUN) is None and distributed.not_joined(1, {}) is None
    assert distributed.not_joined(1, BATCH) is None
    line = distributed.not_joined(1, SRUN)
    assert line.startswith("error: srun started 8 processes, but MPI joined 1: ") and "srun --mpi=pmix" in line
    line = distributed.not_joined(1, {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"})
    assert line == ("error: Open MPI's mpirun started 2 processes, but MPI joined 1: start the ranks with the "
                    "mpiexec of the MPI that mpi4py was built with")


needs_mpi = pytest.mark.skipif(shutil.which("mpiexec") is None or importlib.util.find_spec("mpi4py") is None,
                               reason="needs mpiexec and mpi4py (pip install 'minidl[dist]')")
ENV = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
ENV = {k: v for k, v in ENV.items() if not k.startswith(("PMI_", "OMPI_", "PMIX_", "MV2_", "SLURM_"))}
SHOW = "from minidl import distributed as d; w = d.init(); print(w.rank, w.size, w.local_rank)"


@needs_mpi
@pytest.mark.parametrize("rank,said", [("0", True), ("1", False)])
def test_srun_tasks_mpi_cannot_join_end_with_one_line_from_rank_0(rank, said):
    """srun without a process manager MPI knows: each task is a lone MPI process (a singleton)."""
    env = {**ENV, **SRUN, "SLURM_PROCID": rank}
    p = subprocess.run([sys.executable, "-c", SHOW], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert lines == (["error: srun started 8 processes, but MPI joined 1: give MPI a process manager it knows: "
                      "srun --mpi=pmix (or another of `srun --mpi=list`), or start the ranks with mpiexec"]
                     if said else [])


@needs_mpi
def test_mpiexec_inside_a_slurm_job_takes_mpis_ranks_not_sruns():
    """Hydra under Slurm starts its proxies with srun, whose SLURM_* reach every rank of a host alike."""
    gather = ("from minidl import distributed as d; w = d.init(); "
              "seen = w.comm.gather((w.rank, w.size, w.local_rank)); print(seen if w.main else '', end='')")
    cmd = ["mpiexec", "-n", "2", "env", *(f"{k}={v}" for k, v in SRUN.items()), sys.executable, "-c", gather]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "[(0, 2, 0), (1, 2, 1)]"
