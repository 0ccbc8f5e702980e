"""Stamps: the moment an actor sees, on both clocks, for events and decisions."""

from __future__ import annotations

import functools

from infervisor.adapters.proc.identity import boot_id
from infervisor.replay.state import Stamp

from .clock import Clock

__all__ = ["now_stamp"]


@functools.cache
def _boot_id() -> str:
    return boot_id()


def now_stamp(clock: Clock) -> Stamp:
    """Now on ``clock``: wall ns, monotonic seconds and this kernel's boot id.

    The monotonic clock (CLOCK_MONOTONIC) is shared by every process of one
    boot, so stamps taken by a node and by the node that replaced it compare.
    """
    return Stamp(wall_ns=clock.wall_ns(), mono_s=clock.monotonic(), boot_id=_boot_id())
