"""The kernel's TCP socket table, read from ``/proc/net`` directly.

``psutil.net_connections`` answers "who owns each socket" by reading every
file descriptor of every process on the machine, on every call: on a node
that takes the socket table once per reconcile tick, that scan was a fifth of
an idle node's CPU. What the node needs is cheaper: the LISTEN sockets (a few
lines of ``/proc/net/tcp`` and ``/proc/net/tcp6``) and, only for the rare
listener beyond loopback on one of its own instances' ports, the process that
holds it (:func:`socket_owners`, the same fd scan, limited to the sockets
asked about).

The formats are the kernel's (``net/ipv4/tcp_ipv4.c`` ``get_tcp4_sock``,
``net/ipv6/tcp_ipv6.c`` ``get_tcp6_sock``): one line per socket,
``sl local_address rem_address st ... inode``; an address is the IP as 32-bit
words printed in hex in the host's byte order, a colon, and the port in hex;
state ``0A`` is LISTEN. Addresses are rendered as psutil renders them
(``socket.inet_ntop``; an IPv4-mapped IPv6 address reads ``::ffff:1.2.3.4``;
no scope id).

Linux only: elsewhere (or where ``/proc/net`` cannot be read) the reader
raises ``OSError`` and the caller falls back to psutil.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Collection
from typing import NamedTuple

__all__ = ["PROC", "ListeningSocket", "decode_address", "listening_sockets", "socket_owners"]

#: Where procfs is mounted (a parameter of every reader, so tests can point elsewhere).
PROC = "/proc"

_LISTEN = "0A"  # TCP_LISTEN in the kernel's state numbering, as printed
_LITTLE = sys.byteorder == "little"


class ListeningSocket(NamedTuple):
    """One TCP socket in LISTEN state: its local address (bare IP), port and
    socket inode (what ``/proc/PID/fd/N`` links to as ``socket:[inode]``)."""

    address: str
    port: int
    inode: int


def decode_address(field: str) -> tuple[str, int]:
    """``"0100007F:1F90"`` -> ``("127.0.0.1", 8080)``: one address field of ``/proc/net/tcp*``.

    8 hex digits are IPv4, 32 are IPv6 (four 32-bit words, each in host byte order).

    Raises:
        ValueError: the field is not an address of either shape.
    """
    hexip, _, hexport = field.partition(":")
    raw = bytes.fromhex(hexip)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1] if _LITTLE else raw), int(hexport, 16)
    if len(raw) == 16:
        if _LITTLE:
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
        return socket.inet_ntop(socket.AF_INET6, raw), int(hexport, 16)
    raise ValueError(f"not an address of /proc/net/tcp: {field!r}")


def _listening_in(path: str) -> list[ListeningSocket]:
    found: list[ListeningSocket] = []
    with open(path, encoding="ascii") as table:
        next(table, None)  # the header line
        for line in table:
            words = line.split(None, 4)
            if len(words) < 4 or words[3] != _LISTEN:
                continue
            fields = line.split()
            address, port = decode_address(fields[1])
            if port:  # a socket not bound to a port is nobody's listener (psutil skips it too)
                found.append(ListeningSocket(address, port, int(fields[9])))
    return found


def listening_sockets(proc: str = PROC) -> list[ListeningSocket]:
    """Every TCP socket LISTENing on this machine (this network namespace), IPv4 then IPv6.

    Two small file reads; no process is looked at. A kernel without IPv6 has
    no ``tcp6`` table: that is no IPv6 listener, not an error.

    Raises:
        OSError: ``<proc>/net/tcp`` cannot be read (not Linux, procfs not
            mounted, not permitted).
        ValueError: a line is not in the kernel's format (the caller treats
            the table as unreadable).
    """
    found = _listening_in(f"{proc}/net/tcp")
    with contextlib.suppress(FileNotFoundError):
        found += _listening_in(f"{proc}/net/tcp6")
    return found


def socket_owners(inodes: Collection[int], proc: str = PROC) -> dict[int, int]:
    """Socket inode -> the pid holding it, for the inodes asked about only.

    One pass over ``<proc>/*/fd``, stopping early never (a socket shared by
    several processes, inherited across fork, is reported under the last of
    them in ``/proc``'s listing order, as ``psutil.net_connections`` reports
    it). Processes that vanish, and file descriptors this process may not
    read (another user's, when unprivileged), are skipped: their sockets are
    absent from the answer. Nothing is read when ``inodes`` is empty.

    Returns:
        inode -> pid for each inode found; inodes no readable process holds are absent.
    """
    if not inodes:
        return {}
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    owners: dict[int, int] = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return owners
    for name in names:
        if not name.isdigit():
            continue
        fd_dir = f"{proc}/{name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                inode = wanted.get(os.readlink(f"{fd_dir}/{fd}"))
            except OSError:
                continue
            if inode is not None:
                owners[inode] = int(name)
    return owners
