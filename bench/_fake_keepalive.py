"""A cheap llama-protocol fake for the benchmarks: HTTP/1.1 keep-alive on one asyncio loop.

Answers ``GET /health`` (200 ``{"status": "ok"}``), ``GET /v1/models`` and
``GET /bench/stats`` (how many /health requests and connections it has seen,
as JSON), so a benchmark can count the probes that really happened. Takes
llama-server's ``--host`` and ``--port``; other flags are ignored. Ends on
SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal

STATS = {"health": 0, "models": 0, "connections": 0}
MODELS = json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model"}]}).encode()
HEALTH = b'{"status":"ok"}'
NOT_FOUND = b'{"error":{"code":404,"message":"File Not Found"}}'


def response(status: int, body: bytes) -> bytes:
    reason = {200: "OK", 404: "Not Found"}[status]
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def answer(path: str) -> bytes:
    if path == "/health":
        STATS["health"] += 1
        return response(200, HEALTH)
    if path == "/v1/models":
        STATS["models"] += 1
        return response(200, MODELS)
    if path == "/bench/stats":
        return response(200, json.dumps(STATS).encode())
    return response(404, NOT_FOUND)


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    STATS["connections"] += 1
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            parts = lines[0].split()
            headers = dict(h.split(":", 1) for h in lines[1:] if ":" in h)
            length = int(next((v for k, v in headers.items() if k.lower() == "content-length"), 0))
            if length:
                await reader.readexactly(length)
            writer.write(answer(parts[1] if len(parts) > 1 else "/"))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    except asyncio.CancelledError:
        pass  # shutting down: end quietly (a fake; nothing awaits this task)
    finally:
        writer.close()


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    args, _ = p.parse_known_args()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await asyncio.start_server(serve, args.host, args.port, backlog=1024)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
