"""Progress on a terminal while a verb blocks: one line on stderr, rewritten in place."""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from ..api.exit_codes import cut

__all__ = ["Progress", "countdown", "elapsed", "ticking"]


class Progress:
    """One line on stderr rewritten in place, only when stderr is a terminal."""

    def __init__(self) -> None:
        self.on = sys.stderr.isatty()
        self._width = 0

    def show(self, line: str) -> None:
        if self.on:
            line = cut(line)[:120]
            click.echo("\r" + line.ljust(self._width), nl=False, err=True)
            self._width = len(line)

    def clear(self) -> None:
        if self.on and self._width:
            click.echo("\r" + " " * self._width + "\r", nl=False, err=True)
            self._width = 0


@contextmanager
def ticking(show: Callable[[float], str], progress: Progress) -> Iterator[None]:
    """While a verb blocks: ``show(seconds waited)`` once a second, on a terminal only."""
    done = threading.Event()

    def tick() -> None:
        began = time.monotonic()
        while True:
            progress.show(show(time.monotonic() - began))
            if done.wait(1.0):
                return

    thread = threading.Thread(target=tick, daemon=True) if progress.on else None
    if thread is not None:
        thread.start()
    try:
        yield
    finally:
        done.set()
        if thread is not None:
            thread.join()
        progress.clear()


def countdown(iid: str, grace_s: float | None, progress: Progress) -> Any:
    """While a stop blocks: the grace counting down to SIGKILL (elapsed seconds when
    the grace is the node's default)."""

    def show(waited: float) -> str:
        if grace_s is None:
            return f"stopping {iid}: {waited:.0f} s (SIGKILL after the node's grace)"
        if waited < grace_s:
            return f"stopping {iid}: SIGKILL in {math.ceil(grace_s - waited)} s"
        return f"stopping {iid}: SIGKILL sent, waiting for it to exit"

    return ticking(show, progress)


def elapsed(what: str, progress: Progress) -> Any:
    return ticking(lambda waited: f"{what} {waited:.0f} s", progress)
