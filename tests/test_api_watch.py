"""``infervisor watch DATA_DIR --json --from-seq N`` killed at awkward moments
and resumed, across a restart of the node: every event exactly once.

A driver thread keeps making events (start, stop, restart through the API)
while the watcher, the real console script, is killed with SIGKILL right
after it started and after k lines (k random), and restarted with
``--from-seq`` one past the last complete line it printed (a partial last
line is discarded). Once, the node itself is stopped (SIGTERM) and started
again on the same data directory while a watcher runs: the watcher
reconnects by itself. At the end the lines, concatenated, are exactly the
chain's events 0..head, each once, each with the chain's hash.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from test_run_resume import INFERVISOR, NodeRun, end_runs, put_model, toml_str

from infervisor.adapters.ports import free_port
from infervisor.tools.api.client import ApiClient
from infervisor.tools.api.errors import ApiError, NodeUnavailable
from infervisor.tools.api.wire import WatchEvent

SEED = 4242
DEADLINE_S = 60.0  # a bound on a hang, never a measurement: generous at load 10
#: Watcher sessions; the node restarts during the one of this index. Four reach
#: every case once: killed after k lines (0 and 2), killed at once (1), across
#: the node's restart (3); the last watcher then resumes on the new run. (Six
#: sessions only repeated the k-lines case while the driver kept spawning servers.)
SESSIONS = 4
NODE_RESTART_AT = 3


def config_text(program: str, ports: list[int]) -> str:
    """Node n1 with instances w0 and w1 (both started), fake llama servers, quick ticks."""
    entries = "".join(
        f"""
[[instances]]
role = "w{i}"
flavor = "llamacpp"
model = "tiny"
port = {port}
"""
        for i, port in enumerate(ports)
    )
    return f"""
[node]
node_id = "n1"
data_dir = "data"
llamacpp_program = {toml_str(program)}
health_interval_s = 0.05
reconcile_interval_s = 0.2
stop_grace_s = 1.0

[[models]]
name = "tiny"
path = "tiny.gguf"
{entries}"""


class Node:
    """The ``infervisor run`` of the test, which it may restart."""

    def __init__(self, tmp_path: Path, program: str) -> None:
        put_model(tmp_path / "data")
        self.tmp_path = tmp_path
        self.config = tmp_path / "node.toml"
        self.config.write_text(config_text(program, [free_port(), free_port()]))
        self.runs: list[NodeRun] = []

    def start(self) -> NodeRun:
        run = NodeRun(self.config, self.tmp_path / f"run-{len(self.runs) + 1}.log")
        self.runs.append(run)
        run.until("the node running", lambda: "Ctrl-C or SIGTERM stops it" in run.output())
        return run

    @property
    def current(self) -> NodeRun:
        return self.runs[-1]


@pytest.fixture
def node(tmp_path: Path, fake_llama: str) -> Iterator[Node]:
    n = Node(tmp_path, fake_llama)
    try:
        n.start()
        yield n
    finally:
        end_runs(n.runs, tmp_path / "data" / "chain.db")


class Watcher:
    """One ``infervisor watch --json`` subprocess; a thread reads its stdout."""

    def __init__(self, data_dir: Path, from_seq: int, log: Path) -> None:
        self.from_seq = from_seq
        self.log = log
        with log.open("ab") as err:
            self.proc = subprocess.Popen(
                [str(INFERVISOR), "watch", str(data_dir), "--json", "--from-seq", str(from_seq)],
                stdout=subprocess.PIPE,
                stderr=err,
            )
        self.data = bytearray()
        self.cond = threading.Condition()
        self.eof = False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while chunk := os.read(fd, 65536):
            with self.cond:
                self.data += chunk
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def lines_read(self) -> int:
        with self.cond:
            return self.data.count(b"\n")

    def wait_lines(self, k: int, timeout_s: float = DEADLINE_S) -> None:
        """Until ``k`` complete lines came (fails naming the watcher's stderr)."""
        with self.cond:
            ok = self.cond.wait_for(lambda: self.data.count(b"\n") >= k or self.eof, timeout_s)
            got = self.data.count(b"\n")
            if not ok or got < k:
                pytest.fail(
                    f"watcher from seq {self.from_seq}: {got} lines, "
                    f"wanted {k} (exited {self.proc.poll()}); stderr:\n{self.log.read_text()}"
                )

    def wait_seq(self, seq: int, timeout_s: float = DEADLINE_S) -> None:
        """Until the last complete line is event ``seq``."""

        def reached() -> bool:
            events = decode(bytes(self.data))
            return bool(events) and events[-1].seq >= seq

        with self.cond:
            if not self.cond.wait_for(lambda: reached() or self.eof, timeout_s) or not reached():
                pytest.fail(
                    f"watcher did not reach seq {seq} (exited {self.proc.poll()}); "
                    f"stderr:\n{self.log.read_text()}"
                )

    def kill(self) -> list[WatchEvent]:
        """SIGKILL it; the events of its complete lines (a partial last line dropped)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=DEADLINE_S)
        self.reader.join(timeout=DEADLINE_S)
        assert not self.reader.is_alive()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return decode(bytes(self.data))


def decode(data: bytes) -> list[WatchEvent]:
    """The events of the complete lines of ``data`` (what follows the last newline is partial)."""
    complete = data[: data.rfind(b"\n") + 1]
    return [msgspec.json.decode(line, type=WatchEvent) for line in complete.splitlines()]


class Driver:
    """Makes events all the time: start, stop, restart of the instances through the API."""

    def __init__(self, data_dir: Path, ids: list[str]) -> None:
        self.data_dir, self.ids = data_dir, ids
        self.done = threading.Event()
        self.node_up = threading.Event()
        self.node_up.set()
        self.verbs = 0
        self.unavailable = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        rng = random.Random(SEED)
        try:
            while not self.done.is_set():
                self.node_up.wait(DEADLINE_S)
                iid = rng.choice(self.ids)
                verb = rng.choice(["start", "stop", "restart"])
                with ApiClient(data_dir=self.data_dir, timeout_s=30.0) as client:
                    try:
                        if verb == "start":
                            client.start(iid)
                        elif verb == "stop":
                            client.stop(iid, 0.1)
                        else:
                            client.restart(iid)
                        self.verbs += 1
                    except NodeUnavailable:
                        self.unavailable += 1  # the node restarting: wait for node_up
                        self.done.wait(0.05)
                    except ApiError as e:
                        if e.status != 409:
                            raise
        except BaseException as e:
            self.error = e

    def stop(self) -> None:
        self.done.set()
        self.node_up.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error


def chain_hashes(db: Path) -> dict[int, str]:
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        return {seq: bytes(h).hex() for seq, h in con.execute("SELECT seq, hash FROM events")}


def settled_head(client: ApiClient) -> int | None:
    """The chain head, once every instance is running and up or stopped, and
    the head did not move while the views were read."""
    head = client.node().head_seq
    views = client.list()
    if client.node().head_seq != head:
        return None
    for v in views:
        if v.desired == "running" and (v.lifecycle, v.health) != ("running", "up"):
            return None
        if v.desired == "stopped" and v.lifecycle != "stopped":
            return None
    return head


@pytest.mark.slow
def test_watch_killed_and_resumed_across_a_node_restart_sees_every_event_once(
    node: Node, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    rng = random.Random(SEED)
    with ApiClient(data_dir=data_dir) as client:
        ids = [v.instance_id for v in client.list()]
    assert len(ids) == 2
    driver = Driver(data_dir, ids)
    t0 = time.monotonic()
    seen: list[WatchEvent] = []
    kills: list[tuple[int, int]] = []  # (from_seq, lines kept) per session
    reconnected = False
    try:
        for session in range(SESSIONS):
            from_seq = seen[-1].seq + 1 if seen else 0
            watcher = Watcher(data_dir, from_seq, tmp_path / f"watch-{session}.err")
            if session == 1:
                got = watcher.kill()  # at once, before any output (most likely)
            elif session == NODE_RESTART_AT:
                watcher.wait_lines(rng.randint(1, 5))
                driver.node_up.clear()
                assert node.current.stop() == 0, node.current.output()
                node.start()
                driver.node_up.set()
                # Events of the new run reach the watcher without a restart of it.
                with ApiClient(data_dir=data_dir) as client:
                    head = client.node().head_seq
                watcher.wait_seq(head)
                assert watcher.proc.poll() is None, watcher.log.read_text()
                got = watcher.kill()
                # One process saw the first run end and the second begin: it reconnected.
                kinds = [e.kind for e in got]
                reconnected = "node.stopped" in kinds and "node.started" in kinds
            else:
                watcher.wait_lines(rng.randint(1, 30))
                got = watcher.kill()
            if got:
                assert got[0].seq == from_seq, f"session {session} from {from_seq}: {got[0].seq}"
            kills.append((from_seq, len(got)))
            seen.extend(got)
        driver.stop()

        with ApiClient(data_dir=data_dir) as client:
            head = node.current.until("the node settled", lambda: settled_head(client))
        last = Watcher(data_dir, seen[-1].seq + 1, tmp_path / "watch-last.err")
        try:
            if seen[-1].seq < head:  # the last session may have read up to the head already
                last.wait_seq(head)
        finally:
            seen.extend(last.kill())
    finally:
        if not driver.done.is_set():
            driver.done.set()
            driver.node_up.set()
            driver.thread.join(timeout=60)

    took = time.monotonic() - t0
    print(f"sessions (from_seq, lines): {kills}; head {head}; verbs {driver.verbs}; {took:.1f} s")
    assert reconnected, "the watcher running across the node restart did not see both runs"
    seqs = [e.seq for e in seen]
    assert seqs == list(range(head + 1)), "watched seqs are not 0..head each once"
    hashes = chain_hashes(data_dir / "chain.db")
    for e in seen:
        assert e.hash == hashes[e.seq], f"seq {e.seq}: line hash {e.hash}, chain {hashes[e.seq]}"
    for before, after in itertools.pairwise(seen):
        assert after.prev_hash == before.hash, f"seq {after.seq}: prev_hash does not link"
    node_runs = {e.kind for e in seen}
    assert {"node.started", "node.stopped"} <= node_runs
    assert sum(e.kind == "node.started" for e in seen) == 2  # both runs watched
    assert driver.verbs > 0
    assert node.current.stop() == 0, node.current.output()


def test_watch_gives_up_after_retry_for_without_a_node(tmp_path: Path) -> None:
    """No node on the data directory: reconnecting stops after --retry-for, exit 3,
    and it never claims to have reconnected."""
    (tmp_path / "data").mkdir()
    argv = [str(INFERVISOR), "watch", str(tmp_path / "data"), "--json", "--retry-for", "1"]
    for extra in ([], ["--from-seq", "0"]):
        try:
            done = subprocess.run(
                [*argv, *extra], capture_output=True, text=True, timeout=15, check=False
            )
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode() if isinstance(e.stderr, bytes) else str(e.stderr)
            pytest.fail(f"watch {extra} still retrying after 15 s (--retry-for 1):\n{err[:600]}")
        assert done.returncode == 3, done.stderr
        assert "reconnected" not in done.stderr, done.stderr
        # --json: the refusal is the error object on stdout, as every command's.
        assert json.loads(done.stdout)["error"]["code"] == "no_node", done.stdout
