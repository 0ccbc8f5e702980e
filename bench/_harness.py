"""What the benchmarks share: temporary folders, fake servers, a node, tables.

Not a benchmark itself (the leading underscore). Every benchmark runs on
loopback only and ends every process it started: :func:`reaped_children`
wraps a run and kills (and reports) any child process still alive at its end.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import stat
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil

from infervisor.actors.node import Node
from infervisor.actors.settings import NodeSettings
from infervisor.tools.api.client import ApiClient
from infervisor.tools.api.errors import ApiError

REPO = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
FAKE_LLAMA = REPO / "tests" / "programs" / "fake_llama.py"
"""The tests' llama-protocol fake (HTTP/1.0: one connection per request)."""
FAKE_KEEPALIVE = BENCH / "_fake_keepalive.py"
"""The benchmarks' llama-protocol fake (HTTP/1.1 keep-alive, one asyncio loop)."""
MS = 1e6  # ns per ms


@contextlib.contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    """A temporary folder on the same file system as the project's (ext4 here)."""
    with tempfile.TemporaryDirectory(prefix=f"infervisor-bench-{prefix}-") as d:
        yield Path(d)


@contextlib.contextmanager
def reaped_children() -> Iterator[None]:
    """Kill any child process started inside the block and still alive at its end."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    try:
        yield
    finally:
        left = [p for p in me.children(recursive=True) if p.pid not in before]
        live = [p for p in left if _alive(p)]
        for p in live:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(live, timeout=5)
        if live:
            print(f"note: killed {len(live)} process(es) left behind: {[p.pid for p in live]}")


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def make_launcher(directory: Path, script: Path) -> str:
    """An executable that execs ``python script "$@"`` (the pid stays the same)."""
    path = directory / f"launch-{script.stem}"
    path.write_text(f"#!/bin/sh\nexec '{sys.executable}' '{script}' \"$@\"\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def fake_registry(directory: Path) -> Path:
    """A registry folder holding ``tiny.gguf`` (the fake servers never read it)."""
    root = directory / "models"
    root.mkdir()
    (root / "tiny.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0) + bytes(40))
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_listening(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@contextlib.contextmanager
def servers(script: Path, count: int, directory: Path) -> Iterator[list[tuple[int, int]]]:
    """``count`` fake llama servers on loopback; yields (port, pid) pairs; all ended after."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        started = []
        for i in range(count):
            port = free_port()
            cwd = directory / f"server{i}"
            cwd.mkdir()
            argv = [sys.executable, str(script), "--host", "127.0.0.1", "--port", str(port)]
            procs.append(subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL))
            started.append((port, procs[-1].pid))
        for port, _ in started:
            wait_listening(port)
        yield started
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def bench_settings(root: Path, registry: Path, **fields: Any) -> NodeSettings:
    """Node "bench" on ``root/data`` with the models of ``registry``; ``fields`` tune it."""
    return NodeSettings(
        node_id="bench", data_dir=str(root / "data"), registry_dir=str(registry), **fields
    )


@contextlib.contextmanager
def open_node(settings: NodeSettings) -> Iterator[Node]:
    node = Node.open(settings)
    try:
        yield node
    finally:
        node.shutdown()


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1), nearest rank (so p99 of 100 samples is the 99th)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered) - 1e-9)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain fixed-width table: first column left-aligned, the rest right-aligned."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        rest = [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        parts = [r[0].ljust(widths[0]), *rest]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def _cell(v: object) -> str:
    if isinstance(v, float):
        if v == 0 or abs(v) >= 100:
            return f"{v:,.0f}"
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def machine() -> str:
    """One line: CPU count, memory, Python, kernel, and the load average now
    (other work on the machine skews every number here)."""
    mem = psutil.virtual_memory().total / 2**30
    load = os.getloadavg()[0]
    return (
        f"{os.cpu_count()} cpu, {mem:.0f} GiB, Python {sys.version.split()[0]}, "
        f"{os.uname().sysname} {os.uname().release}, load {load:.1f}"
    )


def node_answers(data: Path) -> bool:
    """Whether the node of DATA_DIR ``data`` answers on its control socket (GET /v1/node)."""
    if not (data / "api.sock").exists():
        return False
    try:
        with ApiClient(data, timeout_s=5.0) as client:
            client.node()
    except ApiError:
        return False
    return True
