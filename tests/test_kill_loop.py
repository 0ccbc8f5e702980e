"""SIGKILL `infervisor run` 6 times at chosen moments while three servers crash-loop.

One data directory, three managed instances (fake llama servers of
tests/programs/kill_loop_server.py): ``flap`` answers health, then exits 1
after a random 0.3-1.5 s; ``batch`` is a one-shot (``continuous = false``)
that exits 0 after 1 s; ``atonce`` exits 3 before it listens. The restart
policy is base 0.3 s, cap 1.5 s, a budget that is never spent, and
``stable_after_s = 0.5`` so the flapper's backoff keeps resetting (delays of
0.3, 0.6, 1.2 and 1.5 s all occur).

The node is SIGKILLed (only it: the servers live on under their shims): the
first kill right as the one-shot exits, then, in turn, right after an
``instance.starting`` is appended, during a backoff (right after an
``instance.restart_scheduled``), while a server answers (right after an
``instance.ready``), right after boot, and at a random time after launch
(which includes the boot itself); each moment once (one round: a second
round reached the same moments again and doubled the test's time), the
delays after the event picked by a seeded random (``KILL_LOOP_SEED`` picks another). The
test counts the moments it reached and fails if one never was. At every kill
point the test checks that each port has at most one listener and that it
carries the launch token of the instance's last recorded ``instance.starting``.

Final states come from a reference run without kills (another data dir, the
same config), settled the same way: the file ``kill_loop_stay`` in each
instance's working directory makes its next server stay up, the test waits
until every continuous instance runs again, then SIGTERMs the node. The
reference result is also asserted explicitly (``stopped``, ``stopped``,
``finished``).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from support import PROGRAMS, chain_rows, cli_here, listening_pids, make_launcher, pids_of_group
from test_run_resume import (
    NodeRun,
    by_role,
    end_runs,
    events_of,
    lifecycle,
    put_model,
    read_state,
    toml_str,
)

from infervisor.adapters.ports import free_port
from infervisor.replay import NodeState

SEED = int(os.environ.get("KILL_LOOP_SEED", "20261201"))  # set it to replay another run
#: The moments a kill is aimed at after the first (in this order, round after round).
MOMENTS = ("starting", "backoff", "ready", "boot", "random")
ROUNDS = 1  # every moment is reached in each round; the test counts them
KILLS = 1 + ROUNDS * len(MOMENTS)  # it prints its timings with -s
EPSILON_S = 0.05
SETTLE_S = 90.0
STEP_S = 60.0
ROLES = ("flap", "batch", "atonce")
BATCH_EXIT_AFTER_S = 1.0
EXPECTED_FINAL = {"flap": "stopped", "batch": "finished", "atonce": "stopped"}
STAY = "kill_loop_stay"


def write_kill_loop_config(tmp_path: Path, program: str, data: str, ports: list[int]) -> Path:
    path = tmp_path / f"{data}.toml"
    path.write_text(
        f"""
[node]
node_id = "n1"
data_dir = "{data}"
llamacpp_program = {toml_str(program)}
health_interval_s = 0.1
reconcile_interval_s = 0.5
stop_grace_s = 5.0

[node.restart]
base_s = 0.3
cap_s = 1.5
max_restarts = 1000000
stable_after_s = 0.5

[[models]]
name = "tiny"
path = "tiny.gguf"

[[instances]]
role = "flap"
flavor = "llamacpp"
model = "tiny"
port = {ports[0]}
env = {{ KILL_LOOP_MODE = "flap", KILL_LOOP_MIN_S = "0.3", KILL_LOOP_MAX_S = "1.5" }}

[[instances]]
role = "batch"
flavor = "llamacpp"
model = "tiny"
port = {ports[1]}
kind = "process"
continuous = false
env = {{ FAKE_EXIT_AFTER = "{BATCH_EXIT_AFTER_S}", FAKE_EXIT_CODE = "0" }}

[[instances]]
role = "atonce"
flavor = "llamacpp"
model = "tiny"
port = {ports[2]}
env = {{ KILL_LOOP_MODE = "at_once" }}
"""
    )
    put_model(tmp_path / data)
    return path


def three_ports() -> list[int]:
    ports: list[int] = []
    while len(ports) < 3:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


# ---------------------------------------------------------------- reading the chain
def last_seq(db: Path, kind: str) -> int:
    return max((r[0] for r in chain_rows(db) if r[2] == kind), default=-1)


def ids_by_role(db: Path) -> dict[str, str]:
    return {r[4]["spec"]["role"]: r[3] for r in chain_rows(db) if r[2] == "instance.placed"}


def tokens_of(db: Path) -> set[str]:
    return {r[4]["launch_token"] for r in chain_rows(db) if r[2] == "instance.starting"}


# ---------------------------------------------------------------- processes
def listeners(port: int) -> set[int]:
    return listening_pids(port)


def launch_token(pid: int) -> str | None:
    try:
        return psutil.Process(pid).environ().get("INFERVISOR_LAUNCH_TOKEN")
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def processes_with_token(tokens: set[str]) -> list[int]:
    found = []
    for p in psutil.process_iter(["pid", "status"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if launch_token(p.pid) in tokens:
            found.append(p.pid)
    return found


def leftovers(db: Path, marker: str) -> list[int]:
    """Live processes of the chain's instances: by launch token, or in a recorded group."""
    tokens = tokens_of(db)
    found = set(processes_with_token(tokens))
    for r in chain_rows(db):
        if r[2] != "instance.spawned":
            continue
        for pid in pids_of_group(r[4]["pgid"]):
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if launch_token(pid) in tokens or marker in " ".join(proc.cmdline()):
                    found.add(pid)  # not a stranger that reused the group id
    return sorted(found)


def kill_leftovers(db: Path, marker: str) -> None:
    for pid in leftovers(db, marker):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- the checks
def check_ports(db: Path, ports: dict[str, int], kill: int) -> int:
    """At most one listener per port, carrying the last recorded launch token."""
    ids = ids_by_role(db)
    last_token = {}
    for r in chain_rows(db):
        if r[2] == "instance.starting":
            last_token[r[3]] = r[4]["launch_token"]
    seen = 0
    for role, port in ports.items():
        pids = listeners(port)
        assert len(pids) <= 1, f"kill {kill}: {role} port {port} has listeners {pids}"
        for pid in pids:
            token = launch_token(pid)
            if token is None:
                continue  # it exited between the two looks
            seen += 1
            assert role in ids and token == last_token.get(ids[role]), (
                f"kill {kill}: {role} port {port} served by pid {pid} with token {token}, "
                f"the chain's last launch is {last_token.get(ids.get(role, ''))}"
            )
    return seen


def check_backoff(db: Path) -> tuple[list[str], int, int]:
    """Every restart_scheduled (delay D) is followed by its next starting no sooner than D.

    Returns the violations, the pairs checked and how many of them span a boot.
    """
    bad = []
    pairs = across = 0
    boot_seqs = [r[0] for r in chain_rows(db) if r[2] == "node.started"]
    pending: dict[str, list[tuple[int, int, float]]] = {}
    for seq, ts, kind, subject, payload in chain_rows(db):
        if kind == "instance.restart_scheduled":
            pending.setdefault(subject, []).append((seq, ts, float(payload["delay_s"])))
        elif kind == "instance.starting":
            for sseq, sts, delay in pending.pop(subject, []):
                pairs += 1
                across += any(sseq < b < seq for b in boot_seqs)
                gap = (ts - sts) / 1e9
                if gap < delay - EPSILON_S:
                    bad.append(
                        f"{subject}: restart_scheduled #{sseq} delay {delay} s, "
                        f"starting #{seq} after {gap:.3f} s"
                    )
    return bad, pairs, across


def check_one_shot(db: Path, batch_id: str) -> None:
    done_at = None
    for seq, _ts, kind, subject, payload in chain_rows(db):
        if subject != batch_id:
            continue
        if kind == "instance.exited" and payload.get("exit_code") == 0 and done_at is None:
            done_at = seq
        elif kind == "instance.starting" and done_at is not None:
            pytest.fail(f"one-shot started again (#{seq}) after its exit 0 (#{done_at})")
    assert done_at is not None, "the one-shot never recorded exit code 0"


def settle_and_stop(run: NodeRun, db: Path, data: Path) -> NodeState:
    """Make every next server stay up, wait until the continuous ones run, SIGTERM the node."""
    ids = ids_by_role(db)
    # Read before the files exist: a server spawned after this may or may not have
    # seen them (if not, it flaps and a later one does), one spawned before cannot.
    stay_seq = max((r[0] for r in chain_rows(db)), default=0)
    for role in ("flap", "atonce"):
        workdir = data / "instances" / ids[role]
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / STAY).write_text("stay\n")

    up_since: dict[int, float] = {}  # flap pid -> when it was first seen running

    def staying_flap(s: NodeState) -> bool:
        """A flap server that reads the stay file: spawned after it exists, or one
        spawned just before that read it at its start (Python's start-up is after
        the spawn is recorded) and so has outlived KILL_LOOP_MAX_S by far."""
        spawned = {r[3] for r in chain_rows(db) if r[2] == "instance.spawned" and r[0] > stay_seq}
        if ids["flap"] in spawned:
            return True
        proc = s.instances[ids["flap"]].process
        if proc is None:
            return False
        first = up_since.setdefault(proc.pid, time.monotonic())
        return time.monotonic() - first > 3 * 1.5  # KILL_LOOP_MAX_S: a flapper is gone by then

    def settled(s: NodeState) -> bool:
        # An at_once server exits before it listens unless it read the stay file: running
        # is staying, whenever it was spawned.
        return (
            lifecycle(s, "flap") == "running"
            and lifecycle(s, "atonce") == "running"
            and lifecycle(s, "batch") == "finished"
            and staying_flap(s)
        )

    run.until_state(db, "every continuous instance running a staying server", settled, SETTLE_S)
    assert run.stop() == 0, run.output()
    state = read_state(db)
    assert state is not None
    return state


def finals(state: NodeState) -> dict[str, str | None]:
    return {role: lifecycle(state, role) for role in ROLES}


def pick_moment(
    rng: random.Random, kill: int, db: Path
) -> tuple[str, str, Callable[[NodeRun], None]]:
    """The moment (``one-shot`` or one of :data:`MOMENTS`), its description and a
    function that waits (on the running node) until it comes."""
    starting_before = last_seq(db, "instance.starting")
    scheduled_before = last_seq(db, "instance.restart_scheduled")
    booted_before = last_seq(db, "node.started")
    ready_before = last_seq(db, "instance.ready")

    def after(kind: str, before: int, jitter: float) -> Callable[[NodeRun], None]:
        def wait(run: NodeRun) -> None:
            run.until(f"kill {kill}: a new {kind}", lambda: last_seq(db, kind) > before, STEP_S)
            time.sleep(rng.uniform(0, jitter))

        return wait

    if kill == 0:  # a fresh chain: the one-shot is launched in this boot

        def one_shot_exiting(run: NodeRun) -> None:
            spawned = run.until(
                f"kill {kill}: the one-shot spawned",
                lambda: [
                    r[1]
                    for r in chain_rows(db)
                    if r[2] == "instance.spawned" and r[3] == ids_by_role(db).get("batch")
                ],
                STEP_S,
            )
            exit_ns = spawned[-1] + BATCH_EXIT_AFTER_S * 1e9
            time.sleep(max(0.0, (exit_ns - time.time_ns()) / 1e9 + rng.uniform(-0.08, 0.12)))

        return "one-shot", "one-shot exiting", one_shot_exiting
    choice = MOMENTS[(kill - 1) % len(MOMENTS)]
    if choice == "starting":
        return (
            choice,
            "right after instance.starting",
            after("instance.starting", starting_before, 0.03),
        )
    if choice == "backoff":
        return (
            choice,
            "during a backoff",
            after("instance.restart_scheduled", scheduled_before, 0.4),
        )
    if choice == "ready":
        return choice, "while a server answers", after("instance.ready", ready_before, 0.3)
    if choice == "boot":
        return choice, "right after boot", after("node.started", booted_before, 0.2)
    delay = rng.uniform(0.0, 1.5)
    return choice, f"{delay:.2f} s after launch", lambda _run: time.sleep(delay)


# ---------------------------------------------------------------- the test
@pytest.mark.slow
@pytest.mark.timeout(300)  # also its place in the run: conftest, longest first
def test_sigkill_loop_keeps_every_promise(tmp_path: Path) -> None:
    program = make_launcher(tmp_path, PROGRAMS / "kill_loop_server.py")
    marker = str(tmp_path)
    ref_db = tmp_path / "ref" / "chain.db"
    db = tmp_path / "data" / "chain.db"
    ref_runs: list[NodeRun] = []
    node_runs: list[NodeRun] = []

    def runs(config: Path) -> NodeRun:
        node_runs.append(NodeRun(config, tmp_path / f"run-{len(node_runs) + 1}.log"))
        return node_runs[-1]

    began = time.monotonic()
    try:
        # The reference: the same config, no kills, settled and stopped the same way.
        ref_config = write_kill_loop_config(tmp_path, program, "ref", three_ports())
        ref = NodeRun(ref_config, tmp_path / "ref.log")
        ref_runs.append(ref)
        ref.until_state(
            ref_db,
            "reference: the one-shot finished, the others restarted",
            lambda s: (
                lifecycle(s, "batch") == "finished"
                and sum(1 for r in chain_rows(ref_db) if r[2] == "instance.restart_scheduled") >= 6
            ),
            SETTLE_S,
        )
        reference = finals(settle_and_stop(ref, ref_db, tmp_path / "ref"))
        assert reference == EXPECTED_FINAL, reference
        kill_leftovers(ref_db, marker)
        reference_s = time.monotonic() - began

        ports = dict(zip(ROLES, three_ports(), strict=True))
        config = write_kill_loop_config(tmp_path, program, "data", list(ports.values()))
        rng = random.Random(SEED)
        log: list[str] = []
        reached: Counter[str] = Counter()
        batch_finished = False
        listeners_seen = 0
        for kill in range(KILLS):
            moment, name, wait = pick_moment(rng, kill, db)
            node = runs(config)
            wait(node)
            reached[moment] += 1  # the wait raises when its moment never comes
            node.proc.send_signal(signal.SIGKILL)
            node.proc.wait(timeout=20)
            head = max((r[0] for r in chain_rows(db)), default=-1)
            log.append(f"kill {kill}: {name}, chain at #{head}")
            listeners_seen += check_ports(db, ports, kill)
            state = read_state(db)
            if state is not None and lifecycle(state, "batch") == "finished":
                batch_finished = True
            elif batch_finished:
                pytest.fail(f"kill {kill}: the one-shot left finished: {lifecycle(state, 'batch')}")
        loop_s = time.monotonic() - began - reference_s

        last = runs(config)
        state = settle_and_stop(last, db, tmp_path / "data")

        verified = cli_here("chain", "verify", db)  # in this process
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert leftovers(db, marker) == [], "processes outlived the final SIGTERM"
        bad, pairs, across = check_backoff(db)
        assert bad == [], "\n".join(bad + log)
        # At least one backoff spans a boot, and the port check saw a listener:
        # neither check was vacuous.
        assert pairs >= KILLS // 2 and across >= max(1, KILLS // 10), (pairs, across)
        assert listeners_seen >= max(1, KILLS // 10), listeners_seen
        ids = ids_by_role(db)
        check_one_shot(db, ids["batch"])
        assert finals(state) == reference, "\n".join(log)
        assert set(reached) == {"one-shot", *MOMENTS}, reached
        assert by_role(state.instances, "batch")[1].lifecycle == "finished"
        boots = sum(1 for e in events_of(db) if e.kind == "node.started")
        assert boots > KILLS // 2  # most kills hit a node that had booted
        print(
            f"reference {reference_s:.1f} s, {KILLS} kills {loop_s:.1f} s, "
            f"total {time.monotonic() - began:.1f} s; events {len(chain_rows(db))}, boots {boots}, "
            f"listeners checked {listeners_seen}, backoffs {pairs} ({across} across a boot)"
        )
        print("\n".join(log))
    finally:
        end_runs(ref_runs, ref_db)
        end_runs(node_runs, db)
        for chain in (ref_db, db):
            kill_leftovers(chain, marker)
