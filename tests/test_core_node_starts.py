"""Issue 21, starts the node decides itself (a restart whose backoff came due, a
boot resuming an instance wanted running), pure: one that does not fit asks the
node for room (``AskRoom``) and records nothing; the node's ``StartAgain``
decides the same start again (the supervisor's, no use); a refusal after the
plan is recorded once per cause, however long apart; a verb's refusal names
what could not go and how long it waited.
"""

from __future__ import annotations

from core_support import Sim, make_rules

from infervisor.actors.core import effects as fx
from infervisor.actors.core import observations as o
from infervisor.actors.core.decision import RefusalKind
from infervisor.actors.core.rules import Mode
from infervisor.replay import Desired, LifecycleState
from infervisor.replay import residency_events as rev

S = LifecycleState
NO_ROOM = "memory budget 100 bytes, 80 in use, 40 needed"


def crashed() -> Sim:
    """A running process instance whose server exited 1; its restart is due."""
    sim = Sim(rules=make_rules(Mode.PROCESS))
    sim.start()
    sim.gone(exit_code=1)
    assert sim.inst.lifecycle is S.RESTARTING
    sim.clock.advance(10)
    sim.feed(o.TimerDue(name=fx.Timer.RESTART))
    return sim


def test_a_restart_that_does_not_fit_asks_the_node_for_room_and_records_nothing() -> None:
    sim = crashed()
    check = sim.effect(fx.CheckStart)
    assert (check.by, check.verb, check.demand, check.planned) == (
        "supervisor",
        False,
        False,
        False,
    )

    d = sim.checked(check, memory_refusal=NO_ROOM)

    assert d.events == () and d.refusal is None
    ask = sim.effect(fx.AskRoom)
    assert ask.by == "supervisor" and ask.cause == "its restart after an exit (attempt 1)"
    assert sim.inst.lifecycle is S.RESTARTING and sim.inst.refusal == ""


def test_the_nodes_start_again_is_the_supervisors_start_and_no_use() -> None:
    sim = crashed()
    sim.checked(memory_refusal=NO_ROOM)
    used = sim.inst.last_use_ns

    sim.feed(o.StartAgain(by="supervisor"))
    check = sim.effect(fx.CheckStart)
    assert (check.by, check.attempt, check.demand) == ("supervisor", 1, True)
    refused = sim.checked(check, demand=True, memory_refusal=NO_ROOM)  # still no room: answered
    assert refused.events == () and refused.refusal is not None
    assert refused.refusal.kind is RefusalKind.MEMORY

    sim.feed(o.StartAgain(by="supervisor"))
    sim.checked(demand=True, reserved_bytes=40)

    assert sim.kinds_of_last() == ["instance.starting"]
    assert sim.inst.last_use_ns == used  # a supervisor's restart is no use
    assert sim.inst.restarts == 1


def test_start_again_recorded_refuses_once_per_cause() -> None:
    sim = crashed()
    sim.checked(memory_refusal=NO_ROOM)
    sim.feed(o.StartAgain(by="supervisor", record=True))
    check = sim.effect(fx.CheckStart)
    assert check.planned and not check.demand
    sim.checked(check, planned=True, memory_refusal=NO_ROOM)
    assert sim.kinds_of_last() == ["instance.start_refused"]
    sim.feed(o.StartAgain(by="supervisor", record=True))
    d = sim.checked(planned=True, memory_refusal=NO_ROOM)
    assert d.events == ()  # the same cause: recorded once
    assert not [e for e in d.effects if isinstance(e, fx.AskRoom)]


def test_start_again_of_an_instance_no_longer_wanted_decides_nothing() -> None:
    sim = crashed()
    sim.checked(memory_refusal=NO_ROOM)
    sim.feed(o.StopVerb(by="operator", grace_s=1.0))
    assert sim.inst.desired is Desired.STOPPED

    d = sim.feed(o.StartAgain(by="supervisor"))

    assert d.events == () and d.effects == () and d.refusal is None


def test_a_verbs_start_does_not_ask_for_room_itself() -> None:
    """A verb's or a request's memory refusal goes to its caller (the node plans
    for it there): only the node's own starts ask."""
    sim = Sim(rules=make_rules(Mode.PROCESS))
    sim.feed(o.StartVerb(by="operator", room=True))
    d = sim.checked(demand=True, memory_refusal=NO_ROOM)
    assert d.refusal is not None and d.refusal.kind is RefusalKind.MEMORY
    assert not [e for e in d.effects if isinstance(e, fx.AskRoom)]


def _refused(*, node: bool, waited_s: float = 0.0) -> o.RoomRefused:
    busy = rev.Candidate(
        instance_id="chat", last_use_ns=1, priority=0, pinned=False, held_bytes=50,
        busy=True, chosen=False, why_not="serving a request",
    )  # fmt: skip
    pinned = rev.Candidate(
        instance_id="embed", last_use_ns=2, priority=0, pinned=True, held_bytes=30,
        busy=False, chosen=False, why_not="pinned",
    )  # fmt: skip
    return o.RoomRefused(
        by="node", needed_bytes=40, budget_bytes=100, in_use_bytes=80,
        held={"chat": 50, "embed": 30}, candidates=(busy, pinned), waited_s=waited_s, node=node,
    )  # fmt: skip


def test_a_refusal_names_what_could_not_go_and_how_long_it_waited() -> None:
    sim = Sim(rules=make_rules(Mode.PROCESS))
    d = sim.feed(_refused(node=False, waited_s=12.4))
    assert d.refusal is not None and d.refusal.kind is RefusalKind.NOT_NO_ROOM
    message = d.refusal.message
    assert "chat (serving a request), embed (pinned)" in message
    assert "waited 12.4 s" in message  # replay/durations.py: three significant digits
    assert sim.kinds_of_last() == ["residency.refused"]


def test_a_node_starts_identical_refusal_is_recorded_once_however_long_apart() -> None:
    sim = crashed()
    sim.checked(memory_refusal=NO_ROOM)
    sim.feed(_refused(node=True))
    assert sim.kinds_of_last() == ["residency.refused"]
    sim.clock.advance(rev.REFUSAL_WINDOW_S * 10)
    d = sim.feed(_refused(node=True))
    assert d.events == () and sim.tracking.refusals_folded == 1
    # a request's identical refusal that long after is recorded again
    d = sim.feed(_refused(node=False))
    assert sim.kinds_of_last() == ["residency.refused"]


def test_a_boot_resuming_an_instance_wanted_running_asks_for_room_the_same() -> None:
    """Stopped by the node's shutdown (still wanted running): the boot starts it;
    when it does not fit, the boot's start asks for room as a restart's does."""
    sim = Sim(rules=make_rules(Mode.PROCESS))
    sim.start()
    sim.feed(o.StopVerb(by="shutdown", grace_s=1.0))
    sim.gone(signal=15)
    assert sim.inst.lifecycle is S.STOPPED and sim.inst.desired is Desired.RUNNING
    sim.clock.reboot("boot-b", down_s=5)

    sim.feed(o.BootSeen(process=o.ProcessNone()))
    check = sim.effect(fx.CheckStart)
    assert check.by == "boot"
    d = sim.checked(check, memory_refusal=NO_ROOM)

    assert d.events == ()
    assert sim.effect(fx.AskRoom) == fx.AskRoom(
        by="boot", cause="its start at boot (it was wanted running)"
    )
    sim.feed(o.StartAgain(by="boot"))
    assert sim.effect(fx.CheckStart).by == "boot"
    sim.checked(demand=True, reserved_bytes=40)
    assert sim.kinds_of_last() == ["instance.starting"]
