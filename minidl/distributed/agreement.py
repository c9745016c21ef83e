"""Ranks that agree on the run before it starts: the same flags and the same MINIDL_* values on
every rank, or one line naming the first difference and exit status 2.

Each rank of `mpiexec -n N python -m minidl.train ...` reads its own command line and environment,
and nothing made them equal: `--seed` or `-b` differing trained a silently different run, `-n` or
`-m` differing left the ranks in different collectives for ever (MPI matches collectives by their
order), `MINIDL_BUCKET_MIB` differing cut the gradients into other buckets and MPI aborted. So
every rank parses and checks its own flags, rank 0 broadcasts its run description (the flags that
shape the run and the MINIDL_* values, minus what may differ per rank or host), every rank compares
it with its own, and all end alike: rank 0 prints the first difference of the lowest rank that has
one (`error: the ranks were started on different runs: rank 1: -n is 30, rank 0 has 20`) and every
rank exits 2. A rank whose flags fail
their check does not leave the others waiting: MPI is set up before the flags are read, and the
ranks' outcomes are gathered, so they all exit with the failing rank's status, rank 0 printing its
message once.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .buckets import bucket_mib_from_env, tail_mib_from_env

# MINIDL_* values that may differ per host and change no number of the run: where the data, caches
# and compiles live, how the GPU kernels are tuned and compiled, the reduction stream's priority.
PER_HOST_ENV = frozenset({"MINIDL_DATA", "MINIDL_MIRRORS", "MINIDL_CACHE", "MINIDL_COMPILE_LOCK",
                          "MINIDL_COMPILE_WORKERS", "MINIDL_PARALLEL_COMPILE", "MINIDL_NVRTC_PCH",
                          "MINIDL_AUTOTUNE", "MINIDL_AUTOTUNE_TOPK", "MINIDL_AUTOTUNE_RTC", "MINIDL_REDUCE_PRIORITY"})
# The command lines' flags (by dest) each rank may set for itself: where its data lies and how many
# threads its host gives it, and the logs only rank 0 writes.
PER_RANK_FLAGS = ("data_dir", "threads", "metrics", "tensorboard")


class RanksDisagree(ValueError):
    """The ranks were started on different runs; every rank raises it together (World.guard)."""
    collective = True
    exit_status = 2


def describe(flags: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The run description: `flags` (a flag as the user types it -> its value) and every MINIDL_*
    environment value but PER_HOST_ENV's, by name."""
    env = os.environ if environ is None else environ
    shaping = {k: v for k, v in sorted(env.items()) if k.startswith("MINIDL_") and k not in PER_HOST_ENV}
    return {**flags, **shaping}


def first_difference(mine: Mapping[str, Any], root: Mapping[str, Any], rank: int) -> str | None:
    """`rank N: NAME is X, rank 0 has Y` for the first entry (rank 0's order) that differs, else None."""
    for name in [*root, *(k for k in mine if k not in root)]:
        a, b = mine.get(name), root.get(name)
        if a != b or type(a) is not type(b):
            return f"rank {rank}: {name} is {_shown(a)}, rank 0 has {_shown(b)}"
    return None


def _shown(v):
    return "unset" if v is None else "on" if v is True else "off" if v is False else str(v)


def agree(world: Any, description: Mapping[str, Any]) -> None:
    """Every rank's `description` equals rank 0's, or RanksDisagree on every rank naming the first
    difference of the lowest rank that has one. Collective: two small MPI calls."""
    if world.size == 1:
        return
    root = world.comm.bcast(dict(description), root=0)
    differences = world.comm.allgather(first_difference(description, root, world.rank))
    found = next((d for d in differences if d is not None), None)
    if found is not None:
        raise RanksDisagree(f"the ranks were started on different runs: {found}")


def parse_agreed(parser: argparse.ArgumentParser, argv: Sequence[str] | None,
                 check: Callable[[Any, argparse.Namespace], argparse.Namespace],
                 per_rank: Iterable[str] = PER_RANK_FLAGS) -> argparse.Namespace:
    """A command line's flags, parsed and `check`ed (check(parser, args)) on every rank, agreed
    among the ranks (`per_rank`: dests left out, each rank keeping its own), and
    $MINIDL_BUCKET_MIB checked; any failure ends every rank with one message (rank 0's, or the
    failing rank's line) and its status: 2 for flags. One process: parse and check, as before."""
    from . import init, launched_by_mpi
    world = init() if launched_by_mpi() else None
    if world is None or world.size == 1:
        args = check(parser, parser.parse_args(argv))
        _check_bucket_env()
        return args
    status, said, args = _parse_quietly(parser, argv, check)
    outcomes = world.comm.allgather((status, said))
    failed = [r for r, (s, _) in enumerate(outcomes) if s not in (None, 0)]
    helped = [r for r, (s, _) in enumerate(outcomes) if s == 0]          # -h: the help, and exit 0
    if failed or helped:
        r = failed[0] if failed else helped[0]
        text = outcomes[r][1] if r == 0 or not failed else f"error: rank {r}: {_last_line(outcomes[r][1])}\n"
        _end(world, outcomes[r][0], text)
    own = set(per_rank)
    flags = _as_typed(parser, {k: v for k, v in vars(args).items() if k not in own})
    try:
        agree(world, describe(flags))
    except RanksDisagree as e:
        _end(world, e.exit_status, f"error: {e}\n")
    problem = _bucket_problem()         # the same value on every rank now: rank 0 says it
    if problem:
        _end(world, 2, f"error: {problem}\n")
    return args


def _as_typed(parser, values):
    """{dest: value} keyed by the option that sets it as the user types it (Parser.options, else the
    dest); a flag that stores False (--no-graph) shows as given (on) or not (off)."""
    options = getattr(parser, "options", {})
    negated = {a.dest for a in parser._actions if isinstance(a, argparse._StoreFalseAction)
               and a.option_strings and a.option_strings[0] == options.get(a.dest, a.option_strings[0])}
    return {options.get(k, k): not v if k in negated and isinstance(v, bool) else v for k, v in values.items()}


def _parse_quietly(parser, argv, check):
    """(exit status or None, what the parser printed, args): SystemExit caught, its output kept."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            return None, "", check(parser, parser.parse_args(argv))
        except SystemExit as e:
            code = e.code
            if isinstance(code, str):          # sys.exit("error: ...")
                print(code, file=sys.stderr)
            return (code if isinstance(code, int) else 0 if code is None else 1), out.getvalue(), None
        except Exception as e:                 # noqa: BLE001  one rank alone must not leave the others waiting
            return 1, f"error: {e or type(e).__name__}\n", None


def _last_line(text):
    line = text.strip().splitlines()[-1] if text.strip() else "its flags were refused"
    return line.split(": error: ", 1)[-1].removeprefix("error: ")     # argparse's `prog: error: argument -n: ...`


def _end(world, status, text):
    """Every rank exits with `status`; rank 0 prints `text` (to stdout for status 0: help)."""
    if world.main and text:
        print(text, end="", file=sys.stdout if status == 0 else sys.stderr, flush=True)
    sys.exit(status)


def _bucket_problem():
    """What is wrong with $MINIDL_BUCKET_MIB or $MINIDL_BUCKET_TAIL_MIB (one line naming it), or None."""
    try:
        bucket_mib_from_env()
        tail_mib_from_env()
    except ValueError as e:
        return str(e)
    return None


def _check_bucket_env():
    """$MINIDL_BUCKET_MIB and $MINIDL_BUCKET_TAIL_MIB are checked as flags are: one line naming it, exit 2."""
    problem = _bucket_problem()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
