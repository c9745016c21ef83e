"""One training step, run eagerly or captured once as a CUDA graph and replayed.

A step is: gather the batch, forward, the loss from the logits (a minidl.losses.Loss: softmax
cross-entropy unless told), backward, the optimizer update, and the metrics; all of it on the
device with no host sync, so the whole step can be recorded as one graph. A device flag `finite`
turns False at the first step whose loss is not finite; from then on no update reaches the weights
or the optimizer state (the update kernels are gated by the flag), and `good_steps` counts the steps
before it, so the host, reading both at its monitoring interval (`divergence()`), can say where
training diverged.

Data-parallel ranks (minidl.distributed) give a `reducer`: backward hands it each bucket of the
flat gradient as soon as the bucket is final, to be summed over the ranks while backward goes on;
before the update the flag is AND-ed over the ranks and the update waits for the sums, which it
scales by 1/N (the optimizer is set up with grad_scale=1/N). All of it is inside the step, so a captured step
records the reductions too (on the GPU on their own stream, forked from the step's and joined back).

A precision policy (minidl.precision) lowers the model with the `cast` pass as well: its layers
compute on compute-dtype copies of the float32 weights and their gradients end in the float32
arena. Under fp16 the loss gradient is scaled and the gradients unscaled on the device
(minidl.training.loss_scale); a step whose gradients overflow is skipped without lowering `finite`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .. import precision
from .._types import Array, DTypeLike
from ..graph import passes
from .loss_scale import DynamicLossScale
from ..losses import Loss, SoftmaxCrossEntropy

if TYPE_CHECKING:
    from ..backend import CapturedCall
    from ..data.loader import Loader
    from ..distributed import Reducer
    from ..graph.model import Model
    from ..metrics import Mean
    from ..optim.base import Optimizer


def check_optimizer(optimizer: Any, model: Model) -> None:
    """`optimizer` is an Optimizer instance free to train `model` (Trainer(model, None) or the class itself
    was an AttributeError deep in the check: one TypeError naming what was given)."""
    from ..optim.base import Optimizer
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"Trainer: optimizer must be an Optimizer instance (e.g. minidl.optim.Adam(lr=1e-3)), "
                        f"got {optimizer!r}")
    optimizer.check_free_for(model)


class TrainStep:
    """forward/loss/backward/update of `model` (lowered for training) with `optimizer`; `metrics` add up.

    reducer: a distributed.Reducer among data-parallel ranks, None for one process.
    The options, keyword-only: policy: a precision.Policy (or its name); fp32 by default.
    loss: a losses.Loss of (logits, labels) (default SoftmaxCrossEntropy(smoothing)); smoothing: label
    smoothing of the default loss; shift: each training image is first shifted by up to `shift`
    pixels (random integers per image from the device's generator, as dropout's masks); flip: each
    training image is first mirrored left to right with probability 1/2 (the same generator).
    channels_last: convolutions write NHWC activations (None: where the device prefers it).

    What the trainer reads: `divergence()` (the NaN flag), `loss_scale_state()`, `evaluate(x, y, metrics)`.
    """

    def __init__(self, model: Model, optimizer: Optimizer, metrics: Mean, reducer: Reducer | None = None, *,
                 policy: precision.Policy | DTypeLike | None = None, loss: Loss | None = None,
                 smoothing: float = 0.0, shift: int = 0, flip: bool = False,
                 channels_last: bool | None = None) -> None:
        if (not 0.0 <= smoothing < 1.0 or isinstance(shift, bool) or not isinstance(shift, int) or shift < 0
                or not isinstance(flip, bool)):
            raise ValueError(f"TrainStep: smoothing must be in [0, 1), shift an int >= 0 and flip a bool, got "
                             f"{smoothing!r}, {shift!r}, {flip!r}")
        if loss is not None and smoothing:
            raise ValueError("TrainStep: smoothing is the default loss's: give SoftmaxCrossEntropy(smoothing=) "
                             "as loss= instead")
        self.loss = SoftmaxCrossEntropy(smoothing) if loss is None else loss
        self.eval_loss = self.loss.plain()         # evaluation reports the plain loss (no smoothing)
        self.shift, self.flip = shift, flip
        self.blank = 0.0             # a background pixel's value in eager batches (the trainer sets its loader's)
        self.requested = precision.policy(policy)
        _check_master(model, self.requested)
        # a model too small for half precision to pay on its device trains in fp32 (precision.where_it_pays);
        # logits out; ReLUs fused into BN and Add; convolutions channels-last where the device prefers it
        # (channels_last: None asks it); casts where the policy's compute dtype begins and ends
        self.policy, self.channels_last = passes.precision_and_layout(model.nodes, model.device, self.requested,
                                                                      channels_last)
        policy = self.policy
        layout = passes.channels_last if self.channels_last else (lambda g: g)
        self.net = model.lower(lambda g: passes.cast(layout(passes.training(g)), policy.compute, policy.param))
        self.net.releases = True             # each value let go after its last reader (graph/liveness.py)
        self.scaler = DynamicLossScale(model.device, policy.loss_scale) if policy.loss_scale else None
        self.optimizer, self.metrics, self.device = optimizer, metrics, model.device
        self.reducer = reducer
        if reducer is not None:             # the ranks sum the gradients bucket by bucket
            reducer.watch(self.net)
        shard = None if reducer is None else reducer.shard
        if shard is not None and self.scaler is not None:
            raise ValueError(f"shard_optimizer: precision {policy.name}'s loss scaling checks the whole gradient "
                             "arena, of which a sharded rank sums only its shard: use bf16 or fp32")
        # the update takes the mean over the ranks: their summed gradients x 1/N, inside its kernel; a sharded
        # optimizer (distributed/shard.py) updates this rank's shard alone and keeps state for it alone
        optimizer.setup(model, grad_scale=1.0 if reducer is None else reducer.grad_scale, shard=shard)
        self.overwrite = self.net.overwrites_grads           # backward overwrites: no zero_grad
        xp = self.device.xp
        self.finite, self.good_steps = xp.empty((), bool), xp.zeros((), "int64")
        self.device.fill(self.finite, True)
        self._gz: Array | None = None
        self._captured: dict[int, tuple[Array, CapturedCall]] = {}

    def reset_flag(self) -> None:
        """A new run: the loss is finite again and no step counted."""
        self.device.fill(self.finite, True)
        self.good_steps.fill(0)

    def divergence(self) -> int | None:
        """None while every loss since reset_flag() was finite, else how many steps came before the
        first that was not (their weights are the ones kept). Reads the device (one sync)."""
        if bool(self.device.to_host(self.finite)):
            return None
        return int(self.device.to_host(self.good_steps))

    def loss_scale_state(self) -> dict[str, float] | None:
        """fp16: the loss scale's {'scale', 'clean', 'skipped'} (one sync); None without loss scaling."""
        return None if self.scaler is None else self.scaler.state()

    def set_loss_scale_state(self, state: dict[str, Any]) -> None:
        """Continue fp16 loss scaling from `loss_scale_state()`'s record (a ValueError names a malformed one);
        without loss scaling nothing to do."""
        if self.scaler is not None:
            self.scaler.set_state(state)

    def evaluate(self, x: Array, y: Array, metrics: Mean) -> None:
        """Forward in inference mode on the training lowering; the batch's plain loss and hits add into
        `metrics` (on the device)."""
        logits = self.net.forward(x, training=False)
        loss_sum, correct = self.eval_loss(logits, y, self.device.xp.empty_like(logits))
        metrics.update(loss_sum, correct, len(y))

    # NumPy's overflow / invalid-value warnings of a diverging step printed lines of the kernels' files
    # ahead of the one line the NaN stop ends a run with (TerminateOnNaN names the step): the check covers them
    @np.errstate(over="ignore", invalid="ignore", divide="ignore")
    def forward_backward(self, x: Array, y: Array, blank: float = 0.0) -> tuple[Array, Array]:
        """Flip, shift, forward, loss from the logits, backward: on-device (loss_sum, correct); no update.
        `blank`: the value of a background pixel in x, which shifted images are filled with."""
        if self.flip:
            x = self.device.kernels.augment.random_flip(x, self.device.rng)
        if self.shift:
            x = self.device.kernels.augment.random_shift(x, self.shift, blank, self.device.rng)
        logits = self.net.forward(x, training=True)
        if self._gz is None or self._gz.shape != logits.shape:
            self._gz = self.device.xp.empty_like(logits)
        gz = self._gz
        loss_sum, correct = self.loss(logits, y, gz)
        if self.scaler is not None:
            self.scaler.scale_grad(gz)
        if not self.overwrite:
            self.net.zero_grad()
        ready = None if self.reducer is None else self.reducer.begin()     # buckets start as they are final
        self.net.backward(gz, input_grads=False, accumulate=not self.overwrite, ready=ready)
        return loss_sum, correct

    def __call__(self, x: Array, y: Array) -> None:
        """One eager step on the batch (x, y)."""
        loss_sum, correct = self.forward_backward(x, y, self.blank)
        self._update(loss_sum, correct)
        self.metrics.count += len(y)

    @np.errstate(over="ignore", invalid="ignore", divide="ignore")
    def _update(self, loss_sum, correct):
        """The NaN flag, the good steps, the metrics' sums (one kernel: softmax.loss_tally), the update."""
        one = self.reducer is None           # ranks count the good steps after the flag's AND
        self.device.kernels.softmax.loss_tally(loss_sum, correct, self.finite, self.good_steps if one else None,
                                               self.metrics.loss, self.metrics.correct)
        if not one:                          # a non-finite loss on any rank stops every rank, and the
            self.reducer.finish(self.finite)                 # update waits for the gradient sums
            self.good_steps += self.finite
        # Past the first non-finite loss the update is gated off inside the optimizer's kernel:
        # the weights and the optimizer state stay as they were, at no extra pass over memory.
        # Under loss scaling an overflowing step is gated off too, alone (after the average: every rank agrees).
        gate = self.finite if self.scaler is None else self.scaler.unscale(self.net.grads, self.finite)
        self.optimizer.step(gate=gate)

    # -- captured -------------------------------------------------------------------------
    def replay(self, loader: Loader, epoch: int, k: int) -> None:
        """The step on batch k of `epoch` as one graph launch (captured at the first call per loader)."""
        if self.optimizer.refresh():        # the first control or frozen weight: the controlled kernels
            self._captured.clear()          # (frozen flags set later are read from the device arrays)
        captured = self._captured.get(id(loader))
        if captured is None:
            captured = self._captured[id(loader)] = self._capture(loader, epoch, k)
        idx, call = captured
        self.device.xp.copyto(idx, loader.indices(epoch, k))     # a memcpy
        call.replay()
        self.metrics.count += loader.batch_size

    def _capture(self, loader, epoch, k):
        """The whole step, the batch gathered on the device from a fixed index buffer.

        Per step the host then issues one device-to-device copy of the indices and one launch. A host
        loader (data/host_loader.py) first copies its batch into the fixed `loader.x`, `loader.y`
        the step reads; the step's own batch (epoch, k) is asked for first, so a stream reads no extra one.
        """
        xp, model = self.device.xp, self.net
        first = loader.indices(epoch, k)
        idx = xp.empty_like(first)
        xp.copyto(idx, first)

        def step():
            x, y = self.device.kernels.augment.gather_batch(loader.x, loader.y, idx)     # one launch on the GPU
            loss_sum, correct = self.forward_backward(x, y, loader.blank)
            self._update(loss_sum, correct)

        # The warm-up runs really train: snapshot everything a step changes and put it back. Two: the
        # first compiles and chooses engines, the second is traced for the memory plan (capture.py).
        state = [model.flat, model.state_flat, self.metrics.loss, self.metrics.correct, self.finite,
                 self.good_steps, self.device.rng.offset] + self.optimizer.device_arrays()
        state += self.scaler.device_arrays() if self.scaler is not None else []
        saved = [xp.empty_like(a) for a in state]
        for a, b in zip(saved, state):       # copyto: a memcpy, where copy() and a[...] = b compile a kernel per dtype
            xp.copyto(a, b)
        call = self.device.capture(step, warmup=2)
        for a, b in zip(state, saved):
            xp.copyto(a, b)
        return idx, call

    def forget_captures(self) -> None:
        """Drop captured graphs (after a resume rewrites what they were recorded with)."""
        self._captured.clear()


def _check_master(model, policy):
    """Mixed precision trains float32 master weights, all of them in the model's one arena."""
    if policy.mixed and model.device.dtype != policy.param:
        raise ValueError(f"precision {policy.name} keeps {policy.param.name} master weights; "
                         f"{model.name} is {model.device.dtype.name}")
    if model.side_arenas:
        raise ValueError(f"{model.name} has layers computing in {', '.join(d.name for d in model.side_arenas)} "
                         "with weights of their own, which no optimizer updates: train the float32 model "
                         "with a precision policy (precision='bf16') instead")
