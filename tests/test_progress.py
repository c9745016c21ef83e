"""What a run shows while a cold first step prepares (minidl.training.progress): the bar's postfix on a
terminal, a line in a log at most every 10 s; the CPU has nothing to prepare."""
import minidl as dl
from minidl.training import progress


class _Bar:
    def __init__(self):
        self.postfix = []

    def set_postfix_str(self, s):
        self.postfix.append(s)


def test_a_bar_shows_every_line_and_a_log_gets_one_line_per_interval(monkeypatch):
    bar, lines = _Bar(), []
    say = progress.preparing(bar, lines.append)
    say("preparing: compiling 1/3 kernels, timing 0 convolutions")
    say("preparing: compiling 2/3 kernels, timing 0 convolutions")
    assert len(bar.postfix) == 2 and lines == []
    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    say = progress.preparing(None, lines.append)
    say("a")
    say("b")                       # within 10 s of the last line: not logged
    clock[0] += 10.0
    say("c")
    assert lines == ["a", "c"]


def test_the_cpu_prepares_nothing():
    stop = dl.get_device("cpu").preparing(lambda line: 1 / 0)
    stop()
