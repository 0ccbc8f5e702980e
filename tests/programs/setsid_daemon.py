"""A llama-protocol server that leaves a daemon behind: a classic double fork.

It listens first, then forks a child that calls ``setsid()`` (a session and
group of its own), forks the daemon and exits at once, so the daemon is
orphaned (re-parented to the nearest subreaper, or init) and belongs to no
group of the server's. The daemon writes ``daemon.pid`` and sleeps holding
the server's listening socket: while it lives, the port stays taken.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from fault_common import Handler, listen, parse_args, write_pid


def daemon() -> None:
    os.setsid()
    if os.fork() == 0:
        write_pid("daemon.pid", os.getpid())
        while True:
            signal.pause()
    os._exit(0)


def serve_leaving(daemon: Callable[[], None]) -> None:
    """Listen, run ``daemon`` in a forked child (it inherits the socket), serve."""
    args = parse_args()
    Handler.alias = args.alias
    server = listen(args.host, args.port, Handler)
    pid = os.fork()
    if pid == 0:
        daemon()
    os.waitpid(pid, 0)
    server.serve_forever()


if __name__ == "__main__":
    serve_leaving(daemon)
