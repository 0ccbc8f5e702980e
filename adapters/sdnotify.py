"""systemd's service notification protocol: READY=1, STATUS=, STOPPING=1, WATCHDOG=1.

Source of the behaviour: sd_notify(3) and sd_watchdog_enabled(3). A service
under ``Type=notify`` tells its manager how it is by sending one datagram of
newline-separated ``VARIABLE=value`` assignments to the ``AF_UNIX`` socket
named by ``$NOTIFY_SOCKET``: an absolute path, or ``@name`` for a name in the
abstract namespace (a leading NUL byte on the wire). With ``WatchdogSec=``
the manager also sets ``$WATCHDOG_USEC`` (and ``$WATCHDOG_PID``, the pid it
means: a watchdog the manager set for another process is not ours) and kills
the service when ``WATCHDOG=1`` does not come within that many microseconds;
sd_watchdog_enabled(3) advises a ping every half of it.

Written here, about thirty lines of protocol, rather than taken from PyPI:
``sdnotify`` (last release 2017) swallows every error and knows no watchdog;
``systemd-watchdog`` paces the watchdog on the wall clock (``datetime.now``),
which jumps with the system's time; ``systemd-python`` and ``cysystemd`` build
against libsystemd.

Nothing here raises: a manager that is gone or a full socket buffer costs a
notification (logged once), never the node. Sends never block
(``MSG_DONTWAIT``): the watchdog ping runs on the supervisor's tick.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, MutableMapping

__all__ = ["ENV_NAMES", "Notifier"]

log = logging.getLogger(__name__)

#: The variables the manager sets; :meth:`Notifier.from_environ` takes them out
#: of the environment so that no child process inherits them (sd_notify(3),
#: ``unset_environment``).
ENV_NAMES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


class Notifier:
    """Sends notifications to a service manager; does nothing without one.

    Args:
        address: ``$NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract
            namespace); None or empty: no manager listens.
        watchdog_s: the manager's watchdog timeout, seconds (None: no watchdog).
        clock: a monotonic clock, seconds (the watchdog's pace).
    """

    def __init__(
        self,
        address: str | None,
        watchdog_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.address = address or None
        self.watchdog_s = watchdog_s if self.address else None
        self._clock = clock
        self._last_ping: float | None = None
        self._warned = False
        self._sock: socket.socket | None = None
        if self.address is not None and not self.address.startswith(("/", "@")):
            log.warning("NOTIFY_SOCKET=%s is not a path or @name: not notifying", self.address)
            self.address = self.watchdog_s = None

    @classmethod
    def from_environ(
        cls, environ: MutableMapping[str, str] | None = None, pid: int | None = None
    ) -> Notifier:
        """The manager named by ``environ`` (default ``os.environ``), whose
        variables it removes. ``$WATCHDOG_USEC`` counts only when
        ``$WATCHDOG_PID`` is unset or ``pid`` (default this process's)."""
        env = os.environ if environ is None else environ
        address, usec, wpid = (env.pop(name, None) for name in ENV_NAMES)
        watchdog_s = None
        if usec is not None and usec.isdigit() and int(usec) > 0:
            mine = str(os.getpid() if pid is None else pid)
            if wpid is None or wpid == mine:
                watchdog_s = int(usec) / 1_000_000
        return cls(address, watchdog_s)

    @property
    def enabled(self) -> bool:
        """Whether a manager listens."""
        return self.address is not None

    def send(self, *assignments: str) -> bool:
        """Send ``VARIABLE=value`` lines as one datagram; whether it went."""
        if self.address is None:
            return False
        wire = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(assignments).encode(), socket.MSG_DONTWAIT, wire)
        except OSError as e:
            if not self._warned:
                log.warning("systemd notification to %s failed: %s", self.address, e)
                self._warned = True
            return False
        return True

    def ready(self, status: str) -> bool:
        """``READY=1``: the service has started up (with its status line)."""
        return self.send("READY=1", f"STATUS={_one_line(status)}")

    def status(self, text: str) -> bool:
        """``STATUS=``: one line for ``systemctl status``."""
        return self.send(f"STATUS={_one_line(text)}")

    def stopping(self, status: str) -> bool:
        """``STOPPING=1``: a graceful stop has begun."""
        return self.send("STOPPING=1", f"STATUS={_one_line(status)}")

    def watchdog(self) -> bool:
        """``WATCHDOG=1`` if half the watchdog timeout has passed since the last; whether sent."""
        if self.watchdog_s is None:
            return False
        now = self._clock()
        if self._last_ping is not None and now - self._last_ping < self.watchdog_s / 2:
            return False
        self._last_ping = now
        return self.send("WATCHDOG=1")

    def close(self) -> None:
        """Close the socket (a later send opens another)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _one_line(text: str) -> str:
    return " ".join(text.split())
