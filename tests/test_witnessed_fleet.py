"""Issue 18, "What shows it", end to end: three real nodes and two real witnesses on loopback.

Three ``infervisor run`` (n1, n2, n3: the fake llama-server, a checkpoint per
event, the TCP API with a read token) and two ``infervisor witness run``:
"plain" (consistency only) and "audit" (``--audit``: before cosigning it
mirrors the node's C2SP tlog-tiles over the node's TCP API with the read token,
re-hashes the new events and replays them through the lifecycle rules). One
test, its phases in order (they share the fleet, which takes most of the time):

1. Every node's checkpoints end up cosigned by both witnesses. The node submits
   its newest checkpoint (the consistency proof vouches for the ones before):
   the latest checkpoint each node signed carries both witnesses' cosignatures
   in chain.db (checked with tests/independent_cosignature.py, written from the
   spec), the plain witness serves it at its monitoring path, and ``chain verify
   --witness A --witness B`` says ``anchored: 2 of 2 witnesses at size N``.
2. kill -9 of the plain witness mid-submission (stopped with the node's request
   unread in its socket, then killed): supervision does not wait for it (the
   node's killed server is restarted), and once the witness is back (same port,
   same data dir) the node's backlog is cosigned; witness and node agree.
3. A node restored from an older ``chain backup`` refuses to boot, in one line
   naming the witness, the size it cosigned and the chain's size.
4. A chain rewritten from an early event and re-signed with the node's own
   node.key: the boot's trust policy (the config's witnesses) refuses it, since
   the stored cosignatures no longer verify; with the cosignatures deleted too,
   the witnesses refuse the consistency proof and the boot names the witness.
5. ``chain verify`` without a policy passes (unanchored) the rewrite and a fork
   built with the project's own writer and key; with both witnesses' keys it
   fails them ("rewritten", "forked"). A truncation (events cut and the newest
   checkpoints deleted) is failed with the policy; the witnesses' cosignatures of
   the deleted checkpoints, kept in chain.db, betray it even without one.
6. The audit witness refuses (422, kept, shown by ``infervisor witness status``)
   a checkpoint whose new events break a lifecycle rule: an ``instance.starting``
   of an instance never placed, appended to a stopped node's chain with the
   chain's own writer, signed with node.key and served by the node's API; the
   plain witness cosigns the same checkpoint (it checks consistency only).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from independent_cosignature import CosignatureInvalid, cosigned_by
from support import cli_here, wait_until
from test_chain_trust import _done, _raw, _rehash_from, _resign_all
from test_run_resume import (
    INFERVISOR,
    NodeRun,
    by_role,
    end_runs,
    events_of,
    lifecycle,
    put_model,
    read_state,
    toml_str,
)
from test_witnessing import new_chain
from witness_support import RunningWitness

from infervisor.actors.witness_submit import Outcome, WitnessTarget, submit
from infervisor.actors.witnessing import http_client
from infervisor.adapters.ports import free_port
from infervisor.chain import EventDraft, SqliteChain
from infervisor.chain.checkpoint import load_or_create_signer
from infervisor.chain.checkpoint_store import Checkpointer, read_stored
from infervisor.chain.cosignature import parse_witness_key, with_cosignatures
from infervisor.chain.cosignature_store import read_lines_by_size
from infervisor.chain.witness_protocol import monitoring_path
from infervisor.replay import events as ev
from infervisor.replay import kind_of
from infervisor.tools.api.auth import TcpAddress, load_or_create_tokens
from infervisor.tools.api.serving.server import ApiServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(280)]

DEADLINE_S = 60.0  # a bound on a hang, never a measurement
TOKENS = ["operator", "controller", "witness"]  # "witness": a read token (the default scope)
PLAIN, AUDIT = "witness.test/plain", "witness.test/audit"


@dataclass
class Member:
    """One node of the fleet: its folder (node.toml, data/), ports and current run."""

    name: str
    folder: Path
    api_port: int
    chat_port: int
    runs: list[NodeRun] = field(default_factory=list)

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def db(self) -> Path:
        return self.data / "chain.db"

    @property
    def config(self) -> Path:
        return self.folder / "node.toml"

    @property
    def token(self) -> Path:
        return self.folder / "witness.token"

    @property
    def origin(self) -> str:
        return f"example.com/fleet/{self.name}"  # tests/test_witnessing.py new_chain

    @property
    def vkey(self) -> str:
        return (self.data / "node.pub").read_text().strip()

    @property
    def run(self) -> NodeRun:
        return self.runs[-1]

    def start(self) -> NodeRun:
        run = NodeRun(self.config, self.folder / f"run-{len(self.runs) + 1}.log")
        self.runs.append(run)
        return run


@dataclass
class WitnessProc:
    """A witness's config, port and running process (restartable on the same port)."""

    name: str
    config: Path
    port: int
    flags: tuple[str, ...]
    vkey: str = ""
    running: RunningWitness | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        err = self.config.parent / "witness.err"  # a file: a pipe nobody reads could fill
        with err.open("a") as stderr:
            argv = ["witness", "run", str(self.config), "--listen", f"127.0.0.1:{self.port}"]
            proc = subprocess.Popen(
                [str(INFERVISOR), *argv, *self.flags],
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        assert proc.stdout is not None
        line = proc.stdout.readline()  # bounded by the test's timeout
        assert "listening on" in line, (line, err.read_text())
        self.running = RunningWitness(proc, self.url, self.config, self.config.parent / "wdata")

    def kill(self) -> None:
        """kill -9 (also of a stopped process), then reap it."""
        if self.running is not None:
            if self.running.proc.poll() is None:
                self.running.proc.kill()
            self.running.stop()
            self.running = None

    def status(self) -> dict[str, Any]:
        """`infervisor witness status CONFIG --json`, by origin."""
        ran = cli_here("witness", "status", self.config, "--json")
        assert ran.returncode == 0, ran.stdout + ran.stderr
        return {row["origin"]: row for row in json.loads(ran.stdout)["logs"]}

    @property
    def target(self) -> WitnessTarget:
        return WitnessTarget(self.url, parse_witness_key(self.vkey))


# ---------------------------------------------------------------- setting up
def _ports(count: int) -> list[int]:
    found: set[int] = set()
    for _ in range(count * 100):
        found.add(free_port())
        if len(found) == count:
            return sorted(found)
    raise AssertionError(f"no {count} distinct free ports")


def _prepare(member: Member) -> None:
    """The node's data dir before its first run: model, key (so the witnesses can be
    given its origin and vkey), first checkpoint, and the API tokens with the read
    token the audit witness uses."""
    put_model(member.data)
    new_chain(member.data, member.name)
    load_or_create_tokens(member.data, TOKENS)
    secrets = json.loads((member.data / "api-tokens.json").read_text())
    member.token.write_text(secrets["witness"])


def _witness_config(folder: Path, name: str, members: list[Member], audit: bool) -> Path:
    folder.mkdir(parents=True)
    logs = ""
    for m in members:
        logs += f'\n[[logs]]\norigin = "{m.origin}"\nvkey = "{m.vkey}"\n'
        if audit:
            logs += f'url = "http://127.0.0.1:{m.api_port}"\ntoken_file = {toml_str(m.token)}\n'
    path = folder / "witness.toml"
    path.write_text(
        f'[witness]\nname = "{name}"\nlisten = "127.0.0.1:1"\ndata_dir = "wdata"\n'
        f"read_timeout_s = 5\n{logs}"
    )
    return path


def _node_config(member: Member, program: str, witnesses: list[WitnessProc]) -> None:
    entries = "".join(f'[[witnesses]]\nurl = "{w.url}"\nvkey = "{w.vkey}"\n\n' for w in witnesses)
    member.config.write_text(
        f"""{entries}[api]
tcp = "127.0.0.1:{member.api_port}"
tokens = {json.dumps(TOKENS)}

[node]
node_id = "{member.name}"
data_dir = "data"
llamacpp_program = {toml_str(program)}
health_interval_s = 0.1
reconcile_interval_s = 0.5
stop_grace_s = 5.0
checkpoint_every_events = 1
witness_boot_timeout_s = 30

[[models]]
name = "tiny"
path = "tiny.gguf"

[[instances]]
role = "chat"
flavor = "llamacpp"
model = "tiny"
port = {member.chat_port}
"""
    )


# ---------------------------------------------------------------- reading
def _cosigned(db: Path, vkey: str) -> set[int]:
    """Tree sizes whose stored cosignature of ``vkey`` verifies (independently) against
    the stored checkpoint of that size."""
    notes = {row.tree_size: row.note for row in read_stored(db)}
    found = set()
    for size, lines in read_lines_by_size(db).items():
        try:
            cosigned_by(with_cosignatures(notes[size], lines), vkey)
        except CosignatureInvalid:
            continue
        found.add(size)
    return found


def _chat_pid(db: Path) -> int | None:
    state = read_state(db)
    if state is None or lifecycle(state, "chat") != "running":
        return None
    process = by_role(state.instances, "chat")[1].process
    return None if process is None else int(process.pid)


def _anchored_latest(member: Member, witnesses: list[WitnessProc]) -> int | None:
    """The latest checkpoint's size once chat serves and every witness cosigned it."""
    if _chat_pid(member.db) is None:
        return None
    latest = read_stored(member.db)[-1].tree_size
    if all(latest in _cosigned(member.db, w.vkey) for w in witnesses):
        return latest
    return None


def _verify(where: Path, witnesses: list[WitnessProc]) -> tuple[int, dict[str, Any]]:
    """`chain verify WHERE --json` with ``--witness`` per witness: (exit code, document)."""
    flags = [x for w in witnesses for x in ("--witness", w.vkey)]
    ran = cli_here("chain", "verify", where, "--json", *flags)
    assert "Traceback" not in ran.stderr, ran.stderr
    return ran.returncode, json.loads(ran.stdout)


def _unread_bytes(port: int) -> int:
    """Bytes waiting unread in established TCP sockets whose local port is ``port``."""
    total = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "01":
            total += int(fields[4].split(":")[1], 16)
    return total


def _refusal_line(run: NodeRun) -> str:
    assert run.wait() == 1, run.output()  # a finding about the chain, not usage (stop 34)
    out = run.output()
    assert "Traceback" not in out, out
    (line,) = [x for x in out.splitlines() if x.startswith("error:")]
    return line


def _raw_edit(db: Path, *statements: tuple[str, tuple[int, ...]]) -> None:
    """Run SQL on the chain with its triggers dropped and put back: a root user's edit."""
    conn = _raw(db)
    for sql, args in statements:
        conn.execute(sql, args)
    _done(conn)


def _cut(db: Path, size: int) -> None:
    """Keep events 0..size-1 and the checkpoints up to ``size``."""
    _raw_edit(
        db,
        ("DELETE FROM events WHERE seq >= ?", (size,)),
        ("DELETE FROM checkpoints WHERE tree_size > ?", (size,)),
        ("DELETE FROM checkpoint_frontiers WHERE tree_size > ?", (size,)),
    )


def _copy(member: Member, folder: Path) -> Path:
    """A copy of the stopped node's chain (``chain backup``) beside its key pair."""
    folder.mkdir()
    ran = cli_here("chain", "backup", member.data, folder / "chain.db")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    for name in ("node.key", "node.pub"):
        shutil.copy(member.data / name, folder / name)
    return folder / "chain.db"


def _node_event(reason: str) -> EventDraft:
    event = ev.NodeStopped(reason=reason)
    return EventDraft(
        ts_ns=time.time_ns(),
        source="node",
        kind=kind_of(event),
        subject="",
        payload=ev.encode_event(event),
    )


def _append_signed(data: Path, node: str, drafts: list[EventDraft]) -> None:
    """Append with the chain's own writer, a checkpoint per event signed with node.key."""
    signer = load_or_create_signer(data, node)
    checkpointer = Checkpointer(data / "chain.db", node, signer, every_events=1)
    with SqliteChain.open(data / "chain.db", node) as chain:
        for draft in drafts:
            checkpointer.observe(chain.append_many([draft]))
    checkpointer.close()


# ---------------------------------------------------------------- the fleet
@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[list[Member], list[WitnessProc]]]:
    ports = _ports(8)
    members = [
        Member(f"n{i}", tmp_path / f"n{i}", ports[2 * i - 2], ports[2 * i - 1]) for i in (1, 2, 3)
    ]
    for m in members:
        _prepare(m)
    witnesses = [
        WitnessProc(
            PLAIN, _witness_config(tmp_path / "plain", PLAIN, members, False), ports[6], ()
        ),
        WitnessProc(
            AUDIT, _witness_config(tmp_path / "audit", AUDIT, members, True), ports[7], ("--audit",)
        ),
    ]
    for w in witnesses:
        ran = cli_here("witness", "vkey", w.config)  # creates the witness key
        assert ran.returncode == 0, ran.stderr
        w.vkey = ran.stdout.strip()
    with ExitStack() as stack:
        for w in witnesses:
            stack.callback(w.kill)
        for m in members:
            stack.callback(end_runs, m.runs, m.db)
        yield members, witnesses


def test_a_witnessed_fleet(
    fleet: tuple[list[Member], list[WitnessProc]], tmp_path: Path, fake_llama: str
) -> None:
    members, witnesses = fleet
    plain, audit = witnesses
    for w in witnesses:
        w.start()
    for m in members:
        _node_config(m, fake_llama, witnesses)
        m.start()

    # 1. every node's latest checkpoint is cosigned by both witnesses
    for m in members:
        latest = m.run.until("both cosigned the latest", lambda m=m: _anchored_latest(m, witnesses))
        served = httpx.get(plain.url + monitoring_path(m.origin), timeout=DEADLINE_S)
        assert served.status_code == 200, served.text
        assert int(served.text.split("\n")[1]) >= latest
        cosigned_by(served.text, plain.vkey)  # the independent verifier
        code, doc = _verify(m.data, witnesses)
        assert code == 0 and doc["ok"], doc
        assert doc["anchor"].startswith("anchored: 2 of 2 witnesses at size "), doc
    n1, n2, n3 = members
    backup = tmp_path / "n1-backup.db"
    ran = cli_here("chain", "backup", n1.data, backup)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    backup_size = len(events_of(backup))

    # 2. kill -9 of the plain witness holding a submission; the backlog is cosigned later
    before = max(_cosigned(n1.db, plain.vkey))
    assert plain.running is not None
    plain.running.proc.send_signal(signal.SIGSTOP)
    first = _chat_pid(n1.db)
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: _unread_bytes(plain.port) > 0, DEADLINE_S, "a submission held unread")
    plain.kill()
    n1.run.until("chat restarted", lambda: _chat_pid(n1.db) not in (None, first))
    assert max(_cosigned(n1.db, plain.vkey)) == before
    plain.start()
    latest = n1.run.until("the backlog cosigned", lambda: _anchored_latest(n1, witnesses))
    assert latest > before
    assert plain.status()[n1.origin]["size"] >= latest
    code, doc = _verify(n1.data, witnesses)
    assert code == 0 and doc["anchor"].startswith("anchored: 2 of 2 witnesses"), doc

    for m in members:
        assert m.run.stop() == 0, m.run.output()
    held = {w.name: w.status() for w in witnesses}

    # 3. an older backup restored: refused, naming the witness and both sizes
    for name in os.listdir(n1.data):
        if name.startswith("chain.db"):
            (n1.data / name).unlink()
    shutil.copy(backup, n1.db)
    line = _refusal_line(n1.start())
    assert f"witness {PLAIN} cosigned size {held[PLAIN][n1.origin]['size']} " in line, line
    assert f"the chain has {backup_size} events" in line, line
    assert len(events_of(n1.db)) == backup_size  # nothing appended

    _rewrite_is_refused(n2, witnesses, held[PLAIN][n2.origin]["size"], tmp_path)
    _fork_and_truncation_need_the_policy(n3, witnesses, tmp_path)
    _the_audit_witness_refuses_a_broken_rule(n3, plain, audit)


def _rewrite_is_refused(
    n2: Member, witnesses: list[WitnessProc], cosigned: int, tmp_path: Path
) -> None:
    """4. and 5.: a rewrite re-signed with node.key."""
    seq = next(e.seq for e in events_of(n2.db) if e.kind == "node.started")
    assert seq < cosigned
    _rehash_from(n2.db, seq)
    _resign_all(n2.db, load_or_create_signer(n2.data, n2.name))
    code, doc = _verify(n2.data, [])
    assert code == 0 and doc["anchor"].startswith("unanchored"), doc
    code, doc = _verify(n2.data, witnesses)
    # a cosigned size below the chain's: the evidence cannot tell a rewrite from a fork
    assert code == 1 and doc["checkpoint"]["reason"] in ("rewritten", "forked"), doc
    assert "re-signed after it was cosigned" in doc["checkpoint"]["detail"], doc

    refused = n2.start()  # the boot's trust policy: the config's witnesses
    assert refused.wait() != 0, refused.output()
    assert "re-signed after it was cosigned" in refused.output(), refused.output()
    assert "Traceback" not in refused.output()

    _raw_edit(n2.db, ("DELETE FROM cosignatures", ()))  # the rewriter hides the evidence
    code, doc = _verify(n2.data, witnesses)  # witnesses given, none cosigned: a finding
    assert code == 1 and doc["checkpoint"]["reason"] == "witness quorum not met", doc
    assert "0 of 2 needed cosignatures found" in doc["checkpoint"]["detail"], doc
    line = _refusal_line(n2.start())  # the witnesses remember
    size = len(events_of(n2.db))
    assert f"witness {PLAIN} cosigned size {cosigned}, and the chain of {size} events" in line
    assert "rewritten or forked" in line, line


def _fork_and_truncation_need_the_policy(
    n3: Member, witnesses: list[WitnessProc], tmp_path: Path
) -> None:
    """5.: a fork with the project's writer and key; a truncation."""
    cosigned = set.union(*(_cosigned(n3.db, w.vkey) for w in witnesses))
    cut = max(row.tree_size for row in read_stored(n3.db) if row.tree_size < max(cosigned))

    fork = _copy(n3, tmp_path / "fork")
    _cut(fork, cut)
    more = max(cosigned) - cut + 2  # past every cosigned size: each gets a new checkpoint
    _append_signed(fork.parent, n3.name, [_node_event(f"fork {n}") for n in range(more)])
    code, doc = _verify(fork.parent, [])
    assert code == 0 and doc["anchor"].startswith("unanchored"), doc
    code, doc = _verify(fork.parent, witnesses)
    assert code == 1 and doc["checkpoint"]["reason"] == "forked", doc

    truncated = _copy(n3, tmp_path / "truncated")
    _cut(truncated, cut)
    code, doc = _verify(truncated.parent, witnesses)
    assert code == 1 and doc["checkpoint"]["reason"] == "checkpoints deleted", doc
    code, doc = _verify(truncated.parent, [])  # the cosignatures left behind show it too
    assert code == 1 and doc["checkpoint"]["reason"] == "checkpoints deleted", doc


def _the_audit_witness_refuses_a_broken_rule(
    n3: Member, plain: WitnessProc, audit: WitnessProc
) -> None:
    """6.: the audit witness reads the node's new events over its API and refuses."""
    seq = len(events_of(n3.db))
    start = ev.Starting(by="supervisor", attempt=1)
    ghost = EventDraft(
        ts_ns=time.time_ns(),
        source="supervisor",
        kind=kind_of(start),
        subject="ghost-0123abcd-n3",
        payload=ev.encode_event(start),
    )
    _append_signed(n3.data, n3.name, [ghost])
    latest = read_stored(n3.db)[-1]
    assert latest.tree_size == seq + 1
    tokens = load_or_create_tokens(n3.data, TOKENS)
    server = ApiServer.listen(
        n3.data, n3.db, n3.name, tcp=TcpAddress("127.0.0.1", n3.api_port), tokens=tokens
    )
    try:
        with http_client(DEADLINE_S) as client:
            checkpoint = (latest.tree_size, latest.note)
            refused = submit(client, audit.target, n3.db, checkpoint, 0)
            cosigned = submit(client, plain.target, n3.db, checkpoint, 0)
    finally:
        server.close()
    assert refused.outcome is Outcome.INCONSISTENT, refused
    assert f"(422): seq {seq}: instance never placed" in refused.detail, refused  # its reason
    assert cosigned.outcome is Outcome.COSIGNED, cosigned
    row = audit.status()[n3.origin]
    assert row["refused"] == 1 and row["size"] < latest.tree_size, row
    assert row["last_refusal"].startswith(f"seq {seq}: instance never placed"), row
    shown = cli_here("witness", "status", audit.config)
    assert f"1 refused, last: seq {seq}: instance never placed" in shown.stdout, shown.stdout
    assert latest.tree_size in _cosigned(n3.db, plain.vkey)
    assert latest.tree_size not in _cosigned(n3.db, audit.vkey)
    code, doc = _verify(n3.data, [plain])
    assert code == 0 and doc["anchor"] == f"anchored: 1 of 1 witnesses at size {seq + 1:,}", doc
