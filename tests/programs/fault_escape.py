"""A llama-protocol server whose grandchild escapes its process group.

Before listening, the server forks an intermediate, which forks the grandchild
and writes ``intermediate.pid``; the grandchild calls ``setsid()`` (a session
and group of its own, out of reach of a group kill), writes ``grandchild.pid``
and waits for a signal. The intermediate lingers until a file ``release``
exists in the working directory, then exits, so the grandchild is reparented
away from the server. The server reaps the intermediate.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from fault_common import parse_args, serve, write_pid


def grandchild() -> None:
    os.setsid()
    write_pid("grandchild.pid", os.getpid())
    while True:
        signal.pause()


def intermediate() -> None:
    if os.fork() == 0:
        grandchild()
    write_pid("intermediate.pid", os.getpid())
    while not Path("release").exists():
        time.sleep(0.02)
    os._exit(0)


if __name__ == "__main__":
    args = parse_args()
    pid = os.fork()
    if pid == 0:
        intermediate()
    threading.Thread(target=os.waitpid, args=(pid, 0), daemon=True).start()
    serve(args)
