"""The controller lease's rules (actors/core/lease.py), pure: a table of cases.

Each case is a lease's tracking, one observation and the time, and what the
rule must answer: the renewal appended or not, who is told the lease lapsed,
the seconds excused as a pause and the tracking after.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from infervisor.actors.core import lease as rule
from infervisor.actors.core.lease import RENEW_FRACTION, Audience
from infervisor.replay import events as ev
from infervisor.replay.state import LeaseRecord, Stamp

LEASE_S = 10.0
PAUSE_S = 3.0
POLICY = rule.LeasePolicy(lease_s=LEASE_S, pause_after_s=PAUSE_S)
QUARTER = LEASE_S * RENEW_FRACTION


def at(mono_s: float) -> Stamp:
    return Stamp(wall_ns=int((1_000 + mono_s) * 1e9), mono_s=mono_s, boot_id="b1")


def lease(contact: float, recorded: float | None = None, *, told: bool = False) -> rule.Lease:
    return rule.Lease(policy=POLICY, last_contact_s=contact, last_recorded_s=recorded, told=told)


@dataclass(frozen=True)
class Case:
    name: str
    before: rule.Lease
    seen: rule.LeaseObservation
    now_s: float
    after: rule.Lease
    renewed: bool = False
    lapsed_s: float | None = None
    audience: Audience = Audience.NONE
    excused_s: float = 0.0


CASES = [
    Case("first heard is recorded", lease(0.0), rule.ControllerHeard("ctl"), 5.0,
         lease(5.0, 5.0), renewed=True),
    Case("heard within a fraction: renewed, not recorded", lease(1.0, 1.0),
         rule.ControllerHeard("ctl"), 1.0 + QUARTER - 0.1, lease(1.0 + QUARTER - 0.1, 1.0)),
    Case("heard a fraction later: recorded", lease(1.0, 1.0), rule.ControllerHeard("ctl"),
         1.0 + QUARTER, lease(1.0 + QUARTER, 1.0 + QUARTER), renewed=True),
    Case("heard after the lapse: no longer told", lease(0.0, 0.0, told=True),
         rule.ControllerHeard("ctl"), 20.0, lease(20.0, 20.0), renewed=True),
    Case("renewal failed: the next one is recorded", lease(4.0, 4.0), rule.RenewalFailed(),
         5.0, lease(4.0, None)),
    Case("tick within the lease", lease(0.0), rule.HealthTickFired(0.0), LEASE_S, lease(0.0)),
    Case("tick past the lease: every instance told", lease(0.0), rule.HealthTickFired(0.0),
         10.5, lease(0.0, told=True), lapsed_s=10.5, audience=Audience.EVERY_INSTANCE),
    Case("tick past the lease, told already", lease(0.0, told=True), rule.HealthTickFired(0.0),
         30.0, lease(0.0, told=True)),
    Case("a late tick within the pause threshold is silence", lease(0.0),
         rule.HealthTickFired(PAUSE_S), 12.0, lease(0.0, told=True), lapsed_s=12.0,
         audience=Audience.EVERY_INSTANCE),
    Case("a pause is excused", lease(0.0), rule.HealthTickFired(8.0), 12.0, lease(8.0),
         excused_s=8.0),
    Case("an excuse never runs past now", lease(10.0), rule.HealthTickFired(50.0), 11.0,
         lease(11.0), excused_s=50.0),
    Case("excused, a lease told lapsed stays told", lease(0.0, told=True),
         rule.HealthTickFired(20.0), 25.0, lease(20.0, told=True), excused_s=20.0),
    Case("registered while lapsed: told at once", lease(0.0, told=True),
         rule.InstanceRegistered(), 15.0, lease(0.0, told=True), lapsed_s=15.0,
         audience=Audience.REGISTERED),
    Case("registered within the lease: nothing", lease(0.0), rule.InstanceRegistered(), 9.0,
         lease(0.0)),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_lease_rule(case: Case) -> None:
    decision = rule.decide_lease(case.before, case.seen, at(case.now_s))
    assert decision.lease == case.after
    if case.renewed:
        assert isinstance(case.seen, rule.ControllerHeard)
        expected = ev.LeaseRenewed(controller=case.seen.controller, at=at(case.now_s))
        assert decision.events == (expected,)
    else:
        assert decision.events == ()
    silent = None if decision.lapsed is None else decision.lapsed.silent_s
    assert silent == (None if case.lapsed_s is None else pytest.approx(case.lapsed_s))
    assert decision.audience is case.audience
    assert decision.excused_s == case.excused_s


def test_every_rule_and_audience_is_in_the_table() -> None:
    assert {type(c.seen) for c in CASES} == set(rule.LEASE_RULES)
    assert {c.audience for c in CASES} == set(Audience)


def test_boot_runs_the_lease_from_the_last_renewal() -> None:
    since = LeaseRecord(controller="ctl", at=at(95.0))
    assert rule.lease_at_boot(POLICY, at(100.0), since) == lease(95.0, 95.0)
    assert rule.lease_at_boot(POLICY, at(100.0), None) == lease(100.0)
