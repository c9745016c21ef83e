"""Running metrics kept on the device and read back only when asked."""


class Mean:
    """Accumulates (sum of losses, hits, count) on the device; `result()` reads them once."""

    def __init__(self, device):
        self.device = device
        xp = device.xp
        self.loss, self.correct, self.count = xp.zeros((), "float64"), xp.zeros((), "int64"), 0

    def reset(self):
        # In place: a captured CUDA graph keeps adding into these very buffers.
        self.loss.fill(0)
        self.correct.fill(0)
        self.count = 0

    def add(self, loss_sum, correct):
        """The device half of `update`: in place, no host sync, so a CUDA graph can record it."""
        self.loss += loss_sum
        self.correct += correct

    def update(self, loss_sum, correct, n):
        self.add(loss_sum, correct)
        self.count += n

    def result(self):
        """(mean loss, accuracy in %) over what was accumulated since the last reset."""
        if self.count == 0:
            return float("nan"), float("nan")
        loss, correct = float(self.loss), int(self.correct)
        return loss / self.count, 100.0 * correct / self.count
