"""adapters.ports: exposure is judged by who holds the socket, not by the port number.

Real sockets and real processes: a listener program (tests/programs/owner_listen.py)
runs in a session of its own and binds beyond loopback on a port that this test
process, or another group, also holds.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
from collections.abc import Collection, Iterator
from dataclasses import dataclass

import psutil
import pytest
from support import PROGRAMS, wait_until

from infervisor.adapters import ports
from infervisor.adapters.errors import ProbeError
from infervisor.adapters.ports import (
    Listener,
    ListenerSnapshot,
    free_port,
    listener_snapshot,
    owned_listeners,
    wide_listeners,
)
from infervisor.adapters.procnet import PROC, ListeningSocket

PROGRAM = PROGRAMS / "owner_listen.py"
DEADLINE = 60.0  # s for a listener program to start or to end (generous at load 10)


@dataclass(frozen=True)
class Owner:
    """A running listener program: its process group and the pid holding the socket."""

    pgid: int
    pid: int


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The program's first stdout line, or fail once ``timeout`` seconds have passed."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            pytest.fail(f"{PROGRAM.name} printed nothing within {timeout} s")
    return proc.stdout.readline()


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


@contextlib.contextmanager
def listening(host: str, port: int, who: str = "self") -> Iterator[Owner]:
    """Run owner_listen.py in a new session, listening on ``host:port`` from ``who``
    (self, member or escaped); yields once the socket listens, killed on exit."""
    proc = subprocess.Popen(
        [sys.executable, str(PROGRAM), host, str(port), who],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pid = 0
    try:
        line = _read_line(proc, DEADLINE)
        words = line.split()
        assert len(words) == 2 and words[0] == "listening", f"{PROGRAM.name}: {line!r}"
        pid = int(words[1])
        yield Owner(pgid=proc.pid, pid=pid)
    finally:
        if who == "escaped" and pid:
            _kill_group(pid)  # its own group: the leader's group kill does not reach it
        _kill_group(proc.pid)
        proc.wait(DEADLINE)
        assert proc.stdout is not None
        proc.stdout.close()
        if who == "escaped" and pid:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).wait(DEADLINE)  # reaped once its parent is gone


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def loopback(port: int) -> Iterator[socket.socket]:
    """This test process listening on 127.0.0.1:port (SO_REUSEPORT: Linux refuses a
    wildcard listener on the same port without it, SO_REUSEADDR alone is not enough)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        yield s


def test_foreign_wildcard_listener_on_our_loopback_port_is_not_ours(
    port: int, loopback: socket.socket
) -> None:
    with listening("0.0.0.0", port) as other:
        wide = listener_snapshot().beyond_loopback(port)
        # the loopback socket is not in the snapshot; the other program's is, with its pid
        assert wide == (Listener("0.0.0.0", port, other.pid),)
        assert owned_listeners(wide, pgid=os.getpgrp(), descendants=()) == []
        assert owned_listeners(wide, pgid=other.pgid, descendants=()) == ["0.0.0.0"]


def test_two_groups_on_one_port_are_told_apart_by_pid(port: int, loopback: socket.socket) -> None:
    with listening("0.0.0.0", port) as first, listening("0.0.0.0", port) as second:
        wide = listener_snapshot().beyond_loopback(port)
        assert {listener.pid for listener in wide} == {first.pid, second.pid}
        assert {listener.address for listener in wide} == {"0.0.0.0"}
        only_first = [listener for listener in wide if listener.pid == first.pid]
        assert owned_listeners(only_first, pgid=second.pgid, descendants=()) == []
        assert owned_listeners(only_first, pgid=first.pgid, descendants=()) == ["0.0.0.0"]
        assert owned_listeners(wide, pgid=second.pgid, descendants=()) == ["0.0.0.0"]
        assert owned_listeners(wide, pgid=os.getpgrp(), descendants=()) == []


def test_a_group_member_that_is_not_the_leader_counts(port: int, loopback: socket.socket) -> None:
    with listening("0.0.0.0", port, who="member") as server:
        assert server.pid != server.pgid
        wide = listener_snapshot().beyond_loopback(port)
        assert [listener.pid for listener in wide] == [server.pid]
        assert owned_listeners(wide, pgid=server.pgid, descendants=()) == ["0.0.0.0"]


def test_a_descendant_that_left_the_group_counts_only_as_a_descendant(
    port: int, loopback: socket.socket
) -> None:
    with listening("0.0.0.0", port, who="escaped") as server:
        assert os.getpgid(server.pid) == server.pid != server.pgid
        wide = listener_snapshot().beyond_loopback(port)
        assert [listener.pid for listener in wide] == [server.pid]
        assert owned_listeners(wide, pgid=server.pgid, descendants=()) == []
        assert owned_listeners(wide, pgid=server.pgid, descendants={server.pid}) == ["0.0.0.0"]
        started = {server.pid: psutil.Process(server.pid).create_time()}  # as Watch reports them
        assert owned_listeners(wide, pgid=server.pgid, descendants=started) == ["0.0.0.0"]


def test_unknown_and_vanished_owners_are_not_ours(port: int) -> None:
    with subprocess.Popen([sys.executable, "-c", "pass"]) as proc:
        vanished = proc.pid  # exited and reaped when the with block ends
    assert not psutil.pid_exists(vanished)
    unknown = Listener("0.0.0.0", port, None)
    gone = Listener("0.0.0.0", port, vanished)
    assert owned_listeners([unknown, gone], pgid=os.getpgrp(), descendants=()) == []
    assert owned_listeners([unknown], pgid=os.getpgrp(), descendants={vanished}) == []


def test_ports_has_the_shape_of_wide_listeners(port: int, loopback: socket.socket) -> None:
    with listening("0.0.0.0", port):
        snapshot = listener_snapshot()
        assert snapshot.ports()[port] == ["0.0.0.0"] == wide_listeners()[port]
        # other programs on this machine may open or close listeners between two
        # reads of the socket table: equal within a deadline
        wait_until(
            lambda: listener_snapshot().ports() == wide_listeners(),
            timeout=DEADLINE,
            what="listener_snapshot().ports() == wide_listeners()",
        )
        for p, addresses in snapshot.ports().items():
            assert isinstance(p, int)
            assert addresses == sorted(set(addresses))
            assert all(isinstance(a, str) for a in addresses)


def test_ports_merges_owners_and_duplicates() -> None:
    snapshot = ListenerSnapshot(
        by_port={
            8080: (
                Listener("0.0.0.0", 8080, 1),
                Listener("192.0.2.7", 8080, None),
                Listener("0.0.0.0", 8080, 2),
            ),
            9090: (Listener("::", 9090, 3),),
        }
    )
    assert snapshot.ports() == {8080: ["0.0.0.0", "192.0.2.7"], 9090: ["::"]}
    assert snapshot.beyond_loopback(7070) == ()
    assert snapshot.beyond_loopback(9090) == (Listener("::", 9090, 3),)


def test_one_socket_twice_in_one_process_is_one_listener(port: int) -> None:
    with contextlib.ExitStack() as stack:
        for _ in range(2):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(("0.0.0.0", port))
            s.listen()
        wide = listener_snapshot().beyond_loopback(port)
        assert wide == (Listener("0.0.0.0", port, os.getpid()),)
        assert owned_listeners(wide, pgid=os.getpgrp(), descendants=()) == ["0.0.0.0"]


def _no_kernel_table() -> list[ListeningSocket]:
    raise PermissionError(13, "Permission denied", "/proc/net/tcp")


def test_an_unreadable_socket_table_is_a_probe_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(kind: str = "tcp") -> list[object]:
        raise psutil.AccessDenied(pid=None, msg="not permitted")

    monkeypatch.setattr(ports, "listening_sockets", _no_kernel_table)
    monkeypatch.setattr(psutil, "net_connections", refuse)
    with pytest.raises(ProbeError, match="cannot read the socket table"):
        listener_snapshot()
    with pytest.raises(ProbeError, match="cannot read the socket table"):
        wide_listeners()


def test_snapshot_is_one_read_of_proc_net_and_owners_only_when_asked(
    port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    read, owners = ports.listening_sockets, ports.socket_owners

    def counted_read() -> list[ListeningSocket]:
        calls.append("table")
        return read()

    def counted_owners(inodes: Collection[int], proc: str = PROC) -> dict[int, int]:
        calls.append("owners")
        return owners(inodes, proc)

    def psutil_not_used(kind: str = "tcp") -> list[object]:
        raise AssertionError("psutil.net_connections read every process's descriptors")

    monkeypatch.setattr(ports, "listening_sockets", counted_read)
    monkeypatch.setattr(ports, "socket_owners", counted_owners)
    monkeypatch.setattr(psutil, "net_connections", psutil_not_used)
    with listening("0.0.0.0", port) as other:
        snapshot = listener_snapshot()
        assert snapshot.ports()[port] == ["0.0.0.0"]
        assert snapshot.beyond_loopback(free_port()) == ()  # no wide listener: nothing read
        assert calls == ["table"]
        assert snapshot.beyond_loopback(port) == (Listener("0.0.0.0", port, other.pid),)
        assert calls == ["table", "owners"]


def test_an_ipv6_wildcard_listener_of_a_child_is_found_with_its_pid(port: int) -> None:
    with listening("::", port) as other:
        snapshot = listener_snapshot()
        assert snapshot.ports()[port] == ["::"]
        assert snapshot.beyond_loopback(port) == (Listener("::", port, other.pid),)


@pytest.mark.parametrize(
    ("family", "address", "v6only"),
    [
        (socket.AF_INET, "127.0.0.1", None),
        (socket.AF_INET, "127.0.0.2", None),
        (socket.AF_INET6, "::1", 1),
        (socket.AF_INET6, "::ffff:127.0.0.1", 0),
    ],
)
def test_loopback_listeners_are_not_beyond_loopback(
    family: socket.AddressFamily, address: str, v6only: int | None
) -> None:
    with socket.socket(family, socket.SOCK_STREAM) as s:
        if v6only is not None:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
        s.bind((address, 0))
        s.listen()
        port = s.getsockname()[1]
        inode = os.fstat(s.fileno()).st_ino
        read = ports.listening_sockets()
        assert any(sock.inode == inode and sock.address == address for sock in read)
        snapshot = listener_snapshot()
        assert port not in snapshot.ports()
        assert snapshot.beyond_loopback(port) == ()


def test_the_fallback_where_proc_net_cannot_be_read_is_psutils_table(
    port: int, loopback: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ports, "listening_sockets", _no_kernel_table)
    with listening("0.0.0.0", port) as other:
        snapshot = listener_snapshot()
        assert snapshot.sockets == {}  # owners came with psutil's table
        assert snapshot.beyond_loopback(port) == (Listener("0.0.0.0", port, other.pid),)
        assert wide_listeners()[port] == ["0.0.0.0"]


def _psutil_listeners() -> set[Listener]:
    return {
        Listener(c.laddr.ip, c.laddr.port, c.pid)
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr and not ports._is_loopback(c.laddr.ip)
    }


def _proc_net_listeners() -> set[Listener]:
    snapshot = listener_snapshot()
    assert not snapshot.by_port  # read from /proc/net, not the fallback
    return {li for p in snapshot.ports() for li in snapshot.beyond_loopback(p)}


def test_the_proc_net_table_equals_psutils_on_this_machine(port: int) -> None:
    """Every wide listener of this machine, owners included, as psutil reports them
    (IPv4 and IPv6): equal within a deadline, as other programs open and close
    listeners between the two reads."""
    with listening("0.0.0.0", port) as first, listening("::", free_port()) as second:
        seen: list[tuple[set[Listener], set[Listener]]] = []

        def equal() -> bool:
            ours, theirs = _proc_net_listeners(), _psutil_listeners()
            seen.append((ours, theirs))
            return ours == theirs

        wait_until(equal, timeout=DEADLINE, what="the same listeners as psutil")
        ours = seen[-1][0]
        assert Listener("0.0.0.0", port, first.pid) in ours
        assert {li.pid for li in ours if li.address == "::"} >= {second.pid}
