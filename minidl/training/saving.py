"""What the Trainer does with checkpoints: save, resume, and the NaN check every save makes first."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..data.datasets import SHA256
from .. import checkpoint as ckpt
from ..distributed import heartbeat
from .hooks import TrainingDiverged

if TYPE_CHECKING:
    from ..backend import Device
    from ..distributed import World
    from ..graph.model import Model
    from ..metrics import Mean
    from ..optim.base import Optimizer
    from .step import TrainStep


DATASETS = tuple(SHA256)         # the datasets minidl knows by name: those `minidl infer` can score on


class Saving:
    """Trainer's checkpoints (a base class of it): check_finite, save, resume.

    dataset: the name of the data this run trains on ('mnist', 'fashion-mnist'), recorded in every
    checkpoint it saves (its `data` record, checkpoint/checkpoint_data.py) so that `minidl infer` scores it
    on that data; arrays do not say which dataset they are, so a run in Python names it here or in
    save(dataset=); a command-line run's plan names it already.
    """

    dataset: str | None = None

    if TYPE_CHECKING:              # what Trainer has
        model: Model
        optimizer: Optimizer
        device: Device
        world: World
        metrics: Mean
        step: int
        seed: int
        plan: dict[str, Any] | None
        _step: TrainStep
        _since: int
        _global_batch: int | None
        _resumed_batch: int | None

        @property
        def loss_scale(self) -> dict[str, float] | None: ...

        def _average_state(self) -> None: ...

    def check_finite(self, path: str | os.PathLike | None = None) -> None:
        """Raise TrainingDiverged where a loss of this run was not finite (the NaN flag, AND-ed over the
        ranks inside each step: one sync); the step count goes back to the last good step, whose
        weights the model holds (no update follows a bad loss), and `path` is named as left untouched."""
        good = self._step.divergence()
        if good is None:
            return
        bad = self._since + good + 1
        loss = float(self.device.to_host(self.metrics.loss))      # nan or inf from there on
        self.step = bad - 1
        raise TrainingDiverged(f"loss is {loss} at step {bad}: training stopped, the weights are those after "
                               f"step {bad - 1}" + _untouched(path))

    # -- checkpoints ---------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, dataset: str | None = None) -> str | os.PathLike | None:
        """Write a resumable checkpoint to `path` (rank 0 only), after checking that the weights are
        finite. dataset: as the `dataset` attribute, which it sets for this and the later saves."""
        if dataset is not None:
            if dataset not in DATASETS:
                raise ValueError(f"Trainer.save: dataset must be one of {', '.join(map(repr, DATASETS))}, "
                                 f"got {dataset!r}")
            self.dataset = dataset
        if not bool(self.device.xp.all(self.device.xp.isfinite(self.model.flat))):
            raise TrainingDiverged(f"parameters are not finite{_untouched(path)}")
        self._average_state()
        if self.optimizer.shard is not None:     # a sharded optimizer's state, every rank's, to rank 0 (collective)
            self.optimizer.shard.gather(self.optimizer.state, self.device)
        if not self.world.main:              # rank 0 saves: the same checkpoint as one process
            return None
        meta = {"step": self.step, "seed": self.seed, "ranks": self.world.size, "global_batch": self._global_batch,
                "plan": self.plan, "rng": self.device.rng_state(), "loss_scale": self.loss_scale,
                "dataset": self.dataset}
        meta = {k: v for k, v in meta.items() if v is not None}
        with heartbeat.during("saving"):           # slow by nature: the other ranks' watchdogs wait it out
            saved = ckpt.save(path, self.model, self.optimizer, meta)
        heartbeat.checkpointed(path, self.step)    # named if the run fails later
        return saved

    def resume(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restore weights, optimizer state, step and generator state from a checkpoint."""
        meta = ckpt.load(path, self.model, self.optimizer)
        self._step.forget_captures()       # captured steps hold the old step count
        self.step, self.seed = int(meta.get("step", 0)), int(meta.get("seed", self.seed))
        heartbeat.checkpointed(path, self.step)
        self.plan = meta.get("plan", self.plan)
        if meta.get("dataset") in DATASETS:          # the data the run named: its later saves keep it
            self.dataset = meta["dataset"]
        batch = meta.get("global_batch")
        self._resumed_batch = batch if type(batch) is int and batch > 0 else None
        self.device.set_rng_state(meta.get("rng"))
        if "loss_scale" in meta:      # else it starts afresh
            try:
                self._step.set_loss_scale_state(meta["loss_scale"])
            except ValueError as e:
                raise ckpt.CheckpointError(f"checkpoint {path}: {e}") from None
        return meta


def _untouched(path) -> str:
    """What a stop for a loss that is not finite left at `path`: a file there was not overwritten, none was saved."""
    if not path:
        return ""
    return f"; {path} was not overwritten" if os.path.exists(path) else f"; nothing was saved to {path}"
