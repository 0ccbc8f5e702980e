"""The probe engine's schedule (actors/probe_loop.py) and its wake rule
(actors/core/wake.py), on a manual clock, with the real decision core as the
actor: a report that wakes it is decided (tests/core_support.py's Sim), the
deep check paced and the new watch published, as the instance actor does."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
from core_support import Clock, Sim, make_rules, policy, sick, up

from infervisor.actors.clock import ManualClock
from infervisor.actors.core import observations as o
from infervisor.actors.core.pacing import READINESS_S, Pacing, deep_paced
from infervisor.actors.core.rules import Mode
from infervisor.actors.core.wake import (
    RECONCILE_MEANINGS,
    RECONCILE_RULES,
    PortListeners,
    Reconcile,
    Seen,
    Wake,
    Watch,
    reconcile_for,
    wake_for,
    watch_of,
)
from infervisor.actors.probe_loop import Gates, Probed, ProbeLoop
from infervisor.adapters.probe import Health, HealthKind, ServerReport
from infervisor.replay import LifecycleState

S = LifecycleState
LOADING = ServerReport(health=Health(HealthKind.LOADING))


class Rig:
    """One instance: its core (a Sim), its probe loop on a manual clock, and a
    server answering ``answer`` (held while ``hold``)."""

    def __init__(self, kind: str = "web", stable_after_s: float = 30.0) -> None:
        self.clock = ManualClock()
        rules = make_rules(Mode.PROCESS, kind=kind, restart=policy(stable_after_s=stable_after_s))
        self.sim = Sim(rules=rules, clock=Clock(mono_s=0.0))
        self.answer = up()
        self.hold = False
        self.held: list[tuple[Callable[[Probed], None], Probed]] = []
        self.sent: list[float] = []  # manual times the probes went
        self.woken: list[Wake | None] = []
        self.pacing = Pacing()
        self.deep_sent: list[float] = []
        self.loop = ProbeLoop(self.clock, self._send, self._wake)

    def _send(self, token: int, back: Callable[[Probed], None]) -> None:
        self.sent.append(self.clock.monotonic())
        probed = Probed(token=token, report=self.answer, latency_s=0.0)
        if self.hold:
            self.held.append((back, probed))
        else:
            back(probed)

    def _sync(self) -> None:
        self.sim.clock.advance(self.clock.monotonic() - self.sim.clock.mono_s)

    def _wake(self, probed: Probed) -> None:
        """As the actor: decide the report, then pace the deep check and publish."""
        self.woken.append(probed.wake)
        self._sync()
        self.sim.feed(o.ProbeResult(token=probed.token, report=probed.report))
        self.decided()

    def decided(self) -> None:
        self._sync()
        paced = deep_paced(self.sim.inst, self.sim.rules, self.pacing, self.clock.monotonic())
        self.pacing = paced.pacing
        if paced.deep:
            self.deep_sent.append(self.clock.monotonic())
        now = self.sim.clock.now
        sim = self.sim
        self.loop.publish(
            watch_of(sim.inst, sim.rules, sim.tracking, self.pacing, now, recording=True)
        )

    def deep_answers(self) -> None:
        """The deep check out gives a token."""
        self.pacing = self.pacing.deep_checked()
        self.sim.feed(o.DeepChecked(token=self.sim.inst.process.pid, error=None))  # type: ignore[union-attr]
        self.decided()

    def start(self) -> None:
        self.sim.start()
        self.decided()

    def running(self) -> None:
        """Started, and found ready by its readiness probes."""
        self.start()
        self.clock.advance(READINESS_S)
        assert self.sim.inst.lifecycle is S.RUNNING

    def gaps(self, since: int = 0) -> list[float]:
        times = self.sent[since:]
        return [round(b - a, 6) for a, b in itertools.pairwise(times)]


def test_a_steady_up_instance_is_probed_every_interval_and_never_woken() -> None:
    rig = Rig()
    rig.running()
    rig.clock.advance(1.0)
    assert rig.woken == [Wake.UNSTEADY, Wake.CHANGED]  # ready; then the first report once steady
    woken, sent = len(rig.woken), len(rig.sent)
    rig.clock.advance(60.0)
    assert len(rig.sent) - sent == 60  # every second (the kind's interval_s)
    assert set(rig.gaps(sent - 1)) == {1.0}
    assert len(rig.woken) == woken  # the same "up": nothing to decide
    assert rig.loop.quiet == 60
    assert rig.loop.report == up()


def test_each_wake_reason_wakes_the_actor() -> None:
    """Every reason of the table is reached, each by what it names; the reasons
    reached are counted and one never reached fails the test."""
    rig = Rig(kind="deep", stable_after_s=30.0)  # deep checks every 5 s
    rig.running()
    assert rig.woken == [Wake.UNSTEADY]  # starting: every report is decided
    assert rig.deep_sent  # one deep check at once, while running
    rig.deep_answers()
    rig.clock.advance(4.0)
    assert rig.woken == [Wake.UNSTEADY, Wake.CHANGED]  # the first report once steady
    rig.clock.advance(1.0)  # 5 s after the last deep check
    assert rig.woken[-1] is Wake.DEEP_DUE and len(rig.deep_sent) == 2
    rig.deep_answers()

    rig.answer = ServerReport(health=Health(HealthKind.UP), models=["tiny"])
    rig.clock.advance(1.0)
    assert rig.woken[-1] is Wake.CHANGED

    rig.answer = sick()
    rig.clock.advance(1.0)
    assert rig.woken[-1] is Wake.MISS and rig.sim.tracking.misses == 1
    rig.answer = up()
    rig.clock.advance(1.0)
    assert rig.woken[-1] is Wake.UNSTEADY and rig.sim.tracking.misses == 0  # misses in a row
    rig.clock.advance(1.0)
    assert rig.woken[-1] is Wake.CHANGED  # steady again: a new baseline

    rig.sim.crash_and_restart()  # restarts = 1: the stability reset is pending
    rig.clock.jump(10.0)  # the Sim's backoff, on the manual clock too
    rig.decided()
    rig.clock.advance(READINESS_S)
    assert rig.sim.inst.lifecycle is S.RUNNING and rig.sim.inst.restarts == 1
    before = len(rig.woken)
    rig.clock.advance(29.0)
    assert set(rig.woken[before + 1 :]) <= {Wake.DEEP_DUE}  # no reset yet
    while rig.pacing.deep_running:
        rig.deep_answers()
    rig.clock.advance(1.5)
    assert Wake.STABLE_DUE in rig.woken[before:]
    assert rig.sim.inst.restarts == 0  # decided on a probe answering up

    reached = {w for w in rig.woken if w is not None}
    assert reached == set(Wake), f"never reached: {set(Wake) - reached}"


def test_a_starting_instance_is_probed_at_the_readiness_cadence_and_not_after() -> None:
    rig = Rig(kind="loads")  # loading is allowed for 10 s
    rig.answer = LOADING
    rig.start()
    assert rig.sim.inst.lifecycle is S.STARTING
    rig.clock.advance(1.0)
    assert len(rig.sent) >= round(1.0 / READINESS_S)  # one at once, then every 50 ms
    assert set(rig.gaps()) == {READINESS_S}
    assert set(rig.woken) == {Wake.MISS}  # not up: each loading answer is decided
    rig.answer = up()
    rig.clock.advance(READINESS_S)
    assert rig.sim.inst.lifecycle is S.RUNNING
    ready = len(rig.sent)
    rig.clock.advance(5.0)
    assert set(rig.gaps(ready - 1)) == {1.0}  # the kind's interval, counted from ready


def test_no_second_probe_while_one_is_out_and_none_once_closed() -> None:
    rig = Rig()
    rig.running()
    rig.hold = True
    rig.clock.advance(10.0)
    assert len(rig.held) == 1 and rig.loop.probing  # a hung server costs one probe
    back, probed = rig.held.pop()
    rig.hold = False
    back(msgspec_replace_report(probed, sick()))
    assert rig.woken[-1] is Wake.MISS
    rig.clock.advance(1.0)
    assert rig.sent[-2:] == [10.05, 11.05]  # overdue: the next at once, then on the interval
    rig.loop.close()
    rig.clock.advance(10.0)
    assert rig.sent[-1] == 11.05


def test_afresh_hands_over_the_next_report_whatever_it_says() -> None:
    rig = Rig()
    rig.running()
    woken = len(rig.woken)
    rig.clock.advance(3.0)
    assert len(rig.woken) == woken + 1  # the first report once steady only
    woken = len(rig.woken)
    rig.loop.afresh()
    rig.clock.advance(0.0)
    assert rig.woken[-1] is Wake.CHANGED and len(rig.woken) == woken + 1


def msgspec_replace_report(probed: Probed, report: ServerReport) -> Probed:
    return Probed(token=probed.token, report=report, latency_s=probed.latency_s)


@pytest.mark.parametrize(
    ("watch", "seen", "last", "reason"),
    [
        (Watch(steady=True), Seen(1, sick()), Seen(1, up()), Wake.MISS),
        (Watch(steady=False), Seen(1, up()), Seen(1, up()), Wake.UNSTEADY),
        (Watch(steady=True), Seen(1, up()), None, Wake.CHANGED),
        (Watch(steady=True), Seen(2, up()), Seen(1, up()), Wake.CHANGED),  # a new server
        (Watch(steady=True), Seen(1, up(), 1), Seen(1, up(), 0), Wake.CHANGED),  # busy now
        (Watch(steady=True, deep_due_s=9.0), Seen(1, up()), Seen(1, up()), Wake.DEEP_DUE),
        (Watch(steady=True, stable_due_s=9.0), Seen(1, up()), Seen(1, up()), Wake.STABLE_DUE),
        (
            Watch(steady=True, deep_due_s=11.0, stable_due_s=11.0),
            Seen(1, up()),
            Seen(1, up()),
            None,
        ),
    ],
)
def test_the_wake_table(watch: Watch, seen: Seen, last: Seen | None, reason: Wake | None) -> None:
    assert wake_for(watch, seen, last, 10.0) is reason


# ---------------------------------------------------------------- the reconcile tick
WIDE = ("0.0.0.0:8080",)


@pytest.mark.parametrize(
    ("watch", "seen", "told", "reason"),
    [
        (Watch(ticks=True), (), (), Reconcile.TICKS),  # a managed process: every tick
        (Watch(ticks=True), None, (), Reconcile.TICKS),  # even with the table unread
        (Watch(ticks=False), (), None, Reconcile.LISTENERS),  # none told yet
        (Watch(ticks=False), WIDE, (), Reconcile.LISTENERS),  # it began to listen wide
        (Watch(ticks=False), (), WIDE, Reconcile.LISTENERS),  # and stopped
        (Watch(ticks=False), (), (), None),  # nothing new: not woken
        (Watch(ticks=False), WIDE, WIDE, None),
        (Watch(ticks=False), None, (), None),  # the table unread: nothing to tell
    ],
)
def test_the_reconcile_table(
    watch: Watch, seen: PortListeners, told: PortListeners, reason: Reconcile | None
) -> None:
    assert reconcile_for(watch, seen, told) is reason


def test_every_reconcile_reason_is_in_the_rule_and_in_words() -> None:
    assert [reason for reason, _ in RECONCILE_RULES] == list(Reconcile) == list(RECONCILE_MEANINGS)


def test_an_adopted_server_ticks_nothing_and_a_managed_one_does() -> None:
    """The watch says which instances a reconcile tick has anything for."""
    for mode, ticks in ((Mode.ADOPTED, False), (Mode.PROCESS, True)):
        sim = Sim(rules=make_rules(mode), clock=Clock(mono_s=0.0))
        sim.start()
        watch = watch_of(
            sim.inst, sim.rules, sim.tracking, Pacing(), sim.clock.now, recording=True, port=8080
        )
        assert (watch.ticks, watch.port) == (ticks, 8080), mode


def test_a_reconcile_tick_wakes_an_adopted_server_only_when_its_listeners_change() -> None:
    """Through the loop and the node's gates, as the supervisor asks: each reason
    is reached and counted, and one never reached fails the test."""
    gates = Gates()
    loop = ProbeLoop(ManualClock(), lambda token, back: None, lambda probed: None)
    gates.put("a", loop)
    assert gates.wakes("a", {}) is True  # before any watch: told (ticks by default)
    loop.publish(Watch(ticks=False, port=8080))
    ticks = [{}, {}, None, {9000: ["0.0.0.0:9000"]}, {8080: ["0.0.0.0:8080"]}, {8080: list(WIDE)}]
    woken = [gates.wakes("a", ports) for ports in ticks]
    # told () at first; the same (), an unread table, another port's listener: nothing
    # new; then its own port listens wide; the same again: nothing new.
    assert woken == [False, False, False, False, True, False]
    loop.publish(Watch(ticks=True, port=8080))  # a process of its own (or a tick rule)
    assert gates.wakes("a", {}) is True
    assert loop.reconciled == {Reconcile.TICKS: 2, Reconcile.LISTENERS: 1}
    assert set(loop.reconciled) == set(Reconcile), f"never reached: {set(Reconcile)}"
    assert loop.reconcile_quiet == 5
    gates.drop("a", ProbeLoop(ManualClock(), lambda token, back: None, lambda probed: None))
    loop.publish(Watch(ticks=False, port=8080))
    assert gates.wakes("a", {}) is False  # another loop's drop: still gated
    loop.close()
    assert gates.wakes("a", {}) is True  # closed: the actor decides
    gates.drop("a", loop)
    assert gates.wakes("a", {}) is True  # no loop: always told
