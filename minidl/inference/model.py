"""InferenceModel: a model after the inference passes, scheduled into kernel calls, replayed as CUDA graphs.

On a device that captures (cuda), `predict` keeps one fixed input buffer and one CUDA graph per
batch size (captured at first use, its first replay checked against eager execution); a call
copies x into the buffer and launches the graph. Given the input buffer itself
(`input_buffer(N)`), predict is one dict lookup and the graph launch. The array it returns is the
graph's output buffer: valid until the next call at that batch size (copy it to keep it).
Elsewhere predict returns fresh arrays.

A compiled model (`images`) takes the input contract's images (docs/input.md), as Model.predict does:
uint8 in [0, 255] (divided by 255 on the device, after a uint8 copy) or floats in [0, 1] (a host
array's range is checked; a device array and the input buffer are taken as they are), (N, H, W) where
the input is (1, H, W), or (N, C, H, W); a model's Normalize is part of the lowered graph. An artifact
from before the contract (its record says no `images`) takes normalised floats, unchecked, as it did.
"""
from __future__ import annotations

import os
from collections import namedtuple
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..errors import DataError
from ..graph.liveness import last_reads
from ..layers.input_contract import CONTRACT, pixel_scale
from . import artifact, schedule as _schedule

if TYPE_CHECKING:
    from .._types import Array
    from ..graph.model import Model
    from ..layers.node import Node
    from .schedule import Step

GRAPH_CHECK_RTOL = 1e-4     # replay vs eager: the same kernels, so only nondeterministic sums differ
OpTime = namedtuple("OpTime", "name kind shape ms")


class InferenceModel:
    """A built, inference-lowered Model on one device.   predict(x (N, *input_shape)) -> y."""

    def __init__(self, model: Model, probabilities: bool = False, stats: dict[str, Any] | None = None,
                 direct: bool = True, precision: str = "fp32", images: bool = False,
                 dataset: str | None = None) -> None:
        self.model, self.device, self.name = model, model.device, model.name
        self.dataset = dataset                     # what it was trained on, where its checkpoint said: saved along
        self.images = bool(images)                 # takes the contract's images (the model's preprocessing)
        self.dtype, self.probabilities = model.device.dtype, bool(probabilities)
        self.precision = precision                 # the policy's name: inputs and outputs in `dtype`
        self.stats = dict(stats or {})
        self.input_shapes = [tuple(n.shape[1:]) for n in model.inputs]
        vid = _schedule.value_ids(model)
        self.outputs = [vid[id(o)] for o in model.outputs]          # the value ids predict returns
        self.cuda_graphs = self.device.can_capture        # False: run eagerly (debugging)
        self._direct = bool(direct)
        self._plan()

    @property
    def nodes(self) -> list[Node]:
        return self.model.nodes

    @property
    def n_params(self) -> int:
        return int(sum(p.size for p in self.model.params.values()))

    # -- scheduling -----------------------------------------------------------------------------------
    @property
    def direct(self) -> bool:
        """Whether fused direct kernels are scheduled (True by default); setting it drops captured graphs."""
        return self._direct

    @direct.setter
    def direct(self, on: bool) -> None:
        self._direct = bool(on)
        self._plan()

    def _plan(self):
        compute = {n.dtype for n in self.model.nodes} - {self.dtype}   # a policy's compute dtype, if any
        dk = _schedule.direct_family(self.device, compute.pop() if compute else self.dtype) if self._direct else None
        self.steps, self.chain = _schedule.plan(self.model, dk)
        self._schedules, self._entries, self._replays = {}, {}, {}

    def schedule(self, N: int) -> tuple[list[Step], list[list[int]]]:
        """(steps, free) at batch N: the kernel calls in order, and after each the values to drop."""
        sched = self._schedules.get(N)
        if sched is None:
            chain = self.chain is not None and N <= _schedule.CHAIN_MAX_BATCH
            steps = [self.chain] if chain else self.steps
            keep = set(self.outputs) | set(range(len(self.input_shapes)))      # the caller's arrays
            free = last_reads([(st.inputs, st.out) for st in steps], keep)
            sched = self._schedules[N] = (steps, free)
        return sched

    # -- running --------------------------------------------------------------------------------------
    def _forward(self, xs, keep=False):
        steps, free = self.schedule(xs[0].shape[0])
        values = dict(enumerate(xs))
        for st, drop in zip(steps, free):
            values[st.out] = st.run([values[v] for v in st.inputs])
            if not keep:
                for v in drop:
                    del values[v]
        return values if keep else [values[v] for v in self.outputs]

    def _shaped(self, xs):
        """xs as Model.predict takes them: (N, H, W) images given their channel where an input is (1, H, W),
        and (N, H, W, C) images moved to (N, C, H, W) where the shape alone says so (C of 1 or 3 and
        the shape not also channels first: data/sources.layout's rule without a data_format)."""
        return [_channels_first(x, shape) for x, shape in zip(xs, self.input_shapes)]

    def _inputs(self, xs):
        if len(xs) != len(self.input_shapes):
            raise ValueError(f"{self.name} takes {len(self.input_shapes)} input(s), got {len(xs)}")
        N = None
        for x, shape in zip(xs, self.input_shapes):
            s = tuple(getattr(x, "shape", ()))
            if s[1:] != shape or (N is not None and s[0] != N) or not s or s[0] < 1:
                raise ValueError(f"{self.name}: inputs must be (N, *{shape}) with one N >= 1, got {s}")
            N = s[0]
        return N

    def _pack(self, outs):
        return outs[0] if len(outs) == 1 else list(outs)

    def _to_device(self, x, out=None):
        """x on the device in the model's dtype (into `out` if given); images as the contract says."""
        if self.images:
            if getattr(x, "dtype", None) == np.uint8:          # uint8 crosses (4x fewer bytes), / 255 there
                return self.device.xp.divide(self.device.asarray(x), np.float32(255), out=out, dtype=np.float32)
            if isinstance(x, np.ndarray):
                pixel_scale(x, f"{self.name}.predict images")
            elif not np.issubdtype(getattr(x, "dtype", np.dtype(np.float32)), np.floating):
                raise DataError(f"{self.name}.predict images: dtype {x.dtype}, expected {CONTRACT}")
        if out is None:
            return self.device.asarray(x, dtype=self.dtype)
        out[...] = self.device.asarray(x, dtype=self.dtype)
        return out

    def _entry(self, N):
        entry = self._entries.get(N)
        if entry is None:
            bufs = [self.device.xp.zeros((N, *s), dtype=self.dtype) for s in self.input_shapes]
            call = self._capture(bufs) if self.cuda_graphs else None
            entry = self._entries[N] = (bufs, call)
            if call is not None and len(bufs) == 1:
                replay, out = call.replay, self._pack(call.result)

                def launch():
                    replay()
                    return out
                self._replays[id(bufs[0])] = (bufs[0], launch)
        return entry

    def _capture(self, bufs):
        """The forward on `bufs` as a captured call, its first replay checked against eager execution.

        The check runs once per batch size, on a random probe input: the graph replays the very
        kernels the eager run launched, so any difference means some kernel is not safe to
        capture, and that must fail loudly rather than return wrong outputs at every replay.
        """
        from ..backend import CaptureError
        rng = np.random.default_rng(0)
        for buf in bufs:           # a probe in the model's input range either way
            buf[...] = self.device.asarray(rng.random(buf.shape, dtype=np.float32), dtype=self.dtype)
        want = [y.copy() for y in self._forward(bufs)]
        call = self.device.capture(lambda: self._forward(bufs))
        for w, y in zip(want, call.replay()):
            err, scale = float(abs(y - w).max()), float(abs(w).max())    # one host sync, at capture only
            if not err <= GRAPH_CHECK_RTOL * scale:
                raise CaptureError(f"{self.name}: the CUDA graph at batch {bufs[0].shape[0]} disagrees with "
                                   f"eager execution (max error {err:.3g}, max |y| {scale:.3g}): a kernel is not "
                                   "safe to capture; set cuda_graphs = False (minidl.infer --no-graphs)")
        return call

    def input_buffer(self, N: int, index: int = 0) -> Array:
        """The fixed input buffer for batch size N: write into it and pass it to predict (no copy)."""
        return self._entry(N)[0][index]

    def predict(self, *xs: Array) -> Array | list[Array]:
        """Outputs for inputs xs (host or device arrays, (N, *input_shape), or (N, H, W) for (1, H, W)):
        Model.predict's outputs for the same images (probabilities where the model ends in a Softmax,
        unless compiled with probabilities=False).

        With CUDA graphs (the default on cuda) the result is the graph's output buffer for this
        batch size, overwritten by the next call at the same N; the call does not wait for the GPU.
        Given the input buffer of a captured batch size (input_buffer(N)), it only launches the graph.
        """
        hit = self._replays.get(id(xs[0])) if len(xs) == 1 and self.cuda_graphs else None
        if hit is not None and hit[0] is xs[0]:
            return hit[1]()
        xs = tuple(self._shaped(xs))
        N = self._inputs(xs)
        if not self.cuda_graphs:
            return self._pack(self._forward([self._to_device(x) for x in xs]))
        bufs, call = self._entry(N)
        for buf, x in zip(bufs, xs):
            if x is not buf:
                self._to_device(x, out=buf)
        return self._pack(call.replay())

    __call__ = predict

    def profile(self, *xs: Array, repeats: int = 20) -> list[OpTime]:
        """Per-step times [OpTime(name, kind, shape, ms)] at this batch, one row per kernel call of
        schedule(N): each step's inputs come from one forward pass, and each step is timed over
        `repeats` runs by the device (GPU: CUDA events around captured repeats; CPU: the clock).
        """
        xs = tuple(self._shaped(xs))
        N = self._inputs(xs)
        values = self._forward([self._to_device(x) for x in xs], keep=True)
        rows = []
        for st in self.schedule(N)[0]:
            ins = [values[v] for v in st.inputs]
            ms = 0.0 if st.kind == "flatten" else self._time(st, ins, repeats)
            rows.append(OpTime(st.name, st.kind, tuple(values[st.out].shape), ms))
        return rows

    def _time(self, st, ins, repeats):
        """ms per run of one step; captured repeats where the device captures (kernel time, no launches)."""
        if not self.device.can_capture:
            return self.device.elapsed_ms(lambda: st.run(ins), repeats)

        def loop():                              # outputs dropped: the pool reuses them
            for _ in range(repeats):
                st.run(ins)
        return self.device.elapsed_ms(self.device.capture(loop, warmup=1).replay) / repeats

    # -- description ------------------------------------------------------------------------------------
    def summary(self, print_fn: Callable[[str], Any] = print) -> None:
        """The lowered model's layers, then what the passes did."""
        self.model.summary(print_fn)
        print_fn(f"{len(self.steps)} kernel calls at large batches, {self.dtype.name} ({self.precision}), "
                 f"{self.device.name}; "
                 + ", ".join(f"{k} {v}" for k, v in sorted(self.stats.items())))

    def __repr__(self) -> str:
        return f"InferenceModel({self.name!r}, {len(self.nodes)} nodes, {self.device})"

    def save(self, path: str | os.PathLike) -> str | os.PathLike:
        """Write the weights-only artifact (the lowered graph in Model.config's format) atomically."""
        return artifact.write(path, self.model, self.probabilities, self.stats, self.precision, self.images,
                              self.dataset)


def _channels_first(x: Any, shape: tuple[int, ...]) -> Any:
    """x (host or device array) in the (N, *shape) layout where it is one of the image layouts it stands for."""
    s = tuple(getattr(x, "shape", ()))
    if len(shape) != 3 or len(s) < 3:
        return x
    C, H, W = shape
    if C == 1 and s[1:] == (H, W):
        return x.reshape(s[0], C, H, W)
    if C in (1, 3) and s[1:] == (H, W, C) and s[1:] != shape:
        return x.transpose(0, 3, 1, 2)          # (N, H, W, C): the copy into the device buffer lays it out
    return x
