"""A small seeded training run that saves or resumes, for the tests that a resumed run with on-device
randomness (shifts, flips) is the straight run."""
import numpy as np


def run(steps, resume_from=None, save_to=None, **trainer_kw):
    """Train a 10x10 softmax regression `steps` steps (b16, Adam) on seeded random images; the Trainer
    takes `trainer_kw` (shift=, flip=, label_smoothing=); resume first / save after where given."""
    import minidl as dl
    from minidl import layers as L
    x = L.Input((1, 10, 10))
    model = dl.Model(x, L.Softmax()(L.Dense(10)(L.Flatten()(x))), seed=0)
    trainer = dl.Trainer(model, dl.optim.Adam(1e-2), progress=False, log=lambda s: None, **trainer_kw)
    if resume_from:
        trainer.resume(resume_from)
    rng = np.random.default_rng(0)
    trainer.fit((rng.integers(0, 256, (128, 10, 10), dtype=np.uint8), rng.integers(0, 10, 128)),
                more_steps=steps, batch_size=16, monitor=100)
    if save_to:
        trainer.save(save_to)
    return trainer
