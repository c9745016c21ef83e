"""Compile workers: the processes a cuda Device starts (`start`) to fill CuPy's disk cache.

    python -m minidl.kernels.gpu.compile_workers GPU CLAIMS N STAMP    (one worker; `start` runs N)

NVRTC compiles one program at a time in a process, so the first step's compiles run side by side
only in processes of their own. A worker imports every kernel family (so their Modules register,
with the same sources as the process that started it), lists gpu/ahead.py's rehearsals and then the
Modules, the largest first, in an order every worker computes alike, and takes job after job: job i
is its own when it creates the file CLAIMS/i first. A rehearsal calls its kernels on tiny arrays, a
Module compiles. What it compiles lands in CuPy's cache, under `_cuda`'s file locks, where the
training process loads it; a kernel that process compiled first is a cache hit here. A worker ends
when no job is left; any error ends it quietly (the training process compiles what is missing).

MINIDL_COMPILE_WORKERS of them (default: a core each but one, at most 8; 0: none), started by a
host's first rank only (backends/cuda.py). None start with MINIDL_PARALLEL_COMPILE=0, where the
caches already hold their work (a stamp file the last run's workers left, named by the GPU, the
CUDA and CuPy versions and the kernel sources), where a GPU takes one process only (its compute mode),
or where CuPy's cache lives in memory. Each worker makes a CUDA context of its own on the GPU while it
runs, a few hundred MB.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from minidl import files            # absolute: the tests load this file without its package


def start(dev: int) -> None:
    """Start the workers for GPU `dev` (none: see above), listed in `_cuda._workers`, where the compile
    pool's threads wait for them before loading what they compiled; before `_cuda.prefetch`."""
    import cupy as cp
    from . import _cuda
    from .affinity import unbind
    n = count()
    off = n < 1 or not _cuda._flag("MINIDL_PARALLEL_COMPILE", "1") or _cuda._flag("CUPY_CACHE_IN_MEMORY", "0")
    if off or cp.cuda.Device(dev).attributes.get("ComputeMode", 0) != 0:     # one process a GPU: none
        return
    stamp = _cuda.stamp_path(dev)
    if os.path.exists(stamp):           # the caches hold every job already
        return
    claims = tempfile.mkdtemp(prefix="minidl-compile-")
    cmd = [sys.executable, "-m", __name__, str(dev), claims, str(n), stamp]
    env = dict(os.environ, MINIDL_PARALLEL_COMPILE="0", MINIDL_COMPILE_WORKERS="0")   # no workers of their own
    procs = []
    for _ in range(n):
        try:
            procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
            unbind(procs[-1].pid)          # before its imports: they alone are a second of CPU
        except OSError:                 # no processes to spare: the training process compiles the rest
            break
    _cuda._workers.extend(procs)


def count() -> int:
    """MINIDL_COMPILE_WORKERS, or its default: a core each but one, at most 8."""
    v = os.environ.get("MINIDL_COMPILE_WORKERS")
    if v is None:
        return min(8, (os.cpu_count() or 2) - 1)
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"MINIDL_COMPILE_WORKERS must be a whole number of processes (0: none), got {v!r}") from None


def finished(claims: str, n: int, stamp: str, me: int | None = None) -> None:
    """Worker `me` (its pid) is done: the last of the n to finish stamps the cache and drops the claims
    (a worker that failed never gets here, so the cache stays unstamped and the next run tries again)."""
    os.close(os.open(os.path.join(claims, f"done-{os.getpid() if me is None else me}"), os.O_CREAT | os.O_WRONLY))
    if sum(f.startswith("done-") for f in os.listdir(claims)) == n and claim(claims, "stamp"):
        try:
            files.write_atomic(stamp, lambda f: f.write(b"compiled\n"))
        except files.WriteError:        # a read-only cache: the next run starts workers again
            pass
        shutil.rmtree(claims, ignore_errors=True)


def jobs(registry: Sequence[Any], rehearsals: Sequence[Callable[[], None]]) -> list[Callable[[], None]]:
    """The shared work list: the rehearsals (the first step needs them first), then the Modules, those
    of most kernels first, then by the hash of their source and names (the same order in every
    worker, whatever imported first)."""
    def key(m):
        return -len(m.names), hashlib.sha1(repr((m.code, m.names)).encode()).hexdigest()
    return list(rehearsals) + [(lambda m=m: m._compile(None, m.names)) for m in sorted(registry, key=key)]


def claim(folder: str, i: int | str) -> bool:
    """Whether job i is this worker's: it made folder/i first."""
    try:
        os.close(os.open(os.path.join(folder, str(i)), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def main(argv: Sequence[str]) -> int:
    dev, claims, n, stamp = int(argv[0]), argv[1], int(argv[2]), argv[3]
    import cupy as cp
    cp.cuda.Device(dev).use()
    import importlib
    from minidl.kernels.gpu import _cuda, ahead
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        # the rehearsals first, before the other families load: the first step needs them first
        work(claims, enumerate(ahead.REHEARSALS))
        from minidl.kernels.families import KERNEL_FAMILIES
        for family in KERNEL_FAMILIES:           # every family: its Modules register
            try:
                importlib.import_module(f"minidl.kernels.gpu.{family}")
            except ModuleNotFoundError:          # a family this backend lacks
                pass
        work(claims, list(enumerate(jobs(_cuda._registry, ahead.REHEARSALS)))[len(ahead.REHEARSALS):])
    stream.synchronize()
    finished(claims, n, stamp)
    return 0


def work(claims: str, numbered: Iterable[tuple[int, Callable[[], None]]]) -> None:
    """Run each job (i, job) that this worker claims first."""
    for i, job in numbered:
        if claim(claims, i):
            try:
                job()
            except Exception:                    # noqa: BLE001  the training process meets it itself
                pass


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception:                            # noqa: BLE001  quiet: see the docstring
        sys.exit(1)
