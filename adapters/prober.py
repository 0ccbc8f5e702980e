"""The probes seam: the one interface the actors use to ask a server how it is.

Three questions, whatever the flavor (``reference/infer_runtime.rs.txt``
``ServerClient::probe`` and ``deep_health``):

- :meth:`Prober.probe`: the liveness/readiness probe the health tick makes,
  answered later through a callback (Ollama's ``/api/ps`` listing comes with
  it, as :attr:`~.probe.ServerReport.running`);
- :meth:`Prober.check`: the same probe, answered at once (an adopted start
  confirming the server answers);
- :meth:`Prober.deep_health`: the probe plus one real token.

:class:`HttpProber` is the real one (the node's :class:`~.probe_engine.ProbeEngine`
for the periodic probes, a fresh :class:`~.probe.ServerClient` for the others);
:class:`~.prober_fake.ScriptedProber` beside it answers as a test scripts it,
as httpx keeps its mock transport beside the real ones.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Protocol

from .errors import ProbeError
from .probe import Health, HealthKind, ProbeTarget, ServerClient, ServerReport, deep_health
from .probe_engine import ProbeEngine, ReportTo

__all__ = ["HttpProber", "ModelChoice", "Prober"]

#: Picks the model a deep health check asks for one token, from the probe's report
#: (None lets the server choose).
ModelChoice = Callable[[ServerReport], str | None]


class Prober(Protocol):
    """What the actors need to probe servers. Implementations never raise from
    :meth:`probe` or :meth:`check`: a server that does not answer is a report."""

    def probe(self, key: Hashable, target: ProbeTarget, done: ReportTo) -> None:
        """Probe ``target`` once; ``done(report)`` follows on another thread.

        ``key`` names the server (an instance id): one probe per key at a time
        (a second one while the first runs is answered at once as unhealthy),
        and what is kept for it (a connection) is dropped by :meth:`forget`.
        After :meth:`close`, ``done`` is never called."""
        ...

    def check(self, target: ProbeTarget) -> ServerReport:
        """Probe ``target`` once and return the report; blocks up to a few
        ``timeout_s`` (one per request of the probe)."""
        ...

    def deep_health(self, target: ProbeTarget, model: ModelChoice) -> str:
        """The probe plus one real token (``model`` picks the model from the
        report); blocks up to ``timeout_s`` per request.

        Returns:
            The token.

        Raises:
            ProbeError: the server is not up, or gave no token; the message says which.
        """
        ...

    def forget(self, key: Hashable) -> None:
        """Drop what is kept for ``key`` (an instance that went away)."""
        ...

    def close(self) -> None:
        """Stop probing; probes in flight report nothing."""
        ...


class HttpProber:
    """The real probes, over HTTP (:class:`ProbeEngine` for :meth:`probe`, its
    thread started at the first one; a fresh :class:`ServerClient` per
    :meth:`check` or :meth:`deep_health`). Thread-safe.

    ``max_body``: bytes of any response body read (the rest is not).
    """

    def __init__(self, *, max_body: int = 64 * 1024) -> None:
        self._max_body = max_body
        self._lock = threading.Lock()
        self._engine: ProbeEngine | None = None  # its thread starts at the first probe
        self._closed = False

    def probe(self, key: Hashable, target: ProbeTarget, done: ReportTo) -> None:
        with self._lock:
            if self._closed:
                return
            if self._engine is None:
                self._engine = ProbeEngine(max_body=self._max_body)
            engine = self._engine
        engine.probe(key, target, done)

    def timers(self) -> ProbeEngine | None:
        """The engine as a clock whose timers run on its thread, where the
        reports land: probes scheduled on it hand nothing between threads
        (None once closed)."""
        with self._lock:
            if self._closed:
                return None
            if self._engine is None:
                self._engine = ProbeEngine(max_body=self._max_body)
            return self._engine

    def check(self, target: ProbeTarget) -> ServerReport:
        try:
            client = ServerClient(target.base_url, target.timeout_s, max_body=self._max_body)
        except ProbeError as e:  # a URL no request can be made to: a verdict, as the engine's
            return ServerReport(Health(HealthKind.UNHEALTHY, str(e)), flavor=target.flavor)
        with client:
            return client.probe(target.flavor)

    def deep_health(self, target: ProbeTarget, model: ModelChoice) -> str:
        return deep_health(target.base_url, target.flavor, target.timeout_s, model)

    def forget(self, key: Hashable) -> None:
        with self._lock:
            engine = self._engine
        if engine is not None:
            engine.forget(key)

    def close(self) -> None:
        with self._lock:
            engine, self._closed = self._engine, True
        if engine is not None:
            engine.close()
