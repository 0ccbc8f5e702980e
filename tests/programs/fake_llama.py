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
working directory the same way: ``ok`` (200, the token ``" fake"``),
``fail`` (500, llama-server's error shape) or ``cut`` (200, a chunked event
stream of one token, then the connection closed without the last chunk: a
server that died mid-answer). ``GET /slots`` is chosen by the
file ``slots``: a whole number n, the slots processing a request (llama-server's
shape: a list of slots with ``is_processing``, n of them true, at least one
slot); without the file, 404 (a server without counters). Flags of its own:
``--really-bind HOST`` listens on HOST whatever ``--host`` says (a server
that ignores the address it was given, e.g. ``0.0.0.0``); ``--version``
prints a version line and exits 0, as llama-server does.
"""

from __future__ import annotations

import argparse
import os
import threading

from fault_common import Handler, mode, parse_args, serve


class FakeLlama(Handler):
    """The shared llama-protocol handler; completions fail when ``completions`` says so,
    ``/slots`` answers what ``slots`` says."""

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        if self.path != "/slots" or not os.path.exists("slots"):
            super().do_GET()
            return
        busy = int(mode("slots"))
        self.reply(200, [{"id": i, "is_processing": i < busy} for i in range(max(busy, 1))])

    def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
        if mode("completions") == "cut":
            self.cut()
            return
        if mode("completions") != "fail":
            super().do_POST()
            return
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        error = {"code": 500, "message": "injected completion failure", "type": "server_error"}
        self.reply(500, {"error": error})

    def cut(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        event = b'data: {"choices":[{"index":0,"delta":{"content":" fake"}}]}\n\n'
        self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        self.wfile.flush()
        self.close_connection = True  # no "0" chunk, no [DONE]: cut mid-answer


def own_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--really-bind", metavar="HOST", help="listen here, ignoring --host")
    p.add_argument("--version", action="version", version="fake_llama 0.0 (llama-server flags)")


def main() -> None:
    args = parse_args(own_flags)
    exit_after = os.environ.get("FAKE_EXIT_AFTER")  # a one-shot run: exit on its own
    if exit_after is not None:
        code = int(os.environ.get("FAKE_EXIT_CODE", "0"))
        threading.Timer(float(exit_after), lambda: os._exit(code)).start()
    serve(args, FakeLlama, host=args.really_bind or "")


if __name__ == "__main__":
    main()
