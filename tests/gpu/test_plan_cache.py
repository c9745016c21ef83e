"""Built cuDNN plans kept on disk (kernels/gpu/plan_cache.py), on the GPU: a plan serialised by one
process and loaded by a fresh one gives the same bits as the built one; a damaged, foreign or refused
plan is built again with the same answers; and how long a warm start takes with and without them.

Each "process" is a child running LeNet-like convolution graphs (fprop with the fused bias and ReLU,
plain fprop, dgrad, wgrad; autotuned, deterministic, as training runs them) on seeded arrays.
"""
import ast
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("cupy")
pytest.importorskip("cudnn")

ROOT = pathlib.Path(__file__).resolve().parents[2]

_CHILD = r"""
import ast, json, logging, sys
import cupy as cp, numpy as np
from minidl.kernels.gpu import conv, cudnn_graphs as cudnn, plan_cache

logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s: %(message)s")
out = sys.argv[1]
seen = {"loaded": [], "saved": [], "builds": 0}
load, save, build = plan_cache.load, plan_cache.save, cudnn._build


def op(key):
    return [x for x in ast.literal_eval(key) if isinstance(x, str) and x.startswith("conv")][0]


def loading(key, *a, **k):
    got = load(key, *a, **k)
    if got:
        seen["loaded"].append(op(key))
    return got


def saving(key, *a, **k):
    before = plan_cache.stats["unserialisable"]
    save(key, *a, **k)
    if plan_cache.stats["unserialisable"] == before:
        seen["saved"].append(op(key))


def building(*a, **k):
    seen["builds"] += 1
    return build(*a, **k)


plan_cache.load, plan_cache.save, cudnn._build = loading, saving, building
rng = np.random.default_rng(0)
results = {}
for N, C, H, K in ((16, 1, 28, 20), (16, 20, 12, 50)):        # LeNet-5's two convolutions
    plan = conv.conv2d_plan((None, C, H, H), (K, C, 5, 5), (1, 1), 0, (1, 1))
    x = cp.asarray(rng.standard_normal((N, C, H, H), np.float32))
    w = cp.asarray(rng.standard_normal((K, C, 5, 5), np.float32) * 0.1)
    b = cp.asarray(rng.standard_normal(K, np.float32))
    gy = cp.asarray(rng.standard_normal((N, K, H - 4, H - 4), np.float32))
    gw = cp.zeros((K, C, 5, 5), np.float32)
    results[f"y{C}"] = conv.conv2d_fprop(plan, x, w)
    results[f"ybr{C}"] = conv.conv2d_bias_relu_fprop(plan, x, w, b)
    results[f"gx{C}"] = conv.conv2d_dgrad(plan, gy, w)
    conv.conv2d_wgrad(plan, x, gy, gw, accumulate=False)
    results[f"gw{C}"] = gw
np.savez(out, **{k: v.get() for k, v in results.items()})
plan_cache.flush()
print(json.dumps(dict(seen, stats=dict(plan_cache.stats))))
"""


def _pythonpath():
    """This checkout first, then the device's own path (where the cuDNN Frontend is installed)."""
    return os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))


def _child(cache, out, **env):
    env = dict(os.environ, MINIDL_CACHE=str(cache), PYTHONPATH=_pythonpath(), **env)
    env.pop("MINIDL_AUTOTUNE", None)
    p = subprocess.run([sys.executable, "-c", _CHILD, str(out)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    notes = [line for line in p.stderr.splitlines() if "plan_cache" in line]
    return json.loads(p.stdout.strip().splitlines()[-1]), dict(np.load(out)), notes


def _same_bits(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), k        # same engine, deterministic: bit for bit


def test_a_plan_serialised_by_one_process_gives_the_same_bits_in_a_fresh_one(tmp_path):
    first, built, notes = _child(tmp_path / "cache", tmp_path / "1.npz")
    print(f"\nplans saved: {first['saved']}; not serialisable: {first['stats'].get('unserialisable', 0)}")
    print("\n".join(notes))
    assert first["saved"], f"cuDNN serialised none of {first['builds']} plans: {notes}"
    second, loaded, notes = _child(tmp_path / "cache", tmp_path / "2.npz")
    print(f"loaded in a fresh process: {second['loaded']}; built: {second['builds']}")
    assert sorted(second["loaded"]) == sorted(first["saved"]), notes
    assert second["builds"] == first["builds"] - len(first["saved"])
    _same_bits(built, loaded)
    third, rebuilt, _ = _child(tmp_path / "cache", tmp_path / "3.npz", MINIDL_PLAN_CACHE="0")
    assert third["loaded"] == [] and third["builds"] == first["builds"]
    _same_bits(built, rebuilt)                   # and the remembered engines' rebuild agrees too


def _rewrite(file, how):
    data = file.read_bytes()
    magic = b"minidl cudnn plan\n"
    head, _, blob = data[len(magic):].partition(b"\n")
    meta = json.loads(head)
    if how == "flipped":                          # a damaged disk: the checksum catches it
        file.write_bytes(data[:-1] + bytes([data[-1] ^ 0x40]))
        return
    if how == "foreign":                          # another GPU's plan under this name
        key = list(ast.literal_eval(meta["key"]))
        key[2] = "Another GPU"
        meta["key"] = repr(tuple(key))
    else:                                         # checksum right, plan cut short: cuDNN must refuse it
        import hashlib
        blob = blob[: len(blob) // 2]
        meta.update(size=len(blob), sha256=hashlib.sha256(blob).hexdigest())
    file.write_bytes(magic + json.dumps(meta).encode() + b"\n" + blob)


@pytest.mark.parametrize("how", ["flipped", "foreign", "refused"])
def test_a_damaged_foreign_or_refused_plan_is_built_again_with_the_same_answers(tmp_path, how):
    first, built, _ = _child(tmp_path / "cache", tmp_path / "1.npz")
    if not first["saved"]:
        pytest.skip("cuDNN serialised no plan here (the test above says which)")
    plans = sorted((tmp_path / "cache" / "cudnn-plans").iterdir())
    for file in plans:
        _rewrite(file, how)
    second, again, notes = _child(tmp_path / "cache", tmp_path / "2.npz")
    assert second["loaded"] == [] and second["builds"] == first["builds"]
    assert second["stats"]["passed_over"] == len(plans)
    assert len([n for n in notes if "passed over" in n]) == len(plans)       # one line each
    _same_bits(built, again)
    third, _, _ = _child(tmp_path / "cache", tmp_path / "3.npz")             # the rebuilt plans were kept
    assert sorted(third["loaded"]) == sorted(first["saved"])


def _startup(folder, model, **env):
    """One profile_startup child (its phases, as JSON) on the caches in `folder`, and its wall seconds."""
    out = folder / "run.json"
    env = dict(os.environ, PYTHONPATH=_pythonpath(), MINIDL_CACHE=str(folder / "minidl"),
               CUPY_CACHE_DIR=str(folder / "cupy"), **env)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "benchmarks/profile_startup.py", "--child", str(out), *model], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads(out.read_text()), wall


@pytest.mark.parametrize("model", [["--model", "lenet", "-b", "128"], ["-r50", "-b", "32"]], ids=["lenet", "r50"])
def test_warm_start_with_and_without_the_plan_cache(tmp_path, model):
    """A timing print, not an assertion: warm runs alternated, plans loaded (on) or rebuilt (off)."""
    _startup(tmp_path, model)                                          # cold: fills every cache
    rows = [(plans, *_startup(tmp_path, model, MINIDL_PLAN_CACHE=plans)) for plans in ("0", "1", "0", "1")]
    plans = list((tmp_path / "minidl" / "cudnn-plans").glob("*.plan"))
    print(f"\n{' '.join(model)}: {len(plans)} plan files, {sum(p.stat().st_size for p in plans) / 1e6:.2f} MB;"
          " warm starts, plan cache off (0) / on (1), one child each")
    for plans, r, wall in rows:
        stats = r.get("plans", {})
        print(f"  plans={plans}: first step {r['first_step'] * 1e3:.0f} ms, cudnn builds {r['cudnn_build']:.3f} s,"
              f" plan loads {r['plan_load']:.3f} s (loaded {stats.get('loaded', 0)}, built {stats.get('built', 0)}),"
              f" ready {r['ready_wall']:.2f} s, process {wall:.2f} s")
