"""NCHW <-> CHWN copies for the kernels that compute with the batch innermost (conv)."""
from __future__ import annotations

import numpy as np

from ..._types import Array

# A CHWN -> NCHW copy walks the destination in order, so it reads the source N values apart.
# Done in blocks of about this many source values (32 KB of float32: L1), each source cache line
# is read once instead of once per sample (nearly twice as fast on LeNet's first conv output).
BLOCK_VALUES = 8192


def nchw_to_chwn(x: Array, out: Array) -> None:
    """x (N, C, H, W) -> out (C, H, W, N); out may be a view (a padded buffer's interior)."""
    np.copyto(out, x.transpose(1, 2, 3, 0))


def chwn_to_nchw(x: Array, out: Array) -> Array:
    """x (C, H, W, N), possibly a view (a crop) -> out (N, C, H, W)."""
    C, H, W, N = x.shape
    positions = max(1, BLOCK_VALUES // N)
    if x.flags.c_contiguous and out.flags.c_contiguous:
        src, dst = x.reshape(-1, N), out.reshape(N, -1)            # (C*H*W, N) and (N, C*H*W)
        for s in range(0, src.shape[0], positions):
            np.copyto(dst[:, s:s + positions], src[s:s + positions].T)
        return out
    rows = max(1, positions // W)
    for c in range(C):
        for h in range(0, H, rows):
            np.copyto(out[:, c, h:h + rows], x[c, h:h + rows].transpose(2, 0, 1))    # (N, rows, W)
    return out
