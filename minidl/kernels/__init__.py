"""Kernel families per backend (cpu/, gpu/), their written contract (contract.py), what a device holds
of them, typed (families.py: Kernels), and the shape maths both share (shapes.py); docs/kernels.md
describes the interface."""
