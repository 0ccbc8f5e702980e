"""What the test servers share: llama-server's flags and a llama-protocol handler.

fake_llama.py, http_fault.py and each fault_* program import this module (it
sits beside them, so it is on ``sys.path`` when one runs as a script). The
handler answers ``/health`` as the file ``health`` in the working directory
says: ``ok`` (200, the default), ``fail`` (500), ``loading`` (503 "Loading
model"), ``hang`` (never answers); ``/v1/models`` lists the alias, and a
completion returns one token.
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
NEVER = threading.Event()


def parse_args(
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """llama-server's flags (-m --host --port -c --alias -md) plus a program's own."""
    p = argparse.ArgumentParser()
    p.add_argument("-m", "--model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("-c", "--ctx-size", type=int)
    p.add_argument("--alias", default="model")
    p.add_argument("-md", "--model-draft")
    if extra is not None:
        extra(p)
    return p.parse_args()


def mode(name: str = "health") -> str:
    """The behaviour the file ``name`` in the working directory selects; ``ok`` without it."""
    path = Path(name)
    return path.read_text().strip() if path.exists() else "ok"


def write_pid(name: str, pid: int) -> None:
    """Record a pid in the working directory (atomically: the test polls for it)."""
    Path(f"{name}.tmp").write_text(str(pid))
    Path(f"{name}.tmp").rename(name)


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet handler that replies with JSON (or given bytes) and a Content-Length."""

    def log_message(self, *args: object) -> None:
        pass

    def reply(self, status: int, body: object, ctype: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Handler(JsonHandler):
    """llama-server's health, models and completion endpoints; override to inject faults."""

    alias = "model"

    def health(self) -> None:
        health = mode()
        if health == "hang":
            NEVER.wait()
        elif health == "loading":
            self.reply(503, LOADING)
        elif health == "fail":
            self.reply(500, {"error": {"code": 500, "message": "injected failure"}})
        else:
            self.reply(200, {"status": "ok"})

    def do_GET(self) -> None:
        if self.path == "/health":
            self.health()
        elif self.path == "/v1/models":
            self.reply(200, {"object": "list", "data": [{"id": self.alias, "object": "model"}]})
        else:
            self.reply(404, {"error": {"code": 404, "message": "File Not Found"}})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.reply(200, {"choices": [{"text": " fake", "index": 0}], "model": self.alias})


def listen(host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """A server on ``host:port`` (0: the kernel picks); its request threads are daemons."""
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def serve(args: argparse.Namespace, handler: type[Handler] = Handler, host: str = "") -> None:
    """Listen on ``host`` (default --host) and --port and serve forever."""
    handler.alias = args.alias
    listen(host or args.host, args.port, handler).serve_forever()
