"""The node state that the chain folds into: plain frozen records.

Everything here is sourced: it changes only by applying an event. What is
not sourced (process handles, HTTP clients, timers, health-miss counters)
lives in the actors and is rebuilt from this at boot.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

from .lifecycle import LifecycleState

__all__ = ["Desired", "ExitRecord", "InstanceState", "NodeState", "ProcessRecord"]


class Desired(enum.StrEnum):
    """What the operator or controller wants: the supervisor acts only toward it."""

    RUNNING = "running"
    STOPPED = "stopped"


class ProcessRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Identity of a managed server process: enough to find it again after a crash."""

    pid: int
    pgid: int
    start_time: float
    boot_id: str


class ExitRecord(msgspec.Struct, frozen=True, kw_only=True):
    """How the last process ended. ``ts_ns``: when the exit was recorded."""

    pid: int | None
    exit_code: int | None
    signal: int | None
    reason: str
    ts_ns: int


class InstanceState(msgspec.Struct, frozen=True, kw_only=True):
    """One instance as the chain says it is.

    Attributes:
        restarts: automatic restarts since the budget last cleared.
        restart_times_ns: when each of those restarts was decided (ns since epoch).
        since_ns: timestamp of the last lifecycle transition.
        exposed: addresses beyond loopback the server was found on; while set,
            the instance does not start until it is reloaded.
        last_seq: sequence number of the last event applied to this instance.
    """

    instance_id: str
    spec: dict[str, Any]
    placed_by: str
    generation: int
    lifecycle: LifecycleState
    desired: Desired
    since_ns: int
    last_seq: int
    reason: str = ""
    process: ProcessRecord | None = None
    restarts: int = 0
    restart_times_ns: tuple[int, ...] = ()
    last_exit: ExitRecord | None = None
    exposed: tuple[str, ...] = ()


class NodeState(msgspec.Struct, frozen=True, kw_only=True):
    """The whole node: its instances and the chain position it reflects."""

    node_id: str
    head_seq: int
    head_hash: str
    instances: dict[str, InstanceState] = msgspec.field(default_factory=dict)
    boots: int = 0
