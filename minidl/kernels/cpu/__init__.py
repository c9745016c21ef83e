"""NumPy reference kernels; `minidl/kernels/gpu/` mirrors these names (docs/kernels.md)."""
