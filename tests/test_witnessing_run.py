"""Witnessing with real ``infervisor run`` processes (issue 18 items 1 and 2).

One process test per behaviour: a witness that is down delays neither the boot
nor the restart of a killed server, and its backlog is cosigned when it comes
back; a node restored from an older ``chain backup`` refuses to boot naming the
witness and both sizes, and ``--accept-witness-conflict`` resumes, recorded as
``node.witness_override`` before anything else; kill -9 of the node while a
witness holds its answer leaves chain and cosignatures consistent, and the
next boot gets the cosignature. The witness is tests/servers/witness_double.py.
The operator's commands beside the node run in this process (support.cli_here):
the node is the process under test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from servers.witness_double import WitnessDouble
from support import cli_here, wait_until
from test_cli_contract import validate
from test_run_resume import (
    INFERVISOR,
    NodeRun,
    by_role,
    end_runs,
    events_of,
    lifecycle,
    put_model,
    read_state,
    write_config,
)
from test_witnessing import _verified_sizes, new_chain

from infervisor.chain.checkpoint_store import read_stored
from infervisor.chain.cosignature_store import read_lines_by_size
from infervisor.tools.clikit.node_schema import NODE_SCHEMA

DEADLINE_S = 60.0
ORIGIN = "example.com/fleet/n1"  # tests/test_witnessing.py new_chain


class FlagRun(NodeRun):
    """``infervisor run`` with extra arguments."""

    def __init__(self, config: Path, log: Path, *flags: str) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(INFERVISOR), "run", *flags, str(config)], stdout=out, stderr=subprocess.STDOUT
            )


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Callable[..., NodeRun]]:
    started: list[NodeRun] = []

    def start(config: Path, *flags: str) -> NodeRun:
        run = FlagRun(config, tmp_path / f"run-{len(started) + 1}.log", *flags)
        started.append(run)
        return run

    yield start
    end_runs(started, tmp_path / "data" / "chain.db")


@pytest.fixture
def witness(tmp_path: Path) -> Iterator[WitnessDouble]:
    double = WitnessDouble("witness.test/one", [new_chain(tmp_path / "data").verifier])
    yield double
    double.release()
    double.stop()


def _config(tmp_path: Path, program: str, double: WitnessDouble, boot_s: float = 30.0) -> Path:
    put_model(tmp_path / "data")
    entry = f'[[witnesses]]\nurl = "{double.url}"\nvkey = "{double.vkey}"\n'
    extra = f"checkpoint_every_events = 1\nwitness_boot_timeout_s = {boot_s}\n"
    return write_config(tmp_path, program, node_extra=extra, top_extra=entry)


def _api(tmp_path: Path, path: str) -> httpx.Response:
    """GET ``path`` from the node's control API on its Unix socket."""
    transport = httpx.HTTPTransport(uds=str(tmp_path / "data" / "api.sock"))
    with httpx.Client(transport=transport, base_url="http://node", timeout=DEADLINE_S) as client:
        answer = client.get(path)
    assert answer.status_code == 200, answer.text
    return answer


def _chat_pid(db: Path) -> int | None:
    state = read_state(db)
    if state is None or lifecycle(state, "chat") != "running":
        return None
    process = by_role(state.instances, "chat")[1].process
    return None if process is None else int(process.pid)


def test_a_witness_that_is_down_delays_nothing_and_gets_its_backlog(
    runs: Callable[..., NodeRun], tmp_path: Path, fake_llama: str, witness: WitnessDouble
) -> None:
    db = tmp_path / "data" / "chain.db"
    config = _config(tmp_path, fake_llama, witness)
    witness.stop()  # down: connections refused
    run = runs(config)
    first = run.until("chat running", lambda: _chat_pid(db))
    assert "the chain is unanchored at witness.test/one" in run.output()
    os.kill(first, signal.SIGKILL)
    run.until("chat restarted", lambda: _chat_pid(db) not in (None, first))
    backlog = read_stored(db)[-1].tree_size
    assert witness.size_of(ORIGIN) == 0
    (lag,) = _api(tmp_path, "/v1/node").json()["witnesses"]
    assert (lag["witness"], lag["cosigned_size"]) == ("witness.test/one", 0)
    assert lag["behind_events"] > 0 and "unreachable" in lag["last_error"]
    status = cli_here("status", tmp_path / "data")
    assert "witness witness.test/one: cosigned size 0," in status.stdout, status.stdout
    assert "witnesses: 0 of 1 cosigned the latest checkpoint (quorum 1: not met)" in status.stdout
    # status --node says the same, and its --json carries /v1/node's witness fields
    # (stop 35's trial: neither had them; fails before)
    node_text = cli_here("status", tmp_path / "data", "--node")
    assert "witnesses: 0 of 1 cosigned the latest checkpoint" in node_text.stdout, node_text
    assert "witness witness.test/one: cosigned size 0," in node_text.stdout
    record = json.loads(cli_here("status", tmp_path / "data", "--node", "--json").stdout)
    validate(record, NODE_SCHEMA)
    (said,) = record["witnesses"]
    assert record["witness_quorum"] == 1
    assert (said["witness"], said["url"], said["cosigned_size"]) == (
        "witness.test/one",
        lag["url"],
        0,
    )
    assert said["behind_events"] > 0 and "unreachable" in said["last_error"]
    metrics = _api(tmp_path, "/metrics").text
    assert 'infervisor_witness_failing{witness="witness.test/one"} 1.0' in metrics

    witness.start()
    run.until("backlog cosigned", lambda: witness.size_of(ORIGIN) >= backlog)
    run.until("cosignature stored", lambda: max(_verified_sizes(db, witness), default=0) >= backlog)
    run.until(
        "the lag gone",
        lambda: _api(tmp_path, "/v1/node").json()["witnesses"][0]["last_error"] is None,
    )
    metrics = _api(tmp_path, "/metrics").text
    assert 'infervisor_witness_cosigned_size{witness="witness.test/one"}' in metrics
    assert "infervisor_witness_last_success_timestamp_seconds" in metrics
    assert run.stop() == 0, run.output()
    # The checkpoint the clean stop signed is cosigned before the node exits.
    final = read_stored(db)[-1].tree_size
    assert witness.size_of(ORIGIN) == final
    assert final in _verified_sizes(db, witness)


def test_a_restored_backup_is_refused_and_the_override_is_recorded(
    runs: Callable[..., NodeRun], tmp_path: Path, fake_llama: str, witness: WitnessDouble
) -> None:
    data = tmp_path / "data"
    db = data / "chain.db"
    config = _config(tmp_path, fake_llama, witness)
    run = runs(config)
    run.until("the boot cosigned", lambda: witness.size_of(ORIGIN) >= 2)
    backup = tmp_path / "old.db"
    assert cli_here("chain", "backup", data, backup).returncode == 0
    old_size = len(events_of(backup))
    run.until("chat running", lambda: _chat_pid(db))
    state = run.until("embed placed", lambda: (s := read_state(db)) and lifecycle(s, "embed") and s)
    embed = by_role(state.instances, "embed")[0]
    assert cli_here("start", data, embed).returncode == 0  # more events, more checkpoints
    run.until("more cosigned", lambda: witness.size_of(ORIGIN) > old_size + 1)
    assert run.stop() == 0, run.output()
    cosigned = witness.size_of(ORIGIN)

    for name in os.listdir(data):
        if name.startswith("chain.db"):
            (data / name).unlink()
    shutil.copy(backup, db)
    checkpoints = read_stored(db)
    refused = runs(config)
    assert refused.wait() == 1, refused.output()  # a finding about the chain (stop 34)
    out = refused.output()
    (line,) = [x for x in out.splitlines() if x.startswith("error:")]
    assert "witness.test/one" in line and f"cosigned size {cosigned}" in line
    assert f"the chain has {old_size} events" in line and "--accept-witness-conflict" in line
    assert "Traceback" not in out
    assert len(events_of(db)) == old_size  # nothing appended
    assert read_stored(db) == checkpoints  # and nothing signed (stop 34)

    resumed = runs(config, "--accept-witness-conflict")
    resumed.until("the node running", lambda: "node n1 running" in resumed.output())
    assert resumed.stop() == 0, resumed.output()
    after = events_of(db)[old_size:]
    assert [e.kind for e in after[:2]] == ["node.witness_override", "node.started"]
    payload = json.loads(after[0].payload)
    assert payload["witness"] == "witness.test/one"
    assert (payload["witness_size"], payload["chain_size"]) == (cosigned, old_size)
    assert payload["flag"] == "--accept-witness-conflict" and payload["reason"]
    assert cli_here("chain", "verify", db).returncode == 0


def test_kill_9_mid_submission_leaves_chain_and_cosignatures_consistent(
    runs: Callable[..., NodeRun], tmp_path: Path, fake_llama: str, witness: WitnessDouble
) -> None:
    db = tmp_path / "data" / "chain.db"
    config = _config(tmp_path, fake_llama, witness, boot_s=2.0)
    witness.hold()  # the witness cosigns, then does not answer
    run = runs(config)
    run.until("node.started", lambda: "node.started" in [e.kind for e in events_of(db)])
    wait_until(witness.holding.is_set, DEADLINE_S, "a submission held")
    run.proc.kill()
    run.proc.wait(timeout=DEADLINE_S)
    witness.release()
    held = witness.size_of(ORIGIN)
    assert held not in _verified_sizes(db, witness)  # the witness has it, the node does not

    again = runs(config)
    again.until(
        "a cosignature from the held size on stored",
        lambda: max(_verified_sizes(db, witness), default=0) >= held,
    )
    again.until("the node running", lambda: "node n1 running" in again.output())
    assert again.stop() == 0, again.output()
    assert cli_here("chain", "verify", db).returncode == 0
    assert len(_verified_sizes(db, witness)) == len(read_lines_by_size(db))  # all verify
