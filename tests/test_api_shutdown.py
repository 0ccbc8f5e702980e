"""SIGTERM with the control API serving: changes answer 503, the verb in flight
finishes, managed servers stop in parallel, a checkpoint covers the chain, exit 0.

A real ``infervisor run`` with llama-protocol servers that ignore SIGTERM, so
each stop takes its whole grace period and the verb in flight is still in
flight when the signal arrives. Synchronisation is by the chain file and by
the API's answers, each with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import PROGRAMS, make_launcher, wait_until
from test_run_resume import DEADLINE_S, NodeRun, end_runs, put_model, write_config

from infervisor.adapters.ports import free_port
from infervisor.tools.api.serving.server import socket_path

#: The shutdown's grace for each server (each ignores SIGTERM, so takes all of it).
GRACE_S = 3.0
#: The grace of the stop in flight: it stays in flight until the test itself kills
#: the server (once the refusal is seen), however loaded the machine.
IN_FLIGHT_GRACE_S = 60.0


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Callable[[Path], NodeRun]]:
    started: list[NodeRun] = []

    def start(config: Path) -> NodeRun:
        run = NodeRun(config, tmp_path / f"run-{len(started) + 1}.log")
        started.append(run)
        return run

    yield start
    end_runs(started, tmp_path / "data" / "chain.db")


def api(data: Path) -> httpx.Client:
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=str(socket_path(data))),
        base_url="http://node",
        timeout=httpx.Timeout(60.0, connect=5.0),
    )


Row = tuple[int, str, str, dict[str, Any], bytes, str]


def rows(db: Path) -> list[Row]:
    """(seq, kind, subject, payload, hash, source) of every event."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        found = conn.execute(
            "SELECT seq, kind, subject, payload, hash, source FROM events ORDER BY seq"
        )
        return [(s, k, subj, json.loads(p), bytes(h), src) for s, k, subj, p, h, src in found]


def views(client: httpx.Client) -> dict[str, dict[str, Any]]:
    answer = client.get("/v1/instances")
    answer.raise_for_status()
    return {v["role"]: v for v in answer.json()}


def test_sigterm_refuses_changes_finishes_the_verb_in_flight_and_stops_in_parallel(
    runs: Callable[[Path], NodeRun], tmp_path: Path
) -> None:
    stubborn = make_launcher(tmp_path, PROGRAMS / "fault_ignore_term.py")
    put_model(tmp_path / "data")
    third = f"""
[[instances]]
role = "third"
flavor = "llamacpp"
model = "tiny"
port = {free_port()}
"""
    config = write_config(tmp_path, stubborn)
    config.write_text(
        config.read_text().replace("stop_grace_s = 5.0", f"stop_grace_s = {GRACE_S}") + third
    )
    data, db = tmp_path / "data", tmp_path / "data" / "chain.db"
    run = runs(config)
    run.until("the API socket listening", lambda: listening(socket_path(data)))
    with api(data) as client:
        check_shutdown(run, client, data, db)


def listening(path: Path) -> bool:
    """True once something accepts connections on the Unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def stop_in_flight(data: Path, chat: str, answers: list[httpx.Response]) -> None:
    with api(data) as own:
        answers.append(own.post(f"/v1/instances/{chat}/stop", json={"grace_s": IN_FLIGHT_GRACE_S}))


def check_shutdown(run: NodeRun, client: httpx.Client, data: Path, db: Path) -> None:
    run.until("the node open", lambda: client.get("/v1/node").status_code == 200)
    # The API opens before the configured instances are placed: wait for all three.
    run.until("three instances placed", lambda: len(views(client)) == 3)
    embed = views(client)["embed"]["instance_id"]
    assert client.post(f"/v1/instances/{embed}/start").status_code == 200
    run.until(
        "all three running",
        lambda: all(v["lifecycle"] == "running" for v in views(client).values()),
    )
    chat_view = views(client)["chat"]
    chat, chat_group = chat_view["instance_id"], chat_view["pid"]

    # A stop that takes its whole grace (the server ignores SIGTERM) is in flight ...
    answers: list[httpx.Response] = []
    stopper = threading.Thread(target=stop_in_flight, args=(data, chat, answers))
    stopper.start()
    run.until(
        "the stop in flight",
        lambda: any(r[1] == "instance.stop_requested" and r[2] == chat for r in rows(db)),
    )
    signalled_after = rows(db)[-1][0]
    # ... when SIGTERM arrives: from then on, a change is answered 503 node_stopping.
    run.send(signal.SIGTERM)

    def refused() -> httpx.Response | None:
        # A start of a running instance records nothing when taken (the node polls
        # its signals twice a second: the first tries may still be taken).
        answer = client.post(f"/v1/instances/{embed}/start")
        return answer if answer.status_code == 503 else None

    refusal = wait_until(refused, DEADLINE_S, "a change refused with 503")
    assert refusal.json()["error"]["code"] == "node_stopping", refusal.text
    assert not answers, "the stop answered before the refusal: it was not in flight"
    # The server ignores SIGTERM: only its end (here, by the test) ends the stop.
    os.killpg(chat_group, signal.SIGKILL)

    stopper.join(DEADLINE_S)
    assert answers and answers[0].status_code == 200, answers and answers[0].text
    finished = answers[0].json()
    assert finished["instance"]["lifecycle"] == "stopped"
    assert run.wait() == 0, run.output()

    events = rows(db)
    by_seq = {r[0]: r[4] for r in events}
    assert by_seq[finished["seq"]].hex() == finished["hash"]
    # After the signal, the operator's only events are those of the stop in flight.
    late = [r for r in events if r[0] > signalled_after and r[5].startswith("operator")]
    assert {r[2] for r in late} <= {chat}, late
    # The shutdown stopped the two others in parallel: both were asked to stop
    # before either exited (each takes the whole grace, then SIGKILL).
    others = {r[2] for r in events} - {"", chat}
    asked = {
        r[2]: r[0]
        for r in events
        if r[1] == "instance.stop_requested" and r[2] in others and r[5] == "shutdown"
    }
    assert set(asked) == others, (asked, others)
    exited = {
        r[2]: r[0] for r in events if r[1] == "instance.exited" and r[0] > min(asked.values())
    }
    assert set(exited) == others, exited
    assert max(asked.values()) < min(exited.values()), (asked, exited)
    # A signed checkpoint covers the whole chain, node.stopped included.
    assert events[-1][1] == "node.stopped", events[-1]
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        (size,) = conn.execute("SELECT max(tree_size) FROM checkpoints").fetchone()
    assert size == len(events)
    assert not socket_path(data).exists()
