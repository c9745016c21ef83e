"""Task 1: one input contract, for every model.

The same uint8 images through every entry point (predict, forward, the compiled model, ONNX),
for a custom net without Normalize (the README's) and for a zoo net (lenet5, which carries its
Normalize). Each must give Model.predict's outputs; uint8 and float [0, 1] must agree; (N, H, W)
and NHWC must be taken; floats in [0, 255] must be refused in one line.
"""
import numpy as np

import minidl as dl
from minidl import layers as L
from minidl.inference.onnx_export import save_onnx
import onnxruntime as ort


def custom_net():
    """The README's net of your own: no Normalize."""
    x = L.Input((1, 28, 28))
    h = L.ReLU()(L.BatchNorm2D()(L.Conv2D(16, 3, padding=1, bias=False)(x)))
    h = L.MaxPool2D(2)(h)
    h = L.Add()(h, L.ReLU()(L.Conv2D(16, 3, padding="same")(h)))
    y = L.Softmax()(L.Dense(10)(L.Flatten()(h)))
    return dl.Model(x, y, seed=0)


train, test = dl.data.mnist("train"), dl.data.mnist("test")
images = test[0][:256]                                            # uint8 (256, 28, 28)
floats = images.astype(np.float32) / 255

for name, model in [("custom net", custom_net()), ("zoo lenet5", dl.models.lenet5())]:
    trainer = dl.Trainer(model, dl.optim.Adam(lr=3e-3), device="cpu", seed=0)
    trainer.fit(train, steps=30, batch_size=32, monitor=30)
    p = model.predict(images)                                     # (N, H, W) uint8
    outs = {
        "predict(float [0, 1])": model.predict(floats),
        "forward(uint8 N,H,W)": np.asarray(model.forward(images)),
        "model(uint8 N,C,H,W)": np.asarray(model(images[:, None])),
        "compile().predict(uint8)": dl.inference.compile(model, device="cpu").predict(images),
        "predict(NHWC uint8)": model.predict(images[..., None]),
    }
    save_onnx(f"{name.replace(' ', '_')}.onnx", model)
    session = ort.InferenceSession(f"{name.replace(' ', '_')}.onnx", providers=["CPUExecutionProvider"])
    outs["ONNX(float [0, 1])"] = session.run(None, {"input": floats[:, None]})[0]
    save_onnx("uint8.onnx", model, uint8=True)                    # minidl export --uint8
    session = ort.InferenceSession("uint8.onnx", providers=["CPUExecutionProvider"])
    outs["ONNX --uint8 (uint8)"] = session.run(None, {"input": images[:, None]})[0]
    print(f"{name}: predict gives {p.shape}, rows sum to {p.sum(1).mean():.4f}, "
          f"test accuracy {model.evaluate(*test).accuracy:.1%}")
    for what, out in outs.items():
        diff = float(np.abs(out - p).max())
        agree = float((out.argmax(1) == p.argmax(1)).mean())
        print(f"  {what:28s} max |diff| vs predict(uint8) {diff:.1e}, argmax agrees {agree:.0%}")
        assert diff < 1e-4, what
    try:
        model.predict(floats * 255)
    except ValueError as e:
        print("  floats in [0, 255] refused:", e)
    else:
        raise AssertionError("floats in [0, 255] were taken")
