"""Task 7: checkpoints that know their data.

An MNIST run saves checkpoints/lenet5.npz; a Fashion-MNIST run with -s must not replace it (it
saves checkpoints/lenet5-fashion-mnist.npz), and `-s --checkpoint` onto the MNIST file is refused;
`minidl infer` scores each checkpoint on its own dataset and refuses a --dataset that differs.
A checkpoint saved from Python says its dataset when told (Trainer.save(path, dataset=...)).
"""
import re
import subprocess
import sys

import minidl as dl


def minidl(*args):
    r = subprocess.run([sys.executable, "-m", "minidl", *args], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def accuracy(out):
    return re.findall(r"accuracy:? ([\d.]+)%", out)[-1]


rc, out = minidl("train", "-n", "60", "-m", "60", "--device", "cpu", "-s")
print(f"train (MNIST) -s: exit {rc}, test accuracy {accuracy(out)}%")
mnist_info = dl.checkpoint.read_info("checkpoints/lenet5.npz")
rc, out = minidl("train", "--dataset", "fashion-mnist", "-n", "60", "-m", "60", "--device", "cpu", "-s")
saved = re.findall(r"checkpoints/\S+\.npz", out)
print(f"train --dataset fashion-mnist -s: exit {rc}, test accuracy {accuracy(out)}%, saved {sorted(set(saved))}")
print("checkpoints/lenet5.npz still the MNIST run:",
      dl.checkpoint.dataset_of(dl.checkpoint.read_info("checkpoints/lenet5.npz")),
      dl.checkpoint.read_info("checkpoints/lenet5.npz") == mnist_info)
rc, out = minidl("train", "--dataset", "fashion-mnist", "-n", "20", "--device", "cpu", "-s",
                 "--checkpoint", "checkpoints/lenet5.npz")
print(f"train --dataset fashion-mnist -s --checkpoint checkpoints/lenet5.npz: exit {rc}:",
      out.strip().splitlines()[-1])

rc, out = minidl("infer", "--checkpoint", "checkpoints/lenet5-fashion-mnist.npz", "--device", "cpu")
print(f"infer the Fashion-MNIST checkpoint: exit {rc}: {out.strip().splitlines()[-1]}")
rc, out = minidl("infer", "--checkpoint", "checkpoints/lenet5-fashion-mnist.npz", "--dataset", "mnist",
                 "--device", "cpu")
print(f"infer it with --dataset mnist: exit {rc}: {out.strip().splitlines()[-1]}")

# from Python: arrays do not say which dataset they are; the Trainer is told, in save() or .dataset
trainer = dl.Trainer(dl.models.lenet5(), dl.optim.Adam(3e-3), device="cpu")
trainer.fit(dl.data.fashion_mnist("train"), steps=30, monitor=30)
trainer.save("py_unnamed.npz")
trainer.save("py_fashion.npz", dataset="fashion-mnist")
for path in ("py_unnamed.npz", "py_fashion.npz"):
    rc, out = minidl("infer", "--checkpoint", path, "--device", "cpu")
    lines = out.splitlines()
    notes = [line for line in lines if line.startswith("note")]
    print(f"\ninfer {path} (dataset recorded: {dl.checkpoint.dataset_of(dl.checkpoint.read_info(path))}): "
          f"exit {rc}, {next(line for line in lines if line.startswith('accuracy'))}"
          + (f"\n  {notes[0]}" if notes else ""))
