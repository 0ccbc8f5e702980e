"""The transition audit: replay a chain through the lifecycle rules and name what they forbid.

`audit_events` folds the events with the same reducer a node uses
(:class:`~.reducer.Folder`) and, before each event, asks what the rules of
:mod:`.lifecycle` and :mod:`.policy` (and the node's decision rules that
follow from them) say about it. It keeps going past every finding, so one
run reports them all, each with its sequence number. The rules:

- ``restart after an operator stop``: an automatic start (``instance.starting``
  by the supervisor or at boot) or a ``instance.restart_scheduled`` while the
  instance is wanted stopped because an operator or controller stopped it;
- ``restart beyond the budget``: a restart or automatic start after the node
  recorded the budget as spent (``instance.failed``), or, when the restart
  policy is known (given, or a spec's ``restart.max_restarts``), a restart
  scheduled when :func:`.policy.restarts_in_window` at the restart's time
  already reached ``max_restarts``;
- ``start of an exposed instance``: any start of an instance found listening
  beyond loopback and not reloaded (placed again) since;
- ``instance never placed``: an instance event for an instance that is not
  placed (never, or no longer: after its unload);
- ``time going backwards``: an event stamped earlier than the event before it;
- ``illegal transition``: any other event the reducer refuses (a transition
  the lifecycle table does not allow, a second placement, an undecodable
  payload).

Pure: no I/O but reading the chain (`audit_chain`, which verifies it in the
same pass).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Literal

import msgspec

from infervisor.chain import GENESIS_KIND, StoredEvent, VerifyReport, scan_chain

from . import events as ev
from .callers import Role, role_of
from .events import EventDecodeError
from .policy import RestartPolicy, restarts_in_window
from .reducer import Folder, ReplayError
from .state import Desired, InstanceState, Stamp, Then

__all__ = ["AuditReport", "Finding", "Rule", "TransitionAudit", "audit_chain", "audit_events"]

Rule = Literal[
    "restart after an operator stop",
    "restart beyond the budget",
    "start of an exposed instance",
    "instance never placed",
    "time going backwards",
    "illegal transition",
]

_AUTOMATIC = frozenset({Role.SUPERVISOR, Role.BOOT})
"""Roles whose starts are automatic (not an explicit verb)."""
_EXPLICIT = frozenset({Role.OPERATOR, Role.CONTROLLER})
"""Roles whose stops hold an instance until an explicit start."""


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    """One forbidden transition.

    Attributes:
        seq: the event's sequence number.
        ts_ns: its timestamp, ns since the Unix epoch, UTC.
        instance: its subject ("" for node-level events).
        kind: its kind.
        rule: which rule forbids it (see the module docstring).
        detail: what was found, naming the earlier event that makes it forbidden.
    """

    seq: int
    ts_ns: int
    instance: str
    kind: str
    rule: Rule
    detail: str


class AuditReport(msgspec.Struct, frozen=True, kw_only=True):
    """What `audit_chain` found.

    Attributes:
        ok: no finding, and the chain verifies.
        events: how many events were audited.
        findings: every forbidden transition, in seq order.
        verify: the verification of the chain, read in the same snapshot.
    """

    ok: bool
    events: int
    findings: list[Finding]
    verify: VerifyReport


class _Hold(msgspec.Struct, kw_only=True):
    """Why an instance is wanted stopped, and since which seq."""

    why: Literal["stop", "failed", "exposed"]
    seq: int
    by: str = ""


class _Auditor:
    """Folds events and checks each against the rules before it is applied."""

    def __init__(self, policy: RestartPolicy | None) -> None:
        self.folder = Folder("")
        self._base = policy
        self.findings: list[Finding] = []
        self.count = 0
        self._last: StoredEvent | None = None
        self._holds: dict[str, _Hold] = {}
        self._exposed: dict[str, int] = {}
        self._policies: dict[str, RestartPolicy | None] = {}

    def feed(self, stored: StoredEvent) -> None:
        self.count += 1
        last = self._last
        if last is not None and stored.ts_ns < last.ts_ns:
            self._find(
                stored,
                "time going backwards",
                f"stamped {stored.ts_ns} ns, before seq {last.seq} ({last.ts_ns} ns): "
                f"{(last.ts_ns - stored.ts_ns) / 1e9:.3f} s earlier",
            )
        self._last = stored
        event: ev.Event | None = None
        if stored.kind != GENESIS_KIND:
            try:
                event = ev.decode_event(stored)
            except EventDecodeError:
                event = None  # the fold below reports it
        if event is not None and type(event) in _INSTANCE:
            self._check(stored, event, self.folder.instance(stored.subject))
        try:
            self.folder.feed(stored)
        except ReplayError as e:
            self._refused(stored, str(e))
        except EventDecodeError as e:
            self._find(stored, "illegal transition", f"cannot be decoded: {e}")
        if event is not None:
            self._remember(stored, event)

    def _refused(self, stored: StoredEvent, why: str) -> None:
        unknown = "for unknown instance" in why
        if unknown and any(f.seq == stored.seq for f in self.findings):
            return  # already reported as never placed
        self._find(stored, "instance never placed" if unknown else "illegal transition", why)

    def _check(self, stored: StoredEvent, event: Any, inst: InstanceState | None) -> None:
        subject = stored.subject
        if inst is None:
            if type(event) is not ev.Placed:
                self._find(
                    stored,
                    "instance never placed",
                    f"{stored.kind} for {subject!r}, which is not placed"
                    + (" (it was unloaded)" if subject in self._policies else ""),
                )
            return
        starting = type(event) is ev.Starting
        automatic = type(event) is ev.RestartScheduled or (
            starting and role_of(event.by) in _AUTOMATIC
        )
        if starting and subject in self._exposed:
            self._find(
                stored,
                "start of an exposed instance",
                f"start by {event.by} after seq {self._exposed[subject]} found it listening "
                "beyond loopback; it must be reloaded first",
            )
        hold = self._holds.get(subject)
        if automatic and inst.desired is Desired.STOPPED and hold is not None:
            if hold.why == "stop":
                self._find(
                    stored,
                    "restart after an operator stop",
                    f"{_what(event)} although {hold.by} stopped it at seq {hold.seq}",
                )
            elif hold.why == "failed":
                self._find(
                    stored,
                    "restart beyond the budget",
                    f"{_what(event)} although its restart budget was spent at seq {hold.seq}",
                )
        policy = self._policies.get(subject)
        if type(event) is ev.RestartScheduled and policy is not None:
            now = event.at or Stamp(wall_ns=stored.ts_ns, mono_s=0.0, boot_id="")
            used = restarts_in_window(inst, policy, now)
            if used >= policy.max_restarts:
                self._find(
                    stored,
                    "restart beyond the budget",
                    f"restart {event.attempt} scheduled with {used} restarts already counted; "
                    f"the policy allows {policy.max_restarts}",
                )

    def _remember(self, stored: StoredEvent, event: Any) -> None:
        subject, kind = stored.subject, type(event)
        if kind is ev.Placed:
            self._policies[subject] = _policy(self._base, event.spec)
            self._exposed.pop(subject, None)
            self._holds.pop(subject, None)
        elif kind is ev.Unloaded:
            self._exposed.pop(subject, None)
            self._holds.pop(subject, None)
        elif kind is ev.Exposed:
            self._exposed[subject] = stored.seq
            self._holds[subject] = _Hold(why="exposed", seq=stored.seq)
        elif kind is ev.StopRequested:
            if role_of(event.by) in _EXPLICIT and event.then != Then.RESTART:
                self._holds[subject] = _Hold(why="stop", seq=stored.seq, by=event.by)
        elif kind is ev.Failed:
            self._holds[subject] = _Hold(why="failed", seq=stored.seq)
        elif kind is ev.Starting and role_of(event.by) not in _AUTOMATIC:
            self._holds.pop(subject, None)

    def _find(self, stored: StoredEvent, rule: Rule, detail: str) -> None:
        self.findings.append(
            Finding(
                seq=stored.seq,
                ts_ns=stored.ts_ns,
                instance=stored.subject,
                kind=stored.kind,
                rule=rule,
                detail=detail,
            )
        )


class TransitionAudit(_Auditor):
    """`audit_events` one event at a time, keeping the replayed state between calls.

    ``TransitionAudit(policy)`` (policy as for `audit_events`); ``feed(stored)``
    each event of a chain in seq order from genesis; ``findings`` is every
    forbidden transition found so far (seq order), ``count`` how many events
    were fed. A reader that holds one can audit a growing chain by feeding
    only its new events (``infervisor witness run --audit`` does).
    """


_INSTANCE: frozenset[type[Any]] = frozenset(
    t for t in ev.EVENT_TYPES.values() if t not in (ev.NodeStarted, ev.NodeStopped)
) - {ev.AdmissionRefused, ev.LeaseRenewed, ev.KeyRotated, ev.NodeStraysEnded, ev.WitnessOverride}
_INSTANCE -= {ev.NodeCordoned, ev.NodeDrained, ev.NodeUncordoned, ev.PlacementSet}


def _what(event: Any) -> str:
    if type(event) is ev.RestartScheduled:
        return f"restart {event.attempt} scheduled"
    return f"start by {event.by}"


def _policy(base: RestartPolicy | None, spec: dict[str, Any]) -> RestartPolicy | None:
    """The instance's restart policy: `base` with its spec's `restart` overrides.

    None when the chain cannot tell: the node's own policy is configuration,
    not an event, so without `base` only a spec naming `max_restarts` gives one.
    """
    overrides = spec.get("restart")
    if not isinstance(overrides, dict):
        return base
    if base is None and "max_restarts" not in overrides:
        return None
    merged = {**msgspec.to_builtins(base or RestartPolicy()), **overrides}
    try:
        return msgspec.convert(merged, RestartPolicy)
    except msgspec.ValidationError:
        return base


def audit_events(
    stored_events: Iterable[StoredEvent], policy: RestartPolicy | None = None
) -> list[Finding]:
    """Every forbidden transition in `stored_events` (a chain from its genesis), by seq.

    Args:
        stored_events: the chain's events in seq order, from genesis.
        policy: the node's restart policy (configuration, not in the chain).
            None: the budget is checked only where the chain shows it: a
            restart after the node recorded it as spent (`instance.failed`),
            and against a spec's own `restart.max_restarts`.
    """
    auditor = _Auditor(policy)
    for stored in stored_events:
        auditor.feed(stored)
    return auditor.findings


def audit_chain(path: str | os.PathLike[str], policy: RestartPolicy | None = None) -> AuditReport:
    """Verify and audit the chain at `path` in one pass over one snapshot.

    `policy` as for `audit_events`.

    Rows after a verification problem are audited as stored (the report's
    `verify` names the problem, and `ok` is False).

    Raises:
        ChainFormatError, ChainIOError: the file is not a readable chain.
    """
    auditor = _Auditor(policy)
    report = scan_chain(path, auditor.feed, keep_going=True)
    return AuditReport(
        ok=report.ok and not auditor.findings,
        events=auditor.count,
        findings=auditor.findings,
        verify=report,
    )
