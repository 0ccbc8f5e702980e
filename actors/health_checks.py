"""The instance actor's health checks: probes scheduled by the instance's
:class:`~.probe_loop.ProbeLoop` (which wakes the actor only when the core's
:func:`~.core.wake.wake_for` says so), deep checks sent when the core's pacing
(:func:`~.core.pacing.deep_paced`) says they are due, and what comes back
turned into observations for the core.

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
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from functools import partial
from typing import Any, Protocol

from infervisor.adapters.activity import ActivityError, ActivityReader
from infervisor.adapters.probe import Health, HealthKind, ProbeTarget, ServerReport
from infervisor.adapters.prober import HttpProber, Prober
from infervisor.adapters.server import ServerAdapter
from infervisor.adapters.spec import Flavor
from infervisor.replay import InstanceState, LifecycleState
from infervisor.replay.state import Stamp

from .clock import RealClock
from .core import observations as o
from .core.health import probe_token
from .core.pacing import Pacing, deep_paced
from .core.rules import Mode, Rules, Tracking
from .core.wake import watch_of
from .effects_runner import EffectRunner
from .probe_loop import Probed, ProbeLoop, Timers
from .timer_wheel import TimerWheel

__all__ = ["HealthChecks", "Probed", "miss"]

log = logging.getLogger(__name__)

#: The grid the node's probes are sent on, seconds: at most ``1 / PROBE_SLOT_S``
#: loop wake-ups a second to send them, each probe at most half a slot early or
#: late. A divisor of the readiness cadence (50 ms) and of whole-second intervals.
PROBE_SLOT_S = 0.025
#: Each probe engine's grid (one per engine: instances share its slots).
_WHEELS: weakref.WeakKeyDictionary[Any, TimerWheel] = weakref.WeakKeyDictionary()
_WHEELS_LOCK = threading.Lock()

#: The prober of contexts built without a node (its engine starts at a first probe).
_HTTP_FALLBACK = HttpProber()


class Owner(Protocol):
    """What the checks need of the instance actor that owns them."""

    iid: str
    state: InstanceState
    rules: Rules
    adapter: ServerAdapter
    effects: EffectRunner
    tracking: Tracking

    @property
    def ctx(self) -> Any: ...

    def tell_self(self, message: Any) -> None: ...

    def now(self) -> Stamp: ...


class HealthChecks:
    """One instance's probes and deep checks (owned by its actor, used on its thread).

    Attributes:
        pacing: when the last deep check was sent and whether one is out (the
            probes are the loop's).
        loop: the instance's probes, on their own timers.
    """

    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.pacing = Pacing()
        self._activity: _Activity | None = None
        self.loop = ProbeLoop(_timers(owner.ctx), self._send_probe, owner.tell_self)
        gates = getattr(owner.ctx, "gates", None)  # the supervisor's reconcile gates
        if gates is not None:
            gates.put(owner.iid, self.loop)

    @property
    def report(self) -> ServerReport | None:
        """The last probe's report (None before the first)."""
        return self.loop.report

    @property
    def latency_s(self) -> float | None:
        """How long the last probe took, seconds (real time; None before the first)."""
        return self.loop.latency_s

    @property
    def probing(self) -> bool:
        """A probe is out."""
        return self.loop.probing

    def tick(self) -> None:
        """A health tick told to the actor: the checks due now go now."""
        self._send_deep()
        self.loop.kick()

    def decided(self, *, recording: bool) -> None:
        """After a decision: send a deep check if one is due, and tell the loop
        what it watches (``recording``: no observation waits for the chain)."""
        if recording:
            self._send_deep()
        owner = self.owner
        watch = watch_of(
            owner.state, owner.rules, owner.tracking, self.pacing, owner.now(),
            recording=recording, port=owner.adapter.spec.port,
        )  # fmt: skip
        self.loop.publish(watch)

    def _send_deep(self) -> None:
        owner = self.owner
        paced = deep_paced(owner.state, owner.rules, self.pacing, owner.ctx.clock.monotonic())
        self.pacing = paced.pacing
        if paced.deep:
            token = probe_token(owner.state)
            name = f"{owner.iid[:12]}-deep"
            threading.Thread(target=self._deep_job, args=(token,), name=name, daemon=True).start()

    def afresh(self) -> None:
        """Both checks due at once (the chain records again: what was observed
        while it did not is no verdict)."""
        self.pacing = self.pacing.afresh()
        self.loop.afresh()

    def deep_checked(self) -> None:
        """A deep check reported."""
        self.pacing = self.pacing.deep_checked()

    def probed(self, message: Probed) -> Iterator[o.Observation]:
        """A probe came back: the observations it makes, in order (the report is
        judged first; what Ollama listed in it, after)."""
        report = message.report
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
        """Stop the probes; close the activity reader's connection (the actor stops)."""
        self.loop.close()
        gates = getattr(self.owner.ctx, "gates", None)
        if gates is not None:
            gates.drop(self.owner.iid, self.loop)
        self._close_activity()

    def _close_activity(self) -> None:
        if self._activity is not None:
            self._activity.close()
            self._activity = None

    def _send_probe(self, token: int, back: Back) -> None:
        """The loop's probe: through the engine (a plain HTTP probe) or the pool;
        ``back(probed)`` always follows, on another thread or at once."""
        owner, engine = self.owner, self.owner.ctx.engine
        activity = self._activity_reader()
        if engine is not None and owner.adapter.plain_probe:
            deliver = partial(self._probed_by_engine, token, time.perf_counter(), activity, back)
            engine.probe(owner.iid, self.target(), deliver)
        else:
            owner.ctx.probes.submit(self._probe_job, token, back, activity)

    def _probed_by_engine(
        self, token: int, sent: float, activity: _Activity | None, back: Back, report: ServerReport
    ) -> None:
        """On the engine's thread: the report (and its latency) to the loop;
        with an activity read to make, on the probe pool (never the engine's loop)."""
        latency = time.perf_counter() - sent
        if activity is None or report.health.kind is not HealthKind.UP:
            back(Probed(token=token, report=report, latency_s=latency))
            return
        self.owner.ctx.probes.submit(self._activity_job, token, report, latency, activity, back)

    def _activity_job(
        self, token: int, report: ServerReport, latency: float, activity: _Activity, back: Back
    ) -> None:
        """On a probe worker: the probe's report with the server's own count."""
        active = activity.read(self.owner.ctx.clock.wall_ns())
        back(Probed(token=token, report=report, latency_s=latency, active=active))

    def _probe_job(self, token: int, back: Back, activity: _Activity | None = None) -> None:
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
        back(Probed(token=token, report=report, latency_s=latency, active=active))

    def _activity_reader(self) -> _Activity | None:
        """The server's counters to read with this probe (None: none to read; see
        the module's docstring for which instances have them read)."""
        rules, ctx = self.owner.rules, self.owner.ctx
        evictable = not rules.pinned and ctx.ledger is not None
        wanted = rules.mode is Mode.PROCESS and rules.flavor is Flavor.LLAMACPP
        if not wanted or (rules.idle_ttl_s is None and not evictable):
            self._close_activity()
            return None
        base_url = self.owner.adapter.spec.base_url
        if self._activity is None or self._activity.base_url != base_url:
            self._close_activity()
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

    def deep_health_verb(self) -> Future[str]:
        """The ``deep-health`` verb: :meth:`deep_health` on a daemon thread of its
        own; its token or error lands in the Future (never on the actor's thread)."""
        done: Future[str] = Future()

        def run() -> None:
            try:
                done.set_result(self.deep_health())
            except Exception as e:  # noqa: BLE001 - handed to whoever waits on the Future
                done.set_exception(e)

        name = f"{self.owner.iid[:12]}-work"
        threading.Thread(target=run, name=name, daemon=True).start()
        return done

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


#: Where a probe's :class:`Probed` goes (the loop's :meth:`~.probe_loop.ProbeLoop.reported`).
Back = Callable[[Probed], None]


def _timers(ctx: Any) -> Timers:
    """The probes' timers: the node's probe engine on a real clock (its own
    thread, where the reports land), on one grid for the whole node (probes due
    in the same slot go in one pass of the engine's loop: :mod:`.timer_wheel`),
    else the context's clock (a test's manual one)."""
    clock = ctx.clock
    if isinstance(clock, RealClock) and isinstance(ctx.engine, HttpProber):
        engine = ctx.engine.timers()
        if engine is not None:
            with _WHEELS_LOCK:
                wheel = _WHEELS.get(engine)
                if wheel is None:
                    wheel = _WHEELS[engine] = TimerWheel(engine, PROBE_SLOT_S)
            return wheel
    return clock  # type: ignore[no-any-return]


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
