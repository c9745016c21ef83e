"""Kernel families per backend; see docs/kernels.md for the shared interface."""
