"""Leave a grandchild behind outside this process group (a fault for terminate).

The server forks an intermediate and waits. The intermediate forks the
grandchild, prints "intermediate PID", then waits until a file named "release"
exists in the working directory and exits, so the grandchild is reparented to
init. The grandchild calls os.setsid() (a session and group of its own, out of
reach of a group kill), prints "grandchild PID" and waits for a signal.
"""

import os
import pathlib
import signal
import time


def grandchild() -> None:
    os.setsid()
    print(f"grandchild {os.getpid()}", flush=True)
    while True:
        signal.pause()


def intermediate() -> None:
    if os.fork() == 0:
        grandchild()
    print(f"intermediate {os.getpid()}", flush=True)
    release = pathlib.Path("release")
    while not release.exists():
        time.sleep(0.02)
    os._exit(0)


if os.fork() == 0:
    intermediate()
print("ready", flush=True)
while True:
    signal.pause()
