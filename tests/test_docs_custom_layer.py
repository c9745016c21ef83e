"""docs/custom-layers.md as written: its ```python blocks, joined in order, run as one program.

The page defines a layer, checks its gradient, trains it on MNIST, saves, reloads and exports it
to ONNX, asserting as it goes; this runs it in a fresh interpreter on the CPU, in a temporary folder,
with MNIST from $MINIDL_DATA (skipped where MNIST is not there: nothing is downloaded).
"""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "custom-layers.md"
FENCE = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def page_program():
    return "\n\n".join(FENCE.findall(PAGE.read_text(encoding="utf-8")))


def test_the_page_is_in_the_site_and_its_program_does_every_step():
    assert "custom-layers.md" in (ROOT / "mkdocs.yml").read_text()
    code = page_program()
    for step in ("class Swish(L.Layer)", "check_gradients(", "trainer.fit(", "trainer.save(",
                 "load_model(", "save_onnx(", "InferenceSession("):
        assert step in code, f"docs/custom-layers.md no longer shows {step}"
    assert "record_config" not in FENCE.findall(PAGE.read_text())[0]     # no decorator to remember


def test_the_page_runs(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from minidl.data import DataError, find_dataset
    try:
        folder = str(next(iter(find_dataset("mnist", download=False, progress=False).values())).resolve().parent)
    except (DataError, OSError):
        pytest.skip("MNIST not found under $MINIDL_DATA or the other local roots (not downloaded)")
    env = dict(os.environ, MINIDL_DATA=folder, CUDA_VISIBLE_DEVICES="", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-c", page_program()], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, f"docs/custom-layers.md failed:\n--- stdout:\n{r.stdout}\n--- stderr:\n{r.stderr[-3000:]}"
    assert "ONNX agrees with predict" in r.stdout
    assert (tmp_path / "swish_net.npz").is_file() and (tmp_path / "swish_net.onnx").is_file()
