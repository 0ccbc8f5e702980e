"""tests/port_once.py: the ports a worker hands out are its own, beside another suite."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os

import port_once
import pytest


def test_a_block_another_suite_holds_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two suites at once on one machine have the same bands: a port of a block
    another process holds the lock of is never handed out here (fails before:
    the first port of the turn, in that block, was)."""
    band = port_once._band()
    first = band.stop // port_once.BLOCK - 6  # six whole blocks inside the band
    blocks = [b for b in range(first, first + 5) if b not in port_once._held]
    port_once.CLAIMS.mkdir(exist_ok=True)
    other = None  # the lock "another suite" holds: a description of its own
    for block in blocks:
        fd = os.open(port_once.CLAIMS / str(block), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a suite running beside this one holds it for real
            os.close(fd)
            continue
        other = (block, fd)
        break
    if other is None:
        pytest.skip("every block of the five is held by suites running beside this one")
    block, fd = other
    try:
        start = block * port_once.BLOCK
        monkeypatch.setattr(port_once, "_turns", itertools.cycle(range(start, start + 160)))
        monkeypatch.setattr(port_once, "_handed_out", set())
        taken = port_once.free_port_once()
        assert taken // port_once.BLOCK != block, taken
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
