"""The node state that the chain folds into: plain frozen records.

Everything here is sourced: it changes only by applying an event. What is
not sourced (process handles, HTTP clients, timers, health-miss counters)
lives in the actors and is rebuilt from this at boot.

The records replay builds once per event are ``gc=False`` msgspec Structs:
they never hold reference cycles, and untracked structs are cheaper to create
and to decode (replay's hot path, bench/chain_audit.py).
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

from .lifecycle import LifecycleState

__all__ = [
    "Cordon",
    "Desired",
    "ExitRecord",
    "InstanceFields",
    "InstanceState",
    "LeaseRecord",
    "NodeState",
    "ProcessRecord",
    "RunClock",
    "Stamp",
    "Termination",
    "Then",
    "elapsed_s",
    "freeze",
    "later",
    "thaw",
]


class Desired(enum.StrEnum):
    """What the operator or controller wants: the supervisor acts only toward it."""

    RUNNING = "running"
    STOPPED = "stopped"


class Cordon(enum.StrEnum):
    """Whether the node takes placements (``node.cordoned``, ``node.drained``,
    ``node.uncordoned``). A StrEnum: the API answers the same strings."""

    NONE = "none"  # placements taken
    CORDONED = "cordoned"  # no new placements; what runs keeps running
    DRAINED = "drained"  # cordoned, and what controllers placed is stopped


class Then(enum.StrEnum):
    """What follows a stop in flight (``instance.stop_requested``'s ``then``).

    A StrEnum: the chain stores the same strings as before."""

    NOTHING = ""  # the stop is all
    RESTART = "restart"  # an operator restart: start again once stopped
    UNLOAD = "unload"  # forget the instance once stopped
    REST = "rest"  # an eviction or idle expiry: rest (wanted on demand) once stopped


class Stamp(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A moment as the node saw it: wall time (ns since the epoch, UTC), the
    monotonic clock (seconds) and the kernel boot id it belongs to.

    Durations between two stamps of the same boot use the monotonic clock, so
    a wall-clock step neither shortens a backoff nor spends restart budget;
    across boots only wall time is comparable (see :func:`elapsed_s`).
    """

    wall_ns: int
    mono_s: float
    boot_id: str


def elapsed_s(since: Stamp, now: Stamp) -> float:
    """Seconds from ``since`` to ``now`` (never negative).

    Same boot: the monotonic clocks' difference. Another boot: the wall
    clocks' difference, the only measure the two share.
    """
    if since.boot_id and since.boot_id == now.boot_id:
        return max(0.0, now.mono_s - since.mono_s)
    return max(0.0, (now.wall_ns - since.wall_ns) / 1e9)


def later(at: Stamp, seconds: float) -> Stamp:
    """The stamp ``seconds`` after ``at`` (on both of its clocks)."""
    return Stamp(
        wall_ns=at.wall_ns + int(seconds * 1e9), mono_s=at.mono_s + seconds, boot_id=at.boot_id
    )


class Termination(msgspec.Struct, frozen=True, kw_only=True):
    """A termination in flight: SIGTERM sent at ``at``, SIGKILL due ``grace_s`` later.

    ``cause`` becomes the exit's reason; ``by`` is who asked (supervisor for a
    health kill or an exposure, else the stop's caller).
    """

    cause: str
    grace_s: float
    by: str
    at: Stamp


class LeaseRecord(msgspec.Struct, frozen=True, kw_only=True):
    """When a controller other than this node was last recorded as heard;
    ``down_ns``: the node's :attr:`RunClock.down_ns` then."""

    controller: str
    at: Stamp
    down_ns: int = 0


class RunClock(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """How long the chain's node has run, as its events tell it.

    Attributes:
        head_ns: the wall time of the newest event (``ts_ns``, ns since the
            epoch, UTC; 0: none but the genesis).
        down_ns: the time the node did not run, ns, summed over its restarts:
            from the last event a run recorded to the next run's first
            (``node.started``, or a ``node.witness_override`` before it; a
            wall clock stepped back counts 0).
        booting: the newest event is a boot's (one of those two).
    """

    head_ns: int = 0
    down_ns: int = 0
    booting: bool = False

    def ran_since_s(self, at_wall_ns: int, down_ns: int) -> float:
        """Seconds the node ran from a moment (its wall time and the ``down_ns``
        then) to the newest event, never negative."""
        return max(0.0, (self.head_ns - at_wall_ns - (self.down_ns - down_ns)) / 1e9)

    def after(self, stored_ts_ns: int, boot: bool) -> RunClock:
        """The clock once an event recorded at ``stored_ts_ns`` is folded (``boot``:
        a ``node.started`` or ``node.witness_override``; the first of a run ends
        the time the node was down, unless it is the chain's first event)."""
        down = boot and not self.booting and self.head_ns
        gap = max(0, stored_ts_ns - self.head_ns) if down else 0
        return RunClock(head_ns=stored_ts_ns, down_ns=self.down_ns + gap, booting=boot)


class ProcessRecord(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Identity of a managed server process: enough to find it again after a crash."""

    pid: int
    pgid: int
    start_time: float
    boot_id: str


class ExitRecord(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """How the last process ended. ``ts_ns``: when the exit was recorded;
    ``output_tail``: the end of what the server wrote (its stdout, then stderr)."""

    pid: int | None
    exit_code: int | None
    signal: int | None
    reason: str
    ts_ns: int
    output_tail: str = ""
    oom_killed: bool = False


class InstanceFields(msgspec.Struct, gc=False):
    """One instance as the chain says it is, as a record replay may change in place
    (`InstanceState` is the same record frozen: what every reader gets).

    Attributes:
        restarts: automatic restarts since the budget last cleared.
        restart_times_ns: when each of those restarts was decided (ns since epoch).
        since_ns: timestamp of the last lifecycle transition.
        exposed: addresses beyond loopback the server was found on; while set,
            the instance does not start until it is reloaded.
        last_seq: sequence number of the last event applied to this instance.
        launch_token: the token of the last launch decided (``instance.starting``);
            the exit-status shim names its files after it.
        restart_stamps: when each counted restart was decided.
        restart_due: when the scheduled restart falls due (set while restarting).
        up_since: when the current server process started.
        terminating: a termination in flight (SIGTERM sent, SIGKILL due).
        then: what follows the stop in flight: ``restart``, ``unload`` or ``""``.
        then_by: who asked for what follows.
        ollama_owned: True when this node asked Ollama to load the model (so
            only it may unload it), False when it was somebody else's, None
            before a load was decided.
        reserved_bytes: what the residency ledger holds for it, bytes.
        unload_error: why Ollama did not unload this node's model when a stop
            asked it to (``instance.unload_failed``); while set no unload is in
            flight. A stop (which asks again) or a start clears it.
        refusal: the cause of the last refused start, until a start succeeds
            (a refusal is recorded once per cause).
        oom_kills: exits recorded as OOM kills under the instance's memory
            limit (``instance.exited`` with ``oom_killed``), ever.
        busy: it serves a request, as last recorded (``residency.busy`` /
            ``residency.idle``, debounced: not a row per request).
        last_use_ns: when it was last used (ns since the epoch, UTC): a
            demand, the moment it turned busy, or the ``idle_since_ns`` it
            turned idle at; None: never used.
        stopped_by: who stopped it (an operator's or controller's stop, not a
            rest); cleared by a start. A request for a stopped instance is
            refused naming them.
        demanded: a start asked by a request or verb is recorded
            (``residency.demanded``) and not yet made: room is being made for
            it, and a boot resumes it (cleared by the start or its refusal).
        rested_for: why it rests, once evicted or expired (``evicted for B``,
            ``idle longer than 60 s``); "" when it was placed on demand and
            never ran, or does not rest. Cleared by a start or a stop.
        refused_ns: when a start of it was last refused for room
            (``residency.refused``, ns since the epoch); None: never, or
            started since. Identical refusals soon after it record nothing.
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
    oom_kills: int = 0
    restart_times_ns: tuple[int, ...] = ()
    last_exit: ExitRecord | None = None
    exposed: tuple[str, ...] = ()
    launch_token: str = ""
    restart_stamps: tuple[Stamp, ...] = ()
    restart_due: Stamp | None = None
    up_since: Stamp | None = None
    terminating: Termination | None = None
    then: Then = Then.NOTHING
    then_by: str = ""
    ollama_owned: bool | None = None
    reserved_bytes: int = 0
    refusal: str = ""
    unload_error: str = ""
    busy: bool = False
    last_use_ns: int | None = None
    stopped_by: str = ""
    demanded: bool = False
    rested_for: str = ""
    refused_ns: int | None = None


# mypy reads msgspec's dataclass_transform as a dataclass's, where a frozen class may not
# derive from a changeable one; msgspec allows it (the instances are frozen).
class InstanceState(InstanceFields, frozen=True, kw_only=True, gc=False):  # type: ignore[misc]
    """One instance as the chain says it is (the fields: `InstanceFields`). Frozen:
    the live node's reducer makes a new one per event (replay/reducer.py
    `apply_instance`); a replay folds into an `InstanceFields` and freezes it once."""


def thaw(inst: InstanceState) -> InstanceFields:
    """A changeable copy of `inst` (replay folds events into it in place)."""
    return InstanceFields(*msgspec.structs.astuple(inst))


def freeze(work: InstanceFields) -> InstanceState:
    """The frozen `InstanceState` of what `work` holds now."""
    return InstanceState(*msgspec.structs.astuple(work))


class NodeState(msgspec.Struct, frozen=True, kw_only=True):
    """The whole node: its instances and the chain position it reflects.

    ``lease`` is the last renewal recorded (any controller); ``leases`` the last
    one of each controller, by name (a lease is per controller, issue 19);
    ``run`` how long the node ran (the leases count only that at a boot).
    """

    node_id: str
    head_seq: int
    head_hash: str
    instances: dict[str, InstanceState] = msgspec.field(default_factory=dict)
    boots: int = 0
    lease: LeaseRecord | None = None
    leases: dict[str, LeaseRecord] = msgspec.field(default_factory=dict)
    run: RunClock = RunClock()
    #: Whether the node takes placements (the last cordon event's).
    cordon: Cordon = Cordon.NONE
    #: Each controller's last recorded placement set: its generation.
    placement_sets: dict[str, int] = msgspec.field(default_factory=dict)

    def reserved_bytes(self) -> int:
        """Memory every instance holds in the residency ledger, bytes."""
        return sum(i.reserved_bytes for i in self.instances.values())
