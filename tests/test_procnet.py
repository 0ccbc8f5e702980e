"""adapters.procnet: the kernel's LISTEN sockets (netlink sock_diag, else /proc/net), owners.

The /proc/net parsing is tested on lines in the kernel's own format (copied
from /proc/net/tcp and /proc/net/tcp6 of a little-endian Linux machine) under
a fake procfs root; netlink against /proc/net on this machine's real table;
the owner lookup on real sockets of this process and of a child.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support import wait_until

from infervisor.adapters import procnet
from infervisor.adapters.procnet import (
    PROC,
    ListeningSocket,
    decode_address,
    listening_sockets,
    read_proc_net,
    read_sock_diag,
    socket_owners,
)

little_endian_only = pytest.mark.skipif(
    sys.byteorder != "little", reason="the lines below are a little-endian kernel's"
)

TCP_HEADER = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt"
    "   uid  timeout inode\n"
)
TCP = TCP_HEADER + (
    # 127.0.0.1:10010 LISTEN, 0.0.0.0:2024 LISTEN, 192.168.1.5:8080 LISTEN,
    # 127.0.0.1:8080 -> 127.0.0.1:50000 ESTABLISHED (01), 10.0.0.5:22 TIME_WAIT (06)
    "   0: 0100007F:271A 00000000:0000 0A 00000000:00000000 00:00000000 00000000"
    "     0        0 3363342 1 0000000000000000 100 0 0 10 0\n"
    "   1: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000"
    "     0        0 657 1 0000000000000000 100 0 0 10 0\n"
    "   2: 0501A8C0:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000"
    "     0        0 4242 1 0000000000000000 100 0 0 10 0\n"
    "   3: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000"
    "     0        0 4243 1 0000000000000000 20 4 30 10 -1\n"
    "   4: 0500000A:0016 0600000A:D431 06 00000000:00000000 03:00000F3C 00000000"
    "     0        0 0 3 0000000000000000\n"
)
TCP6 = TCP_HEADER + (
    # [::1]:37951, [::ffff:127.0.0.1]:60567, [::]:8081, [fe80::1]:9000 (LISTEN)
    "   0: 00000000000000000000000001000000:943F 00000000000000000000000000000000:0000 0A"
    " 00000000:00000000 00:00000000 00000000     0        0 3363394 1 0 100 0 0 10 0\n"
    "   1: 0000000000000000FFFF00000100007F:EC97 00000000000000000000000000000000:0000 0A"
    " 00000000:00000000 00:00000000 00000000     0        0 3363393 1 0 100 0 0 10 0\n"
    "   2: 00000000000000000000000000000000:1F91 00000000000000000000000000000000:0000 0A"
    " 00000000:00000000 00:00000000 00000000     0        0 77 1 0 100 0 0 10 0\n"
    "   3: 000080FE000000000000000001000000:2328 00000000000000000000000000000000:0000 0A"
    " 00000000:00000000 00:00000000 00000000     0        0 78 1 0 100 0 0 10 0\n"
)


def fake_proc(root: Path, tcp: str | None = TCP, tcp6: str | None = TCP6) -> str:
    (root / "net").mkdir(parents=True)
    if tcp is not None:
        (root / "net" / "tcp").write_text(tcp)
    if tcp6 is not None:
        (root / "net" / "tcp6").write_text(tcp6)
    return str(root)


@little_endian_only
@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("0100007F:1F90", ("127.0.0.1", 8080)),
        ("0501A8C0:0016", ("192.168.1.5", 22)),
        ("00000000:0000", ("0.0.0.0", 0)),
        ("00000000000000000000000001000000:943F", ("::1", 37951)),
        ("0000000000000000FFFF00000100007F:EC97", ("::ffff:127.0.0.1", 60567)),
        ("000080FE000000000000000001000000:2328", ("fe80::1", 9000)),
        ("B80D0120000000000000000001000000:0050", ("2001:db8::1", 80)),
    ],
)
def test_addresses_decode_as_psutil_renders_them(field: str, expected: tuple[str, int]) -> None:
    assert decode_address(field) == expected


@pytest.mark.parametrize("field", ["0100007F", "01007F:1F90", "zz00007F:1F90", ":0050"])
def test_a_field_that_is_not_an_address_is_a_value_error(field: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message is fromhex's or ours
        decode_address(field)


@little_endian_only
def test_only_listen_lines_are_read_ipv4_then_ipv6(tmp_path: Path) -> None:
    assert read_proc_net(fake_proc(tmp_path)) == [
        ListeningSocket("127.0.0.1", 10010, 3363342),
        ListeningSocket("0.0.0.0", 2024, 657),
        ListeningSocket("192.168.1.5", 8080, 4242),
        ListeningSocket("::1", 37951, 3363394),
        ListeningSocket("::ffff:127.0.0.1", 60567, 3363393),
        ListeningSocket("::", 8081, 77),
        ListeningSocket("fe80::1", 9000, 78),
    ]


def test_no_tcp6_table_is_no_ipv6_listener(tmp_path: Path) -> None:
    assert read_proc_net(fake_proc(tmp_path, tcp=TCP_HEADER, tcp6=None)) == []


def test_no_tcp_table_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_proc_net(fake_proc(tmp_path, tcp=None))


def test_a_line_not_in_the_kernels_format_is_a_value_error(tmp_path: Path) -> None:
    bad = TCP_HEADER + "   0: 0100007F 00000000:0000 0A 0 0 0 0 0 0 nope\n"
    with pytest.raises(ValueError):  # noqa: PT011 - the caller treats any as unreadable
        read_proc_net(fake_proc(tmp_path, tcp=bad))


def test_this_machines_table_has_our_listener_with_its_inode() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        mine = ListeningSocket("127.0.0.1", s.getsockname()[1], os.fstat(s.fileno()).st_ino)
        assert mine in listening_sockets()
        assert mine in read_sock_diag()
        assert mine in read_proc_net()


def test_netlink_and_proc_net_give_the_same_table_on_this_machine() -> None:
    """IPv4, IPv6, v4-mapped, loopback and wildcard listeners of our own beside
    whatever else listens: the same sockets both ways, within a deadline (other
    programs open and close listeners between the two reads)."""
    with contextlib.ExitStack() as stack:
        mine: set[int] = set()
        for family, address, v6only in [
            (socket.AF_INET, "127.0.0.1", None),
            (socket.AF_INET, "0.0.0.0", None),
            (socket.AF_INET6, "::", 1),
            (socket.AF_INET6, "::1", 1),
            (socket.AF_INET6, "::ffff:127.0.0.1", 0),
        ]:
            s = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            if v6only is not None:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
            s.bind((address, 0))
            s.listen()
            mine.add(os.fstat(s.fileno()).st_ino)
        seen: list[list[ListeningSocket]] = []

        def same() -> bool:
            diag, proc = read_sock_diag(), read_proc_net()
            seen.append(diag)
            return sorted(diag) == sorted(proc)

        wait_until(same, timeout=60, what="the same LISTEN sockets from netlink and /proc/net")
        assert mine <= {s.inode for s in seen[-1]}


def test_netlink_refused_reads_proc_net(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused() -> list[ListeningSocket]:
        raise PermissionError(1, "Operation not permitted")

    read: list[str] = []

    def counted(proc: str = PROC) -> list[ListeningSocket]:
        read.append(proc)
        return [ListeningSocket("0.0.0.0", 8080, 7)]

    monkeypatch.setattr(procnet, "read_sock_diag", refused)
    monkeypatch.setattr(procnet, "read_proc_net", counted)
    assert listening_sockets() == [ListeningSocket("0.0.0.0", 8080, 7)]
    assert read == [PROC]


def test_owners_are_found_by_inode_only_for_the_inodes_asked() -> None:
    with socket.socket() as s, socket.socket() as other:
        for sock in (s, other):
            sock.bind(("127.0.0.1", 0))
            sock.listen()
        inode = os.fstat(s.fileno()).st_ino
        assert socket_owners({inode}) == {inode: os.getpid()}
        assert socket_owners(()) == {}
        assert socket_owners({1}) == {}  # no process holds inode 1 as a socket


def test_a_socket_inherited_by_a_child_is_reported_under_the_last_pid_in_proc() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        inode = os.fstat(s.fileno()).st_ino
        code = "import sys; sys.stdout.write('up\\n'); sys.stdout.flush(); sys.stdin.read()"
        child = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            pass_fds=(s.fileno(),),
            text=True,
        )
        try:
            assert child.stdout is not None and child.stdout.readline() == "up\n"
            holders = [p for p in os.listdir("/proc") if p in {str(os.getpid()), str(child.pid)}]
            assert socket_owners({inode}) == {inode: int(holders[-1])}
        finally:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(60)
            assert child.stdout is not None
            child.stdout.close()
