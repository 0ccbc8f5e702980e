"""The controller leases, one per controller: ``decide_lease(lease, seen, now) -> LeaseDecision``.

Pure, as the rest of the core: it reads the leases' tracking, one
observation and the time, and answers the tracking after, the events to
append (a renewal) and which instance actors are told which controller's
lease lapsed (:class:`~.observations.LeaseLapsed`). The supervisor actor
executes it: it appends the renewal and tells the instances; what an instance
does when told is the instance rule ``verbs.lease_lapsed``. Source:
``reference/host_supervise.rs.txt`` (``expire_lease``), made per controller
as docs/api.md says (issue 19): the instances controller X placed stop when X
has been silent for the lease, whoever else is heard.

- A controller other than this node heard renews its own lease. The renewal
  is recorded (``node.lease_renewed``, source ``controller``, naming it) at
  most once per :data:`RENEW_FRACTION` of the lease per controller, so the
  chain grows by a bounded number of rows per controller whatever the
  heartbeat rate; a renewal whose append failed is recorded again at that
  controller's next heartbeat. The decision says whether its lease had
  lapsed before (``was_lapsed``: the heartbeat's answer).
- At boot each controller's lease continues from the boot with the silence
  the chain holds already used: the time the node *ran* from that
  controller's last renewal recorded to the chain's newest event (the last
  the previous run recorded; :class:`~infervisor.replay.state.RunClock`). The
  time the node did not run (from a run's last event to the next run's
  first) is excused, as a pause is, so a restart within the lease does not
  stop a live controller's instances. What a run did after its last event
  is not in the chain, so the excuse is bounded: the silence carried is at
  least the wall time since the renewal less one lease and less this run's
  own start-up (from the process's start to the boot: imports, the chain's
  check and replay, when no controller can reach the node either; 6.6 s at
  load 10 on 2 cores). A dead controller's instances therefore stop once the
  node has run for the lease since its last renewal, or, across restarts,
  once two leases of wall time and the run's start-up have passed since it
  (at the first health tick of a run then), whichever is first; a crash loop
  cannot keep them running, since each run excuses only its own start-up. A lapse the live node
  decided is in the chain as its stops, so a controller lapsed before the
  restart is still lapsed after it (the heartbeat answers ``lapsed``; its
  instances, told again, are already stopped). Each controller's first
  heartbeat after a boot is recorded at once, so a live controller has a
  renewal in every run's chain.
- Each health tick checks every lease: a controller silent for longer than
  the lease has the instances it placed told, once until it is heard again.
  An instance registered while its controller's lease has lapsed (a boot after
  the silence began, a revived actor) is told at once. An instance whose
  controller the leases do not know yet (a boot on a chain with no renewal of
  it) starts that controller's lease at its registration.
- A pause is not a controller's silence: a health tick fired more than
  ``pause_after_s`` after it was due means the node did not run, so no
  controller could reach it; that time is excused from every lease (issue
  17). It is not recorded: a restart counts a pause of the previous run as
  silence.

Times are seconds on the monotonic clock (``Stamp.mono_s``).

============================  =============================================
observation                   rule
============================  =============================================
:class:`ControllerHeard`      renew that controller's lease; record it at most once per fraction
:class:`HealthTickFired`      excuse a pause; tell each newly lapsed controller's instances
:class:`InstanceRegistered`   tell the instance at once if its controller's lease has lapsed
:class:`RenewalFailed`        that controller's next heartbeat is recorded
============================  =============================================
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from infervisor.replay import events as ev
from infervisor.replay.callers import Role
from infervisor.replay.state import LeaseRecord, RunClock, Stamp, elapsed_s

from . import observations as o

__all__ = [
    "LEASE_RULES",
    "RENEWAL_SOURCE",
    "RENEW_FRACTION",
    "Audience",
    "ControllerHeard",
    "ControllerLease",
    "HealthTickFired",
    "InstanceRegistered",
    "Lease",
    "LeaseDecision",
    "LeaseObservation",
    "LeasePolicy",
    "RenewalFailed",
    "decide_lease",
    "lease_at_boot",
    "silence_s",
]

#: A heard controller is recorded at most once per this fraction of the lease.
RENEW_FRACTION = 0.25
#: The source of a recorded renewal on the chain.
RENEWAL_SOURCE = Role.CONTROLLER


class LeasePolicy(msgspec.Struct, frozen=True, kw_only=True):
    """The lease (seconds) and how late a health tick must fire (seconds) to be a pause."""

    lease_s: float
    pause_after_s: float


class ControllerLease(msgspec.Struct, frozen=True, kw_only=True):
    """One controller's lease.

    Attributes:
        last_contact_s: when the controller was last heard (or its lease's start).
        last_recorded_s: when its renewal was last recorded (None: none yet, or
            the last one's append failed).
        told: its instances were told it lapsed (until it is heard again).
    """

    last_contact_s: float
    last_recorded_s: float | None = None
    told: bool = False


class Lease(msgspec.Struct, frozen=True, kw_only=True):
    """The leases' tracking (not sourced: rebuilt at boot from ``NodeState.leases``).

    Attributes:
        policy: the lease and the pause threshold.
        controllers: each controller's lease, by name.
    """

    policy: LeasePolicy
    controllers: Mapping[str, ControllerLease] = msgspec.field(default_factory=dict)


# ---------------------------------------------------------------- observations
class ControllerHeard(msgspec.Struct, frozen=True):
    """A controller other than this node was heard from (a verb or a heartbeat)."""

    controller: str


class HealthTickFired(msgspec.Struct, frozen=True):
    """The supervisor's health tick fired ``late_s`` seconds after it was due."""

    late_s: float


class InstanceRegistered(msgspec.Struct, frozen=True):
    """An instance actor placed by ``placed_by`` (a controller) was registered with
    the supervisor (boot, placement, revive). The node's own are not observed."""

    placed_by: str


class RenewalFailed(msgspec.Struct, frozen=True):
    """The append of ``controller``'s last renewal failed (or the chain writer is gone)."""

    controller: str


LeaseObservation = ControllerHeard | HealthTickFired | InstanceRegistered | RenewalFailed


class Audience(enum.StrEnum):
    """Which instance actors are told of each lapse."""

    NONE = "none"
    PLACED_BY_LAPSED = "placed_by_lapsed"  # those the lapsed controller placed
    REGISTERED = "registered"  # only the one just registered


class LeaseDecision(msgspec.Struct, frozen=True, kw_only=True):
    """What one observation of the leases calls for.

    Attributes:
        lease: the tracking after it.
        events: to append (source :data:`RENEWAL_SOURCE`, no subject): a renewal.
        lapsed: one per lapsed controller: what the instances of ``audience``
            (that controller's) are told.
        audience: who is told ``lapsed``.
        excused_s: seconds excused as a pause (0: none), for the operator's log.
        was_lapsed: the heard controller's lease had lapsed before it was heard.
    """

    lease: Lease
    events: tuple[ev.Event, ...] = ()
    lapsed: tuple[o.LeaseLapsed, ...] = ()
    audience: Audience = Audience.NONE
    excused_s: float = 0.0
    was_lapsed: bool = False


def lease_at_boot(
    policy: LeasePolicy,
    now: Stamp,
    since: Mapping[str, LeaseRecord],
    run: RunClock,
    startup_s: float = 0.0,
) -> Lease:
    """The leases at boot (``now``): each controller's continues with the silence
    the chain holds already used.

    Args:
        policy: the lease.
        now: the boot.
        since: each controller's last renewal in the chain (``NodeState.leases``).
        run: how long the node ran (``NodeState.run``): the silence carried is
            the running time from the renewal to the chain's newest event, but
            at least the wall time since the renewal less one lease and less
            ``startup_s`` (what a run did after its last event is not in the
            chain: at most one lease of wall time, and this run's start-up, are
            excused per renewal), and never more than that wall time.
        startup_s: seconds this node process spent starting before ``now``
            (>= 0; 0 for a node opened in process), excused as a pause is.

    Each controller's first heartbeat after the boot is recorded at once, so a
    live controller has a renewal in each run's chain.
    """
    held = {}
    for name, record in since.items():
        wall = elapsed_s(record.at, now)
        ran = run.ran_since_s(record.at.wall_ns, record.down_ns)
        carried = min(wall, max(ran, wall - policy.lease_s - max(0.0, startup_s)))
        # Not recorded since the boot: the first heartbeat heard is recorded at once.
        held[name] = ControllerLease(last_contact_s=now.mono_s - carried)
    return Lease(policy=policy, controllers=held)


def silence_s(lease: Lease, controller: str, now_s: float) -> float | None:
    """Seconds ``controller`` has been silent at ``now_s`` when they exceed the lease,
    else None (also for a controller the leases do not know)."""
    held = lease.controllers.get(controller)
    if held is None:
        return None
    silent = now_s - held.last_contact_s
    return silent if silent > lease.policy.lease_s else None


def _with(lease: Lease, controller: str, held: ControllerLease) -> Lease:
    return msgspec.structs.replace(lease, controllers={**lease.controllers, controller: held})


# ---------------------------------------------------------------- the rules
def _heard(lease: Lease, seen: ControllerHeard, now: Stamp) -> LeaseDecision:
    """Renew its lease; record it unless one was recorded less than a fraction ago."""
    name = seen.controller
    before = lease.controllers.get(name)
    was_lapsed = before is not None and (
        before.told or silence_s(lease, name, now.mono_s) is not None
    )
    last = None if before is None else before.last_recorded_s
    if last is not None and now.mono_s - last < lease.policy.lease_s * RENEW_FRACTION:
        renewed = ControllerLease(last_contact_s=now.mono_s, last_recorded_s=last)
        return LeaseDecision(lease=_with(lease, name, renewed), was_lapsed=was_lapsed)
    recorded = ControllerLease(last_contact_s=now.mono_s, last_recorded_s=now.mono_s)
    event = ev.LeaseRenewed(controller=name, at=now)
    return LeaseDecision(lease=_with(lease, name, recorded), events=(event,), was_lapsed=was_lapsed)


def _excuse(lease: Lease, excused_s: float, now_s: float) -> Lease:
    """Every lease's contact moved on by the pause (never past now)."""
    moved = {
        name: msgspec.structs.replace(
            held, last_contact_s=min(now_s, held.last_contact_s + excused_s)
        )
        for name, held in lease.controllers.items()
    }
    return msgspec.structs.replace(lease, controllers=moved)


def _tick(lease: Lease, tick: HealthTickFired, now: Stamp) -> LeaseDecision:
    """Excuse a pause, then tell each newly lapsed controller's instances, once."""
    excused = tick.late_s if tick.late_s > lease.policy.pause_after_s else 0.0
    if excused:
        lease = _excuse(lease, excused, now.mono_s)
    lapsed: list[o.LeaseLapsed] = []
    for name in sorted(lease.controllers):
        held, silent = lease.controllers[name], silence_s(lease, name, now.mono_s)
        if held.told or silent is None:
            continue
        lease = _with(lease, name, msgspec.structs.replace(held, told=True))
        lapsed.append(o.LeaseLapsed(silent_s=silent, controller=name))
    if not lapsed:
        return LeaseDecision(lease=lease, excused_s=excused)
    return LeaseDecision(
        lease=lease,
        lapsed=tuple(lapsed),
        audience=Audience.PLACED_BY_LAPSED,
        excused_s=excused,
    )


def _registered(lease: Lease, seen: InstanceRegistered, now: Stamp) -> LeaseDecision:
    """An instance registered while its controller's lease has lapsed is told at
    once; a controller not known yet has its lease start now."""
    name = seen.placed_by
    if name not in lease.controllers:
        return LeaseDecision(lease=_with(lease, name, ControllerLease(last_contact_s=now.mono_s)))
    silent = silence_s(lease, name, now.mono_s)
    if silent is None:
        return LeaseDecision(lease=lease)
    told = (o.LeaseLapsed(silent_s=silent, controller=name),)
    return LeaseDecision(lease=lease, lapsed=told, audience=Audience.REGISTERED)


def _renewal_failed(lease: Lease, seen: RenewalFailed, now: Stamp) -> LeaseDecision:
    """The renewal was not recorded: that controller's next heartbeat is."""
    held = lease.controllers.get(seen.controller)
    if held is None:
        return LeaseDecision(lease=lease)
    unrecorded = msgspec.structs.replace(held, last_recorded_s=None)
    return LeaseDecision(lease=_with(lease, seen.controller, unrecorded))


#: Every observation of the leases and the rule that decides it.
LEASE_RULES: dict[type[Any], Callable[[Lease, Any, Stamp], LeaseDecision]] = {
    ControllerHeard: _heard,
    HealthTickFired: _tick,
    InstanceRegistered: _registered,
    RenewalFailed: _renewal_failed,
}


def decide_lease(lease: Lease, observation: LeaseObservation, now: Stamp) -> LeaseDecision:
    """What ``observation`` at ``now`` calls for (pure)."""
    return LEASE_RULES[type(observation)](lease, observation, now)
