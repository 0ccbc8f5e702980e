"""`infervisor witness run --audit`: the witness reads a checkpoint's events before cosigning.

The logs are real chains written with the project's own writer
(`SqliteChain.append_many` of real event kinds, as tests/test_chain_audit.py
builds them), their checkpoints signed with a node key; the audit's fetch is
injected in-process (a copy of the test chain) or, for the real process, the
default fetch reading a ``file:`` url of the chain.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from chain_tamper import alter_payload
from support import cli_here
from witness_support import INFERVISOR, witness

from infervisor.chain import EventDraft, SqliteChain
from infervisor.chain.checkpoint import origin_of, sign_checkpoint
from infervisor.chain.checkpoint_store import event_hashes
from infervisor.chain.cosignature import Cosigner
from infervisor.chain.merkle import consistency_proof, leaf_hash, tree_root
from infervisor.chain.note import Signer
from infervisor.chain.witness_protocol import encode_add_checkpoint
from infervisor.replay import events as ev
from infervisor.replay import kind_of
from infervisor.tools.witness.audit import (
    CHAIN_FILE,
    ChainAuditor,
    FetchError,
    fetch_log,
    mirror_folder,
)
from infervisor.tools.witness.config import WitnessedLog
from infervisor.tools.witness.service import Witness
from infervisor.tools.witness.store import WitnessStore

NOW = 1_793_491_200_000_000_000
NODE = "n1"
CHAT = "chat-0123abcd-n1"
SPEC = {"role": "chat", "flavor": "llamacpp", "model": "tiny", "port": 18080}

Step = tuple[str, ev.Event, str]

LAWFUL: list[Step] = [
    ("", ev.NodeStarted(pid=1, boot_id="boot-1", version="0"), "node"),  # 1
    (CHAT, ev.Placed(spec=SPEC, placed_by=NODE), "operator"),  # 2
    (CHAT, ev.Starting(by="operator", reset_budget=True), "operator"),  # 3
    (CHAT, ev.Spawned(pid=10, pgid=10, start_time=1.0, boot_id="boot-1", argv=[]), "node"),
    (CHAT, ev.Ready(), "supervisor"),  # 5
    (CHAT, ev.StopRequested(by="operator:uid=1000(alice)", grace_s=5.0), "operator"),  # 6
    (CHAT, ev.Exited(pid=10, exit_code=0, signal=None, reason="stopped"), "node"),  # 7
]
"""Seq 1..7: CHAT placed, started, serving, then stopped by alice."""

FORBIDDEN: list[Step] = [
    (CHAT, ev.Starting(by="supervisor", attempt=1), "supervisor"),  # 8: after alice's stop
]
MORE_LAWFUL: list[Step] = [
    (CHAT, ev.Starting(by="operator", reset_budget=True), "operator"),
    (CHAT, ev.Unloaded(by="operator"), "operator"),
]


class Node:
    """A node's chain on disk and its checkpoint key."""

    def __init__(self, path: Path, node: str = NODE) -> None:
        self.path = path
        self.node = node
        self.signer = Signer.generate(origin_of(node))
        self._tick = NOW
        with SqliteChain.open(path, node, now_ns=lambda: NOW - 1):
            pass

    @property
    def origin(self) -> str:
        return origin_of(self.node)

    @property
    def vkey(self) -> str:
        return self.signer.verifier.key_string()

    def append(self, steps: list[Step]) -> None:
        drafts = []
        for subject, event, source in steps:
            self._tick += 1_000_000_000
            payload = ev.encode_event(event)
            drafts.append(
                EventDraft(
                    ts_ns=self._tick,
                    source=source,
                    kind=kind_of(event),
                    subject=subject,
                    payload=payload,
                )
            )
        with SqliteChain.open(self.path, self.node) as chain:
            chain.append_many(drafts)

    def hashes(self) -> list[bytes]:
        return self.hashes_of(self.path)

    @staticmethod
    def hashes_of(path: Path) -> list[bytes]:
        conn = sqlite3.connect(path)
        try:
            return event_hashes(conn)
        finally:
            conn.close()

    def request(self, old: int, size: int | None = None) -> bytes:
        hashes = self.hashes()
        n = len(hashes) if size is None else size
        leaves = [leaf_hash(h) for h in hashes]  # an event hash is a leaf's data
        cp = sign_checkpoint(self.signer, n, tree_root(hashes[:n]), hashes[n - 1])
        proof = consistency_proof(leaves, old, n) if 0 < old < n else []
        return encode_add_checkpoint(old, proof, cp.note)

    def log(self, url: str | None = None) -> WitnessedLog:
        return WitnessedLog(self.origin, (self.signer.verifier,), url)


def copying(source: Path) -> object:
    """A fetch that mirrors `source` (the test's chain) into the folder, as a pull would."""

    def fetch(log: WitnessedLog, folder: Path) -> None:
        shutil.copyfile(source, folder / CHAIN_FILE)

    return fetch


def failing(log: WitnessedLog, folder: Path) -> None:
    raise FetchError("connection refused")


def _witness(tmp_path: Path, node: Node, fetch: object) -> Witness:
    (tmp_path / "wdata").mkdir(exist_ok=True)
    store = WitnessStore(tmp_path / "wdata" / "witness.db")
    auditor = ChainAuditor(tmp_path / "wdata", fetch)  # type: ignore[arg-type]
    return Witness(
        Cosigner.generate("w.test/audit"), {node.origin: node.log()}, store, auditor=auditor
    )


def test_lawful_events_are_cosigned_and_new_forbidden_ones_refused_with_the_reason_kept(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path / "chain.db")
    node.append(LAWFUL)
    witness = _witness(tmp_path, node, copying(node.path))
    try:
        assert witness.add_checkpoint(node.request(0)).status == 200  # size 8
        assert (mirror_folder(tmp_path / "wdata", node.origin) / CHAIN_FILE).is_file()
        node.append(FORBIDDEN)
        answer = witness.add_checkpoint(node.request(8))
        assert answer.status == 422
        reason = answer.body.decode()
        assert reason.startswith("seq 8: restart after an operator stop"), reason
        assert "alice" in reason
        held = witness.store.get(node.origin)
        assert held is not None and held.size == 8
        count, last = witness.store.refusal_counts()[node.origin]
        assert count == 1 and last is not None and last.startswith("seq 8")
    finally:
        witness.store.close()


def test_a_rule_broken_below_the_held_size_is_not_refused_again(tmp_path: Path) -> None:
    node = Node(tmp_path / "chain.db")
    node.append(LAWFUL + FORBIDDEN)
    (tmp_path / "wdata").mkdir()
    plain = Witness(
        Cosigner.generate("w.test/audit"),
        {node.origin: node.log()},
        WitnessStore(tmp_path / "wdata" / "witness.db"),
    )
    try:  # cosigned by the witness before it audited: seq 8 is accepted history
        assert plain.add_checkpoint(node.request(0)).status == 200  # size 9
    finally:
        plain.store.close()
    witness = _witness(tmp_path, node, copying(node.path))
    try:
        node.append(MORE_LAWFUL)
        answer = witness.add_checkpoint(node.request(9))
        assert answer.status == 200, answer.body
    finally:
        witness.store.close()


def test_events_that_do_not_make_the_root_are_refused(tmp_path: Path) -> None:
    node = Node(tmp_path / "chain.db")
    node.append(LAWFUL)
    other = Node(tmp_path / "other.db")  # the same kinds, other timestamps: other hashes
    other._tick += 7
    other.append(LAWFUL)
    witness = _witness(tmp_path, node, copying(other.path))
    try:
        answer = witness.add_checkpoint(node.request(0))
        assert answer.status == 422
        assert "the node's events 0..7 make root" in answer.body.decode()
        assert "not the checkpoint's" in answer.body.decode()
    finally:
        witness.store.close()


def test_fewer_events_than_the_checkpoint_are_refused(tmp_path: Path) -> None:
    node = Node(tmp_path / "chain.db")
    node.append(LAWFUL)
    short = tmp_path / "short.db"
    shutil.copyfile(node.path, short)
    node.append(MORE_LAWFUL)
    witness = _witness(tmp_path, node, copying(short))
    try:
        answer = witness.add_checkpoint(node.request(0))
        assert (answer.status, answer.body) == (422, b"the node served 8 of 10 events\n")
    finally:
        witness.store.close()


def tampering(source: Path, seq: int) -> object:
    """A fetch that mirrors `source`, then alters the payload of `seq` in the mirror."""

    def fetch(log: WitnessedLog, folder: Path) -> None:
        shutil.copyfile(source, folder / CHAIN_FILE)
        alter_payload(folder / CHAIN_FILE, seq)

    return fetch


def test_an_event_that_does_not_verify_is_refused(tmp_path: Path) -> None:
    node = Node(tmp_path / "chain.db")
    node.append(LAWFUL + MORE_LAWFUL)
    witness = _witness(tmp_path, node, tampering(node.path, 9))
    try:
        answer = witness.add_checkpoint(node.request(0))
        assert answer.status == 422
        assert answer.body.decode().startswith("seq 9: the node's event does not verify")
    finally:
        witness.store.close()


def test_the_prefix_verified_at_the_held_size_is_not_verified_again(tmp_path: Path) -> None:
    node = Node(tmp_path / "chain.db")
    node.append(LAWFUL)
    fetches = [copying(node.path), tampering(node.path, 3)]

    def fetch(log: WitnessedLog, folder: Path) -> None:
        fetches.pop(0)(log, folder)  # type: ignore[operator]

    witness = _witness(tmp_path, node, fetch)
    try:
        assert witness.add_checkpoint(node.request(0)).status == 200  # size 8, verified
        node.append(MORE_LAWFUL)
        # seq 3 (now altered in the mirror) was verified at size 8: only 8..9 are read
        answer = witness.add_checkpoint(node.request(8))
        assert answer.status == 200, answer.body
    finally:
        witness.store.close()
    # a witness that kept no replay (just restarted) verifies from genesis
    witness = _witness(tmp_path, node, tampering(node.path, 3))
    try:  # the same checkpoint again: a cosigned one is audited again too
        answer = witness.add_checkpoint(node.request(10))
        assert answer.status == 422
        assert answer.body.decode().startswith("seq 3: the node's event does not verify")
    finally:
        witness.store.close()


def test_a_log_that_cannot_be_fetched_or_serves_garbage_is_a_503_not_kept(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path / "chain.db")
    node.append(LAWFUL)
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a chain at all" * 100)
    for fetch in (failing, copying(garbage)):
        witness = _witness(tmp_path, node, fetch)
        try:
            answer = witness.add_checkpoint(node.request(0))
            assert answer.status == 503, answer.body
            assert "try again later" in answer.body.decode()
            assert witness.store.get(node.origin) is None
            assert witness.store.refusal_counts() == {}
        finally:
            witness.store.close()


def test_the_default_fetch_says_what_it_cannot_reach(tmp_path: Path) -> None:
    node = Node(tmp_path / "chain.db")
    with pytest.raises(FetchError, match="no url"):
        fetch_log(node.log(None), tmp_path)
    with pytest.raises(FetchError, match="not a chain file"):
        fetch_log(node.log((tmp_path / "missing.db").as_uri()), tmp_path)
    node.append(LAWFUL)
    (tmp_path / "m").mkdir()
    fetch_log(node.log(tmp_path.as_uri()), tmp_path / "m")  # a data dir holding chain.db
    assert node.hashes() == Node.hashes_of(tmp_path / "m" / CHAIN_FILE)
    (tmp_path / "wdata").mkdir()
    witness = Witness(
        Cosigner.generate("w.test/audit"),
        {node.origin: node.log("http://127.0.0.1:1")},
        WitnessStore(tmp_path / "wdata" / "witness.db"),
        auditor=ChainAuditor(tmp_path / "wdata"),
    )
    try:  # no chain pull in this build, or nothing listening there: transient either way
        assert witness.add_checkpoint(node.request(0)).status == 503
    finally:
        witness.store.close()


def _config(tmp_path: Path, node: Node, url: str | None, audit: str = "") -> Path:
    path = tmp_path / "witness.toml"
    table = f'origin = "{node.origin}"\nvkey = "{node.vkey}"\n'
    if url is not None:
        table += f'url = "{url}"\n'
    path.write_text(
        f'[witness]\nname = "witness.test/audit"\nlisten = "127.0.0.1:1"\n'
        f'data_dir = "wdata"\nread_timeout_s = 5\n{audit}\n[[logs]]\n{table}'
    )
    return path


@pytest.mark.timeout(120)
def test_a_real_audit_witness_cosigns_lawful_events_and_refuses_forbidden_ones(
    tmp_path: Path,
) -> None:
    (tmp_path / "node").mkdir()
    node = Node(tmp_path / "node" / "chain.db")
    node.append(LAWFUL)
    config = _config(tmp_path, node, (tmp_path / "node").as_uri(), "audit = true")
    with witness(config) as running:
        answer = running.post(node.request(0))
        assert answer.status_code == 200, answer.text
        node.append(FORBIDDEN)
        answer = running.post(node.request(8))
        assert answer.status_code == 422
        assert answer.text.startswith("seq 8: restart after an operator stop")
        body = node.request(8)
        (tmp_path / "node" / "chain.db").rename(tmp_path / "node" / "moved.db")
        answer = running.post(body)  # the log cannot be read now: transient
        assert answer.status_code == 503, answer.text
    shown = cli_here("witness", "status", config, "--json")  # in this process
    assert shown.returncode == 0, shown.stderr
    (row,) = json.loads(shown.stdout)["logs"]
    assert row["size"] == 8 and row["refused"] == 1
    assert row["last_refusal"].startswith("seq 8: restart after an operator stop")


@pytest.mark.timeout(120)
def test_audit_refuses_to_start_with_a_log_it_cannot_read(tmp_path: Path) -> None:
    node = Node(tmp_path / "chain.db")
    config = _config(tmp_path, node, None)
    done = subprocess.run(
        [INFERVISOR, "witness", "run", str(config), "--audit", "--listen", "127.0.0.1:1"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2  # a config it cannot use, as any other
    assert "has no url" in done.stderr
    assert "Traceback" not in done.stderr
