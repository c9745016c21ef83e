"""What the tests that start several ranks share: whether MPI can launch them here (`needs_mpi`), how
many GPUs this machine has, and the MPI launcher ($MINIDL_MPIEXEC, e.g. "mpirun --allow-run-as-root"
where Open MPI runs as root; mpiexec by default)."""
import importlib.util
import os
import shlex
import shutil

import pytest

MPI_MISSING = ("mpiexec is not on PATH" if shutil.which("mpiexec") is None else
               "mpi4py is not installed" if importlib.util.find_spec("mpi4py") is None else None)
needs_mpi = pytest.mark.skipif(MPI_MISSING is not None, reason=f"{MPI_MISSING} (pip install 'minidl[dist]')")


def gpu_count() -> int:
    """CUDA devices visible here; 0 without CuPy or a driver (tests/gpu/conftest.py skips those runs)."""
    try:
        import cupy as cp
        return cp.cuda.runtime.getDeviceCount()
    except Exception:                  # noqa: BLE001  no CuPy, no driver
        return 0


def launcher() -> list[str]:
    return shlex.split(os.environ.get("MINIDL_MPIEXEC", "mpiexec"))
