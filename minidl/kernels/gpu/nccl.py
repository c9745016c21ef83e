"""NCCL all-reduce among data-parallel ranks (cupy.cuda.nccl), one GPU per rank, set up over MPI.

UNVERIFIED: written without a GPU to run it on. What DESIGN.md records from 2 H200s (NCCL 2.28.9,
CuPy 14): an all-reduce issued with cupy.cuda.nccl on a capturing CuPy stream is recorded into the
CUDA graph and replays correctly; a process that exits without destroying its communicator hangs.
This is the simple version: one call over the whole flat gradient after backward (no buckets
overlapping backward, no second stream).
"""
import atexit

import cupy as cp
from cupy.cuda import nccl

_OPS = {"sum": nccl.NCCL_SUM, "min": nccl.NCCL_MIN, "max": nccl.NCCL_MAX}
_TYPES = {"float16": nccl.NCCL_FLOAT16, "float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64,
          "int32": nccl.NCCL_INT32, "int64": nccl.NCCL_INT64, "uint8": nccl.NCCL_UINT8}


class Communicator:
    """In-place collectives over CuPy arrays among the ranks of the MPI communicator `mpi_comm`.

    Every rank must have made its GPU current (backend.get_device(gpu=local rank)) before this:
    NCCL binds the communicator to the current device. Creation is collective (all ranks call it).
    """

    def __init__(self, mpi_comm):
        uid = nccl.get_unique_id() if mpi_comm.rank == 0 else None
        uid = mpi_comm.bcast(uid, root=0)           # rank 0's id reaches every rank over MPI
        self.comm = nccl.NcclCommunicator(mpi_comm.size, uid, mpi_comm.rank)
        atexit.register(self.close)                 # a communicator left alive hangs the exit

    def allreduce(self, a, op):
        """a <- op over the ranks of a, on the current stream (recorded when it is capturing).

        op: "sum", "min", "max", or "and" for a bool array (MIN over its bytes, 0 or 1).
        """
        if op == "and":
            a, op = a.view(cp.uint8), "min"
        if not a.flags.c_contiguous:
            raise ValueError(f"NCCL all-reduce needs a contiguous array, got strides {a.strides}")
        stream = cp.cuda.get_current_stream()       # the device's compute stream: cuDNN's too
        self.comm.allReduce(a.data.ptr, a.data.ptr, a.size, _TYPES[a.dtype.name], _OPS[op], stream.ptr)

    def broadcast(self, a, root=0):
        """a <- rank `root`'s a, on the current stream."""
        stream = cp.cuda.get_current_stream()
        self.comm.bcast(a.data.ptr, a.size, _TYPES[a.dtype.name], root, stream.ptr)

    def close(self):
        """Destroy the communicator (once): the ranks then exit without hanging."""
        if self.comm is not None:
            cp.cuda.get_current_stream().synchronize()
            self.comm.destroy()
            self.comm = None
