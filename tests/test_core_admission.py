"""Admission's rules (actors/core/admission.py), pure: tables of cases.

The order of a start's checks and where they stop, the memory fit with its
numbers, what a placement's admission records, and the refusals the host
answers from its books.
"""

from __future__ import annotations

import pytest

from infervisor.actors.core import admission as rule
from infervisor.actors.core import effects as fx
from infervisor.actors.core import observations as o
from infervisor.actors.core.admission import START_ORDER, StartCheck
from infervisor.adapters.errors import AddressTaken, ProgramMissing, SpecError
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.replay import events as ev

START = fx.CheckStart(by="operator", reset_budget=True, attempt=0, verb=True)
PRECHECK = fx.CheckStart(
    by="supervisor", reset_budget=False, attempt=2, verb=False, weights_only=True
)
A, W, M = StartCheck.ADDRESS, StartCheck.WEIGHTS, StartCheck.MEMORY


# ---------------------------------------------------------------- a start's checks
@pytest.mark.parametrize(
    ("check", "found", "expected"),
    [
        (START, {}, A),
        (START, {A: None}, W),
        (START, {A: None, W: None}, M),
        (START, {A: None, W: None, M: None}, None),
        (START, {A: "127.0.0.1:8080"}, None),  # the first refusal ends the checks
        (START, {A: None, W: "digest differs"}, None),
        (PRECHECK, {}, W),
        (PRECHECK, {W: None}, None),
        (PRECHECK, {W: "weights gone"}, None),
    ],
)
def test_next_start_check(
    check: fx.CheckStart, found: dict[StartCheck, str | None], expected: StartCheck | None
) -> None:
    assert rule.next_start_check(check, found) is expected


def run_checks(check: fx.CheckStart, answers: dict[StartCheck, str | None]) -> list[StartCheck]:
    """The checks run, in order, when each answers as ``answers`` says."""
    found: dict[StartCheck, str | None] = {}
    while (nxt := rule.next_start_check(check, found)) is not None:
        found[nxt] = answers.get(nxt)
    return list(found)


def test_start_checks_run_in_the_reference_order_until_one_refuses() -> None:
    assert run_checks(START, {}) == list(START_ORDER) == [A, W, M]
    assert run_checks(START, {W: "no"}) == [A, W]
    assert run_checks(PRECHECK, {}) == [W]


@pytest.mark.parametrize(
    ("check", "found", "reserved", "expected"),
    [
        (START, {A: "h:1"}, 0, {"taken": "h:1"}),
        (START, {A: None, W: "bad"}, 0, {"model_refusal": "bad"}),
        (START, {A: None, W: None, M: "too big"}, 0, {"memory_refusal": "too big"}),
        (START, {A: None, W: None, M: None}, 7, {"reserved_bytes": 7}),
        (PRECHECK, {W: "bad"}, 0, {"model_refusal": "bad", "precheck": True}),
        (PRECHECK, {W: None}, 0, {"precheck": True}),
    ],
)
def test_start_checked(
    check: fx.CheckStart, found: dict[StartCheck, str | None], reserved: int, expected: dict
) -> None:
    base = {"by": check.by, "reset_budget": check.reset_budget, "attempt": check.attempt}
    want = o.StartChecked(**base, verb=check.verb, **expected)
    assert rule.start_checked(check, found, reserved) == want


@pytest.mark.parametrize(
    ("model", "reported", "expected"), [(100, None, 100), (100, 0, 100), (100, 250, 250)]
)
def test_start_memory_bytes(model: int, reported: int | None, expected: int) -> None:
    assert rule.start_memory_bytes(model, reported) == expected


# ---------------------------------------------------------------- the memory fit
@pytest.mark.parametrize(
    ("held", "size", "expected"),
    [
        ({}, 80, rule.MemoryFit(held_bytes=90)),
        ({"b": 10}, 80, rule.MemoryFit(held_bytes=90)),  # exactly the budget fits
        (
            {"b": 11},
            80,
            rule.MemoryFit(
                refusal="memory budget 100 bytes, 11 in use, 90 needed "
                "(80 model + 10 overhead): does not fit"
            ),
        ),
        ({"a": 42, "b": 58}, 500, rule.MemoryFit(held_bytes=42)),  # a retried start keeps its own
    ],
)
def test_fit_memory(held: dict[str, int], size: int, expected: rule.MemoryFit) -> None:
    assert rule.fit_memory(100, 10, held, "a", size) == expected


# ---------------------------------------------------------------- a placement
def spec(port: int = 8080) -> InstanceSpec:
    return InstanceSpec(role="chat", flavor=Flavor.LLAMACPP, model="tiny", port=port)


@pytest.mark.parametrize(
    ("refused", "recorded"),
    [
        (None, ev.Placed),
        (AddressTaken("127.0.0.1:8080 is taken"), ev.AdmissionRefused),
        (ProgramMissing("llama-server is not installed"), ev.AdmissionRefused),
        (SpecError("port: out of range", field="port"), None),  # the caller's mistake
    ],
)
def test_placement_event(refused: Exception | None, recorded: type | None) -> None:
    event = rule.placement_event(spec(), "ctl", 3, refused)
    if recorded is None:
        assert event is None
        return
    assert isinstance(event, recorded)
    if isinstance(event, ev.Placed):
        assert (event.placed_by, event.generation) == ("ctl", 3)
    else:
        assert isinstance(event, ev.AdmissionRefused)
        assert event.reason == str(refused)


@pytest.mark.parametrize(
    ("books", "says"),
    [
        ({}, None),
        ({"booting": True, "unloading": True}, "still rebuilding"),
        ({"unbuilt": "model gone", "placing": True}, "cannot be started (model gone)"),
        ({"unloading": True, "placing": True}, "is being unloaded"),
        ({"placing": True}, "already in progress"),
    ],
)
def test_placement_busy(books: dict, says: str | None) -> None:
    full = {"booting": False, "unbuilt": None, "unloading": False, "placing": False, **books}
    refusal = rule.placement_busy("i1", **full)
    assert (refusal is None) if says is None else (says in (refusal or ""))


def test_kind_refusal_names_the_allowed_kinds() -> None:
    assert rule.kind_refusal("chat", ["chat", "embed"]) is None
    assert rule.kind_refusal("x", ["embed", "chat"]) == (
        "kind 'x' is not a kind of this node: one of chat, embed (or define it in [node.kinds.x])"
    )


def test_shared_address_names_the_other_instance() -> None:
    assert rule.shared_address(spec(8080), [("other", spec(8081))]) is None
    refusal = rule.shared_address(spec(8080), [("other", spec(8080))])
    assert refusal is not None
    assert refusal.startswith("127.0.0.1:8080 is already used by another instance (other): ")


@pytest.mark.parametrize(
    ("limit", "enforceable", "refused"), [(None, False, False), (1, True, False), (1, False, True)]
)
def test_memory_limit_refusals(limit: int | None, enforceable: bool, refused: bool) -> None:
    placing = rule.placement_limit_refusal(limit, enforceable, "pgroup", "no cgroup v2")
    spawning = rule.spawn_limit_refusal(limit, "llama-server", enforceable)
    assert (placing is not None, spawning is not None) == (refused, refused)
    if refused:
        assert placing is not None
        assert placing.startswith("memory_max_bytes 1: this node has no memory cgroup")
        assert spawning == (
            "cannot start llama-server: no memory cgroup to enforce memory_max_bytes 1 on this node"
        )
