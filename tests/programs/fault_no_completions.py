"""Health 200 and the model listed, but every completion fails (HTTP 500)."""

from __future__ import annotations

from fault_common import Handler, parse_args, serve

ERROR = {"error": {"code": 500, "message": "injected: KV cache allocation failed"}}


class NoCompletions(Handler):
    def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.reply(500, ERROR)


if __name__ == "__main__":
    serve(parse_args(), NoCompletions)
