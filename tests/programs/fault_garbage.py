"""/health answers 200 with a body a probe must not trust.

``--body garbage``: a few bytes that are not JSON. ``--body huge``: a body
declared as 1 GiB, streamed until the client hangs up; the bytes written
until then are recorded in the file ``sent`` in the working directory.
"""

from __future__ import annotations

from pathlib import Path

from fault_common import Handler, parse_args, serve

HUGE = 1 << 30
CHUNK = b"x" * 65536


class Garbage(Handler):
    body = "garbage"

    def health(self) -> None:
        if self.body == "garbage":
            self.reply(200, b"\xff\xfe<html>garbage", "text/html")
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(HUGE))
        self.end_headers()
        sent = 0
        try:
            while sent < HUGE:
                self.wfile.write(CHUNK)
                sent += len(CHUNK)
        except OSError:
            pass
        Path("sent.tmp").write_text(str(sent))
        Path("sent.tmp").rename("sent")


if __name__ == "__main__":
    args = parse_args(lambda p: p.add_argument("--body", choices=["garbage", "huge"]))
    Garbage.body = args.body
    serve(args, Garbage)
