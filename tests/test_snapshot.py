"""The projection's snapshot (replay/snapshot.py, actors/snapshots.py): a boot from a
snapshot plus the events after it gives what a replay from scratch gives, and a
snapshot that is torn, altered, stale, another history's or another code's is
ignored (the whole chain replayed, the node log saying why)."""

from __future__ import annotations

import enum
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import NodeFactory
from support import wait_until

from infervisor.actors.node import Node
from infervisor.actors.node_boot import boot_state, rebuild_verified
from infervisor.actors.snapshots import Snapshotter, write_snapshot
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.chain import EventDraft, SqliteChain, StoredEvent, encode_payload
from infervisor.chain.errors import ChainTampered
from infervisor.replay import (
    Folder,
    LifecycleState,
    NodeState,
    ReplayError,
    apply,
    kind_of,
    rebuild,
)
from infervisor.replay import events as ev
from infervisor.replay import residency_events as rev
from infervisor.replay.fleet_events import NodeCordoned, NodeDrained, NodeUncordoned, PlacementSet
from infervisor.replay.snapshot import (
    FORMAT,
    SNAPSHOT_FILE,
    Snapshot,
    SnapshotRejected,
    decode_snapshot,
    encode_snapshot,
    fingerprint,
    fingerprint_of,
    resume_chain,
)
from infervisor.replay.state import Cordon, LeaseRecord, RunClock, Stamp, Then

NODE = "snap-node"
NODE_ID = "n1"  # conftest's NodeFactory.settings
SLOTS = ("a", "b", "c")
BOOT = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
ZERO = bytes(32)
#: Kinds the reducer folds that the random chains leave out: a key rotation is
#: read by the trust policy (its note must verify), and folds to no state.
NOT_GENERATED = frozenset({"chain.key_rotated"})


# ------------------------------------------------------------ random legal chains
def _candidates(rng: random.Random, t: int, *, every: bool = False) -> list[tuple[str, ev.Event]]:
    """One event of every kind the generator knows (subject, event), with random fields
    (the residency kinds at a quarter of the steps, or always with ``every``)."""
    at = Stamp(wall_ns=t, mono_s=t / 1e9, boot_id=BOOT)
    due = Stamp(wall_ns=t + 2_000_000_000, mono_s=t / 1e9 + 2, boot_id=BOOT)
    pid = rng.randrange(100, 60_000)
    slot = rng.choice(SLOTS)
    spec = {"flavor": "llamacpp", "model": "tiny", "port": 18_000 + rng.randrange(50)}
    if rng.random() < 0.3:
        spec["on_demand"] = True  # placed resting
    other = rng.choice(SLOTS)
    candidate = rev.Candidate(
        instance_id=slot, last_use_ns=rng.choice([None, t - 10**9]), priority=rng.randrange(-2, 3),
        pinned=False, held_bytes=rng.randrange(2**30), busy=False, chosen=True,
    )  # fmt: skip
    instance: list[ev.Event] = [
        ev.Placed(spec=spec, placed_by=rng.choice(["op", "ctl-1"]), generation=rng.randrange(3)),
        ev.Replaced(placed_by="ctl-1", generation=rng.randrange(1, 9)),
        ev.PlacementIgnored(placed_by="ctl-1", generation=0, current=rng.randrange(1, 4)),
        ev.Starting(
            by=rng.choice(["operator", "supervisor"]),
            attempt=rng.randrange(3),
            at=at,
            reset_budget=rng.random() < 0.3,
            reserved_bytes=rng.randrange(0, 2**30),
            launch_token=f"tok-{rng.randrange(1000)}",
        ),
        ev.Spawned(
            pid=pid,
            pgid=pid,
            start_time=1.7e9 + rng.random(),
            boot_id=BOOT,
            argv=["llama-server", "--port", "1"],
            at=at,
        ),
        ev.Reattached(pid=pid, up_since=at),
        ev.StartRefused(by="operator", reason=rng.choice(["model gone", "port taken"])),
        ev.Ready(detail="ok", at=at),
        ev.Unhealthy(misses=rng.randrange(1, 5), reason="probe timed out"),
        ev.DeepHealthFailed(misses=2, reason="completion failed"),
        ev.Recovered(detail="ok"),
        ev.Exited(
            pid=pid,
            exit_code=rng.choice([None, 0, 1]),
            signal=rng.choice([None, 9]),
            reason="exited",
            oom_killed=rng.random() < 0.2,
            output_tail="bye\n",
        ),
        ev.RestartScheduled(
            attempt=rng.randrange(1, 4), delay_s=2.0, reason="crash", at=at, due=due
        ),
        ev.Failed(attempts=3, reason="budget spent"),
        ev.Finished(exit_code=0),
        ev.StableAgain(uptime_s=61.5),
        ev.StopRequested(
            by="operator",
            grace_s=rng.choice([0.5, 5.0]),
            reason="asked",
            then=rng.choice(list(Then)),
            at=at,
        ),
        ev.Terminating(cause="health", grace_s=5.0, at=at),
        ev.ModelClaimed(ours=rng.random() < 0.5),
        ev.ModelDropped(expired=rng.random() < 0.5),
        ev.MemoryCorrected(reserved_bytes=rng.randrange(2**30), size_bytes=rng.randrange(2**30)),
        ev.MemoryReleased(bytes=rng.randrange(2**30)),
        ev.UnloadFailed(error="ollama said no"),
        ev.Exposed(addresses=["0.0.0.0:18000"]),
        ev.StraysEnded(pids=[pid + 1], cgroup="/sys/fs/cgroup/x"),
        ev.Unloaded(by="operator"),
    ]
    # Drawn at a quarter of the steps: among every step's options they would
    # otherwise keep the walk from failing, finishing and restarting.
    residency: list[ev.Event] = [
        rev.ResidencyDemanded(request=f"req-{rng.randrange(99)}", model="tiny", by="front:t"),
        rev.ResidencyEvicted(
            for_instance=other,
            needed_bytes=2**20,
            freed_bytes=candidate.held_bytes,
            budget_bytes=2**31,
            in_use_bytes=2**30,
            candidates=[candidate],
        ),
        rev.ResidencyExpired(idle_since_ns=t - 10**10, idle_ttl_s=rng.choice([1.0, 300.0])),
        rev.ResidencyRefused(
            needed_bytes=2**31,
            budget_bytes=2**31,
            in_use_bytes=2**30,
            held={other: 2**30},
            candidates=[candidate],
        ),
        rev.ResidencyBusy(),
        rev.ResidencyIdle(idle_since_ns=t),
    ]
    node: list[ev.Event] = [
        ev.NodeStarted(pid=pid, boot_id=BOOT, version="0.1"),
        ev.NodeStopped(reason="shutdown"),
        ev.LeaseRenewed(controller=rng.choice(["ctl-1", "ctl-2"]), at=at),
        ev.WitnessOverride(witness="w1", witness_size=5, chain_size=4, reason="cut", flag="--x"),
        ev.AdmissionRefused(reason="no room", spec=spec),
        ev.NodeStraysEnded(instance_id="gone", pids=[pid], cgroup="/sys/fs/cgroup/y"),
        NodeCordoned(reason="maintenance"),
        NodeDrained(reason=None),
        NodeUncordoned(reason=None),
        PlacementSet(controller="ctl-1", generation=rng.randrange(5), instances=[slot]),
    ]
    if every or rng.random() < 0.25:
        instance += residency
    return [(slot, e) for e in instance] + [("", e) for e in node]


def _trial(seq: int, ts: int, subject: str, event: ev.Event) -> StoredEvent:
    payload = ev.encode_event(event)
    return StoredEvent(seq=seq, ts_ns=ts, node=NODE, source="test", kind=kind_of(event),
                       subject=subject, payload=payload, payload_hash=ZERO, prev_hash=ZERO,
                       hash=ZERO)  # fmt: skip


def random_chain(path: Path, seed: int, length: int, kinds: Counter[str]) -> int:
    """A chain of `length` events the reducer accepts (a random walk: each step one
    random event among those that fold onto the state so far); returns its size."""
    rng = random.Random(seed)
    state = NodeState(node_id=NODE, head_seq=0, head_hash=ZERO.hex())
    drafts: list[EventDraft] = []
    t = 1_700_000_000_000_000_000
    for seq in range(1, length + 1):
        t += rng.randrange(1, 10**9)
        options = _candidates(rng, t)
        rng.shuffle(options)  # instance events first, mostly: the lifecycle goes further
        options.sort(key=lambda o: (o[0] == "") == (rng.random() < 0.85))
        for subject, event in options:
            try:
                state = apply(state, _trial(seq, t, subject, event))
            except ReplayError:
                continue
            kinds[kind_of(event)] += 1
            inst = state.instances.get(subject)
            if inst is not None:
                kinds[f"state {inst.lifecycle.value}"] += 1
            drafts.append(EventDraft(ts_ns=t, source="test", kind=kind_of(event),
                                     subject=subject, payload=ev.encode_event(event)))  # fmt: skip
            break
    with SqliteChain.open(path, NODE, now_ns=lambda: 1_700_000_000_000_000_000) as chain:
        chain.append_many(drafts)
        return chain.head().seq + 1


def state_at(path: Path, seq: int) -> NodeState:
    """The state after the events up to `seq`, folded from scratch."""
    folder = Folder(NODE)
    with SqliteChain.open_readonly(path) as chain:
        for stored in chain.events():
            if stored.seq > seq:
                break
            folder.feed(stored)
    return folder.state()


def test_snapshot_plus_tail_is_a_rebuild_from_scratch(tmp_path: Path) -> None:
    """For random legal chains, a snapshot taken at genesis, at the head and at
    random places between, encoded, decoded and resumed with the events after it,
    is the state a rebuild from scratch gives; the test counts the places and
    the event kinds it covered and fails when one is never reached."""
    kinds: Counter[str] = Counter()
    places: Counter[str] = Counter()
    compared = 0
    for seed in range(24):
        path = tmp_path / f"chain-{seed}.db"
        size = random_chain(path, seed, length=70, kinds=kinds)
        whole = rebuild(path)
        rng = random.Random(1000 + seed)
        for at in sorted({0, size - 1, *rng.sample(range(1, size - 1), 4)}):
            snapshot = encode_snapshot(state_at(path, at))
            state, replayed = resume_chain(path, decode_snapshot(snapshot, NODE))
            assert state == whole, f"seed {seed}: resumed at seq {at}"
            assert replayed == size - 1 - at
            places["genesis" if at == 0 else "head" if at == size - 1 else "between"] += 1
            compared += 1
    assert set(places) == {"genesis", "head", "between"}, places
    known = {kind_of(e) for _, e in _candidates(random.Random(0), 0, every=True)}
    unknown = set(ev.EVENT_TYPES) - known - NOT_GENERATED
    assert not unknown, f"add these event kinds to _candidates: {sorted(unknown)}"
    missing = {k for k in known if kinds[k] == 0}
    missing |= {f"state {s.value}" for s in LifecycleState if kinds[f"state {s.value}"] == 0}
    assert not missing, f"event kinds and lifecycle states never reached: {sorted(missing)}"
    assert compared >= 24 * 4


def test_resume_round_trips_the_folder(tmp_path: Path) -> None:
    """`Folder.resume(state).state()` is `state`, with every NodeState field set
    to something other than its default (a field added later fails here by name
    until the test sets it, and then until `Folder.resume` carries it)."""
    path = tmp_path / "chain.db"
    random_chain(path, 3, length=60, kinds=Counter())
    base = rebuild(path)
    assert base.instances, "the chain ends with instances placed"
    at = Stamp(wall_ns=5, mono_s=1.0, boot_id=BOOT)
    lease = LeaseRecord(controller="ctl-9", at=at, down_ns=4)
    values: dict[str, Any] = {
        "node_id": NODE,
        "head_seq": 7,
        "head_hash": "ab" * 32,
        "instances": base.instances,
        "boots": 3,
        "lease": lease,
        "leases": {"ctl-9": lease},
        "run": RunClock(head_ns=9, down_ns=2, booting=True),
        "cordon": Cordon.DRAINED,
        "placement_sets": {"ctl-9": 4},
    }
    names = {f.name for f in msgspec.structs.fields(NodeState)}
    assert names == set(values), f"set these NodeState fields here: {sorted(names - set(values))}"
    state = NodeState(**values)
    assert Folder.resume(state).state() == state
    assert Folder.resume(state).head_seq == 7


# ------------------------------------------------------------ refused snapshots
def _chain(tmp_path: Path) -> tuple[Path, int]:
    path = tmp_path / "chain.db"
    return path, random_chain(path, 7, length=40, kinds=Counter())


def test_a_torn_or_altered_snapshot_is_refused(tmp_path: Path) -> None:
    path, size = _chain(tmp_path)
    data = encode_snapshot(state_at(path, size - 5))
    with pytest.raises(SnapshotRejected, match="not a snapshot"):
        decode_snapshot(data[: len(data) // 2], NODE)  # torn
    flipped = bytearray(data)
    flipped[-3] ^= 0x01  # inside the state's body
    with pytest.raises(SnapshotRejected, match="does not hash"):
        decode_snapshot(bytes(flipped), NODE)
    with pytest.raises(SnapshotRejected, match="node"):
        decode_snapshot(data, "another-node")


def test_a_snapshot_of_another_history_is_refused(tmp_path: Path) -> None:
    """Bound by the hash of the event it covers: a consistent snapshot whose head
    is not the chain's event there (forged, re-digested), or beyond the chain's end."""
    path, size = _chain(tmp_path)
    state = state_at(path, size - 5)
    forged = msgspec.structs.replace(state, head_hash="00" * 32)
    with pytest.raises(SnapshotRejected, match=f"covers seq {size - 5}"):
        resume_chain(path, decode_snapshot(encode_snapshot(forged), NODE))
    beyond = msgspec.structs.replace(state, head_seq=size + 3)
    with pytest.raises(SnapshotRejected, match="no event"):
        resume_chain(path, decode_snapshot(encode_snapshot(beyond), NODE))


def test_an_event_after_the_snapshot_is_verified(tmp_path: Path) -> None:
    """The events after the snapshot are verified as they are folded."""
    from chain_tamper import alter_payload

    path, size = _chain(tmp_path)
    data = encode_snapshot(state_at(path, size - 10))
    alter_payload(path, size - 4)
    with pytest.raises(ChainTampered) as caught:
        resume_chain(path, decode_snapshot(data, NODE))
    assert (caught.value.seq, caught.value.reason) == (size - 4, "payload altered")


class _Lifecycle(enum.StrEnum):
    LOADED = "loaded"


class _LifecycleMore(enum.StrEnum):
    LOADED = "loaded"
    RESTING = "resting"


class _OldNode(msgspec.Struct, frozen=True, kw_only=True):
    """A projection of older code: NodeState without most of its fields."""

    node_id: str
    head_seq: int
    head_hash: str


class _NewNode(_OldNode, frozen=True, kw_only=True):
    resting: bool = False


class _Inst(msgspec.Struct, frozen=True):
    lifecycle: _Lifecycle


class _InstMore(msgspec.Struct, frozen=True):
    lifecycle: _LifecycleMore


def test_the_fingerprint_follows_the_projection_shape_and_code() -> None:
    """A field, an enum value or a reducer line added gives another fingerprint."""
    assert fingerprint_of(_OldNode, []) != fingerprint_of(_NewNode, [])
    assert fingerprint_of(_Inst, []) != fingerprint_of(_InstMore, [])
    assert fingerprint_of(_OldNode, [b"rule"]) != fingerprint_of(_OldNode, [b"rule2"])
    assert fingerprint() == fingerprint()  # stable within one code


def test_a_snapshot_of_older_code_is_refused(tmp_path: Path) -> None:
    """A snapshot another code version wrote (another projection, another
    fingerprint) is refused before its state is decoded."""
    path, size = _chain(tmp_path)
    old = _OldNode(node_id=NODE, head_seq=size - 1, head_hash=state_at(path, size - 1).head_hash)
    body = msgspec.msgpack.encode(old)
    import blake3

    record = Snapshot(format=FORMAT, fingerprint=fingerprint_of(_OldNode, [b"old reducer"]),
                      node_id=NODE, seq=old.head_seq, hash=old.head_hash,
                      state_hash=blake3.blake3(body).hexdigest(), state=body)  # fmt: skip
    with pytest.raises(SnapshotRejected, match="other code"):
        decode_snapshot(msgspec.msgpack.encode(record), NODE)
    other_format = msgspec.structs.replace(record, format="infervisor.snapshot/0")
    with pytest.raises(SnapshotRejected, match="format"):
        decode_snapshot(msgspec.msgpack.encode(other_format), NODE)


# ------------------------------------------------------------ the node's boot
def _place(node: Node, model: Path, count: int) -> None:
    """Place `count` managed instances of the fake model (distinct ports; not started)."""
    node.registry.adopt("tiny", model / "tiny.gguf")
    for i in range(count):
        node.place(
            InstanceSpec(role=f"r{i}", flavor=Flavor.LLAMACPP, model="tiny", port=18_400 + i)
        )


def test_boot_from_a_snapshot_and_its_tail(
    nodes: NodeFactory,
    fake_llama: str,
    fake_model: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A node boots from an older snapshot plus the events after it, to the state a
    replay from scratch gives, and says so in its log; a snapshot of another chain
    (same node id, another history) is ignored and the whole chain replayed."""
    settings = nodes.settings(fake_llama, fake_model)
    data = Path(settings.data_dir)
    nodes.open(settings).shutdown()
    older = (data / SNAPSHOT_FILE).read_bytes()
    node = nodes.open(settings)
    _place(node, fake_model, 3)
    node.shutdown()
    (data / SNAPSHOT_FILE).write_bytes(older)
    caplog.set_level(logging.INFO, logger="infervisor.actors.node_boot")
    booted = boot_state(settings.chain_path, settings.node_id)
    assert booted.replayed > 0 and booted.snapshot_seq >= 0
    assert booted.state == rebuild_verified(settings.chain_path)
    assert "events after it replayed" in caplog.text
    nodes.open(settings).shutdown()  # and a node runs on it

    other = nodes.settings(fake_llama, fake_model, data_dir=str(tmp_path / "other"))
    nodes.open(other).shutdown()
    shutil.copy(data / SNAPSHOT_FILE, Path(other.data_dir) / SNAPSHOT_FILE)
    caplog.clear()
    booted = boot_state(other.chain_path, other.node_id)
    assert booted.snapshot_seq == -1
    assert booted.state == rebuild_verified(other.chain_path)
    assert "snapshot ignored" in caplog.text and "replaying the whole chain" in caplog.text


def test_a_running_node_snapshots_with_its_checkpoints(
    nodes: NodeFactory, fake_llama: str, fake_model: Path
) -> None:
    """While the node runs, a checkpoint the writer signs brings a snapshot at the
    chain's head (not only at shutdown): a node killed then boots from it."""
    settings = nodes.settings(fake_llama, fake_model, checkpoint_every_events=2)
    data = Path(settings.data_dir)
    node = nodes.open(settings)
    try:
        _place(node, fake_model, 3)  # 3 events: a checkpoint signed
        head = rebuild(settings.chain_path).head_seq

        def snapshot_seq() -> int:
            try:
                return decode_snapshot((data / SNAPSHOT_FILE).read_bytes(), NODE_ID).head_seq
            except (OSError, SnapshotRejected):
                return -1

        wait_until(lambda: snapshot_seq() >= head - 1, 30, "a snapshot near the head")
        taken = decode_snapshot((data / SNAPSHOT_FILE).read_bytes(), NODE_ID)
        assert len(taken.instances) >= 2
    finally:
        node.shutdown()


def test_an_unreadable_snapshot_means_a_full_replay(
    nodes: NodeFactory, fake_llama: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = nodes.settings(fake_llama, tmp_path / "models")
    nodes.open(settings).shutdown()
    (Path(settings.data_dir) / SNAPSHOT_FILE).write_bytes(b"\x00garbage")
    caplog.set_level(logging.INFO, logger="infervisor.actors.node_boot")
    nodes.open(settings).shutdown()
    assert "snapshot ignored (not a snapshot" in caplog.text
    assert boot_state(settings.chain_path, settings.node_id).snapshot_seq >= 0  # rewritten


def test_an_undecodable_event_after_the_snapshot_is_refused_as_before(
    nodes: NodeFactory, fake_llama: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An event after the snapshot that verifies but does not decode: the snapshot
    is set aside, and the whole replay refuses the chain naming the seq and kind,
    as a boot without a snapshot does."""
    settings = nodes.settings(fake_llama, tmp_path / "models")
    nodes.open(settings).shutdown()
    old = encode_payload({"event": "node.started", "v": 0, "pid": 1})  # no upcaster for v0
    with SqliteChain.open(settings.chain_path, NODE_ID) as chain:
        seq = chain.head().seq + 1
        draft = EventDraft(ts_ns=2**62, source="node", kind="node.started", subject="", payload=old)
        chain.append_many([draft])
    caplog.set_level(logging.INFO, logger="infervisor.actors.node_boot")
    with pytest.raises(ChainTampered) as caught:
        nodes.open(settings)
    assert (caught.value.seq, caught.value.reason) == (seq, "undecodable event")
    assert "snapshot ignored" in caplog.text


def test_the_snapshotter_takes_one_per_interval_and_at_stop(tmp_path: Path) -> None:
    path, size = _chain(tmp_path)
    clock = [100.0]
    taker = Snapshotter(path, state_at(path, 3), min_interval_s=5.0, monotonic=lambda: clock[0])
    try:
        assert taker.take()  # from seq 3 to the head
        assert not taker.take()  # nothing new
    finally:
        taker.stop()
    state = decode_snapshot((tmp_path / SNAPSHOT_FILE).read_bytes(), NODE)
    assert state == rebuild(path) and state.head_seq == size - 1


# ------------------------------------------------------------ killed while writing
_WRITER = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from infervisor.actors.snapshots import write_snapshot
    from infervisor.replay import rebuild
    from infervisor.replay.reducer import Folder
    from infervisor.chain import SqliteChain

    data, point = Path(sys.argv[1]), sys.argv[2]
    head = rebuild(data / "chain.db")
    folder = Folder(head.node_id)
    with SqliteChain.open_readonly(data / "chain.db") as chain:
        for stored in chain.events():
            if stored.seq > head.head_seq // 2:
                break
            folder.feed(stored)
    states = [folder.state(), head]
    real_write, real_replace = os.write, os.replace

    def held(where):  # tell the test where this write is, and wait for the kill
        print("at", where, flush=True)
        sys.stdin.readline()

    def half_write(fd, data):
        done = real_write(fd, bytes(data[: len(data) // 2]))
        held("write")
        return done

    def replace_held(src, dst):
        held("replace")
        real_replace(src, dst)

    def replace_then_held(src, dst):
        real_replace(src, dst)
        held("after replace")

    n = 0
    while True:
        print("writing", n, flush=True)
        if n == 1 and point == "write":
            os.write = half_write
        if n == 1 and point == "replace":
            os.replace = replace_held
        if n == 1 and point == "after replace":
            os.replace = replace_then_held
        write_snapshot(data, states[n % 2])
        n += 1
    """
)
#: Where the kill lands: half the bytes written; the file whole, not yet renamed;
#: renamed, the folder not yet fsynced; anywhere (the k-th write of a free run).
_POINTS = ("write", "replace", "after replace", "free", "free", "free")


@pytest.mark.slow
def test_a_kill_while_writing_leaves_a_boot_that_works(
    nodes: NodeFactory, fake_llama: str, fake_model: Path, tmp_path: Path
) -> None:
    """SIGKILL a process writing snapshots, at each step of a write and at random
    ones: the snapshot file is always a whole one (the old or the new), and the node
    boots on it to the state a replay from scratch gives; the temporary file a kill
    left is removed. Counts the kills that left one, and fails if none did."""
    settings = nodes.settings(fake_llama, fake_model)
    data = Path(settings.data_dir)
    node = nodes.open(settings)
    _place(node, fake_model, 40)  # a state of some size
    node.shutdown()
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    rng = random.Random(5)
    used = torn = 0
    for point in _POINTS:
        child = subprocess.Popen(
            [sys.executable, str(script), str(data), point],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdin is not None
        if point == "free":
            for _ in range(rng.randrange(1, 30)):  # kill as the k-th write begins
                assert child.stdout.readline().startswith("writing")
        else:
            line = ""
            while not line.startswith("at"):
                line = child.stdout.readline()
                assert line, "the writer ended"
            assert line.strip() == f"at {point}"
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
        child.stdin.close()
        torn += bool(list(data.glob(f".{SNAPSHOT_FILE}.*")))
        booted = boot_state(settings.chain_path, settings.node_id)
        assert booted.state == rebuild_verified(settings.chain_path), point
        used += booted.snapshot_seq >= 0
        nodes.open(settings).shutdown()
        assert not list(data.glob(f".{SNAPSHOT_FILE}.*")), point  # the leftover removed
    assert used == len(_POINTS), "every kill left a whole snapshot"
    assert torn >= 2, f"only {torn} kills left a half-written temporary file"


def test_write_snapshot_refuses_what_msgpack_cannot_carry(tmp_path: Path) -> None:
    path, size = _chain(tmp_path)
    state = state_at(path, size - 1)
    inst = next(iter(state.instances.values()), None)
    if inst is None:
        pytest.skip("the chain ends with no instance")
    big = msgspec.structs.replace(inst, spec={"n": 2**70})
    odd = msgspec.structs.replace(state, instances={inst.instance_id: big})
    assert not write_snapshot(tmp_path, odd)
    assert not (tmp_path / SNAPSHOT_FILE).exists()


def _replay_imports(name: str, root: Path) -> set[str]:
    """The replay modules `name` imports at module level or below, by its source (ast)."""
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse((root / f"{name}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "infervisor.replay."
        ):
            found.add((node.module or "").split(".")[2])
    return {m for m in found if (root / f"{m}.py").exists()}


def test_the_fingerprint_covers_every_module_the_fold_reads() -> None:
    """A module the reducer or the folder reads (at any depth) is in the fingerprint,
    so a change to any rule of the fold makes older snapshots unusable."""
    from infervisor.replay import snapshot

    root = Path(snapshot.__file__).parent
    todo, seen = ["reducer", "folder"], set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(_replay_imports(name, root))
    missing = seen - set(snapshot._FOLD_MODULES)
    assert not missing, f"fold modules outside the snapshot's fingerprint: {sorted(missing)}"
