"""cli/run.py: the one builder of a training run. minidl train and minidl warmup build the same model,
optimizer and Trainer from the same flags, and a training walk resolves the recipe once."""
import os

import numpy as np
import pytest

from minidl.backend import get_device
from minidl.cli import recipes, run as cli_run, train, warmup

DATA = os.environ.get("MINIDL_DATA")
needs_mnist = pytest.mark.skipif(not (DATA and os.path.isdir(os.path.join(DATA, "mnist"))),
                                 reason="real MNIST not found: $MINIDL_DATA/mnist/ is missing")


def _args(*argv):
    p = train.parser()
    return train.check_args(p, p.parse_args([*argv, "--device", "cpu"]))


def test_build_run_builds_what_the_plan_says():
    args = _args("--optimizer", "momentum", "--lr", "0.07", "--weight-decay", "1e-4", "--epochs", "3",
                 "--label-smoothing", "0.2", "--shift", "1", "--flip", "-b", "8")
    plan = recipes.plan(args)
    run = cli_run.build_run(args, get_device("cpu"), plan, per_epoch=5, log=lambda *a, **k: None)
    assert run.plan is plan and run.trainer.plan == plan.to_json()        # the checkpoints save the plan
    assert run.model.name == "lenet5" and run.trainer.model is run.model and run.trainer.optimizer is run.optimizer
    assert type(run.optimizer).__name__ == "Momentum" and run.optimizer.momentum == cli_run.MOMENTUM
    assert run.optimizer.weight_decay == pytest.approx(1e-4)
    assert run.total_steps == 15                                           # --epochs 3 of 5 batches
    assert (run.trainer._step.shift, run.trainer._step.flip) == (1, True)
    lr = run.optimizer.schedule                                            # cosine over the 15 steps
    assert float(lr(1.0, 0)) == pytest.approx(1.0) and float(lr(1.0, 15)) == pytest.approx(0.0, abs=1e-12)


def test_warmup_builds_the_run_minidl_train_builds():
    args = _args("--model", "simplenet", "-b", "16")
    plan = recipes.plan(args)
    ours = cli_run.build_run(args, get_device("cpu"), plan, per_epoch=60000 // 16, log=lambda *a, **k: None)
    theirs = warmup.build_trainer(args, get_device("cpu"))
    assert theirs.plan == ours.trainer.plan and type(theirs.optimizer) is type(ours.optimizer)
    assert theirs.progress is False                                        # the warm-up prints nothing
    a, b = ours.model.get_weights(), theirs.model.get_weights()            # one seed: the same weights
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@needs_mnist
def test_a_training_walk_resolves_the_recipe_once(tmp_path, monkeypatch, capsys):
    """After check_args, the command resolves the recipe once (recipes.plan) and reads the plan; only the default
    checkpoint path still asks recipes for the model's tag."""
    monkeypatch.chdir(tmp_path)
    args = _args("-n", "2", "-m", "1", "-y", "1", "-x", "100")
    calls = {"plan": 0, "model_of": 0}
    for name in calls:
        real = getattr(recipes, name)

        def counted(*a, _real=real, _name=name, **k):
            calls[_name] += 1
            return _real(*a, **k)
        monkeypatch.setattr(recipes, name, counted)
    train.run(args)
    assert calls["plan"] == 1
    # plan's own, and the default checkpoint path's (cli/checkpoints.py); the walk before the builder took 4
    assert calls["model_of"] <= 2
    assert capsys.readouterr().out.splitlines()[-1] == "Done."
