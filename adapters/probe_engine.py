"""One probing engine for the whole node: every health probe on one event loop.

A thread per probe (or a pool of them) costs the node most of its idle CPU:
each probe hands the GIL between threads several times, and a pool of K
workers lets K hung servers delay every other probe. The engine runs all
probes as tasks of one asyncio loop on one thread instead, with a kept-alive
HTTP/1.1 connection per server. Each request has its own timeout, so a hung
server delays nothing but its own probe.

HTTP is parsed by h11 (the sans-IO HTTP/1.1 library httpx's own stack is
built on; well-kept, no hand-written parsing). A probe's requests and its
verdict are :class:`~.probe.ProbeSteps`, the same steps the
synchronous :class:`~.probe.ServerClient` drives, so both judge alike.

Thread-safe entry points: :meth:`ProbeEngine.probe`, :meth:`ProbeEngine.forget`,
:meth:`ProbeEngine.close`, :meth:`ProbeEngine.call_later` (a timer on the
engine's loop: whoever schedules probes on it, actors/probe_loop.py, hands no
message between threads for a probe). The report is handed to the ``done`` callback on
the engine's thread: it must be quick (an actor's ``tell``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import threading
from collections.abc import Callable, Hashable
from urllib.parse import urlsplit

import h11
import msgspec

from .errors import ProbeError
from .probe import Health, HealthKind, ProbeSteps, ProbeTarget, ServerReport, _Reply
from .spec import Flavor

__all__ = ["Later", "ProbeEngine", "ReportTo"]

#: Called with a probe's report (on the engine's thread: keep it quick, an actor's ``tell``).
ReportTo = Callable[[ServerReport], None]

log = logging.getLogger(__name__)

_READ = 65536  # bytes asked of the socket at once
_END = h11.EndOfMessage()
_CLOSED = "{where}: the server closed the connection without answering"
#: A kept-alive connection: the HTTP state machine and the stream pair.
_Link = tuple[h11.Connection, asyncio.StreamReader, asyncio.StreamWriter]


class _Connection:
    """A kept-alive connection to one server; lives on the engine's loop."""

    def __init__(self, base_url: str, timeout: float, max_body: int) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ProbeError(f"invalid server URL {base_url!r}: expected http://host:port")
        self.base_url = base_url
        self._tls = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._tls else 80)
        self._host_header = parts.netloc
        self.timeout, self._max_body = timeout, max_body
        self._link: _Link | None = None
        self._requests: dict[str, h11.Request] = {}
        self._retired = False
        #: Seconds the last timeout fired after it was due (0: none fired late).
        self.late_s = 0.0

    async def get(self, path: str) -> _Reply:
        """``GET path`` within the timeout; a kept-alive connection the server
        closed meanwhile is replaced once.

        Raises:
            ProbeError: no answer (refused, timed out, reset, not HTTP), worded
                as :class:`~.probe.ServerClient` words it.
        """
        where = f"{self.base_url}{path}"
        reused = self._link is not None
        loop = asyncio.get_running_loop()
        due = loop.time() + self.timeout
        try:
            async with asyncio.timeout_at(due):
                return await self._exchange_once_more(path, where, again=reused)
        except TimeoutError:
            self.close()
            self.late_s = max(self.late_s, loop.time() - due)  # the loop did not run on time
            raise ProbeError(f"{where}: no answer within {self.timeout} s") from None
        except BaseException:
            self.close()  # whatever went wrong, this connection is not used again
            raise

    def retire(self) -> None:
        """Drop the connection for good: a probe still running opens no other."""
        self._retired = True
        self.close()

    def close(self) -> None:
        """Drop the connection (the next GET opens a new one)."""
        link, self._link = self._link, None
        if link is not None:
            link[2].transport.abort()

    async def _exchange_once_more(self, path: str, where: str, *, again: bool) -> _Reply:
        """One exchange; with ``again``, a second on a new connection when the kept
        one turned out closed (never a third)."""
        try:
            return await self._exchange(path, where)
        except _Stale:
            self.close()
            if not again:
                raise ProbeError(_CLOSED.format(where=where)) from None
        try:
            return await self._exchange(path, where)
        except _Stale:
            self.close()
            raise ProbeError(_CLOSED.format(where=where)) from None

    async def _exchange(self, path: str, where: str) -> _Reply:
        if self._link is not None and self._link[0].our_state is not h11.IDLE:
            self.close()  # a connection h11 no longer takes a request on: a new one
        if self._link is None:
            if self._retired:
                raise ProbeError(f"{where}: not probed any more (the instance went away)")
            self._link = await self._connect(where)
            if self._retired:  # retired while it connected
                self.close()
                raise ProbeError(f"{where}: not probed any more (the instance went away)")
        conn, reader, writer = self._link
        request = self._requests.get(path)
        if request is None:  # h11 validates a request's headers as it is made: once a path
            headers = [("Host", self._host_header), ("Accept", "application/json")]
            request = self._requests[path] = h11.Request(method="GET", target=path, headers=headers)
        try:
            writer.write(conn.send(request))
            writer.write(conn.send(_END) or b"")
            return await self._response(conn, reader)
        except (ConnectionResetError, BrokenPipeError, _Stale) as e:
            raise _Stale from e
        except h11.RemoteProtocolError as e:
            raise ProbeError(f"{where}: not an HTTP answer ({e})") from e
        except h11.LocalProtocolError as e:
            raise ProbeError(f"{where}: the request could not be sent ({e})") from e
        except OSError as e:
            raise ProbeError(f"{where}: {e.strerror or type(e).__name__}") from e

    async def _response(self, conn: h11.Connection, reader: asyncio.StreamReader) -> _Reply:
        status, body, heard = 0, bytearray(), False
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(_READ)
                if not data and not heard:
                    raise _Stale  # closed before a byte of the answer
                heard = True
                conn.receive_data(data)
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                room = self._max_body - len(body)
                body += event.data[:room]
                if len(event.data) > room:  # the rest is never read
                    self.close()
                    return _Reply(status, bytes(body), truncated=True)
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise _Stale
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        else:
            self.close()  # the server closes after this answer (HTTP/1.0, Connection: close)
        return _Reply(status, bytes(body), truncated=False)

    async def _connect(self, where: str) -> _Link:
        context = ssl.create_default_context() if self._tls else None
        try:
            reader, writer = await asyncio.open_connection(self._host, self._port, ssl=context)
        except OSError as e:
            raise ProbeError(f"{where}: cannot connect ({e.strerror or e})") from e
        return h11.Connection(h11.CLIENT), reader, writer


class _Stale(Exception):
    """The server closed a kept-alive connection before answering."""


class _Server:
    """What the engine keeps per probed server: its connection and probe steps."""

    def __init__(self, base_url: str, timeout: float, max_body: int) -> None:
        self.connection = _Connection(base_url, timeout, max_body)
        self.steps = ProbeSteps(max_body)
        self.busy = False


class Later:
    """A callback scheduled on the engine's loop; :meth:`cancel` keeps it from
    running (idempotent, from any thread)."""

    __slots__ = ("cancelled", "fn")

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        """Do not run (a no-op once it has run)."""
        self.cancelled = True

    def run(self) -> None:
        if self.cancelled:
            return
        try:
            self.fn()
        except Exception:
            log.exception("probe engine: a scheduled callback failed")


class ProbeEngine:
    """Probes every server of the node on one asyncio loop (thread ``probe-engine``).

    ``max_body``: bytes of any response body read (the rest is not).
    """

    def __init__(self, *, max_body: int = 64 * 1024) -> None:
        self._max_body = max_body
        self._loop = asyncio.new_event_loop()
        self._servers: dict[Hashable, _Server] = {}  # touched on the loop only
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._run, name="probe-engine", daemon=True)
        self._closed = False
        self._thread.start()

    def probe(self, key: Hashable, target: ProbeTarget, done: ReportTo) -> None:
        """Probe the server ``key`` at ``target.base_url`` once; ``done(report)``
        follows on the engine's thread (never an exception: a failure is a report).
        ``target.timeout_s``: seconds for each of the probe's requests. One probe
        per key at a time: a second one while the first runs is answered at once
        as unhealthy. After :meth:`close`, ``done`` is never called."""
        if self._closed:
            return
        if threading.get_ident() == self._thread.ident:  # on the loop: no hand-off
            self._start(key, target, done)
            return
        with contextlib.suppress(RuntimeError):  # closed meanwhile
            self._loop.call_soon_threadsafe(self._start, key, target, done)

    def monotonic(self) -> float:
        """The clock :meth:`call_later` counts on (``time.monotonic``), seconds."""
        return self._loop.time()

    def call_later(self, delay: float, fn: Callable[[], None]) -> Later:
        """Run ``fn`` on the engine's thread after ``delay`` seconds (it must be
        quick, as a report callback). Never runs after :meth:`close`."""
        later = Later(fn)
        if threading.get_ident() == self._thread.ident:
            self._loop.call_later(max(delay, 0.0), later.run)
        elif not self._closed:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._loop.call_later, max(delay, 0.0), later.run)
        return later

    def forget(self, key: Hashable) -> None:
        """Close the connection kept for ``key`` (an instance that went away)."""
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._forget, key)

    def close(self) -> None:
        """Stop the loop and drop every connection; probes in flight report nothing."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._stop)
        self._thread.join()

    # ------------------------------------------------------------ on the loop
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    def _start(self, key: Hashable, target: ProbeTarget, done: ReportTo) -> None:
        base_url, flavor, timeout = target.base_url, target.flavor, target.timeout_s
        server = self._servers.get(key)
        if server is None or server.connection.base_url != base_url:
            if server is not None:
                server.connection.retire()
            try:
                server = _Server(base_url, timeout, self._max_body)
            except ProbeError as e:
                _deliver(done, _report(HealthKind.UNHEALTHY, str(e), flavor))
                return
            self._servers[key] = server
        if server.busy:
            _deliver(done, _report(HealthKind.UNHEALTHY, "a probe is still running", flavor))
            return
        server.busy = True
        server.connection.timeout = timeout
        task = self._loop.create_task(self._probe(server, flavor, done))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _probe(self, server: _Server, flavor: Flavor, done: ReportTo) -> None:
        server.connection.late_s = 0.0
        try:
            report = await _drive(server, flavor)
            report = _with_lateness(report, server.connection.late_s)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a bug is a probe verdict, not a lost probe
            report = _report(HealthKind.UNHEALTHY, f"probe error: {type(e).__name__}: {e}", flavor)
        finally:
            server.busy = False
        _deliver(done, report)

    def _forget(self, key: Hashable) -> None:
        server = self._servers.pop(key, None)
        if server is not None:
            server.connection.retire()

    def _stop(self) -> None:
        self._loop.create_task(self._shutdown())

    async def _shutdown(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for server in self._servers.values():
            server.connection.retire()
        self._servers.clear()
        await asyncio.sleep(0)  # let the aborted transports close their sockets
        self._loop.stop()


async def _drive(server: _Server, flavor: Flavor) -> ServerReport:
    """Run one probe's steps over the server's connection."""
    steps = server.steps.probe(flavor)
    try:
        path = next(steps)
        while True:
            try:
                reply = await server.connection.get(path)
            except ProbeError as e:
                path = steps.throw(e)
            else:
                path = steps.send(reply)
    except StopIteration as stop:
        report: ServerReport = stop.value
        return report


def _with_lateness(report: ServerReport, late_s: float) -> ServerReport:
    """A failed probe whose timeout fired late says by how much (Health.node_late_s)."""
    if late_s <= 0 or report.health.kind is HealthKind.UP:
        return report
    return msgspec.structs.replace(
        report, health=msgspec.structs.replace(report.health, node_late_s=late_s)
    )


def _report(kind: HealthKind, reason: str, flavor: Flavor) -> ServerReport:
    return ServerReport(Health(kind, reason), flavor=flavor)


def _deliver(done: ReportTo, report: ServerReport) -> None:
    try:
        done(report)
    except Exception:
        log.exception("probe engine: the report callback failed")
