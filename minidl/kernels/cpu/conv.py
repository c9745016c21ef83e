"""2-D convolution as im2col + matrix products (cross-correlation, as cuDNN computes it).

The kernels compute in a CHWN layout: with the batch innermost, every window offset reads and
writes runs of oW*N contiguous values (at stride 1) instead of runs of oW or kW. y and gx come
back NCHW by shape but CHWN in memory (transposed views: no copy; see _util), and gy in that
order is read without a copy. A plan keeps its buffers (`ConvPlan.ws`) for the batch size and
dtype it last ran; fprop's im2col columns are kept for the wgrad of the same x, and wgrad's
rearranged gy for the dgrad of the same gy (conv2d_wgrad then conv2d_dgrad, as a layer's
backward calls them), since each is a full pass over memory.
"""
from __future__ import annotations

import numpy as np

from ..._types import Array
from ..shapes import ConvPlan, conv2d_plan  # noqa: F401  the family's plans: one definition (kernels/shapes.py)
from ._layout import chwn_to_nchw, nchw_to_chwn


# im2col and GEMM run over blocks of output rows: a block's columns (C*kH*kW x ~4096 values) are
# still in cache when the GEMM reads them (LeNet's first conv, 6 x 25 x 25,088: about 10% faster).
CHUNK_COLUMNS = 4096
# fprop keeps the whole im2col matrix for wgrad up to this size; past it (large images, large
# batches) wgrad builds the columns again, block by block, and the plan holds one block only.
KEEP_COLS_BYTES = 64 << 20


def _buffer(plan, name, shape, dtype, zero=False):
    """The plan's buffer `name`, (re)allocated when the shape or dtype asked for changes."""
    b = plan.ws.get(name)
    if b is None or b.shape != shape or b.dtype != dtype:
        b = plan.ws[name] = (np.zeros if zero else np.empty)(shape, dtype)
    return b


def _dims(plan, N):
    """(C, kH, kW, oH, oW, L): L = oH*oW*N columns of the im2col matrix."""
    _, C, kH, kW = plan.w_shape
    oH, oW = plan.out_shape[2:]
    return C, kH, kW, oH, oW, oH * oW * N


def _row_chunks(plan, N):
    """Output-row ranges of about CHUNK_COLUMNS im2col columns each (at least one row)."""
    oH, oW = plan.out_shape[2:]
    rows = max(1, CHUNK_COLUMNS // (oW * N))
    return [(r, min(r + rows, oH)) for r in range(0, oH, rows)]


def _windows(plan, x):
    """x (N, C, H, W) -> a strided view (C, kH, kW, oH, oW, N) of its zero-padded CHWN copy."""
    N, C, H, W = x.shape
    t, b, l, r = plan.pads
    xp = _buffer(plan, "xp", (C, H + t + b, W + l + r, N), x.dtype, zero=True)   # the border stays 0
    nchw_to_chwn(x, xp[:, t:t + H, l:l + W])
    _, _, kH, kW = plan.w_shape
    oH, oW = plan.out_shape[2:]
    (sh, sw), (dh, dw) = plan.stride, plan.dilation
    c, h, w, n = xp.strides
    # np.ndarray over xp's memory: as_strided's Python wrapper is slow for a call made this often
    return np.ndarray((C, kH, kW, oH, oW, N), xp.dtype, xp, 0, (c, h * dh, w * dw, h * sh, w * sw, n))


def _columns(plan, x, keep):
    """Yields (column range, im2col block (C*kH*kW, columns)) per row chunk; keep: into one whole
    matrix that stays in the plan for wgrad (x's columns), else into one reused block."""
    N = x.shape[0]
    C, kH, kW, oH, oW, L = _dims(plan, N)
    win, R = _windows(plan, x), C * kH * kW
    chunks = _row_chunks(plan, N)
    width = L if keep else (chunks[0][1] - chunks[0][0]) * oW * N
    cols = _buffer(plan, "cols", (R, width), x.dtype)
    plan.ws["cols_of"] = None
    for r0, r1 in chunks:
        a, n = r0 * oW * N, (r1 - r0) * oW * N
        block = cols[:, a:a + n] if keep else cols[:, :n]
        np.copyto(block.reshape(C, kH, kW, r1 - r0, oW, N), win[:, :, :, r0:r1])
        yield (a, a + n), block
    if keep:
        plan.ws["cols_of"] = x


def _keeps_cols(plan, x):
    C, kH, kW, _, _, L = _dims(plan, x.shape[0])
    return C * kH * kW * L * x.itemsize <= KEEP_COLS_BYTES


def _gemm_rows(K):
    """K, or K padded with zero rows, for the wgrad product cols @ gy^T (N = K columns).

    OpenBLAS (its Haswell kernels, this machine's) runs the N side in blocks of 8, then one pass
    each for a remaining 4, 2 and 1 columns, each pass over all of cols: K = 6 (LeNet's first conv)
    takes two extra passes and is slower than 8 columns; padded to 8 it is one pass.
    """
    return -(-K // 4) * 4 if bin(K % 8).count("1") > 1 else K


def _gy_rows(plan, gy):
    """gy (N, K, oH, oW) -> (K', oH*oW*N) with K' = _gemm_rows(K) (rows past K are zero): the
    GEMM operand both gradients share, kept for dgrad."""
    if plan.ws.get("g_of") is gy:
        g, plan.ws["g"], plan.ws["g_of"] = plan.ws["g"], None, None
        return g
    N, K, oH, oW = gy.shape
    g = gy.transpose(1, 2, 3, 0)                                   # (K, oH, oW, N)
    if not g.flags.c_contiguous or _gemm_rows(K) != K:           # not already CHWN in memory
        g = _buffer(plan, "g_rows", (_gemm_rows(K), oH, oW, N), gy.dtype, zero=True)
        nchw_to_chwn(gy, g[:K])
    plan.ws["g"], plan.ws["g_of"] = g.reshape(g.shape[0], -1), gy
    return plan.ws["g"]


def conv2d_fprop(plan: ConvPlan, x: Array, w: Array, b: Array | None = None, out: Array | None = None,
                 cl: bool = False) -> Array:
    """x (N, C, H, W), w (K, C, kH, kW), b (K,) -> y (N, K, oH, oW), in CHWN memory order whatever
    `cl` (the GPU's channels-last request) says: the order this kernel computes in."""
    N, K = x.shape[0], w.shape[0]
    oH, oW = plan.out_shape[2:]
    w2 = w.reshape(K, -1)
    y = np.empty((K, oH * oW * N), dtype=np.result_type(x, w))
    for (a, e), cols in _columns(plan, x, _keeps_cols(plan, x)):
        np.matmul(w2, cols, out=y[:, a:e])
    if b is not None:
        y += b[:, None]
    y = y.reshape(K, oH, oW, N)
    return y.transpose(3, 0, 1, 2) if out is None else chwn_to_nchw(y, out)


def conv2d_wgrad(plan: ConvPlan, x: Array, gy: Array, gw: Array, accumulate: bool = True) -> None:
    """Adds dL/dw = gy @ im2col(x)^T into gw (K, C, kH, kW); accumulate=False overwrites gw."""
    g = _gy_rows(plan, gy)
    if plan.ws.get("cols_of") is x:          # fprop's columns of this very x
        plan.ws["cols_of"] = None
        # cols @ gy^T, then a transpose of the small result: OpenBLAS runs this orientation faster
        dw = plan.ws["cols"] @ g.T                                         # (C*kH*kW, K')
    else:
        dw = np.zeros((gw[0].size, g.shape[0]), dtype=gw.dtype)
        for (a, e), cols in _columns(plan, x, keep=False):
            dw += cols @ g[:, a:e].T
    dw = dw[:, :gw.shape[0]].T.reshape(gw.shape)                        # (K, C, kH, kW)
    if accumulate:
        gw += dw
    else:
        gw[...] = dw


def conv2d_dgrad(plan: ConvPlan, gy: Array, w: Array, out: Array | None = None, cl: bool | None = None) -> Array:
    """gy (N, K, oH, oW), w (K, C, kH, kW) -> gx (N, C, H, W): col2im of w^T @ gy, in CHWN memory order
    whatever `cl` (the GPU's channels-last request) says."""
    N, K, oH, oW = gy.shape
    C, kH, kW = w.shape[1:]
    H, W = plan.in_shape[2:]
    t, b, l, r = plan.pads
    (sh, sw), (dh, dw) = plan.stride, plan.dilation
    g, w2t = _gy_rows(plan, gy)[:K], w.reshape(K, -1).T
    gxp = np.zeros((C, H + t + b, W + l + r, N), dtype=gy.dtype)            # padded, CHWN
    chunks = _row_chunks(plan, N)
    rows = chunks[0][1] - chunks[0][0]
    span = (rows - 1) * sh + (kH - 1) * dh + 1               # input rows one chunk of output rows reads
    gcols = _buffer(plan, "gcols", (C * kH * kW, rows * oW * N), gy.dtype)
    u = _buffer(plan, "u", (C, span, oW * N), gy.dtype)
    for r0, r1 in chunks:
        n = r1 - r0
        cols = np.matmul(w2t, g[:, r0 * oW * N:r1 * oW * N], out=gcols[:, :n * oW * N])
        cols = cols.reshape(C, kH, kW, n * oW * N)
        s = (n - 1) * sh + (kH - 1) * dh + 1
        for j in range(kW):
            # col2im: first the kH row offsets of kernel column j, into u (C, s, oW*N), where at
            # stride 1 each is one contiguous run per channel; then u into gx's columns at offset
            # j, one strided slab per kernel column rather than per kernel offset.
            uj = u[:, :s]
            uj.fill(0)
            for i in range(kH):
                v = uj[:, i * dh:i * dh + (n - 1) * sh + 1:sh]              # (C, n, oW*N)
                np.add(v, cols[:, i, j].reshape(C, n, oW * N), out=v)
            d = gxp[:, r0 * sh:r0 * sh + s, j * dw:j * dw + sw * (oW - 1) + 1:sw]   # (C, s, oW, N)
            np.add(d, uj.reshape(C, s, oW, N), out=d)
    gx = gxp[:, t:t + H, l:l + W]
    return gx.transpose(3, 0, 1, 2) if out is None else chwn_to_nchw(gx, out)
