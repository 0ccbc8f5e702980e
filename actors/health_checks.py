"""The instance actor's health checks: sending probes and deep checks when the
core's pacing (:func:`~.core.pacing.pace`) says they are due, and turning what
comes back into observations for the core.

Nothing here runs on the actor's thread but the bookkeeping: a plain HTTP
probe goes to the node's probe engine (one event loop for every instance, each
probe with its own timeout), any other probe to the node's probe pool, a deep
check (one real token, up to ``deep_timeout_s``) to a thread of its own. Each
always reports back to the actor (a probe that raises is a miss), so no check
is ever left out.

A managed llama.cpp instance the residency rules can release (an
``idle_ttl_s``, or evictable: not pinned, on a node with a memory budget) also
has its server's own count of requests in progress read after a probe that
found it up (adapters/activity.py: ``/slots``, else ``/metrics``), on the
probe pool, and reported with the probe as ``o.ServerActivity``: clients that
talk to the server directly keep it busy (issue 21). A count the server cannot
give, or a read that fails, reports nothing: it never turns a busy instance
idle. Adopted servers and mlx-lm report none (no residency rules; no
counters); a managed Ollama instance's residency comes from ``/api/ps``
(:class:`~.core.observations.OllamaListed`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Any, Protocol

import msgspec

from infervisor.adapters.activity import ActivityError, ActivityReader
from infervisor.adapters.probe import Health, HealthKind, ProbeTarget, ServerReport
from infervisor.adapters.prober import HttpProber, Prober
from infervisor.adapters.server import ServerAdapter
from infervisor.adapters.spec import Flavor
from infervisor.replay import InstanceState, LifecycleState

from .core import observations as o
from .core.health import probe_token
from .core.pacing import Pacing, pace
from .core.rules import Mode, Rules
from .effects_runner import EffectRunner

__all__ = ["HealthChecks", "Probed", "miss"]

log = logging.getLogger(__name__)

#: The prober of contexts built without a node (its engine starts at a first probe).
_HTTP_FALLBACK = HttpProber()


class Probed(msgspec.Struct, frozen=True):
    """A probe's report, back to the actor."""

    token: int
    report: ServerReport
    latency_s: float  # from sending the probe to its report, seconds
    active: int | None = None  # the server's own count of requests in progress (None: unknown)


class Owner(Protocol):
    """What the checks need of the instance actor that owns them."""

    iid: str
    state: InstanceState
    rules: Rules
    adapter: ServerAdapter
    effects: EffectRunner

    @property
    def ctx(self) -> Any: ...

    def tell_self(self, message: Any) -> None: ...


class HealthChecks:
    """One instance's probes and deep checks (owned by its actor, used on its thread).

    Attributes:
        pacing: when each check was last sent and whether one is out.
        report: the last probe's report (None before the first).
        latency_s: how long the last probe took, seconds (real time).
    """

    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.pacing = Pacing()
        self.report: ServerReport | None = None
        self.latency_s: float | None = None
        self._activity: _Activity | None = None

    @property
    def probing(self) -> bool:
        """A probe is out."""
        return self.pacing.probing

    def tick(self) -> None:
        """A health tick: send the checks the pacing says are due."""
        owner = self.owner
        ctx = owner.ctx
        paced = pace(
            owner.state, owner.rules, self.pacing, ctx.clock.monotonic(), ctx.settings.tick_s / 2
        )
        self.pacing = paced.pacing
        token = probe_token(owner.state)
        if paced.deep:
            name = f"{owner.iid[:12]}-deep"
            threading.Thread(target=self._deep_job, args=(token,), name=name, daemon=True).start()
        if paced.probe:
            self._send_probe(token)

    def afresh(self) -> None:
        """Both checks due at the next tick (the chain records again: what was
        observed while it did not is no verdict)."""
        self.pacing = self.pacing.afresh()

    def deep_checked(self) -> None:
        """A deep check reported."""
        self.pacing = self.pacing.deep_checked()

    def probed(self, message: Probed) -> Iterator[o.Observation]:
        """A probe came back: the observations it makes, in order (the report is
        judged first; what Ollama listed in it, after)."""
        self.pacing = self.pacing.probed()
        report = self.report = message.report
        self.latency_s = message.latency_s
        # The output is read for a failure line only while starting (the core
        # judges it only then); decoding its tails on every probe costs.
        starting = self.owner.state.lifecycle is LifecycleState.STARTING
        failure = self._failure() if starting else None
        yield o.ProbeResult(token=message.token, report=report, failure=failure)
        listed = self._ollama_listed(report)
        if listed is not None:
            yield listed
        if message.active is not None:
            yield o.ServerActivity(active=message.active)

    def close(self) -> None:
        """Close the activity reader's connection (the actor stops)."""
        if self._activity is not None:
            self._activity.close()
            self._activity = None

    def _send_probe(self, token: int) -> None:
        owner, engine = self.owner, self.owner.ctx.engine
        activity = self._activity_reader()
        if engine is not None and owner.adapter.plain_probe:
            deliver = partial(self._probed_by_engine, token, time.perf_counter(), activity)
            engine.probe(owner.iid, self.target(), deliver)
        else:
            owner.ctx.probes.submit(self._probe_job, token, activity)

    def _probed_by_engine(
        self, token: int, sent: float, activity: _Activity | None, report: ServerReport
    ) -> None:
        """On the engine's thread: hand the report (and its latency) to the actor;
        with an activity read to make, on the probe pool (never the engine's loop)."""
        latency = time.perf_counter() - sent
        if activity is None or report.health.kind is not HealthKind.UP:
            self.owner.tell_self(Probed(token=token, report=report, latency_s=latency))
            return
        self.owner.ctx.probes.submit(self._activity_job, token, report, latency, activity)

    def _activity_job(
        self, token: int, report: ServerReport, latency: float, activity: _Activity
    ) -> None:
        """On a probe worker: the probe's report with the server's own count."""
        active = activity.read(self.owner.ctx.clock.wall_ns())
        self.owner.tell_self(Probed(token=token, report=report, latency_s=latency, active=active))

    def _probe_job(self, token: int, activity: _Activity | None = None) -> None:
        """On a probe worker: always answer, so a probe that raises is a miss, never a
        probe that never ends."""
        sent = time.perf_counter()
        try:
            report = self.owner.adapter.probe()
        except Exception as e:  # noqa: BLE001 - reported as the probe's verdict
            why = f"probe error: {type(e).__name__}: {e}"
            report = ServerReport(health=Health(kind=HealthKind.UNHEALTHY, reason=why))
        latency = time.perf_counter() - sent
        active = None
        if activity is not None and report.health.kind is HealthKind.UP:
            active = activity.read(self.owner.ctx.clock.wall_ns())
        self.owner.tell_self(Probed(token=token, report=report, latency_s=latency, active=active))

    def _activity_reader(self) -> _Activity | None:
        """The server's counters to read with this probe (None: none to read; see
        the module's docstring for which instances have them read)."""
        rules, ctx = self.owner.rules, self.owner.ctx
        evictable = not rules.pinned and ctx.ledger is not None
        wanted = rules.mode is Mode.PROCESS and rules.flavor is Flavor.LLAMACPP
        if not wanted or (rules.idle_ttl_s is None and not evictable):
            self.close()
            return None
        base_url = self.owner.adapter.spec.base_url
        if self._activity is None or self._activity.base_url != base_url:
            self.close()
            self._activity = _Activity(base_url, ctx.settings.probe_timeout_s)
        return self._activity

    def _deep_job(self, token: int) -> None:
        """On a thread of its own: one real token; the verdict is told to the actor."""
        try:
            self.deep_health()
            error: str | None = None
        except Exception as e:  # noqa: BLE001 - every failure is the check's verdict
            error = str(e) or type(e).__name__
        self.owner.tell_self(o.DeepChecked(token=token, error=error))

    @property
    def prober(self) -> Prober:
        """The node's prober (the probes seam, adapters/prober.py)."""
        return self.owner.ctx.engine or _HTTP_FALLBACK

    def target(self, timeout_s: float | None = None) -> ProbeTarget:
        """This instance's server, each request within ``timeout_s`` seconds
        (None: the node's probe timeout)."""
        spec, settings = self.owner.adapter.spec, self.owner.ctx.settings
        timeout = settings.probe_timeout_s if timeout_s is None else timeout_s
        return ProbeTarget(spec.base_url, spec.flavor, timeout)

    def deep_health(self) -> str:
        """The probe plus one real token, through the prober (any thread).

        Raises:
            ProbeError: no token (the check's verdict).
        """
        target = self.target(self.owner.ctx.settings.deep_timeout_s)
        return self.prober.deep_health(target, self.owner.adapter.deep_model)

    def _ollama_listed(self, report: ServerReport) -> o.OllamaListed | None:
        """Managed Ollama: what ``/api/ps`` said of this model, when it gave a list."""
        rules = self.owner.rules
        if rules.mode is not Mode.OLLAMA or report.running is None:
            return None
        if report.health.kind is not HealthKind.UP:
            return None
        entry = report.running_model(rules.served_model or "")
        if entry is None:
            return o.OllamaListed(listed=False)
        return o.OllamaListed(
            listed=True,
            size_bytes=entry.size_bytes,
            size_vram_bytes=entry.size_vram_bytes,
            expires_at_ns=entry.expires_at_ns,
        )

    def _failure(self) -> str | None:
        """A line of the server's output saying it will never serve."""
        proc, adapter = self.owner.effects.proc, self.owner.adapter
        find = getattr(adapter, "failure_in_output", None)
        if proc is None or find is None:
            return None
        out, err = proc.output()
        found: str | None = find(out[-8192:] + "\n" + err[-8192:])
        return found


class _Activity:
    """One instance's :class:`ActivityReader`, shared by its probes' jobs: a read
    while another is out (the reader is not thread-safe) gives None."""

    def __init__(self, base_url: str, timeout_s: float) -> None:
        self.base_url = base_url
        self._reader = ActivityReader(Flavor.LLAMACPP, base_url, timeout=timeout_s)
        self._lock = threading.Lock()

    def read(self, now_ns: int) -> int | None:
        """Requests the server serves now; None when it cannot say or the read fails."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._reader.read(now_ns).in_flight
        except ActivityError:
            return None
        except Exception:  # the probe must still report; the count is unknown
            log.exception("activity read of %s", self.base_url)
            return None
        finally:
            self._lock.release()

    def close(self) -> None:
        self._reader.close()


def miss(token: int, error: Exception) -> o.ProbeResult:
    """A probe whose handling raised, as a miss with the error as its reason."""
    why = f"handler error: {type(error).__name__}: {error}"
    report = ServerReport(health=Health(kind=HealthKind.UNHEALTHY, reason=why))
    return o.ProbeResult(token=token, report=report)
