"""CuPy + cuDNN kernels, the same names as `minidl/kernels/cpu/` (docs/kernels.md).

Imports nothing itself: CuPy is loaded only when a cuda Device asks for a family, so a CPU-only
install imports minidl without it. The file exists so that `packages = find:` ships this folder.
"""
