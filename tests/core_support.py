"""A harness for the pure decision core: no threads, no processes, a hand clock.

``step`` decides one observation and applies the decision's events with the
same reducer the executor uses (``apply_instance``), so a test walks an
instance through its lifecycle one observation at a time. Every lifecycle
state reached and every event kind emitted is recorded in :data:`SEEN_STATES`
and :data:`SEEN_KINDS` for the coverage self-check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from infervisor.actors.core import effects as fx
from infervisor.actors.core import observations as o
from infervisor.actors.core.decide import decide
from infervisor.actors.core.decision import Decision, Situation
from infervisor.actors.core.rules import Mode, Rules, Tracking
from infervisor.actors.core.supervision import Supervision
from infervisor.actors.kinds import KindSettings, supervision_for
from infervisor.adapters.probe import Health, HealthKind, ServerReport
from infervisor.adapters.spec import Flavor
from infervisor.chain import StoredEvent
from infervisor.replay import InstanceState, LifecycleState, RestartPolicy, apply_instance, kind_of
from infervisor.replay import events as ev
from infervisor.replay.state import Stamp

__all__ = [
    "IID",
    "NS",
    "SEEN_KINDS",
    "SEEN_STATES",
    "Clock",
    "Health",
    "HealthKind",
    "ServerReport",
    "Sim",
    "kinds",
    "make_rules",
    "placed",
    "policy",
    "step",
    "stored_for",
]

NS = 1_000_000_000
IID = "chat-llamacpp-8080-0123456789abcdef"
SEEN_STATES: set[LifecycleState] = set()
SEEN_KINDS: set[str] = set()


class Clock:
    """A node's clocks, advanced by hand: wall (ns), monotonic (s), boot id."""

    def __init__(
        self, wall_s: float = 1_800_000_000.0, mono_s: float = 1000.0, boot: str = "boot-a"
    ):
        self.wall_ns = int(wall_s * NS)
        self.mono_s = mono_s
        self.boot = boot

    @property
    def now(self) -> Stamp:
        return Stamp(wall_ns=self.wall_ns, mono_s=self.mono_s, boot_id=self.boot)

    def advance(self, seconds: float) -> Stamp:
        """Both clocks move on together."""
        self.wall_ns += int(seconds * NS)
        self.mono_s += seconds
        return self.now

    def step_wall(self, seconds: float) -> Stamp:
        """Only the wall clock jumps (NTP, an operator): the monotonic clock does not."""
        self.wall_ns += int(seconds * NS)
        return self.now

    def reboot(self, boot: str, down_s: float) -> Stamp:
        """The machine rebooted: a new boot id, the monotonic clock starts again."""
        self.wall_ns += int(down_s * NS)
        self.mono_s = 5.0
        self.boot = boot
        return self.now


def stored_for(
    state: InstanceState | None, event: ev.InstanceEvent, now: Stamp, source: str
) -> StoredEvent:
    """A provisional stored event, as ``Draft.emit`` builds one."""
    seq = state.last_seq + 1 if state is not None else 1
    return StoredEvent(
        seq=seq,
        ts_ns=now.wall_ns,
        node="",
        source=source,
        kind=kind_of(event),
        subject=state.instance_id if state is not None else IID,
        payload=b"",
        payload_hash=b"",
        prev_hash=b"",
        hash=b"",
    )


def placed(now: Stamp, spec: dict[str, Any] | None = None) -> InstanceState:
    """A freshly placed instance (lifecycle ``loaded``)."""
    event = ev.Placed(spec=spec or {"role": "chat"}, placed_by="controller", generation=1)
    state = apply_instance(None, stored_for(None, event, now, "controller"), event)
    assert state is not None
    SEEN_KINDS.add(kind_of(event))
    SEEN_STATES.add(state.lifecycle)
    return state


def policy(**kw: Any) -> RestartPolicy:
    base = {"max_restarts": 2, "base_s": 2.0, "cap_s": 60.0, "stable_after_s": 30.0}
    base.update(kw)
    p = RestartPolicy(**base)
    p.validate()
    return p


def kinds() -> dict[str, KindSettings]:
    return {
        "web": KindSettings(probe="http"),
        "deep": KindSettings(probe="http", deep_interval_s=5.0),
        "loads": KindSettings(startup_deadline_s=10.0, startup_cap_s=60.0),
    }


def make_rules(
    mode: Mode,
    *,
    kind: str = "process",
    continuous: bool = True,
    restart: RestartPolicy | None = None,
) -> Rules:
    sup: Supervision = supervision_for(
        kind,
        kinds(),
        node_interval_s=1.0,
        node_miss_limit=3,
        node_restart=restart or policy(),
    )
    flavor = Flavor.OLLAMA if mode is Mode.OLLAMA else Flavor.LLAMACPP
    return Rules(
        mode=mode,
        flavor=flavor,
        served_model="tiny:latest" if mode is Mode.OLLAMA else None,
        continuous=continuous,
        supervision=sup,
        node_id="node-1",
        stop_grace_s=10.0,
        health_kill_grace_s=4.0,
    )


def step(
    state: InstanceState | None, tracking: Tracking, obs: o.Observation, now: Stamp, rules: Rules
) -> tuple[InstanceState | None, Tracking, Decision]:
    """Decide one observation, then apply its events as the executor does."""
    assert state is not None, "the instance was unloaded"
    decision = decide(Situation(state=state, tracking=tracking, rules=rules, now=now), obs)
    new: InstanceState | None = state
    for event in decision.events:
        assert new is not None, "an event after the instance was unloaded"
        new = apply_instance(new, stored_for(new, event, now, decision.source), event)
        SEEN_KINDS.add(kind_of(event))
        if new is not None:
            SEEN_STATES.add(new.lifecycle)
    return new, decision.tracking or tracking, decision


def up() -> ServerReport:
    return ServerReport(health=Health(HealthKind.UP))


def sick() -> ServerReport:
    return ServerReport(health=Health(HealthKind.UNHEALTHY, "HTTP 500"))


@dataclass
class Sim:
    """One instance driven through the core, with its clock."""

    rules: Rules
    clock: Clock = field(default_factory=Clock)
    state: InstanceState | None = None
    tracking: Tracking = field(default_factory=Tracking)
    last: Decision | None = None
    pid: int = 4000

    def __post_init__(self) -> None:
        if self.state is None:
            self.state = placed(self.clock.now)

    @property
    def inst(self) -> InstanceState:
        assert self.state is not None
        return self.state

    def feed(self, obs: o.Observation) -> Decision:
        self.state, self.tracking, self.last = step(
            self.state, self.tracking, obs, self.clock.now, self.rules
        )
        return self.last

    # ------------------------------------------------------------ helpers
    def effect(self, kind: type[Any]) -> Any:
        """The one effect of this type in the last decision."""
        assert self.last is not None
        found = [e for e in self.last.effects if isinstance(e, kind)]
        assert len(found) == 1, f"want one {kind.__name__}, got {self.last.effects}"
        return found[0]

    def checked(self, check: fx.CheckStart | None = None, **kw: Any) -> Decision:
        """Feed back the StartChecked a CheckStart effect asks for."""
        c = check or self.effect(fx.CheckStart)
        kw.setdefault("precheck", c.weights_only)
        kw.setdefault("request", c.request)
        kw.setdefault("model", c.model)
        return self.feed(
            o.StartChecked(
                by=c.by, reset_budget=c.reset_budget, attempt=c.attempt, verb=c.verb, **kw
            )
        )

    def spawn_ok(self) -> Decision:
        spawn = self.effect(fx.Spawn)
        self.pid += 1
        return self.feed(
            o.SpawnSucceeded(
                token=spawn.token,
                pid=self.pid,
                pgid=self.pid,
                start_time=self.clock.wall_ns / NS,
                boot_id=self.clock.boot,
                argv=["llama-server"],
            )
        )

    def start(self, by: str = "operator", **checked: Any) -> Decision:
        """Start verb, its check, and (process mode) the spawn."""
        self.feed(o.StartVerb(by=by))
        if self.rules.mode is Mode.ADOPTED:
            return self.feed(o.AnswersChecked(by=by, why_not=None))
        self.checked(**checked)
        if self.rules.mode is Mode.PROCESS:
            return self.spawn_ok()
        return self.last  # type: ignore[return-value]

    def crash_and_restart(self) -> Decision:
        """The server exits 1; its restart falls due and is spawned (process mode)."""
        self.gone(exit_code=1)
        self.clock.advance(10)
        self.feed(o.TimerDue(name=fx.Timer.RESTART))
        self.checked()
        return self.spawn_ok()

    def probe(self, report: ServerReport) -> Decision:
        token = self.inst.process.pid if self.inst.process is not None else 0
        return self.feed(o.ProbeResult(token=token, report=report))

    def gone(self, exit_code: int | None = None, signal: int | None = None) -> Decision:
        assert self.inst.process is not None
        return self.feed(o.GroupGone(pid=self.inst.process.pid, exit_code=exit_code, signal=signal))

    def kinds_of_last(self) -> list[str]:
        assert self.last is not None
        return [kind_of(e) for e in self.last.events]

    def copy(self) -> Sim:
        return Sim(
            rules=self.rules,
            clock=Clock(self.clock.wall_ns / NS, self.clock.mono_s, self.clock.boot),
            state=self.state,
            tracking=self.tracking,
            pid=self.pid,
        )


def effect_types(decision: Decision) -> list[str]:
    return [type(e).__name__ for e in decision.effects]


def replace(state: InstanceState, **kw: Any) -> InstanceState:
    return msgspec.structs.replace(state, **kw)
