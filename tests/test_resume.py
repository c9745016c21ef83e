"""Stops and exact resume from the command line: a run stopped at any step (SIGINT, SIGTERM, or a
crash after a --save-every checkpoint) and started again with the same command plus --resume ends
bit-identical (CPU) to the same run never stopped."""
import os
import signal

import numpy as np
import pytest

from minidl import checkpoint
from minidl.cli import train as cli
from minidl.training.trainer import Trainer

DATA = os.environ.get("MINIDL_DATA")
pytestmark = pytest.mark.skipif(not (DATA and os.path.isdir(os.path.join(DATA, "mnist"))),
                                reason="needs MNIST under $MINIDL_DATA")
TRAIN_STEP = Trainer.train_step          # the real one: each run wraps this, not the last run's wrapper
BASE = ["--model", "lenet", "-m", "5", "-y", "1", "-x", "500", "--device", "cpu"]


def run(argv, folder, monkeypatch, stop_at=None, how=None):
    """cli.main(argv) in `folder`; at step `stop_at` send the signal `how`, or crash ('crash')."""
    monkeypatch.chdir(folder)
    step = TRAIN_STEP

    def train_step(self, x, y):
        out = step(self, x, y)
        if self.step + 1 == stop_at:                 # the step now running is number stop_at
            if how == "crash":
                raise RuntimeError("the machine went away")
            os.kill(os.getpid(), how)                # the handler runs at once, in this thread
        return out
    monkeypatch.setattr(Trainer, "train_step", train_step)
    return cli.main(argv)


def weights(folder):
    return checkpoint.read(folder / "checkpoints" / "lenet5.npz")[1]


@pytest.mark.parametrize("plan,stop_at,how", [
    (["-n", "30", "-b", "16", "--schedule", "cosine"], 13, signal.SIGINT),
    (["-n", "30", "-b", "16", "--schedule", "step"], 21, signal.SIGTERM),
    (["-n", "30", "-b", "16", "--schedule", "inverse-time", "--optimizer", "momentum"], 7, signal.SIGTERM),
    (["-n", "30", "-b", "16", "--schedule", "constant", "--save-every", "10"], 25, "crash"),
])
def test_a_stopped_run_resumed_ends_as_the_run_never_stopped(plan, stop_at, how, tmp_path, monkeypatch):
    (tmp_path / "straight").mkdir()
    (tmp_path / "stopped").mkdir()
    assert run(BASE + plan + ["-s"], tmp_path / "straight", monkeypatch) == 0
    want = weights(tmp_path / "straight")

    if how == "crash":
        with pytest.raises(RuntimeError, match="went away"):
            run(BASE + plan + ["-s"], tmp_path / "stopped", monkeypatch, stop_at, how)
        saved_at = stop_at // 10 * 10                              # the last --save-every checkpoint
    else:
        code = run(BASE + plan + ["-s"], tmp_path / "stopped", monkeypatch, stop_at, how)
        assert code == 128 + how                                   # 130 for SIGINT, 143 for SIGTERM
        saved_at = stop_at                                         # the current step finished, then saved
    info, _ = checkpoint.read(tmp_path / "stopped" / "checkpoints" / "lenet5.npz")
    assert info["meta"]["step"] == saved_at

    # no -s: a resumed run that runs to its end saves into the checkpoint it resumed (issue 39.6)
    assert run(BASE + [f for f in plan if f != "-s"] + ["--resume"], tmp_path / "stopped", monkeypatch) == 0
    info, _ = checkpoint.read(tmp_path / "stopped" / "checkpoints" / "lenet5.npz")
    assert info["meta"]["step"] == 30 and info["data"]["dataset"] == "mnist"
    got = weights(tmp_path / "stopped")
    assert set(got) == set(want)
    for k in want:
        if k.startswith(("param/", "optim/")):
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_the_stop_message_says_where_it_saved(tmp_path, monkeypatch, capsys):
    code = run(BASE + ["-n", "30", "-b", "16"], tmp_path, monkeypatch, 4, signal.SIGTERM)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 143 and len(err) == 1
    assert err[0].startswith("SIGTERM: stopped at step 4; saved checkpoints/lenet5.npz") and "--resume" in err[0]


def test_an_epoch_planned_run_resumed_across_an_epoch_boundary_is_exact(tmp_path, mnist_train):
    """What the CLI does with --epochs (total = epochs x batches an epoch), on 2,000 images."""
    import minidl as dl
    from minidl import models, optim
    from minidl.cli.runplan import RunPlan

    data = (mnist_train[0][:2000], mnist_train[1][:2000])
    plan = RunPlan("lenet5", "mnist", 64, None, 3, "adam", 1e-3, 0.0, "cosine", 0)
    per_epoch = 2000 // 64
    total = plan.total_steps(per_epoch)
    assert total == 3 * per_epoch == 93

    def trainer():
        opt = optim.Adam(lr=plan.lr, schedule=plan.schedule_fn(optim.schedules, per_epoch))
        return dl.Trainer(models.lenet5(seed=0), opt, device="cpu", progress=False, log=lambda s: None)
    straight = trainer()
    straight.fit(data, steps=total, batch_size=64)
    first = trainer()
    first.fit(data, steps=40, batch_size=64)                   # into the second epoch
    first.save(str(tmp_path / "c.npz"))
    second = trainer()
    second.resume(str(tmp_path / "c.npz"))
    second.fit(data, steps=total, batch_size=64)                # the run's total, as -n
    for k, w in straight.model.get_weights().items():
        np.testing.assert_array_equal(second.model.get_weights()[k], w, err_msg=k)


def test_metrics_file_has_one_line_per_interval_and_the_evaluation(tmp_path, monkeypatch):
    from minidl.files import metrics_log
    assert run(BASE + ["-n", "20", "-b", "16", "--metrics", "run.jsonl"], tmp_path, monkeypatch) == 0
    intervals, evals = metrics_log.read(tmp_path / "run.jsonl")
    assert [r["step"] for r in intervals] == [5, 10, 15, 20]
    assert all(r["images_per_s"] > 0 and 0 <= r["accuracy"] <= 100 and r["lr"] > 0 for r in intervals)
    assert len(evals) == 1 and evals[0]["step"] == 20 and 0 <= evals[0]["test_accuracy"] <= 100


def test_tensorboard_gets_the_records_of_the_metrics_file(tmp_path, monkeypatch):
    pytest.importorskip("tensorboardX")
    from minidl.files import metrics_log
    argv = BASE + ["-n", "10", "-b", "16", "--metrics", "run.jsonl", "--tensorboard", "tb/run"]
    assert run(argv, tmp_path, monkeypatch) == 0
    intervals, evals = metrics_log.read(tmp_path / "run.jsonl")
    from tests.helpers.tensorboard_events import scalars as read_scalars
    scalars = read_scalars(tmp_path / "tb" / "run")
    assert set(scalars) == {"train/loss", "train/accuracy", "train/lr", "train/images_per_s", "test/loss",
                            "test/accuracy"}
    for name in ("loss", "accuracy", "lr", "images_per_s"):        # float32 in the event file
        want = [(r["step"], r[name]) for r in intervals]
        assert [s for s, _ in scalars[f"train/{name}"]] == [s for s, _ in want] == [5, 10]
        np.testing.assert_allclose([v for _, v in scalars[f"train/{name}"]], [v for _, v in want], rtol=1e-6)
    np.testing.assert_allclose(scalars["test/accuracy"][0], (10, evals[0]["test_accuracy"]), rtol=1e-6)
