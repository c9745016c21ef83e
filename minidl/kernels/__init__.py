"""Kernel families per backend (cpu/, gpu/), their written contract (contract.py) and the shape maths
both share (shapes.py); docs/kernels.md describes the interface."""
