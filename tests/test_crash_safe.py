"""A crash-safe node: kill -9 of `infervisor run` while servers run, then run again.

The same server pids are re-attached (``instance.reattached``), nothing is
started twice, the chain verifies, the restart budget carries over, and a
one-shot run that had finished stays finished.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from support import cli_here, pids_of_group
from test_run_resume import (
    DEADLINE_S,
    NodeRun,
    by_role,
    events_of,
    lifecycle,
    put_model,
    runs,  # noqa: F401 - the fixture, shared with the resume tests
    server_groups,
    write_config,
)

from infervisor.replay import NodeState

ONE_SHOT = """
[[instances]]
role = "batch"
flavor = "llamacpp"
model = "tiny"
port = {port}
kind = "process"
continuous = false
env = {{ FAKE_EXIT_AFTER = "0.3", FAKE_EXIT_CODE = "0" }}
"""


@pytest.fixture
def crash_config(tmp_path: Path, fake_llama: str) -> tuple[Path, Path]:
    from infervisor.adapters.ports import free_port

    put_model(tmp_path / "data")
    config = write_config(
        tmp_path,
        fake_llama,
        node_extra="[node.restart]\nbase_s = 0.2\ncap_s = 1.0\nmax_restarts = 50\n",
    )
    config.write_text(config.read_text() + ONE_SHOT.format(port=free_port()))
    return config, tmp_path / "data" / "chain.db"


def chat(state: NodeState) -> object:
    return by_role(state.instances, "chat")[1]


def settled(state: NodeState) -> bool:
    return lifecycle(state, "chat") == "running" and lifecycle(state, "batch") == "finished"


def reattached_count(db: Path, iid: str) -> int:
    return sum(1 for e in events_of(db) if e.kind == "instance.reattached" and e.subject == iid)


def run_crash_loop(start: Callable[[Path], NodeRun], config: Path, db: Path, rounds: int) -> None:
    first = start(config)
    state = first.until_state(db, "chat running, batch finished", settled, DEADLINE_S)
    chat_id, inst = by_role(state.instances, "chat")
    os.kill(inst.process.pid, signal.SIGKILL)  # one restart before the crashes: budget 1 used
    state = first.until_state(
        db,
        "chat restarted once",
        lambda s: (
            lifecycle(s, "chat") == "running"
            and chat(s).restarts == 1
            and chat(s).process.pid != inst.process.pid
        ),
        DEADLINE_S,
    )
    pid = chat(state).process.pid
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(timeout=DEADLINE_S)
    spawned_before = Counter(e.subject for e in events_of(db) if e.kind == "instance.spawned")
    for round_ in range(1, rounds + 1):
        node = start(config)
        state = node.until_state(
            db,
            f"chat re-attached (round {round_})",
            lambda s, n=round_: settled(s) and reattached_count(db, chat_id) == n,
            DEADLINE_S,
        )
        assert chat(state).process.pid == pid
        assert chat(state).restarts == 1  # the budget carried over
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(timeout=DEADLINE_S)
        assert psutil.pid_exists(pid)
        assert len(pids_of_group(pid)) == 1  # no duplicate server, no leak
    spawned = Counter(e.subject for e in events_of(db) if e.kind == "instance.spawned")
    assert spawned == spawned_before  # nothing was started again
    batch_id, batch = by_role(state.instances, "batch")
    assert batch.lifecycle == "finished"
    assert spawned[batch_id] == 1  # the one-shot ran once, ever
    verified = cli_here("chain", "verify", db)  # in this process (support.cli_here)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    last = start(config)
    again = rounds + 1
    last.until_state(
        db, "re-attached once more", lambda s: reattached_count(db, chat_id) == again, DEADLINE_S
    )
    assert last.stop() == 0, last.output()
    for pgid in server_groups(db):
        assert pids_of_group(pgid) == [], f"process group {pgid} outlived the node"


@pytest.mark.slow
@pytest.mark.timeout(240)  # also its place in the run: conftest, longest first
def test_kill_9_of_the_node_then_restart_reattaches_again_and_again_without_leaks(
    runs,  # noqa: F811 - fixture
    crash_config,
) -> None:
    # Two rounds: the first is a kill -9 and a re-attach; the second re-attaches a
    # server that was re-attached already (each round is the same moment;
    # tests/test_kill_loop.py kills the node at chosen moments). One test: a
    # test of one round alone ran the first round again (the suite's time budget).
    config, db = crash_config
    rounds = 2
    run_crash_loop(runs, config, db, rounds=rounds)
    kinds = Counter(e.kind for e in events_of(db))
    assert kinds["instance.reattached"] == rounds + 1
    payloads = [json.loads(e.payload) for e in events_of(db) if e.kind == "node.started"]
    assert len(payloads) == rounds + 2
