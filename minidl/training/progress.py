"""What a training run shows while it runs: tqdm's bar on a terminal, and what a cold first step
prepares (kernels compiling, convolutions timed), so a minute of preparation does not look like a hang."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tqdm import tqdm


def bar(total: int, enabled: bool) -> tqdm | None:
    """A progress bar over `total` steps, or None (not a terminal, or a rank other than 0)."""
    if not enabled:
        return None
    from tqdm import tqdm
    total_or_none = total if total < 1 << 62 else None    # a generator's epoch: its end tells (data/host_loader.py)
    return tqdm(total=total_or_none, unit="step", leave=False, dynamic_ncols=True)


def preparing(bar: tqdm | None, log: Callable[[str], object], every_s: float = 10.0) -> Callable[[str], None]:
    """say(line) for Device.preparing: the bar's postfix on a terminal; without a bar, a line in the
    log at most every `every_s` seconds."""
    said = [-every_s]

    def say(line: str) -> None:
        if bar is not None:
            bar.set_postfix_str(line)
        elif time.monotonic() - said[0] >= every_s:
            said[0] = time.monotonic()
            log(line)
    return say
