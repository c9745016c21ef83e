"""In-place collectives among data-parallel ranks over CuPy arrays: NCCL (cupy.cuda.nccl), one GPU per
rank, set up over MPI. The CPU twin, kernels/cpu/collectives.py, goes through MPI.

`allreduce` runs on the current (compute) stream, in order with everything else. `start` (and
`reduce_scatter` and `all_gather`, the sharded optimizer's halves of the all-reduce: distributed/shard.py)
inside a CUDA stream capture runs on a second stream, the reduction stream, after the work queued so
far on the compute stream (an event recorded there, which the reduction stream waits for: the capture
forks into it), so backward goes on while the buckets of the last layers' gradients are summed; `wait`
makes the compute stream wait for all that was started (an event recorded on the reduction stream:
the capture joins back), so the update that follows reads the sums, and the captured step holds the
work of both streams in one graph. Outside a capture (the warm-up step, an uncaptured run) they run
on the compute stream in order: kernels run on another stream outside a graph leave the process
replaying every graph slower (`_fork`). Every rank issues the same collectives in the same order.

The reduction stream has the device's highest priority, so the GPU may give the all-reduce's
blocks the SMs that backward's kernels free rather than queue it behind them ($MINIDL_REDUCE_PRIORITY
=normal: the default priority, for comparison; what it measures is in docs/distributed.md).
A `wire` array of a narrower dtype (bfloat16) makes a reduction travel in it: the bucket is rounded
into it, summed there, and widened back, halving the bytes sent.

NCCL's communicator destroy waits for every CUDA graph that recorded its collectives to be
destroyed, so `close` releases the captured graphs first; a process that exits with its
communicator alive hangs. tests/gpu/test_distributed.py checks the fork/join of the two streams
on one GPU, eager and captured, and two ranks against one GPU on two.
"""
from __future__ import annotations

import atexit
import ctypes
import gc
import os
import platform
import threading
from typing import TYPE_CHECKING

import cupy as cp
from cupy.cuda import nccl

from ..._types import Array
from . import capture
from .cast import cast_copy

if TYPE_CHECKING:
    from mpi4py import MPI

_OPS = {"sum": nccl.NCCL_SUM, "min": nccl.NCCL_MIN, "max": nccl.NCCL_MAX}
_TYPES = {"float16": nccl.NCCL_FLOAT16, "float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64,
          "int32": nccl.NCCL_INT32, "int64": nccl.NCCL_INT64, "uint8": nccl.NCCL_UINT8,
          "bfloat16": getattr(nccl, "NCCL_BFLOAT16", 9)}      # ncclBfloat16 (NCCL >= 2.10), not named by CuPy


def _priority():
    """The highest stream priority of the current GPU (CUDA: lower numbers run first), or 0."""
    if os.environ.get("MINIDL_REDUCE_PRIORITY", "high") == "normal":
        return 0
    cp.cuda.runtime.free(0)              # makes the current GPU's context, which the driver reads
    least, greatest = ctypes.c_int(), ctypes.c_int()
    err = ctypes.CDLL("libcuda.so.1").cuCtxGetStreamPriorityRange(ctypes.byref(least), ctypes.byref(greatest))
    if err:                              # CuPy names no such runtime call: the driver's, through ctypes
        raise RuntimeError(f"cuCtxGetStreamPriorityRange failed (CUresult {err})")
    return greatest.value


class ReductionStream:
    """`start(a, op)` / `wait()`: in-place reductions on a second stream, forked from the current
    stream and joined back to it. Subclasses give `_reduce(a, op, stream)`, the collective itself."""

    def __init__(self):
        self.stream = cp.cuda.Stream(non_blocking=True, priority=_priority())
        self._forks = []                 # one event per reduction in flight, reused step after step
        self._join = cp.cuda.Event(disable_timing=True)
        self._in_flight = 0
        self._forked = False             # a reduction of this step went to the reduction stream

    def start(self, a: Array, op: str, wire: Array | None = None) -> None:
        """a <- op over the ranks of a, on the reduction stream once the current stream's queued work is
        done; through `wire` (a's size, a narrower dtype) when given: rounded, reduced there, widened."""
        stream = self._fork()
        if wire is None:
            self._reduce(a, op, stream)
            return
        with stream:
            cast_copy(wire, a)
        self._reduce(wire, op, stream)
        with stream:
            cp.copyto(a, wire, casting="unsafe")

    def _fork(self) -> cp.cuda.Stream:
        """The stream the next reduction runs on. Inside a capture: the reduction stream, after the current
        stream's queued work. Outside one: the current stream itself, in order, as `allreduce`: a process
        whose other streams ran kernels outside a graph replays every captured step slower for the rest
        of its life, which the reduction stream's uncaptured all-reduces did to every rank
        (docs/distributed.md); a captured fork does not."""
        if self._in_flight == len(self._forks):          # made in the warm-up run, before any capture
            self._forks.append(cp.cuda.Event(disable_timing=True))
        fork = self._forks[self._in_flight]
        self._in_flight += 1
        current = cp.cuda.get_current_stream()
        if not current.is_capturing():
            return current
        self._forked = True
        fork.record(current)
        self.stream.wait_event(fork)
        return self.stream

    def wait(self) -> None:
        """The current stream's next work starts after every reduction started (none forked: no-op)."""
        if self._forked:
            self._join.record(self.stream)
            cp.cuda.get_current_stream().wait_event(self._join)
        self._in_flight, self._forked = 0, False

    def _reduce(self, a, op, stream):
        raise NotImplementedError


class SharedGPU(ValueError):
    """Two ranks were given one GPU, which NCCL refuses at the first collective in its own words; every
    rank raises it together, from the same gathered list (distributed.World.guard: rank 0 says it)."""
    collective, exit_status = True, 1


def one_gpu_each(gpus: list[tuple[str, str, str]]) -> None:
    """gpus: each rank's (host name, boot id, GPU PCI bus id), rank by rank: a host is its name and its boot,
    as NCCL tells hosts apart (two hosts' containers may share a name; their bus ids often repeat).
    SharedGPU naming the first two ranks on one GPU: a launcher that shows one GPU to ranks that each take
    the first they see (CUDA_VISIBLE_DEVICES=0 exported to `mpiexec -n 2`)."""
    first: dict[tuple[str, str, str], int] = {}
    for rank, gpu in enumerate(gpus):
        if gpu in first:
            raise SharedGPU(f"ranks {first[gpu]} and {rank} share GPU {gpu[2]} on host {gpu[0]}, and NCCL needs a GPU "
                            "for each rank: show every rank its host's GPUs, or each rank one of its own "
                            "(CUDA_VISIBLE_DEVICES)")
        first[gpu] = rank


def _boot_id() -> str:
    """This boot of this host's kernel (Linux), or '' where it cannot be read."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


class Communicator(ReductionStream):
    """In-place collectives over CuPy arrays among the ranks of the MPI communicator `mpi_comm`.

    Every rank must have made its GPU current (backend.get_device(gpu=local rank)) before this:
    NCCL binds the communicator to the current device, a GPU no other rank has (`one_gpu_each`).
    Creation is collective (all ranks call it).
    op: "sum", "min", "max", or "and" for a bool array (MIN over its bytes, 0 or 1).
    """

    def __init__(self, mpi_comm: MPI.Comm) -> None:
        one_gpu_each(mpi_comm.allgather((platform.node(), _boot_id(), cp.cuda.Device().pci_bus_id)))
        uid = nccl.get_unique_id() if mpi_comm.rank == 0 else None
        uid = mpi_comm.bcast(uid, root=0)           # rank 0's id reaches every rank over MPI
        super().__init__()
        self.rank, self.size = mpi_comm.rank, mpi_comm.size
        self.comm: nccl.NcclCommunicator | None = None
        self.closed = False                         # close() destroyed it: a World makes another
        self._setup_error: BaseException | None = None
        self._setup = threading.Thread(target=self._connect, args=(mpi_comm.size, uid, mpi_comm.rank,
                                                                   cp.cuda.Device().id), daemon=True)
        self._setup.start()
        atexit.register(self.close)                 # a communicator left alive hangs the exit

    def _connect(self, size, uid, rank, dev):
        """Create the communicator and run one small all-reduce, in a thread of its own: NCCL connects
        the ranks at their first collective, and both together took 1-3 s of a cold start, which the
        model's build and the first step's compiles now cover (docs/cold-start.md). Its one kernel runs on
        the reduction stream outside a graph, the only such: one left the step as it was where ten slowed
        it (docs/distributed.md), and the compute stream may be capturing in the main thread meanwhile."""
        try:
            cp.cuda.runtime.setDevice(dev)          # not `with Device(dev)`, whose exit would make this
            self.comm = nccl.NcclCommunicator(size, uid, rank)     # thread's GPU 0 current: a context there
            with self.stream:                       # not this thread's legacy stream (docs/results.md)
                one = cp.zeros(1, cp.float32)
            self.comm.allReduce(one.data.ptr, one.data.ptr, 1, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, self.stream.ptr)
            self.stream.synchronize()
        except BaseException as e:                  # noqa: BLE001  raised where the communicator is first used
            self._setup_error = e

    def _ready(self):
        """The communicator, once its set-up thread is done (its error, if it failed)."""
        if self._setup.is_alive():
            self._setup.join()
        if self._setup_error is not None:
            raise self._setup_error
        return self.comm

    def allreduce(self, a: Array, op: str) -> None:
        """a <- op over the ranks of a, on the current stream (recorded when it is capturing)."""
        self._reduce(a, op, cp.cuda.get_current_stream())

    def _reduce(self, a, op, stream):
        if a.size == 0:                             # a model without BatchNorm: no running statistics
            return
        if op == "and":
            a, op = a.view(cp.uint8), "min"
        if not a.flags.c_contiguous:
            raise ValueError(f"NCCL all-reduce needs a contiguous array, got strides {a.strides}")
        self._ready().allReduce(a.data.ptr, a.data.ptr, a.size, _TYPES[a.dtype.name], _OPS[op], stream.ptr)

    def reduce_scatter(self, a: Array, op: str, wire: Array | None = None) -> None:
        """This rank's chunk of a (a cut into `size` equal chunks, chunk r rank r's) <- op over the ranks of
        that chunk, in place (NCCL's in-place layout), on the reduction stream as `start`; the other chunks
        keep this rank's values. `wire`: as start's (the bucket rounded into it, the chunk widened back)."""
        stream = self._fork()
        src = a if wire is None else wire
        n, r = a.size // self.size, self.rank
        if wire is not None:
            with stream:
                cast_copy(wire, a)
        self._ready().reduceScatter(src.data.ptr, src[r * n:].data.ptr, n, _TYPES[src.dtype.name], _OPS[op],
                                    stream.ptr)
        if wire is not None:
            with stream:
                cp.copyto(a[r * n:(r + 1) * n], wire[r * n:(r + 1) * n], casting="unsafe")

    def all_gather(self, a: Array) -> None:
        """Every chunk of a (as reduce_scatter cuts it) <- its rank's, in place, on the reduction stream
        after the current stream's queued work (the update of this rank's chunk); wait() joins it back."""
        stream = self._fork()
        n, r = a.size // self.size, self.rank
        self._ready().allGather(a[r * n:].data.ptr, a.data.ptr, n, _TYPES[a.dtype.name], stream.ptr)

    def broadcast(self, a: Array, root: int = 0) -> None:
        """a <- rank `root`'s a, on the current stream."""
        stream = cp.cuda.get_current_stream()
        self._ready().bcast(a.data.ptr, a.size, _TYPES[a.dtype.name], root, stream.ptr)

    def close(self) -> None:
        """Destroy the communicator (once), its work done: the ranks then exit without hanging.

        NCCL's destroy waits until every CUDA graph that recorded this communicator's collectives is
        destroyed (NCCL 2.28's commDestroySync counts them), so the graphs go first: release_all(),
        and a collection for any held only by reference cycles. Captured steps cannot replay after."""
        self._setup.join()
        self.closed = True
        if self.comm is not None:
            self.stream.synchronize()
            cp.cuda.get_current_stream().synchronize()
            capture.release_all()
            gc.collect()
            self.comm.destroy()
            self.comm = None
