"""Several processes: which rank this is, and the collectives that keep data-parallel ranks in step.

    mpiexec -n N python -m minidl.train ...

MPI starts the ranks and carries control; mpi4py is imported only when the environment says an
MPI launcher started this process as one of several (PMI_RANK, OMPI_COMM_WORLD_RANK, ...), so one
process alone runs exactly as before. Rank r trains on slice r of each global batch of N*b (the
Loader's `rank`/`world`) on the GPU of its local rank, and after backward a `Reducer` averages
the flat gradient buffer over the ranks, in place: MPI Allreduce on the CPU, NCCL on the GPU
(`device.collectives`, minidl/kernels/gpu/nccl.py). N ranks at b then train like one process at N*b.
"""
import os
import sys

# Set by the launchers: MPICH/Hydra and Intel MPI (PMI_*), Open MPI (OMPI_*), PMIx, MVAPICH (MV2_*).
_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


def launched_by_mpi(environ=None):
    """Whether an MPI launcher started this process as one of several ranks (from the environment)."""
    env = os.environ if environ is None else environ
    if not any(v in env for v in _RANK_VARS):
        return False
    size = next((env[v] for v in _SIZE_VARS if v in env), None)
    return size is None or int(size) > 1          # mpiexec -n 1 is one process: no MPI needed


class World:
    """This process among the ranks: `rank` of `size`, `local_rank` on its host, `comm` (mpi4py's or None)."""

    def __init__(self, rank=0, size=1, local_rank=0, comm=None):
        self.rank, self.size, self.local_rank, self.comm = rank, size, local_rank, comm

    @property
    def main(self):
        """Rank 0: the one that prints and saves."""
        return self.rank == 0

    def reducer(self, device):
        """The Reducer of these ranks on `device`, or None for one process (nothing to reduce)."""
        return None if self.size == 1 else Reducer(self, device)

    def first_signal(self, signum):
        """The stop request any rank holds (a signal number, or None), on the host: every rank then
        stops after the same step. One process: signum itself."""
        if self.size == 1:
            return signum
        return self.comm.allreduce(signum or 0, op=_mpi().MAX) or None

    def guard(self, fn):
        """fn, wrapped so that a failing rank ends every rank: it prints one line naming itself
        (`error: rank r: ...`) and aborts the MPI job, so no rank waits forever in a collective.
        One process: fn itself (errors reach the caller as before)."""
        if self.size == 1:
            return fn

        def guarded(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except KeyboardInterrupt:
                _abort(self, f"interrupted: rank {self.rank}", 130)
            except SystemExit as e:          # argparse: every rank sees the same flags, exits alike
                if e.code not in (None, 0):
                    _abort(self, f"error: rank {self.rank}: exit status {e.code}", e.code)
                raise
            except BaseException as e:
                _abort(self, f"error: rank {self.rank}: {e if str(e) else type(e).__name__}", 1)
        return guarded

    def __repr__(self):
        return f"World(rank={self.rank}, size={self.size}, local_rank={self.local_rank})"


def _abort(world, line, code):
    print(line, file=sys.stderr, flush=True)
    world.comm.Abort(code if isinstance(code, int) else 1)


_WORLD = None


def init():
    """The World of this process, made once: MPI's under an MPI launcher with N > 1, else one rank."""
    global _WORLD
    if _WORLD is None:
        _WORLD = _mpi_world() if launched_by_mpi() else World()
    return _WORLD


def _mpi():
    from mpi4py import MPI
    return MPI


def _mpi_world():
    try:
        from mpi4py import MPI
    except ImportError:
        sys.exit("error: started by an MPI launcher, but mpi4py is missing (pip install 'minidl[dist]')")
    comm = MPI.COMM_WORLD
    host = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)     # the ranks on this host
    world = World(comm.rank, comm.size, host.rank, comm)
    host.Free()
    return world


class Reducer:
    """Collectives among the ranks over `device`'s arrays, in place (captured steps keep the buffers).

    The interface TrainStep and Trainer use: `average_grads(grads)` (sum, then x 1/N),
    `all_finite(flag)` (a 0-d bool: AND over the ranks), `average(a)` (BatchNorm's running
    statistics before evaluation and saving), `sum_metrics(metrics)` (a Mean's sums and count).
    On the CPU the arrays are NumPy and go through MPI; on cuda through the device's NCCL
    communicator on the compute stream, where a captured step records the calls.
    """

    def __init__(self, world, device):
        self.world, self.device, self.scale = world, device, 1.0 / world.size
        self.coll = _MPICollectives(world.comm) if device.name == "cpu" else device.collectives(world.comm)

    def average_grads(self, grads):
        """grads <- mean over the ranks of grads: gradients of the global batch's mean loss."""
        self.coll.allreduce(grads, "sum")
        grads *= self.scale

    def all_finite(self, flag):
        """flag <- AND of every rank's flag: a non-finite loss on any rank stops them all."""
        self.coll.allreduce(flag, "and")

    def average(self, a):
        """a <- mean over the ranks of a (per-rank BatchNorm statistics become common ones)."""
        self.coll.allreduce(a, "sum")
        a *= self.scale

    def sum_metrics(self, metrics):
        """A Mean's loss sum, hits and count become the sums over the ranks (so result() is global)."""
        self.coll.allreduce(metrics.loss, "sum")
        self.coll.allreduce(metrics.correct, "sum")
        metrics.count = self.world.comm.allreduce(metrics.count)


class _MPICollectives:
    """In-place MPI all-reduce of NumPy arrays (0-d ones too), the CPU side of the reducer."""

    def __init__(self, comm):
        from mpi4py import MPI
        self.comm, self.MPI = comm, MPI
        self.ops = {"sum": MPI.SUM, "and": MPI.LAND}

    def allreduce(self, a, op):
        self.comm.Allreduce(self.MPI.IN_PLACE, a, op=self.ops[op])
