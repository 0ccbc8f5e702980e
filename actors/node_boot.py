"""The node's actors: how they are started, the chain replayed and checked for
them, instances the chain does not have ended, and how they are stopped.

:class:`~.node.Node` opens and shuts down through these; nothing here takes a
verb.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pykka

from infervisor.adapters.prober import HttpProber, Prober
from infervisor.adapters.proc.containment import Containment, detect, no_containment
from infervisor.adapters.proc.errors import AdapterError
from infervisor.adapters.registry import ModelRegistry
from infervisor.chain import SqliteChain, StoredEvent
from infervisor.chain.checkpoint_store import read_stored
from infervisor.chain.errors import ChainTampered
from infervisor.replay import EventDecodeError, NodeState, ReplayError, fold
from infervisor.replay import events as ev
from infervisor.replay.callers import Role
from infervisor.replay.queries import read_chain
from infervisor.replay.snapshot import SnapshotRejected, decode_snapshot, resume_chain
from infervisor.replay.state import LeaseRecord, RunClock

from . import messages as m
from .append import WriterAppend
from .append_health import AppendHealth
from .chain_writer import ChainWriter, CommitLatency
from .clock import Clock
from .context import InstanceContext
from .host import HostActor
from .ledger import LedgerActor
from .probe_loop import Gates
from .room_asks import RoomAsks
from .routes import Routes
from .settings import NodeSettings
from .snapshots import Snapshotter, read_snapshot_file
from .supervisor import SupervisorActor
from .view_board import ViewBoard
from .watchdog import Watchdog, stall_after
from .witness_submit import WitnessTarget
from .witnessing import Witnessing

__all__ = [
    "ASK_TIMEOUT_S",
    "BootState",
    "NodeActors",
    "append_node_event",
    "boot_state",
    "end_unknown",
    "rebuild",
    "rebuild_verified",
    "start_actors",
    "stop_actors",
]

log = logging.getLogger(__name__)
#: Health probes of all instances share these threads (one per instance cost twice
#: the CPU per probe at 300 instances: bench/supervision_cost.py).
PROBE_WORKERS = 8
#: The longest the node waits for one answer of one of its actors, seconds.
ASK_TIMEOUT_S = 60.0
#: A boot that replayed more events than this takes a snapshot at once (so the
#: next boot after a crash need not replay them again).
SNAPSHOT_AFTER_REPLAYING = 1000


@dataclass(frozen=True)
class NodeActors:
    """The node-wide actors (the ledger only when the node has a memory budget)
    and the routes the host publishes."""

    writer: pykka.ActorRef[Any]
    supervisor: pykka.ActorRef[Any]
    host: pykka.ActorRef[Any]
    ledger: pykka.ActorRef[Any] | None = None
    probes: ThreadPoolExecutor | None = None
    routes: Routes = field(default_factory=Routes)
    watchdog: Watchdog | None = None
    engine: Prober | None = None
    #: The chain writer's commit latency histogram (shared with it by reference).
    commit_latency: CommitLatency | None = None
    #: Whether the chain takes appends (the writer reports, anyone reads).
    append_health: AppendHealth | None = None
    #: How this node contains its managed servers (cgroups or process groups).
    containment: Containment = field(default_factory=no_containment)
    #: The witness submitters and their lag board (None: no witnesses configured).
    witnessing: Witnessing | None = None
    #: Takes the snapshots of the projection (None: not given the booted state).
    snapshotter: Snapshotter | None = None
    #: The starts the node decided itself that wait for room (the node attaches).
    rooms: RoomAsks = field(default_factory=RoomAsks)
    #: Each instance's posted view, read by ``list`` without asking the actors.
    views: ViewBoard = field(default_factory=ViewBoard)


def start_actors(
    settings: NodeSettings,
    clock: Clock,
    on_event: Callable[[StoredEvent], None] | None,
    leases: Mapping[str, LeaseRecord] | None = None,
    prober: Prober | None = None,
    *,
    witnesses: Sequence[WitnessTarget] = (),
    run: RunClock | None = None,
    startup_s: float = 0.0,
    booted: BootState | None = None,
) -> NodeActors:
    """Start the node-wide actors on ``settings``: the chain writer, the ledger (with
    a memory budget), the supervisor (``leases``: each controller's last renewal in
    the chain; ``run``: how long the node ran, ``NodeState.run``; ``startup_s``: the
    seconds the node spent starting, excused from the leases), the host, the
    watchdog over them, the probe threads and, with ``witnesses``, a submitter per
    witness (fed each checkpoint by the writer); the containment detected. With
    ``booted`` (the state the boot rebuilt), a snapshotter fed each checkpoint."""
    commit_latency = CommitLatency()
    append_health = AppendHealth()
    witnessing = _witnessing(settings, clock, witnesses)
    snapshotter = _snapshotter(settings, booted)
    writer = _writer(
        settings, on_event, commit_latency, append_health, _checkpoint_hook(witnessing, snapshotter)
    )
    ledger = _ledger(settings)
    probes = ThreadPoolExecutor(max_workers=PROBE_WORKERS, thread_name_prefix="probe")
    engine = prober or HttpProber()
    relay = _GoneRelay()
    rooms = RoomAsks()
    containment = detect(settings.containment, settings.node_id, settings.data_dir)
    log.info("containment: %s (%s)", containment.mode, containment.reason)
    gates, views = Gates(), ViewBoard()
    ctx = InstanceContext(
        settings.node_id, WriterAppend(writer, clock), clock, settings, ledger, probes, engine,
        gone=relay.tell, containment=containment, gates=gates, room=rooms.ask, views=views,
    )  # fmt: skip
    watchdog = Watchdog(clock, stall_after(settings.tick_s))
    clock.on_error = watchdog.clock_error
    supervisor = SupervisorActor.start(
        clock, settings.tick_s, settings.reconcile_interval_s, settings.lease_s,
        writer=writer, leases=leases, run=run, watchdog=watchdog, startup_s=startup_s,
        gates=gates,
    )  # fmt: skip
    routes = Routes()
    host = HostActor.start(ctx, ModelRegistry(settings.registry_path), supervisor, routes)
    relay.host = host
    supervisor.tell(m.WatchedBy(host=host))
    watchdog.start({"supervisor": supervisor, "host": host, "chain writer": writer})
    return NodeActors(
        writer, supervisor, host, ledger, probes, routes, watchdog, engine, commit_latency,
        append_health, containment, witnessing, snapshotter, rooms=rooms, views=views,
    )  # fmt: skip


def _writer(
    settings: NodeSettings,
    on_event: Callable[[StoredEvent], None] | None,
    latency: CommitLatency,
    health: AppendHealth,
    on_checkpoint: Callable[[Any], None] | None,
) -> pykka.ActorRef[ChainWriter]:
    """The chain writer of ``settings``' chain, checkpointing as they say."""
    return ChainWriter.start(
        settings.chain_path,
        settings.node_id,
        on_event,
        checkpoint_every_events=settings.checkpoint_every_events,
        checkpoint_every_s=settings.checkpoint_every_s,
        latency=latency,
        health=health,
        on_checkpoint=on_checkpoint,
        origin=settings.origin,
    )


def _snapshotter(settings: NodeSettings, booted: BootState | None) -> Snapshotter | None:
    """The snapshotter of the state the boot rebuilt (None: not given it); it takes
    one at once when the boot replayed more than :data:`SNAPSHOT_AFTER_REPLAYING`."""
    if booted is None:
        return None
    take_now = booted.replayed > SNAPSHOT_AFTER_REPLAYING
    return Snapshotter(settings.chain_path, booted.state, take_now=take_now)


def _ledger(settings: NodeSettings) -> pykka.ActorRef[Any] | None:
    """The ledger actor of the node's memory budget (None: the node has none)."""
    if settings.memory_budget_bytes is None:
        return None
    return LedgerActor.start(settings.memory_budget_bytes, settings.reserve_overhead_bytes)


def _checkpoint_hook(
    witnessing: Witnessing | None, snapshotter: Snapshotter | None
) -> Callable[[Any], None] | None:
    """What the writer calls with each checkpoint it signs (never blocks): the
    witnesses' submitters and the snapshotter."""
    hooks = [h.offer for h in (witnessing, snapshotter) if h is not None]
    if not hooks:
        return None
    if len(hooks) == 1:
        return hooks[0]

    def offer(checkpoint: Any) -> None:
        for hook in hooks:
            hook(checkpoint)

    return offer


def _witnessing(
    settings: NodeSettings, clock: Clock, witnesses: Sequence[WitnessTarget]
) -> Witnessing | None:
    """The witness submitters, each told first of the newest stored checkpoint."""
    if not witnesses:
        return None
    stored = read_stored(settings.chain_path)
    latest = (stored[-1].tree_size, stored[-1].note) if stored else None
    return Witnessing(witnesses, settings.chain_path, clock, latest)


class _GoneRelay:
    """Tells the host an instance unloaded itself (the host starts after the
    context its instances share, so the context holds this, not the host)."""

    def __init__(self) -> None:
        self.host: pykka.ActorRef[Any] | None = None

    def tell(self, iid: str) -> None:
        if self.host is not None:
            with contextlib.suppress(pykka.ActorDeadError):
                self.host.tell(m.InstanceGone(instance_id=iid))


def end_unknown(actors: NodeActors, clock: Clock, known: set[str]) -> None:
    """Kill and remove the cgroups of instances the chain does not have (one
    unloaded while its last node died, say): nothing runs unrecorded. What is
    killed is recorded first (``node.strays_ended``: the chain has no instance
    to record it on); an empty cgroup is only removed."""
    for iid in actors.containment.instances():
        cgroup = actors.containment.cgroup(iid)
        if iid in known or cgroup is None:
            continue
        if left := sorted(cgroup.members()):
            found = ev.NodeStraysEnded(instance_id=iid, pids=left, cgroup=cgroup.tree)
            append_node_event(actors.writer, clock, found)
        try:
            cgroup.kill(everything=True)
        except AdapterError as e:
            log.error("the cgroup of unknown instance %s could not be emptied: %s", iid, e)  # noqa: TRY400
            continue
        cgroup.remove()


def stop_actors(actors: NodeActors) -> None:
    """Stop the node-wide actors in dependency order: the watchdog and ticks
    first, the writer last."""
    actors.rooms.close()
    if actors.watchdog is not None:
        actors.watchdog.stop()
    actors.supervisor.stop()
    actors.host.stop()
    if actors.ledger is not None:
        actors.ledger.stop()
    actors.writer.stop()
    if actors.snapshotter is not None:
        actors.snapshotter.stop()  # a last snapshot, at the head the writer left
    if actors.witnessing is not None:
        actors.witnessing.stop()
    actors.containment.remove_empty()  # the cgroups of servers that ended
    if actors.probes is not None:
        actors.probes.shutdown(wait=False, cancel_futures=True)
    if actors.engine is not None:
        actors.engine.close()


class BootState(NamedTuple):
    """The state a boot rebuilt, and how.

    Attributes:
        state: the node state at the chain's head.
        replayed: events folded (all of them without a usable snapshot).
        snapshot_seq: the seq the snapshot used covers (-1: none used).
    """

    state: NodeState
    replayed: int
    snapshot_seq: int = -1


def boot_state(path: Path, node_id: str) -> BootState:
    """The node state at the head of the chain at `path`: its snapshot (beside it,
    replay/snapshot.py) with the events after it verified and folded, or, without
    a usable one, the whole chain replayed and verified (:func:`rebuild_verified`;
    the node log says why). Run it after the boot check (chain/boot.py).

    Raises:
        ChainTampered: an event after the snapshot fails verification; or as
            :func:`rebuild_verified` when the whole chain is replayed.
    """
    data = read_snapshot_file(path.parent)
    if data is None:
        log.info("no snapshot of the node state: replaying the whole chain")
    else:
        try:
            state, replayed = resume_chain(path, decode_snapshot(data, node_id))
        except SnapshotRejected as e:
            log.warning("snapshot ignored (%s): replaying the whole chain", e.reason)
        except (ReplayError, EventDecodeError) as e:
            log.warning("snapshot ignored (the events after it do not fold onto it: %s): "
                        "replaying the whole chain", e)  # fmt: skip
        else:
            log.info("state from the snapshot at seq %d, %d events after it replayed",
                     state.head_seq - replayed, replayed)  # fmt: skip
            return BootState(state, replayed, state.head_seq - replayed)
    state = rebuild_verified(path)
    return BootState(state, state.head_seq + 1)


def rebuild_verified(path: Path) -> NodeState:
    """The node state replayed from the chain, each event verified in the same pass.

    Raises:
        ChainTampered: an event that does not verify (a payload altered in place
            below the last checkpoint, which the checkpoint check does not read),
            or one that verifies but cannot be decoded or applied (reason
            "undecodable event" / "unreplayable event", naming the seq and kind):
            a one-line refusal at boot, never a traceback.
    """
    try:
        read = read_chain(path)
    except EventDecodeError as e:
        seq = -1 if e.seq is None else e.seq
        detail = f"{e.kind or 'an event'} verifies but cannot be decoded ({e})"
        raise ChainTampered(str(path), seq, "undecodable event", detail) from e
    except ReplayError as e:
        raise ChainTampered(str(path), _seq_of(str(e)), "unreplayable event", str(e)) from e
    problem = read.report.problem
    if problem is not None:
        raise ChainTampered(str(path), problem.seq, problem.reason, problem.detail)
    return read.state


def _seq_of(message: str) -> int:
    """The seq a replay error's message starts with ("seq N ..."), else -1."""
    words = message.split()
    if len(words) > 1 and words[0] == "seq" and words[1].rstrip(":,").isdigit():
        return int(words[1].rstrip(":,"))
    return -1


def rebuild(path: Path) -> NodeState:
    """The node state replayed from the chain file alone."""
    with SqliteChain.open_readonly(path) as chain:
        return fold(chain.node_id, chain.events())


def append_node_event(writer: pykka.ActorRef[Any], clock: Clock, event: ev.Event) -> None:
    """Append a node-wide event (source ``node``, no subject) and wait until it is durable."""
    WriterAppend(writer, clock).append([event], source=Role.NODE)
