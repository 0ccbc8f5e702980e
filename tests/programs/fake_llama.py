"""A small server speaking llama-server's health and model protocol, with one
behaviour switch, for the supervisor's fast tests (the real llama.cpp server is
tested in tests/test_llamacpp_real.py).

Takes llama-server's flags (-m, --host, --port, -c, --alias, -md). Each
/health answer is chosen by the file ``health`` in the working directory when
it exists: ``ok`` (200), ``loading`` (503 "Loading model", nested form),
``fail`` (500), ``hang`` (never answers). Default: ``ok``. With
``FAKE_EXIT_AFTER`` (seconds) in its environment it exits by itself then, with
``FAKE_EXIT_CODE`` (default 0): a one-shot run.

Each completion (any POST) is chosen by the file ``completions`` in the
working directory the same way: ``ok`` (200, the token ``" fake"``) or
``fail`` (500, llama-server's error shape). Flags of its own:
``--really-bind HOST`` listens on HOST whatever ``--host`` says (a server
that ignores the address it was given, e.g. ``0.0.0.0``); ``--version``
prints a version line and exits 0, as llama-server does.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}


def mode(name: str = "health") -> str:
    path = Path(name)
    return path.read_text().strip() if path.exists() else "ok"


class Handler(BaseHTTPRequestHandler):
    alias = "model"

    def log_message(self, *args: object) -> None:
        pass

    def reply(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            m = mode()
            if m == "hang":
                threading.Event().wait()
            elif m == "loading":
                self.reply(503, LOADING)
            elif m == "fail":
                self.reply(500, {"error": {"code": 500, "message": "injected failure"}})
            else:
                self.reply(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self.reply(200, {"object": "list", "data": [{"id": self.alias, "object": "model"}]})
        else:
            self.reply(404, {"error": {"code": 404, "message": "File Not Found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        self.rfile.read(length)
        if mode("completions") == "fail":
            error = {"code": 500, "message": "injected completion failure", "type": "server_error"}
            self.reply(500, {"error": error})
            return
        self.reply(200, {"choices": [{"text": " fake", "index": 0}], "model": self.alias})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-m", "--model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("-c", "--ctx-size", type=int)
    p.add_argument("--alias", default="model")
    p.add_argument("-md", "--model-draft")
    p.add_argument("--really-bind", metavar="HOST", help="listen here, ignoring --host")
    p.add_argument("--version", action="version", version="fake_llama 0.0 (llama-server flags)")
    args = p.parse_args()
    Handler.alias = args.alias
    exit_after = os.environ.get("FAKE_EXIT_AFTER")  # a one-shot run: exit on its own
    if exit_after is not None:
        code = int(os.environ.get("FAKE_EXIT_CODE", "0"))
        threading.Timer(float(exit_after), lambda: os._exit(code)).start()
    server = ThreadingHTTPServer((args.really_bind or args.host, args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
