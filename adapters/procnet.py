"""The kernel's table of LISTENing TCP sockets, read without psutil, and their owners.

``psutil.net_connections`` answers "who owns each socket" by reading every
file descriptor of every process on the machine, on every call: on a node
that takes the socket table once per reconcile tick, that scan was a fifth of
an idle node's CPU. What the node needs is cheaper: the LISTEN sockets and,
only for the rare listener beyond loopback on one of its own instances'
ports, the process that holds it (:func:`socket_owners`, the same fd scan,
limited to the sockets asked about).

:func:`listening_sockets` asks the kernel over netlink (``sock_diag(7)``,
``SOCK_DIAG_BY_FAMILY`` with a LISTEN-only state filter, as ``ss -lt`` does):
the kernel then walks its listening hash only. Printing ``/proc/net/tcp``
walks every bucket of the established hash as well, which on this project's
2-core test machine costs about 2.6 ms of kernel time per file whatever the
number of sockets (and the node reads two). Where netlink is refused (a
kernel without ``inet_diag``, a seccomp filter) it reads ``/proc/net/tcp``
and ``/proc/net/tcp6`` (:func:`read_proc_net`).

The ``/proc/net`` formats are the kernel's (``net/ipv4/tcp_ipv4.c`` ``get_tcp4_sock``,
``net/ipv6/tcp_ipv6.c`` ``get_tcp6_sock``): one line per socket,
``sl local_address rem_address st ... inode``; an address is the IP as 32-bit
words printed in hex in the host's byte order, a colon, and the port in hex;
state ``0A`` is LISTEN. Addresses are rendered as psutil renders them
(``socket.inet_ntop``; an IPv4-mapped IPv6 address reads ``::ffff:1.2.3.4``;
no scope id).

Netlink's ``inet_diag_msg`` carries the same fields in network byte order.

Linux only: elsewhere (or where neither can be read) the reader raises
``OSError`` and the caller falls back to psutil.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import sys
from collections.abc import Collection
from typing import NamedTuple

__all__ = [
    "PROC",
    "ListeningSocket",
    "decode_address",
    "listening_sockets",
    "read_proc_net",
    "read_sock_diag",
    "socket_owners",
]

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


def read_proc_net(proc: str = PROC) -> list[ListeningSocket]:
    """Every TCP socket LISTENing in this network namespace, from ``<proc>/net/tcp``
    then ``<proc>/net/tcp6`` (IPv4 then IPv6).

    Two file reads; no process is looked at. A kernel without IPv6 has
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


# sock_diag(7) and netlink(7): constants and layouts from linux/netlink.h,
# linux/sock_diag.h and linux/inet_diag.h.
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCPF_LISTEN = 1 << 10
_NLMSG = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_REQ = struct.Struct("=BBBBI48x")  # inet_diag_req_v2: family, protocol, ext, pad, states, id
_MSG_PORT = struct.Struct(">H")  # inet_diag_msg.id.idiag_sport, at offset 4 (big-endian)
_MSG_INODE = struct.Struct("=I")  # inet_diag_msg.idiag_inode, at offset 68
_MSG_LEN = 72
_SIZES: dict[int, int] = {socket.AF_INET: 4, socket.AF_INET6: 16}


def _diag_dump(family: socket.AddressFamily) -> list[ListeningSocket]:
    request = _REQ.pack(family, socket.IPPROTO_TCP, 0, 0, _TCPF_LISTEN)
    header = _NLMSG.pack(
        _NLMSG.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0
    )
    found: list[ListeningSocket] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as nl:
        nl.sendto(header + request, (0, 0))
        while True:
            data = nl.recv(1 << 16)
            if not data:
                raise ValueError("sock_diag: the dump ended without NLMSG_DONE")
            at = 0
            while at + _NLMSG.size <= len(data):
                length, kind, _, _, _ = _NLMSG.unpack_from(data, at)
                if kind == _NLMSG_DONE:
                    return found
                if kind == _NLMSG_ERROR:
                    (errno,) = struct.unpack_from("=i", data, at + _NLMSG.size)
                    raise OSError(-errno, f"sock_diag refused the dump: {os.strerror(-errno)}")
                body = at + _NLMSG.size
                if length < _NLMSG.size + _MSG_LEN:
                    raise ValueError(f"sock_diag: a message of {length} bytes")
                msg_family = data[body]
                size = _SIZES.get(msg_family)
                if size is None:
                    raise ValueError(f"sock_diag: address family {msg_family}")
                raw = data[body + 8 : body + 8 + size]
                (port,) = _MSG_PORT.unpack_from(data, body + 4)
                (inode,) = _MSG_INODE.unpack_from(data, body + 68)
                if port:
                    found.append(ListeningSocket(socket.inet_ntop(msg_family, raw), port, inode))
                at += (length + 3) & ~3


def read_sock_diag() -> list[ListeningSocket]:
    """Every TCP socket LISTENing in this network namespace, from the kernel over
    netlink (``sock_diag(7)``, LISTEN only), IPv4 then IPv6. No process is looked at.

    Raises:
        OSError: netlink or its ``inet_diag`` family is not available (not
            Linux, module not loaded, refused by a seccomp filter).
        ValueError: an answer not in the kernel's format.
    """
    return _diag_dump(socket.AF_INET) + _diag_dump(socket.AF_INET6)


def listening_sockets() -> list[ListeningSocket]:
    """Every TCP socket LISTENing in this network namespace, IPv4 then IPv6:
    :func:`read_sock_diag`, else :func:`read_proc_net` where netlink is refused.

    Raises:
        OSError: neither can be read; ValueError: an answer not in the kernel's
            format (the caller treats both as an unreadable table).
    """
    try:
        return read_sock_diag()
    except (OSError, ValueError):
        return read_proc_net()


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
