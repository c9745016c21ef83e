"""Which launcher started this process, read from the environment before MPI is set up.

MPI's launchers (mpiexec of MPICH and Intel MPI, Open MPI's mpirun, MVAPICH, PMIx) and Slurm's srun
each set variables in the processes they start: this process's rank, their number, its rank on its
host. `launched_by_mpi` decides whether MPI is set up at all (one process alone never imports
mpi4py), `size_from_env` gives the number of ranks before it is, and `not_joined` is the one line
for processes the launcher started but MPI did not join (each would train a run of its own).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

# The variables a launcher sets in each process it starts: (rank, size, local rank), in the order
# trusted. MPI's launchers come first: MPICH/Hydra and Intel MPI, Open MPI, MVAPICH, then PMIx, whose
# processes (srun --mpi=pmix) learn their number from Slurm. Slurm's srun comes last: an mpiexec inside
# a Slurm job starts its proxies through srun, and SLURM_* then describe the proxies, one a host.
_MPI_VARS = (("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
             ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
             ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK"),
             ("PMIX_RANK", None, None))
# srun sets SLURM_STEP_ID and SLURM_STEP_NUM_TASKS in the tasks of a step; a batch script itself has
# SLURM_PROCID=0 and the job's SLURM_NTASKS but no step: a `python` there is one process.
_SLURM_VARS = ("SLURM_PROCID", ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"), "SLURM_LOCALID")
_SLURM_STEP = ("SLURM_STEP_ID", "SLURM_STEPID")
_LAUNCHER = {"PMI_RANK": "mpiexec", "OMPI_COMM_WORLD_RANK": "Open MPI's mpirun",     # the rank's variable -> who set it
             "MV2_COMM_WORLD_RANK": "MVAPICH's mpirun", "PMIX_RANK": "a PMIx launcher", "SLURM_PROCID": "srun"}


class Launch(NamedTuple):
    """How a launcher started this process: `rank` of `size` (None where it does not say),
    `local_rank` on its host (None where it does not say) and `by`, the variable that gave the rank."""
    rank: int
    size: int | None
    local_rank: int | None
    by: str


def _number(env: Mapping[str, str], var: str | None) -> int | None:
    if var is None or var not in env:
        return None
    try:
        return int(env[var])
    except ValueError:
        raise ValueError(f"the launcher's {var} must be a whole number, got {env[var]!r}") from None


def launch_from_env(environ: Mapping[str, str] | None = None) -> Launch | None:
    """The launch the environment describes (MPI's launchers, or Slurm's srun), or None: no launcher."""
    env = os.environ if environ is None else environ
    slurm_step = "SLURM_PROCID" in env and any(v in env for v in _SLURM_STEP)
    slurm_size = next((_number(env, v) for v in _SLURM_VARS[1] if v in env), None) if slurm_step else None
    for rank_var, size_var, local_var in _MPI_VARS:
        if rank_var in env:
            size, local = _number(env, size_var), _number(env, local_var)
            if size_var is None:         # PMIx: the number and the local rank are the other launchers' (srun's)
                size = next((_number(env, s) for _, s, _ in _MPI_VARS if s and s in env), slurm_size)
                local = _number(env, _SLURM_VARS[2]) if slurm_step else None
            return Launch(_number(env, rank_var) or 0, size, local, rank_var)
    if slurm_step:
        return Launch(_number(env, "SLURM_PROCID") or 0, slurm_size, _number(env, "SLURM_LOCALID"), "SLURM_PROCID")
    return None


def launched_by_mpi(environ: Mapping[str, str] | None = None) -> bool:
    """Whether a launcher (MPI's, or Slurm's srun) started this process as one of several ranks."""
    launch = launch_from_env(environ)
    return launch is not None and (launch.size is None or launch.size > 1)   # mpiexec -n 1: no MPI needed


def size_from_env(environ: Mapping[str, str] | None = None) -> int:
    """The number of ranks the launcher started (1 without one, or where it does not say), read before
    MPI is set up."""
    launch = launch_from_env(environ)
    if launch is None or launch.size is None:
        return 1
    return launch.size


def not_joined(mpi_size: int, environ: Mapping[str, str] | None = None) -> str | None:
    """The line saying that MPI did not join the processes the launcher started (mpi4py's MPI is not
    the launcher's, or srun gave MPI no process manager: each process then thinks it is alone and
    would train a run of its own), or None where it did."""
    launch = launch_from_env(environ)
    if launch is None or launch.size is None or launch.size == mpi_size:
        return None
    how = ("give MPI a process manager it knows: srun --mpi=pmix (or another of `srun --mpi=list`), or start the "
           "ranks with mpiexec" if launch.by in ("SLURM_PROCID", "PMIX_RANK") else
           "start the ranks with the mpiexec of the MPI that mpi4py was built with")
    return f"error: {_LAUNCHER[launch.by]} started {launch.size} processes, but MPI joined {mpi_size}: {how}"
