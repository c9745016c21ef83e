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

    def update(self, loss_sum, correct, n):
        self.loss += loss_sum          # in place on the device: no host sync
        self.correct += correct
        self.count += n

    def result(self):
        """(mean loss, accuracy in %) over what was accumulated since the last reset."""
        if self.count == 0:
            return float("nan"), float("nan")
        loss, correct = float(self.loss), int(self.correct)
        return loss / self.count, 100.0 * correct / self.count
