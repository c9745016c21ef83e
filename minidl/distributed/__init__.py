"""Several processes: which rank this is, and the collectives that keep data-parallel ranks in step.

    mpiexec -n N python -m minidl.train ...

MPI starts the ranks and carries control; mpi4py is imported only when the environment says an
MPI launcher started this process as one of several (PMI_RANK, OMPI_COMM_WORLD_RANK, ...), so one
process alone runs exactly as before. Rank r trains on slice r of each global batch of N*b (the
Loader's `rank`/`world`) on the GPU of its local rank. A `Reducer` sums the flat gradient arena
over the ranks in buckets while backward runs (minidl.distributed.buckets) through the World's communicator
on the device, one a process (`World.communicator`: MPI on the CPU, NCCL on the GPU), and the update multiplies by
1/N (its grad_scale): N ranks at b then train like one process at N*b (sharded: shard.py). Stop requests are agreed
one step late, with no blocking collective per step (World.agree_stop).

Before a run the ranks agree on its flags (agreement.py); a Trainer starts every rank from rank 0's
weights (Reducer.start_alike); host waits poll, so a rank waiting for others still hears SIGTERM (waits.py).
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from .._types import Array
from . import heartbeat, shard as sharding, waits, watchdog  # noqa: F401 (heartbeat: the phases the trainer declares)
from .agreement import RanksDisagree, agree, parse_agreed  # noqa: F401 (the package's: before a run)
from .buckets import GradientBuckets, bucket_mib_from_env, check_cap, tail_mib_from_env
from .launch import Launch, launch_from_env, launched_by_mpi, not_joined, size_from_env  # noqa: F401 (before MPI)

if TYPE_CHECKING:
    from ..backend import Device
    from ..graph.model import Model
    from ..layers.base import Layer
    from ..metrics import Mean

_T = TypeVar("_T")

GRAD_REDUCE = ("fp32", "bf16")     # the dtype gradients travel in between the ranks

class World:
    """This process among the ranks: `rank` of `size`, `local_rank` on its host, `comm` (mpi4py's or None),
    `host` (the communicator of this host's ranks, or None)."""

    def __init__(self, rank: int = 0, size: int = 1, local_rank: int = 0, comm: Any = None, host: Any = None) -> None:
        self.rank, self.size, self.local_rank, self.comm, self.host = rank, size, local_rank, comm, host
        self._vote: tuple[Any, Array, Array] | None = None     # the stop vote in flight: (MPI request, sent, received)
        self._colls: dict[str, Any] = {}                       # backend name -> its communicator, made once

    @property
    def main(self) -> bool:
        """Rank 0: the one that prints and saves."""
        return self.rank == 0

    def host_first(self, fn: Callable[[], _T]) -> _T:
        """fn() on this host's first rank, then on its others: what the first fetches (a dataset's
        download) the others then find, so a host downloads once and no two ranks write one file."""
        if self.host is None or self.host.size == 1:
            return fn()
        if self.local_rank == 0:
            try:
                return fn()
            finally:
                self.host.Barrier()
        self.host.Barrier()
        return fn()

    def global_batch(self, batch_size: int, resumed: int | None = None) -> int:
        """The images a step takes over all ranks. A run resumed from a checkpoint trained on
        `resumed` images a step must keep that number, over any number of ranks."""
        total = batch_size * self.size
        if resumed is not None and total != resumed:
            fix = f"batch_size={resumed // self.size}" if resumed % self.size == 0 else f"ranks dividing {resumed}"
            raise ValueError(f"fit: the checkpoint's run trained on batches of {resumed} images; batch_size "
                             f"{batch_size} x {self.size} rank{'s' * (self.size > 1)} is {total}: use {fix}")
        return total

    def reducer(self, device: Device, bucket_mib: float | None = None, grad_reduce: str = "fp32",
                stop_asked: Callable[[], int | None] | None = None, shard: bool = False) -> Reducer | None:
        """The Reducer of these ranks on `device`, or None for one process (nothing to reduce); the ranks'
        watchdog starts with the first (distributed.watchdog: a rank that dies, hangs or falls behind is named)."""
        watchdog.start(self)
        return None if self.size == 1 else Reducer(self, device, bucket_mib, grad_reduce=grad_reduce,
                                                   stop_asked=stop_asked, shard=shard)

    def communicator(self, device: Device) -> Any:
        """The collectives of these ranks over `device`'s arrays (device.communicator), made at the first
        call, which every rank makes alike, and kept for the process: every Reducer of the process uses
        it, as every DDP model of a PyTorch process uses its process group. One made per Reducer
        connected the ranks again for each Trainer (NCCL: 1-3 s) and kept every one of them, with its
        buffers, until the process ended. A communicator closed since (`closed`) is made again."""
        coll = self._colls.get(device.name)
        if coll is None or getattr(coll, "closed", False):
            coll = self._colls[device.name] = device.communicator(self.comm)
        return coll

    def wait_all(self, requests: list[Any], asked: Callable[[], int | None] | None = None) -> None:
        """Complete MPI `requests`, hearing signals meanwhile (distributed.waits): `asked()` gives a
        stop request; once one is asked, STOP_GRACE_S more seconds of waiting end the job."""
        waits.wait_all(requests, asked, self._stuck)

    def _stuck(self, signum, seconds):
        import signal
        name = signal.Signals(signum).name
        _abort(self, f"{name}: rank {self.rank} waited {seconds:.0f} s for the other ranks in a collective they "
                     f"did not reach (ranks out of step): the job ends, nothing saved", 128 + signum)

    def agree_stop(self, signum: int | None, final: bool = False) -> int | None:
        """The stop request the ranks agree on (a signal number, or None), the same on every rank at
        the same call. One process: signum itself.

        With several ranks each call completes the vote posted by the call before (a non-blocking
        MPI all-reduce, MAX, of every rank's request) and posts this call's: an answer arrives one
        step late, and completing it seldom waits, since every rank posted it a step earlier. No
        host round trip per step, and a stop asked of one rank alone (SIGTERM to one process) still
        stops them all after the same step. final=True (the end of a run): also a blocking vote on
        the requests held now, and nothing left in flight. Once a stop is agreed no vote is posted.
        """
        if self.size == 1:
            return signum
        agreed = 0
        if self._vote is not None:
            request, mine, theirs = self._vote
            self.wait_all([request], lambda: signum)          # a stop asked here: the wait's patience
            agreed, self._vote = int(theirs[0]), None
        if final or not agreed:
            mine, theirs = np.array([signum or 0], np.int64), np.zeros(1, np.int64)
            request = self.comm.Iallreduce(mine, theirs, op=_mpi().MAX)
            if not final:
                self._vote = (request, mine, theirs)
            else:
                self.wait_all([request], lambda: signum)
                agreed = max(agreed, int(theirs[0]))
        return agreed or None

    def guard(self, fn: Callable[..., _T]) -> Callable[..., _T]:
        """fn, wrapped so that a failing rank ends every rank: it prints one line naming itself
        (`error: rank r: ...`) and aborts the MPI job, so no rank waits forever in a collective.
        An exception marked `collective` (every rank raises it after the same step: an agreed stop,
        a divergence seen through the AND-ed flag) aborts nothing, so rank 0 finishes its
        checkpoint: it reaches rank 0's caller, which reports it, and the other ranks exit quietly
        with its `exit_status`. One process: fn itself (errors reach the caller as before)."""
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
                if getattr(e, "collective", False):
                    if self.main:
                        raise
                    raise SystemExit(getattr(e, "exit_status", 1)) from None
                _abort(self, f"error: rank {self.rank}: {e if str(e) else type(e).__name__}", 1)
        return guarded

    def __repr__(self) -> str:
        return f"World(rank={self.rank}, size={self.size}, local_rank={self.local_rank})"


ABORT_GRACE_S = 0.5


def _abort(world, line, code):
    if watchdog.claim():           # this line is the run's: no sentinel or watchdog adds another (nor it one)
        print(line, file=sys.stderr, flush=True)
    time.sleep(ABORT_GRACE_S)      # the launcher forwards output on its own: an abort at once can lose the line
    world.comm.Abort(code if isinstance(code, int) else 1)


_WORLD: World | None = None


def init() -> World:
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
        from ..install_hint import install_hint
        hint = install_hint("dist", "mpi4py", "mpich")
        sys.exit(f"error: started by an MPI launcher, but mpi4py is missing ({hint})")
    comm = MPI.COMM_WORLD
    if line := not_joined(comm.size):         # rank 0 of the launcher says it; the others end alike
        sys.exit(line if launch_from_env().rank == 0 else 1)
    host = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)     # the ranks on this host
    return World(comm.rank, comm.size, host.rank, comm, host)


class Reducer:
    """Collectives among the ranks over `device`'s arrays, in place (captured steps keep the buffers),
    through the World's communicator on the device (MPI on the CPU, NCCL on the GPU).

    In a training step (TrainStep): `watch(net)` once plans the buckets of net's gradient arena;
    each step `begin()` gives Model.backward its hook, which starts summing a bucket over the ranks
    as soon as backward has finished its layers (on the GPU on a second stream in the captured
    step, in order on the compute stream outside one; under a precision policy its range is first
    cast from the compute-dtype copies, net.gather, so half-precision buckets also travel while
    backward goes on), and `finish(flag)`
    starts what is left, ANDs the ranks' NaN flags behind it, and makes the update wait for all of it.
    The sum becomes the mean inside the update:
    `grad_scale` = 1/N is the optimizer's. Outside steps: `average(a)` (BatchNorm's running
    statistics before evaluation and saving), `sum_metrics(metrics)` (a Mean's sums and count).
    bucket_mib: bucket size (default $MINIDL_BUCKET_MIB, else buckets.CAP_MIB); communicator: the
    World's on this device (World.communicator) unless given. grad_reduce: "fp32" sums the float32
    gradients as they are; "bf16" sends them as bfloat16 (rounded, summed in bfloat16 by NCCL, widened
    back: half the bytes, PyTorch DDP's bf16_compress_hook), each gradient then carrying bfloat16's
    8-bit mantissa.
    stop_asked: gives the stop request a signal handler recorded (a signal number) or None; a wait on the host
    that goes on STOP_GRACE_S past one ends the job (waits.py). shard: ZeRO stage 1, buckets reduce-scattered
    (shard.py; `watch` makes `self.shard`, the optimizer's part).
    """

    def __init__(self, world: World, device: Device, bucket_mib: float | None = None, communicator: Any = None,
                 grad_reduce: str = "fp32", stop_asked: Callable[[], int | None] | None = None, shard: bool = False):
        if grad_reduce not in GRAD_REDUCE:
            raise ValueError(f"grad_reduce must be one of {', '.join(GRAD_REDUCE)}, got {grad_reduce!r}")
        if not isinstance(shard, bool):
            raise TypeError(f"shard_optimizer must be True or False, got {shard!r}")
        self.bucket_mib = bucket_mib_from_env() if bucket_mib is None else check_cap(bucket_mib)
        self.tail_mib = tail_mib_from_env()
        self.world, self.device, self.grad_scale = world, device, 1.0 / world.size
        self.grad_reduce, self.stop_asked = grad_reduce, stop_asked
        self.coll = communicator or world.communicator(device)
        self._waits = lambda requests: world.wait_all(requests, stop_asked)
        self._bind_waits()
        self.buckets: GradientBuckets = None     # type: ignore[assignment]  # watch() sets it, before any step
        self.sharded, self.shard = shard, None  # type: bool, sharding.Shard | None  # watch() makes the Shard

    def watch(self, net: Model) -> GradientBuckets:
        """Plan the gradient buckets of `net` (lowered for training); returns them (GradientBuckets)."""
        wires: dict[int, Array] = {}                           # bucket start -> its bfloat16 wire

        def start(view, lo):                     # a precision policy's copies: cast this range first
            net.gather(lo, lo + view.size)
            self.shard.reduce(view, lo, wires.get(lo)) if self.shard else self.coll.start(view, "sum", wires.get(lo))
        self.buckets = GradientBuckets(net, start, self.bucket_mib, self.tail_mib)
        if self.sharded:                         # this rank's chunk of each bucket: what its optimizer updates
            self.shard = sharding.Shard(self.world, self.coll, self.buckets.buckets, net.flat, self.device.xp)
        if self.grad_reduce == "bf16":           # one bfloat16 twin of the arena, cut as the buckets are
            from ..precision import BFLOAT16
            twin = self.device.xp.empty(net.grads.size, BFLOAT16)
            wires.update({b.lo: twin[b.lo:b.hi] for b in self.buckets.buckets})
        return self.buckets

    def start_alike(self, model: Model, seed: int) -> int:
        """Every rank as rank 0: its parameters and running statistics (the model's arenas, through
        the host, so a GPU's NCCL communicator still connecting is not waited for) and its device
        generator's state; returns rank 0's `seed` (the loaders' shuffling). Before the first step,
        ranks built with other seeds then train one run."""
        for a in (model.flat, model.state_flat):
            if a.size:
                host = self.device.to_host(a)                  # a NumPy arena: the arena itself
                self.world.wait_all([self.world.comm.Ibcast(host.reshape(-1).view(np.uint8), root=0)],
                                    self.stop_asked)
                if host is not a:
                    a[...] = self.device.asarray(host)
        seed, state = self.world.comm.bcast((seed, self.device.rng_state()), root=0)    # in step: at once
        self.device.set_rng_state(state)
        return seed

    def begin(self) -> Callable[[Layer], None]:
        """A step's backward begins: its hook ready(layer) for Model.backward."""
        self._bind_waits()
        return self.buckets.begin()

    def _bind_waits(self):
        """MPI's requests are waited for on the host through the World's waits, hearing this Reducer's
        stop requests: the communicator is the process's, and the Trainer stepping is this one."""
        if hasattr(self.coll, "waits"):
            self.coll.waits = self._waits

    def finish(self, flag: Array) -> None:
        """Before the update: start the buckets backward left, flag <- AND of every rank's flag (a
        non-finite loss on any rank stops every rank), and make what follows wait for all of it."""
        self.buckets.flush()
        self.coll.start(flag, "and")
        self.coll.wait()

    def average(self, a: Array) -> None:
        """a <- mean over the ranks of a (per-rank BatchNorm statistics become common ones)."""
        self.coll.allreduce(a, "sum")
        a *= self.grad_scale

    def sum_metrics(self, metrics: Mean) -> None:
        """A Mean's loss sum, hits and count become the sums over the ranks (so result() is global)."""
        self.coll.allreduce(metrics.loss, "sum")
        self.coll.allreduce(metrics.correct, "sum")
        count = np.array([metrics.count], np.int64)
        self.world.wait_all([self.world.comm.Iallreduce(_mpi().IN_PLACE, count, op=_mpi().SUM)], self.stop_asked)
        metrics.count = int(count[0])
