"""Time to accuracy: StopAtAccuracy ends a run at the first evaluated step that reaches its target and
times training apart from its evaluations; --target-accuracy, --eval-every and --recipe fast on the
command line, checked before any data is read."""
import math

import numpy as np
import pytest
from tests.conftest import mnist_lookalike
from tests.test_cli import exits_2, lines_of, needs_mnist, train

import minidl as dl
from minidl import optim
from minidl.cli import recipes, train as cli


def trainer(seed=0, lr=3e-3):
    model = dl.models.lenet5(device=dl.get_device("cpu", seed=seed), seed=seed)
    lines = []
    return dl.Trainer(model, optim.Adam(lr=lr), seed=seed, progress=False, log=lines.append), lines


def data(n=512, seed=0):
    return mnist_lookalike(n, seed)


def test_a_reachable_target_stops_the_run_at_the_first_evaluation_that_reaches_it():
    t, lines = trainer(lr=1e-3)       # on the look-alikes: about 43%, 75%, 94% at steps 2, 4, 6
    stop = dl.StopAtAccuracy(0.9, data(256, seed=1), every=2, batch_size=128)
    t.fit(data(), steps=200, batch_size=32, monitor=1000, callbacks=[stop])
    assert stop.reached and stop.step is not None
    assert t.step == stop.step < 200, "the run went on past the step that reached the target"
    assert stop.step % 2 == 0 and stop.curve[-1] == (stop.step, stop.accuracy)
    assert stop.accuracy >= 0.9 and all(acc < 0.9 for _, acc in stop.curve[:-1]) and len(stop.curve) > 1
    assert stop.epoch == pytest.approx(stop.step / 16)            # 512 images at batch 32: 16 steps an epoch
    assert stop.evaluations == len(stop.curve) == stop.step // 2
    assert stop.train_s > 0 and stop.eval_s > 0
    assert t.evaluate(data(256, seed=1), batch_size=128).accuracy == stop.accuracy   # what it scored: the model's
    line = lines[-1]
    assert f"reached at step {stop.step} (epoch {stop.epoch:.2f})" in line and "s of training" in line, line
    assert f"in {stop.evaluations} evaluations" in line


def test_a_target_never_reached_runs_to_the_end_and_says_so():
    t, lines = trainer()
    stop = dl.StopAtAccuracy(1.0, data(256, seed=1), every=5, batch_size=256)    # 5% noisy labels: never 100%
    t.fit(data(), steps=12, batch_size=32, monitor=1000, callbacks=[stop])
    assert t.step == 12 and not stop.reached and stop.step is None and stop.epoch is None
    assert [s for s, _ in stop.curve] == [5, 10, 12]              # every 5 steps and the last
    assert stop.best == max(a for _, a in stop.curve) < 1.0
    assert "not reached in 12 steps" in lines[-1] and f"best {stop.best:.2%}" in lines[-1], lines[-1]


def test_the_evaluations_leave_training_as_it_would_be_without_them():
    """Scoring between steps must not touch the weights, the optimizer's state or the step's generator:
    a run with evaluations every step ends bit-identical to one without."""
    runs = []
    for callbacks in ([], [dl.StopAtAccuracy(1.0, data(128, seed=2), every=1, batch_size=64)]):
        t, _ = trainer(seed=3)
        t2 = dl.Trainer(t.model, optim.Adam(lr=3e-3), seed=3, progress=False, log=lambda *a: None, shift=2)
        t2.fit(data(), steps=6, batch_size=32, monitor=1000, callbacks=callbacks)
        runs.append(t2.model.get_weights())
    for k in runs[0]:
        assert np.array_equal(runs[0][k], runs[1][k]), k


def test_the_default_interval_is_a_tenth_of_an_epoch():
    t, _ = trainer()
    stop = dl.StopAtAccuracy(1.0, data(128, seed=1))
    t.fit(data(640), steps=8, batch_size=32, monitor=1000, callbacks=[stop])     # 20 steps an epoch
    assert stop.interval == 2 and [s for s, _ in stop.curve] == [2, 4, 6, 8]


@pytest.mark.parametrize("target", [0, -0.5, 1.01, 99, math.nan, True, "0.99"])
def test_a_target_that_is_no_fraction_is_one_value_error(target):
    with pytest.raises(ValueError, match="StopAtAccuracy: target must be an accuracy as a fraction"):
        dl.StopAtAccuracy(target, data())


@pytest.mark.parametrize("kw,what", [({"every": 0}, "every"), ({"batch_size": -1}, "batch_size"),
                                     ({"every": 2.5}, "every")])
def test_bad_intervals_and_batches_are_one_value_error(kw, what):
    with pytest.raises(ValueError, match=f"StopAtAccuracy: {what} must be a positive int"):
        dl.StopAtAccuracy(0.99, data(), **kw)


def test_no_data_to_score_is_one_value_error():
    with pytest.raises(ValueError, match="StopAtAccuracy: data to score is needed"):
        dl.StopAtAccuracy(0.99, None)


def test_users_import_it_with_the_other_callbacks():
    from minidl.callbacks import StopAtAccuracy
    assert StopAtAccuracy is dl.StopAtAccuracy and "StopAtAccuracy" in dl.__all__


# -- the command line --------------------------------------------------------------------------------

@pytest.mark.parametrize("args,flag", [
    (["--target-accuracy", "0"], "--target-accuracy"), (["--target-accuracy", "-3"], "--target-accuracy"),
    (["--target-accuracy", "100.5"], "--target-accuracy"), (["--target-accuracy", "nan"], "--target-accuracy"),
    (["--target-accuracy", "inf"], "--target-accuracy"),
    (["--eval-every", "10"], "--eval-every"),                      # without --target-accuracy
    (["--target-accuracy", "99", "--eval-every", "0"], "--eval-every"),
    (["--recipe", "fast", "-r", "50"], "--recipe"), (["--recipe", "fast", "--model", "simplenet"], "--recipe"),
    (["--recipe", "slow"], "--recipe"),
])
def test_bad_target_and_recipe_flags_exit_2_before_reading_data(args, flag, no_data, capsys):
    err = exits_2(cli.main, args, flag, capsys)
    assert sum("error" in line for line in err.splitlines()) == 1, err       # the usage, then one error line


def test_target_accuracy_of_100_is_accepted(no_data):
    args = cli.check_args(cli.parser(), cli.parser().parse_args(["--target-accuracy", "100"]))
    assert args.target_accuracy == 100.0 and args.eval_every is None


def plan(*argv):
    p = cli.parser()
    return recipes.plan(cli.check_args(p, p.parse_args(list(argv))))


def test_the_fast_recipe_exists_and_plans_its_batch_and_length():
    fast = recipes.NAMED["fast"]
    got = plan("--recipe", "fast")
    assert got.model == "lenet5" and got.batch_size == fast["batch_size"] and got.epochs == fast["epochs"]
    assert got.steps is None
    for k in ("optimizer", "lr", "schedule", "warmup", "weight_decay", "label_smoothing", "shift", "flip"):
        assert getattr(got, k) == fast[k], k
    assert (got.batch_size, got.epochs, got.lr) != (plan().batch_size, plan().epochs, plan().lr)


def test_flags_given_win_over_the_fast_recipe():
    got = plan("--recipe", "fast", "-b", "64", "-n", "50", "--lr", "0.001", "--model", "lenet")
    assert (got.batch_size, got.steps, got.epochs, got.lr) == (64, 50, None, 0.001)
    assert plan("--recipe", "fast", "--epochs", "3").epochs == 3
    assert plan("--recipe", "default").batch_size == recipes.DEFAULT_BATCH == plan().batch_size == 32


def test_the_fast_recipe_scores_the_test_set_in_one_batch_unless_x_is_given():
    """Its target evaluates every 12 steps: ten batches of 1,000 a time cost more host launches than it trained."""
    p = cli.parser()
    args = lambda *argv: cli.check_args(p, p.parse_args(list(argv)))     # noqa: E731
    assert args("--recipe", "fast").test_batch == recipes.NAMED["fast"]["test_batch"] == 10000
    assert args("--recipe", "fast", "-x", "500").test_batch == 500
    assert args().test_batch == args("--recipe", "default").test_batch == recipes.DEFAULT_TEST_BATCH == 1000


@needs_mnist
def test_the_command_line_stops_at_the_target_and_prints_step_epoch_and_seconds(tmp_path):
    p = train("-n", "300", "-m", "1000", "--target-accuracy", "60", "--eval-every", "5", "--device", "cpu",
              cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    out = lines_of(p)
    hit = [line for line in out if line.startswith("target accuracy 60.00% reached at step")]
    assert hit, p.stdout
    step = int(hit[0].split("reached at step ")[1].split()[0])
    assert step % 5 == 0 and step < 300
    assert any(line.startswith(f"trained {step} steps") for line in out), p.stdout
    assert "s of training" in hit[0] and "evaluation" in hit[0]
