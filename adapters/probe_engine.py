"""One probing engine for the whole node: every health probe on one event loop.

A thread per probe (or a pool of them) costs the node most of its idle CPU:
each probe hands the GIL between threads several times, and a pool of K
workers lets K hung servers delay every other probe. The engine runs all
probes as tasks of one asyncio loop on one thread instead, with a kept-alive
HTTP/1.1 connection per server. Each request has its own timeout, so a hung
server delays nothing but its own probe.

The HTTP exchange is :mod:`.probe_http`'s (httptools' C parser, a request
encoded once per path; h11 before, whose pure-Python state machine was most
of a probe's cost). A probe's requests and its
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
import threading
from collections.abc import Callable, Coroutine, Hashable
from typing import Any

import msgspec

from .errors import ProbeError
from .probe import Health, HealthKind, ProbeSteps, ProbeTarget, ServerReport
from .probe_http import Connection, Outcome
from .spec import Flavor

__all__ = ["Later", "ProbeEngine", "ReportTo"]

#: Called with a probe's report (on the engine's thread: keep it quick, an actor's ``tell``).
ReportTo = Callable[[ServerReport], None]

log = logging.getLogger(__name__)


class _Server:
    """What the engine keeps per probed server: its connection and probe steps."""

    def __init__(self, base_url: str, timeout: float, max_body: int) -> None:
        self.connection = Connection(base_url, timeout, max_body)
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
        server.connection.late_s = 0.0
        _Probe(self, server, flavor, done).go(None)

    def _run_task(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run ``coroutine`` as a task (cancelled at :meth:`close`)."""
        task = self._loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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


class _Probe:
    """One probe's steps, driven by the answers' callbacks over the kept
    connection (no task, no future: most of a steady probe's cost was theirs);
    a step that needs a new connection awaits it in a task, then goes on so."""

    __slots__ = ("done", "engine", "flavor", "path", "server", "steps")

    def __init__(self, engine: ProbeEngine, server: _Server, flavor: Flavor, done: ReportTo):
        self.engine, self.server, self.flavor, self.done = engine, server, flavor, done
        self.steps = server.steps.probe(flavor)
        self.path = ""

    def go(self, outcome: Outcome) -> None:
        """Feed the steps ``outcome`` (None: none yet) and send the next request."""
        try:
            steps = self.steps
            if outcome is None:
                path = next(steps)
            elif isinstance(outcome, ProbeError):
                path = steps.throw(outcome)
            else:
                path = steps.send(outcome)
            self.path = path
            try:
                sent = self.server.connection.send(path, self.answered)
            except ProbeError as e:
                self.go(e)
                return
        except StopIteration as stop:
            self.finish(stop.value)
            return
        except Exception as e:  # noqa: BLE001 - a bug is a probe verdict, not a lost probe
            self.failed(e)
            return
        if not sent:  # no kept connection: connecting awaits
            self.engine._run_task(self.rest())

    def answered(self, outcome: Outcome) -> None:
        """The request's outcome; None: the kept connection was closed, one more try."""
        if outcome is None:
            self.engine._run_task(self.rest())
        else:
            self.go(outcome)

    async def rest(self) -> None:
        """The current request over a new connection, then the steps go on."""
        outcome: Outcome
        try:
            outcome = await self.server.connection.get(self.path)
        except ProbeError as e:
            outcome = e
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a bug is a probe verdict, not a lost probe
            self.failed(e)
            return
        self.go(outcome)

    def failed(self, e: Exception) -> None:
        reason = f"probe error: {type(e).__name__}: {e}"
        self.finish(_report(HealthKind.UNHEALTHY, reason, self.flavor))

    def finish(self, report: ServerReport) -> None:
        """The report to its callback (never once the engine is closed)."""
        self.server.busy = False
        if not self.engine._closed:
            _deliver(self.done, _with_lateness(report, self.server.connection.late_s))


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
