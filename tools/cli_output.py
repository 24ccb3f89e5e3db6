"""Stdout of the CLIs when the reader stops early (``rewrite-debug wan2.1 --json | head``).

`emit` prints and flushes, so that a reader that has gone is noticed at the write that fails, not at the
interpreter's final flush (where Python prints ``Exception ignored ... BrokenPipeError``). Such a write raises
`StdoutClosed`, which a `main` wrapped in `quiet_when_stdout_closes` turns into exit status
`BROKEN_PIPE_STATUS` with nothing on stderr, stdout pointed at ``os.devnull`` for whatever is still buffered.
Only writes made through `emit` count: a `BrokenPipeError` from anything else (a socket, a file) propagates.
"""

from __future__ import annotations

import functools
import io
import os
import sys
from collections.abc import Callable, Sequence

#: what a shell reports for a program ended by SIGPIPE (128 + 13), as ``yes | head`` under ``set -o pipefail``
BROKEN_PIPE_STATUS = 141

Main = Callable[[Sequence[str] | None], int]


class StdoutClosed(Exception):
    """The reader of stdout closed it (a `BrokenPipeError` on a write through `emit`)."""


def emit(*parts: object, sep: str = " ", end: str = "\n") -> None:
    """``print(*parts)`` to ``sys.stdout``, flushed; raises `StdoutClosed` if the reader has gone."""
    try:
        print(*parts, sep=sep, end=end, file=sys.stdout, flush=True)
    except BrokenPipeError as error:
        raise StdoutClosed from error


def silence_stdout() -> None:
    """Send what is left of stdout, buffered or still to come, to ``os.devnull``: on the real file
    descriptor when stdout has one (so the interpreter's last flush succeeds), else by replacing
    ``sys.stdout`` (an in-memory or test stream)."""
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both OSError and ValueError
        sys.stdout = io.TextIOWrapper(io.BytesIO())  # never flushed anywhere
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, descriptor)
    finally:
        os.close(devnull)


def quiet_when_stdout_closes(main: Main) -> Main:
    """``main`` returning `BROKEN_PIPE_STATUS` quietly when its output's reader closes stdout early."""

    @functools.wraps(main)
    def wrapper(argv: Sequence[str] | None = None) -> int:
        try:
            return main(argv)
        except StdoutClosed:
            silence_stdout()
            return BROKEN_PIPE_STATUS

    return wrapper
