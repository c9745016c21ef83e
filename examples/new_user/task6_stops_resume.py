"""Task 6: stops and resumes, in Python and on the command line.

Python: Ctrl-C (SIGINT, sent to a child process) during fit(checkpoint=...) finishes the step and
saves; a new Trainer resumes it and fit(steps=N) trains to the run's total N (not N more), ending
where the run never stopped ends. CLI: a run stopped by SIGINT, then the same command plus --resume
(no -s) runs to the end and saves; `minidl infer` reports the accuracy the run printed.
"""
import os
import re
import signal
import subprocess
import sys

import numpy as np

import minidl as dl

STEPS = 120
child = f"""
import minidl as dl
trainer = dl.Trainer(dl.models.lenet5(), dl.optim.Adam(3e-3, schedule="cosine"), device="cpu", seed=0)
try:
    trainer.fit(dl.data.mnist("train"), steps={STEPS}, monitor=10, checkpoint="py_run.npz")
except dl.TrainingInterrupted as stop:
    print("child:", stop, "| a KeyboardInterrupt:", isinstance(stop, KeyboardInterrupt), flush=True)
"""


def stop_after_first_record(cmd):
    """Start cmd, send SIGINT once it prints its first 'step:' line, return its output and status."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out = []
    for line in p.stdout:
        out.append(line)
        if line.startswith("step:") and len(out) < 100:
            p.send_signal(signal.SIGINT)
            out.append("<SIGINT>\n")
            break
    out += p.stdout.readlines()
    return "".join(out), p.wait()


def last(text, pattern):
    return re.findall(pattern, text)[-1]


# -- Python ---------------------------------------------------------------------------------------
out, rc = stop_after_first_record([sys.executable, "-c", child])
print(f"[python] exit {rc}; {out.strip().splitlines()[-1]}")
train = dl.data.mnist("train")
trainer = dl.Trainer(dl.models.lenet5(), dl.optim.Adam(3e-3, schedule="cosine"), device="cpu", seed=0)
trainer.resume("py_run.npz")
at = trainer.step
trainer.fit(train, steps=STEPS, monitor=1000)
print(f"[python] resumed at step {at}, fit(steps={STEPS}) ended at step {trainer.step} "
      f"({trainer.step - at} trained)")
assert trainer.step == STEPS
trainer.fit(train, steps=STEPS, monitor=1000)                    # already there: nothing more
trainer.fit(train, more_steps=10, monitor=1000)
print(f"[python] fit(steps={STEPS}) again, then more_steps=10: step {trainer.step}")

whole = dl.Trainer(dl.models.lenet5(), dl.optim.Adam(3e-3, schedule="cosine"), device="cpu", seed=0)
whole.fit(train, steps=STEPS, monitor=1000)
resumed = dl.Trainer(dl.models.lenet5(), dl.optim.Adam(3e-3, schedule="cosine"), device="cpu", seed=0)
resumed.resume("py_run.npz")
resumed.fit(train, steps=STEPS, monitor=1000)
same = all(np.array_equal(a, resumed.model.get_weights()[k]) for k, a in whole.model.get_weights().items())
print("[python] stopped + resumed == never stopped, bit for bit:", same)

# -- the command line -----------------------------------------------------------------------------
cmd = [sys.executable, "-m", "minidl", "train", "-n", "200", "-m", "20", "--device", "cpu",
       "--checkpoint", "cli_run.npz"]
out, rc = stop_after_first_record(cmd)
print(f"[cli] {' '.join(cmd[3:])}: stopped, exit {rc}; {out.strip().splitlines()[-1]}")
print(f"[cli] checkpoint at step {dl.checkpoint.read_info('cli_run.npz')['meta']['step']}")
out = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, check=True).stdout
final = last(out, r"accuracy: ([\d.]+)%")
trained = last(out, r"trained .*")
print(f"[cli] --resume (no -s): {trained}; test accuracy {final}%")
print(f"[cli] checkpoint at step {dl.checkpoint.read_info('cli_run.npz')['meta']['step']}")
out = subprocess.run([sys.executable, "-m", "minidl", "infer", "--checkpoint", "cli_run.npz", "--device", "cpu"],
                     capture_output=True, text=True, check=True).stdout
scored = last(out, r"accuracy:? ([\d.]+)%")
print(f"[cli] minidl infer: {scored}% (the run printed {final}%)")
assert scored == final
