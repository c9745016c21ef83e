"""The training loop: steps or epochs, on-device metrics read at each monitoring interval,
evaluation over the whole test set, checkpoints and exact resume; what a run does besides
training (the bar, logs, periodic saves, the NaN stop, the save at a stop request) are callbacks."""
from __future__ import annotations
import math
import os
import sys
import time
from numbers import Integral
from typing import TYPE_CHECKING, Any, Callable, Sequence

from . import callbacks as cb, interrupt
from .saving import Saving
from .. import distributed
from .._types import Array
from ..backend import Device, DeviceError, get_device
from .callbacks import Callback, TrainingDiverged, TrainingStopped  # noqa: F401 (re-exported: minidl.TrainingDiverged)
from .history import History, record
from ..optim import schedules
from ..data.sources import TrainLoaders, loader_for
from ..metrics import Mean, Score
from .step import TrainStep, check_optimizer
if TYPE_CHECKING:
    from ..distributed import World
    from ..graph.model import Model
    from ..losses import Loss
    from ..files.metrics_log import Logs, MetricsLog
    from ..optim.base import Optimizer
    from ..precision import Policy
    from ..files.tensorboard_log import TensorBoardLog


class Trainer(Saving):
    """Trains `model` with `optimizer` on `device` ('auto', 'cpu', 'cuda' or a Device).

    One step (minidl.training.step): forward in training mode, the loss from the logits, backward, optimizer
    update. Loss and accuracy accumulate on the device and are read (one sync) every `monitor` steps,
    when the C++ trainer's line `step:  100, loss: 0.082, accuracy: 45.188%` is printed.
    Everything after model and optimizer is keyword-only.
    world: the data-parallel ranks (minidl.distributed; default: MPI's under mpiexec, else one process);
    with several, fit, evaluate and save are collective (every rank calls them) and rank 0 prints and writes.
    precision: 'fp32' (default), 'bf16' or 'fp16' (or a minidl.precision.Policy): the dtype convolutions,
    dense layers and activations compute in, float32 master weights, fp16 with dynamic loss scaling
    (torch.autocast with a GradScaler); checkpoints stay float32 and load under any precision.
    loss: a minidl.losses.Loss of (logits, labels), SoftmaxCrossEntropy() by default; label_smoothing: the
    default loss's, SoftmaxCrossEntropy(smoothing=) (evaluation reports the plain cross-entropy); shift: training
    images are shifted by random integers of up to `shift` pixels, filled with the background; flip:
    training images are mirrored left to right with probability 1/2 (before the shift).
    channels_last: convolutions write NHWC activations (graph.passes.channels_last); None: where the
    device finds it faster (Device.channels_last: the GPU in bf16/fp16). Shapes and results stay NCHW.
    grad_reduce: the dtype gradients travel in between data-parallel ranks, 'fp32' or 'bf16' (half the bytes,
    rounded: distributed.Reducer). shard_optimizer: N ranks each update 1/N of the weights (distributed/shard.py).
    """

    def __init__(self, model: Model, optimizer: Optimizer, *, device: str | Device | None = None, seed: int = 0,
                 log: Callable = print, progress: bool | None = None, graph: bool = True, world: World | None = None,
                 precision: Policy | str | None = None, loss: Loss | None = None, label_smoothing: float = 0.0,
                 shift: int = 0, flip: bool = False, channels_last: bool | None = None,
                 grad_reduce: str = "fp32", shard_optimizer: bool = False) -> None:
        check_optimizer(optimizer, model)    # an Optimizer, free: one for two Trainers would train neither
        if device is not None:
            dev = get_device(device, dtype=model.device.dtype, seed=seed)
            if dev.xp is not model.device.xp:     # another backend: rebuild the model there
                model.to(dev)
        self.model, self.optimizer, self.seed, self.log, self.device = model, optimizer, seed, log, model.device
        self.step = 0                      # steps trained so far (restored by resume)
        self.plan: dict[str, Any] | None = None     # the run's plan (JSON), saved in its checkpoints
        self._stop: int | None = None               # a signal number once a stop is requested
        self._record_sums = [0.0, 0.0, 0]           # loss x images, hits, images since the History's last record
        self._since = 0                             # where the NaN flag began counting (fit's first step)
        self._global_batch = self._resumed_batch = None  # type: int | None  # all ranks' batch: fit's, checkpoint's
        self.progress = sys.stdout.isatty() if progress is None else progress
        self.metrics = Mean(self.device)   # one set of accumulators: captured graphs add into it
        self.world = world or distributed.init()
        if not self.world.main:            # rank 0 prints
            log = self.log = lambda *a, **k: None
            self.progress = False
        self.reducer = self.world.reducer(self.device, grad_reduce=grad_reduce, stop_asked=lambda: self._stop,
                                          **({"shard": shard_optimizer} if shard_optimizer is not False else {}))
        if self.reducer:     # every rank starts from rank 0's weights, seed and generator: one run
            self.seed = self.reducer.start_alike(model, seed)
        self.device.rng.shard(self.world.rank, self.world.size)   # ranks draw as one process would
        self._step = TrainStep(model, optimizer, self.metrics, self.reducer, policy=precision, loss=loss,
                               smoothing=label_smoothing, shift=shift, flip=flip, channels_last=channels_last)
        self.precision, self.channels_last = self._step.policy, self._step.channels_last
        if self.precision is not self._step.requested:
            log(f"precision {self._step.requested.name}: {model.name} is too small for half precision to pay here "
                f"(docs/precision.md): it computes in fp32")
        # The whole step is captured as one CUDA graph per loader where the device can (graph=False:
        # eager); dropout's counter-based generator advances on the device, so it is captured too.
        self.graph = graph and self.device.can_capture
        self._loaders = TrainLoaders()        # fit's last loader of arrays, kept for the next fit on them
        self._trained_on: Any = None          # the loader of the last fit: its captured step

    @property
    def loss_scale(self) -> dict[str, float] | None:
        """fp16: the loss scale's {'scale', 'clean', 'skipped'} read from the device (one sync); else None."""
        return self._step.loss_scale_state()

    def train_step(self, x: Array, y: Array) -> Mean:
        """Forward, loss, backward and update on one batch (eagerly); returns the interval's metrics."""
        self._step(self.model.prepare_input(x), y)
        return self.metrics

    def _run_step(self, loader, per_epoch):
        """Step self.step + 1: one graph launch where captured, else eagerly; out of memory says what to do."""
        epoch, k = divmod(self.step, per_epoch)
        distributed.heartbeat.step_begins(self.step + 1, first=self.step == self._since)   # ranks watch each other
        try:
            if self.graph:
                self._step.replay(loader, epoch, k)
            else:
                self.train_step(*loader.batch(epoch, k))
        except Exception as e:
            if self.device.is_out_of_memory(e):
                raise DeviceError(f"out of GPU memory training {self.model.name} ({self.model.n_params:,} "
                                  f"parameters) at batch size {loader.batch_size}: try a smaller -b") from None
            raise
        self.step += 1
        distributed.heartbeat.step_ends(self.step)

    def _train_loader(self, x, y, batch_size, **how):
        """fit's loader (data/sources.py): the last fit's again where its arrays are unchanged, so its
        captured step stays valid; a new one drops the old one's captured step (one kept at most)."""
        loader = self._loaders.get(x, y, self.model, self.device, where="fit", batch_size=batch_size, seed=self.seed,
                                   rank=self.world.rank, world=self.world.size, fits=self._check_fits, **how)
        if loader is not self._trained_on:
            self._step.forget_captures()
            self._trained_on = loader
        return loader

    def _check_fits(self, top: int | None) -> None:
        """The model's output must be (N, classes) with a class for the largest label the data holds,
        `top` (None: labels come batch by batch, checked as they come)."""
        if len(self.model.outputs) != 1:
            names = ", ".join(o.layer.name for o in self.model.outputs)
            raise ValueError(f"{self.model.name} has {len(self.model.outputs)} outputs ({names}): fit and evaluate "
                             f"train and score a model of one output (the logits the loss reads)")
        out = self.model.outputs[0].shape
        top = top or 0
        if len(out) != 2 or out[1] <= top:
            last = self.model.outputs[0].layer
            shape = "(" + ", ".join("N" if d is None else str(d) for d in out) + ")"
            raise ValueError(f"layer {last.name} ({type(last).__name__}): the model outputs shape "
                             f"{shape}, but the labels need (N, {top + 1}): {top + 1} classes or more")

    # -- training ------------------------------------------------------------------------------
    def request_stop(self, signum: int) -> None:
        """Stop after the current step: save to the checkpoint path and raise TrainingStopped.
        Safe to call from a signal handler."""
        self._stop = signum

    @interrupt.stops_on_ctrl_c
    def fit(self, x: Any, y: Any = None, *, steps: int | None = None, epochs: int | None = None, batch_size: int = 32,
            steps_per_epoch: int | None = None, data_format: str | None = None, augment: Callable | None = None,
            monitor: int = 100, save_to: str | os.PathLike | None = None, save_every: int | None = None,
            checkpoint: str | os.PathLike | Callable[[], str | os.PathLike | None] | None = None,
            metrics_log: MetricsLog | TensorBoardLog | Logs | None = None, callbacks: Sequence[Callback] = (),
            more_steps: int | None = None, validation_data: Any = None, validation_freq: int | None = None,
            validation_batch_size: int = 1000) -> History:
        """Train on `(images, labels)`, `images, labels` (Keras's order), a map-style dataset, an iterable
        or generator of (x_batch, y_batch) batches, or a Loader (minidl.data.sources) until the run has
        trained `steps` steps in all (the command line's -n: after resume() at step 1749, steps=3000 trains
        1251 more), or `epochs` epochs in all (Keras's epochs with initial_epoch), or `more_steps` more
        than it has (default: one epoch more). Images as docs/input.md says. The rest is keyword-only
        (Keras's third positional is batch_size). steps_per_epoch: the steps of an epoch of a source without
        len() (Keras's); data_format: 'channels_last' for NHWC images; augment: a function of a host batch
        (x, y) -> (x, y).

        Returns a History: the last interval's Score (loss, accuracy as a fraction), `loss, acc = fit(...)`,
        with Keras's `.history["loss"]`, `["val_accuracy"]`, ... a value per record.
        validation_data: data as evaluate takes it, scored at every epoch's end, or every `validation_freq`
        steps (in `validation_batch_size` batches): 'val_loss', 'val_accuracy' in the records.
        save_to: saved at the end, only if training stayed finite. checkpoint: where a stop request
        (request_stop, Ctrl-C) and every `save_every` steps save (default save_to; for a stop also a function
        returning the path, called at the stop); each save first checks that training stayed finite.
        Ctrl-C in the main thread finishes the step, saves to `checkpoint` and raises TrainingInterrupted
        (a TrainingStopped and a KeyboardInterrupt); a second Ctrl-C interrupts at once.
        metrics_log: a log from minidl.files.metrics_log.open_logs that gets one record per monitoring interval.
        callbacks: minidl.training.callbacks hooks (EarlyStopping, ReduceLROnPlateau, ModelCheckpoint or a
        user's), called after the built-ins (TerminateOnNaN, metrics_log's records, the bar and line,
        save_every's Checkpoints) and before SaveOnStop; run.stop ends a run early. What
        every rank must do at the same step stays in the trainer (_interval, _agree_stop), never in a callback.
        """
        for what, v in (("steps", steps), ("epochs", epochs), ("batch_size", batch_size), ("monitor", monitor),
                        ("save_every", save_every), ("more_steps", more_steps), ("validation_freq", validation_freq),
                        ("validation_batch_size", validation_batch_size)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, Integral) or v <= 0):
                raise ValueError(f"fit: {what} must be a positive int, got {v!r}")
        if sum(v is not None for v in (steps, epochs, more_steps)) > 1:
            raise ValueError("fit: give one of steps (the run's total), epochs (in all) or more_steps")
        checkpoint = checkpoint or save_to
        if save_every is not None and not checkpoint:
            raise ValueError("fit: save_every needs a checkpoint path (checkpoint= or save_to=)")
        left = steps - self.step if steps is not None else more_steps      # this call's steps, where said
        loader = self._train_loader(x, y, batch_size, steps=None if left is None else max(left, 1), epochs=epochs,
                                    steps_per_epoch=steps_per_epoch, data_format=data_format, augment=augment)
        val = (None if validation_data is None else
               loader_for(validation_data, None, self.model, self.device, where="fit validation_data",
                          batch_size=validation_batch_size, training=False, seed=self.seed, rank=self.world.rank,
                          world=self.world.size, data_format=data_format, fits=self._check_fits))
        self._global_batch, self._resumed_batch = self.world.global_batch(loader.batch_size, self._resumed_batch), None
        self._step.blank = loader.blank      # shifted images are filled with the background
        per_epoch = len(loader)
        end = self.step + left if left is not None else (epochs or 0) * per_epoch or self.step + per_epoch
        distributed.agree(self.world, {"steps": end, "batch_size": loader.batch_size, "steps an epoch": per_epoch,
                                       "monitor": monitor})     # ranks out of step would wait for each other
        if end <= self.step:                 # the data checked all the same
            return self._nothing_left(f"steps={steps}" if steps is not None else f"epochs={epochs} ({end} steps)")
        # a schedule named without its length ("cosine") spans the run's steps, as on the command line
        self.optimizer.schedule = schedules.for_run(self.optimizer.schedule, end)
        result = Score(math.nan, math.nan)
        self.metrics.reset()
        self._step.reset_flag()
        self._since, self._record_sums = self.step, [0.0, 0.0, 0]
        show, logs = cb.Progress(), [cb.MetricsRecords(metrics_log)] if metrics_log is not None else []
        every = [cb.Checkpoints(checkpoint, save_every)] if save_every else []  # type: ignore[arg-type]
        hooks = [cb.TerminateOnNaN(save_to), *logs, show, *every, *callbacks, cb.SaveOnStop(checkpoint)]
        run = cb.Run(self, self.step, end, per_epoch, loader, monitor, hooks)
        # a record closes the monitoring interval where it scores the validation data (its train loss then
        # covers every step since the last); else it takes the intervals closed since the last (the cadence kept)
        closes = val is not None or validation_freq is not None
        run.emit("on_train_begin")
        t0 = t1 = time.perf_counter()
        quiet = self.device.preparing(show.say)     # a cold first step says what it does
        while self.step < run.end and not run.stop:
            self._run_step(loader, per_epoch)
            run.stop = run.stop or loader.exhausted     # a stream of batches ran out: its epoch, and the run, end
            if self.step == run.start + 1:       # one sync: the first step's compilation apart
                self.device.sync()
                t1, _ = time.perf_counter(), quiet()
            if interval := self.step % monitor == 0 or self.step == run.end:
                result = self._interval(run)
            run.emit("on_step_end")
            if epoch_end := self.step % per_epoch == 0 or loader.exhausted:
                run.emit("on_epoch_end", (self.step - 1) // per_epoch)
            if (self.step % validation_freq == 0 if validation_freq else epoch_end) or (
                    (self.step == run.end or run.stop) and self._record_sums[2]):
                if closes and not interval:
                    result, interval = self._interval(run), True
                record(run, val)
            if run.stop and not interval:        # a callback ended the run between intervals
                result = self._interval(run)
            self._agree_stop(run)
        if run.signal is None:                   # a request in the last steps
            self._agree_stop(run, final=True)
        distributed.heartbeat.phase("idle")       # out of training (the last sync, saves): no step to judge hung
        run.emit("on_train_end")                 # after a stop request SaveOnStop saves and raises
        self.device.sync()
        t2, steps = time.perf_counter(), self.step - run.start
        self.timing = {"steps": steps, "total_s": t2 - t0, "first_s": t1 - t0,
                       "steady_ms": (t2 - t1) / max(steps - 1, 1) * 1e3}
        if save_to:
            self.save(save_to)
        return History.of(result, run.history)

    def _nothing_left(self, total: str) -> History:
        self.log(f"fit: the run has trained {self.step} steps, {total} is the run's total: nothing to train "
                 f"(more_steps=N trains N more)")
        return History.of(Score(math.nan, math.nan), {})

    # -- what every rank does at the same step: kept out of callbacks --------------------------
    def _interval(self, run):
        """A monitoring interval's end: the ranks' metric sums, then on_interval (TerminateOnNaN first)."""
        if self.reducer:                      # the loss and accuracy of the global batches
            self.reducer.sum_metrics(self.metrics)
        run.images, result = self.metrics.count, self.metrics.result()
        if not math.isnan(result.loss):          # the History's record: means weighted by images
            sums = self._record_sums
            sums[0] += result.loss * run.images
            sums[1] += result.accuracy * run.images
            sums[2] += run.images
        run.emit("on_interval", result)
        self.metrics.reset()
        return result

    def _agree_stop(self, run, final=False):
        """The ranks' vote on stop requests (World.agree_stop, read a step late): once agreed, every
        rank ends the run after this same step."""
        if (signum := self.world.agree_stop(self._stop, final)) is not None:
            self._stop, run.signal, run.stop = None, signum, True

    # -- evaluation ----------------------------------------------------------------------------
    def evaluate(self, x: Any, y: Any = None, *, batch_size: int = 1000, steps: int | None = None,
                 data_format: str | None = None) -> Score:
        """Score(mean loss, accuracy as a fraction) over the whole set, or over its first `steps`
        batches; the data as fit takes it (arrays, a dataset, batches, a Loader; data_format as fit's)."""
        for what, v in (("steps", steps), ("batch_size", batch_size)):     # steps=None: the whole set
            if v is not None and (isinstance(v, bool) or not isinstance(v, Integral) or v <= 0):
                raise ValueError(f"evaluate: {what} must be a positive int, got {v!r}")
        distributed.heartbeat.phase("evaluation")
        loader = loader_for(x, y, self.model, self.device, where="evaluate", batch_size=batch_size, training=False,
                            seed=self.seed, rank=self.world.rank, world=self.world.size, data_format=data_format,
                            fits=self._check_fits)
        self._average_state()
        metrics = Mean(self.device)
        for i, (x, y) in enumerate(loader):
            if steps is not None and i >= steps:
                break
            if len(y) == 0:                   # a rank past the end of the last batch
                continue
            self._step.evaluate(x, y, metrics)
        if self.reducer:                      # each rank scored its shard: the sums over all
            self.reducer.sum_metrics(metrics)
        return metrics.result()

    def _average_state(self):
        """BatchNorm trains on per-rank statistics: the running ones become their mean over the ranks."""
        if self.reducer:
            self.reducer.average(self.model.state_flat)
