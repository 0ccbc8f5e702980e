"""Helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

PROGRAMS = Path(__file__).parent / "programs"


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy, or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def make_launcher(directory: Path, script: Path, *extra: str) -> str:
    """An executable that execs ``python script extra... "$@"`` (the pid stays the same)."""
    path = directory / f"launch-{script.stem}"
    args = " ".join(f"'{a}'" for a in extra)
    path.write_text(f"#!/bin/sh\nexec '{sys.executable}' '{script}' {args} \"$@\"\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


def pids_of_group(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group."""
    found = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p.pid)
        except (ProcessLookupError, PermissionError):
            continue
    return found
