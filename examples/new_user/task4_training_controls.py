"""Task 4: the training controls a Keras or PyTorch user reaches for first.

Freezing a layer, parameter groups, clip_norm, AdamW, load_weights(strict=False) into a new head,
fit(validation_data=) returning a History, EarlyStopping, ReduceLROnPlateau, ModelCheckpoint
(best only), model.evaluate without a Trainer, schedule="cosine". Tens of steps each.
"""
import numpy as np

import minidl as dl
from minidl.callbacks import EarlyStopping, ModelCheckpoint, ReduceLROnPlateau   # as docs/training.md imports them

train, test = dl.data.mnist("train"), dl.data.mnist("test")
val = (test[0][:500], test[1][:500])

# freezing, parameter groups, clipping, AdamW, a cosine schedule by name
model = dl.models.lenet5()
model.freeze("conv2d")                                          # Keras-style, by layer name
model.layer("dense").params["b"].trainable = False             # torch-style, one parameter
model.layer("dense_1").trainable = False                       # Keras-style, a layer object
model.summary()
before = model.get_weights()
opt = dl.optim.AdamW(1e-3, weight_decay=0.05, clip_norm=1.0, schedule="cosine",
                     groups=[{"params": ["dense_2"], "lr": 1e-2}])
trainer = dl.Trainer(model, opt, device="cpu", seed=0)
history = trainer.fit(train, steps=40, batch_size=32, monitor=20, validation_data=val, validation_freq=20)
after = model.get_weights()
print("\nfrozen conv2d/w unchanged:", np.array_equal(before["conv2d/w"], after["conv2d/w"]),
      "| conv2d_1/w changed:", not np.array_equal(before["conv2d_1/w"], after["conv2d_1/w"]))
frozen = ["conv2d/w", "conv2d/b", "dense/b", "dense_1/w", "dense_1/b"]
print("also unchanged:", {k: np.array_equal(before[k], after[k]) for k in frozen[1:]})
assert all(np.array_equal(before[k], after[k]) for k in frozen)
print("History:", {k: [round(v, 4) for v in vs] for k, vs in history.history.items()})
print("lr by the cosine schedule at the records:", history.history["lr"], "| optimizer lr now:", opt.lr)
loss, accuracy = history                                        # the last interval's Score, as before
print(f"model.evaluate without a Trainer: {model.evaluate(*val)}; Trainer.evaluate: {trainer.evaluate(val)}")
trainer.save("lenet5-digits.npz")

# a new head: 5 classes, the rest loaded from the 10-class run
head5 = dl.models.lenet5(classes=5)
keys = dl.checkpoint.load_weights("lenet5-digits.npz", head5, strict=False)
print("\nload_weights(strict=False) into a 5-class head:", keys)
assert np.array_equal(head5.get_weights()["conv2d_1/w"], after["conv2d_1/w"])
try:
    dl.checkpoint.load_weights("lenet5-digits.npz", dl.models.lenet5(classes=5))
except dl.checkpoint.CheckpointError as e:
    print("strict=True refuses it:", type(e).__name__, str(e)[:150])

# validation at each epoch, the three built-in callbacks
small = (train[0][:640], train[1][:640])                        # an epoch of 20 steps at batch 32
cb = [EarlyStopping(patience=2, restore_best_weights=True), ReduceLROnPlateau(factor=0.5, patience=1),
      ModelCheckpoint("best.npz", save_best_only=True)]
model = dl.models.lenet5()
trainer = dl.Trainer(model, dl.optim.Adam(3e-3), device="cpu", seed=0)
history = trainer.fit(small, epochs=12, batch_size=32, monitor=20, validation_data=val, callbacks=cb)
print("\nepochs run:", history.history["epoch"], "val_loss:", [round(v, 3) for v in history.history["val_loss"]])
print("lr per epoch:", history.history["lr"])
assert len(history.history["epoch"]) < 12, "EarlyStopping did not stop the run"
best = dl.checkpoint.load_model("best.npz")
print("best.npz val_loss:", round(best.evaluate(*val).loss, 3), "| model (restored best):",
      round(model.evaluate(*val).loss, 3), "| min val_loss:", round(min(history.history["val_loss"]), 3))
