"""StopAtAccuracy in the captured GPU step: its evaluations between replays leave the captured step, its
buffers and the generator alone (a run scored every step ends bit-identical to one never scored, with
one capture), and a reachable target stops the captured run at the first evaluation that reaches it."""
import numpy as np
import pytest

pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl as dl
from minidl import optim
from tests.conftest import mnist_lookalike


def run(callbacks, steps=12, lr=3e-3):
    dev = dl.get_device("cuda", seed=0)
    model = dl.models.lenet5(device=dev, seed=0)
    trainer = dl.Trainer(model, optim.Adam(lr=lr), seed=0, graph=True, progress=False, log=lambda *a: None,
                         shift=2, label_smoothing=0.1)
    trainer.fit(mnist_lookalike(512), steps=steps, batch_size=64, monitor=1000, callbacks=callbacks)
    return trainer


def test_evaluations_between_replays_leave_the_captured_run_bit_identical():
    """Scored every step, the run ends where a run never scored ends: as exactly as two unscored runs agree
    (bit for bit with the deterministic engines, the default)."""
    plain, again = run([]), run([])
    stop = dl.StopAtAccuracy(1.0, mnist_lookalike(300, seed=1), every=1, batch_size=128)
    scored = run([stop])
    assert len(scored._step._captured) == 1, "the evaluations cost a capture of their own"
    assert stop.evaluations == 12 and not stop.reached
    a, a2, b = plain.model.get_weights(), again.model.get_weights(), scored.model.get_weights()
    for k in a:
        rerun = np.abs(a2[k] - a[k]).max()
        assert np.abs(b[k] - a[k]).max() <= rerun, (k, rerun)
        assert rerun == 0, f"{k}: two unscored runs differ by {rerun}: a kernel of the step is not deterministic"
    assert stop.train_s > 0 and stop.eval_s > 0 and 0 < stop.first_s <= stop.train_s


def test_a_reachable_target_stops_the_captured_run_where_it_is_reached():
    stop = dl.StopAtAccuracy(0.9, mnist_lookalike(300, seed=1), every=2, batch_size=100)
    trainer = run([stop], steps=200, lr=1e-3)
    assert stop.reached and trainer.step == stop.step < 200 and stop.step % 2 == 0
    assert all(acc < 0.9 for _, acc in stop.curve[:-1]) and stop.accuracy >= 0.9
    assert trainer.evaluate(mnist_lookalike(300, seed=1), batch_size=100).accuracy == stop.accuracy
