"""The training loop: steps or epochs, on-device metrics read at each monitoring interval,
evaluation over the whole test set, NaN stop, checkpoints and exact resume."""
import math
import sys
import time


from . import checkpoint as ckpt
from .backend import get_device
from .data.loader import Loader
from .layers.dropout import Dropout
from .losses import backward_from_loss, softmax_cross_entropy
from .metrics import Mean


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is left untouched."""


class Trainer:
    """Trains `model` with `optimizer` on `device` ('auto', 'cpu', 'cuda' or a Device).

    One step: forward in training mode, softmax cross-entropy from the logits, backward,
    optimizer update. Loss and accuracy accumulate on the device and are read (one sync) every
    `monitor` steps, when the seed's line `step:  100, loss: 0.082, accuracy: 45.188%` is printed.
    """

    def __init__(self, model, optimizer, device=None, seed=0, log=print, progress=None, graph=True):
        if device is not None:
            dev = get_device(device, dtype=model.device.dtype, seed=seed)
            if dev.name != model.device.name:
                model.to(dev)
        self.model, self.optimizer, self.seed, self.log = model, optimizer, seed, log
        self.device = model.device
        optimizer.setup(model)
        self.step = 0                      # steps trained so far (restored by resume)
        self.progress = sys.stdout.isatty() if progress is None else progress
        # On the GPU the whole step is captured as one CUDA graph per loader (graph=False: eager).
        self.graph = graph and self.device.name == "cuda"
        if self.graph and any(isinstance(l, Dropout) for l in model.layers):
            # CuPy's generator allocates per draw, which a captured graph cannot replay.
            log("note: the model has Dropout, which cannot be captured yet: training runs eagerly")
            self.graph = False
        self.metrics = Mean(self.device)   # one set of accumulators: captured graphs add into it
        # Fewer kernels per step: on the GPU each ReLU after a BN or an Add is applied by that
        # layer, and wherever every layer can, parameter gradients are overwritten by backward
        # instead of being zeroed and then added into.
        if self.device.name == "cuda":
            model.fuse(True)
        self.overwrite = model.can_overwrite
        self._gz, self._graphs, self._loaders = None, {}, {}

    # -- one step ------------------------------------------------------------------------------
    def _forward_backward(self, x, y):
        """Forward, loss from the logits, backward: on-device (loss_sum, correct); no update."""
        model = self.model
        model.forward(x, training=True)
        if self._gz is None or self._gz.shape != model.logits.shape:
            self._gz = self.device.xp.empty_like(model.logits)
        loss_sum, correct, gz = softmax_cross_entropy(model, y, self._gz)
        if not self.overwrite:
            model.zero_grad()
        backward_from_loss(model, gz, accumulate=not self.overwrite)
        return loss_sum, correct

    def train_step(self, x, y):
        """Forward, loss, backward and update on one batch; returns on-device (loss_sum, correct)."""
        result = self._forward_backward(x, y)
        self.optimizer.step()
        return result

    def _run_step(self, loader, epoch, k):
        if not self.graph:
            x, y = loader.batch(epoch, k)
            self.metrics.update(*self.train_step(x, y), len(y))
            return
        captured = self._graphs.get(id(loader))
        if captured is None:
            captured = self._graphs[id(loader)] = _CapturedStep(self, loader)
        captured.run(epoch, k)

    def _train_loader(self, data, batch_size):
        """The training loader; one per dataset and batch size, kept so captured graphs stay valid."""
        if isinstance(data, Loader):
            return data
        key = (id(data[0]), id(data[1]), batch_size)
        if key not in self._loaders:
            self._loaders[key] = (data, self._loader(data, batch_size, shuffle=True, drop_last=True))
        return self._loaders[key][1]

    def _loader(self, data, batch_size, shuffle, drop_last):
        if isinstance(data, Loader):
            return data
        images, labels = data
        return Loader(images, labels, batch_size, self.device, shuffle=shuffle, seed=self.seed,
                      drop_last=drop_last)

    # -- training ------------------------------------------------------------------------------
    def fit(self, data, steps=None, epochs=None, batch_size=32, monitor=100, save_to=None):
        """Train for `steps` (or `epochs` of the whole set) more steps; returns the last
        interval's (loss, accuracy %). Saves to `save_to` at the end, only if training stayed finite.
        """
        loader = self._train_loader(data, batch_size)
        per_epoch = len(loader)
        if steps is None:
            steps = (epochs or 1) * per_epoch
        metrics, result = self.metrics, (math.nan, math.nan)
        metrics.reset()
        bar = _bar(steps, self.progress)
        end = self.step + steps
        t0 = t1 = time.perf_counter()
        while self.step < end:
            epoch, k = divmod(self.step, per_epoch)
            try:
                self._run_step(loader, epoch, k)
            except Exception as e:
                _raise_if_out_of_memory(e, self.model, loader.batch_size)
                raise
            self.step += 1
            if self.step == end - steps + 1:     # one sync: the first step's compilation apart
                self.device.sync()
                t1 = time.perf_counter()
            if bar is not None:
                bar.update(1)
            if self.step % monitor == 0 or self.step == end:
                result = metrics.result()
                metrics.reset()
                if not math.isfinite(result[0]):
                    raise TrainingDiverged(f"loss is {result[0]} at step {self.step}: training stopped"
                                           + (f"; {save_to} was not overwritten" if save_to else ""))
                if self.step % monitor == 0:
                    self._print(bar, f"step: {self.step:4d}, loss: {result[0]:.3f}, accuracy: {result[1]:.3f}%")
        if bar is not None:
            bar.close()
        self.device.sync()
        t2 = time.perf_counter()
        self.timing = {"steps": steps, "total_s": t2 - t0, "first_s": t1 - t0,
                       "steady_ms": (t2 - t1) / max(steps - 1, 1) * 1e3}
        if save_to:
            self.save(save_to)
        return result

    def _print(self, bar, line):
        if bar is not None:
            bar.write(line)
        else:
            self.log(line)

    # -- evaluation ----------------------------------------------------------------------------
    def evaluate(self, data, batch_size=1000, steps=None):
        """(mean loss, accuracy %) over the whole set, or over its first `steps` batches."""
        loader = self._loader(data, batch_size, shuffle=False, drop_last=False)
        metrics = Mean(self.device)
        for i, (x, y) in enumerate(loader):
            if steps is not None and i >= steps:
                break
            self.model.forward(x, training=False)
            loss_sum, correct, _ = softmax_cross_entropy(self.model, y)
            metrics.update(loss_sum, correct, len(y))
        return metrics.result()

    # -- checkpoints ---------------------------------------------------------------------------
    def save(self, path):
        if not bool(self.device.xp.all(self.device.xp.isfinite(self.model.flat))):
            raise TrainingDiverged(f"parameters are not finite: {path} was not overwritten")
        meta = {"step": self.step, "seed": self.seed}
        rng = getattr(self.device.rng, "bit_generator", None)
        if rng is not None and self.device.name == "cpu":
            meta["rng"] = rng.state
        return ckpt.save(path, self.model, self.optimizer, meta)

    def resume(self, path):
        """Restore weights, optimizer state, step and generator state from a checkpoint."""
        meta = ckpt.load(path, self.model, self.optimizer)
        self._graphs.clear()               # captured steps hold the old step count
        self.step, self.seed = int(meta.get("step", 0)), int(meta.get("seed", self.seed))
        if "rng" in meta and self.device.name == "cpu":
            self.device.rng.bit_generator.state = meta["rng"]
        return meta


class _CapturedStep:
    """One training step (gather, forward, loss, backward, update, metrics) as a CUDA graph.

    The batch enters through `idx`, a fixed device buffer that receives the batch's indices by
    one device-to-device copy; the graph gathers the images itself. Per step the host then
    issues that copy, the learning-rate refresh when a schedule moves it, and one graph launch.
    """

    def __init__(self, trainer, loader):
        from .cudagraph import CapturedCall
        xp, opt, model = trainer.device.xp, trainer.optimizer, trainer.model
        self.trainer, self.loader = trainer, loader
        self.idx = xp.zeros(loader.batch_size, dtype=loader.indices(0, 0).dtype)
        self.idx[...] = loader.indices(0, 0)
        opt.bind_device_scalars()
        metrics = trainer.metrics

        def step():
            x = xp.take(loader.x, self.idx, axis=0)
            y = xp.take(loader.y, self.idx, axis=0)
            loss_sum, correct = trainer._forward_backward(x, y)
            opt.device_step()
            metrics.add(loss_sum, correct)

        # The warm-up run really trains: snapshot everything a step changes and put it back.
        state = [model.flat, model.state_flat, metrics.loss, metrics.correct] + opt.device_arrays()
        saved = [a.copy() for a in state]
        self.call = CapturedCall(trainer.device, step, warmup=1)
        for a, b in zip(state, saved):
            a[...] = b

    def run(self, epoch, k):
        self.idx[...] = self.loader.indices(epoch, k)
        self.trainer.optimizer.host_step()
        self.call.replay()
        self.trainer.metrics.count += self.loader.batch_size


def _raise_if_out_of_memory(e, model, batch_size):
    if type(e).__name__ == "OutOfMemoryError" or "CUDNN_STATUS_ALLOC_FAILED" in str(e) \
            or "out of memory" in str(e).lower():
        from .backend import DeviceError
        raise DeviceError(f"out of GPU memory training {model.name} ({model.n_params:,} parameters) "
                          f"at batch size {batch_size}: try a smaller -b") from None


def _bar(total, enabled):
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, unit="step", leave=False, dynamic_ncols=True)
