"""Is a port taken, a free port, and who listens on a port beyond loopback.

Source of the behaviour: ``reference/infer_lifecycle.rs.txt`` (``port_in_use``
guards every start and restart: nothing starts over a port already listening;
``reachable_beyond_loopback`` finds a managed server listening on a
non-loopback address so it can be stopped).

Exposure is judged by the owner of the socket, not by the port number: Linux
lets ``127.0.0.1:P`` and ``0.0.0.0:P`` (with SO_REUSEPORT) or ``127.0.0.1:P``
and ``192.168.1.5:P`` belong to different processes, so a wide listener on a
managed server's port is the server's only when its pid is in the server's
process group or among its descendants (:func:`owned_listeners`, over a
:func:`listener_snapshot`). The LISTEN sockets are read from the kernel
(netlink ``sock_diag``, else ``/proc/net``: module :mod:`.procnet`), owners
only for the ports asked about; psutil is the fallback where neither can be read.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import Callable, Collection, Iterable

import msgspec
import psutil

from .errors import ProbeError, SpecError
from .procnet import PROC, ListeningSocket, listening_sockets, socket_owners

__all__ = [
    "Listener",
    "ListenerSnapshot",
    "free_port",
    "listener_snapshot",
    "listeners_beyond_loopback",
    "owned_listeners",
    "port_in_use",
    "wide_listeners",
]


class Listener(msgspec.Struct, frozen=True):
    """One TCP socket LISTENing beyond loopback, and the process that holds it.

    Attributes:
        address: the local address as :func:`wide_listeners` reports it: the
            bare IP, without the port (``"0.0.0.0"``, ``"::"``,
            ``"192.168.1.5"``, ``"fe80::1%eth0"``).
        port: the local TCP port.
        pid: the process holding the socket; None when the kernel does not
            tell us (an unprivileged reader cannot see other users' file
            descriptors). A socket shared by several processes (inherited
            across fork, passed over a Unix socket) is reported under one of
            them only, whichever the socket table read found first.
    """

    address: str
    port: int
    pid: int | None


class ListenerSnapshot(msgspec.Struct, frozen=True):
    """Every TCP socket LISTENing beyond loopback on this machine at one moment.

    The socket table is read when the snapshot is taken; the owner of a
    socket is looked up when :meth:`beyond_loopback` is asked about its port
    (reading every process's file descriptors for the whole table cost more
    than everything else an idle node does, and the node needs owners only
    for a wide listener on one of its own instances' ports, which is rare).

    Attributes:
        by_port: port -> its listeners with their owners already known (the
            psutil fallback, or a snapshot built by hand), without duplicates
            (two sockets of one process on one address are one
            :class:`Listener`), ordered by address then pid (None first).
            Ports with no wide listener are absent.
        sockets: port -> the wide LISTEN sockets read from the kernel
            whose owners are looked up when asked (by socket inode, under
            ``proc``). Ports with no wide listener are absent.
        proc: where procfs is mounted, for the owner lookup.
    """

    by_port: dict[int, tuple[Listener, ...]] = msgspec.field(default_factory=dict)
    sockets: dict[int, tuple[ListeningSocket, ...]] = msgspec.field(default_factory=dict)
    proc: str = PROC

    def beyond_loopback(self, port: int) -> tuple[Listener, ...]:
        """The listeners beyond loopback on ``port`` with their owners' pids; empty
        when there are none.

        For a socket read from the kernel the owner is looked up now (one pass
        over ``/proc/*/fd``, only when ``port`` has a wide listener): a socket
        whose process has ended since the table was read, or that no readable
        process holds, has pid None, which :func:`owned_listeners` counts as
        not ours. Deduplicated and ordered as :attr:`by_port`.
        """
        known = self.by_port.get(port)
        if known is not None:
            return known
        found = self.sockets.get(port, ())
        if not found:
            return ()
        owners = socket_owners({s.inode for s in found}, self.proc)
        return _ordered({Listener(s.address, s.port, owners.get(s.inode)) for s in found})

    def ports(self) -> dict[int, list[str]]:
        """Port -> its addresses beyond loopback, sorted, without duplicates,
        whoever holds them: the shape :func:`wide_listeners` returns. Reads
        nothing (no owner is looked up)."""
        addresses: dict[int, set[str]] = {}
        for port, listeners in self.by_port.items():
            addresses.setdefault(port, set()).update(li.address for li in listeners)
        for port, sockets in self.sockets.items():
            addresses.setdefault(port, set()).update(s.address for s in sockets)
        return {port: sorted(found) for port, found in addresses.items()}


def _ordered(listeners: Iterable[Listener]) -> tuple[Listener, ...]:
    return tuple(sorted(listeners, key=lambda x: (x.address, -1 if x.pid is None else x.pid)))


def _address(host: str, port: int) -> tuple[socket.AddressFamily, tuple[str, int]]:
    host = "127.0.0.1" if host == "localhost" else host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise SpecError(f"host {host!r} does not resolve: {e}", field="host") from e
    family, _, _, _, sockaddr = infos[0]
    return family, (str(sockaddr[0]), int(sockaddr[1]))


def port_in_use(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something answers on ``host:port`` or the address cannot be bound.

    First a TCP connect (up to ``timeout`` seconds): success means a listener.
    Otherwise a bind of ``host:port`` is tried with SO_REUSEADDR (as servers
    set it, so connections lingering in TIME_WAIT do not count) and without
    SO_REUSEPORT (so a live listener always makes it fail). Any bind failure,
    an address this machine does not own included, counts as in use: the
    caller is about to refuse a start, and refusing is the safe answer.

    Raises:
        SpecError: ``host`` does not resolve.
    """
    family, addr = _address(host, port)
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout)
        with contextlib.suppress(OSError):
            probe.connect(addr)
            return True
    with socket.socket(family, socket.SOCK_STREAM) as trial:
        trial.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            trial.bind(addr)
        except OSError:
            return True
    return False


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel reports free on ``host`` right now (it may be taken
    again before it is used: bind it promptly).

    Raises:
        SpecError: ``host`` does not resolve or is not an address of this machine.
    """
    family, (addr, _) = _address(host, 0)
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((addr, 0))
        except OSError as e:
            raise SpecError(f"cannot bind {host}: {e}", field="host") from e
        return int(s.getsockname()[1])


def _is_loopback(ip: str) -> bool:
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def _psutil_snapshot(purpose: str) -> ListenerSnapshot:
    """The fallback where the kernel's table cannot be read: psutil's socket table,
    owners included (psutil reads every process's file descriptors for them).

    Raises:
        ProbeError: the socket table cannot be read (not permitted); the
            message names ``purpose``.
    """
    try:
        conns = psutil.net_connections(kind="tcp")  # LISTEN is TCP: UDP lines cost for nothing
    except (psutil.Error, OSError) as e:
        raise ProbeError(f"cannot read the socket table{purpose}: {e}") from e
    found: dict[int, set[Listener]] = {}
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and not _is_loopback(c.laddr.ip):
            found.setdefault(c.laddr.port, set()).add(Listener(c.laddr.ip, c.laddr.port, c.pid))
    return ListenerSnapshot(by_port={port: _ordered(ls) for port, ls in found.items()})


def _snapshot(
    purpose: str, read: Callable[[], list[ListeningSocket]] | None = None
) -> ListenerSnapshot:
    """The snapshot from ``read`` (default :func:`.procnet.listening_sockets`),
    from psutil where that raises."""
    try:
        table = (read or listening_sockets)()
    except (OSError, ValueError):
        return _psutil_snapshot(purpose)
    found: dict[int, list[ListeningSocket]] = {}
    for s in table:
        if not _is_loopback(s.address):
            found.setdefault(s.port, []).append(s)
    return ListenerSnapshot(sockets={port: tuple(ss) for port, ss in found.items()})


def listeners_beyond_loopback(port: int) -> list[str]:
    """Local addresses with a TCP socket LISTENing on ``port`` that are not loopback.

    A wildcard (``0.0.0.0``, ``::``) counts: it answers on every interface.
    Read from the system socket table, whichever process owns the socket.
    Returns the addresses sorted, without duplicates; empty when none.

    Raises:
        ProbeError: the socket table cannot be read (not permitted).
    """
    return _snapshot(f" to check port {port}").ports().get(port, [])


def listener_snapshot() -> ListenerSnapshot:
    """Every TCP socket LISTENing beyond loopback on this machine; owners when asked.

    One read of the socket table for the whole node (take it once per
    reconcile tick and hand it to every instance, not once per instance):
    netlink ``sock_diag`` on Linux, LISTEN sockets only (about 0.1 ms), else
    ``/proc/net/tcp`` and ``tcp6`` (about 5 ms: the kernel walks every socket
    to print them), else psutil's table, which reads every process's file
    descriptors as well (tens of milliseconds on a busy machine). IPv4 and
    IPv6; a wildcard (``0.0.0.0``, ``::``) counts, as it answers on every
    interface; loopback (``127.0.0.0/8``, ``::1``, and
    IPv4-mapped loopback) does not. Owners are reported by
    :meth:`ListenerSnapshot.beyond_loopback` as :attr:`Listener.pid`; judge
    them with :func:`owned_listeners`.

    Returns:
        A :class:`ListenerSnapshot`.

    Raises:
        ProbeError: neither the kernel nor psutil can read the socket table
            (not permitted).
    """
    return _snapshot("")


def owned_listeners(
    listeners: Iterable[Listener], pgid: int, descendants: Collection[int]
) -> list[str]:
    """The addresses among ``listeners`` that belong to one managed server.

    A listener is the server's when its pid is in ``descendants`` (pids the
    server spawned that may have left its group, e.g. with ``setsid``) or
    when ``os.getpgid(pid) == pgid``. Everything else is somebody else's,
    even on the same port. At most one ``getpgid`` per listener; the process
    table is not scanned.

    Listeners that count as not ours:

    - pid None (the kernel did not say who holds the socket). Only an
      unprivileged reader sees that for sockets of other users; the node runs
      as root in production and in the tests, where every pid is known, so
      this does not hide a server of ours. A node run unprivileged must run
      its servers as its own user for them to be seen.
    - a pid that has exited (or whose group cannot be read) by the time it
      is asked: a socket of a vanished process is gone with it.

    Args:
        listeners: e.g. ``snapshot.beyond_loopback(port)`` for the server's port.
        pgid: the server's process group (the server is its leader).
        descendants: pids known to descend from the server (a
            ``dict[pid, start_time]`` works as well as a set).

    Returns:
        The owned listeners' addresses, sorted, without duplicates; empty when
        none is the server's.
    """
    ours: set[str] = set()
    for listener in listeners:
        pid = listener.pid
        if pid is None:
            continue
        if pid in descendants:
            ours.add(listener.address)
            continue
        try:
            group = os.getpgid(pid)
        except OSError:  # gone (ProcessLookupError), or not ours to see
            continue
        if group == pgid:
            ours.add(listener.address)
    return sorted(ours)


def wide_listeners() -> dict[int, list[str]]:
    """Every TCP port LISTENing beyond loopback on this machine, with its addresses.

    One read of the socket table (:func:`listener_snapshot`'s), no owner
    looked up. Whoever owns the sockets: use :func:`listener_snapshot`
    and :func:`owned_listeners` to tell a server's own from another program's.

    Returns:
        Port -> addresses (bare IPs), sorted, without duplicates; equal to
        ``listener_snapshot().ports()``.

    Raises:
        ProbeError: the socket table cannot be read (not permitted).
    """
    return listener_snapshot().ports()
