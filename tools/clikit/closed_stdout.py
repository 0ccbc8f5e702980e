"""A command whose standard output is closed early ends quietly, with exit 141.

``infervisor status | head -1``: once ``head`` has its line it closes the pipe,
and the next write (or the flush at exit) fails with EPIPE. That is the reader's
choice, not a fault of the command: no message, no traceback, and the status
a program killed by SIGPIPE gets from the shell, 128 + 13 = 141
(:data:`~..api.exit_codes.Exit.CLOSED_STDOUT`), as ``cat``, ``grep`` or ``git``
give there. It is not 0, which says all was written, nor 1, which says the node
refused (click's own handling exited 1, and Python's exit flush printed
"Exception ignored ... BrokenPipeError" and exited 120: stop 35's trial).

Python ignores SIGPIPE, so the write raises ``BrokenPipeError``; standard
output is then pointed at /dev/null before exiting, so that the flush at the
interpreter's exit has nowhere to fail (the recipe of Python's documentation,
library/signal, "Note on SIGPIPE"). :class:`~.command.Command` and
:class:`~.command.Group` wrap their parsing (``--help``, ``--version``) and
their callbacks in :func:`quiet_on_closed_stdout`: every command, once.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from ..api.exit_codes import Exit

__all__ = ["quiet_on_closed_stdout"]


@contextmanager
def quiet_on_closed_stdout() -> Iterator[None]:
    """Run the block, then flush standard output (so a closed pipe is found here,
    not at the interpreter's exit, whatever the block raised); a
    ``BrokenPipeError`` ends the process quietly with exit 141.

    Raises:
        SystemExit: 141 (``Exit.CLOSED_STDOUT``) when the reader went away.
    """
    try:
        try:
            yield
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        _end()


def _end() -> NoReturn:
    """Point standard output at /dev/null (what is still buffered goes there) and exit 141."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, io.UnsupportedOperation):  # not a file: a test's buffer
        sys.exit(Exit.CLOSED_STDOUT)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    sys.exit(Exit.CLOSED_STDOUT)
