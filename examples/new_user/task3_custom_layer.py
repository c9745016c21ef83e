"""Task 3: a layer of your own, as docs/custom-layers.md writes one.

SoftClip(k): y = a * k * tanh(x / k), k a hyper-parameter (not trained), a a trained gain per
channel. Defined with no decorator, gradient-checked with minidl.testing, trained in a net, saved,
reloaded with k intact, exported to ONNX (with its own `onnx` mapping) and run by onnxruntime.
Loading in a process that has not imported the class must name it.
"""
import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort

import minidl as dl
from minidl import layers as L
from minidl.inference.onnx_export import save_onnx
from minidl.testing import check_gradients


class SoftClip(L.Layer):
    """y = a k tanh(x / k): a soft clip at +-k, with a trained gain a per channel.  x (N, C, ...) -> y."""

    kind = "softclip"

    def __init__(self, k=2.0, name=None):
        super().__init__(name)
        self.k = float(k)

    def build(self, in_shapes, device):
        shape, = in_shapes
        self.xp = device.xp
        self.a = self.param("a", (shape[1],), "ones")
        return shape

    def forward(self, xs, training):
        x, = xs
        t = self.xp.tanh(x / self.k)
        self.saved = t
        gain = self.a.data.reshape((1, -1) + (1,) * (x.ndim - 2))
        return gain * self.k * t

    def backward(self, gy, need):
        t = self.saved
        gain = self.a.data.reshape((1, -1) + (1,) * (gy.ndim - 2))
        axes = (0,) + tuple(range(2, gy.ndim))
        self.a.grad += (gy * self.k * t).sum(axis=axes)
        return (gy * gain * (1 - t * t),)

    def onnx(self, builder, ins, out, weights):
        x, = ins
        k = builder.const(out + "/k", np.array(self.k, np.float32))
        gain = builder.const(out + "/ak", (weights["a"] * self.k).astype(np.float32).reshape(1, -1, 1, 1))
        t = builder.op("Tanh", [builder.op("Div", [x, k], out + "/x_k")], out + "/tanh")
        return builder.op("Mul", [t, gain], out)


print("config recorded without a decorator:", SoftClip(k=3.0).config())
errors = check_gradients(SoftClip(k=3.0), in_shapes=[(2, 3, 4, 4)])
print("gradient check, max relative error:", f"{max(errors.values()):.1e}", sorted(errors))

x = L.Input((1, 28, 28))
h = L.MaxPool2D(2)(SoftClip(k=3.0)(L.Conv2D(8, 3, padding=1)(L.Normalize()(x))))
model = dl.Model(x, L.Softmax()(L.Dense(10)(L.Flatten()(h))), seed=0)
trainer = dl.Trainer(model, dl.optim.Adam(lr=1e-3), device="cpu", seed=0)
train, test = dl.data.mnist("train"), dl.data.mnist("test")
trainer.fit(train, steps=40, batch_size=32, monitor=40)
print(f"\nafter 40 steps: test accuracy {model.evaluate(test[0][:1000], test[1][:1000]).accuracy:.1%}")

trainer.save("softclip.npz")
loaded = dl.checkpoint.load_model("softclip.npz")
layer = next(n.layer for n in loaded.nodes if isinstance(n.layer, SoftClip))
print("reloaded: k =", layer.k, "| a equal:", np.array_equal(loaded.get_weights()["softclip/a"],
                                                            model.get_weights()["softclip/a"]))
assert layer.k == 3.0
images = test[0][:64]
assert np.allclose(loaded.predict(images), model.predict(images), atol=1e-6)

save_onnx("softclip.onnx", loaded)
session = ort.InferenceSession("softclip.onnx", providers=["CPUExecutionProvider"])
onnx_out = session.run(None, {"input": images[:, None].astype(np.float32) / 255})[0]
print("ONNX vs predict: max |diff|", f"{np.abs(onnx_out - loaded.predict(images)).max():.1e}")

# a fresh process that never imported SoftClip
code = "import minidl as dl; dl.checkpoint.load_model('softclip.npz')"
r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=os.getcwd())
print("loading without the class:", r.stderr.strip().splitlines()[-1])
