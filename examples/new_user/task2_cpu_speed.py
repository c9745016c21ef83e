"""Task 2: CPU speed through the Python API, with the default threads.

The README's Python quick start (LeNet-5, batch 32, device="cpu"), timed as it runs: no
set_threads() call, no OMP/OPENBLAS variable. The first CPU device picks one BLAS thread, as the
command line does; printed beside the threads BLAS uses and the command line's own ms/step.
"""
import os
import re
import subprocess
import sys

from threadpoolctl import threadpool_info

import minidl as dl

unset = [v for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS") if v in os.environ]
print("thread variables set:", unset or "none", "| cores:", os.cpu_count(), "| load:", os.getloadavg()[0])

model = dl.models.lenet5()
trainer = dl.Trainer(model, dl.optim.Adam(lr=3e-3), device="cpu")
print("BLAS threads after the first CPU device:", [p["num_threads"] for p in threadpool_info()])
trainer.fit(dl.data.mnist("train"), steps=60, batch_size=32, monitor=60)
loss, accuracy = trainer.evaluate(dl.data.mnist("test"))
api_ms = trainer.timing["steady_ms"]
print(f"\nPython API: {api_ms:.1f} ms/step (LeNet-5, b32), test accuracy {accuracy:.2%}")

cli = subprocess.run([sys.executable, "-m", "minidl", "train", "-n", "60", "-m", "60", "--device", "cpu"],
                     capture_output=True, text=True, check=True).stdout
cli_ms = float(re.search(r"([\d.]+) ms/step", cli).group(1))
print("CLI `minidl train -n 60 --device cpu`:", next(line for line in cli.splitlines() if "ms/step" in line).strip())
print(f"API / CLI: {api_ms / cli_ms:.2f}x (the CLI's recipe also shifts images, and label-smooths)")
assert api_ms < 3 * cli_ms, "the API is much slower than the command line"
