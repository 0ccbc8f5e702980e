"""A scripted :class:`~.prober.Prober`: servers answer as a test says, no HTTP.

Beside the real :class:`~.prober.HttpProber` as httpx keeps its mock
transport beside the real ones: actor tests that need only probe behaviour
script each server's answers instead of running a fault-injection server.

A script is a list of answers per server (``base_url``), taken one per probe
(:meth:`~ScriptedProber.probe` and :meth:`~ScriptedProber.check` alike); the
last one repeats once the list is used up. The answers, worded as the real
probes word them (:mod:`.probe`)::

    UP        /health 200 (Ollama: /api/version answers), listing ``models``
    LOADING   503 "Loading model" (llama.cpp still loading its model)
    DOWN      connection refused: unreachable
    GARBAGE   200 with a body that is not JSON: unhealthy
    HANG      no answer: the report waits until :meth:`ScriptedProber.release`
              (then unreachable, "no answer within" the timeout), as the real
              probe's own timeout would end it

A :class:`~.probe.ServerReport` given as an answer is reported as it is (an
Ollama ``/api/ps`` listing, a node-late timeout). A server with no script
is DOWN. Thread-safe.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Hashable
from typing import Final

from .errors import ProbeError
from .probe import Health, HealthKind, ProbeTarget, ServerReport
from .probe_engine import ReportTo
from .prober import ModelChoice

__all__ = ["Answer", "ScriptedProber"]


class Answer(enum.Enum):
    """How a scripted server answers one probe."""

    UP = "up"
    LOADING = "loading"
    DOWN = "down"
    GARBAGE = "garbage"
    HANG = "hang"


Scripted = Answer | ServerReport

_DOWN: Final = Answer.DOWN


class ScriptedProber:
    """A :class:`~.prober.Prober` answering from per-server scripts.

    Attributes:
        probes: every probe asked, in order, as ``(key, target)`` (``key`` None
            for :meth:`check`).
        deep_asked: every deep health check, as ``(target, model chosen)``.
    """

    def __init__(self, *, models: tuple[str, ...] = ()) -> None:
        self._lock = threading.Lock()
        self._scripts: dict[str, list[Scripted]] = {}
        self._tokens: dict[str, list[str | ProbeError]] = {}
        self._hung: list[tuple[ProbeTarget, ReportTo]] = []
        self._busy: set[Hashable] = set()
        self._closed = False
        self._models = list(models)
        self.probes: list[tuple[Hashable | None, ProbeTarget]] = []
        self.deep_asked: list[tuple[ProbeTarget, str | None]] = []

    # ------------------------------------------------------------------ scripting
    def script(self, base_url: str, *answers: Scripted) -> None:
        """Answer the next probes of ``base_url`` with ``answers``, in order; the
        last repeats. Replaces what was left of its script."""
        if not answers:
            raise ValueError("script at least one answer (up, loading, down, garbage, hang)")
        with self._lock:
            self._scripts[base_url] = list(answers)

    def script_deep(self, base_url: str, *tokens: str | ProbeError) -> None:
        """Answer the next deep health checks of ``base_url`` (after a probe that is
        up) with ``tokens``: a token, or a :class:`ProbeError` raised; the last
        repeats. Unscripted, a deep check of an up server gives ``" fake"``."""
        with self._lock:
            self._tokens[base_url] = list(tokens)

    def release(self) -> int:
        """End every hung probe as its timeout would; returns how many there were."""
        with self._lock:
            hung, self._hung = self._hung, []
        for target, done in hung:
            done(_timed_out(target))
        return len(hung)

    # ------------------------------------------------------------------ Prober
    def probe(self, key: Hashable, target: ProbeTarget, done: ReportTo) -> None:
        with self._lock:
            if self._closed:
                return
            self.probes.append((key, target))
            if key in self._busy:
                busy = _report(target, HealthKind.UNHEALTHY, "a probe is still running")
                answer: Scripted = busy
            else:
                answer = self._next(target.base_url)
            if answer is Answer.HANG:
                self._busy.add(key)
                self._hung.append((target, lambda r: self._ended(key, done, r)))
                return
        done(self._report(target, answer))

    def check(self, target: ProbeTarget) -> ServerReport:
        with self._lock:
            self.probes.append((None, target))
            answer = self._next(target.base_url)
        if answer is Answer.HANG:  # a blocking probe ends at its own timeout
            return _timed_out(target)
        return self._report(target, answer)

    def deep_health(self, target: ProbeTarget, model: ModelChoice) -> str:
        report = self.check(target)
        if report.health.kind is not HealthKind.UP:
            raise ProbeError(f"deep health: {report.health.kind}: {report.health.reason}")
        chosen = model(report)
        with self._lock:
            self.deep_asked.append((target, chosen))
            tokens = self._tokens.get(target.base_url) or [" fake"]
            token = tokens.pop(0) if len(tokens) > 1 else tokens[0]
        if isinstance(token, ProbeError):
            raise token
        return token

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._busy.discard(key)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._hung.clear()

    # ------------------------------------------------------------------ helpers
    def _next(self, base_url: str) -> Scripted:
        script = self._scripts.get(base_url)
        if not script:
            return _DOWN
        return script.pop(0) if len(script) > 1 else script[0]

    def _ended(self, key: Hashable, done: ReportTo, report: ServerReport) -> None:
        with self._lock:
            self._busy.discard(key)
            closed = self._closed
        if not closed:
            done(report)

    def _report(self, target: ProbeTarget, answer: Scripted) -> ServerReport:
        if isinstance(answer, ServerReport):
            return answer
        where = f"{target.base_url}/health"
        match answer:
            case Answer.UP:
                return ServerReport(Health(HealthKind.UP), list(self._models), flavor=target.flavor)
            case Answer.LOADING:
                return _report(target, HealthKind.LOADING, "")
            case Answer.GARBAGE:
                return _report(target, HealthKind.UNHEALTHY, "HTTP 200: not JSON: '<garbage>'")
            case _:
                why = f"{where}: cannot connect (Connection refused)"
                return _report(target, HealthKind.UNREACHABLE, why)


def _report(target: ProbeTarget, kind: HealthKind, reason: str) -> ServerReport:
    return ServerReport(Health(kind, reason), flavor=target.flavor)


def _timed_out(target: ProbeTarget) -> ServerReport:
    why = f"{target.base_url}/health: no answer within {target.timeout_s} s"
    return _report(target, HealthKind.UNREACHABLE, why)
