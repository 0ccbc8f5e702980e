"""Crash-anywhere, against the real node: a hypothesis state machine drives ONE
Node (ManualClock) with four instances at once and checks, after every step,
what the chain says against what is live.

Instances: a managed llama.cpp protocol fake (continuous), a managed one-shot
(``continuous=False``, exits 0 once the file ``exit-now`` appears in its
working directory), an adopted fake llama server this test runs itself, and a
managed Ollama model on the Ollama test server. All managed fakes run
tests/programs/nca_server.py, steered by files in their working directory
(``health``, ``bind``, ``exit-now``).

Rules: operator verbs (start, stop, restart, reload = unload + place, newer and
stale placements), health files, SIGKILL of a managed server, the one-shot's
clean exit, an address taken before a start, a server that binds beyond
loopback, clock advances (only once settled) and node crashes (every actor
dropped without shutdown, servers left running, a new node opened on the same
chain and clock).

Invariants, once every instance is settled: the chain verifies; replay equals
the live state; every process group the chain records as live exists, and no
process carrying one of the chain's launch tokens runs outside those groups;
every restart attempt starts at or after the recorded due time of its
``instance.restart_scheduled``; a reopen never lowers the restart count.

Coverage is asserted: :func:`test_zz_node_coverage` fails naming every
lifecycle state and instance event kind that neither the random run nor the
directed tour (the same machine, a fixed sequence) reached.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any

import hypothesis
import msgspec
import psutil
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from support import (
    CRASH_LEAVES_SOCKETS,
    PROGRAMS,
    make_launcher,
    ollama_server,
    own_server,
    pids_of_group,
    wait_until,
)

from infervisor.actors.clock import ManualClock
from infervisor.actors.errors import InvalidState, NotResident, VerbRefused
from infervisor.actors.kinds import KindSettings
from infervisor.actors.node import Node
from infervisor.actors.node_boot import stop_actors
from infervisor.actors.settings import NodeSettings
from infervisor.adapters import ollama
from infervisor.adapters.errors import AdmissionRefused
from infervisor.adapters.manifest import ModelFormat
from infervisor.adapters.ports import free_port, port_in_use
from infervisor.adapters.spec import Flavor, InstanceSpec, Mode
from infervisor.chain import SqliteChain, verify_chain
from infervisor.replay import LifecycleState, RestartPolicy, timeline
from infervisor.replay import events as ev
from infervisor.replay.lifecycle import LIVE_STATES

pytestmark = [pytest.mark.slow, *CRASH_LEAVES_SOCKETS]

FIELDS = ("lifecycle", "desired", "process", "restarts", "reserved_bytes")
TICK = 0.5  # health interval (s, manual clock)
RECONCILE = 1.0
POLICY = RestartPolicy(max_restarts=2, base_s=1.0, cap_s=2.0, stable_after_s=5.0)
TAG = "tinyllama"
SLOTS = ("llama", "oneshot", "adopted", "ollama")
MANAGED_PROCESS = ("llama", "oneshot")
FAKES = ("llama", "adopted")  # instances whose health a file decides
REFUSALS = (InvalidState, VerbRefused, AdmissionRefused)
TOKEN_VAR = "INFERVISOR_LAUNCH_TOKEN"

#: Every instance event kind the chain schema has (``instance.*`` tags).
INSTANCE_KINDS = frozenset(
    t.__struct_config__.tag
    for t in vars(ev).values()
    if isinstance(t, type)
    and hasattr(t, "__struct_config__")
    and isinstance(t.__struct_config__.tag, str)
    and t.__struct_config__.tag.startswith("instance.")
)
#: Kinds left out of the coverage check, with the reason.
EXCLUDED: dict[str, str] = {
    "instance.deep_health_failed": (
        "needs a kind with deep_interval_s and a server whose completions fail; "
        "tests/test_deep_health.py drives it on llama.cpp, mlx-lm and Ollama, and "
        "tests/test_crash_anywhere.py crashes around it"
    ),
    "instance.strays_ended": (
        "needs processes left in an instance's cgroup that no record claims; "
        "tests/test_core_rules.py decides it and tests/test_containment.py kills "
        "nodes mid-launch with real cgroups"
    ),
    "instance.unload_failed": (
        "needs an Ollama that refuses an unload; tests/test_core_mended_decisions.py "
        "decides it and tests/test_crash_anywhere.py crashes around it"
    ),
}

SEEN_STATES: set[str] = set()
SEEN_KINDS: set[str] = set()
RUNS: list[str] = []  # which drivers ran (the coverage check needs both)
#: What the random run reached by itself (reported by the coverage check).
RANDOM_SEEN: set[str] = set()
STEPS: list[str] = []  # every rule the random run took


def projection(inst: Any) -> dict[str, Any]:
    return {f: getattr(inst, f) for f in FIELDS}


def _note(what: str) -> None:
    """``hypothesis.event`` when running under hypothesis (not in the directed tour)."""
    with contextlib.suppress(Exception):
        hypothesis.event(what)


class NodeCrashAnywhere(RuleBasedStateMachine):
    driver = "random"

    def __init__(self) -> None:
        super().__init__()
        self.stack = contextlib.ExitStack()
        self.tmp = Path(tempfile.mkdtemp(prefix="nca-"))
        self.clock = ManualClock()
        self.old_nodes: list[Node] = []
        self.generation: dict[str, int] = dict.fromkeys(SLOTS, 0)
        try:
            self._set_up()
        except BaseException:
            self.teardown()
            raise

    # ------------------------------------------------------------ setup, teardown

    def _set_up(self) -> None:
        models = self.tmp / "models"
        models.mkdir()
        # a valid GGUF v3 header with no tensors (the fake server never reads it)
        (models / "tiny.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0) + bytes(40))
        launcher = make_launcher(self.tmp, PROGRAMS / "nca_server.py")
        # Loaded, the model takes more than /api/tags says: the node corrects its
        # reservation (instance.memory_corrected).
        self.ollama = self.stack.enter_context(
            ollama_server(TAG, load_seconds=0.2, loaded_size=700_000_000)
        )
        adopted_port = free_port()
        adopted_dir = self.tmp / "adopted"
        self.adopted_dir = adopted_dir
        argv = [sys.executable, str(PROGRAMS / "nca_server.py"), "--port", str(adopted_port)]
        self.adopted = self.stack.enter_context(
            own_server(argv, cwd=adopted_dir, port=adopted_port)
        )
        wait_until(lambda: port_in_use("127.0.0.1", adopted_port), 20, "the adopted server")
        self.settings = NodeSettings(
            node_id="n1",
            data_dir=str(self.tmp / "data"),
            registry_dir=str(models),
            llamacpp_program=launcher,
            health_interval_s=TICK,
            reconcile_interval_s=RECONCILE,
            stop_grace_s=2.0,
            health_kill_grace_s=1.0,
            miss_limit=2,
            kinds={"inference": KindSettings(miss_limit=2)},
            memory_budget_bytes=10**9,
            reserve_overhead_bytes=4096,
            ollama_keep_alive="5m",
            restart=POLICY,
        )
        self.node = Node.open(self.settings, self.clock)
        self.node.registry.adopt("tiny", models / "tiny.gguf")
        self.node.registry.adopt(TAG, format=ModelFormat.OLLAMA, ollama_tag=TAG)
        self.specs = {
            "llama": InstanceSpec(
                role="chat", flavor=Flavor.LLAMACPP, model="tiny", port=free_port()
            ),
            "oneshot": InstanceSpec(
                role="job",
                flavor=Flavor.LLAMACPP,
                model="tiny",
                port=free_port(),
                kind="process",
                continuous=False,
            ),
            "adopted": InstanceSpec(
                role="ext", flavor=Flavor.LLAMACPP, mode=Mode.ADOPTED, port=adopted_port
            ),
            "ollama": InstanceSpec(
                role="llm", flavor=Flavor.OLLAMA, model=TAG, port=self.ollama.port
            ),
        }
        self.iids = {slot: self.node.place(spec) for slot, spec in self.specs.items()}

    def teardown(self) -> None:
        node = getattr(self, "node", None)
        try:
            if node is not None:
                with contextlib.suppress(Exception):
                    node.shutdown()
            for old in self.old_nodes:
                with contextlib.suppress(Exception):
                    old.shutdown(stop_servers=False)
            if node is not None:
                self._collect()
                self._kill_our_groups()
        finally:
            self.stack.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _kill_our_groups(self) -> None:
        """Whatever a failed run left: every group the chain ever spawned, SIGKILLed."""
        for event in self._events(ev.Spawned):
            for pid in pids_of_group(event.pgid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            wait_until(lambda e=event: pids_of_group(e.pgid) == [], 10, f"group {event.pgid}")

    # ------------------------------------------------------------ reading the chain

    def _events(self, kind: type) -> list[Any]:
        tag = kind.__struct_config__.tag
        with SqliteChain.open_readonly(self.settings.chain_path) as chain:
            return [ev.decode_event(s) for s in chain.events(kinds=[tag])]

    def _kinds(self, slot: str) -> set[str]:
        with SqliteChain.open_readonly(self.settings.chain_path) as chain:
            return {s.kind for s in chain.events() if s.subject == self._iid(slot)}

    def _subjects(self) -> set[str]:
        with SqliteChain.open_readonly(self.settings.chain_path) as chain:
            return {s.subject for s in chain.events() if s.kind.startswith("instance.")}

    def _collect(self) -> None:
        for iid in self._subjects():
            for entry in timeline(self.settings.chain_path, iid):
                if entry.kind not in SEEN_KINDS:
                    SEEN_KINDS.add(entry.kind)
                if entry.to != "-":
                    SEEN_STATES.add(entry.to)
                if self.driver == "random":
                    RANDOM_SEEN.update({entry.kind, entry.to})
                _note(f"kind {entry.kind}")
                if entry.to != "-":
                    _note(f"state {entry.to}")

    # ------------------------------------------------------------ helpers

    def _iid(self, slot: str) -> str:
        return self.iids[slot]

    def _state(self, slot: str) -> Any:
        return self.node.live_states()[self._iid(slot)]

    def _all_settled(self) -> bool:
        """No probe or termination in flight, and every managed server just started
        has had (real) time to listen: a ManualClock tick never outruns its bind."""
        if not all(self.node.settled(iid) for iid in self.iids.values()):
            return False
        states = self.node.live_states()
        for slot in MANAGED_PROCESS:
            st = states[self.iids[slot]]
            starting = st.lifecycle is LifecycleState.STARTING and st.process is not None
            if (
                starting
                and psutil.pid_exists(st.process.pid)
                and not port_in_use("127.0.0.1", self.specs[slot].port)
            ):
                return False
        return True

    def _settle(self) -> None:
        wait_until(self._all_settled, 30, "every instance settled")

    def _advance(self, seconds: float) -> None:
        self._settle()
        self.clock.advance(seconds)

    def _ticks(self, seconds: float) -> None:
        """Advance ``seconds`` one health interval at a time, each once settled."""
        left = seconds
        while left > 0:
            self._advance(min(TICK, left))
            left -= TICK

    def lifecycles(self) -> dict[str, str]:
        states = self.node.live_states()
        return {slot: str(states[iid].lifecycle) for slot, iid in self.iids.items()}

    def tick_until(self, done: Any, what: str) -> None:
        """Advance a health interval at a time, each once settled, until ``done()``."""

        def step() -> bool:
            if not self._all_settled():
                return False
            if done():
                return True
            self.clock.advance(TICK)
            return False

        wait_until(step, 60, what)

    def _verb(self, fn: Any, *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except REFUSALS as e:
            _note(f"refused {type(e).__name__}")
            return None

    def _recorded_pid_changes(self, slot: str, pid: int) -> None:
        def moved() -> bool:
            proc = self._state(slot).process
            return proc is None or proc.pid != pid

        wait_until(moved, 30, f"the exit of {slot}'s pid {pid} to be recorded")

    # ------------------------------------------------------------ rules: verbs

    @rule(slot=st.sampled_from(SLOTS))
    def start(self, slot: str) -> None:
        self._verb(self.node.start, self._iid(slot))

    @rule(slot=st.sampled_from(SLOTS))
    def stop(self, slot: str) -> None:
        self._verb(self.node.stop, self._iid(slot))

    @rule(slot=st.sampled_from(SLOTS))
    def restart(self, slot: str) -> None:
        self._verb(self.node.restart, self._iid(slot))

    @rule(slot=st.sampled_from(SLOTS))
    def reload(self, slot: str) -> None:
        """Unload, then place again: what clears an exposure hold."""
        self._verb(self.node.unload, self._iid(slot))
        if slot == "llama":
            (Path(self.settings.data_dir) / "instances" / self._iid(slot) / "bind").unlink(
                missing_ok=True
            )
        self.generation[slot] = 0
        self.iids[slot] = self.node.place(self.specs[slot])

    @rule()
    def on_demand(self) -> None:
        """Place the llama slot again on demand (it rests), then demand it: the
        demand records its start and answers at once (timeout 0, the manual
        clock brings it up)."""
        self._verb(self.node.unload, self._iid("llama"))
        (Path(self.settings.data_dir) / "instances" / self._iid("llama") / "bind").unlink(
            missing_ok=True
        )
        self.generation["llama"] = 0
        spec = msgspec.structs.replace(self.specs["llama"], on_demand=True)
        self.iids["llama"] = self.node.place(spec)
        with contextlib.suppress(NotResident, *REFUSALS):
            self.node.demand(
                self._iid("llama"), request="nca", model="tiny", by="front", timeout_s=0
            )

    @rule(slot=st.sampled_from(SLOTS))
    def placements(self, slot: str) -> None:
        """A controller places the instance again: a newer generation, then a stale one."""
        self.generation[slot] += 2
        gen = self.generation[slot]
        assert self.node.place(self.specs[slot], placed_by="ctl", generation=gen) == self._iid(slot)
        assert self.node.place(self.specs[slot], placed_by="ctl", generation=gen - 1) == (
            self._iid(slot)
        )

    # ------------------------------------------------------------ rules: the world

    def _workdir(self, slot: str) -> Path:
        if slot == "adopted":
            return self.adopted_dir
        path = Path(self.settings.data_dir) / "instances" / self._iid(slot)
        path.mkdir(parents=True, exist_ok=True)
        return path

    @rule(slot=st.sampled_from(FAKES), health=st.sampled_from(["ok", "fail"]))
    def set_health(self, slot: str, health: str) -> None:
        (self._workdir(slot) / "health").write_text(health)

    @rule(slot=st.sampled_from(MANAGED_PROCESS))
    def kill(self, slot: str) -> None:
        proc = self._state(slot).process
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        self._recorded_pid_changes(slot, proc.pid)

    @rule()
    def one_shot_exits(self) -> None:
        proc = self._state("oneshot").process
        if proc is None:
            return
        (self._workdir("oneshot") / "exit-now").touch()
        self._recorded_pid_changes("oneshot", proc.pid)
        (self._workdir("oneshot") / "exit-now").unlink(missing_ok=True)

    @rule()
    def ollama_drops_the_model(self) -> None:
        """Somebody else unloads the model from Ollama (as a keep-alive running out
        would): the node records the drop and loads it again under the policy."""
        if self._state("ollama").lifecycle is not LifecycleState.RUNNING:
            return
        ollama.unload(self.ollama.url, TAG)
        self.tick_until(
            lambda: "instance.model_dropped" in self._kinds("ollama"), "the drop recorded"
        )

    @rule()
    def address_taken(self) -> None:
        """Somebody listens on the llama instance's port; a start is refused (recorded)."""
        if self._state("llama").lifecycle in LIVE_STATES:
            return
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", self.specs["llama"].port))
            s.listen()
            # AdmissionRefused (recorded), or InvalidState while an exposure holds it
            with pytest.raises(REFUSALS):
                self.node.start(self._iid("llama"))

    @rule()
    def exposed(self) -> None:
        """The llama server comes back listening on 0.0.0.0: stopped and held."""
        (self._workdir("llama") / "bind").write_text("0.0.0.0")
        before = len(self._events(ev.Exposed))
        if self._verb(self.node.restart, self._iid("llama")) is None:
            return

        def seen() -> bool:
            if len(self._events(ev.Exposed)) > before:
                return True
            if not self._all_settled():
                return False
            if self._state("llama").process is None:
                return True  # it ended otherwise first (e.g. a health kill)
            self.clock.advance(RECONCILE)
            return False

        wait_until(seen, 30, "instance.exposed")

    # ------------------------------------------------------------ rules: time, crashes

    @rule()
    def tick(self) -> None:
        self._advance(TICK)

    @rule(n=st.integers(3, 6))
    def ticks(self, n: int) -> None:
        """Several health intervals (each once settled): enough for a verdict."""
        for _ in range(n):
            self._advance(TICK)

    @rule()
    def past_backoff(self) -> None:
        self._advance(POLICY.cap_s + TICK)

    @rule()
    def stable_period(self) -> None:
        self._ticks(POLICY.stable_after_s + TICK)

    @rule()
    def crash_and_reopen(self) -> None:
        before = {iid: s.restarts for iid, s in self.node.live_states().items()}
        stop_actors(self.node._actors)
        self.old_nodes.append(self.node)
        self.node = Node.open(self.settings, self.clock)
        for iid in self.iids.values():
            self.node.status(iid)  # queued behind the boot the host told it
        after = {iid: s.restarts for iid, s in self.node.live_states().items()}
        for iid, n in before.items():
            assert after[iid] >= n, f"{iid}: restarts {n} before the reopen, {after[iid]} after"

    # ------------------------------------------------------------ invariants

    @invariant()
    def consistent(self) -> None:
        if self.driver == "random":
            STEPS.append("check")
        self._settle()
        report = verify_chain(self.settings.chain_path)
        assert report.ok, report.problem

        def same() -> bool:
            live = {iid: projection(s) for iid, s in self.node.live_states().items()}
            replayed = self.node.rebuild().instances
            return set(live) == set(replayed) and all(
                projection(replayed[iid]) == p for iid, p in live.items()
            )

        wait_until(same, 20, "replay to equal the live state")
        self._processes_match()
        self._backoff_honoured()
        self._collect()

    def _process_problem(self) -> str:
        """What is wrong between the chain's live processes and the system's ("": nothing)."""
        recorded = {
            s.process.pgid: iid
            for iid, s in self.node.rebuild().instances.items()
            if s.process is not None
        }
        for pgid, iid in recorded.items():
            if not pids_of_group(pgid):
                return f"{iid}: the chain records group {pgid} as live; it is gone"
        tokens = {e.launch_token for e in self._events(ev.Starting) if e.launch_token}
        for p in psutil.process_iter(["pid", "status"]):
            try:
                if p.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                token = p.environ().get(TOKEN_VAR)
                if token not in tokens or os.getpgid(p.pid) in recorded:
                    continue
                # the exit-status shim: a session of its own, the parent of a live server
                if any(os.getpgid(c.pid) in recorded for c in p.children()):
                    continue
                return f"pid {p.pid} (token {token}) runs outside every live group {recorded}"
            except (psutil.Error, ProcessLookupError, PermissionError):
                continue
        return ""

    def _processes_match(self) -> None:
        problem = [""]

        def ok() -> bool:
            problem[0] = self._process_problem()
            return not problem[0]

        try:
            wait_until(ok, 30, "the live processes to match the chain")
        except BaseException:
            pytest.fail(problem[0])

    def _backoff_honoured(self) -> None:
        with SqliteChain.open_readonly(self.settings.chain_path) as chain:
            stored = list(chain.events())
        due: dict[str, Any] = {}
        for s in stored:
            if not s.kind.startswith("instance."):
                continue
            event = ev.decode_event(s)
            if isinstance(event, ev.RestartScheduled):
                due[s.subject] = event.due
            elif isinstance(event, ev.Starting):
                scheduled = due.pop(s.subject, None)
                if event.attempt > 0 and scheduled is not None and event.at is not None:
                    if scheduled.boot_id == event.at.boot_id:
                        assert event.at.mono_s >= scheduled.mono_s - 1e-9, (
                            f"{s.subject} attempt {event.attempt} started at "
                            f"{event.at.mono_s}, before its due time {scheduled.mono_s}"
                        )
                    else:
                        assert event.at.wall_ns >= scheduled.wall_ns


class DirectedTour(NodeCrashAnywhere):
    driver = "directed"


NodeCrashAnywhere.TestCase.settings = settings(
    max_examples=5,
    stateful_step_count=20,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


#: The random run, collected by pytest as a unittest case (so that
#: ``--hypothesis-show-statistics`` lists the ``hypothesis.event`` notes).
TestNodeCrashAnywhere = NodeCrashAnywhere.TestCase
TestNodeCrashAnywhere.pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_node_directed_tour() -> None:
    """The same machine through a fixed sequence that reaches every state and kind."""
    m = DirectedTour()
    try:
        m.consistent()
        for slot in SLOTS:
            m.start(slot)
            m.consistent()
        m.tick_until(
            lambda: (
                m.lifecycles()
                == {
                    "llama": "running",
                    "oneshot": "running",
                    "adopted": "running",
                    "ollama": "running",
                }
            ),
            "all four running",
        )
        m.consistent()
        # adopted: unhealthy, then recovered
        m.set_health("adopted", "fail")
        m.tick_until(lambda: m.lifecycles()["adopted"] == "unhealthy", "adopted unhealthy")
        m.set_health("adopted", "ok")
        m.tick_until(lambda: m.lifecycles()["adopted"] == "running", "adopted recovered")
        m.consistent()
        # Ollama drops the model: recorded, released, loaded again
        m.ollama_drops_the_model()
        m.tick_until(lambda: m.lifecycles()["ollama"] == "running", "ollama loaded again")
        m.consistent()
        # a crash while everything runs: reattached
        m.crash_and_reopen()
        m.consistent()
        # a health kill, then a restart after the backoff, then stable
        m.set_health("llama", "fail")
        m.tick_until(lambda: m.lifecycles()["llama"] == "restarting", "a health kill")
        m.consistent()
        m.set_health("llama", "ok")
        m.past_backoff()
        m.tick_until(lambda: m.lifecycles()["llama"] == "running", "llama running again")
        m.consistent()
        m.stable_period()
        m.consistent()
        # kills (a crash during each backoff) until the budget is spent: failed
        for _ in range(POLICY.max_restarts + 1):
            m.tick_until(lambda: m.lifecycles()["llama"] == "running", "llama running")
            m.kill("llama")
            m.consistent()
            m.crash_and_reopen()
            m.past_backoff()
            m.consistent()
        m.tick_until(lambda: m.lifecycles()["llama"] == "failed", "llama failed")
        # the one-shot ends cleanly: finished
        m.one_shot_exits()
        m.tick_until(lambda: m.lifecycles()["oneshot"] == "finished", "one-shot finished")
        m.consistent()
        # stops (Ollama's releases its memory), placements, a taken address
        for slot in SLOTS:
            m.stop(slot)
            m.consistent()
        m.placements("llama")
        m.address_taken()
        m.consistent()
        m.start("llama")
        m.tick_until(lambda: m.lifecycles()["llama"] == "running", "llama running")
        m.exposed()
        m.consistent()
        m.reload("llama")
        m.start("llama")
        m.tick_until(lambda: m.lifecycles()["llama"] == "running", "llama running")
        m.consistent()
        # residency: placed on demand it rests; a demand starts it
        m.on_demand()
        m.tick_until(lambda: m.lifecycles()["llama"] == "running", "demanded llama running")
        m.consistent()
    finally:
        m.teardown()
    RUNS.append("directed")


def test_zz_node_coverage() -> None:
    """Every lifecycle state and instance event kind was reached by the runs above."""
    if not STEPS or "directed" not in RUNS:
        pytest.skip("the random run and the directed tour did not both run in this session")
    states = {s.value for s in LifecycleState} - SEEN_STATES
    kinds = INSTANCE_KINDS - SEEN_KINDS - set(EXCLUDED)
    alone = sorted(({s.value for s in LifecycleState} | INSTANCE_KINDS) - RANDOM_SEEN)
    print(f"random run: {len(STEPS)} steps; never reached by it alone: {alone}")
    assert not states and not kinds, (
        f"never reached: states {sorted(states)}, event kinds {sorted(kinds)}"
    )
