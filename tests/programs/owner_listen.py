"""Listen on HOST:PORT from a chosen process, report who listens, then wait for a signal.

Usage: owner_listen.py HOST PORT [self | member | escaped]

- ``self`` (the default): this process listens.
- ``member``: a forked child in this process group listens (not the leader).
- ``escaped``: a forked child calls ``os.setsid()`` (a group of its own, as a
  server's descendant escaping its group would) and listens.

The socket sets SO_REUSEADDR and SO_REUSEPORT, so a test can hold
``127.0.0.1:PORT`` (or another ``0.0.0.0:PORT``) at the same time. Once the
socket is listening the listener prints ``listening PID`` on stdout. The
process group is meant to be ended with SIGKILL (killpg), an escaped child
separately by its own group.
"""

import os
import signal
import socket
import sys


def listen(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind((host, port))
    s.listen()
    print(f"listening {os.getpid()}", flush=True)
    while True:
        signal.pause()


host, port = sys.argv[1], int(sys.argv[2])
who = sys.argv[3] if len(sys.argv) > 3 else "self"
if who == "self":
    listen(host, port)
if os.fork() == 0:
    if who == "escaped":
        os.setsid()
    listen(host, port)
while True:
    signal.pause()
