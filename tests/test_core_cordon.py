"""The cordon's and the placement set's rules, pure (actors/core/cordon.py,
actors/core/placement_set.py): every cell of the cordon's table, boot after a
drain, and what a set decides from a state with extra, missing and older
instances; the fold of their events (replay)."""

from __future__ import annotations

from typing import Any

import pytest
from core_support import Sim, make_rules

from infervisor.actors.core import cordon as rule
from infervisor.actors.core import effects as fx
from infervisor.actors.core import observations as o
from infervisor.actors.core import placement_set as sets
from infervisor.actors.core.rules import Mode
from infervisor.chain import GENESIS_KIND, StoredEvent
from infervisor.replay import (
    Desired,
    LifecycleState,
    NodeState,
    apply,
    encode_event,
    fold,
    kind_of,
)
from infervisor.replay import events as ev
from infervisor.replay.cordon_reason import CordonInForce
from infervisor.replay.state import Cordon

C = Cordon
#: Two controller instances (one running, one stopped) and the operator's, running.
PLACED = (
    rule.Held(instance_id="c-run", by_controller=True, wanted_running=True, up=True),
    rule.Held(instance_id="c-off", by_controller=True, wanted_running=False),
    rule.Held(instance_id="c-stopping", by_controller=True, wanted_running=False, up=True),
    rule.Held(instance_id="own", by_controller=False, wanted_running=True, up=True),
)
STOPPED = ("c-run", "c-stopping")


@pytest.mark.parametrize(
    ("now", "asked", "after", "kinds", "stop"),
    [
        (C.NONE, rule.CordonAsked("r"), C.CORDONED, ["node.cordoned"], ()),
        (C.CORDONED, rule.CordonAsked(), C.CORDONED, [], ()),
        (C.CORDONED, rule.CordonAsked("new"), C.CORDONED, ["node.cordoned"], ()),
        (C.DRAINED, rule.CordonAsked(), C.DRAINED, [], ()),
        (C.DRAINED, rule.CordonAsked("new"), C.DRAINED, [], ()),
        (C.NONE, rule.DrainAsked("r"), C.DRAINED, ["node.drained"], STOPPED),
        (C.CORDONED, rule.DrainAsked(), C.DRAINED, ["node.drained"], STOPPED),
        (C.DRAINED, rule.DrainAsked(), C.DRAINED, [], STOPPED),
        (C.DRAINED, rule.DrainAsked("new"), C.DRAINED, ["node.drained"], STOPPED),
        (C.NONE, rule.UncordonAsked(), C.NONE, [], ()),
        (C.CORDONED, rule.UncordonAsked("r"), C.NONE, ["node.uncordoned"], ()),
        (C.DRAINED, rule.UncordonAsked(), C.NONE, ["node.uncordoned"], ()),
        (C.NONE, rule.BootFound(), C.NONE, [], ()),
        (C.CORDONED, rule.BootFound(), C.CORDONED, [], ()),
        (C.DRAINED, rule.BootFound(), C.DRAINED, [], STOPPED),
    ],
)
def test_every_cell_of_the_cordon_table(
    now: Cordon,
    asked: rule.CordonObservation,
    after: Cordon,
    kinds: list[str],
    stop: tuple[str, ...],
) -> None:
    decision = rule.decide_cordon(now, asked, PLACED)
    assert decision.cordon is after
    assert [kind_of(e) for e in decision.events] == kinds
    assert decision.stop == stop  # never the operator's
    reason = getattr(asked, "reason", None)
    assert all(getattr(e, "reason", None) == reason for e in decision.events)


def test_boot_on_a_drained_node_holds_every_controller_instance() -> None:
    decision = rule.decide_cordon(C.DRAINED, rule.BootFound(), PLACED)
    assert decision.hold == ("c-off", "c-run", "c-stopping")
    assert rule.decide_cordon(C.CORDONED, rule.BootFound(), PLACED).hold == ()


def test_refusals_name_the_way_out() -> None:
    assert rule.placement_refusal(C.NONE) is None
    for cordon in (C.CORDONED, C.DRAINED):
        why = rule.placement_refusal(cordon)
        assert why is not None and str(cordon) in why and "uncordon" in why
    assert rule.start_refusal(C.CORDONED, "c1", by_controller=True) is None
    assert rule.start_refusal(C.DRAINED, "own", by_controller=False) is None
    assert "uncordon" in (rule.start_refusal(C.DRAINED, "c1", by_controller=True) or "")


# ---------------------------------------------------------------- placement sets
def spec(role: str, **more: Any) -> dict[str, Any]:
    return {"role": role, "flavor": "llamacpp", "model": "tiny", "port": 9000, **more}


def have(placed_by: str, generation: int, role: str, running: bool = False) -> sets.Existing:
    return sets.Existing(
        placed_by=placed_by, generation=generation, spec=spec(role), running=running
    )


def asked(generation: int, *roles: str, start: bool = True) -> sets.Asked:
    items = tuple(sets.Item(instance_id=r, spec=spec(r), start=start) for r in roles)
    return sets.Asked(controller="ctl1", generation=generation, items=items)


#: Extra (ctl1's, not named), older (ctl1's, generation 1), current, the
#: operator's and another controller's.
STATE = {
    "extra": have("ctl1", 1, "extra", running=True),
    "older": have("ctl1", 1, "older"),
    "current": have("ctl1", 2, "current", running=True),
    "own": have("n1", 0, "own", running=True),
    "theirs": have("ctl2", 5, "theirs", running=True),
}


def test_a_set_places_replaces_unloads_and_starts() -> None:
    d = sets.decide_set(asked(2, "older", "current", "missing"), STATE, 1, C.NONE)
    assert d.refusal is None
    assert d.place == (2,)
    assert d.replace == ("older",)
    assert d.unchanged == ("current",)
    assert d.unload == ("extra",)  # never the operator's nor another controller's
    assert d.start == ("older", "missing")  # "current" is wanted running already
    assert [kind_of(e) for e in d.events] == ["node.placement_set"]
    recorded = d.events[0]
    assert isinstance(recorded, ev.PlacementSet)
    assert (recorded.controller, recorded.generation) == ("ctl1", 2)
    assert recorded.instances == ["older", "current", "missing"]


def test_the_same_set_again_records_and_does_nothing() -> None:
    converged = {
        "older": have("ctl1", 2, "older", running=True),
        "current": have("ctl1", 2, "current", running=True),
    }
    d = sets.decide_set(asked(2, "older", "current"), converged, 2, C.NONE)
    assert d.idle and d.refusal is None
    assert d.unchanged == ("older", "current")


def test_a_set_cut_off_is_finished_by_sending_it_again_without_a_second_record() -> None:
    half = {"older": have("ctl1", 1, "older"), "extra": have("ctl1", 1, "extra")}
    d = sets.decide_set(asked(2, "older", "missing"), half, 2, C.NONE)
    assert d.events == ()  # generation 2 is recorded already
    assert (d.place, d.replace, d.unload) == ((1,), ("older",), ("extra",))


def test_an_empty_set_unloads_everything_the_controller_placed() -> None:
    d = sets.decide_set(asked(3), STATE, 2, C.NONE)
    assert d.unload == ("current", "extra", "older")
    assert [kind_of(e) for e in d.events] == ["node.placement_set"]


@pytest.mark.parametrize(
    ("the_set", "last", "cordon", "code", "field"),
    [
        (asked(1, "current"), 2, C.NONE, "stale_generation", "generation"),
        (asked(2, "current", "missing"), 1, C.CORDONED, "cordoned", "placements[1]"),
        (asked(2, "older"), 1, C.DRAINED, "cordoned", "placements[0].start"),
        (asked(2, "older", "older"), 1, C.NONE, "bad_value", "placements[1]"),
    ],
)
def test_a_refused_set_names_the_field_and_does_nothing(
    the_set: sets.Asked, last: int, cordon: Cordon, code: str, field: str
) -> None:
    d = sets.decide_set(the_set, STATE, last, cordon)
    assert d.refusal is not None
    assert (d.refusal.kind.value, d.refusal.field) == (code, field)
    assert d.idle


def test_a_set_with_another_spec_for_a_placed_instance_is_refused() -> None:
    changed = sets.Asked(
        controller="ctl1",
        generation=3,
        items=(sets.Item(instance_id="older", spec=spec("older", ctx_size=512)),),
    )
    d = sets.decide_set(changed, STATE, 2, C.NONE)
    assert d.refusal is not None and d.refusal.field == "placements[0].spec"
    assert "ctx_size" in d.refusal.message


def test_a_drained_node_takes_a_set_that_starts_nothing() -> None:
    d = sets.decide_set(asked(2, "older", start=False), STATE, 1, C.DRAINED)
    assert d.refusal is None and d.replace == ("older",) and d.start == ()


# ---------------------------------------------------------------- the fold
def _stored(seq: int, event: ev.Event) -> StoredEvent:
    return StoredEvent(
        seq=seq, ts_ns=seq, node="n1", source="operator", kind=kind_of(event), subject="",
        payload=encode_event(event), payload_hash=b"", prev_hash=b"", hash=bytes(32),
    )  # fmt: skip


def test_the_cordon_and_the_sets_are_folded_alike_by_apply_and_fold() -> None:
    events: list[ev.Event] = [
        ev.NodeCordoned(reason="maintenance"),
        ev.PlacementSet(controller="ctl1", generation=4, instances=["a"]),
        ev.NodeDrained(),
        ev.PlacementSet(controller="ctl2", generation=1, instances=[]),
    ]
    genesis = StoredEvent(
        seq=0, ts_ns=0, node="n1", source="", kind=GENESIS_KIND, subject="",
        payload=b"{}", payload_hash=b"", prev_hash=b"", hash=bytes(32),
    )  # fmt: skip
    stored = [genesis, *(_stored(n, e) for n, e in enumerate(events, 1))]
    state = NodeState(node_id="n1", head_seq=-1, head_hash="")
    for row in stored:
        state = apply(state, row)
    folded = fold("n1", stored)
    for s in (state, folded):
        assert s.cordon is C.DRAINED
        assert s.placement_sets == {"ctl1": 4, "ctl2": 1}
    uncordoned = apply(state, _stored(len(stored), ev.NodeUncordoned()))
    assert uncordoned.cordon is C.NONE


# ---------------------------------------------------------------- boot, held
def _process_sim() -> Sim:
    return Sim(rules=make_rules(Mode.PROCESS))


def _running() -> Sim:
    sim = _process_sim()
    sim.start()
    assert sim.inst.lifecycle is LifecycleState.RUNNING
    return sim


def test_a_held_boot_accounts_for_the_process_and_starts_nothing() -> None:
    """A drained node's controller instance: its exit is recorded, no restart,
    no start; a shutdown-stopped one wanted running stays stopped; a live one is
    re-attached (the drain's stop follows)."""
    gone = _running()
    pid = gone.inst.process.pid if gone.inst.process is not None else None
    died = o.ProcessGone(pid=pid, exit_code=1, signal=None, reason="ended while the node was down")
    gone.feed(o.BootSeen(process=died, held=True))
    assert gone.kinds_of_last() == ["instance.exited"]
    assert gone.last is not None
    assert not any(isinstance(e, fx.CheckStart | fx.ArmTimer) for e in gone.last.effects)

    stopped = _running()
    stopped.feed(o.StopVerb(by="shutdown", grace_s=5))
    stopped.gone(signal=15)
    assert stopped.inst.desired is Desired.RUNNING  # a shutdown leaves it wanted running
    stopped.feed(o.BootSeen(process=o.ProcessNone(), held=True))
    assert stopped.kinds_of_last() == []
    assert stopped.last is not None and stopped.last.effects == ()
    stopped.feed(o.StopVerb(by="node", grace_s=5, reason="the node is drained"))
    assert stopped.kinds_of_last() == ["instance.stop_requested"]  # recorded: wanted stopped
    assert stopped.inst.desired is Desired.STOPPED

    unheld = _running()
    unheld.feed(o.StopVerb(by="shutdown", grace_s=5))
    unheld.gone(signal=15)
    unheld.feed(o.BootSeen(process=o.ProcessNone()))
    assert unheld.effect(fx.CheckStart).by == "boot"  # not held: started again


# ---------------------------------------------------------------- the reason in force
def in_force(reason: str | None) -> CordonInForce:
    return CordonInForce(reason=reason, since_ns=1_796_335_805_000_000_000, seq=7)


@pytest.mark.parametrize(
    ("now", "asked", "reason_in_force", "kinds"),
    [
        (C.CORDONED, rule.CordonAsked("r"), "r", []),  # re-sent: nothing (stop 33)
        (C.CORDONED, rule.CordonAsked("r"), "other", ["node.cordoned"]),
        (C.CORDONED, rule.CordonAsked("r"), None, ["node.cordoned"]),
        (C.CORDONED, rule.CordonAsked(), "r", []),
        (C.DRAINED, rule.DrainAsked("r"), "r", []),
        (C.DRAINED, rule.DrainAsked("r"), "other", ["node.drained"]),
        (C.CORDONED, rule.DrainAsked("r"), "r", ["node.drained"]),  # a drain is new
        (C.DRAINED, rule.CordonAsked("r"), "r", []),
    ],
)
def test_the_reason_in_force_again_records_nothing(
    now: Cordon, asked: rule.CordonObservation, reason_in_force: str | None, kinds: list[str]
) -> None:
    """A cordon (or drain) re-sent with the reason in force was recorded again, one
    row per re-send; it records nothing now, and a drain still stops what is left."""
    decision = rule.decide_cordon(now, asked, PLACED, in_force(reason_in_force))
    assert [kind_of(e) for e in decision.events] == kinds
    assert decision.cordon is (C.DRAINED if isinstance(asked, rule.DrainAsked) else now)
    if isinstance(asked, rule.DrainAsked):
        assert decision.stop == STOPPED


def test_a_placement_refusal_says_since_when_and_why() -> None:
    why = rule.placement_refusal(C.CORDONED, in_force("kernel update"))
    assert why is not None
    assert "cordoned since 2026-12-03T22:10:05Z, because: kernel update:" in why
    bare = rule.placement_refusal(C.DRAINED, in_force(None))
    assert bare is not None and "drained since 2026-12-03T22:10:05Z:" in bare
