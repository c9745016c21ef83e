"""The device's counter-based generator (Philox4x32-10): its key and its counter on the device."""
import numpy as np


class CounterRNG:
    """The device's generator for dropout: counter-based (Philox4x32-10, kernels.*.dropout), so a draw
    depends on `key` and a counter alone. `offset` (a 0-d uint64 on the device) is where the next
    draw starts; kernels advance it there, so a captured CUDA graph draws anew at every replay, and
    the whole state is two numbers, saved in checkpoints on either device.

    `subsequence` picks one of the seed's independent streams (cuRAND's word) by changing the key:
    data-parallel rank r draws subsequence r, so ranks draw different masks for their different
    images; subsequence 0 is the seed's own key. The state saved is the seed's key and the offset,
    the same on every rank (each draws as many numbers per step), so each rank resumes its own stream.
    """

    def __init__(self, xp, seed, subsequence=0):
        seed = int(seed)
        self.seed_key = (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)
        self.subsequence = int(subsequence)
        self.offset = xp.zeros((), np.uint64)

    @property
    def key(self):
        """The Philox key of the draws: the seed's, its high word moved by subsequence x 0x9E3779B9
        (an odd constant, so the subsequences of one seed below 2^32 all have distinct keys)."""
        k0, k1 = self.seed_key
        return k0, (k1 + self.subsequence * 0x9E3779B9) & 0xFFFFFFFF

    def state(self):
        return {"key": list(self.seed_key), "offset": int(self.offset)}

    def set_state(self, state):
        """Continue the draws `state()` describes (its seed's key and its offset) in this subsequence."""
        key = state.get("key") if isinstance(state, dict) else None
        ok = (isinstance(key, list) and len(key) == 2 and all(type(k) is int and 0 <= k <= 0xFFFFFFFF for k in key)
              and type(state.get("offset")) is int and 0 <= state["offset"] < 2 ** 63)
        if not ok:
            raise ValueError(f"generator state must be {{'key': [two 32-bit ints], 'offset': int}}, got {state!r}"[:200])
        self.seed_key = tuple(key)
        self.offset.fill(state["offset"])
