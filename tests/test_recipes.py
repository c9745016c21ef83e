"""Default recipes: every flag left out takes the model's recipe, the recipe is printed at the start,
the recipe flags are checked before data is read and are part of the run plan."""
import pytest
from tests.test_cli import exits_2, lines_of, needs_mnist, train

from minidl import optim
from minidl.cli import recipes, train as cli
from minidl.cli.runplan import RunPlan


def plan(*argv):
    p = cli.parser()
    return recipes.plan(cli.check_args(p, p.parse_args(list(argv))))


@pytest.mark.parametrize("argv,family,model", [((), "lenet", "lenet5"), (("-r", "50"), "resnet", "resnet50"),
                                               (("--model", "resnet"), "resnet", "resnet18")])
def test_flags_left_out_take_the_models_recipe(argv, family, model):
    got = plan(*argv)
    assert got.model == model
    for k, v in recipes.RECIPES[family].items():
        assert getattr(got, k) == v, k


def test_fashion_mnist_takes_no_shifts_by_default():
    assert plan("--dataset", "fashion-mnist").shift == 0
    assert plan("--dataset", "fashion-mnist", "--shift", "1").shift == 1
    assert plan("--dataset", "fashion-mnist", "-r", "18").shift == 0
    assert plan("--dataset", "fashion-mnist").lr == recipes.RECIPES["lenet"]["lr"]


def test_lenet_on_fashion_mnist_takes_weight_decay_by_default_and_nothing_else_does():
    assert plan("--dataset", "fashion-mnist").weight_decay == 2e-4
    assert plan("--dataset", "fashion-mnist", "--weight-decay", "0").weight_decay == 0
    assert plan().weight_decay == 0 and plan("--dataset", "fashion-mnist", "-r", "18").weight_decay == 0


def test_flip_is_the_recipes_unless_flip_or_no_flip_is_given():
    for dataset in ("mnist", "fashion-mnist"):
        want = recipes.DATASETS[dataset].get("flip", recipes.RECIPES["lenet"]["flip"])
        assert plan("--dataset", dataset).flip is want
        assert plan("--dataset", dataset, "--flip").flip is True
        assert plan("--dataset", dataset, "--no-flip").flip is False


def test_given_flags_override_the_recipe_and_another_optimizer_takes_its_own_lr():
    got = plan("--lr", "0.02", "--warmup", "7", "--label-smoothing", "0.2", "--shift", "0", "--schedule", "step",
               "--weight-decay", "1e-4")
    assert (got.lr, got.warmup, got.label_smoothing, got.shift, got.schedule, got.weight_decay) == \
        (0.02, 7, 0.2, 0, "step", 1e-4)
    assert plan("--optimizer", "sgd").lr == 0.01 == optim.SGD.default_lr
    assert plan("-r", "18", "--optimizer", "adam").lr == 1e-3 == optim.Adam.default_lr
    assert plan("-r", "18", "--optimizer", "momentum", "--lr", "0.3").lr == 0.3       # the flag first
    assert plan("-r", "18", "--optimizer", "momentum").lr == recipes.RECIPES["resnet"]["lr"]   # the recipe's own


@pytest.mark.parametrize("name", list(optim.OPTIMIZERS))
def test_every_registered_optimizer_is_a_choice_and_runs_at_its_own_default_lr(name):
    """No hand-kept table: --optimizer takes every registered optimizer, at its class's default_lr where
    the model's recipe is another optimizer's, and the plan builds it as cli/train.py does."""
    cls = optim.OPTIMIZERS[name]
    family = "resnet" if recipes.RECIPES["lenet"]["optimizer"] == name else "lenet"
    got = plan("--optimizer", name, *(("-r", "18") if family == "resnet" else ()))
    assert got.optimizer == name and got.lr == cls.default_lr > 0
    opt = optim.get(name, lr=got.lr, weight_decay=got.weight_decay, schedule=None)
    assert type(opt) is cls and opt.lr == cls.default_lr
    assert f"{name} {cls.default_lr:g}" in cli.parser()._option_string_actions["--lr"].help


def test_describe_names_the_seed_and_every_part_of_the_recipe():
    line = RunPlan("lenet5", "fashion-mnist", 32, None, 10, "adam", 3e-3, 0.0, "cosine", 4, warmup=100,
                   label_smoothing=0.1, shift=2).describe()
    assert line == ("recipe: seed 4, lenet5 on fashion-mnist, adam lr 0.003, cosine schedule, warm-up 100 steps, "
                    "weight decay 0, label smoothing 0.1, shifts of up to 2 px, no horizontal flips, batch 32, "
                    "10 epochs")
    assert "shifts of up to 0 px, horizontal flips, batch 32" in RunPlan(
        "lenet5", "fashion-mnist", 32, None, 10, "adam", 3e-3, 0.0, "cosine", 0, flip=True).describe()
    assert RunPlan("resnet50", "mnist", 32, 500, None, "momentum", 0.05, 0.0, "cosine", 0).describe().endswith(
        "batch 32, 500 steps")


def test_the_new_fields_are_part_of_the_plan_and_old_plans_meant_none():
    mine = RunPlan("lenet5", "mnist", 32, 300, None, "adam", 1e-3, 0.0, "cosine", 0, warmup=10, shift=2)
    saved = {k: v for k, v in mine.to_json().items() if k not in ("warmup", "label_smoothing", "shift")}
    assert mine.differences(saved) == ["--warmup 10 (the checkpoint's run: 0)", "--shift 2 (the checkpoint's run: 0)"]
    assert RunPlan(**{**mine.to_json(), "warmup": 0, "shift": 0}).differences(saved) == []
    assert mine.differences({**mine.to_json(), "label_smoothing": 0.1}) == \
        ["--label-smoothing 0 (the checkpoint's run: 0.1)"]
    flipped = RunPlan(**{**mine.to_json(), "flip": True})
    assert flipped.differences(mine.to_json()) == ["--flip on (the checkpoint's run: off)"]
    assert flipped.differences({k: v for k, v in mine.to_json().items() if k != "flip"}) == \
        ["--flip on (the checkpoint's run: off)"]


def test_the_schedule_includes_the_warmup():
    from minidl.optim import schedules
    p = RunPlan("lenet5", "mnist", 32, 100, None, "adam", 1e-3, 0.0, "cosine", 0, warmup=10)
    fn = p.schedule_fn(schedules, per_epoch=1875)
    assert fn.config == {"name": "warmup", "steps": 10,
                         "schedule": {"name": "cosine", "total_steps": 100, "min_lr": 0.0}}
    assert float(fn(1.0, 0)) == pytest.approx(0.1)
    assert not hasattr(RunPlan(**{**p.to_json(), "warmup": 0}).schedule_fn(schedules, 1875), "steps")


@pytest.mark.parametrize("args,flag", [
    (["--warmup", "-1"], "--warmup"), (["--warmup", "2000"], "--warmup"), (["-n", "50", "--warmup", "60"], "--warmup"),
    (["--epochs", "1", "-b", "60000", "--warmup", "1"], "--warmup"), (["--warmup", "1.5"], "--warmup"),
    (["--label-smoothing", "1"], "--label-smoothing"), (["--label-smoothing", "-0.1"], "--label-smoothing"),
    (["--label-smoothing", "nan"], "--label-smoothing"), (["--label-smoothing", "inf"], "--label-smoothing"),
    (["--shift", "-1"], "--shift"), (["--shift", "9"], "--shift"), (["--shift", "two"], "--shift"),
    (["--flip=yes"], "--flip/--no-flip"), (["--no-flip=1"], "--flip/--no-flip"),
])
def test_bad_recipe_flags_exit_2_before_reading_data(args, flag, no_data, capsys):
    exits_2(cli.main, args, flag, capsys)


@needs_mnist
def test_the_recipe_is_printed_first_and_a_resume_that_changes_it_is_refused(tmp_path):
    smoke = ("-n", "10", "-m", "5", "-y", "1", "-x", "200", "--device", "cpu", "--shift", "1", "--warmup", "3",
             "--label-smoothing", "0.05", "--flip")
    p = train(*smoke, "-s", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    out = lines_of(p)
    recipe = next(i for i, line in enumerate(out) if line.startswith("recipe: "))
    assert recipe < out.index("[TRAIN]")
    assert ("seed 0" in out[recipe] and "warm-up 3 steps" in out[recipe] and "label smoothing 0.05" in out[recipe]
            and "shifts of up to 1 px, horizontal flips" in out[recipe] and "10 steps" in out[recipe])
    for flag, value, shown in (("--shift", "2", "--shift 2 (the checkpoint's run: 1)"),
                               ("--warmup", "4", "--warmup 4 (the checkpoint's run: 3)"),
                               ("--label-smoothing", "0.1", "--label-smoothing 0.1 (the checkpoint's run: 0.05)"),
                               ("--flip", None, "--flip off (the checkpoint's run: on)")):
        argv = list(smoke)
        if value is None:
            argv[argv.index(flag)] = "--no-flip"
        else:
            argv[argv.index(flag) + 1] = value
        p = train(*argv, "--resume", cwd=tmp_path)
        assert p.returncode == 2 and "argument --resume" in p.stderr and shown in p.stderr, p.stderr
    p = train(*smoke, "--resume", cwd=tmp_path)
    assert p.returncode == 0 and "the run is complete: step 10 of 10" in lines_of(p), p.stderr
