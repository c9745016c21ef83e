"""In-place collectives among data-parallel ranks over NumPy arrays (0-d ones too): MPI through mpi4py,
the CPU twin of kernels/gpu/collectives.py (NCCL). Imported only when several ranks ask for it.

`start` is MPI's non-blocking all-reduce (`reduce_scatter` and `all_gather` its halves, for a sharded
optimizer: distributed/shard.py) and `wait` completes every one started, so a gradient
bucket is handed to MPI as soon as backward has finished it, as on the GPU. What that buys on
the CPU is small: MPICH moves a non-blocking collective along only inside MPI calls (no progress
thread by default), so most of the work happens in the next `start` or in `wait`. MPI has no
bfloat16, so a reduction `through` a narrower dtype is NCCL's arithmetic for two ranks: each
rank's values rounded to it, summed in float32, the sum rounded again.

Every collective here is non-blocking underneath and completed through `waits`, MPI_Waitall
unless the Reducer gives minidl.distributed's waits, which poll from Python: a rank whose peers
never arrive then still hears SIGTERM and Ctrl-C (MPI's own waits spin in C, deaf to them).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from mpi4py import MPI

from ..._types import Array

_OPS = {"sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX, "and": MPI.LAND}


class Communicator:
    """In-place collectives among the ranks of the MPI communicator `mpi_comm`; op: sum, min, max, and."""

    def __init__(self, mpi_comm: MPI.Comm) -> None:
        self.comm = mpi_comm
        self.waits: Callable[[Sequence[MPI.Request]], object] = MPI.Request.Waitall     # completes requests
        self._requests: list[MPI.Request] = []
        self._narrowed: list[tuple[Array, Array]] = []             # (a, wire): sums to round to wire's dtype at wait()
        self._landed: list[tuple[Array, Array]] = []               # (a's chunk, the reduce-scatter's result) for wait()

    def allreduce(self, a: Array, op: str) -> None:
        """a <- op over the ranks of a, now."""
        self.waits([self.comm.Iallreduce(MPI.IN_PLACE, a, op=_OPS[op])])

    def start(self, a: Array, op: str, wire: Array | None = None) -> None:
        """a <- op over the ranks of a, begun now; `a` is not to be touched until wait(). `wire`: a's
        size in a narrower dtype, which the values and the sum are rounded to (the GPU's wire)."""
        if wire is not None:
            _round(a, wire)
            self._narrowed.append((a, wire))
        self._requests.append(self.comm.Iallreduce(MPI.IN_PLACE, a, op=_OPS[op]))

    def reduce_scatter(self, a: Array, op: str, wire: Array | None = None) -> None:
        """This rank's chunk of a (a cut into `size` equal chunks, chunk r rank r's) <- op over the ranks
        of that chunk, begun now; the other chunks keep this rank's values. `wire`: as start's."""
        n, r = a.size // self.comm.size, self.comm.rank
        if wire is not None:
            _round(a, wire)
        out = np.empty(n, a.dtype)              # MPI writes a rank's chunk at the buffer's start: moved at wait()
        self._requests.append(self.comm.Ireduce_scatter_block(a, out, op=_OPS[op]))
        self._landed.append((a[r * n:(r + 1) * n], out))
        if wire is not None:
            self._narrowed.append((a[r * n:(r + 1) * n], wire[r * n:(r + 1) * n]))

    def all_gather(self, a: Array) -> None:
        """Every chunk of a (as reduce_scatter cuts it) <- its rank's, begun now."""
        self._requests.append(self.comm.Iallgather(MPI.IN_PLACE, a))

    def wait(self) -> None:
        """Complete every collective started."""
        self.waits(self._requests)
        self._requests.clear()
        for chunk, out in self._landed:
            np.copyto(chunk, out)
        self._landed.clear()
        for a, wire in self._narrowed:
            _round(a, wire)
        self._narrowed.clear()

    def broadcast(self, a: Array, root: int = 0) -> None:
        """a <- rank `root`'s a."""
        self.waits([self.comm.Ibcast(a, root=root)])

    def close(self) -> None:
        self.wait()


def _round(a: Array, wire: Array) -> None:
    """a <- a rounded to wire's dtype (to nearest even), through wire."""
    np.copyto(wire, a, casting="unsafe")
    np.copyto(a, wire, casting="unsafe")
