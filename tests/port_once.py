"""Test harness: ``adapters.ports.free_port`` hands out ports no one else will take.

The kernel's free port (bind to port 0) comes from the ephemeral range, which
the kernel also hands out as the source port of every outgoing connection: a
port found free by one xdist worker can be taken, before its server binds it,
by a probe or a client of another worker's test ("127.0.0.1:P is already taken
by something else"). The kernel may also offer the same free port to two calls
in a row, and a test that places two instances then sees them collide.

So each worker takes ports from a band of its own below the ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``), in turn, each checked free by a
bind on the host asked for, and never hands one out twice in a run unless its
band is used up. Two suites running at once on one machine (other checkouts,
CI) have the same bands: a worker hands ports out only of blocks it holds an
advisory lock on (``flock``, held for its life, in a folder of the temporary
directory), so a port one suite hands out is never handed out by another.
conftest.py imports this first, so every test module that imports
``free_port`` gets the patched one.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import random
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import infervisor.adapters.ports as ports

#: The lowest port handed out: clear of the well-known ports (a port a service of this
#: machine holds is skipped by the bind check).
LOWEST = 10_000
#: Bands: xdist workers beyond this many share bands (a collision is then only possible).
BANDS = 8
#: Ports claimed at once: a worker holds the lock of each block it hands ports out of.
BLOCK = 32
#: Where the blocks' lock files are (one file a block, named by its number).
CLAIMS = Path(tempfile.gettempdir()) / "infervisor-test-ports"


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _band() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    width = max(1, (_ephemeral_low() - LOWEST) // BANDS)
    start = LOWEST + (index % BANDS) * width
    return range(start, start + width)


def _turns_from_anywhere(band: range) -> Iterator[int]:
    """The band in turn, from a random place in it: two suites running at once on one
    machine (another checkout's, CI's) have the same bands, and from the same first
    port they took the same ports in step (a port checked free by one, bound by the
    other before its server started: "already listening" in three tests of a run
    beside another suite)."""
    start = random.SystemRandom().randrange(len(band))
    return itertools.islice(itertools.cycle(band), start, None)


_turns: Iterator[int] = _turns_from_anywhere(_band())
_handed_out: set[int] = set()


_held: dict[int, int] = {}  # block -> the descriptor holding its lock


def _claimed(port: int) -> bool:
    """Whether this process holds, or now takes, the lock of ``port``'s block. A
    run beside another suite had a port checked free by one bound by the other
    before its server started ("127.0.0.1:P is already taken by something else",
    tests/test_crash_recovery.py): the random start below made that rare, not
    impossible. Where no lock file can be made, True (the bind check alone)."""
    block = port // BLOCK
    if block in _held:
        return True
    try:
        CLAIMS.mkdir(exist_ok=True)
        fd = os.open(CLAIMS / str(block), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # another process holds it
        os.close(fd)
        return False
    _held[block] = fd
    return True


def _bindable(family: socket.AddressFamily, address: str, port: int) -> bool:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


def free_port_once(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, from this worker's band, not handed out before.

    Raises:
        SpecError: ``host`` is not an address of this machine (as the original).
    """
    _of_the_kernel(host)  # a host that is not this machine's is refused as before
    family, (address, _) = ports._address(host, 0)
    band = _band()
    if len(_handed_out) >= len(band):
        _handed_out.clear()  # the band is used up: ports of ended tests are free again
    for claims in (True, False):  # every block held by others: the bind check alone
        for _ in range(len(band)):
            port = next(_turns)
            if port in _handed_out or (claims and not _claimed(port)):
                continue
            if _bindable(family, address, port):
                _handed_out.add(port)
                return port
    return _of_the_kernel(host)  # nothing in the band binds: the kernel's, as before


_of_the_kernel = ports.free_port
ports.free_port = free_port_once
