"""``chain pull`` of a 200,000-event chain over the node's API, beside ``chain export``.

Builds a chain of ``--events`` events (default 200,000) with the chain's own
writer in transactions of 10,000 and signs one checkpoint at the end, serves
it on loopback TCP with the node's API server (a read token), then times:

- **chain pull**: a first, full pull into a new folder (every entry bundle and
  level-0 tile fetched over HTTP, every event re-hashed and linked, the root
  checked, committed in one transaction);
- **chain pull, nothing new**: a second run (the checkpoint and one consistency
  check);
- **chain pull, own process**: the full pull again by ``infervisor chain pull``
  in a process of its own (the two above share this process, and its GIL,
  with the server);
- **chain export**: the same chain written as a bundle directory (local, no
  network, no verification), for scale.

Printed: seconds and events/s of each, and pull / export in time.

Run: ``python bench/chain_pull.py [--events 200000]`` (~1 min).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _harness import free_port, workdir
from chain_append import drafts  # the same realistic instance.exited rows

from infervisor.chain import SqliteChain
from infervisor.chain.bundle import export_bundle
from infervisor.chain.checkpoint import load_or_create_signer
from infervisor.chain.checkpoint_store import Checkpointer
from infervisor.tools.api.auth import TcpAddress, load_or_create_tokens
from infervisor.tools.api.scopes import ApiToken, Scope
from infervisor.tools.api.serving.server import ApiServer
from infervisor.tools.audit.chain_pull import pull

NODE = "bench-node"


def build(data: Path, events: int) -> int:
    """A chain of `events` events and one checkpoint; returns its size."""
    data.mkdir()
    signer = load_or_create_signer(data, NODE)
    chain = SqliteChain.open(data / "chain.db", NODE)
    checkpointer = Checkpointer(data / "chain.db", NODE, signer, every_events=10**9)
    left = events - 1
    while left > 0:
        batch = drafts(min(10_000, left))
        checkpointer.observe(chain.append_many(batch))
        left -= len(batch)
    checkpointer.close()
    size = chain.head().seq + 1
    chain.close()
    return size


def timed(what: str, size: int, run: object) -> float:
    start = time.perf_counter()
    run()  # type: ignore[operator]
    took = time.perf_counter() - start
    print(f"{what:28s} {took:8.2f} s  {size / took:12,.0f} events/s")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--events", type=int, default=200_000)
    args = parser.parse_args()
    with workdir("pull") as root:
        data = root / "node"
        t0 = time.perf_counter()
        size = build(data, args.events)
        print(f"built a chain of {size:,} events in {time.perf_counter() - t0:.1f} s")
        port = free_port()
        tokens = load_or_create_tokens(data, [ApiToken(name="auditor", scope=Scope.READ)])
        with ApiServer.listen(
            data, data / "chain.db", NODE, tcp=TcpAddress("127.0.0.1", port), tokens=tokens
        ):
            secret = json.loads((data / "api-tokens.json").read_text())["auditor"]
            url = f"http://127.0.0.1:{port}"
            mirror = root / "mirror"
            command = [str(Path(sys.executable).parent / "infervisor"), "chain", "pull", url]
            env = {**os.environ, "INFERVISOR_TOKEN": secret}

            def cli_pull(folder: Path) -> None:
                subprocess.run([*command, str(folder)], env=env, check=True, capture_output=True)

            pulled = timed("chain pull (full)", size, lambda: pull(url, mirror, token=secret))
            timed("chain pull (nothing new)", size, lambda: pull(url, mirror, token=secret))
            timed("chain pull, own process", size, lambda: cli_pull(root / "mirror2"))
        exported = timed("chain export", size, lambda: export_bundle(data / "chain.db", root / "b"))
        print(f"pull / export in time: {pulled / exported:.1f}x")


if __name__ == "__main__":
    main()
