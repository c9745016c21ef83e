"""What a Keras or PyTorch user reaches for around fit (docs/training.md): frozen layers through a whole
fit, fit(validation_data=) and its History, EarlyStopping, ReduceLROnPlateau, ModelCheckpoint,
model.evaluate without a Trainer, schedule names, load_weights(strict=False) into a new head, Ctrl-C
saving like the command line, and `steps` as the run's total (the command line's -n)."""
import math
import os
import signal

import numpy as np
import pytest

import minidl as dl
from minidl import checkpoint, layers as L, optim
from minidl.callbacks import EarlyStopping, ModelCheckpoint, ReduceLROnPlateau
from minidl.training import callbacks


def net(seed=0, classes=10):
    return dl.Sequential([L.Conv2D(4, 3, padding=1), L.BatchNorm2D(), L.ReLU(), L.Flatten(), L.Dense(16, name="fc"),
                          L.ReLU(), L.Dense(classes, name="head"), L.Softmax()], (1, 8, 8), seed=seed)


def trainer(opt=None, seed=0, **kw):
    return dl.Trainer(net(seed, **kw), opt or optim.Adam(1e-2), device="cpu", progress=False, log=lambda s: None)


def data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 8, 8), dtype=np.uint8), rng.integers(0, 10, n).astype(np.uint8)


def test_frozen_layers_are_bit_identical_after_fit_and_the_rest_trains():
    t = trainer(optim.AdamW(1e-2, clip_norm=1.0))
    t.model.freeze("conv2d", "fc")
    before = t.model.get_weights()
    t.fit(data(), steps=8, batch_size=16, monitor=4)
    after = t.model.get_weights()
    for k in ("conv2d/w", "conv2d/b", "fc/w", "fc/b"):
        assert np.array_equal(after[k], before[k]), k
    assert not np.array_equal(after["head/w"], before["head/w"]) and not np.array_equal(after["fbn/gamma"],
                                                                                         before["fbn/gamma"])
    t.model.layer("fc").trainable = True    # decided after the Trainer was made: the next fit trains it
    t.fit(data(), more_steps=2, batch_size=16, monitor=4)
    assert not np.array_equal(t.model.get_weights()["fc/w"], before["fc/w"])
    assert np.array_equal(t.model.get_weights()["conv2d/w"], before["conv2d/w"])


def test_validation_data_fills_the_history_every_epoch_or_every_validation_freq_steps():
    t = trainer()
    x, y = data()
    history = t.fit((x, y), epochs=3, batch_size=16, monitor=3, validation_data=data(32, seed=1))   # 4 steps an epoch
    h = history.history
    assert h["step"] == [4, 8, 12] and h["epoch"] == [0, 1, 2]
    assert set(h) == {"step", "epoch", "loss", "accuracy", "val_loss", "val_accuracy", "lr"}
    assert h["val_loss"][-1] == pytest.approx(t.evaluate(data(32, seed=1)).loss, rel=1e-6)
    assert all(0 <= a <= 1 for a in h["val_accuracy"]) and h["lr"] == [0.01] * 3
    loss, acc = history                                  # still the last interval's Score
    assert isinstance(history, dl.metrics.Score) and (loss, acc) == (history.loss, history.accuracy)
    assert math.isfinite(loss) and history["val_loss"] is h["val_loss"]
    every = trainer().fit((x, y), steps=10, batch_size=16, validation_data=data(32, seed=1), validation_freq=3)
    assert every.history["step"] == [3, 6, 9, 10]        # and at the run's end
    # the train loss of a record is the mean of its steps: one record per step equals each step's loss
    t1 = trainer()
    per_step = t1.fit((x, y), steps=3, batch_size=16, monitor=1, validation_data=data(32), validation_freq=1)
    t2 = trainer()
    scores = [t2.fit((x, y), more_steps=1, batch_size=16, monitor=1).loss for _ in range(3)]
    np.testing.assert_allclose(per_step.history["loss"], scores, rtol=1e-6)


def test_without_validation_the_history_has_the_epochs_train_metrics():
    h = trainer().fit(data(), epochs=2, batch_size=16, monitor=2).history
    assert h["step"] == [4, 8] and len(h["loss"]) == 2 and "val_loss" not in h


def test_early_stopping_stops_after_patience_records_without_improvement_and_restores_the_best():
    t = trainer(optim.SGD(0.0))
    stop = EarlyStopping(monitor="val_loss", patience=2, min_delta=10)      # nothing improves after the first
    h = t.fit(data(), epochs=20, batch_size=16, monitor=100, validation_data=data(32, seed=1), callbacks=[stop])
    assert t.step == 12 and h.history["step"] == [4, 8, 12] and stop.stopped_step == 12
    learning = trainer(optim.Adam(1e-2))
    patient = EarlyStopping(monitor="loss", patience=100)
    learning.fit(data(), epochs=4, batch_size=16, monitor=2, callbacks=[patient])
    assert learning.step == 16 and patient.stopped_step is None
    with pytest.raises(ValueError, match="EarlyStopping: monitor 'val_loss' is not logged.*validation_data"):
        trainer().fit(data(), epochs=1, batch_size=16, monitor=2, callbacks=[EarlyStopping()])


def test_restore_best_weights_puts_the_best_records_weights_back(monkeypatch):
    t = trainer(optim.Adam(1e-2))
    seen = []

    class Spy(callbacks.Callback):
        def on_record(self, run, logs):
            seen.append((logs["val_loss"], run.trainer.model.get_weights()))
    stop = EarlyStopping(monitor="val_loss", patience=10, restore_best_weights=True)
    t.fit(data(), epochs=5, batch_size=16, monitor=100, validation_data=data(32, seed=1), callbacks=[Spy(), stop])
    best = min(seen, key=lambda s: s[0])[1]
    assert all(np.array_equal(v, best[k]) for k, v in t.model.get_weights().items())


def test_reduce_lr_on_plateau_lowers_the_base_lr_and_the_captured_groups_follow():
    t = trainer(optim.SGD(1e-9, groups=[{"params": ["head"], "lr": 2e-9}]))   # too small to move val_loss
    cut = ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=2, min_delta=10, min_lr=2e-10)
    h = t.fit(data(), epochs=8, batch_size=16, monitor=100, validation_data=data(32, seed=1), callbacks=[cut])
    # records 1..8: the first is the best; lr halves after each second record without one, down to min_lr
    assert h.history["lr"] == pytest.approx([1e-9, 1e-9, 1e-9, 5e-10, 5e-10, 2.5e-10, 2.5e-10, 2e-10], abs=1e-14)
    assert t.optimizer.lr == pytest.approx(2e-10)
    assert t.optimizer.config()["groups"][0]["lr"] == pytest.approx(4e-10)     # the group keeps its ratio


def test_model_checkpoint_saves_the_best_model_so_far(tmp_path, monkeypatch):
    t = trainer(optim.Adam(1e-2))
    saves = []
    save = callbacks.Run.save
    monkeypatch.setattr(callbacks.Run, "save", lambda run, path: (saves.append((run.step, str(path))), save(run, path)))
    losses = []

    class Spy(callbacks.Callback):
        def on_record(self, run, logs):
            losses.append(logs["val_loss"])
    best = ModelCheckpoint(tmp_path / "best.npz", monitor="val_loss", save_best_only=True)
    every = ModelCheckpoint(str(tmp_path / "e{epoch}-{step}.npz"))
    t.fit(data(), epochs=5, batch_size=16, monitor=100, validation_data=data(32, seed=1),
          callbacks=[Spy(), best, every])
    improved = [4 * (i + 1) for i, v in enumerate(losses) if v < min(losses[:i], default=math.inf)]
    assert [s for s, p in saves if p.endswith("best.npz")] == improved
    # '{epoch}' counts from 1 in the name, as Keras's ModelCheckpoint does
    assert sorted(p.name for p in tmp_path.glob("e*.npz")) == [f"e{e + 1}-{4 * (e + 1)}.npz" for e in range(5)]
    again = trainer(seed=3)
    assert again.resume(tmp_path / "best.npz")["step"] == improved[-1]      # a checkpoint that resumes


def test_model_evaluate_without_a_trainer_is_trainer_evaluate():
    t = trainer()
    t.fit(data(), steps=4, batch_size=16, monitor=4)
    x, y = data(48, seed=2)
    mine, theirs = t.model.evaluate(x, y, batch_size=20), t.evaluate((x, y))
    assert mine.loss == pytest.approx(theirs.loss, rel=1e-5) and mine.accuracy == theirs.accuracy
    logits = dl.Sequential([L.Flatten(), L.Dense(10)], (1, 8, 8))           # no Softmax: scored on logits
    z = logits.predict(x)
    ref = np.mean(np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1) - z[np.arange(48), y])
    assert logits.evaluate(x, y).loss == pytest.approx(ref, rel=1e-5)
    with pytest.raises(ValueError, match="model.evaluate labels: "):
        t.model.evaluate(x, np.full(48, 12))


def test_schedule_names_span_the_run_as_on_the_command_line():
    t = trainer(optim.Adam(1e-2, schedule="cosine"))
    with pytest.raises(ValueError, match="schedule 'cosine' spans a run: Trainer.fit sets its length"):
        optim.Adam(1e-2, schedule="cosine").schedule(0.1, 0)
    t.fit(data(), steps=6, batch_size=16, monitor=3)
    assert t.optimizer.schedule.config == {"name": "cosine", "total_steps": 6, "min_lr": 0.0}
    assert t.optimizer.current_lr == pytest.approx(0.01 * (1 + math.cos(math.pi * 5 / 6)) / 2)
    for name, cfg in (("step", {"name": "step_decay", "step_size": 2, "gamma": 0.1}),
                      ("inverse-time", {"name": "inverse_time", "decay": 1e-4}), ("constant", {"name": "constant"})):
        s = trainer(optim.SGD(0.1, schedule=name))
        s.fit(data(), steps=6, batch_size=16, monitor=6)
        assert s.optimizer.schedule.config == cfg


def test_load_weights_strict_false_into_a_new_head(tmp_path):
    t = trainer()
    t.fit(data(), steps=2, batch_size=16, monitor=2)
    t.save(tmp_path / "ten.npz")
    five = net(seed=4, classes=5)
    head = five.get_weights()["head/w"]
    with pytest.raises(checkpoint.CheckpointError, match="does not fit the model"):
        checkpoint.load_weights(tmp_path / "ten.npz", five)
    keys = checkpoint.load_weights(tmp_path / "ten.npz", five, strict=False)
    assert keys.missing == ["head/b", "head/w"] and keys.unexpected == []
    assert keys.mismatched == ["head/b: file (10,) vs model (5,)", "head/w: file (10, 16) vs model (5, 16)"]
    got, want = five.get_weights(), t.model.get_weights()
    assert all(np.array_equal(got[k], want[k]) for k in want if not k.startswith("head"))
    assert np.array_equal(got["head/w"], head)
    bigger = dl.Sequential([L.Conv2D(4, 3, padding=1), L.BatchNorm2D(), L.ReLU(), L.Flatten(), L.Dense(16, name="fc"),
                            L.ReLU(), L.Dense(5, name="head2"), L.Softmax()], (1, 8, 8))
    keys = checkpoint.load_weights(tmp_path / "ten.npz", bigger, strict=False)
    assert keys.unexpected == ["head/b", "head/w"] and keys.missing == ["head2/b", "head2/w"]
    # a .safetensors file (PyTorch's names, python -m minidl.export --safetensors) the same way
    from minidl.cli.export import save_safetensors
    save_safetensors(tmp_path / "ten.safetensors", t.model)
    again = net(seed=5, classes=5)
    keys = checkpoint.load_weights(tmp_path / "ten.safetensors", again, strict=False)
    assert keys.missing == ["head/b", "head/w"] and len(keys.mismatched) == 2 and keys.unexpected == []
    assert np.array_equal(again.get_weights()["fc/w"], want["fc/w"])


def test_steps_is_the_runs_total_as_on_the_command_line(tmp_path):
    t = trainer()
    t.fit(data(), steps=6, batch_size=16, monitor=3, save_to=tmp_path / "c.npz")
    resumed, lines = trainer(seed=1), []
    resumed.log = lines.append
    resumed.resume(tmp_path / "c.npz")
    resumed.fit(data(), steps=10, batch_size=16, monitor=5)
    assert resumed.step == 10 and resumed.timing["steps"] == 4            # 4 more, not 10
    resumed.fit(data(), more_steps=3, batch_size=16, monitor=5)
    assert resumed.step == 13
    h = resumed.fit(data(), steps=5, batch_size=16, monitor=5)
    assert resumed.step == 13 and math.isnan(h.loss)
    assert lines[-1] == ("fit: the run has trained 13 steps, steps=5 is the run's total: nothing to train "
                         "(more_steps=N trains N more)")
    with pytest.raises(ValueError, match="give one of steps"):
        resumed.fit(data(), steps=20, more_steps=2)


class CtrlC(callbacks.Callback):
    """Presses Ctrl-C (SIGINT to this process) after step `at`."""

    def __init__(self, at):
        self.at = at

    def on_step_end(self, run):
        if run.step == self.at:
            os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_in_fit_finishes_the_step_saves_and_raises_a_keyboard_interrupt(tmp_path):
    t = trainer()
    with pytest.raises(KeyboardInterrupt) as e:
        t.fit(data(), steps=50, batch_size=16, monitor=100, checkpoint=tmp_path / "c.npz", callbacks=[CtrlC(5)])
    assert isinstance(e.value, dl.TrainingStopped) and isinstance(e.value, dl.TrainingInterrupted)
    assert str(e.value) == f"stopped at step {t.step}; saved {tmp_path / 'c.npz'}" and e.value.signum == signal.SIGINT
    assert t.step in (5, 6)                       # the request is honoured after the step it came in
    resumed = trainer(seed=2)
    assert resumed.resume(tmp_path / "c.npz")["step"] == t.step
    assert np.array_equal(resumed.model.flat, t.model.flat)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler     # put back
    with pytest.raises(dl.TrainingInterrupted, match="^stopped at step 3$"):   # no checkpoint: nothing saved
        trainer().fit(data(), steps=50, batch_size=16, callbacks=[CtrlC(3)])
