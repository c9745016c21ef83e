"""The rule the GPU code keeps (docs/distributed.md, docs/results.md): no kernel runs outside a CUDA graph on
a stream other than the compute stream, since a process where one did replays every graph slower for the
rest of its life. Each place that makes a stream is listed here with what runs on it; a new one fails
this test until it is added with its reason."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1] / "minidl"

ALLOWED = {
    "kernels/gpu/stream.py": "the compute stream itself",
    "kernels/gpu/collectives.py": "the reduction stream: forked to only inside a capture (ReductionStream._fork), "
                                  "and the one-element all-reduce that connects the ranks",
    "kernels/gpu/_cuda.py": "the rehearsals' stream: recorded into graphs that never run (record.record_once)",
    "kernels/gpu/compile_workers.py": "a compile worker process's own stream: another process",
}


def test_only_the_listed_files_make_or_name_a_stream_other_than_the_compute_stream():
    pattern = re.compile(r"\bStream\s*\(|Stream\.null|Stream\.ptds|streamCreate")
    found = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if pattern.search(p.read_text())}
    assert found == set(ALLOWED), f"streams made outside the list: {sorted(found - set(ALLOWED))}; " \
                                  f"listed but gone: {sorted(set(ALLOWED) - found)}"

