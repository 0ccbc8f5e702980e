"""Crash anywhere, at the level of the decision core (no threads, no processes).

A simulated executor drives :func:`infervisor.actors.core.decide.decide` the way
the instance actor does (decide, append the events, apply them with the replay
reducer, then run the effects in order, feeding back the observations that
effects produce at once). Effects act on a simulated world: processes with
pids that keep running when the node dies (a process that exits while the
node is down keeps its status, as the shim does), a port that something else
may hold, an Ollama that holds the model or not. Timers fire when the
simulated clock passes their due.

Four instances of different modes live side by side: a continuous llama.cpp
server (``inference`` kind, http probe), a one-shot process (``process`` kind,
``continuous=False``), an adopted server and a managed Ollama model.

**Crash** drops the executor's volatile state (tracking, timers, process
handles, observations in flight) and keeps the world; it may strike in the
middle of executing a decision's effects (so between appending
``instance.starting`` and running ``Spawn``, or between the spawn and its
``instance.spawned``). The node may stay down a while (the world's clock
runs, nothing of the node does), then it boots: the state is refolded from
the chain and each instance is fed ``BootSeen`` with what the world says.

Invariants after every step: the fold of the chain equals the live state;
a ``Starting`` with ``attempt > 0`` never comes before the recorded due of
its restart (measured on the monotonic clock, so wall-clock steps do not
count); a boot never resets the restart budget (unless it completes an
operator's restart in flight, which resets it as the live node would) and
changes the restart count only by the restarts it schedules.

At every crash the node is forked first: the **twin** is a copy that is never
crashed (it finishes the interrupted decision and lives through the downtime).
Both are then *settled* (observations in flight delivered, reconcile ticks,
the clock advanced through every armed timer and pending exit, no probes and
no outside events) and compared on what is sourced: per instance its
presence, lifecycle, desired state, restart count, whether a process is
recorded, exposure and what follows a stop. Health misses are not sourced,
and settling sends no probes, so they cannot make the two differ; a twin
forked per crash (instead of one twin for the whole run) keeps a difference
that misses made earlier from growing into later, unrelated ones. Once
settled, the world's running processes are exactly those the chain records.
One difference is legitimate and not compared: an observation whose
decision was interrupted before any event was appended is lost (the twin is
not given it either: a verb's caller gets an error).

Two findings of this test are regression tests below: a wall-clock step
within the boot followed by a crash once moved a re-attached server's uptime
by the step (``test_wall_step_then_crash_keeps_restart_budget``), and a
launch interrupted between ``instance.starting`` and ``Spawn`` once spent
restart budget (``test_crash_before_spawn_does_not_fail_the_instance``).

The examples are derandomized (the same ones every run), so the coverage
check, ``test_zz_coverage``, which must run after both machines (file order),
cannot flake; explore further by running the machines with another seed and
more examples.
"""

from __future__ import annotations

import copy
import os
import signal
from collections import deque
from dataclasses import dataclass, field
from typing import Any, get_args

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import event as _event
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from infervisor.actors.core import effects as fx
from infervisor.actors.core import observations as o
from infervisor.actors.core.common import demand_pending, remaining_s
from infervisor.actors.core.decide import decide
from infervisor.actors.core.decision import Situation
from infervisor.actors.core.health import probe_token, wants_deep, wants_probe
from infervisor.actors.core.rules import Mode, Rules, Tracking
from infervisor.actors.kinds import KindSettings, supervision_for
from infervisor.adapters.probe import Health, HealthKind, ServerReport
from infervisor.adapters.spec import Flavor
from infervisor.chain import StoredEvent
from infervisor.replay import InstanceState, LifecycleState, RestartPolicy, apply_instance, kind_of
from infervisor.replay import events as ev
from infervisor.replay.state import Stamp

BOOT_ID = "kernel-boot-1"
NODE_ID = "node-1"
POLICY = RestartPolicy(max_restarts=2, base_s=1.0, cap_s=4.0, stable_after_s=5.0, jitter=0.5)
KINDS = {
    "inference": KindSettings(startup_deadline_s=5.0, startup_cap_s=20.0, deep_interval_s=10.0)
}
SLOTS = ("llama", "oneshot", "adopted", "ollama")
RESERVED = 100

#: Every lifecycle state and instance event kind reached over the whole run.
SEEN_STATES: set[LifecycleState] = set()
SEEN_KINDS: set[str] = set()
#: Reached elsewhere: strays need a real cgroup (tests/test_core_rules.py decides
#: them, tests/test_containment.py kills nodes mid-launch with real cgroups).
ALL_KINDS = {t.__struct_config__.tag for t in get_args(ev.InstanceEvent)} - {
    "instance.strays_ended"
}


def event(name: str) -> None:
    """``hypothesis.event`` inside the machine; nothing in the plain tests below."""
    if currently_in_test_context():
        _event(name)


def _rules(slot: str) -> Rules:
    kind = "process" if slot == "oneshot" else "inference"
    sup = supervision_for(kind, KINDS, node_interval_s=1.0, node_miss_limit=2, node_restart=POLICY)
    mode = {"adopted": Mode.ADOPTED, "ollama": Mode.OLLAMA}.get(slot, Mode.PROCESS)
    flavor = Flavor.OLLAMA if slot == "ollama" else Flavor.LLAMACPP
    return Rules(
        mode=mode,
        flavor=flavor,
        served_model="tiny:latest" if slot == "ollama" else None,
        continuous=slot != "oneshot",
        supervision=sup,
        node_id=NODE_ID,
        stop_grace_s=2.0,
        health_kill_grace_s=1.0,
        exposure_grace_s=1.0,
        idle_ttl_s=20.0 if slot == "llama" else None,  # issue 21: idle expiry on the tick
    )


RULES = {slot: _rules(slot) for slot in SLOTS}
DEMAND = o.DemandVerb(request="req-1", model="tiny", by="front")
EVICT = o.EvictVerb(
    by="node", for_instance="other-1", needed_bytes=RESERVED, freed_bytes=RESERVED,
    budget_bytes=2 * RESERVED, in_use_bytes=2 * RESERVED, candidates=(), grace_s=2.0,
)  # fmt: skip
#: The node evicts for the slot's start (a request's): its demand is recorded first.
ROOM_PLANNED = o.RoomPlanned(request="req-1", model="tiny", by="front", verb=False)
ROOM_REFUSED = o.RoomRefused(
    by="node", needed_bytes=RESERVED, budget_bytes=RESERVED, in_use_bytes=RESERVED,
    held={"other-1": RESERVED}, candidates=(),
)  # fmt: skip


# ---------------------------------------------------------------- the world
@dataclass
class SimProc:
    """A server process: it runs until it exits on its own or by a signal."""

    slot: str
    iid: str
    token: str
    pid: int
    started_wall_ns: int
    alive: bool = True
    exit_code: int | None = None
    sig: int | None = None
    term_due_mono: float | None = None  # SIGTERM honoured at this monotonic time

    @property
    def ignores_sigterm(self) -> bool:
        return self.pid % 3 == 0


@dataclass
class World:
    """What outlives the node: processes, the ports, Ollama's memory."""

    procs: dict[int, SimProc] = field(default_factory=dict)
    next_pid: int = 1000
    taken: set[str] = field(default_factory=set)  # slots whose port somebody else holds
    full: set[str] = field(default_factory=set)  # slots whose demanded start finds no room
    ollama_resident: bool = False
    ollama_unload_fails: bool = False  # Ollama answers an unload with an error
    wall_ns: int = 1_700_000_000 * 10**9
    mono_s: float = 100.0

    def now(self) -> Stamp:
        return Stamp(wall_ns=self.wall_ns, mono_s=self.mono_s, boot_id=BOOT_ID)

    def alive_for(self, iid: str) -> set[int]:
        return {p.pid for p in self.procs.values() if p.alive and p.iid == iid}


class Crash(Exception):
    """The node dies here (in the middle of executing effects)."""


# ---------------------------------------------------------------- the node
@dataclass
class SimNode:
    """The executor: chain, sourced state, tracking, timers, process handles."""

    world: World = field(default_factory=World)
    chain: list[tuple[StoredEvent, ev.InstanceEvent]] = field(default_factory=list)
    states: dict[str, InstanceState] = field(default_factory=dict)
    slot_iid: dict[str, str] = field(default_factory=dict)
    placed: int = 0
    # volatile: lost in a crash
    tracking: dict[str, Tracking] = field(default_factory=dict)
    timers: dict[tuple[str, str], Stamp] = field(default_factory=dict)
    handles: dict[str, int] = field(default_factory=dict)
    pending: deque[tuple[str, Any]] = field(default_factory=deque)
    interrupted_launches: int = 0

    # ------------------------------------------------------------ chain
    def slot_of(self, iid: str) -> str:
        return next(s for s, i in self.slot_iid.items() if i == iid)

    def append(self, iid: str, event: ev.InstanceEvent, source: str) -> None:
        now = self.world.now()
        before = self.states.get(iid)
        if isinstance(event, ev.Starting) and event.attempt > 0 and before is not None:
            due = before.restart_due
            assert due is not None, f"{iid}: a restart start with no recorded due"
            assert remaining_s(due, now) <= 1e-3, (
                f"{iid}: restart {event.attempt} started {remaining_s(due, now):.3f} s "
                "before its recorded due"
            )
        stored = StoredEvent(
            seq=len(self.chain) + 1,
            ts_ns=now.wall_ns,
            node=NODE_ID,
            source=source,
            kind=kind_of(event),
            subject=iid,
            payload=b"",
            payload_hash=b"",
            prev_hash=b"",
            hash=b"",
        )
        after = apply_instance(before, stored, event)
        self.chain.append((stored, event))
        SEEN_KINDS.add(stored.kind)
        if after is None:
            self.states.pop(iid, None)
            self._forget(iid)
        else:
            self.states[iid] = after
            SEEN_STATES.add(after.lifecycle)

    def _forget(self, iid: str) -> None:
        """An unloaded instance's actor stops: its timers and handle go."""
        self.handles.pop(iid, None)
        for key in [k for k in self.timers if k[0] == iid]:
            del self.timers[key]

    def refold(self) -> dict[str, InstanceState]:
        states: dict[str, InstanceState] = {}
        for stored, e in self.chain:
            after = apply_instance(states.get(stored.subject), stored, e)
            if after is None:
                states.pop(stored.subject, None)
            else:
                states[stored.subject] = after
        return states

    def place(self, slot: str) -> None:
        self.placed += 1
        iid = f"{slot}-{self.placed}"
        self.slot_iid[slot] = iid
        by = "controller-x" if slot == "llama" else NODE_ID
        self.append(iid, ev.Placed(spec={"role": slot}, placed_by=by, generation=1), "controller")

    # ------------------------------------------------------------ deciding
    def run(self, slot: str, obs: Any, crash_after: int | None = None) -> None:
        """Decide and execute, like ``InstanceActor.run``; raise Crash after
        ``crash_after`` effects (counted over the whole cascade)."""
        iid = self.slot_iid[slot]
        queue: deque[Any] = deque([obs])
        done = 0
        while queue:
            current = queue.popleft()
            state = self.states.get(iid)
            if state is None:
                return
            sit = Situation(
                state=state,
                tracking=self.tracking.get(iid, Tracking()),
                rules=RULES[slot],
                now=self.world.now(),
            )
            decision = decide(sit, current)
            if decision.tracking is not None:
                self.tracking[iid] = decision.tracking
            for e in decision.events:
                self.append(iid, e, decision.source)
            for effect in decision.effects:
                if crash_after is not None and done >= crash_after:
                    self._note_interrupted_launch(iid)
                    raise Crash
                follow = self.effect(slot, iid, effect)
                done += 1
                if follow is not None:
                    queue.append(follow)
        if crash_after is not None and queue:
            self._note_interrupted_launch(iid)
            raise Crash

    def _note_interrupted_launch(self, iid: str) -> None:
        """A launch recorded (``instance.starting``) whose Spawn never ran."""
        s = self.states.get(iid)
        if (
            s is not None
            and s.lifecycle is LifecycleState.STARTING
            and s.launch_token
            and s.process is None
            and not any(p.token == s.launch_token for p in self.world.procs.values())
        ):
            self.interrupted_launches += 1

    def effect(self, slot: str, iid: str, e: Any) -> Any:
        w, now = self.world, self.world.now()
        match e:
            case fx.CheckStart(weights_only=True):  # a restart's pre-check: weights fine
                return o.StartChecked(
                    by=e.by, reset_budget=e.reset_budget, attempt=e.attempt, verb=e.verb,
                    precheck=True,
                )  # fmt: skip
            case fx.CheckStart():
                taken = "127.0.0.1:8080" if slot in w.taken else None
                no_room = e.demand and slot in w.full and not taken
                return o.StartChecked(
                    by=e.by,
                    reset_budget=e.reset_budget,
                    attempt=e.attempt,
                    verb=e.verb,
                    taken=taken,
                    reserved_bytes=0 if taken or no_room else RESERVED,
                    memory_refusal="memory budget 100 bytes, 100 in use" if no_room else None,
                    demand=e.demand,
                    request=e.request,
                    model=e.model,
                )
            case fx.CheckAnswers():
                return o.AnswersChecked(by=e.by, why_not=None)
            case fx.Spawn():
                w.next_pid += 1
                p: SimProc | None = SimProc(
                    slot=slot, iid=iid, token=e.token, pid=w.next_pid, started_wall_ns=w.wall_ns
                )
                assert p is not None
                w.procs[p.pid] = p
                self.handles[iid] = p.pid
                return o.SpawnSucceeded(
                    token=e.token,
                    pid=p.pid,
                    pgid=p.pid,
                    start_time=p.started_wall_ns / 1e9,
                    boot_id=BOOT_ID,
                    argv=["llama-server"],
                )
            case fx.Terminate():
                p = self._proc(iid)
                if p is not None and p.term_due_mono is None and not p.ignores_sigterm:
                    p.term_due_mono = now.mono_s + 0.5
            case fx.Kill():
                p = self._proc(iid)
                if p is not None:
                    self.exit_proc(p, None, signal.SIGKILL)
            case fx.Reap():
                p = self._proc(iid)
                if p is not None and not p.alive:
                    self.pending.append(
                        (slot, o.GroupGone(pid=p.pid, exit_code=p.exit_code, signal=p.sig))
                    )
            case fx.ArmTimer():
                self.timers[(iid, e.name)] = e.due
            case fx.CancelTimer():
                self.timers.pop((iid, e.name), None)
            case fx.CheckResident():
                self.pending.append((slot, "resident?"))
            case fx.LoadModel():
                self.pending.append((slot, "load"))
            case fx.AbortLoad():
                self._drop_pending(slot, "load")
            case fx.UnloadModel():
                self._drop_pending(slot, "load")
                self.pending.append((slot, "unload"))
            case fx.RemoveWorkdir():
                pass
            case _:
                raise AssertionError(f"unknown effect {e!r}")
        return None

    def _drop_pending(self, slot: str, what: str) -> None:
        self.pending = deque(x for x in self.pending if x != (slot, what))

    def _proc(self, iid: str) -> SimProc | None:
        pid = self.handles.get(iid)
        return self.world.procs.get(pid) if pid is not None else None

    def exit_proc(self, p: SimProc, code: int | None, sig: int | None) -> None:
        """The process ends: its status is kept; a watching node hears of it."""
        if not p.alive:
            return
        p.alive, p.exit_code, p.sig = False, code, sig
        if self.handles.get(p.iid) == p.pid:
            self.pending.append((p.slot, o.ProcessExited(pid=p.pid)))

    def deliver_one(self) -> None:
        """An observation in flight arrives (Ollama answers act on the world now)."""
        slot, what = self.pending.popleft()
        w = self.world
        if what == "resident?":
            obs: Any = o.OllamaResidency(resident=w.ollama_resident)
        elif what == "load":
            w.ollama_resident = True
            obs = o.OllamaLoadEnded(ok=True)
        elif what == "unload" and w.ollama_unload_fails:
            obs = o.OllamaUnloadEnded(ok=False, error="ollama refused the unload")
        elif what == "unload":
            w.ollama_resident = False
            obs = o.OllamaUnloadEnded(ok=True)
        else:
            obs = what
        if slot in self.slot_iid and self.slot_iid[slot] in self.states:
            self.run(slot, obs)

    def drain(self) -> None:
        for _ in range(200):
            if not self.pending:
                return
            self.deliver_one()
        raise AssertionError("observations keep coming")

    # ------------------------------------------------------------ time
    def world_passes(self, dt: float) -> None:
        """Time passes for the world only: SIGTERMed processes exit when due."""
        w = self.world
        w.mono_s += dt
        w.wall_ns += int(dt * 1e9)
        for p in list(w.procs.values()):
            if p.alive and p.term_due_mono is not None and p.term_due_mono <= w.mono_s + 1e-9:
                self.exit_proc(p, None, signal.SIGTERM)

    def fire_due(self) -> None:
        now = self.world.now()
        for (iid, name), due in sorted(self.timers.items(), key=lambda kv: kv[1].mono_s):
            if self.timers.get((iid, name)) != due or iid not in self.states:
                continue
            if remaining_s(due, now) <= 1e-3:
                del self.timers[(iid, name)]
                self.run(self.slot_of(iid), o.TimerDue(name=name))

    def advance(self, dt: float) -> None:
        self.drain()
        self.world_passes(dt)
        self.drain()
        self.fire_due()

    def next_due(self) -> float | None:
        now = self.world.now()
        dues = [remaining_s(d, now) for d in self.timers.values()]
        dues += [
            p.term_due_mono - now.mono_s
            for p in self.world.procs.values()
            if p.alive and p.term_due_mono is not None
        ]
        return max(0.0, min(dues)) if dues else None

    def tick_all(self) -> None:
        for slot in SLOTS:
            if self.slot_iid.get(slot) in self.states:
                self.run(slot, o.Tick())

    def settle(self) -> None:
        """Deliver, tick and let every armed timer and pending exit come due."""
        for _ in range(60):
            self.drain()
            self.tick_all()
            self.drain()
            nxt = self.next_due()
            if nxt is None:
                return
            self.advance(nxt + 0.01)
        raise AssertionError("the node never settles")

    # ------------------------------------------------------------ crash and boot
    def crash(self) -> None:
        self.tracking.clear()
        self.timers.clear()
        self.handles.clear()
        self.pending.clear()
        self.states = {}

    def boot(self) -> None:
        self.states = self.refold()
        for slot in SLOTS:
            iid = self.slot_iid.get(slot)
            state = self.states.get(iid) if iid else None
            if state is None:
                continue
            restarts = state.restarts
            # An operator's restart in flight resets the budget when it completes.
            owed = state.then == "restart" and state.then_by == "operator"
            seen = self.boot_facts(slot, state)
            recovered = " recovered" if getattr(seen, "recovered", False) else ""
            event(f"boot: {type(seen).__name__}{recovered}")
            mark = len(self.chain)
            self.run(slot, o.BootSeen(process=seen))
            booted = [e for _, e in self.chain[mark:]]
            resets = [
                e
                for e in booted
                if isinstance(e, ev.StableAgain) or (isinstance(e, ev.Starting) and e.reset_budget)
            ]
            if owed:
                continue
            assert not resets, f"{iid}: boot reset the restart budget: {resets}"
            now_restarts = self.states[iid].restarts if iid in self.states else restarts
            scheduled = sum(isinstance(e, ev.RestartScheduled) for e in booted)
            assert now_restarts == restarts + scheduled, (
                f"{iid}: restarts {restarts} before boot, {now_restarts} after"
            )
        for slot in SLOTS:  # Node.open resumes the demands recorded but not started
            state = self.states.get(self.slot_iid.get(slot, ""))
            if state is not None and demand_pending(state):
                event("boot: a demand resumed")
                self.run(slot, o.DemandVerb(request="boot", model="", by="boot"))

    def boot_facts(self, slot: str, state: InstanceState) -> Any:
        """What ``boot_facts.gather`` finds, from the simulated world."""
        if RULES[slot].mode is not Mode.PROCESS:
            return o.ProcessNone()
        rec = state.process
        if rec is None:
            token = state.launch_token
            if not token or state.lifecycle is not LifecycleState.STARTING:
                return o.ProcessNone()
            found = [p for p in self.world.procs.values() if p.token == token]
            if not found:
                return o.ProcessNone()
            p = found[0]
            if p.alive:
                self.handles[state.instance_id] = p.pid
                return o.ProcessAlive(
                    pid=p.pid,
                    pgid=p.pid,
                    start_time=p.started_wall_ns / 1e9,
                    boot_id=BOOT_ID,
                    recovered=True,
                )
            why = "the server it launched ended while no node ran"
            return o.ProcessGone(pid=None, exit_code=p.exit_code, signal=p.sig, reason=why)
        q = self.world.procs.get(rec.pid)
        if q is not None and q.alive:
            self.handles[state.instance_id] = q.pid
            return o.ProcessAlive(
                pid=rec.pid, pgid=rec.pgid, start_time=rec.start_time, boot_id=rec.boot_id
            )
        code, sig = (q.exit_code, q.sig) if q is not None else (None, None)
        why = f"pid {rec.pid} was gone when the node started again"
        return o.ProcessGone(pid=rec.pid, exit_code=code, signal=sig, reason=why)

    # ------------------------------------------------------------ comparing
    def sourced(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for slot in SLOTS:
            s = self.states.get(self.slot_iid.get(slot, ""))
            out[slot] = None if s is None else (
                s.instance_id,
                s.lifecycle,
                s.desired,
                s.restarts,
                s.process is not None,
                s.exposed,
                s.then,
            )  # fmt: skip
        return out

    def check_processes(self) -> None:
        """Settled: the world runs exactly the processes the chain records as live."""
        recorded = {iid: s.process.pid for iid, s in self.states.items() if s.process is not None}
        running: dict[str, set[int]] = {}
        for p in self.world.procs.values():
            if p.alive:
                running.setdefault(p.iid, set()).add(p.pid)
        for iid, pids in running.items():
            assert iid in recorded and pids == {recorded[iid]}, (
                f"{iid}: processes {sorted(pids)} run, the chain records {recorded.get(iid)}"
            )
        for iid, pid in recorded.items():
            assert pid in running.get(iid, set()), f"{iid}: pid {pid} recorded live, not running"


REPORTS = {
    "up": ServerReport(health=Health(kind=HealthKind.UP), models=[]),
    "unreachable": ServerReport(health=Health(kind=HealthKind.UNREACHABLE, reason="refused")),
    "loading": ServerReport(health=Health(kind=HealthKind.LOADING, reason="loading model")),
}
DEATHS = {"exit0": (0, None), "exit1": (1, None), "sigsegv": (None, signal.SIGSEGV)}


class CrashAnywhere(RuleBasedStateMachine):
    """A node of four instances, crashed anywhere, compared with its never-crashed twin."""

    def __init__(self) -> None:
        super().__init__()
        self.node = SimNode()

    @initialize(started=st.lists(st.sampled_from(SLOTS), unique=True))
    def place_all(self, started: list[str]) -> None:
        """Place the four instances and start some of them (an operator start)."""
        for slot in SLOTS:
            self.node.place(slot)
        for slot in started:
            self.node.run(slot, o.StartVerb(by="operator"))

    def _live(self, slot: str) -> bool:
        return self.node.slot_iid.get(slot) in self.node.states

    def _verb(self, slot: str, obs: Any, crash_after: int | None = None) -> None:
        if self._live(slot):
            self.node.run(slot, obs, crash_after)

    # ------------------------------------------------------------ verbs
    @rule(slot=st.sampled_from(SLOTS))
    def start(self, slot: str) -> None:
        self._verb(slot, o.StartVerb(by="operator"))

    @rule(slot=st.sampled_from(SLOTS), grace=st.sampled_from([0.2, 2.0]))
    def stop(self, slot: str, grace: float) -> None:
        self._verb(slot, o.StopVerb(by="operator", grace_s=grace))

    @rule(slot=st.sampled_from(SLOTS))
    def restart(self, slot: str) -> None:
        self._verb(slot, o.RestartVerb(by="operator", grace_s=2.0))

    @rule(slot=st.sampled_from(SLOTS))
    def unload(self, slot: str) -> None:
        self._verb(slot, o.UnloadVerb(by="operator", grace_s=2.0))

    @rule(slot=st.sampled_from(SLOTS))
    def replace(self, slot: str) -> None:
        if not self._live(slot):
            self.node.place(slot)  # reloaded: a fresh instance in the slot

    @rule(slot=st.sampled_from(SLOTS), gen=st.sampled_from([0, 2, 3]))
    def placement(self, slot: str, gen: int) -> None:
        self._verb(slot, o.PlacementVerb(placed_by="controller-x", generation=gen))

    # ------------------------------------------------------------ residency (issue 21)
    @rule(slot=st.sampled_from(SLOTS))
    def demand(self, slot: str) -> None:
        """A request asks for the instance: a resting one is demanded and started."""
        self._verb(slot, DEMAND)

    @rule(slot=st.sampled_from(["llama", "ollama"]))
    def evict(self, slot: str) -> None:
        """The node evicts it for another's start (refused when busy or loading)."""
        self._verb(slot, EVICT)

    @rule(slot=st.sampled_from(["llama", "ollama"]))
    def room_planned(self, slot: str) -> None:
        """The node evicts others for this one's start (a boot resumes it), then,
        the victims gone, asks for the start again."""
        self._verb(slot, ROOM_PLANNED)
        self._verb(slot, DEMAND)

    @rule(slot=st.sampled_from(["llama", "ollama"]))
    def room_refused(self, slot: str) -> None:
        """The node found nothing to evict for this one's start."""
        self._verb(slot, ROOM_REFUSED)

    @rule(slot=st.sampled_from(["llama", "ollama"]), full=st.booleans())
    def memory(self, slot: str, full: bool) -> None:
        """From now on a demanded start of the slot finds no room (or finds it)."""
        (self.node.world.full.add if full else self.node.world.full.discard)(slot)

    @rule(
        slot=st.sampled_from(["llama", "ollama"]), began=st.integers(1, 3), ended=st.integers(0, 3)
    )
    def requests(self, slot: str, began: int, ended: int) -> None:
        """Requests begin and end (some may stay in flight), then a tick."""
        for _ in range(began):
            self._verb(slot, o.RequestBegan())
        for _ in range(min(began, ended)):
            self._verb(slot, o.RequestEnded())
        self.node.tick_all()

    @rule()
    def stays_idle(self) -> None:
        """No request for longer than llama's idle_ttl_s, then a tick: it expires
        to resting if it was running and idle."""
        self.node.advance(21.0)
        self.node.tick_all()

    @rule()
    def lease_lapses(self) -> None:
        self._verb("llama", o.LeaseLapsed(silent_s=30.0, controller="controller-x"))

    # ------------------------------------------------------------ the world
    @rule(
        slot=st.sampled_from(SLOTS),
        outcomes=st.lists(st.sampled_from(sorted(REPORTS)), min_size=1, max_size=3),
    )
    def probe(self, slot: str, outcomes: list[str]) -> None:
        """A run of health probes (long enough to reach a verdict), one per interval."""
        for outcome in outcomes:
            if not self._live(slot):
                return
            state = self.node.states[self.node.slot_iid[slot]]
            if wants_probe(state, RULES[slot]):
                report = REPORTS[outcome]
                self.node.run(slot, o.ProbeResult(token=probe_token(state), report=report))

    @rule(
        slot=st.sampled_from(["llama", "oneshot"]),
        how=st.sampled_from(sorted(DEATHS)),
        heard=st.booleans(),
    )
    def process_dies(self, slot: str, how: str, heard: bool) -> None:
        """The server dies; ``heard``: its exit reaches the node at once (else it
        stays in flight until delivered, or lost in a crash)."""
        iid = self.node.slot_iid[slot]
        for p in list(self.node.world.procs.values()):
            if p.alive and p.iid == iid:
                self.node.exit_proc(p, *DEATHS[how])
        if heard:
            self.node.drain()

    @rule()
    def oneshot_ends(self) -> None:
        """The one-shot's run ends cleanly (exit 0, heard at once): finished when it
        was wanted running. Its own rule, as one draw in twelve of
        :meth:`process_dies` left ``instance.finished`` to chance."""
        self.process_dies("oneshot", "exit0", heard=True)

    @rule(slot=st.sampled_from(["llama", "oneshot"]), times=st.integers(1, 3))
    def flaps(self, slot: str, times: int) -> None:
        """The server crashes soon after each start: exit 1, heard at once, then
        the backoff runs out (the policy restarts it, or gives up)."""
        for _ in range(times):
            self.process_dies(slot, "exit1", heard=True)
            self.node.advance(POLICY.cap_s * 1.5 + 0.1)

    @rule(slot=st.sampled_from(SLOTS), ok=st.booleans(), times=st.integers(1, 3))
    def deep_check(self, slot: str, ok: bool, times: int) -> None:
        """Scheduled deep health checks: a token each, or none (health may still answer)."""
        for _ in range(times):
            if not self._live(slot):
                return
            state = self.node.states[self.node.slot_iid[slot]]
            if wants_deep(state, RULES[slot]):
                error = None if ok else "completion refused: HTTP 500"
                self.node.run(slot, o.DeepChecked(token=probe_token(state), error=error))

    @rule(size=st.sampled_from([50, 5000]))
    def ollama_lists(self, size: int) -> None:
        """Ollama's /api/ps on a probe: the model and the memory it takes, while resident."""
        if self._live("ollama") and self.node.world.ollama_resident:
            expires = self.node.world.wall_ns + 300 * 10**9
            listed = o.OllamaListed(listed=True, size_bytes=size, expires_at_ns=expires)
            self.node.run("ollama", listed)

    @rule()
    def ollama_drops(self) -> None:
        """Ollama drops the model (its keep_alive ran out): /api/ps no longer lists it."""
        self.node.world.ollama_resident = False
        if self._live("ollama"):
            self.node.run("ollama", o.OllamaListed(listed=False))

    @rule(fails=st.booleans())
    def ollama_unload_answers(self, fails: bool) -> None:
        """From now on Ollama refuses unloads (the model stays resident), or does them."""
        self.node.world.ollama_unload_fails = fails

    @rule()
    def exposed(self) -> None:
        iid = self.node.slot_iid["llama"]
        if iid in self.node.handles and self._live("llama"):
            self.node.run("llama", o.ListenersSeen(owned_beyond=("0.0.0.0:8080",)))

    @rule(slot=st.sampled_from(["llama", "oneshot"]))
    def port_taken(self, slot: str) -> None:
        self.node.world.taken.add(slot)

    @rule(slot=st.sampled_from(["llama", "oneshot"]))
    def port_freed(self, slot: str) -> None:
        self.node.world.taken.discard(slot)

    @rule()
    def deliver(self) -> None:
        if self.node.pending:
            self.node.deliver_one()

    @rule()
    def tick(self) -> None:
        self.node.tick_all()

    @rule(dt=st.sampled_from([0.3, 1.0, 2.5, 6.0, 30.0]))
    def clock_advances(self, dt: float) -> None:
        self.node.advance(dt)

    @rule()
    def settle(self) -> None:
        self.node.settle()
        self.node.check_processes()

    @rule()
    def stays_up(self) -> None:
        """Everything that runs stays up past the stability period, then a tick."""
        self.node.advance(POLICY.stable_after_s + 0.5)
        self.node.tick_all()

    # ------------------------------------------------------------ the crash
    @rule(
        during=st.sampled_from(
            ["start", "restart", "stop", "tick", "deliver", "demand", "evict", "planned", "none"]
        ),
        slot=st.sampled_from(SLOTS),
        after=st.integers(0, 3),
        down_s=st.sampled_from([0.0, 0.4, 3.0, 30.0]),
    )
    def crash(self, during: str, slot: str, after: int, down_s: float) -> None:
        node = self.node
        twin = copy.deepcopy(node)
        obs: Any = {
            "start": o.StartVerb(by="operator"),
            "restart": o.RestartVerb(by="operator", grace_s=2.0),
            "stop": o.StopVerb(by="operator", grace_s=2.0),
            "tick": o.Tick(),
            "demand": DEMAND,
            "evict": EVICT,
            "planned": ROOM_PLANNED,
        }.get(during)
        interrupted = False
        if obs is not None and self._live(slot):
            mark = len(node.chain)
            try:
                node.run(slot, obs, crash_after=after)
            except Crash:
                interrupted = True
            if len(node.chain) > mark or not interrupted:
                twin.run(slot, obs)  # else nothing was recorded: the observation is lost
                if during == "planned":  # the live node went on: the start, room made
                    twin.run(slot, DEMAND)
        elif during == "deliver" and node.pending:
            head = node.pending[0]
            node.pending.popleft()  # lost in flight; the world acted on it already
            if head[1] == "load":
                node.world.ollama_resident = True
            elif head[1] == "unload" and not node.world.ollama_unload_fails:
                node.world.ollama_resident = False
            twin.deliver_one()
        event(f"crash during {during}{' (interrupted)' if interrupted else ''}")
        # The node is down: the world goes on (the twin lives through it).
        node.crash()
        node.world_passes(down_s)
        twin.advance(down_s)
        node.boot()
        # The comparison: both settled, sourced facts equal.
        node.settle()
        twin.settle()
        node.check_processes()
        twin.check_processes()
        mine, theirs = node.sourced(), twin.sourced()
        assert mine == theirs, f"crashed node {mine}\n  never-crashed twin {theirs}"

    # ------------------------------------------------------------ invariants
    @invariant()
    def replay_equals_live(self) -> None:
        assert self.node.refold() == self.node.states

    @invariant()
    def coverage_events(self) -> None:
        for s in self.node.states.values():
            event(f"state {s.lifecycle}")


class CrashAnywhereWallStep(CrashAnywhere):
    """The same, with wall-clock steps within the boot (see the xfail below)."""

    @rule(step_s=st.sampled_from([-3600.0, -5.0, 7.0, 86400.0]))
    def wall_clock_steps(self, step_s: float) -> None:
        """Within one boot only the wall clock jumps: monotonic durations hold."""
        self.node.world.wall_ns += int(step_s * 1e9)


#: Examples per machine. Both machines reach every lifecycle state and event kind
#: (``test_zz_coverage``) with 60 of them; 100 keep a margin, at half the CPU time
#: of the 200 they ran before (the suite's time budget). Set
#: ``CRASH_ANYWHERE_EXAMPLES`` to explore further.
EXAMPLES = int(os.environ.get("CRASH_ANYWHERE_EXAMPLES", "100"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=50,
    deadline=None,
    derandomize=True,  # the same examples every run: the coverage check cannot flake
    suppress_health_check=[HealthCheck.too_slow],
)
CrashAnywhere.TestCase.settings = SETTINGS
TestCrashAnywhere = CrashAnywhere.TestCase

CrashAnywhereWallStep.TestCase.settings = settings(
    SETTINGS,
    phases=[Phase.explicit, Phase.generate],  # no shrinking of a known failure
)
TestCrashAnywhereWallStep = CrashAnywhereWallStep.TestCase


def _running_oneshot_with_restarts(restarts: int) -> SimNode:
    """A one-shot (process kind: healthy once spawned) that has been restarted."""
    node = SimNode()
    node.place("oneshot")
    node.run("oneshot", o.StartVerb(by="operator"))
    for _ in range(restarts):
        (p,) = [p for p in node.world.procs.values() if p.alive]
        node.exit_proc(p, 1, None)
        node.drain()
        node.advance(2.0)
    state = node.states["oneshot-1"]
    assert (state.lifecycle, state.restarts) == (LifecycleState.RUNNING, restarts)
    return node


def test_wall_step_then_crash_keeps_restart_budget() -> None:
    """Minimal sequence the wall-step machine finds: a restarted server, a wall
    clock 7 s ahead (same boot), a crash: the re-attached server is 0 s old on
    the monotonic clock, yet the next tick declares it stable after 5 s."""
    node = _running_oneshot_with_restarts(1)
    node.world.wall_ns += 7 * 10**9
    node.crash()
    node.boot()
    node.tick_all()
    assert node.states["oneshot-1"].restarts == 1


def test_crash_before_spawn_does_not_fail_the_instance() -> None:
    """The last restart the budget allows is decided and recorded, the node dies
    before Spawn runs; the live node would now be running its server."""
    node = _running_oneshot_with_restarts(1)
    (p,) = [p for p in node.world.procs.values() if p.alive]
    node.exit_proc(p, 1, None)
    node.drain()  # restart 2 of 2 scheduled
    node.world_passes(POLICY.cap_s * 1.5 + 0.1)
    del node.timers[("oneshot-1", "restart")]
    with pytest.raises(Crash):
        node.run("oneshot", o.TimerDue(name="restart"), crash_after=1)  # Starting, no Spawn
    assert node.states["oneshot-1"].launch_token  # recorded: Starting, no Spawned
    node.crash()
    node.boot()
    node.settle()
    assert node.states["oneshot-1"].lifecycle is LifecycleState.RUNNING


def test_crash_mid_expiry_rests_after_boot_and_nothing_runs_twice() -> None:
    """Issue 21: the idle expiry is recorded with its stop to rest, the node dies
    before SIGTERM is sent; the boot finishes the stop and the instance rests
    (one expiry, one stop, the server ended once)."""
    node = SimNode()
    for slot in SLOTS:
        node.place(slot)
    node.run("llama", o.StartVerb(by="operator"))
    iid = node.slot_iid["llama"]
    node.run("llama", o.ProbeResult(token=probe_token(node.states[iid]), report=REPORTS["up"]))
    assert node.states[iid].lifecycle is LifecycleState.RUNNING
    node.world_passes(21.0)
    with pytest.raises(Crash):
        node.run("llama", o.Tick(), crash_after=0)  # recorded; Terminate never ran
    kinds = [stored.kind for stored, _ in node.chain if stored.subject == iid]
    assert kinds[-2:] == ["residency.expired", "instance.stop_requested"]
    assert node.world.alive_for(iid)
    node.crash()
    node.boot()
    node.settle()
    assert node.states[iid].lifecycle is LifecycleState.RESTING
    assert not node.world.alive_for(iid)
    kinds = [stored.kind for stored, _ in node.chain if stored.subject == iid]
    assert kinds.count("residency.expired") == 1 and kinds.count("instance.stop_requested") == 1


def test_demand_planned_while_its_unload_is_in_flight_is_refused() -> None:
    """Found by the machine (once other test files changed its draws, see
    tests/test_hypothesis_import_order.py): an Ollama model evicted, its unload
    in flight, the node plans room for a request for it. ``residency.demanded``
    was recorded then, though the demand itself is held back until the unload
    ends and nothing took it up after: the live node left the model resting,
    wanted running, while a boot resumed the recorded demand and loaded it.
    Now the plan is refused like the demand (nothing recorded): the crashed
    node and its twin agree, and a demand after the unload starts it."""
    node = SimNode()
    for slot in SLOTS:
        node.place(slot)
    iid = node.slot_iid["ollama"]
    node.run("ollama", o.StartVerb(by="operator"))
    node.drain()  # not resident: claimed, loaded, ready
    assert node.states[iid].lifecycle is LifecycleState.RUNNING
    node.run("ollama", EVICT)
    assert list(node.pending) == [("ollama", "unload")]
    mark = len(node.chain)
    node.run("ollama", ROOM_PLANNED)
    node.run("ollama", DEMAND)
    assert [stored.kind for stored, _ in node.chain[mark:]] == []  # both held back
    node.deliver_one()  # the unload ends: memory released
    twin = copy.deepcopy(node)
    node.crash()
    node.boot()
    node.settle()
    twin.settle()
    assert node.sourced() == twin.sourced()
    assert node.states[iid].lifecycle is LifecycleState.RESTING
    node.run("ollama", DEMAND)  # asked again once the unload has ended
    node.drain()
    assert node.states[iid].lifecycle is LifecycleState.RUNNING


def test_zz_coverage() -> None:
    """Runs after the machine: every lifecycle state and event kind was reached."""
    if not SEEN_KINDS:
        pytest.skip("the state machine did not run in this session")
    missing_states = sorted(set(LifecycleState) - SEEN_STATES)
    missing_kinds = sorted(ALL_KINDS - SEEN_KINDS)
    assert not missing_states and not missing_kinds, (
        f"never reached: states {missing_states}, event kinds {missing_kinds}"
    )
