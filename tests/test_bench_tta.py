"""benchmarks/bench_tta.py (bench.py tta) and torch_recipe's recipe, without a GPU: the result lines of
both frameworks are read, the means and ratios printed, and PyTorch runs minidl's named recipe."""
import json
import subprocess

from benchmarks import bench_tta, torch_recipe

from minidl.cli import recipes
from minidl.training.history import StopAtAccuracy


class _Run:
    start, step, per_epoch = 0, 351, 117


def minidl_line(**kw):
    """The line minidl train prints, from StopAtAccuracy itself."""
    stop = StopAtAccuracy(0.99, data=([0], [0]))
    stop.reached, stop.step, stop.epoch, stop.accuracy = True, 351, 3.0, 0.9902
    stop.train_s, stop.first_s, stop.eval_s, stop.evaluations = 0.151, 0.021, 0.031, 15
    lines = []

    class T:
        log = lines.append
    run = _Run()
    run.trainer = T
    stop.on_train_end(run)
    return lines[0]


def test_minidl_train_s_line_is_read():
    got = bench_tta.parse("minidl", "recipe: ...\n" + minidl_line() + "\ntrained 351 steps in 0.2 s\n")
    assert got == {"reached": True, "step": 351, "epoch": 3.0, "accuracy": 99.02, "train_s": 0.151, "first_s": 0.021,
                   "eval_s": 0.031, "evaluations": 15}


def test_a_run_that_missed_or_failed_is_told_apart():
    assert bench_tta.parse("minidl", "target accuracy 99.00% not reached in 468 steps (best 98.9%): ...") == \
        {"reached": False}
    assert bench_tta.parse("minidl", "error: out of GPU memory") is None
    assert bench_tta.parse("pytorch", "Traceback ...") is None


def test_pytorch_s_json_line_is_read():
    record = {"framework": "pytorch", "reached": True, "step": 400, "train_s": 1.5, "first_s": 0.3}
    assert bench_tta.parse("pytorch", "x\ntime to accuracy: " + json.dumps(record) + "\n") == record


def test_the_table_prints_means_and_ratios_of_the_runs_that_reached_it():
    def got(step, train_s, first_s, process_s, eval_s):
        return {"reached": True, "step": step, "train_s": train_s, "first_s": first_s, "process_s": process_s,
                "eval_s": eval_s}
    missed = {"reached": False, "process_s": 3.0}
    runs = {"minidl": [got(300, 0.1, 0.02, 1.0, 0.01), got(400, 0.3, 0.04, 2.0, 0.03), missed],
            "pytorch": [got(350, 2.0, 0.3, 15.0, 0.1)]}
    results = {"recipe": "fast", "target": 99.0, "seeds": 3}
    for fw, rs in runs.items():
        results[fw] = {"runs": rs, "mean": bench_tta.summary(rs), "reached": sum(r["reached"] for r in rs)}
    assert results["minidl"]["mean"]["train_s"] == 0.2 and results["minidl"]["mean"]["step"] == 350
    lines = []
    bench_tta.print_table(results, lines.append)
    text = "\n".join(lines)
    assert "minidl 2/3, PyTorch 1/3" in text
    assert "| training to the target (s) | 0.200 | 2.000 | 10.00x |" in text
    assert "| whole process (s) | 1.500 | 15.000 | 10.00x |" in text


def test_the_commands_run_the_named_recipe_with_the_same_target():
    m, t = (bench_tta.commands(fw, 3, "fast", 99.0) for fw in ("minidl", "pytorch"))
    for cmd in (m, t):
        assert cmd[cmd.index("--recipe") + 1] == "fast" and cmd[cmd.index("--target-accuracy") + 1] == "99"
        assert cmd[cmd.index("--seed") + 1] == "3"


def test_torch_recipe_takes_the_named_recipe_where_flags_are_left_out():
    fast = recipes.NAMED["fast"]
    args = torch_recipe.resolve(torch_recipe.parser().parse_args(["--model", "lenet", "--recipe", "fast"]))
    for k in ("batch_size", "epochs", "optimizer", "lr", "weight_decay", "label_smoothing", "shift", "warmup",
              "schedule", "eval_every", "test_batch"):
        assert getattr(args, k) == fast.get(k), k
    args = torch_recipe.resolve(torch_recipe.parser().parse_args(["--recipe", "fast", "-b", "64"]))
    assert args.batch_size == 64
    plain = torch_recipe.resolve(torch_recipe.parser().parse_args([]))
    assert (plain.model, plain.batch_size, plain.lr, plain.warmup, plain.test_batch) == ("resnet18", 32, 0.025, 0, 1000)


def test_a_run_is_a_child_that_writes_bytecode_as_a_warm_machine_has_it(monkeypatch):
    seen = {}

    def run(cmd, cwd, env, capture_output, text):
        seen.update(env=env, cmd=cmd)
        return subprocess.CompletedProcess(cmd, 0, "time to accuracy: " + json.dumps({"reached": False}), "")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setattr(bench_tta.subprocess, "run", run)
    r = bench_tta.run_one("pytorch", 3, "fast", 99.0)
    assert r["reached"] is False and r["seed"] == 3 and r["process_s"] >= 0
    assert "PYTHONDONTWRITEBYTECODE" not in seen["env"] and str(bench_tta.ROOT) in seen["env"]["PYTHONPATH"]
