"""In-place collectives among data-parallel ranks over NumPy arrays (0-d ones too): MPI through mpi4py,
the CPU twin of kernels/gpu/collectives.py (NCCL). Imported only when several ranks ask for it.

`start` is MPI's non-blocking all-reduce and `wait` completes every one started, so a gradient
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

    def wait(self) -> None:
        """Complete every reduction started."""
        self.waits(self._requests)
        self._requests.clear()
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
