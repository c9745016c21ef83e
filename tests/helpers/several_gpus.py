"""What the two-GPU tests in tests/gpu share: how many GPUs this machine has, and the MPI launcher
($MINIDL_MPIEXEC, e.g. "mpirun --allow-run-as-root" where Open MPI runs as root; mpiexec by default)."""
import os
import shlex


def gpu_count() -> int:
    """CUDA devices visible here; 0 without CuPy or a driver (tests/gpu/conftest.py skips those runs)."""
    try:
        import cupy as cp
        return cp.cuda.runtime.getDeviceCount()
    except Exception:                  # noqa: BLE001  no CuPy, no driver
        return 0


def launcher() -> list[str]:
    return shlex.split(os.environ.get("MINIDL_MPIEXEC", "mpiexec"))
