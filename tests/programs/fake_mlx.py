"""A small server speaking mlx_lm.server's protocol whose completions fail.

Shapes from mlx-lm's ``mlx_lm/server.py`` (the installed package): ``GET
/health`` answers 200 ``{"status": "ok"}``; ``GET /v1/models`` an OpenAI model
list; a completion whose generation raises is answered 404 with
``{"error": "<the exception>"}`` and no Content-Length (the connection closes).
Takes mlx_lm.server's flags (``--model``, ``--host``, ``--port``). With
``--completions ok`` a completion gives one token instead.
"""

from __future__ import annotations

import argparse
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAILURE = (
    "[metal::malloc] Attempting to allocate 4294967296 bytes which is greater than the maximum"
)


class FakeMlx(BaseHTTPRequestHandler):
    model = "mlx-model"
    completions = "fail"

    def log_message(self, *args: object) -> None:
        pass

    def answer(self, status: int, body: object, *, length: bool = True) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-type", "application/json")
        if length:
            self.send_header("Content-Length", str(len(data)))
        else:
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self.answer(200, {"status": "ok"})
        elif self.path.startswith("/v1/models"):
            entry = {"id": self.model, "object": "model", "created": int(time.time())}
            self.answer(200, {"object": "list", "data": [entry]})
        else:
            self.answer(404, "Not Found")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path not in ("/v1/completions", "/v1/chat/completions", "/chat/completions"):
            self.answer(404, "Not Found")
        elif self.completions == "fail":
            self.answer(404, {"error": FAILURE}, length=False)
        else:
            choice = {"index": 0, "text": " token", "finish_reason": "length"}
            body = {"id": "cmpl-1", "object": "text_completion", "model": self.model}
            self.answer(200, {**body, "created": int(time.time()), "choices": [choice]})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mlx-model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--completions", choices=["ok", "fail"], default="fail")
    args = p.parse_args()
    FakeMlx.model, FakeMlx.completions = args.model, args.completions
    server = ThreadingHTTPServer((args.host, args.port), FakeMlx)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
