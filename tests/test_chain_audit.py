"""`infervisor audit` and replay.audit: each forbidden transition flagged with its seq.

Chains are crafted with `SqliteChain.append_many` of real event kinds
(replay/events.py); the fault suite's own chains are audited in its teardown
(tests/test_misbehaving_servers.py) and must give no finding.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from infervisor.chain import EventDraft, SqliteChain
from infervisor.replay import RestartPolicy, kind_of
from infervisor.replay import events as ev
from infervisor.replay.audit import audit_chain
from infervisor.replay.state import Stamp
from infervisor.tools.cli import cli

NOW = 1_793_491_200_000_000_000
NODE = "n1"
CHAT = "chat-0123abcd-n1"
SPEC = {"role": "chat", "flavor": "llamacpp", "model": "tiny", "port": 18080}

Step = tuple[str, ev.Event, str]


def build(path: Path, steps: list[Step], *, back_at: int | None = None) -> Path:
    """A chain of `steps` (subject, event, source), 1 s apart; the step at index
    `back_at` is stamped 10 s before the one before it."""
    ticks = itertools.count(NOW, 1_000_000_000)
    drafts = []
    for i, (subject, event, source) in enumerate(steps):
        ts = next(ticks)
        if i == back_at:
            ts -= 11_000_000_000
        drafts.append(
            EventDraft(
                ts_ns=ts,
                source=source,
                kind=kind_of(event),
                subject=subject,
                payload=ev.encode_event(event),
            )
        )
    with SqliteChain.open(path, NODE, now_ns=lambda: NOW - 1) as chain:
        chain.append_many(drafts)
    return path


def at(seconds: float) -> Stamp:
    return Stamp(wall_ns=NOW + int(seconds * 1e9), mono_s=seconds, boot_id="boot-1")


def run_once(pid: int, *, exit_code: int | None = None, signal: int | None = 9) -> list[Step]:
    """Start, spawn, ready, then the process dies."""
    return [
        (CHAT, ev.Starting(by="supervisor", attempt=1), "supervisor"),
        (CHAT, ev.Spawned(pid=pid, pgid=pid, start_time=1.0, boot_id="boot-1", argv=[]), "node"),
        (CHAT, ev.Ready(), "supervisor"),
        (CHAT, ev.Exited(pid=pid, exit_code=exit_code, signal=signal, reason="killed"), "node"),
    ]


PLACED: list[Step] = [
    ("", ev.NodeStarted(pid=1, boot_id="boot-1", version="0"), "node"),
    (CHAT, ev.Placed(spec=SPEC, placed_by=NODE), "operator"),
    (CHAT, ev.Starting(by="operator", reset_budget=True), "operator"),
    (CHAT, ev.Spawned(pid=10, pgid=10, start_time=1.0, boot_id="boot-1", argv=[]), "node"),
    (CHAT, ev.Ready(), "supervisor"),
]
"""Seq 1..5: the node starts, CHAT is placed, started by the operator, serving."""


def invoke(*args: object) -> Result:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def rules(path: Path, policy: RestartPolicy | None = None) -> list[tuple[int, str]]:
    return [(f.seq, f.rule) for f in audit_chain(path, policy).findings]


def test_a_lawful_chain_has_no_finding_and_exits_0(tmp_path: Path) -> None:
    steps = [
        *PLACED,
        (CHAT, ev.Exited(pid=10, exit_code=None, signal=9, reason="killed"), "node"),
        (CHAT, ev.RestartScheduled(attempt=1, delay_s=1.0, reason="crash", at=at(6)), "node"),
        *run_once(11)[:3],
        (CHAT, ev.StopRequested(by="operator", grace_s=5.0), "operator"),
        (CHAT, ev.Exited(pid=11, exit_code=0, signal=None, reason="stopped"), "node"),
        (CHAT, ev.Starting(by="operator", reset_budget=True), "operator"),  # explicit: fine
        (CHAT, ev.Unloaded(by="operator"), "operator"),
    ]
    path = build(tmp_path / "chain.db", steps)
    assert rules(path, RestartPolicy(max_restarts=3)) == []
    result = invoke("audit", path)
    assert result.exit_code == 0, result.output
    assert "0 findings" in result.stdout


def test_a_restart_after_an_operator_stop_is_flagged(tmp_path: Path) -> None:
    steps = [
        *PLACED,
        (CHAT, ev.StopRequested(by="operator:uid=1000(alice)", grace_s=5.0), "operator"),  # 6
        (CHAT, ev.Exited(pid=10, exit_code=0, signal=None, reason="stopped"), "node"),  # 7
        (CHAT, ev.Starting(by="supervisor", attempt=1), "supervisor"),  # 8: forbidden
    ]
    path = build(tmp_path / "chain.db", steps)
    assert rules(path) == [(8, "restart after an operator stop")]
    finding = audit_chain(path).findings[0]
    assert "alice" in finding.detail
    assert "seq 6" in finding.detail
    assert finding.instance == CHAT


def test_a_restart_scheduled_after_an_operator_stop_is_flagged(tmp_path: Path) -> None:
    steps = [
        *PLACED,
        (CHAT, ev.StopRequested(by="controller", grace_s=5.0), "controller"),  # 6
        (CHAT, ev.Exited(pid=10, exit_code=0, signal=None, reason="stopped"), "node"),  # 7
        (CHAT, ev.RestartScheduled(attempt=1, delay_s=1.0, reason="exit"), "node"),  # 8
    ]
    path = build(tmp_path / "chain.db", steps)
    assert (8, "restart after an operator stop") in rules(path)


def test_an_operator_restart_is_not_a_stop(tmp_path: Path) -> None:
    steps = [
        *PLACED,
        (CHAT, ev.StopRequested(by="operator", grace_s=5.0, then="restart"), "operator"),
        (CHAT, ev.Exited(pid=10, exit_code=0, signal=None, reason="stopped"), "node"),
        (CHAT, ev.Starting(by="supervisor", attempt=0), "supervisor"),
    ]
    assert rules(build(tmp_path / "chain.db", steps)) == []


def test_a_restart_beyond_the_budget_is_flagged(tmp_path: Path) -> None:
    steps: list[Step] = [*PLACED]
    steps.append((CHAT, ev.Exited(pid=10, exit_code=None, signal=9, reason="k"), "node"))
    for attempt in range(1, 5):  # restarts 1..4 at seq 7, 12, 17, 22
        steps.append((CHAT, ev.RestartScheduled(attempt=attempt, delay_s=1, reason="k"), "node"))
        steps += run_once(10 + attempt)
    path = build(tmp_path / "chain.db", steps)
    assert rules(path, RestartPolicy(max_restarts=3)) == [(22, "restart beyond the budget")]
    assert rules(path, RestartPolicy(max_restarts=5)) == []
    assert rules(path) == []  # the node's budget is configuration: unknown without it
    result = invoke("audit", "--max-restarts", "2", "--json", path)
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert [(f["seq"], f["rule"]) for f in report["findings"]] == [
        (17, "restart beyond the budget"),
        (22, "restart beyond the budget"),
    ]
    assert report["ok"] is False


def test_an_automatic_start_after_the_budget_was_spent_is_flagged(tmp_path: Path) -> None:
    steps = [
        *PLACED,
        (CHAT, ev.Exited(pid=10, exit_code=None, signal=9, reason="k"), "node"),  # 6
        (CHAT, ev.Failed(attempts=5, reason="restart budget spent"), "node"),  # 7
        (CHAT, ev.Starting(by="boot"), "node"),  # 8
    ]
    path = build(tmp_path / "chain.db", steps)
    assert rules(path) == [(8, "restart beyond the budget")]


def test_a_start_of_an_exposed_instance_is_flagged_until_it_is_reloaded(tmp_path: Path) -> None:
    steps = [
        *PLACED,
        (CHAT, ev.Exposed(addresses=["0.0.0.0:18080"]), "supervisor"),  # 6
        (CHAT, ev.Exited(pid=10, exit_code=0, signal=None, reason="stopped"), "node"),  # 7
        (CHAT, ev.Starting(by="operator", reset_budget=True), "operator"),  # 8: forbidden
        (CHAT, ev.StopRequested(by="operator", grace_s=1.0), "operator"),  # 9
        (CHAT, ev.Unloaded(by="operator"), "operator"),  # 10
        (CHAT, ev.Placed(spec=SPEC, placed_by=NODE), "operator"),  # 11: reloaded
        (CHAT, ev.Starting(by="operator", reset_budget=True), "operator"),  # 12: fine
    ]
    path = build(tmp_path / "chain.db", steps)
    assert rules(path) == [(8, "start of an exposed instance")]


def test_an_event_for_an_instance_never_placed_is_flagged(tmp_path: Path) -> None:
    ghost = "ghost-00000000-n1"
    steps = [
        *PLACED,
        (ghost, ev.Ready(), "supervisor"),  # 6
        (CHAT, ev.StopRequested(by="operator", grace_s=1.0), "operator"),  # 7
        (CHAT, ev.Exited(pid=10, exit_code=0, signal=None, reason="stopped"), "node"),  # 8
        (CHAT, ev.Unloaded(by="operator"), "operator"),  # 9
        (CHAT, ev.Ready(), "supervisor"),  # 10: after its unload
    ]
    path = build(tmp_path / "chain.db", steps)
    found = audit_chain(path).findings
    assert [(f.seq, f.rule) for f in found] == [
        (6, "instance never placed"),
        (10, "instance never placed"),
    ]
    assert "unloaded" in found[1].detail


def test_time_going_backwards_is_flagged(tmp_path: Path) -> None:
    path = build(tmp_path / "chain.db", PLACED, back_at=3)  # seq 4
    found = audit_chain(path).findings
    assert [(f.seq, f.rule) for f in found] == [(4, "time going backwards")]
    assert "seq 3" in found[0].detail


def test_an_illegal_transition_is_flagged_and_the_audit_goes_on(tmp_path: Path) -> None:
    steps = [
        *PLACED,
        (CHAT, ev.Finished(), "node"),  # 6: running -> finished is not in the table
        (CHAT, ev.Starting(by="supervisor", attempt=1), "supervisor"),  # 7: ok from running?
        ("", ev.NodeStopped(reason="end"), "node"),
    ]
    path = build(tmp_path / "chain.db", steps)
    found = rules(path)
    assert found[0] == (6, "illegal transition")


def test_the_cli_prints_every_finding_with_its_seq_and_exits_1(tmp_path: Path) -> None:
    ghost = "ghost-00000000-n1"
    steps = [*PLACED, (ghost, ev.Ready(), "supervisor")]
    path = build(tmp_path / "chain.db", steps, back_at=4)
    result = invoke("audit", path)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert "2 findings" in lines[0]
    assert "seq      5" in lines[1]
    assert "time going backwards" in lines[1]
    assert "seq      6" in lines[2]
    assert ghost in lines[2]
    assert "instance never placed" in lines[2]


def test_audit_of_a_tampered_chain_says_so_and_exits_1(tmp_path: Path) -> None:
    import sqlite3

    path = build(tmp_path / "chain.db", PLACED)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP TRIGGER events_append_only_update")
    conn.execute("UPDATE events SET ts_ns = ts_ns + 1 WHERE seq = 3")
    conn.close()
    result = invoke("audit", "--json", path)
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["findings"] == []
    assert report["verify"]["problem"]["seq"] == 3
    assert "INVALID chain at seq 3" in invoke("audit", path).stdout


def test_audit_options(tmp_path: Path) -> None:
    path = build(tmp_path / "chain.db", PLACED)
    assert invoke("audit", "--window", "60", path).exit_code == 2
    assert invoke("audit", tmp_path / "none.db").exit_code == 2


@pytest.mark.parametrize("policy", [None, RestartPolicy(max_restarts=0)])
def test_a_spec_budget_override_is_used(tmp_path: Path, policy: RestartPolicy | None) -> None:
    spec = {**SPEC, "restart": {"max_restarts": 0}}
    steps = [
        ("", ev.NodeStarted(pid=1, boot_id="boot-1", version="0"), "node"),
        (CHAT, ev.Placed(spec=spec, placed_by=NODE), "operator"),
        *run_once(10),
        (CHAT, ev.RestartScheduled(attempt=1, delay_s=1.0, reason="crash"), "node"),  # 7
    ]
    path = build(tmp_path / "chain.db", steps)
    assert rules(path, policy) == [(7, "restart beyond the budget")]
