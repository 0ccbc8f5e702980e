"""A node killed (SIGKILL) in the middle of its graceful shutdown: the next boot starts
what the shutdown stopped and the chain still wants running, by its own decision.

``infervisor run`` runs as a real process (tests/test_run_resume.py ``runs``) with a
llama-protocol server that ignores SIGTERM (tests/programs/fault_ignore_term.py), so
the shutdown's stop stays in flight (grace 300 s) until the node is killed. The
server is then killed too, while no node runs: the next boot finds it gone, records
its exit, and must start it at once rather than leave it stopped for the
supervisor's reconcile tick (actors/core/boot.py). Synchronisation is by condition
and deadline on the chain; the assertion is on the chain's order of events, not on
time.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from support import PROGRAMS, make_launcher, pids_of_group, wait_until
from test_run_resume import (
    DEADLINE_S,
    NodeRun,
    by_role,
    events_of,
    ignores_sigterm,
    lifecycle,
    put_model,
    read_state,
    runs,  # noqa: F401 - the fixture
    write_config,
)

from infervisor.replay import NodeState
from infervisor.replay.callers import Role


def _after_second_boot(db: Path, chat: str) -> list[tuple[str, str, dict[str, object]]]:
    """(kind, source, payload) of chat's events since the second ``node.started``
    (none before it is recorded)."""
    events = events_of(db)
    boots = [i for i, e in enumerate(events) if e.kind == "node.started"]
    if len(boots) < 2:
        return []
    return [
        (e.kind, e.source, json.loads(e.payload))
        for e in events[boots[1] + 1 :]
        if e.subject == chat
    ]


def _chat_running(s: NodeState) -> bool:
    return lifecycle(s, "chat") == "running" and by_role(s.instances, "chat")[1].process is not None


def _killed_mid_shutdown(
    start_run: Callable[[Path], NodeRun], tmp_path: Path, grace_s: float
) -> tuple[Path, Path, str, int]:
    """Run a node whose chat server ignores SIGTERM, SIGTERM the node (its shutdown
    stops chat with ``grace_s``), and SIGKILL it once chat is recorded stopping:
    (config, chain, chat's id, the server's process group)."""
    stubborn = make_launcher(tmp_path, PROGRAMS / "fault_ignore_term.py")
    put_model(tmp_path / "data")
    config = write_config(tmp_path, stubborn)
    config.write_text(config.read_text().replace("stop_grace_s = 5.0", f"stop_grace_s = {grace_s}"))
    db = tmp_path / "data" / "chain.db"
    first = start_run(config)
    state = first.until_state(db, "chat running", _chat_running, DEADLINE_S)
    chat, inst = by_role(state.instances, "chat")
    assert inst.process is not None
    first.until("the server ignoring SIGTERM", lambda: _ignoring(db))
    first.send(signal.SIGTERM)  # the graceful shutdown: chat stopping, still wanted running
    first.until_state(db, "chat stopping", lambda s: lifecycle(s, "chat") == "stopping", 60)
    first.send(signal.SIGKILL)  # mid-shutdown
    first.wait()
    return config, db, chat, inst.process.pgid


def _started_again(
    second: NodeRun, db: Path, chat: str
) -> list[tuple[str, str, dict[str, object]]]:
    """Chat's events since the second boot, once they hold its start."""
    second.until(
        "chat started again",
        lambda: any(k == "instance.starting" for k, _, _ in _after_second_boot(db, chat)),
    )
    return _after_second_boot(db, chat)


def _stop(second: NodeRun, db: Path) -> None:
    """End the second node: its server ignores SIGTERM, so a second signal ends it."""
    second.until_state(db, "chat running again", _chat_running, DEADLINE_S)
    second.until("the server ignoring SIGTERM", lambda: _ignoring(db))
    second.send(signal.SIGTERM)
    second.until_state(db, "chat stopping", lambda s: lifecycle(s, "chat") == "stopping", 60)
    assert second.stop(signal.SIGTERM) == 0, second.output()


@pytest.mark.slow
def test_boot_starts_at_once_what_a_killed_shutdown_left_stopped_and_wanted(
    runs: Callable[[Path], NodeRun],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    config, db, chat, pgid = _killed_mid_shutdown(runs, tmp_path, 300.0)
    os.killpg(pgid, signal.SIGKILL)  # the server ends while no node runs
    wait_until(lambda: not pids_of_group(pgid), DEADLINE_S, "the server gone")

    second = runs(config)
    after = _started_again(second, db, chat)
    kinds = [k for k, _, _ in after]
    # The boot recorded the exit and decided the start in the same decision: the
    # start is the boot's, not the reconcile tick's (a supervisor's start).
    assert kinds[:2] == ["instance.exited", "instance.starting"], after
    assert after[1][2]["by"] == Role.BOOT, after
    _stop(second, db)


@pytest.mark.slow
def test_boot_restarts_a_live_server_a_killed_shutdown_was_stopping(
    runs: Callable[[Path], NodeRun],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    # A grace long enough to kill the node inside it, short enough to wait out.
    config, db, chat, pgid = _killed_mid_shutdown(runs, tmp_path, 20.0)
    assert pids_of_group(pgid), "the server outlives the node (its grace not over)"

    second = runs(config)
    after = _started_again(second, db, chat)
    kinds = [k for k, _, _ in after]
    # The boot re-attached the server, resumed the shutdown's stop and recorded that
    # it starts again once gone; the start follows the exit, by the boot's record.
    assert kinds[:4] == [
        "instance.reattached",
        "instance.stop_requested",
        "instance.exited",
        "instance.starting",
    ], after
    stop = after[1][2]
    assert (stop["by"], stop["then"]) == (Role.BOOT, "restart"), after
    assert after[3][2]["by"] == Role.BOOT, after
    _stop(second, db)


def _ignoring(db: Path) -> bool:
    """Whether chat's recorded server has set SIGTERM to ignored."""
    state = read_state(db)
    assert state is not None
    process = by_role(state.instances, "chat")[1].process
    return process is not None and ignores_sigterm(process.pid)
