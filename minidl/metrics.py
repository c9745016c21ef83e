"""Running metrics kept on the device and read back only when asked, and the Score they come to."""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from ._types import Array

if TYPE_CHECKING:
    from .backend import Device


class Score(NamedTuple):
    """(loss, accuracy) of a fit interval or an evaluation; unpacks as `loss, accuracy = score`.

    accuracy is a fraction in [0, 1] (Keras's convention); `percent` is the same number x 100, the unit
    of the command line's `accuracy: 45.188%` line and of the metrics log.
    """
    loss: float
    accuracy: float

    @property
    def percent(self) -> float:
        """The accuracy in percent."""
        return 100.0 * self.accuracy


class Mean:
    """Accumulates (sum of losses, hits, count) on the device; `result()` reads them once."""

    def __init__(self, device: Device) -> None:
        self.device = device
        xp = device.xp
        self.loss, self.correct, self.count = xp.zeros((), "float64"), xp.zeros((), "int64"), 0

    def reset(self) -> None:
        # In place: a captured CUDA graph keeps adding into these very buffers.
        self.loss.fill(0)
        self.correct.fill(0)
        self.count = 0

    def add(self, loss_sum: Array, correct: Array) -> None:
        """The device half of `update`: in place, no host sync, so a CUDA graph can record it."""
        self.loss += loss_sum
        self.correct += correct

    def update(self, loss_sum: Array, correct: Array, n: int) -> None:
        self.add(loss_sum, correct)
        self.count += n

    def result(self) -> Score:
        """Score(mean loss, accuracy as a fraction) over what was accumulated since the last reset."""
        if self.count == 0:
            return Score(float("nan"), float("nan"))
        loss, correct = float(self.loss), int(self.correct)
        return Score(loss / self.count, correct / self.count)
