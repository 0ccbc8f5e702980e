"""A llama-protocol server whose child tries to leave the server's cgroup.

It listens, then forks a child that calls ``setsid()``, double-forks, and
writes its own pid into the ``cgroup.procs`` of the v2 hierarchy's root (as a
server running as root may), then sleeps holding the listening socket. The
daemon writes ``daemon.pid`` and ``escape.txt``: ``left`` when the move was
taken, else the error the kernel gave.
"""

from __future__ import annotations

import os
import signal

from fault_common import write_pid
from setsid_daemon import serve_leaving

V2_ROOT = "/sys/fs/cgroup/unified/cgroup.procs"


def leave() -> str:
    try:
        with open(V2_ROOT, "w") as f:
            f.write(str(os.getpid()))
    except OSError as e:
        return f"refused: {e.strerror}"
    return "left"


def daemon() -> None:
    os.setsid()
    if os.fork() == 0:
        outcome = leave()
        with open("escape.txt.tmp", "w") as f:
            f.write(outcome)
        os.rename("escape.txt.tmp", "escape.txt")
        write_pid("daemon.pid", os.getpid())
        while True:
            signal.pause()
    os._exit(0)


if __name__ == "__main__":
    serve_leaving(daemon)
