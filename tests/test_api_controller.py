"""A node controller of its own (tests/programs/api_controller.py) drives two
``infervisor run`` nodes over the control API: placements with generations, the
controller lease, and the answers' seq/hash against the chain files.

Each node has one instance of its own config (placed by the node: the lease
never stops it) and a short lease. The controller places two instances on
each node (generation 1) and heartbeats; it goes silent and the lease stops
its instances on both nodes (and only those); it comes back with generation 2
(applied: ``instance.replaced``), starts them again; a stale generation 1 is
answered "ignored" and changes nothing but the ``instance.placement_ignored``
it records. The nodes stop on SIGTERM, their chains verify, and the chain
replayed offline up to the head read live equals the last live listing.

Real processes throughout (the nodes, the controller, fake llama-protocol
servers); synchronisation is by condition and deadline.
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import PROGRAMS, wait_until
from test_run_resume import DEADLINE_S, NodeRun, cli, end_runs, put_model, toml_str

from infervisor.adapters.ports import free_port
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.tools.api.client import ApiClient
from infervisor.tools.api.errors import NodeUnavailable
from infervisor.tools.api.serving.server import ApiServer, socket_path

CONTROLLER = "fleet-ctl"
#: The lease: short, but well over three ticks (health_interval_s 0.1) and many beats.
LEASE_S = 2.0
BEAT_S = 0.2
#: What the live view and the replayed state must agree on.
COMPARED = ("lifecycle", "desired", "generation", "placed_by", "restarts")


# ---------------------------------------------------------------- the nodes
@dataclass
class NodeDir:
    name: str
    node_id: str
    data_dir: Path
    config: Path

    @property
    def db(self) -> Path:
        return self.data_dir / "chain.db"


def node_config(tmp_path: Path, name: str, program: str) -> NodeDir:
    """A node ``n-<name>`` on tmp_path/<name>, with the lease and one instance of its own."""
    data_dir = tmp_path / name
    put_model(data_dir)
    config = tmp_path / f"{name}.toml"
    config.write_text(
        f"""
[node]
node_id = "n-{name}"
data_dir = {toml_str(data_dir)}
llamacpp_program = {toml_str(program)}
health_interval_s = 0.1
reconcile_interval_s = 0.5
stop_grace_s = 5.0
lease_s = {LEASE_S}

[[models]]
name = "tiny"
path = "tiny.gguf"

[[instances]]
role = "own"
flavor = "llamacpp"
model = "tiny"
port = {free_port()}
"""
    )
    return NodeDir(name, f"n-{name}", data_dir, config)


def spec(role: str, port: int) -> dict[str, Any]:
    return {"role": role, "flavor": "llamacpp", "model": "tiny", "port": port}


# ---------------------------------------------------------------- the controller
class Controller:
    """The controller process: one JSON command per line in, one answer per line out."""

    def __init__(self, nodes: list[NodeDir], stderr: Path) -> None:
        argv = [sys.executable, str(PROGRAMS / "api_controller.py"), "--controller", CONTROLLER]
        argv += [f"{n.name}={n.data_dir}" for n in nodes]
        self.stderr_path = stderr
        with stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True
            )
        self._lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)

    def ask(self, op: str, **args: Any) -> dict[str, Any]:
        """The whole reply (``ok`` and ``answer`` or ``error``)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        try:
            line = self._lines.get(timeout=DEADLINE_S * 3)
        except queue.Empty:
            pytest.fail(f"the controller did not answer {op}: {self.stderr_path.read_text()}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def do(self, op: str, **args: Any) -> Any:
        """The answer of a command that must succeed."""
        reply = self.ask(op, **args)
        assert reply["ok"], f"{op} {args}: {reply['error']}"
        return reply["answer"]

    def quit(self) -> int:
        self.do("quit")
        return self.proc.wait(timeout=DEADLINE_S)

    def kill(self) -> None:
        """Teardown: end the process (if a failed test left it going), close the pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join(DEADLINE_S)  # it ends at the end of the output
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


# ---------------------------------------------------------------- the chain
def row_at(db: Path, seq: int) -> tuple[str, str, str]:
    """(kind, subject, hash hex) of the row at ``seq``, read with sqlite3 alone."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        found = con.execute("SELECT kind, subject, hash FROM events WHERE seq = ?", (seq,))
        row = found.fetchone()
    assert row is not None, f"{db}: no row at seq {seq}"
    return str(row[0]), str(row[1] or ""), bytes(row[2]).hex()


def rows_after(db: Path, seq: int) -> list[tuple[int, str, str, dict[str, Any]]]:
    """(seq, kind, subject, payload) of every row after ``seq``."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        found = con.execute(
            "SELECT seq, kind, subject, payload FROM events WHERE seq > ? ORDER BY seq", (seq,)
        ).fetchall()
    return [(q, k, s or "", json.loads(bytes(p))) for q, k, s, p in found]


class Answers:
    """Every answer carrying seq/hash, with the node it came from, checked at the end."""

    def __init__(self) -> None:
        self.seen: list[tuple[NodeDir, str, dict[str, Any]]] = []

    def keep(self, node: NodeDir, what: str, answer: dict[str, Any]) -> dict[str, Any]:
        self.seen.append((node, what, answer))
        return answer

    def check_against_chains(self) -> None:
        for node, what, answer in self.seen:
            kind, subject, digest = row_at(node.db, answer["seq"])
            iid = answer.get("instance_id") or answer["instance"]["instance_id"]
            assert digest == answer["hash"], f"{node.name} {what}: row {answer['seq']} {kind}"
            assert subject == iid, f"{node.name} {what}: row {answer['seq']} is of {subject!r}"


# ---------------------------------------------------------------- fixtures
@pytest.fixture
def two_nodes(tmp_path: Path, fake_llama: str) -> Iterator[tuple[list[NodeDir], list[NodeRun]]]:
    nodes = [node_config(tmp_path, name, fake_llama) for name in ("a", "b")]
    runs = [NodeRun(n.config, tmp_path / f"run-{n.name}.log") for n in nodes]
    yield nodes, runs
    for node, run in zip(nodes, runs, strict=True):
        end_runs([run], node.db)


@pytest.fixture
def controller(
    tmp_path: Path, two_nodes: tuple[list[NodeDir], list[NodeRun]]
) -> Iterator[Controller]:
    ctl = Controller(two_nodes[0], tmp_path / "controller.err")
    yield ctl
    ctl.kill()


# ---------------------------------------------------------------- helpers
def views(ctl: Controller, node: NodeDir) -> dict[str, dict[str, Any]]:
    """The node's instances as the controller lists them, by id."""
    return {v["instance_id"]: v for v in ctl.do("list", node=node.name)}


def until(
    runs: list[NodeRun], what: str, predicate: Callable[[], Any], timeout: float = DEADLINE_S
) -> Any:
    """``predicate`` within the deadline while every node runs (``NodeRun.until`` on all)."""

    def check() -> Any:
        for run in runs:
            if run.proc.poll() is not None:
                pytest.fail(f"a node exited {run.proc.returncode} waiting for {what}")
        return predicate()

    return runs[0].until(what, check, timeout)


def node_open(node: NodeDir) -> bool:
    """The node's API answers and the node is open.

    The socket is first tried with a socket of our own: httpcore 1.0.9 leaks the
    AF_UNIX socket of a failed connect (``SyncBackend.connect_unix_socket`` does
    not close it), so ``ApiClient`` is only used once the socket accepts.
    """
    with contextlib.closing(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)) as probe:
        try:
            probe.connect(str(socket_path(node.data_dir)))
        except OSError:
            return False
    with ApiClient(data_dir=node.data_dir, timeout_s=5.0) as client:
        try:
            return client.node().phase == "open"
        except NodeUnavailable:
            return False


def live_snapshot(ctl: Controller, node: NodeDir) -> tuple[int, dict[str, dict[str, Any]]]:
    """(head seq, listing) with no event between the two reads of the head."""

    def read() -> tuple[int, dict[str, dict[str, Any]]] | None:
        before = ctl.do("node", node=node.name)["head_seq"]
        listed = views(ctl, node)
        after = ctl.do("node", node=node.name)["head_seq"]
        return (after, listed) if after == before else None

    snapshot: tuple[int, dict[str, dict[str, Any]]] = wait_until(
        read, DEADLINE_S, f"{node.name}: a listing with no event during it"
    )
    return snapshot


def replayed_until(node: NodeDir, seq: int) -> dict[str, dict[str, Any]]:
    """The chain's instances as ``infervisor replay --until SEQ --json`` prints them."""
    done = cli("replay", node.data_dir, "--until", seq, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    state = json.loads(done.stdout)
    instances: dict[str, dict[str, Any]] = state["instances"]
    return instances


def compared(inst: dict[str, Any]) -> dict[str, Any]:
    return {k: inst[k] for k in COMPARED}


# ---------------------------------------------------------------- the scenario
def test_a_controller_process_drives_two_nodes_through_the_lease(
    two_nodes: tuple[list[NodeDir], list[NodeRun]], controller: Controller
) -> None:
    nodes, runs = two_nodes
    ctl = controller
    answers = Answers()
    until(runs, "both nodes open", lambda: all(node_open(n) for n in nodes))
    own: dict[str, str] = {}
    for node in nodes:

        def own_running(n: NodeDir = node) -> str | None:
            vs = views(ctl, n)
            running = [
                i for i, v in vs.items() if v["role"] == "own" and v["lifecycle"] == "running"
            ]
            return running[0] if len(vs) == 1 and running else None

        own[node.name] = until(runs, f"{node.name}: its own instance running", own_running)

    # Generation 1: placed and started on both nodes, heartbeats going.
    ctl.do("beat", every_s=BEAT_S)
    placed: dict[str, list[str]] = {n.name: [] for n in nodes}
    ports: dict[tuple[str, str], int] = {}
    for node in nodes:
        for role in ("work", "side"):
            ports[node.name, role] = free_port()
            got = ctl.do(
                "place",
                node=node.name,
                spec=spec(role, ports[node.name, role]),
                generation=1,
                start=True,
            )
            answers.keep(node, f"place {role} g1", got)
            assert (got["outcome"], got["generation"]) == ("applied", 1), got
            assert got["instance"]["placed_by"] == CONTROLLER
            placed[node.name].append(got["instance_id"])

    def all_running(node: NodeDir) -> Any:
        vs = views(ctl, node)
        return all(vs[i]["lifecycle"] == "running" for i in [*placed[node.name], own[node.name]])

    for node in nodes:
        until(
            runs, f"{node.name}: the controller's instances running", lambda n=node: all_running(n)
        )

    # Silence: the lease expires; the controller's instances stop, the nodes' own run on.
    beats = ctl.do("silence")
    assert beats["beats"] > 0 and beats["failures"] == [], beats

    def lease_stopped(node: NodeDir) -> Any:
        vs = views(ctl, node)
        mine = [vs[i] for i in placed[node.name]]
        return all(v["lifecycle"] == "stopped" for v in mine) and vs

    for node in nodes:
        vs = until(
            runs,
            f"{node.name}: the lease stops the controller's instances",
            lambda n=node: lease_stopped(n),
            timeout=DEADLINE_S + LEASE_S,
        )
        for iid in placed[node.name]:
            assert vs[iid]["desired"] == "stopped", vs[iid]
            assert "lease" in vs[iid]["reason"], f"{iid}: reason {vs[iid]['reason']!r}"
        assert (vs[own[node.name]]["lifecycle"], vs[own[node.name]]["desired"]) == (
            "running",
            "running",
        ), vs[own[node.name]]
        stops = [(s, p) for _, k, s, p in rows_after(node.db, 0) if k == "instance.stop_requested"]
        assert sorted(s for s, _ in stops) == sorted(placed[node.name]), stops
        assert all(p["by"] == f"lease:{CONTROLLER}" for _, p in stops), stops

    # Generation 2: the controller is back; placed again (replaced), then started.
    ctl.do("beat", every_s=BEAT_S)
    for node in nodes:
        for role, iid in zip(("work", "side"), placed[node.name], strict=True):
            got = ctl.do(
                "place", node=node.name, spec=spec(role, ports[node.name, role]), generation=2
            )
            answers.keep(node, f"place {role} g2", got)
            assert (got["instance_id"], got["outcome"], got["generation"]) == (iid, "applied", 2)
            assert row_at(node.db, got["seq"])[0] == "instance.replaced", got
            assert got["instance"]["lifecycle"] == "stopped"  # a placement starts nothing
            started = ctl.do("start", node=node.name, instance=iid)
            answers.keep(node, f"start {role} g2", started)
    for node in nodes:
        until(runs, f"{node.name}: generation 2 running", lambda n=node: all_running(n))
        for iid in placed[node.name]:
            view = ctl.do("status", node=node.name, instance=iid)
            assert (view["generation"], view["placed_by"], view["desired"]) == (
                2,
                CONTROLLER,
                "running",
            ), view

    # A stale placement (generation 1): ignored, recorded, nothing else changes.
    for node in nodes:
        head, before = live_snapshot(ctl, node)
        iid = placed[node.name][0]
        got = ctl.do(
            "place", node=node.name, spec=spec("work", ports[node.name, "work"]), generation=1
        )
        answers.keep(node, "place work g1 (stale)", got)
        assert (got["instance_id"], got["outcome"], got["generation"]) == (iid, "ignored", 2)
        kind, _, _ = row_at(node.db, got["seq"])
        assert kind == "instance.placement_ignored", got
        new = [
            (k, s, {f: p[f] for f in ("placed_by", "generation", "current")})
            for _, k, s, p in rows_after(node.db, head)
            if k != "node.lease_renewed"
        ]
        assert new == [
            (
                "instance.placement_ignored",
                iid,
                {"placed_by": CONTROLLER, "generation": 1, "current": 2},
            ),
        ], new
        after = views(ctl, node)
        assert {i: compared(v) for i, v in after.items()} == {
            i: compared(v) for i, v in before.items()
        }
        assert after[iid]["generation"] == 2 and after[iid]["placed_by"] == CONTROLLER

    # Every answer agrees with its node's chain file.
    answers.check_against_chains()

    # The last live listing, and the head it was read at, before the shutdown.
    live = {n.name: live_snapshot(ctl, n) for n in nodes}
    # The controller beats on until both nodes are down: a lease lapsing before
    # a node's shutdown begins (the first node's may take a while under load)
    # would rightly stop the controller's instances there.
    for run in runs:
        assert run.stop() == 0, run.output()
    ctl.do("silence")
    assert ctl.quit() == 0
    for node in nodes:
        verified = cli("chain", "verify", node.data_dir)
        assert verified.returncode == 0, verified.stdout + verified.stderr
        head, listed = live[node.name]
        replayed = replayed_until(node, head)
        assert {i: compared(v) for i, v in replayed.items()} == {
            i: compared(v) for i, v in listed.items()
        }, node.name
        # No node runs: `status --json` replays the whole chain, the shutdown's stops
        # included: every instance stopped, still wanted as it was, placer and generation kept.
        offline = cli("status", node.data_dir, "--json")
        assert offline.returncode == 0, offline.stdout + offline.stderr
        shown = {v["instance_id"]: v for v in json.loads(offline.stdout)}
        assert set(shown) == set(listed)
        for iid, v in shown.items():
            was = listed[iid]
            assert v["source"] == "chain", v
            assert v["lifecycle"] == "stopped", v
            kept = ("desired", "generation", "placed_by", "restarts")
            assert {k: v[k] for k in kept} == {k: was[k] for k in kept}, iid


# ---------------------------------------------------------------- who placed it again
def test_a_placement_again_is_recorded_as_its_caller(
    nodes: Any, fake_llama: str, fake_model: Path
) -> None:
    """In process (a Node with its API served): the placed row and the rows of the
    same caller placing it again (newer, then stale) carry the same source."""
    settings = nodes.settings(fake_llama, fake_model)
    Path(settings.data_dir).mkdir(parents=True)
    server = ApiServer.listen(Path(settings.data_dir), settings.chain_path, settings.node_id)
    try:
        node = nodes.open(settings)
        node.registry.adopt("tiny", fake_model / "tiny.gguf")
        server.serve(node)
        spec = InstanceSpec(role="work", flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
        with ApiClient(data_dir=settings.data_dir, timeout_s=DEADLINE_S) as client:
            answers = [client.place(spec, controller=CONTROLLER, generation=g) for g in (1, 2, 1)]
        server.stopping()
        node.shutdown()
    finally:
        server.close()
    assert [a.outcome for a in answers] == ["applied", "applied", "ignored"]
    rows = {q: (k, src) for q, k, src in sources(settings.chain_path)}
    kinds = [rows[a.seq][0] for a in answers]
    assert kinds == ["instance.placed", "instance.replaced", "instance.placement_ignored"]
    placed_source = rows[answers[0].seq][1]
    assert placed_source.startswith("controller:"), placed_source
    assert [rows[a.seq][1] for a in answers] == [placed_source] * 3


def sources(db: Path) -> list[tuple[int, str, str]]:
    """(seq, kind, source) of every row."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        found = con.execute("SELECT seq, kind, source FROM events ORDER BY seq").fetchall()
    return [(int(q), str(k), str(s)) for q, k, s in found]


def test_a_verb_naming_a_controller_is_the_controllers(
    nodes: Any, fake_llama: str, fake_model: Path
) -> None:
    """A start naming the controller is recorded as the controller's (it does not
    reset the restart budget); one without is the operator's."""
    settings = nodes.settings(fake_llama, fake_model)
    Path(settings.data_dir).mkdir(parents=True)
    server = ApiServer.listen(Path(settings.data_dir), settings.chain_path, settings.node_id)
    try:
        node = nodes.open(settings)
        node.registry.adopt("tiny", fake_model / "tiny.gguf")
        server.serve(node)
        spec = InstanceSpec(role="work", flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
        with ApiClient(data_dir=settings.data_dir, timeout_s=DEADLINE_S) as client:
            iid = client.place(spec, controller=CONTROLLER, generation=1).instance_id
            by_controller = client.start(iid, controller=CONTROLLER)
            client.stop(iid, grace_s=1.0, controller=CONTROLLER)
            by_operator = client.start(iid)
            client.stop(iid, grace_s=1.0)
            # A placement retried with start (its first start cut off) starts it.
            again = client.place(spec, controller=CONTROLLER, generation=1, start=True)
            client.stop(iid, grace_s=1.0, controller=CONTROLLER)
        server.stopping()
        node.shutdown()
    finally:
        server.close()
    starts = [
        (src, json.loads(payload)["reset_budget"])
        for kind, src, payload in payloads(settings.chain_path)
        if kind == "instance.starting"
    ]
    assert [(src.partition(":")[0], reset) for src, reset in starts] == [
        ("controller", False),
        ("operator", True),
        ("controller", False),
    ], starts
    assert (again.outcome, again.started, again.start_error) == ("unchanged", True, None)
    assert by_controller.seq < by_operator.seq
    renewals = [
        src for kind, src, _ in payloads(settings.chain_path) if kind == "node.lease_renewed"
    ]
    assert all(src == "controller" for src in renewals), renewals


def payloads(db: Path) -> list[tuple[str, str, bytes]]:
    """(kind, source, payload) of every row, in seq order."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        found = con.execute("SELECT kind, source, payload FROM events ORDER BY seq").fetchall()
    return [(str(k), str(s), bytes(p)) for k, s, p in found]
