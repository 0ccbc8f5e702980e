"""Is a port taken, a free port, and who listens on a port beyond loopback.

Source of the behaviour: ``reference/infer_lifecycle.rs.txt`` (``port_in_use``
guards every start and restart: nothing starts over a port already listening;
``reachable_beyond_loopback`` finds a managed server listening on a
non-loopback address so it can be stopped).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket

import psutil

from .errors import ProbeError, SpecError

__all__ = ["free_port", "listeners_beyond_loopback", "port_in_use", "wide_listeners"]


def _address(host: str, port: int) -> tuple[socket.AddressFamily, tuple[str, int]]:
    host = "127.0.0.1" if host == "localhost" else host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise SpecError(f"host {host!r} does not resolve: {e}") from e
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
            raise SpecError(f"cannot bind {host}: {e}") from e
        return int(s.getsockname()[1])


def _is_loopback(ip: str) -> bool:
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def listeners_beyond_loopback(port: int) -> list[str]:
    """Local addresses with a TCP socket LISTENing on ``port`` that are not loopback.

    A wildcard (``0.0.0.0``, ``::``) counts: it answers on every interface.
    Read from the system socket table, whichever process owns the socket.
    Returns the addresses sorted, without duplicates; empty when none.

    Raises:
        ProbeError: the socket table cannot be read (not permitted).
    """
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError) as e:
        raise ProbeError(f"cannot read the socket table to check port {port}: {e}") from e
    found = {
        c.laddr.ip
        for c in conns
        if c.status == psutil.CONN_LISTEN
        and c.laddr
        and c.laddr.port == port
        and not _is_loopback(c.laddr.ip)
    }
    return sorted(found)


def wide_listeners() -> dict[int, list[str]]:
    """Every TCP port LISTENing beyond loopback on this machine, with its addresses.

    One read of the socket table for all instances (it costs tens of
    milliseconds on a busy machine, so it is taken once per reconcile tick,
    not per instance).

    Raises:
        ProbeError: the socket table cannot be read (not permitted).
    """
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError) as e:
        raise ProbeError(f"cannot read the socket table: {e}") from e
    found: dict[int, set[str]] = {}
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and not _is_loopback(c.laddr.ip):
            found.setdefault(c.laddr.port, set()).add(c.laddr.ip)
    return {port: sorted(ips) for port, ips in found.items()}
