"""`python -m minidl.train`: a smoke run, save and resume, and clean errors (run as a subprocess)."""
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = os.environ.get("MINIDL_DATA")
STEP_LINE = re.compile(r"step: +\d+, loss: \d+\.\d{3}, accuracy: \d+\.\d{3}%")
RESULT_LINE = re.compile(r"loss: \d+\.\d{3}, accuracy: \d+\.\d{3}%.*")

needs_mnist = pytest.mark.skipif(not (DATA and os.path.isdir(os.path.join(DATA, "mnist"))),
                                 reason="real MNIST not found: $MINIDL_DATA/mnist/ is missing")


def train(*args, cwd, data=True, **env_extra):
    """Run the CLI in `cwd`; data=False unsets $MINIDL_DATA."""
    env = {k: v for k, v in os.environ.items() if k != "MINIDL_DATA"}
    env.update(PYTHONPATH=str(ROOT), **env_extra)
    if data and DATA:
        env["MINIDL_DATA"] = DATA
    return subprocess.run([sys.executable, "-m", "minidl.train", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def lines_of(proc):
    return [line.rstrip() for line in proc.stdout.splitlines()]


SMOKE = ("-n", "20", "-m", "10", "-y", "1", "-x", "500", "--device", "cpu")


@needs_mnist
def test_smoke_run_prints_the_seed_lines(tmp_path):
    p = train(*SMOKE, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    out = lines_of(p)
    for needed in ("[TRAIN]", "[INFERENCE]", "Done."):
        assert needed in out, f"{needed!r} missing from:\n{p.stdout}"
    steps = [line for line in out if STEP_LINE.fullmatch(line)]
    assert [line[:10] for line in steps] == ["step:   10", "step:   20"]
    results = [line for line in out if RESULT_LINE.fullmatch(line)]
    assert len(results) == 1 and "first 500 of 10000" in results[0]
    order = [out.index("[TRAIN]"), out.index(steps[0]), out.index(steps[1]), out.index("[INFERENCE]"),
             out.index(results[0]), out.index("Done.")]
    assert order == sorted(order)
    assert out[-1] == "Done."
    assert any(line.startswith("loaded 60000 items") for line in out)
    assert any(line.startswith("loaded 10000 items") for line in out)
    assert not (tmp_path / "checkpoints").exists()           # no -s, no checkpoint


@needs_mnist
def test_resume_continues_the_planned_run_and_refuses_another_plan(tmp_path):
    p = train(*SMOKE[:2], "-b", "16", *SMOKE[2:], "-s", cwd=tmp_path)      # -n 20 -b 16
    assert p.returncode == 0, p.stderr
    ckpt = tmp_path / "checkpoints" / "lenet5.npz"
    assert ckpt.is_file()
    assert any("saved" in line and "lenet5.npz" in line for line in lines_of(p))
    with np.load(ckpt, allow_pickle=False) as z:
        info = json.loads(z["__meta__"].tobytes())
    assert info["meta"]["step"] == 20 and info["meta"]["plan"]["steps"] == 20

    p = train(*SMOKE[:2], "-b", "16", *SMOKE[2:], "--resume", cwd=tmp_path)   # -n is the run's total
    assert p.returncode == 0, p.stderr
    out = lines_of(p)
    assert any(re.fullmatch(r"resumed from \S*lenet5\.npz at step 20", line) for line in out), p.stdout
    assert "the run is complete: step 20 of 20" in out and "Done." in out

    for flags, named in ((("-n", "30"), "-n 30"), (("-b", "32"), "-b 32"), (("--lr", "0.1"), "--lr 0.1")):
        argv = dict(zip(SMOKE[::2], SMOKE[1::2]), **{"-b": "16"})
        argv.update(dict([flags]))
        p = train(*[x for kv in argv.items() for x in kv], "--resume", cwd=tmp_path)
        assert p.returncode == 2 and "usage:" in p.stderr, p.stderr
        assert f"{named} (the checkpoint's run:" in p.stderr and "argument --resume" in p.stderr


@pytest.mark.parametrize("args,message", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["-b0"], "argument -b"),
    (["-r", "20"], "argument -r"),
    (["-n", "-5"], "argument -n"),
])
def test_bad_flags_exit_2_with_usage(args, message, tmp_path):
    p = train(*args, "--device", "cpu", cwd=tmp_path)
    assert p.returncode == 2
    assert p.stderr.startswith("usage: python -m minidl.train")
    assert message in p.stderr
    assert "Traceback" not in p.stderr
    assert p.stdout == ""


def test_missing_data_is_a_one_line_error(tmp_path):
    # --data-dir names a folder that does not exist (under tmp_path, so that the download folder the
    # CLI creates there stays inside the test), $MINIDL_DATA is unset, ./dataset is absent, and the
    # only mirror refuses connections at once
    missing = tmp_path / "nonexistent"
    p = train("--data-dir", str(missing), "--device", "cpu", cwd=tmp_path, data=False,
              MINIDL_MIRRORS="http://127.0.0.1:9/")
    assert p.returncode not in (0, 2)
    assert "Traceback" not in p.stderr
    errors = [line for line in p.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, p.stderr
    line = errors[0][errors[0].index("error:"):]
    assert line.startswith("error: ") and "mnist" in line
    assert "train-images-idx3-ubyte" in line
    assert "[INFERENCE]" not in p.stdout
    assert not list(missing.rglob("*ubyte*"))                 # nothing half-downloaded is left


def exits_2(main, args, flag, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    out, err = capsys.readouterr()
    assert e.value.code == 2
    assert err.startswith("usage: python -m minidl.")
    last = err.strip().splitlines()[-1]
    assert f"error: argument {flag}:" in last, err
    assert out == ""
    return err


@pytest.mark.parametrize("args,flag", [
    (["--lr", "-1"], "--lr"), (["--lr", "nan"], "--lr"), (["--lr", "inf"], "--lr"), (["--lr", "0"], "--lr"),
    (["--weight-decay", "-1"], "--weight-decay"), (["--weight-decay", "nan"], "--weight-decay"),
    (["--weight-decay", "inf"], "--weight-decay"),
    (["-b", "1000000000"], "-b"), (["-b", "60001"], "-b"),
    (["-b", "70000", "--epochs", "1"], "-b"),                 # was a cosine-schedule error
    (["-x", "10001"], "-x"), (["--epochs", "0"], "--epochs"), (["-m", "0"], "-m"), (["-n", "0"], "-n"),
    (["-y", "0"], "-y"), (["--threads", "0"], "--threads"), (["--seed", "-1"], "--seed"),
    (["-r18", "--model", "lenet"], "-r"), (["-l", "--resume"], "-l"),
    (["--resume"], "--resume"), (["-l"], "-l"), (["--resume", "-r", "50"], "--resume"),
    (["--resume", "--checkpoint", "elsewhere/x.npz"], "--resume"),
    (["-s", "--checkpoint", "a-file/x.npz"], "--checkpoint"),   # a file where the folder should be
    (["-s", "--checkpoint", "."], "--checkpoint"),               # a folder, not a file
    (["--precision", "fp8"], "--precision"),
    (["--tensorboard", "a-file"], "--tensorboard"),               # a file where the folder should be
])
def test_train_rejects_bad_values_before_reading_data(args, flag, no_data, capsys):
    from minidl.cli import train as cli
    exits_2(cli.main, args, flag, capsys)


def test_missing_checkpoint_message_names_the_default_path(no_data, capsys):
    from minidl.cli import train as cli
    err = exits_2(cli.main, ["--resume", "-r", "50"], "--resume", capsys)
    assert os.path.join("checkpoints", "resnet50.npz") in err


def test_save_checks_a_writable_folder_and_leaves_no_file(no_data, capsys):
    from minidl.cli import train as cli
    args = cli.check_args(cli.parser(), cli.parser().parse_args(["-s", "--checkpoint", "new/dir/x.npz"]))
    assert args.save
    assert (no_data / "new" / "dir").is_dir() and not list((no_data / "new" / "dir").iterdir())


@pytest.mark.parametrize("args,flag", [
    (["--checkpoint", "missing.npz"], "--checkpoint"), (["--artifact", "missing.npz"], "--artifact"),
    (["--checkpoint", "a-file", "--batch-size", "0"], "--batch-size"),
    (["--checkpoint", "a-file", "--batch-size", "10001"], "--batch-size"),
    (["--checkpoint", "a-file", "--runs", "0"], "--runs"),
    (["--checkpoint", "a-file", "--runs", "1000000000"], "--runs"),
    (["--checkpoint", "a-file", "--threads", "0"], "--threads"),
    (["--checkpoint", "a-file", "--save-artifact", "a-file/x.npz"], "--save-artifact"),
    (["--checkpoint", "a-file", "--precision", "half"], "--precision"),
])
def test_infer_rejects_bad_values_before_reading_data(args, flag, no_data, capsys):
    from minidl.cli import infer as cli
    exits_2(cli.main, args, flag, capsys)


def test_infer_names_no_gpu_module():
    assert "kernels.gpu" not in (ROOT / "minidl" / "cli/infer.py").read_text()


@needs_mnist
def test_cpu_run_does_not_claim_compilation(tmp_path):
    p = train("-n", "3", "-m", "3", "-y", "1", "-x", "100", "--device", "cpu", "--threads", "1", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    line = next(printed for printed in lines_of(p) if printed.startswith("trained 3 steps"))
    assert "compilation" not in line
    assert ", 1 thread" in p.stdout


def test_channels_last_flag_is_on_off_or_the_devices_choice():
    from minidl.cli import train as cli
    p = cli.parser()
    assert p.parse_args([]).channels_last is None                    # Device.channels_last decides
    assert p.parse_args(["--channels-last"]).channels_last is True
    assert p.parse_args(["--no-channels-last"]).channels_last is False


def test_tensorboard_without_tensorboardx_is_one_line_before_any_data(no_data, capsys, monkeypatch):
    import importlib.util
    from minidl.cli import train as cli
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboardX" else real(name, *a))
    err = exits_2(cli.main, ["--tensorboard", "runs"], "--tensorboard", capsys)
    assert "pip install '.[tensorboard]' in minidl's checkout, or pip install tensorboardX" in err


# -- the zoo by name, and -n against --epochs (issue 29, point 6) ---------------------------------

def test_model_choices_are_the_zoos_names():
    from minidl import models
    from minidl.cli import train as cli
    choices = next(a.choices for a in cli.parser()._actions if a.dest == "model")
    assert tuple(choices) == models.names()
    assert {"lenet", "resnet", "simplenet", "lenet-caffe", "relunet", "largenet", "resnet50"} <= set(choices)


@pytest.mark.parametrize("args", [["-n", "100", "--epochs", "1"], ["--epochs", "1", "-n", "2000"]])
def test_steps_with_epochs_exit_2_naming_both_before_reading_data(args, no_data, capsys):
    from minidl.cli import train as cli
    err = exits_2(cli.main, args, "-n", capsys)         # -n at its default value, but given: still refused
    assert "--epochs" in err.strip().splitlines()[-1]


def test_steps_left_out_take_the_default_and_epochs_alone_plan_no_steps(no_data):
    from minidl.cli import recipes, train as cli
    p = cli.parser()
    assert recipes.plan(cli.check_args(p, p.parse_args([]))).steps == cli.DEFAULT_STEPS == 2000
    plan = recipes.plan(cli.check_args(p, p.parse_args(["--epochs", "2"])))
    assert (plan.steps, plan.epochs) == (None, 2)


@pytest.mark.parametrize("args,flag", [(["--model", "simplenet", "-r", "18"], "-r"),
                                       (["--model", "resnet50", "-r", "18"], "-r"),
                                       (["--model", "vgg"], "--model")])
def test_model_and_depth_that_disagree_exit_2(args, flag, no_data, capsys):
    from minidl.cli import train as cli
    exits_2(cli.main, args, flag, capsys)


@pytest.mark.parametrize("argv,tag,family", [(["--model", "lenet-caffe"], "lenet-caffe", "lenet-caffe"),
                                             (["--model", "lenet_caffe"], "lenet-caffe", "lenet-caffe"),
                                             (["--model", "resnet50"], "resnet50", "resnet"),
                                             (["--model", "resnet50", "-r", "50"], "resnet50", "resnet"),
                                             (["--model", "lenet5"], "lenet5", "lenet")])
def test_each_name_plans_its_model_checkpoint_and_recipe(argv, tag, family, no_data):
    from minidl.cli import recipes, train as cli
    p = cli.parser()
    args = cli.check_args(p, p.parse_args(argv))
    plan = recipes.plan(args)
    assert plan.model == tag and cli.checkpoint_path(args) == os.path.join("checkpoints", f"{tag}.npz")
    assert all(getattr(plan, k) == v for k, v in recipes.RECIPES[family].items())


@needs_mnist
@pytest.mark.parametrize("name", ["simplenet", "lenet-caffe", "relunet", "largenet"])
def test_the_studys_nets_train_by_name(name, tmp_path, monkeypatch, capsys):
    from minidl.cli import train as cli
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--model", name, "-n", "4", "-m", "2", "-y", "1", "-x", "100", "--device", "cpu", "-s"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f".. model {name}: ") and "sgd lr 0.01 constant" in line for line in out), out
    assert [line[:10] for line in out if STEP_LINE.fullmatch(line)] == ["step:    2", "step:    4"]
    assert any(RESULT_LINE.fullmatch(line) for line in out) and out[-1] == "Done."
    assert (tmp_path / "checkpoints" / f"{name}.npz").is_file()
