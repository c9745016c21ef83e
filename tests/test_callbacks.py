"""The training loop's seam (minidl.training.callbacks): hooks called in order at the right steps and epochs,
a callback ending a run early (saved, its step and score right), a signal stop ending the callbacks
before its save, and a user callback on every rank under `mpiexec -n 2`. The built-ins' output is
tests/test_trainer.py's, test_metrics_log.py's, test_cli.py's and test_resume.py's."""
import importlib.util
import math
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import minidl as dl
from minidl.training import callbacks
from minidl import layers as L, optim
from minidl.training.trainer import TrainingStopped

ROOT = pathlib.Path(__file__).resolve().parents[1]
MPI = shutil.which("mpiexec") is not None and importlib.util.find_spec("mpi4py") is not None


def tiny_trainer(seed=0):
    model = dl.Sequential([L.Flatten(), L.Dense(16), L.ReLU(), L.Dense(10)], (1, 8, 8), seed=seed)
    return dl.Trainer(model, optim.SGD(lr=0.05), device="cpu", progress=False, log=lambda s: None)


def data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 8, 8), dtype=np.uint8), rng.integers(0, 10, n).astype(np.uint8)


class Recorder(callbacks.Callback):
    def __init__(self):
        self.events = []

    def on_train_begin(self, run):
        self.events.append(("begin", run.step, run.start, run.end, run.per_epoch))

    def on_step_end(self, run):
        self.events.append(("step", run.step))

    def on_interval(self, run, score):
        self.events.append(("interval", run.step, score))

    def on_epoch_end(self, run, epoch):
        self.events.append(("epoch", run.step, epoch))

    def on_train_end(self, run):
        self.events.append(("end", run.step))


def test_hooks_are_called_in_order_at_their_steps_and_epochs():
    trainer, rec = tiny_trainer(), Recorder()
    result = trainer.fit(data(), steps=10, batch_size=16, monitor=3, callbacks=[rec])     # 4 steps an epoch
    want = [("begin", 0, 0, 10, 4)]
    for s in range(1, 11):
        want += [("interval", s)] if s % 3 == 0 or s == 10 else []
        want += [("step", s)]
        want += [("epoch", s, s // 4 - 1)] if s % 4 == 0 else []
    want += [("end", 10)]
    assert [e[:2] if e[0] == "interval" else e for e in rec.events] == want
    scores = [e[2] for e in rec.events if e[0] == "interval"]
    assert scores[-1] == result and all(math.isfinite(s.loss) and 0 <= s.accuracy <= 1 for s in scores)
    del rec.events[:]
    trainer.fit(data(), more_steps=2, batch_size=16, monitor=3, callbacks=[rec])    # a second fit goes on from 10
    assert [e[:2] if e[0] == "interval" else e for e in rec.events] == [
        ("begin", 10, 10, 12, 4), ("step", 11), ("interval", 12), ("step", 12), ("epoch", 12, 2), ("end", 12)]


class StopBelow(callbacks.Callback):
    """Early stop: end the run at the first interval whose loss is below `threshold`."""

    def __init__(self, threshold):
        self.threshold = threshold

    def on_interval(self, run, score):
        if score.loss < self.threshold:
            run.stop = True


def test_an_early_stop_on_the_loss_ends_after_that_interval_and_saves(tmp_path):
    free, d = tiny_trainer(), data()
    losses = [free.fit(d, more_steps=4, batch_size=16, monitor=4).loss for _ in range(5)]
    assert min(losses[1:]) < losses[0]              # it learns: the threshold is met at step 8 or later
    threshold = (losses[0] + min(losses[1:])) / 2
    met = 4 * next(i + 1 for i, loss in enumerate(losses) if loss < threshold)
    trainer, rec = tiny_trainer(), Recorder()
    result = trainer.fit(d, steps=20, batch_size=16, monitor=4, save_to=tmp_path / "w.npz",
                         callbacks=[StopBelow(threshold), rec])
    assert trainer.step == met and rec.events[-1] == ("end", met) and trainer.timing["steps"] == met
    assert result.loss == pytest.approx(losses[met // 4 - 1]) and result.loss < threshold
    again = tiny_trainer(seed=1)
    assert again.resume(tmp_path / "w.npz")["step"] == met
    assert np.array_equal(again.model.flat, trainer.model.flat)


class StopAt(callbacks.Callback):
    def __init__(self, step):
        self.at = step

    def on_step_end(self, run):
        run.stop = run.stop or run.step == self.at


def test_a_stop_between_intervals_closes_the_interval_saves_and_returns_its_score(tmp_path):
    trainer, rec = tiny_trainer(), Recorder()
    result = trainer.fit(data(), steps=100, batch_size=16, monitor=4, save_to=tmp_path / "w.npz",
                         callbacks=[StopAt(6), rec])
    assert trainer.step == 6
    assert [e[:2] for e in rec.events[-4:]] == [("step", 5), ("step", 6), ("interval", 6), ("end", 6)]
    assert math.isfinite(result.loss) and rec.events[-2][2] == result
    assert tiny_trainer(seed=1).resume(tmp_path / "w.npz")["step"] == 6


def test_a_stop_request_ends_the_callbacks_before_its_save(tmp_path):
    class AskStop(callbacks.Callback):
        def on_step_end(self, run):
            if run.step == 3:
                run.trainer.request_stop(15)      # as SIGTERM's handler does

    trainer, rec = tiny_trainer(), Recorder()
    with pytest.raises(TrainingStopped, match="stopped at step 3") as stop:
        trainer.fit(data(), steps=100, batch_size=16, monitor=10, save_to=tmp_path / "w.npz",
                    callbacks=[AskStop(), rec])
    assert stop.value.exit_status == 128 + 15 and rec.events[-1] == ("end", 3)
    assert tiny_trainer().resume(tmp_path / "w.npz")["step"] == 3


WORKER = """
import sys, numpy as np, minidl as dl
from minidl import callbacks, layers as L, optim

class Seen(callbacks.Callback):
    def __init__(self):
        self.steps, self.losses = [], []
    def on_step_end(self, run):
        self.steps.append(run.step)
        run.stop = run.step == 5                  # every rank sees the same step: all stop together
    def on_interval(self, run, score):
        self.losses.append(round(score.loss, 6))

model = dl.Sequential([L.Flatten(), L.Dense(16), L.ReLU(), L.Dense(10)], (1, 8, 8), seed=0)
trainer = dl.Trainer(model, optim.SGD(lr=0.05), device="cpu", progress=False, log=lambda s: None)
rng = np.random.default_rng(0)
x, y = rng.integers(0, 256, (64, 8, 8), dtype=np.uint8), rng.integers(0, 10, 64).astype(np.uint8)
seen = Seen()
trainer.fit((x, y), steps=100, batch_size=8, monitor=2, save_to=sys.argv[1], callbacks=[seen])
with open(f"{sys.argv[2]}.{trainer.world.rank}", "w") as f:     # a file a rank: mpiexec may merge stdout lines
    w = trainer.world
    f.write(f"rank {w.rank}/{w.size} step {trainer.step} steps {seen.steps} losses {seen.losses}")
"""


@pytest.mark.skipif(not MPI, reason="mpiexec or mpi4py missing (pip install 'minidl[dist]')")
def test_a_user_callback_runs_on_every_rank_and_stops_them_together(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
    p = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-c", WORKER, str(tmp_path / "w.npz"),
                        str(tmp_path / "seen")], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = sorted((tmp_path / f"seen.{r}").read_text() for r in range(2) if (tmp_path / f"seen.{r}").exists())
    assert [line.split(" step")[0] for line in lines] == ["rank 0/2", "rank 1/2"]
    assert len({line.split(" ", 2)[2] for line in lines}) == 1        # the same steps and summed losses
    assert "step 5 steps [1, 2, 3, 4, 5]" in lines[0] and len(eval(lines[0].split("losses ")[1])) == 3
    assert tiny_trainer().resume(tmp_path / "w.npz")["step"] == 5


class SaveEvery(callbacks.Callback):
    """A user's periodic checkpoint: every `n` steps, a file of its own (Run.save: the NaN flag first)."""

    def __init__(self, folder, n):
        self.folder, self.n, self.saved = folder, n, []

    def on_step_end(self, run):
        if run.step % self.n == 0:
            self.saved.append(run.save(self.folder / f"step{run.step}.npz"))


def test_a_user_callback_saves_every_n_steps(tmp_path):
    trainer, every = tiny_trainer(), SaveEvery(tmp_path, 3)
    trainer.fit(data(), steps=10, batch_size=16, monitor=5, callbacks=[every])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step3.npz", "step6.npz", "step9.npz"]
    assert tiny_trainer(seed=1).resume(tmp_path / "step6.npz")["step"] == 6


class Intervals(callbacks.Callback):
    def __init__(self):
        self.seen = []

    def on_interval(self, run, score):
        self.seen.append((run.step, run.images, score, run.trainer.optimizer.current_lr))


def test_a_user_callback_sees_each_intervals_metrics_as_fit_returns_them():
    trainer, rec = tiny_trainer(), Intervals()
    result = trainer.fit(data(), steps=8, batch_size=16, monitor=4, callbacks=[rec])
    assert [(s, n) for s, n, _, _ in rec.seen] == [(4, 64), (8, 64)]       # 4 steps of 16 images each
    assert rec.seen[-1][2] == result and rec.seen[0][2].loss > result.loss
    assert all(lr == pytest.approx(0.05) for *_, lr in rec.seen)


class EarlyStopping(callbacks.Callback):
    """Keras's EarlyStopping on the training loss: stop once `patience` intervals in a row improved
    it by less than `min_delta`."""

    def __init__(self, patience, min_delta=1e-4):
        self.patience, self.min_delta, self.best, self.waited = patience, min_delta, math.inf, 0

    def on_interval(self, run, score):
        better = score.loss < self.best - self.min_delta
        self.best, self.waited = (score.loss, 0) if better else (self.best, self.waited + 1)
        run.stop = self.waited >= self.patience


def test_early_stopping_written_by_the_user_ends_the_run():
    trainer = tiny_trainer()
    trainer.optimizer.lr = 0.0           # nothing improves: each interval (one epoch) scores the same weights
    trainer.fit(data(), steps=100, batch_size=16, monitor=4, callbacks=[EarlyStopping(patience=2)])
    assert trainer.step == 12 and trainer.timing["steps"] == 12


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_the_nan_stop_comes_before_any_callback_sees_the_interval(tmp_path):
    trainer, rec = tiny_trainer(), Recorder()
    x, y = data()
    x = x / 255.0
    x[:, 3, 3] = np.nan                    # every batch carries a NaN: the loss of step 1 is not finite
    with pytest.raises(dl.TrainingDiverged, match=r"at step 1\b.*nothing was saved to .*w\.npz"):
        trainer.fit((x, y), steps=20, batch_size=16, monitor=10, save_to=tmp_path / "w.npz", callbacks=[rec])
    assert trainer.step == 0 and [e[0] for e in rec.events if e[0] != "epoch"] == ["begin"] + ["step"] * 9
    assert not [e for e in rec.events if e[0] in ("interval", "end")] and not (tmp_path / "w.npz").exists()


def test_a_user_callback_sees_the_stop_request_before_its_save(tmp_path):
    class Note(callbacks.Callback):
        signals = []

        def on_step_end(self, run):
            if run.step == 2:
                run.trainer.request_stop(1)           # as SIGHUP's handler does

        def on_train_end(self, run):
            self.signals.append((run.signal, (tmp_path / "w.npz").exists()))

    trainer = tiny_trainer()
    with pytest.raises(TrainingStopped, match=r"stopped at step 2; saved .*w\.npz") as stop:
        trainer.fit(data(), steps=10, batch_size=16, checkpoint=tmp_path / "w.npz", callbacks=[Note()])
    assert Note.signals == [(1, False)] and stop.value.exit_status == 129 and (tmp_path / "w.npz").exists()
