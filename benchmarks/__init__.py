"""Benchmarks against PyTorch and profiling scripts; run from the repository root (never shipped in minidl)."""
