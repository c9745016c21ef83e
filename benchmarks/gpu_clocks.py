"""The GPUs' clocks, power and throttle reasons while a benchmark runs: nvidia-smi sampled in the
background (bench_dist.py --clocks), summarised over the windows a worker timed.

Why: a step that is slower with N processes on N GPUs than alone, with nothing sent between them,
is either the processes sharing the host or the GPUs running slower (power, heat). The SM clock and
the throttle reasons during the timed steps tell which.
"""
import contextlib
import subprocess
import tempfile
import time

FIELDS = "timestamp,index,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"
PERIOD_MS = 50


class Sampler:
    """`with Sampler() as s: ...` then `s.samples`: (unix time, GPU, SM MHz, watts, deg C, reasons
    bitmask) rows, every PERIOD_MS. Where nvidia-smi is missing or refuses the fields, no rows."""

    def __init__(self, period_ms=PERIOD_MS):
        self.period_ms, self.samples, self._p, self._out = period_ms, [], None, None

    def __enter__(self):
        self._out = tempfile.TemporaryFile("w+")
        with contextlib.suppress(OSError):
            self._p = subprocess.Popen(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits",
                                        f"-lms={self.period_ms}"], stdout=self._out, stderr=subprocess.DEVNULL,
                                       text=True)
        return self

    def __exit__(self, *exc):
        if self._p is not None:
            self._p.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._p.wait(timeout=5)
        self._out.seek(0)
        self.samples = [row for line in self._out if (row := parse(line)) is not None]
        self._out.close()
        return False


def parse(line):
    """One nvidia-smi CSV line as (unix time, GPU, SM MHz, watts, deg C, reasons), or None."""
    cells = [c.strip() for c in line.split(",")]
    if len(cells) != 6:
        return None
    try:
        t = time.mktime(time.strptime(cells[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
        t += float("0." + cells[0].split(".")[1]) if "." in cells[0] else 0.0
        return t, int(cells[1]), float(cells[2]), float(cells[3]), float(cells[4]), int(cells[5], 16)
    except (ValueError, IndexError):
        return None


def summary(samples, window, gpus):
    """{sm_mhz, power_w, temp_c, reasons, samples} over `window` (unix start, end) on GPUs 0..gpus-1:
    the mean SM clock, the largest power and temperature, the throttle reasons seen (OR, hex); None
    without a sample in the window."""
    t0, t1 = window
    rows = [r for r in samples if t0 <= r[0] <= t1 and r[1] < gpus]
    if not rows:
        return None
    reasons = 0
    for r in rows:
        reasons |= r[5]
    return {"sm_mhz": sum(r[2] for r in rows) / len(rows), "power_w": max(r[3] for r in rows),
            "temp_c": max(r[4] for r in rows), "reasons": hex(reasons), "samples": len(rows)}
