"""How many threads the CPU kernels' BLAS and OpenMP pools use (threadpoolctl).

NumPy's OpenBLAS starts one thread per core and spins them on every matrix product. LeNet-sized
products (a few million multiply-adds at most) gain little from a second thread (a LeNet-5 step
at batch 32: 10% on idle cores), and on a machine whose cores are busy a spinning pool waits for
a core on every call: the same step took 3-25x longer under load (docs/training.md, Threads on the CPU).

`import minidl` changes nothing; the first CPU Device (a model, a Trainer, an inference model on the
CPU) applies the command lines' default (`use_default`), unless the process chose already: the
environment's OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / MKL_NUM_THREADS (which it then applies, as
the command lines do), a call of `set_threads`, or pools changed through threadpoolctl since the import.
"""
from __future__ import annotations

import os
import warnings

import numpy  # noqa: F401 (its BLAS loaded, so that the pools below are the ones it starts with)
from threadpoolctl import threadpool_info, threadpool_limits

DEFAULT_THREADS = 1     # measured on the 2-core machine: docs/training.md, Threads on the CPU
_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_chosen = False         # set_threads ran (the user's, a command line's, or use_default's): nothing more to decide


def current_threads() -> dict[str, int]:
    """{library name: threads} of the pools threadpoolctl sees (e.g. {'openblas': 1})."""
    return {p["internal_api"]: p["num_threads"] for p in threadpool_info()}


_AT_IMPORT = current_threads()    # read only (1 ms): a library import changes no process-wide setting


def set_threads(n: int | None = None) -> int:
    """Limit every BLAS and OpenMP pool in the process to n threads; returns the limit applied.

    n=None: the user's OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / MKL_NUM_THREADS when set (the first
    of those), else DEFAULT_THREADS.
    """
    if n is None:
        n = next((int(os.environ[k]) for k in _ENV if os.environ.get(k, "").isdigit() and int(os.environ[k]) > 0),
                 DEFAULT_THREADS)
    if n < 1:
        raise ValueError(f"threads must be a positive integer, got {n}")
    if n > cpus():
        warnings.warn(f"{n} threads on the {cpus()} CPU(s) this process may use: each BLAS call then waits "
                      f"for cores (many times slower)", stacklevel=2)
    global _chosen
    threadpool_limits(limits=n)
    _chosen = True
    return n


def use_default() -> int | None:
    """The command lines' choice, set_threads(), for a CPU Device made through the Python API, once
    per process: unless set_threads ran already or the pools changed since `import minidl` (the
    user's threadpoolctl limits), which are left as they are (None returned). Without it the
    README's Python quick start ran many times slower than the command line on a busy machine
    (docs/training.md, Threads on the CPU)."""
    if _chosen or current_threads() != _AT_IMPORT:
        return None
    return set_threads()


def cpus() -> int:
    """The CPUs this process may run on (its affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1

