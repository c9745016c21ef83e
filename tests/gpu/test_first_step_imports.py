"""A training step imports and compiles nothing it need not: CuPy answers the first `array <op>
python number` of a process by importing cupyx.scipy.sparse and SciPy (0.44 s on the H200 machine),
so the step's device arithmetic, the schedules' included, calls CuPy's ufuncs instead
(minidl/optim/schedules.py); and CuPy compiles an empty file once per set of compile options
(13 ms), so every minidl kernel compiles with the same options (kernels/gpu/_cuda.py OPTIONS). Checked in
a fresh process: this one may have imported SciPy or compiled under other options already."""
import subprocess
import sys

import pytest

pytest.importorskip("cupy")
pytest.importorskip("cudnn")

SCRIPT = r"""
import sys
import numpy as np
import minidl as dl
from minidl import models, optim
from minidl.optim import schedules
from minidl.precision import policy
from cupy.cuda import compiler

rng = np.random.default_rng(0)
images, labels = rng.integers(0, 256, (128, 28, 28), dtype=np.uint8), rng.integers(0, 10, 128).astype(np.uint8)
dev = dl.get_device("cuda")
runs = ((None, "fp32"), (schedules.cosine(12), "fp16"), (schedules.warmup(3, schedules.cosine(12)), "bf16"),
        (schedules.step_decay(4), "fp32"), (schedules.warmup(2, schedules.inverse_time(0.1)), "fp32"))
for i, (schedule, precision) in enumerate(runs):
    opt = optim.SGD(lr=0.01, schedule=schedule)
    trainer = dl.Trainer(models.get("lenet", device=dev), opt, precision=policy(precision, always=True),
                         progress=False, log=lambda s: None)
    trainer.fit((images, labels), steps=6, batch_size=32, monitor=6)
    trainer.evaluate((images, labels), batch_size=64)
    if i == 0:     # CuPy's fingerprints, one per option set (its own half kernels add theirs later)
        print(len(compiler._empty_file_preprocess_cache))
print(sorted(m for m in ("scipy", "scipy.sparse", "cupyx.scipy.sparse") if m in sys.modules))
"""


@pytest.fixture(scope="module")
def fresh_run():
    out = subprocess.run([sys.executable, "-c", SCRIPT], check=False, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()


def test_training_steps_do_not_import_scipy(fresh_run):
    assert fresh_run[-1] == "[]"


def test_every_kernel_compiles_under_one_set_of_options(fresh_run):
    assert fresh_run[-2] == "1"      # after the float32 training and evaluation
