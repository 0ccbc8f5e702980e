"""Real ``infervisor run`` nodes on loopback for the fleet tests, each with the TCP
API and tokens, and a real ``infervisor fleet serve`` process following them."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, closing
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from fleet_support import FleetNode, write_fleet
from support import free_ports, wait_until
from test_run_resume import INFERVISOR, NodeRun, end_runs, put_model, toml_str

DEADLINE_S = 60.0  # a bound on a hang, never a measurement


@dataclass
class Member:
    """One node: its folder (node.toml, data/), ports and runs."""

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
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def token(self, name: str = "operator") -> str:
        return str(json.loads((self.data / "api-tokens.json").read_text())[name])

    def write(self, program: str, extra: str = "", model: Path | None = None) -> None:
        """node.toml (and the model: `model`'s bytes, else a header-only GGUF)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        put_model(self.data)
        if model is not None:
            shutil.copy(model, self.data / "models" / "tiny.gguf")
        self.config.write_text(
            f"""[api]
tcp = "127.0.0.1:{self.api_port}"
tokens = ["operator", "controller"]

[node]
node_id = "{self.name}"
data_dir = "data"
llamacpp_program = {toml_str(program)}
health_interval_s = 0.2
reconcile_interval_s = 0.5
stop_grace_s = 5.0
checkpoint_every_events = 1
{extra}
[[models]]
name = "tiny"
path = "tiny.gguf"

[[instances]]
role = "chat"
flavor = "llamacpp"
model = "tiny"
port = {self.chat_port}
"""
        )

    def start(self) -> NodeRun:
        run = NodeRun(self.config, self.folder / f"run-{len(self.runs) + 1}.log")
        self.runs.append(run)
        run.until(f"{self.name} answers over TCP", self.answers, DEADLINE_S)
        return run

    def answers(self) -> bool:
        if not (self.data / "api-tokens.json").exists():
            return False
        try:
            got = httpx.get(
                f"{self.url}/v1/node", headers={"authorization": f"Bearer {self.token()}"}
            )
        except httpx.HTTPError:
            return False
        return got.status_code == 200

    def entry(self, keep: Path) -> FleetNode:
        keep.mkdir(parents=True, exist_ok=True)
        pub = keep / f"{self.name}.pub"
        shutil.copy(self.data / "node.pub", pub)
        return FleetNode(self.name, self.url, self.data / "api-tokens.json", pub)

    def end(self) -> None:
        end_runs(self.runs, self.db)


def make_members(root: Path, names: list[str]) -> list[Member]:
    ports = free_ports(2 * len(names))
    return [Member(n, root / n, ports[2 * i], ports[2 * i + 1]) for i, n in enumerate(names)]


def chain_rows(db: Path) -> list[tuple[int, bytes]]:
    """(seq, hash) of every event of a node's chain file."""
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        rows = conn.execute("SELECT seq, hash FROM events ORDER BY seq")
        return [(int(s), bytes(h)) for s, h in rows]


def fleet_rows(store: Path, node: str) -> list[tuple[int, bytes]]:
    """(seq, hash) of every event of `node` the fleet stored."""
    if not store.exists():
        return []
    with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as conn:
        rows = conn.execute("SELECT seq, hash FROM events WHERE node = ? ORDER BY seq", (node,))
        return [(int(s), bytes(h)) for s, h in rows]


class FleetServe:
    """``infervisor fleet serve FLEET.toml --metrics 127.0.0.1:0``, a real process."""

    def __init__(self, fleet: Path) -> None:
        self.log = fleet.parent / "fleet-serve.err"
        with self.log.open("ab") as err:
            self.proc = subprocess.Popen(
                [str(INFERVISOR), "fleet", "serve", str(fleet), "--metrics", "127.0.0.1:0"],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # bounded by the test's timeout
        assert "listening on" in line, (line, self.log.read_text())
        self.metrics_url = line.split("listening on ", 1)[1].strip()

    def metrics(self) -> dict[str, float]:
        """The fleet's samples: 'name{node="n1"}' -> value."""
        text = httpx.get(self.metrics_url, timeout=DEADLINE_S).text
        found = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                found[key] = float(value)
        return found

    def kill(self) -> None:
        """kill -9, then reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=DEADLINE_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def fleet_of(root: Path, members: list[Member], **fleet: object) -> Path:
    return write_fleet(root, [m.entry(root / "keys") for m in members], **fleet)


def converged(store: Path, members: list[Member]) -> bool:
    """The fleet stored exactly each node's chain (same seqs, same hashes)."""
    return all(fleet_rows(store, m.name) == chain_rows(m.db) for m in members)


def running(stack: ExitStack, members: list[Member]) -> Iterator[Member]:
    for m in members:
        stack.callback(m.end)
        yield m


def wait_converged(store: Path, members: list[Member]) -> None:
    wait_until(lambda: converged(store, members), DEADLINE_S, "the fleet has every event")
