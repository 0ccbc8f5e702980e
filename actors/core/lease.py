"""The controller lease, node-wide: ``decide_lease(lease, observation, now) -> LeaseDecision``.

Pure, as the rest of the core: it reads the lease's tracking, one
observation and the time, and answers the tracking after, the events to
append (a renewal) and which instance actors are told the lease lapsed
(:class:`~.observations.LeaseLapsed`). The supervisor actor executes it: it
appends the renewal and tells the instances; what an instance does when told
is the instance rule ``verbs.lease_lapsed``. Source:
``reference/host_supervise.rs.txt`` (``expire_lease``).

- A controller other than this node heard renews the lease. The renewal is
  recorded (``node.lease_renewed``, source ``controller``) at most once per
  :data:`RENEW_FRACTION` of the lease, so the chain grows by a bounded number
  of rows whatever the heartbeat rate; a renewal whose append failed is
  recorded again at the next one heard.
- At boot the lease runs from the last renewal the chain has, not from the
  boot: a restart may shorten the lease by up to that fraction, never
  lengthen it.
- Each health tick checks it: silent for longer than the lease, every
  instance is told, once until a controller is heard again. An instance
  registered while the lease has lapsed (a boot after the silence began, a
  revived actor) is told at once.
- A pause is not a controller's silence: a health tick fired more than
  ``pause_after_s`` after it was due means the node did not run, so no
  controller could reach it; that time is excused (issue 17). It is not
  recorded: a restart counts the lease from the last renewal recorded.

Times are seconds on the monotonic clock (``Stamp.mono_s``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import msgspec

from infervisor.replay import events as ev
from infervisor.replay.callers import Role
from infervisor.replay.state import LeaseRecord, Stamp, elapsed_s

from . import observations as o

__all__ = [
    "LEASE_RULES",
    "RENEWAL_SOURCE",
    "RENEW_FRACTION",
    "Audience",
    "ControllerHeard",
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


class Lease(msgspec.Struct, frozen=True, kw_only=True):
    """The lease's tracking (not sourced: rebuilt at boot from ``NodeState.lease``).

    Attributes:
        policy: the lease and the pause threshold.
        last_contact_s: when a controller was last heard (or the lease's start).
        last_recorded_s: when a renewal was last recorded (None: none yet, or
            the last one's append failed).
        told: the instances were told it lapsed (until a controller is heard).
    """

    policy: LeasePolicy
    last_contact_s: float
    last_recorded_s: float | None = None
    told: bool = False


# ---------------------------------------------------------------- observations
class ControllerHeard(msgspec.Struct, frozen=True):
    """A controller other than this node was heard from (a verb or a heartbeat)."""

    controller: str


class HealthTickFired(msgspec.Struct, frozen=True):
    """The supervisor's health tick fired ``late_s`` seconds after it was due."""

    late_s: float


class InstanceRegistered(msgspec.Struct, frozen=True):
    """An instance actor was registered with the supervisor (boot, placement, revive)."""


class RenewalFailed(msgspec.Struct, frozen=True):
    """The append of the last renewal failed (or the chain writer is gone)."""


LeaseObservation = ControllerHeard | HealthTickFired | InstanceRegistered | RenewalFailed


class Audience(enum.StrEnum):
    """Which instance actors are told the lease lapsed."""

    NONE = "none"
    EVERY_INSTANCE = "every_instance"  # every instance registered now
    REGISTERED = "registered"  # only the one just registered


class LeaseDecision(msgspec.Struct, frozen=True, kw_only=True):
    """What one observation of the lease calls for.

    Attributes:
        lease: the tracking after it.
        events: to append (source :data:`RENEWAL_SOURCE`, no subject): a renewal.
        lapsed: what the instances of ``audience`` are told, when it lapsed.
        audience: who is told ``lapsed``.
        excused_s: seconds excused as a pause (0: none), for the operator's log.
    """

    lease: Lease
    events: tuple[ev.Event, ...] = ()
    lapsed: o.LeaseLapsed | None = None
    audience: Audience = Audience.NONE
    excused_s: float = 0.0


def lease_at_boot(policy: LeasePolicy, now: Stamp, since: LeaseRecord | None) -> Lease:
    """The lease at boot: it runs from ``since`` (the chain's last renewal), else from ``now``."""
    if since is None:
        return Lease(policy=policy, last_contact_s=now.mono_s)
    contact = now.mono_s - elapsed_s(since.at, now)
    return Lease(policy=policy, last_contact_s=contact, last_recorded_s=contact)


def silence_s(lease: Lease, now_s: float) -> float | None:
    """Seconds of silence at ``now_s`` when they exceed the lease, else None."""
    silent = now_s - lease.last_contact_s
    return silent if silent > lease.policy.lease_s else None


# ---------------------------------------------------------------- the rules
def _heard(lease: Lease, seen: ControllerHeard, now: Stamp) -> LeaseDecision:
    """Renew; record it unless one was recorded less than a fraction of the lease ago."""
    renewed = msgspec.structs.replace(lease, last_contact_s=now.mono_s, told=False)
    last = lease.last_recorded_s
    if last is not None and now.mono_s - last < lease.policy.lease_s * RENEW_FRACTION:
        return LeaseDecision(lease=renewed)
    recorded = msgspec.structs.replace(renewed, last_recorded_s=now.mono_s)
    event = ev.LeaseRenewed(controller=seen.controller, at=now)
    return LeaseDecision(lease=recorded, events=(event,))


def _tick(lease: Lease, tick: HealthTickFired, now: Stamp) -> LeaseDecision:
    """Excuse a pause, then tell every instance once when the lease has lapsed."""
    excused = tick.late_s if tick.late_s > lease.policy.pause_after_s else 0.0
    if excused:
        contact = min(now.mono_s, lease.last_contact_s + excused)
        lease = msgspec.structs.replace(lease, last_contact_s=contact)
    silent = silence_s(lease, now.mono_s)
    if lease.told or silent is None:
        return LeaseDecision(lease=lease, excused_s=excused)
    return LeaseDecision(
        lease=msgspec.structs.replace(lease, told=True),
        lapsed=o.LeaseLapsed(silent_s=silent),
        audience=Audience.EVERY_INSTANCE,
        excused_s=excused,
    )


def _registered(lease: Lease, _: InstanceRegistered, now: Stamp) -> LeaseDecision:
    """An instance registered while the lease has lapsed is told at once."""
    silent = silence_s(lease, now.mono_s)
    if silent is None:
        return LeaseDecision(lease=lease)
    return LeaseDecision(
        lease=lease, lapsed=o.LeaseLapsed(silent_s=silent), audience=Audience.REGISTERED
    )


def _renewal_failed(lease: Lease, _: RenewalFailed, now: Stamp) -> LeaseDecision:
    """The renewal was not recorded: the next controller heard is."""
    return LeaseDecision(lease=msgspec.structs.replace(lease, last_recorded_s=None))


#: Every observation of the lease and the rule that decides it.
LEASE_RULES: dict[type[Any], Callable[[Lease, Any, Stamp], LeaseDecision]] = {
    ControllerHeard: _heard,
    HealthTickFired: _tick,
    InstanceRegistered: _registered,
    RenewalFailed: _renewal_failed,
}


def decide_lease(lease: Lease, observation: LeaseObservation, now: Stamp) -> LeaseDecision:
    """What ``observation`` at ``now`` calls for (pure)."""
    return LEASE_RULES[type(observation)](lease, observation, now)
