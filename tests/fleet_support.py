"""Helpers of the fleet tests: a fleet file, and a chain served by the node's real API.

:class:`ServedChain` serves a chain file (tests/chain_tamper.py makes and
tampers it) with the node's own API server over TCP with a token, without a
node behind it: the routes the fleet reads (events, log checkpoint, proofs)
read the chain file itself, so the file can be tampered between requests.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from chain_tamper import NODE, draft, make_chain

from infervisor.adapters.ports import free_port
from infervisor.chain import SqliteChain
from infervisor.chain.checkpoint import load_signer
from infervisor.chain.checkpoint_store import Checkpointer
from infervisor.tools.api.auth import TcpAddress, load_or_create_tokens
from infervisor.tools.api.serving.server import ApiServer


@dataclass
class FleetNode:
    """One [[nodes]] entry: its name, API URL, token file and node.pub copy."""

    name: str
    url: str
    token_file: Path
    pub: Path


def write_fleet(folder: Path, nodes: list[FleetNode], **fleet: object) -> Path:
    """folder/fleet.toml naming `nodes` (the store in folder/fleet.db)."""
    lines = ["[fleet]", 'store = "fleet.db"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in fleet.items()]
    for n in nodes:
        lines += [
            "",
            "[[nodes]]",
            f'name = "{n.name}"',
            f'url = "{n.url}"',
            f"token_file = {json.dumps(str(n.token_file))}",
            f"pub = {json.dumps(str(n.pub))}",
        ]
    path = folder / "fleet.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


class ServedChain:
    """A chain of node-a in `folder`, served over TCP by the API server (no node)."""

    def __init__(self, folder: Path, events: int) -> None:
        self.folder = folder
        self.path = make_chain(folder, events, every=4)
        load_or_create_tokens(folder, ["operator"])
        self.server = ApiServer.listen(
            folder,
            self.path,
            NODE,
            tcp=TcpAddress("127.0.0.1", free_port()),
            tokens=load_or_create_tokens(folder, ["operator"]),
        )
        self.server.ctx.gate.open(object())  # type: ignore[arg-type]  # no node: reads only
        self.size = events

    def entry(self, name: str, keep: Path) -> FleetNode:
        """Its fleet entry; node.pub copied to `keep` (the fleet's copy, as an operator makes)."""
        keep.mkdir(parents=True, exist_ok=True)
        pub = keep / f"{name}.pub"
        shutil.copy(self.folder / "node.pub", pub)
        assert self.server.url is not None
        return FleetNode(name, self.server.url, self.folder / "api-tokens.json", pub)

    def grow(self, count: int) -> None:
        """Append `count` events and a checkpoint over them (as the node would)."""
        signer = load_signer(self.folder / "node.key")
        with SqliteChain.open(self.path, NODE) as chain:
            cp = Checkpointer(self.path, NODE, signer, every_events=1_000_000, every_s=1e9)
            for n in range(count):
                cp.observe(chain.append_many([draft(self.size + n, "grown")]))
            cp.close()
        self.size += count

    def close(self) -> None:
        self.server.close()
