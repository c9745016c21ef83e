"""The elementwise kernels a training run calls, compiled on the compile pool before its first step.

CuPy compiles an elementwise kernel (its own ufuncs and copies, and minidl's ElementwiseKernels)
at the first call with a given set of dtypes and dimensions, about 0.1 s of NVRTC each, on the
thread that calls: a first step of LeNet-5 called about 30 of them, one after another, on the
main thread (docs/cold-start.md). Their code cannot be named ahead as a Module's can, so this file
rehearses each call on tiny arrays of the same dtypes and dimensions (`_cuda.ahead`), and the
pool's threads compile them side by side while the device, model and trainer are made; the first
step finds them in CuPy's cache.

Each rehearsal mirrors a call made elsewhere (the file named beside it): a call that changes its
dtypes or dimensions leaves its rehearsal compiling a kernel nobody uses, and its own compile moves
back into the first step, which tests/gpu/test_cold_start.py counts. Rehearsed in the float32
compute dtype and both memory orders (a small model runs NCHW, a large one channels-last).
"""
from __future__ import annotations

import os

import cupy as cp
import numpy as np

from . import _cuda, augment, optim, pad, pool
from ..shapes import pool2d_plan

F32, F64, I32, I64, U64 = np.float32, np.float64, np.int32, np.int64, np.uint64


def _images(cl, dtype=F32):
    """A tiny (N, C, H, W) batch, channels-last if cl."""
    a = cp.zeros((2, 4, 4, 3) if cl else (2, 3, 4, 4), dtype)
    return a.transpose(0, 3, 1, 2) if cl else a


def _loader():
    """data/loader.py: uint8 images to the compute dtype and scaled in one kernel, normalised in place;
    batches taken."""
    x = cp.divide(cp.zeros((2, 1, 4, 4), np.uint8), F32(255), dtype=F32)
    x -= 0.5
    x /= 0.5
    idx = cp.zeros(2, I64)
    cp.take(x, idx, axis=0)
    cp.take(cp.zeros(4, I32), idx, axis=0)


def _flags_and_metrics():
    """training/step.py's good-step count among ranks (one process counts in softmax.loss_tally, a
    Module's kernel), metrics.py's sums (evaluation's), rng.py's offset."""
    finite, loss = cp.zeros((), bool), cp.zeros((), F32)
    good = cp.zeros((), I64)
    good += finite
    total, correct = cp.zeros((), F64), cp.zeros((), I64)
    total += loss
    correct += cp.zeros((), I64)
    offset = cp.zeros((), U64)
    offset += 2


def _learning_rate():
    """optim/base.py: the step count gated by the flag, and a tabulated schedule read at min(t, last)."""
    t, table = cp.zeros((), F64), cp.zeros(4, F64)
    t += cp.zeros((), bool)
    cp.take(table, cp.minimum(t, 3).astype(I64))


def _updates():
    """kernels/gpu/optim.py: each update on flat buffers, lr and t as 0-d float64, the flag 0-d bool."""
    p, lr, t, ok = cp.zeros(4, F32), cp.zeros((), F64), cp.zeros((), F64), cp.zeros((), bool)
    for scale in (1.0, 0.5):                   # 0.5: ranks' summed gradients averaged inside the update
        optim.sgd_update(p, p, lr, 0.0, ok, scale)
        optim.momentum_update(p, p, cp.zeros(4, F32), lr, 0.9, 0.0, False, ok, scale)
        optim.adam_update(p, p, cp.zeros(4, F32), cp.zeros(4, F32), lr, 0.9, 0.999, 1e-8, 0.0, t, ok, scale)


class _Draws:
    """rng.py's CounterRNG as augment.py reads it: a key, a device offset, this rank's skip."""
    key, rank, ranks = (1, 2), 0, 1

    def __init__(self):
        self.offset = cp.zeros((), U64)

    def skip(self, count):
        return self.rank * count

    def advance(self, count):
        self.offset += self.ranks * count


def _augment():
    x = _images(False)
    augment.random_shift(x, 2, 0.0, _Draws())
    augment.random_flip(x, _Draws())


def _layers(cl):
    """kernels/gpu/pool.py's and pad.py's kernels, forward and backward, in one memory order."""
    def run():
        x = _images(cl)
        plan = pool2d_plan(x.shape, 2, 2, 0)
        y = pool.maxpool2d_fprop(plan, x)
        pool.maxpool2d_bprop(plan, x, y, y)
        pool.avgpool2d_bprop(plan, pool.avgpool2d_fprop(plan, x))
        pad.pad2d_bprop(pad.pad2d_fprop(x, (1, 1, 1, 1)), (1, 1, 1, 1))
    return run


REHEARSALS = (_loader, _flags_and_metrics, _learning_rate, _updates, _augment, _layers(False),
              _layers(True))


def training() -> None:
    """Queue every rehearsal on the compile pool (once per process; nothing without the pool, nor where
    the compile workers' stamp says CuPy's cache holds their kernels already).

    Rehearsing on a warm cache compiles nothing, and it cost the run's speed: every CUDA graph of runs
    that had rehearsed replayed slower, LeNet-5's and ResNet-50's training steps alike, where one
    rehearsal alone did not (the figures: docs/kernels.md and docs/cold-start.md)."""
    if not _done:
        _done.append(True)
        if os.path.exists(_cuda.stamp_path(cp.cuda.runtime.getDevice())):
            return
        for fn in REHEARSALS:
            _cuda.ahead(fn)


_done: list[bool] = []
