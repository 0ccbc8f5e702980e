"""A llama-protocol server whose child needs 2 s to clean up on SIGTERM.

The child (in the server's process group) writes ``child.pid``; on SIGTERM it
works for 2 s, writes ``cleaned`` and exits. The server itself exits at once
on SIGTERM (the default action), leaving the child to finish within the
stop's grace.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from fault_common import parse_args, serve, write_pid

CLEANUP_S = 2.0


def child() -> None:
    def cleanup(signum: int, frame: object) -> None:
        time.sleep(CLEANUP_S)
        Path("cleaned").write_text("done")
        os._exit(0)

    signal.signal(signal.SIGTERM, cleanup)
    write_pid("child.pid", os.getpid())
    while True:
        signal.pause()


if __name__ == "__main__":
    args = parse_args()
    if os.fork() == 0:
        child()
    serve(args)
