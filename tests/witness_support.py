"""Logs that submit to a witness, and a running `infervisor witness run`, for the witness tests."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from infervisor.adapters.ports import free_port
from infervisor.chain.checkpoint import sign_checkpoint
from infervisor.chain.merkle import consistency_proof, leaf_hash, root_of_hashes
from infervisor.chain.note import Signer, sign_note
from infervisor.chain.witness_protocol import encode_add_checkpoint

INFERVISOR = str(Path(sys.executable).parent / "infervisor")


@dataclass
class Log:
    """A log of random leaves signing its checkpoints, infervisor-style or a plain C2SP one.

    ``node`` set: the four-line infervisor checkpoint (origin infervisor/<node>);
    otherwise a plain three-line tlog-checkpoint with ``origin``.
    """

    origin: str
    node: str | None = None
    signer: Signer = field(init=False)
    leaves: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.signer = Signer.generate(self.origin)

    @property
    def vkey(self) -> str:
        return self.signer.verifier.key_string()

    def grow(self, count: int) -> None:
        self.leaves.extend(leaf_hash(os.urandom(32)) for _ in range(count))

    def note(self, size: int | None = None, signer: Signer | None = None) -> str:
        n = len(self.leaves) if size is None else size
        root = root_of_hashes(self.leaves[:n])
        if self.node is not None and signer is None:
            return sign_checkpoint(self.signer, n, root, self.leaves[n - 1]).note
        text = f"{self.origin}\n{n}\n{base64.b64encode(root).decode()}\n"
        return sign_note(text, signer or self.signer)

    def request(self, old: int, size: int | None = None, signer: Signer | None = None) -> bytes:
        n = len(self.leaves) if size is None else size
        proof = consistency_proof(self.leaves, old, n) if 0 < old < n else []
        return encode_add_checkpoint(old, proof, self.note(n, signer))


@dataclass
class RunningWitness:
    """An `infervisor witness run` process and where it listens."""

    proc: subprocess.Popen[str]
    url: str
    config: Path
    data_dir: Path

    def post(self, body: bytes, timeout: float = 60.0) -> httpx.Response:
        return httpx.post(f"{self.url}/add-checkpoint", content=body, timeout=timeout)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(60)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return code


def write_config(directory: Path, logs: list[Log], name: str = "witness.test/w1") -> Path:
    tables = "".join(f'\n[[logs]]\norigin = "{lg.origin}"\nvkey = "{lg.vkey}"\n' for lg in logs)
    path = directory / "witness.toml"
    path.write_text(
        f'[witness]\nname = "{name}"\nlisten = "127.0.0.1:1"\ndata_dir = "wdata"\n'
        f"read_timeout_s = 5\n{tables}"
    )
    return path


def start_witness(config: Path) -> RunningWitness:
    """Start the witness on a free port; return once it printed that it listens."""
    port = free_port()
    err = config.parent / "witness.err"  # a file: a pipe nobody reads could fill and block it
    with err.open("a") as stderr:
        proc = subprocess.Popen(
            [INFERVISOR, "witness", "run", str(config), "--listen", f"127.0.0.1:{port}"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # bounded by the test's timeout
    assert "listening on" in line, (line, err.read_text())
    return RunningWitness(proc, f"http://127.0.0.1:{port}", config, config.parent / "wdata")


@contextmanager
def witness(config: Path) -> Iterator[RunningWitness]:
    running = start_witness(config)
    try:
        yield running
    finally:
        if running.proc.poll() is None:
            running.proc.kill()
        running.stop()
