"""How minidl hooks CuPy's compiles (`install`, once per process, from _cuda): each NVRTC compile is
counted and recorded in `progress` (with its thread, start and seconds, for profile_startup), each
compile into CuPy's disk cache holds a file lock, so that processes of one host (ranks, compile
workers) never compile one source twice: the second waits and reads the first's result from the
cache; and NVRTC's precompiled headers are set as MINIDL_NVRTC_PCH says. Imports only minidl.files
(its waiting lock, `files.exclusive`) of minidl.

The names wrapped here are CuPy's private ones (`compiler._NVRTCProgram.compile`,
`compiler._compile_module_with_cache`, `compiler._use_pch`, as CuPy 14.2 has them): pyproject.toml's
`cuda` extra holds CuPy below 15 for them (`cupy-cuda13x>=14,<15`); a new major comes in once tests/gpu
passes on it.
"""
from __future__ import annotations

import hashlib
import os
import re
import threading
import time

from ... import files

_STRIPES = 4096         # lock files beside CuPy's cache: sources of different stripes compile at once


def stripe_lock(folder: str, key: bytes) -> str:
    """The lock file of a compile keyed `key`: one of _STRIPES in `folder`, so that compiles of
    different sources mostly take different locks."""
    return os.path.join(folder, f"stripe-{int(hashlib.sha1(key).hexdigest(), 16) % _STRIPES:04d}.lock")


def install(progress, flag, lock_folder):
    """Count NVRTC compiles (progress; not CuPy's empty-file compile, its compiler fingerprint), lock
    each CuPy compile across processes, and set NVRTC's precompiled headers as MINIDL_NVRTC_PCH
    says; once per process."""
    from cupy.cuda import compiler
    program = compiler._NVRTCProgram
    if getattr(program.compile, "minidl", False):
        return
    compile_program, compile_module = program.compile, compiler._compile_module_with_cache

    def counted(self, *args, **kw):
        t = time.perf_counter()
        try:
            return compile_program(self, *args, **kw)
        finally:
            if self.src.strip():
                dt = time.perf_counter() - t
                name = re.search(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)", self.src)
                progress.compiles.append((threading.current_thread() is threading.main_thread(), t, dt,
                                          name.group(1) if name else "?"))
                progress.add(compiled=1, compile_s=dt)

    def locked(source, options=(), **kw):
        if not flag("MINIDL_COMPILE_LOCK", "1") or flag("CUPY_CACHE_IN_MEMORY", "0"):
            return compile_module(source, options, **kw)
        key = repr((source, options, kw.get("name_expressions"), kw.get("arch"))).encode()
        with files.exclusive(stripe_lock(lock_folder(), key)):    # between processes and threads alike;
            return compile_module(source, options, **kw)           # no flock, a read-only folder: unlocked

    counted.minidl = True
    program.compile, compiler._compile_module_with_cache = counted, locked
    if "CUPY_NVRTC_USE_PCH" not in os.environ:
        compiler._use_pch = flag("MINIDL_NVRTC_PCH", "0")


