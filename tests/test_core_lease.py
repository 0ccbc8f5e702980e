"""The controller leases' rules (actors/core/lease.py), pure: a table of cases.

Each case is the leases' tracking (one per controller), one observation and
the time on a manual clock, and what the rule must answer: the renewal
appended or not, which controllers' instances are told their lease lapsed
(and who: those the lapsed controller placed, or the one registered), the
seconds excused as a pause, whether the heard controller's lease had lapsed
before, and the tracking after.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import settings, stateful
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine

from infervisor.actors.core import lease as rule
from infervisor.actors.core.lease import RENEW_FRACTION, Audience
from infervisor.chain import StoredEvent
from infervisor.replay import events as ev
from infervisor.replay.lapses import held_by_lapse
from infervisor.replay.state import LeaseRecord, RunClock, Stamp

LEASE_S = 10.0
PAUSE_S = 3.0
POLICY = rule.LeasePolicy(lease_s=LEASE_S, pause_after_s=PAUSE_S)
QUARTER = LEASE_S * RENEW_FRACTION


def at(mono_s: float) -> Stamp:
    return Stamp(wall_ns=int((1_000 + mono_s) * 1e9), mono_s=mono_s, boot_id="b1")


def held(
    contact: float, recorded: float | None = None, *, told: bool = False
) -> rule.ControllerLease:
    return rule.ControllerLease(last_contact_s=contact, last_recorded_s=recorded, told=told)


def lease(**controllers: rule.ControllerLease) -> rule.Lease:
    """The leases, by controller name (``ctl1=held(...)``)."""
    return rule.Lease(policy=POLICY, controllers=controllers)


def one(contact: float, recorded: float | None = None, *, told: bool = False) -> rule.Lease:
    """Only ``ctl1``'s lease."""
    return lease(ctl1=held(contact, recorded, told=told))


@dataclass(frozen=True)
class Case:
    name: str
    before: rule.Lease
    seen: rule.LeaseObservation
    now_s: float
    after: rule.Lease
    renewed: bool = False
    lapsed: tuple[tuple[str, float], ...] = ()  # (controller, silent_s) told
    audience: Audience = Audience.NONE
    excused_s: float = 0.0
    was_lapsed: bool = False


HEARD1 = rule.ControllerHeard("ctl1")
TICK = rule.HealthTickFired(0.0)

CASES = [
    Case("first heard is recorded", lease(), HEARD1, 5.0, one(5.0, 5.0), renewed=True),
    Case("heard within a fraction: renewed, not recorded", one(1.0, 1.0), HEARD1,
         1.0 + QUARTER - 0.1, one(1.0 + QUARTER - 0.1, 1.0)),
    Case("heard a fraction later: recorded", one(1.0, 1.0), HEARD1, 1.0 + QUARTER,
         one(1.0 + QUARTER, 1.0 + QUARTER), renewed=True),
    Case("heard after the lapse: no longer told, says it had lapsed",
         one(0.0, 0.0, told=True), HEARD1, 20.0, one(20.0, 20.0), renewed=True,
         was_lapsed=True),
    Case("heard past the lease before a tick told it: it had lapsed", one(0.0, 0.0), HEARD1,
         10.5, one(10.5, 10.5), renewed=True, was_lapsed=True),
    Case("heard within the lease: it had not lapsed", one(0.0, 0.0), HEARD1, 9.0,
         one(9.0, 9.0), renewed=True),
    Case("another controller heard renews only its own lease", one(0.0, 0.0),
         rule.ControllerHeard("ctl2"), 20.0, lease(ctl1=held(0.0, 0.0), ctl2=held(20.0, 20.0)),
         renewed=True),
    Case("renewal failed: that controller's next one is recorded",
         lease(ctl1=held(4.0, 4.0), ctl2=held(4.0, 4.0)), rule.RenewalFailed("ctl1"), 5.0,
         lease(ctl1=held(4.0, None), ctl2=held(4.0, 4.0))),
    Case("renewal failed for a controller not held: nothing", one(4.0, 4.0),
         rule.RenewalFailed("ctl9"), 5.0, one(4.0, 4.0)),
    Case("tick within the lease", one(0.0), TICK, LEASE_S, one(0.0)),
    Case("tick past the lease: the lapsed controller's instances told", one(0.0), TICK,
         10.5, one(0.0, told=True), lapsed=(("ctl1", 10.5),),
         audience=Audience.PLACED_BY_LAPSED),
    Case("one silent, one heard: only the silent one lapses",
         lease(ctl1=held(0.0), ctl2=held(8.0)), TICK, 10.5,
         lease(ctl1=held(0.0, told=True), ctl2=held(8.0)), lapsed=(("ctl1", 10.5),),
         audience=Audience.PLACED_BY_LAPSED),
    Case("two silent: both told, in name order", lease(ctl2=held(0.0), ctl1=held(0.5)), TICK,
         11.0, lease(ctl1=held(0.5, told=True), ctl2=held(0.0, told=True)),
         lapsed=(("ctl1", 10.5), ("ctl2", 11.0)), audience=Audience.PLACED_BY_LAPSED),
    Case("tick past the lease, told already", one(0.0, told=True), TICK, 30.0,
         one(0.0, told=True)),
    Case("a late tick within the pause threshold is silence", one(0.0),
         rule.HealthTickFired(PAUSE_S), 12.0, one(0.0, told=True), lapsed=(("ctl1", 12.0),),
         audience=Audience.PLACED_BY_LAPSED),
    Case("a pause is excused from every lease", lease(ctl1=held(0.0), ctl2=held(2.0)),
         rule.HealthTickFired(8.0), 12.0, lease(ctl1=held(8.0), ctl2=held(10.0)),
         excused_s=8.0),
    Case("an excuse never runs past now", one(10.0), rule.HealthTickFired(50.0), 11.0,
         one(11.0), excused_s=50.0),
    Case("excused, a lease told lapsed stays told", one(0.0, told=True),
         rule.HealthTickFired(20.0), 25.0, one(20.0, told=True), excused_s=20.0),
    Case("registered while its controller's lease lapsed: told at once", one(0.0, told=True),
         rule.InstanceRegistered("ctl1"), 15.0, one(0.0, told=True), lapsed=(("ctl1", 15.0),),
         audience=Audience.REGISTERED),
    Case("registered under a live lease while another lapsed: nothing",
         lease(ctl1=held(0.0, told=True), ctl2=held(10.0)), rule.InstanceRegistered("ctl2"),
         15.0, lease(ctl1=held(0.0, told=True), ctl2=held(10.0))),
    Case("registered within the lease: nothing", one(0.0), rule.InstanceRegistered("ctl1"),
         9.0, one(0.0)),
    Case("registered under a controller not held: its lease starts now", lease(),
         rule.InstanceRegistered("ctl1"), 7.0, one(7.0)),
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
    told = [(lapse.controller, lapse.silent_s) for lapse in decision.lapsed]
    assert told == [(name, pytest.approx(silent)) for name, silent in case.lapsed]
    assert decision.audience is case.audience
    assert decision.excused_s == case.excused_s
    assert decision.was_lapsed is case.was_lapsed


def test_every_rule_and_audience_is_in_the_table() -> None:
    assert {type(c.seen) for c in CASES} == set(rule.LEASE_RULES)
    assert {c.audience for c in CASES} == set(Audience)
    assert {c.was_lapsed for c in CASES} == {True, False}


def run_clock(head_s: float, down_s: float = 0.0) -> RunClock:
    """The chain's newest event at ``head_s`` (on :func:`at`'s clock), ``down_s`` not run."""
    return RunClock(head_ns=at(head_s).wall_ns, down_ns=int(down_s * 1e9))


def test_boot_carries_the_silence_the_previous_run_ran() -> None:
    since = {
        "ctl1": LeaseRecord(controller="ctl1", at=at(95.0)),
        "ctl2": LeaseRecord(controller="ctl2", at=at(80.0)),
    }
    # The last run recorded its last event at 100: no downtime, as a lease run on.
    ran_on = rule.lease_at_boot(POLICY, at(100.0), since, run_clock(100.0))
    assert ran_on == lease(ctl1=held(95.0), ctl2=held(80.0))  # the next heartbeat is recorded
    assert rule.lease_at_boot(POLICY, at(100.0), {}, run_clock(100.0)) == lease()
    lapsed = rule.decide_lease(ran_on, TICK, at(100.0))
    assert [lapse.controller for lapse in lapsed.lapsed] == ["ctl2"]  # ran 20 s silent: only it
    # Killed at 97 (its last event 96), booted at 103: the 7 s down are no silence.
    booted = rule.lease_at_boot(POLICY, at(103.0), since, run_clock(96.0))
    assert booted == lease(ctl1=held(102.0), ctl2=held(87.0))
    early = rule.decide_lease(booted, TICK, at(111.9)).lapsed  # ctl1: 1 + 8.9 s
    assert [t.controller for t in early] == ["ctl2"]  # 16 s carried: lapsed from the boot
    told = rule.decide_lease(booted, TICK, at(112.5)).lapsed
    assert [(t.controller, t.silent_s) for t in told] == [
        ("ctl1", pytest.approx(10.5)),
        ("ctl2", pytest.approx(25.5)),
    ]


def test_boot_excuses_every_earlier_restart_after_the_renewal() -> None:
    """A crash loop: the node ran 8 s after ctl1's renewal at 10 but was down 3 s of
    them (12 -> 15), its last event at 18: booted at 22 it carries the 5 s it ran."""
    since = {"ctl1": LeaseRecord(controller="ctl1", at=at(10.0))}
    run = run_clock(18.0, down_s=3.0)
    assert rule.lease_at_boot(POLICY, at(22.0), since, run) == one(17.0)
    # A renewal recorded after the newest event (a clock stepped back) carries none.
    assert rule.lease_at_boot(POLICY, at(15.0), since, run_clock(5.0)) == one(15.0)


def test_boot_excuses_at_most_one_lease_of_wall_time() -> None:
    """What a run did after its last event is not in the chain: a silent controller's
    lease is not stretched by restarts beyond twice the lease of wall time."""
    since = {"ctl1": LeaseRecord(controller="ctl1", at=at(10.0))}
    run = run_clock(18.0, down_s=3.0)  # 5 s of running recorded, as above
    booted = rule.lease_at_boot(POLICY, at(100.0), since, run)
    assert booted == one(20.0)  # 90 s since the renewal, one lease excused: 80 s carried
    told = rule.decide_lease(booted, TICK, at(100.0)).lapsed
    assert [(t.controller, t.silent_s) for t in told] == [("ctl1", pytest.approx(80.0))]


def test_boot_excuses_the_runs_own_start_up_besides_one_lease() -> None:
    """The new process's start-up (imports, the chain's check and replay: 6.6 s at
    load 10) is no controller's silence either: a node down near the lease that is
    slow to start does not stop a live controller's instances at its boot."""
    since = {"ctl1": LeaseRecord(controller="ctl1", at=at(10.0))}
    run = run_clock(12.0)  # the renewal at 10, the run's last event at 12
    slow = rule.lease_at_boot(POLICY, at(10.0 + LEASE_S + 6.0), since, run, startup_s=6.0)
    assert slow == one(10.0 + LEASE_S + 6.0 - 2.0)  # only the 2 s it ran are carried
    bounded = rule.lease_at_boot(POLICY, at(10.0 + LEASE_S + 6.0), since, run)
    assert bounded == one(10.0 + LEASE_S)  # without it: the wall time less one lease


def test_the_chain_excuses_each_time_the_node_was_down_once() -> None:
    """The fold's clock (replay/state.py RunClock): the first event of a run (a
    witness override, then ``node.started``) ends the downtime; the chain's first
    boot ends none."""
    run = RunClock()
    s = 10**9
    for ts_s, boot in [(5, True), (10, False), (30, True), (31, True), (40, False)]:
        run = run.after(ts_s * s, boot)
    assert run == RunClock(head_ns=40 * s, down_ns=20 * s, booting=False)
    assert run.ran_since_s(8 * s, 0) == pytest.approx(12.0)  # 8 -> 10 and 30 -> 40
    assert run.ran_since_s(35 * s, 20 * s) == pytest.approx(5.0)


def test_a_controller_lapsed_before_the_restart_is_still_lapsed() -> None:
    since = {"ctl1": LeaseRecord(controller="ctl1", at=at(0.0))}
    booted = rule.lease_at_boot(POLICY, at(30.0), since, run_clock(12.0))  # its stops at 12
    heard = rule.decide_lease(booted, HEARD1, at(30.0))
    assert heard.was_lapsed
    registered = rule.decide_lease(booted, rule.InstanceRegistered("ctl1"), at(30.0))
    assert registered.audience is Audience.REGISTERED


# ---------------------------------------------------------------- what a lapse stopped
def row(seq: int, kind: str, source: str) -> StoredEvent:
    """A stored row with only what ``held_by_lapse`` reads filled in."""
    return StoredEvent(
        seq=seq, ts_ns=0, node="n1", source=source, kind=f"instance.{kind}", subject="a",
        payload=b"{}", payload_hash=b"", prev_hash=b"", hash=b"",
    )  # fmt: skip


HELD = [
    ("stopped by its lapse", [("placed", "controller:ctl1 (token t)"),
                              ("starting", "controller:ctl1 (token t)"),
                              ("stop_requested", "lease:ctl1")], True),
    ("a shutdown after the lapse changes nothing", [("stop_requested", "lease:ctl1"),
                                                    ("stop_requested", "shutdown")], True),
    ("started again since", [("stop_requested", "lease:ctl1"),
                             ("starting", "controller:ctl1 (token t)")], False),
    ("stopped by an operator since", [("stop_requested", "lease:ctl1"),
                                      ("stop_requested", "operator:uid=0(root)")], False),
    ("placed again since (unloaded, reloaded)", [("stop_requested", "lease:ctl1"),
                                                 ("placed", "controller:ctl1 (token t)")], False),
    ("another controller's lapse", [("stop_requested", "lease:ctl2")], False),
    ("an older chain's lease stop names no controller", [("stop_requested", "lease")], False),
    ("never stopped", [("placed", "controller:ctl1 (token t)")], False),
]  # fmt: skip


@pytest.mark.parametrize(("name", "rows", "held"), HELD, ids=[h[0] for h in HELD])
def test_what_a_lapse_stopped_is_read_from_the_chain(
    name: str, rows: list[tuple[str, str]], held: bool
) -> None:
    events = [row(seq, kind, source) for seq, (kind, source) in enumerate(rows, 1)]
    assert held_by_lapse(events, "ctl1") is held


# ---------------------------------------------------------------- random runs
#: (observation, audience, was_lapsed) the random runs reached, for the coverage check.
VISITED: set[tuple[str, Audience, bool]] = set()
NAMES = ("ctl1", "ctl2")


class Leases(RuleBasedStateMachine):
    """The rules fed random observations on a manual clock, against a model: each
    controller's contact moves when it is heard and by a pause; it is told lapsed
    once past the lease, and never sooner; renewals are spaced by a fraction.

    The node also restarts: its chain holds each controller's last renewal, the
    newest event (renewals, the stops a lapse makes, other events, each
    ``node.started``) and the times it was down; a boot continues each lease
    with the time the node ran since that renewal already used."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.lease = rule.lease_at_boot(POLICY, at(0.0), {}, RunClock())
        self.contact: dict[str, float] = {}
        self.told: set[str] = set()
        self.recorded: dict[str, float | None] = {}
        self.head = 0.0  # the chain's newest event
        self.downs: list[tuple[float, float]] = []  # (last event, next node.started)
        self.renewals: dict[str, list[float]] = {}  # each controller's in the chain

    def _decide(self, seen: rule.LeaseObservation) -> rule.LeaseDecision:
        decision = rule.decide_lease(self.lease, seen, at(self.now))
        self.lease = decision.lease
        VISITED.add((type(seen).__name__, decision.audience, decision.was_lapsed))
        if decision.events or decision.lapsed:  # a renewal, or the stops of a lapse
            self.head = self.now
        for event in decision.events:
            assert isinstance(event, ev.LeaseRenewed)
            self.renewals.setdefault(event.controller, []).append(self.now)
        return decision

    def _down_s(self, since: float) -> float:
        return sum(up - down for down, up in self.downs if down >= since)

    @stateful.rule()
    def an_event_is_recorded(self) -> None:
        self.head = self.now

    @stateful.rule(down=st.sampled_from([1.0, 4.0, 30.0]), startup=st.sampled_from([0.0, 3.0]))
    def restart(self, down: float, startup: float) -> None:
        """kill -9 now, booted ``down`` s later, ``startup`` s of which the new
        process spent starting: the chain is all the boot has."""
        self.downs.append((self.head, self.now + down))
        self.now += down
        last = {name: times[-1] for name, times in self.renewals.items()}
        since = {
            name: LeaseRecord(controller=name, at=at(t), down_ns=int(self._down_s(0) * 1e9)
                              - int(self._down_s(t) * 1e9))
            for name, t in last.items()
        }  # fmt: skip
        run = RunClock(head_ns=at(self.head).wall_ns, down_ns=int(self._down_s(0) * 1e9))
        self.lease = rule.lease_at_boot(POLICY, at(self.now), since, run, startup)
        ran = {name: max(0.0, self.head - t - self._down_s(t)) for name, t in last.items()}
        carried = {
            name: min(self.now - last[name], max(r, self.now - last[name] - LEASE_S - startup))
            for name, r in ran.items()
        }
        self.contact = {name: self.now - c for name, c in carried.items()}
        self.recorded = dict.fromkeys(self.contact)  # the first heartbeat is recorded
        self.told = set()
        self.head = self.now  # node.started
        for name, c in carried.items():
            assert self.lease.controllers[name].last_contact_s == pytest.approx(self.contact[name])
            if c:
                VISITED.add(("boot", Audience.NONE, c > LEASE_S))
            if c > ran[name]:
                VISITED.add(("boot_bounded", Audience.NONE, True))  # a lease of wall excused

    @stateful.rule(step=st.sampled_from([0.5, 2.5, 6.0, 11.0]))
    def time_passes(self, step: float) -> None:
        self.now += step

    @stateful.rule(name=st.sampled_from(NAMES))
    def heard(self, name: str) -> None:
        lapsed = name in self.contact and self.now - self.contact[name] > LEASE_S
        decision = self._decide(rule.ControllerHeard(name))
        assert decision.was_lapsed is (lapsed or name in self.told)
        last = self.recorded.get(name)
        if decision.events:
            assert last is None or self.now - last >= QUARTER
            self.recorded[name] = self.now
        else:
            assert last is not None and self.now - last < QUARTER
        self.contact[name] = self.now
        self.told.discard(name)

    @stateful.rule(late=st.sampled_from([0.0, PAUSE_S, 6.0, 30.0]))
    def tick(self, late: float) -> None:
        decision = self._decide(rule.HealthTickFired(late))
        if late > PAUSE_S:
            self.contact = {n: min(self.now, c + late) for n, c in self.contact.items()}
        due = {n for n, c in self.contact.items() if self.now - c > LEASE_S} - self.told
        assert {lapse.controller for lapse in decision.lapsed} == due
        self.told |= due

    @stateful.rule(name=st.sampled_from(NAMES))
    def registered(self, name: str) -> None:
        decision = self._decide(rule.InstanceRegistered(name))
        silent = name in self.contact and self.now - self.contact[name] > LEASE_S
        assert [lapse.controller for lapse in decision.lapsed] == ([name] if silent else [])
        self.contact.setdefault(name, self.now)

    @stateful.rule(name=st.sampled_from(NAMES))
    def renewal_failed(self, name: str) -> None:
        self._decide(rule.RenewalFailed(name))
        if name in self.recorded:
            times = self.renewals.get(name, [])
            if times and self.recorded[name] == times[-1]:
                times.pop()  # that renewal is not in the chain
                if not times:
                    del self.renewals[name]
            self.recorded[name] = None


#: 70 examples reach every rule, audience and boot outcome (``test_zz_...``); 150
#: keep a margin (about 2 s).
Leases.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, derandomize=True
)
TestLeases = Leases.TestCase


def test_zz_every_lease_rule_and_audience_reached() -> None:
    """Runs after the machine: every observation, every audience it can have, and
    a heard controller both lapsed and not, were reached by the random runs."""
    if not VISITED:
        pytest.skip("the state machine did not run in this session")
    wanted = {
        ("ControllerHeard", Audience.NONE, False),
        ("ControllerHeard", Audience.NONE, True),
        ("HealthTickFired", Audience.NONE, False),
        ("HealthTickFired", Audience.PLACED_BY_LAPSED, False),
        ("InstanceRegistered", Audience.NONE, False),
        ("InstanceRegistered", Audience.REGISTERED, False),
        ("RenewalFailed", Audience.NONE, False),
        ("boot", Audience.NONE, False),  # some silence carried, within the lease
        ("boot", Audience.NONE, True),  # a controller lapsed before the restart
        ("boot_bounded", Audience.NONE, True),  # more down than a lease: the rest is silence
    }
    boots = {"boot", "boot_bounded"}
    assert {name for name, _, _ in wanted} - boots == {t.__name__ for t in rule.LEASE_RULES}
    assert wanted - VISITED == set(), f"never reached: {sorted(wanted - VISITED)}"
