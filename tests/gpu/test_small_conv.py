"""The batch-1 convolution kernel (kernels/gpu/small_conv.py) against the CPU's conv2d_fprop: every
layout of x, w and y, the three io dtypes, strides, paddings, more positions than a block holds; and
conv.py times it against cuDNN at batch 1 and keeps the faster; larger batches go to cuDNN."""
import json

import ml_dtypes
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

from minidl.kernels.cpu import conv as cpu  # noqa: E402
from minidl.kernels.gpu import conv, cudnn_graphs as cudnn, engines, small_conv  # noqa: E402
from tests.helpers.tolerance import close  # noqa: E402

SHAPES = [   # x (N, C, H, W), w (K, C, kH, kW), stride, padding: ResNet-50's kinds at MNIST's sizes
    ((1, 1, 28, 28), (64, 1, 7, 7), (2, 2), 3),        # the stem: 196 positions, 25 blocks of PW
    ((1, 64, 7, 7), (64, 64, 3, 3), (1, 1), 1),
    ((1, 256, 7, 7), (128, 256, 1, 1), (2, 2), 0),     # a strided shortcut
    ((2, 128, 4, 4), (128, 128, 3, 3), (2, 2), 1),     # 2x2 positions: blocks of 4
    ((1, 512, 1, 1), (64, 512, 3, 3), (1, 1), 1),      # one position: only the centre tap is read
    ((1, 2048, 1, 1), (512, 2048, 1, 1), (1, 1), 0),   # layer 4: a matrix-vector product
    ((3, 5, 6, 5), (7, 5, 3, 2), (1, 2), (1, 0)),      # odd sizes, three samples
    ((1, 12, 3, 3), (16, 12, 1, 1), (1, 1), 1),        # 1x1, padded: 16-byte loads in float32 only (12 = 3 x 4)
]
DTYPES = {"float32": ("conv", np.float32), "bfloat16": ("bfloat16", ml_dtypes.bfloat16),
          "float16": ("float16", np.float16)}


def _to(a, dtype, cl):
    d = cp.asarray(a.astype(dtype))
    return cp.ascontiguousarray(d.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2) if cl else d


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[0])) + "-" + "x".join(map(str, s[1])))
def test_small_conv_matches_the_cpu(shape, dtype, rand, no_tf32):
    xs, ws, stride, padding = shape
    op, np_dtype = DTYPES[dtype]
    plan = conv.conv2d_plan((None,) + xs[1:], ws, stride, padding, (1, 1))
    x, w, b = rand(*xs), rand(*ws) / np.sqrt(np.prod(ws[1:])), rand(ws[0])
    rounded = [a.astype(np_dtype).astype(np.float32) for a in (x, w, b)]   # the inputs the GPU sees
    want = cpu.conv2d_fprop(plan, rounded[0], rounded[1], rounded[2])
    for xcl, wcl, ycl in [(0, 0, 0), (1, 1, 1), (1, 0, 0), (0, 1, 1)]:
        args = (_to(x, np_dtype, xcl), _to(w, np_dtype, wcl), cp.asarray(b.astype(np_dtype)))
        assert small_conv.supported(plan, *args)
        y = small_conv.small_conv2d_fprop(plan, *args, cl=bool(ycl))
        close(y, want, op)
        assert y.transpose(0, 2, 3, 1).flags.c_contiguous if ycl else y.flags.c_contiguous
        close(small_conv.small_conv2d_fprop(plan, *args, relu=True, cl=bool(ycl)), np.maximum(want, 0), op)
    nob = small_conv.small_conv2d_fprop(plan, _to(x, np_dtype, 0), _to(w, np_dtype, 0))
    close(nob, cpu.conv2d_fprop(plan, rounded[0], rounded[1]), op)


def test_batch_one_is_timed_both_ways_and_larger_batches_take_cudnn(rand, no_tf32, tmp_path, monkeypatch):
    monkeypatch.setenv("MINIDL_CACHE", str(tmp_path))          # a fresh choice table
    monkeypatch.setattr(engines, "_chosen", {})                 # and nothing remembered in memory
    plan = conv.conv2d_plan((None, 64, 7, 7), (64, 64, 3, 3), (1, 1), 1, (1, 1))
    w, b = cp.asarray(rand(64, 64, 3, 3) / 24), cp.asarray(rand(64))
    for N in (conv.SMALL_N, conv.SMALL_N + 1):
        x = rand(N, 64, 7, 7)
        before = cudnn.calls["conv_bias_relu_fprop"]
        y = conv.conv2d_bias_relu_fprop(plan, cp.asarray(x), w, b)
        close(y, np.maximum(cpu.conv2d_fprop(plan, x, w.get(), b.get()), 0), "conv")
        table = json.loads(open(engines.cache_path()).read())
        chosen = [v for k, v in table.items() if "'conv_fprop'" in k and "(1, 64, 7, 7)" in k]
        assert chosen in (["small"], ["cudnn"])                    # timed once at batch 1, remembered
        if N > conv.SMALL_N:                                    # cuDNN, with nothing timed
            assert cudnn.calls["conv_bias_relu_fprop"] == before + 1
            assert not any("'conv_fprop'" in k and f"({N}, 64, 7, 7)" in k for k in table)


def test_without_autotuning_batch_one_takes_cudnn(rand):
    plan = conv.conv2d_plan((None, 8, 5, 5), (8, 8, 3, 3), (1, 1), 1, (1, 1))
    x, w = cp.asarray(rand(1, 8, 5, 5)), cp.asarray(rand(8, 8, 3, 3))
    was = engines.autotune_enabled()
    engines.set_autotune(False)
    try:
        before = cudnn.calls["conv_fprop"]
        conv.conv2d_fprop(plan, x, w)
        assert cudnn.calls["conv_fprop"] == before + 1
    finally:
        engines.set_autotune(was)


def test_what_it_does_not_take_goes_to_cudnn(rand):
    plan = conv.conv2d_plan((None, 4, 9, 9), (4, 4, 3, 3), (1, 1), 2, (2, 2))      # dilation 2
    x, w = cp.asarray(rand(1, 4, 9, 9)), cp.asarray(rand(4, 4, 3, 3))
    assert not small_conv.supported(plan, x, w, None)
    assert not small_conv.supported(plan, x.astype(cp.float64), w.astype(cp.float64), None)
