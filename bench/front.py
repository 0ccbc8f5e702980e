"""The node's OpenAI-compatible front against straight to llama-server (issue 21, item 4).

One node (``infervisor run`` on a generated config with ``[front] listen``)
runs a managed llama.cpp server on the project's tiny model; every figure
compares the same requests sent to that server directly and through the front,
interleaved in one run, so outside load hits both sides alike:

- **time to first token**, p50 and p99: a streamed chat completion, one at a
  time on a kept-alive connection, direct and through the front in turns
  (target: the front adds at most 2 ms);
- **tokens per second with 64 concurrent streams** (each ``--tokens`` tokens,
  ``ignore_eos``), ``--rounds`` rounds in turns, the median round of each side
  (target: the front at least 0.97x), and the median of each round's own
  ratio (its two sides run back to back, so load that drifts between rounds
  moves both); beside it the node process's CPU seconds per
  token over the rounds through the front (the front's cost, which outside
  load does not change as it changes the ratio);
- **a request for a resting model**: a second instance (another copy of the
  tiny model, under its own name) not running; the first request for it
  through the front, to its first token, against the same server started
  directly (the launcher, its ``/health`` polled every 10 ms, then the same
  request) (target: at most the load time plus 50 ms). Between rounds the
  instance is unloaded and placed again (control API, Unix socket), so each
  round starts it from rest; it is placed ``on_demand`` when the node knows
  the field (part R), else not started (the front starts it on demand).

Counting: a chunk is one ``data:`` line of the server-sent stream other than
``[DONE]`` (llama-server sends one per token). The front needs a token: the
``operator`` secret of ``<data_dir>/api-tokens.json``.

``--server-threads N`` gives llama-server ``N`` CPU threads (the instance's
``threads`` key, its ``-t``; default: the launcher's, 2, both cores of the
2-core machine the figures were measured on). Both sides talk to that one
server, so the count applies to both alike; the streams row names it.

``--flush-interval S`` sets ``[front] stream_flush_interval_s`` (default: the
node's, 5 ms; 0 passes each piece of a stream the moment it comes). The direct
side has no such setting: llama-server writes one piece a token.

Run: ``python bench/front.py`` (about 2 minutes; ``--quick`` for a smoke run).
Needs the front (tools/front, ``[front]`` in the config); a node without it
refuses the config, and the script prints the node's log and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
from _harness import free_port, machine, percentile, reaped_children, table, workdir

from infervisor.tools.servers.launcher import DEFAULT_THREADS
from infervisor.tools.servers.tinymodel import generate_tiny_gguf

BIN = Path(sys.executable).parent
INFERVISOR = BIN / "infervisor"
LAUNCHER = BIN / "infervisor-llama-server"
PROMPT = [{"role": "user", "content": "Hello"}]
READY_S = 120.0
#: The direct side's request headers: a new connection per streamed request, as the
#: front opens one upstream per stream (docs/front.md: llama-server closes a
#: connection kept alive after a stream once the next request arrives on it, and
#: a client reusing it gets "Server disconnected without sending a response").
FRESH = {"Connection": "close"}


@dataclass
class Row:
    figure: str
    value: str
    target: str
    met: bool | None

    def cells(self) -> list[object]:
        return [
            self.figure,
            self.value,
            self.target,
            "-" if self.met is None else ("yes" if self.met else "NO"),
        ]


# ---------------------------------------------------------------- the node
@dataclass
class Setup:
    root: Path
    front: str  # http://127.0.0.1:PORT
    direct: str  # the running llama-server
    token: str
    sock: Path
    cold_spec: dict[str, object]
    cold_weights: Path
    node_pid: int
    threads: int | None = None  # llama-server's -t; None: the launcher's default


def write_config(
    root: Path,
    ports: tuple[int, int],
    hz: float,
    threads: int | None,
    flush_interval_s: float | None = None,
) -> Path:
    """The node's config: the front on ``ports[0]``, the chat instance on ``ports[1]``
    (``threads = N`` and ``stream_flush_interval_s`` when given)."""
    front_port, hot_port = ports
    models = root / "models"
    models.mkdir()
    for name, seed in (("tiny", 0), ("tiny-cold", 1)):
        generate_tiny_gguf(models / f"{name}.gguf", seed=seed)
    text = f"""
[node]
node_id = "bench"
data_dir = "{root / "data"}"
registry_dir = "{models}"
health_interval_s = {hz}

[api]
tokens = ["operator"]

[front]
listen = "127.0.0.1:{front_port}"
{"" if flush_interval_s is None else f"stream_flush_interval_s = {flush_interval_s}"}

[[models]]
name = "tiny"
path = "tiny.gguf"
format = "gguf"

[[models]]
name = "tiny-cold"
path = "tiny-cold.gguf"
format = "gguf"

[[instances]]
role = "chat"
flavor = "llamacpp"
model = "tiny"
port = {hot_port}
ctx_size = 4096
start = true
"""
    if threads is not None:
        text += f"threads = {threads}\n"
    path = root / "node.toml"
    path.write_text(text)
    return path


@contextmanager
def node(
    root: Path, hz: float, threads: int | None = None, flush_interval_s: float | None = None
) -> Iterator[Setup]:
    front_port, hot_port, cold_port = free_port(), free_port(), free_port()
    config = write_config(root, (front_port, hot_port), hz, threads, flush_interval_s)
    log = (root / "node.log").open("wb")
    proc = subprocess.Popen(
        [str(INFERVISOR), "run", str(config)], stdout=log, stderr=log, start_new_session=True
    )
    try:
        direct = f"http://127.0.0.1:{hot_port}"
        _wait(lambda: _ok(f"{direct}/health"), proc, root, "the chat server")
        tokens = json.loads((root / "data" / "api-tokens.json").read_text())
        front = f"http://127.0.0.1:{front_port}"
        auth = {"Authorization": f"Bearer {tokens['operator']}"}
        _wait(lambda: _running(f"{front}/v1/models", auth), proc, root, "the front")
        cold = {"role": "cold", "flavor": "llamacpp", "model": "tiny-cold", "port": cold_port}
        if threads is not None:
            cold["threads"] = threads
        yield Setup(
            root,
            front,
            direct,
            tokens["operator"],
            root / "data" / "api.sock",
            cold,
            root / "models" / "tiny-cold.gguf",
            proc.pid,
            threads,
        )
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def _ok(url: str, headers: dict[str, str] | None = None) -> bool:
    try:
        return httpx.get(url, headers=headers, timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def _running(url: str, headers: dict[str, str]) -> bool:
    """The front lists the chat instance as running (the node saw it ready)."""
    try:
        r = httpx.get(url, headers=headers, timeout=5)
    except httpx.TransportError:
        return False
    listed = r.json().get("data", []) if r.status_code == 200 else []
    return any(m.get("role") == "chat" and m.get("lifecycle") == "running" for m in listed)


def _wait(ready: object, proc: subprocess.Popen[bytes], root: Path, what: str) -> None:
    deadline = time.monotonic() + READY_S
    while not ready():  # type: ignore[operator]
        if proc.poll() is not None:
            sys.exit(f"the node exited ({proc.returncode}):\n{(root / 'node.log').read_text()}")
        if time.monotonic() > deadline:
            sys.exit(f"{what} not ready in {READY_S:g} s:\n{(root / 'node.log').read_text()}")
        time.sleep(0.05)


def _body(model: str, tokens: int) -> dict[str, object]:
    return {
        "model": model,
        "messages": PROMPT,
        "max_tokens": tokens,
        "stream": True,
        "ignore_eos": True,
    }


# ---------------------------------------------------------------- time to first token
def first_token_s(client: httpx.Client, url: str, model: str) -> float:
    """Seconds from sending the request to its first chunk; reads the stream to its
    end (a client kept alive reuses its connection for the next request)."""
    took = None
    t = time.perf_counter()
    with client.stream("POST", url, json=_body(model, 4)) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}: {r.read()[:500]!r}")
        for line in r.iter_lines():
            if took is None and line.startswith("data:") and "[DONE]" not in line:
                took = time.perf_counter() - t
    if took is None:
        raise RuntimeError(f"{url}: no token")
    return took


ERRORS: dict[str, list[str]] = {"direct": [], "front": []}
"""Requests that failed, per side (each is counted, its first few quoted, and sent again)."""


def counted(side: str, f: Callable[[], float]) -> float:
    """``f()``, sent again (up to 5 times) when it fails; each failure is kept in ERRORS."""
    for _ in range(5):
        try:
            return f()
        except (httpx.HTTPError, RuntimeError) as e:
            ERRORS[side].append(f"{type(e).__name__}: {e}"[:300])
    raise RuntimeError(f"{side}: 5 failures in a row: {ERRORS[side][-1]}")


def ttft(s: Setup, count: int) -> list[Row]:
    auth = {"Authorization": f"Bearer {s.token}"}
    with (
        httpx.Client(timeout=60, headers=FRESH) as direct,
        httpx.Client(timeout=60, headers=auth) as front,
    ):
        sides = {
            "direct": lambda: first_token_s(direct, f"{s.direct}/v1/chat/completions", "tiny"),
            "front": lambda: first_token_s(front, f"{s.front}/v1/chat/completions", "tiny"),
        }
        for side, f in sides.items():  # connect, warm the caches
            for _ in range(5):
                counted(side, f)
        got: dict[str, list[float]] = {"direct": [], "front": []}
        for i in range(count):
            order = ("direct", "front") if i % 2 == 0 else ("front", "direct")
            for side in order:
                got[side].append(counted(side, sides[side]) * 1e3)
    rows = []
    for label, q in (("p50", 0.5), ("p99", 0.99)):
        d, f = percentile(got["direct"], q), percentile(got["front"], q)
        rows.append(
            Row(
                f"time to first token, {label} ({count} each, in turns)",
                f"{f:.2f} ms through the front, {d:.2f} ms direct: +{f - d:.2f} ms",
                "at most 2 ms added",
                f - d <= 2.0,
            )
        )
    return rows


# ---------------------------------------------------------------- 64 streams
async def one_stream(client: httpx.AsyncClient, url: str, tokens: int) -> int:
    chunks = 0
    async with client.stream("POST", url, json=_body("tiny", tokens)) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {r.status_code}: {(await r.aread())[:500]!r}")
        async for line in r.aiter_lines():
            if line.startswith("data:") and "[DONE]" not in line:
                chunks += 1
    return chunks


NODE_CPU: list[tuple[float, float, int]] = []
"""(CPU seconds the node process spent in user mode, in the kernel, tokens) of each
round through the front."""


def cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds process ``pid`` has used: (user, system)."""
    t = psutil.Process(pid).cpu_times()
    return float(t.user), float(t.system)


async def streams_rate(
    base: str, headers: dict[str, str], streams: int, tokens: int, node_pid: int | None = None
) -> float:
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
    async with httpx.AsyncClient(timeout=600, headers=headers, limits=limits) as client:
        url = f"{base}/v1/chat/completions"
        cpu = cpu_s(node_pid) if node_pid else (0.0, 0.0)
        t = time.perf_counter()
        counts = await asyncio.gather(*(one_stream(client, url, tokens) for _ in range(streams)))
        took = time.perf_counter() - t
        if node_pid:
            user, system = cpu_s(node_pid)
            NODE_CPU.append((user - cpu[0], system - cpu[1], sum(counts)))
        return sum(counts) / took


def throughput(s: Setup, streams: int, tokens: int, rounds: int) -> list[Row]:
    auth = {"Authorization": f"Bearer {s.token}"}
    got: dict[str, list[float]] = {"direct": [], "front": []}
    asyncio.run(streams_rate(s.direct, FRESH, streams, 8))  # warm up
    for i in range(rounds):
        order = ("direct", "front") if i % 2 == 0 else ("front", "direct")
        for side in order:
            base, headers = (s.direct, FRESH) if side == "direct" else (s.front, auth)
            pid = s.node_pid if side == "front" else None
            rate = functools.partial(streams_rate, base, headers, streams, tokens, pid)
            got[side].append(counted(side, lambda r=rate: asyncio.run(r())))
    d, f = statistics.median(got["direct"]), statistics.median(got["front"])
    pairs = sorted(a / b for a, b in zip(got["front"], got["direct"], strict=True))
    user, system = sum(u for u, _, _ in NODE_CPU), sum(k for _, k, _ in NODE_CPU)
    cpu, count = user + system, max(sum(n for _, _, n in NODE_CPU), 1)
    return [
        Row(
            f"tokens/s, {streams} concurrent streams ({rounds} rounds each, "
            f"llama-server -t {_threads(s)})",
            f"{f:,.0f}/s through the front = {f / d:.3f}x direct's {d:,.0f}/s",
            ">= 0.97x direct",
            f / d >= 0.97,
        ),
        Row(
            "the same, each round's two sides (run back to back) as a ratio",
            f"median {statistics.median(pairs):.3f}x ({pairs[0]:.3f}x to {pairs[-1]:.3f}x)",
            ">= 0.97x direct",
            statistics.median(pairs) >= 0.97,
        ),
        Row(
            "the node's CPU per token through the front (its rounds; load-independent)",
            f"{cpu * 1e6 / count:.1f} us/token (user {user * 1e6 / count:.1f}, system "
            f"{system * 1e6 / count:.1f}; {cpu:.2f} s for {count:,} tokens)",
            "-",
            None,
        ),
    ]


def _threads(s: Setup) -> str:
    return f"{DEFAULT_THREADS}, the default" if s.threads is None else str(s.threads)


# ---------------------------------------------------------------- a resting model
def control(s: Setup) -> httpx.Client:
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=str(s.sock)), base_url="http://node", timeout=120
    )


PLACED_AS: set[str] = set()
"""How the cold instance was placed: ``on_demand`` (resting; part R) or ``not started``."""


def place_resting(api: httpx.Client, s: Setup) -> str:
    """Place the cold instance not running (on_demand where the node knows it)."""
    for extra, how in (({"on_demand": True}, "on_demand"), ({}, "not started")):
        r = api.post("/v1/instances", json={"spec": {**s.cold_spec, **extra}})
        if r.status_code < 300:
            PLACED_AS.add(how)
            return str(r.json()["instance_id"])
    raise RuntimeError(f"cannot place the cold instance: {r.status_code} {r.text}")


def cold_through_front(s: Setup) -> float:
    auth = {"Authorization": f"Bearer {s.token}"}
    with control(s) as api:
        iid = place_resting(api, s)
        try:
            with httpx.Client(timeout=READY_S, headers=auth) as client:
                return first_token_s(client, f"{s.front}/v1/chat/completions", "tiny-cold")
        finally:
            api.post(f"/v1/instances/{iid}/unload")


def cold_direct(s: Setup) -> float:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    t = time.perf_counter()
    proc = subprocess.Popen(
        [str(LAUNCHER), "-m", str(s.cold_weights), "--port", str(port), "--alias", "tiny-cold"]
        + ([] if s.threads is None else ["-t", str(s.threads)]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        while not _ok(f"{base}/health"):
            if proc.poll() is not None:
                raise RuntimeError("the direct server exited")
            time.sleep(0.01)
        with httpx.Client(timeout=60) as client:
            first_token_s(client, f"{base}/v1/chat/completions", "tiny-cold")
        return time.perf_counter() - t
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def resting(s: Setup, rounds: int) -> list[Row]:
    got: dict[str, list[float]] = {"direct": [], "front": []}
    for i in range(rounds):
        order = ("direct", "front") if i % 2 == 0 else ("front", "direct")
        for side in order:
            cold_start = cold_direct if side == "direct" else cold_through_front
            took = counted(side, functools.partial(cold_start, s))
            got[side].append(took * 1e3)
    d, f = statistics.median(got["direct"]), statistics.median(got["front"])
    return [
        Row(
            f"request for a resting model, to its first token ({rounds} each; placed "
            f"{' and '.join(sorted(PLACED_AS))})",
            f"{f:,.0f} ms through the front; load + first token direct {d:,.0f} ms: "
            f"+{f - d:,.0f} ms",
            "load time + at most 50 ms",
            f - d <= 50,
        )
    ]


# ---------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    ap.add_argument("--streams", type=int, default=64, help="concurrent streams (64)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per stream (64)")
    ap.add_argument(
        "--health-interval",
        type=float,
        default=1.0,
        help="the node's health_interval_s (1.0, its default): how soon it sees a start ready",
    )
    ap.add_argument("--rounds", type=int, default=5, help="64-stream rounds a side (5)")
    ap.add_argument(
        "--server-threads",
        type=int,
        metavar="N",
        help=f"llama-server's CPU threads, both sides (default: the launcher's, {DEFAULT_THREADS})",
    )
    ap.add_argument(
        "--flush-interval",
        type=float,
        metavar="S",
        help="[front] stream_flush_interval_s (default: the node's, 0.005; 0: every piece at once)",
    )
    ap.add_argument(
        "--only",
        choices=("ttft", "streams", "resting"),
        action="append",
        help="run only these figures (repeatable; default all)",
    )
    args = ap.parse_args()
    only = set(args.only or ("ttft", "streams", "resting"))
    count, rounds, cold = (40, 2, 1) if args.quick else (300, args.rounds, 3)
    print(f"# {machine()}", flush=True)
    started = time.monotonic()
    rows: list[Row] = []
    with (
        reaped_children(),
        workdir("front") as root,
        node(root, args.health_interval, args.server_threads, args.flush_interval) as s,
    ):
        rows += ttft(s, count) if "ttft" in only else []
        rows += throughput(s, args.streams, args.tokens, rounds) if "streams" in only else []
        rows += resting(s, cold) if "resting" in only else []
    for side, errors in ERRORS.items():
        rows.append(
            Row(f"failed requests ({side}), each sent again", f"{len(errors)}", "0", not errors)
        )
    print(table(["figure", "measured (in this run)", "target", "met"], [r.cells() for r in rows]))
    for side, errors in ERRORS.items():
        for e in errors[:3]:
            print(f"{side}: {e}")
    load = os.getloadavg()
    print(f"\nload average at the end: {load[0]:.1f}; took {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
