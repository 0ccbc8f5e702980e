"""``infervisor status``: the node's instances, one line each (or one in detail),
from the running node, else replayed from its chain; ``-w`` keeps it live."""

from __future__ import annotations

import contextlib
import datetime as dt
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click

from infervisor.replay.cordon_reason import cordon_in_force, in_force_said
from infervisor.replay.views import InstanceView

from ..api.errors import ApiError, NoAnswer, NodeStarting, NodeStopping, NodeUnavailable, NotRunning
from ..api.exit_codes import Exit
from ..api.wire import NodeInfo
from ..clikit.command import UNVERIFIED_HELP, Command
from ..clikit.failure import echo_json, fail, say_line
from ..clikit.names import chain_roles, resolve
from ..clikit.schemas import InstanceRecord, from_state, from_view
from ..clikit.wanted import wanted
from ..node.where import where
from .node_status import show_node, witness_lines
from .target import Target, api_failure, node_command, running_healthy, view_of

__all__ = ["age", "chain_refusal", "cordon_lines", "residency_lines", "row", "status"]

_COLUMNS = (
    "INSTANCE",
    "FLAVOR",
    "MODE",
    "STATE",
    "WANTED",
    "SINCE",
    "RESTARTS",
    "ENDPOINT",
    "MEM MiB",
)
_MIB = 1024 * 1024


@click.command(cls=Command)
@click.option("--json", "as_json", is_flag=True, help="Print the instances as JSON.")
@click.option("--unverified", is_flag=True, help="From the chain: " + UNVERIFIED_HELP)
@click.option(
    "-w",
    "--watch",
    is_flag=True,
    help="Keep it live: redraw on each chain event and every 2 s (Ctrl-C ends it).",
)
@click.option(
    "--check",
    is_flag=True,
    help="Exit 0 only when INSTANCE is running and healthy, else 1 (3: no node runs; "
    "4: it does not answer), like `systemctl is-active`.",
)
@click.option(
    "--node",
    "node_record",
    is_flag=True,
    help="Show the node itself (cordon, phase, chain head), not its instances; with "
    "--json, one object (schema node).",
)
@node_command("[WHERE] [INSTANCE]", 1)
def status(  # noqa: PLR0917 - one parameter per option, as click passes them
    target: Target, as_json: bool, unverified: bool, watch: bool, check: bool, node_record: bool
) -> None:
    """Show the node's instances (or only INSTANCE): one line each, like `kubectl get`.

    WHERE is the node's data directory, its config file (.toml) or its
    chain file; without it, --url (or INFERVISOR_URL) names the node.
    INSTANCE is an instance id or a role naming one instance. Columns:
    INSTANCE, FLAVOR, MODE, STATE (lifecycle), WANTED (running, stopped; for a
    resting instance on-demand, evicted or expired: why it rests),
    SINCE (how long in that state: 42s, 5m, 3h, 2d), RESTARTS (used/budget),
    ENDPOINT, MEM MiB (reserved by the budget/observed resident). With
    INSTANCE, its details follow (health, pid, reason, last exit, the memory
    limit and OOM kills, the tree's memory and CPU from its cgroup, and how
    the node contains its servers).

    While the node's chain refuses writes (disk full, write lock held
    elsewhere), a warning on stderr says so and since when. A cordoned or
    drained node (`infervisor cordon`, `drain`) says so below the table.

    When no node runs on WHERE, the state is replayed from DATA_DIR/chain.db
    instead, and stderr says so; health and memory are then unknown. The
    chain is verified in the same pass, and against its stored checkpoints
    (and a config's witnesses) as `replay` does: one that fails is refused
    (exit 1) unless --unverified (output marked). --json prints the same
    objects either way (docs/cli.md, schema "instance"), with "source":
    "node" or "chain"; what only the node knows is null from the chain.

    -w/--watch redraws the table on each chain event and at least every 2 s:
    on a terminal the screen is cleared first; in a pipe each table follows
    a blank line (each --json answer is one line). Ctrl-C ends it (exit 0).

    --check is for scripts: INSTANCE's line (or JSON) as above, then exit 0
    only when the node has it running and its last probe did not fail, 1
    otherwise, 3 when no node runs, 4 when it does not answer (no chain read).

    --node shows the node instead of its instances: whether it takes
    placements (cordon: none, cordoned, drained; and its reason), its phase
    and its chain's head, from the node or else its chain. With --json it
    is one object (docs/cli.md, schema "node": "cordon", "cordon_reason",
    "takes_placements", ...); --json without --node stays the instances.

    Exit 0; 1 when INSTANCE is not placed (the message names those that are);
    2 when WHERE names nothing, no running node and no chain (no_chain); 3
    when no node listens at --url, or WHERE's is still opening its chain; 4
    when the node is there but does not answer within --timeout.
    """
    instance = target.rest[0] if target.rest else None
    if node_record:
        if instance is not None or watch or check:
            fail("--node shows the node: not with INSTANCE, --watch or --check", "usage", "--node")
        show_node(target, as_json, unverified)
        return
    if check and (instance is None or watch):
        fail("--check needs INSTANCE, and not --watch", "usage", "--check")
    if not watch:
        _show_status(target, instance, as_json, unverified, compact=False, check=check)
        return
    _watch_status(target, instance, as_json, unverified)


def _show_status(
    target: Target,
    instance: str | None,
    as_json: bool,
    unverified: bool,
    *,
    compact: bool,
    check: bool = False,
) -> None:
    """Print the status once (``compact``: a --json answer on one line); with
    ``check``, exit 1 unless INSTANCE runs healthy (3 without a node)."""
    try:
        with target.client() as client:
            views = [view_of(client, instance)] if instance else client.list()
            info = client.node()
            refusal = chain_refusal(info)
    except NoAnswer as e:  # a node holds the data directory: its chain is not the answer
        api_failure(e)
    except NodeUnavailable as e:
        if target.where is None or check:
            api_failure(e)
        _status_from_chain(target.where, instance, as_json, e, unverified=unverified)
        return
    except ApiError as e:
        api_failure(e)
    if refusal is not None:
        click.echo(f"warning: {refusal}", err=True)
    if as_json:
        records = [from_view(v) for v in views]
        answer: Any = records[0] if instance else records
        say_line(answer) if compact else echo_json(answer)
    else:
        _print_table_and_details(target, views, info, instance)
    if check and not running_healthy(views[0]):
        sys.exit(Exit.REFUSED)


def _print_table_and_details(
    target: Target, views: list[InstanceView], info: NodeInfo, instance: str | None
) -> None:
    records = [from_view(v) for v in views]
    _print_table([row(r) for r in records])
    for line in [
        *residency_lines(records),
        *cordon_lines(info.cordon, info.cordon_reason, info.cordon_since_ns),
        *witness_lines(info.witnesses, info.witness_quorum),
    ]:
        click.echo(line)
    if instance:
        _print_details(views[0])
        with contextlib.suppress(ApiError, NodeUnavailable), target.client() as client:
            node = client.node()
            click.echo(f"  contained  {node.containment}: {node.containment_reason}")


def residency_lines(records: list[InstanceRecord], now_ns: int | None = None) -> list[str]:
    """One line per instance under a residency policy (issue 21): resting or
    serving, busy or idle for how long, its last use, pinned, priority, idle ttl.
    Instances with none of it (no policy, not resting, not serving) get no line:
    every start is a use, so a last use alone says nothing an operator asked for."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    lines = []
    for r in records:
        policy = r.on_demand or r.pinned or r.priority or r.idle_ttl_s is not None
        if not (policy or r.resting or r.busy):
            continue
        parts = [_use_of(r, now_ns)]
        if r.last_use_ns is not None:
            parts.append(f"last use {age((now_ns - r.last_use_ns) / 1e9)} ago")
        if r.pinned:
            parts.append("pinned")
        if r.priority is not None:
            parts.append(f"priority {r.priority}")
        if r.idle_ttl_s is not None:
            parts.append(f"idle ttl {r.idle_ttl_s:g}s")
        if r.on_demand:
            parts.append("on demand")
        lines.append(f"residency: {r.instance_id} " + ", ".join(parts))
    return lines


def _use_of(r: InstanceRecord, now_ns: int) -> str:
    """``resting (evicted for B)``, ``busy``, ``idle for 5m`` (since its last use,
    else since it entered its state), or the lifecycle state."""
    if r.resting:
        return f"resting ({r.rest_reason})" if r.rest_reason else "resting"
    if r.busy:
        return "busy"
    if r.lifecycle != "running":
        return r.lifecycle
    since = r.last_use_ns if r.last_use_ns is not None else r.since_ns
    return f"idle for {age((now_ns - since) / 1e9)}" if r.busy is not None else "running"


def cordon_lines(cordon: str, reason: str | None = None, since_ns: int | None = None) -> list[str]:
    """``node: cordoned since T, because: R: ...`` or ``node: drained ...`` ([] while
    it takes placements): the node's cordon as it answers it, or as replayed from
    its chain, with since when (its event's time) and why."""
    said = in_force_said(reason, since_ns)
    if cordon == "cordoned":
        return [f"node: cordoned{said}: no new placements (`infervisor uncordon` ends it)"]
    if cordon == "drained":
        return [
            f"node: drained{said}: no new placements, its controllers' instances stay "
            "stopped (`infervisor uncordon` ends it)"
        ]
    return []


def chain_refusal(info: NodeInfo) -> str | None:
    """What to warn of while the node's chain refuses writes (None while it takes them)."""
    if info.chain_writable:
        return None
    since = ""
    if info.chain_failing_since_ns is not None:
        at = dt.datetime.fromtimestamp(info.chain_failing_since_ns / 1e9, dt.UTC)
        since = f" since {at.isoformat(timespec='seconds')}"
    return (
        f"the node's chain refuses writes{since} ({info.chain_error}): observations wait, "
        "in order, and verbs are refused until it takes them again (free disk space, or "
        "end what holds chain.db's write lock)"
    )


def _watch_status(target: Target, instance: str | None, as_json: bool, unverified: bool) -> None:
    """Redraw on each chain event (the watch stream, on a thread) and every 2 s."""
    terminal = sys.stdout.isatty() and not as_json
    wake: queue.SimpleQueue[int] = queue.SimpleQueue()

    def listen() -> None:
        with contextlib.suppress(Exception), target.client() as client:
            for event in client.events(None):
                wake.put(event.seq)

    listener: threading.Thread | None = None
    first = True
    try:
        while True:
            if listener is None or not listener.is_alive():
                listener = threading.Thread(target=listen, name="status-watch", daemon=True)
                listener.start()
            if terminal:
                click.echo("\x1b[H\x1b[2J", nl=False)
            elif not first and not as_json:
                click.echo("")
            _show_status(target, instance, as_json, unverified, compact=True)
            sys.stdout.flush()
            first = False
            with contextlib.suppress(queue.Empty):
                wake.get(timeout=_REDRAW_S)
                while True:  # one redraw for a burst of events
                    wake.get_nowait()
    except KeyboardInterrupt:
        sys.exit(0)


_REDRAW_S = 2.0


def _status_from_chain(
    given: Path,
    instance: str | None,
    as_json: bool,
    why: NodeUnavailable,
    *,
    unverified: bool = False,
) -> None:
    """The instances replayed from WHERE's chain (`given` as the operator gave it),
    verified and judged against its checkpoints (and a config's witnesses) as
    ``replay`` judges it: refused unless ``unverified``."""
    folder, db = where(given)
    if not db.is_file():
        if not isinstance(why, NotRunning):
            api_failure(why)  # a new node still opening: no chain yet
        fail(  # a WHERE that names no node and no chain: a usage error, as chain_of's
            f"no node is running on {folder}, and it holds no chain ({db}): give a node's "
            "data directory, its config file (.toml) or its chain file",
            "no_chain",
            "WHERE",
        )
    # Imported here: verifying a chain loads its trust checks (checkpoints, notes).
    from ..audit.offline import print_marker, read_offline, wrap  # noqa: PLC0415
    from ..audit.trust_options import TrustArgs  # noqa: PLC0415

    read = read_offline(db, unverified=unverified, trust=TrustArgs(given))
    state = read.state
    click.echo(f"{_unavailable(why)}; state replayed from the chain", err=True)
    records = [from_state(inst) for _, inst in sorted(state.instances.items())]
    if instance:
        iid = resolve(instance, chain_roles(state), f"in {db}")
        records = [r for r in records if r.instance_id == iid]
    answer: Any = records[0] if instance else records
    if as_json:
        echo_json(wrap(read, answer) if unverified else answer)
        return
    if unverified:
        print_marker(db, read)
    _print_table([row(r) for r in records])
    now = None if state.cordon == "none" else cordon_in_force(db, state.head_seq)
    said = (None, None) if now is None else (now.reason, now.since_ns)
    for line in [*residency_lines(records), *cordon_lines(str(state.cordon), *said)]:
        click.echo(line)


_UNAVAILABLE: dict[type[NodeUnavailable], str] = {
    NotRunning: "no node running",
    NodeStarting: "node starting",
    NodeStopping: "node stopping",
}


def _unavailable(why: NodeUnavailable) -> str:
    return _UNAVAILABLE.get(type(why), str(why))


def age(seconds: float) -> str:
    """A duration as `kubectl get` shows ages: 42s, 5m, 3h, 2d (rounded down)."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def row(r: InstanceRecord, now_ns: int | None = None) -> tuple[str, ...]:
    now_ns = time.time_ns() if now_ns is None else now_ns
    offline = r.source == "chain"
    memory = f"{_mib(r.reserved_bytes)}/{'?' if offline else _mib(r.rss_bytes)}"
    budget = "-" if r.max_restarts is None else str(r.max_restarts)
    since = age((now_ns - r.since_ns) / 1e9) if r.since_ns else "-"
    return (
        r.instance_id,
        r.flavor or "?",
        r.mode or "?",
        r.lifecycle,
        wanted(r),
        since,
        f"{r.restarts}/{budget}",
        r.endpoint or "-",
        memory,
    )


def _mib(size: int | None) -> str:
    """Bytes as MiB: one decimal below 10 MiB (0.5 MiB is not 0), whole above."""
    if size is None:
        return "-"
    mib = size / _MIB
    return f"{mib:.1f}" if 0 < mib < 10 else f"{mib:.0f}"


def _print_table(rows: list[tuple[str, ...]]) -> None:
    lines = [_COLUMNS, *rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(_COLUMNS) - 1)]
    for line in lines:
        cells = [cell.ljust(width) for cell, width in zip(line, widths, strict=False)]
        click.echo("  ".join([*cells, line[-1]]).rstrip())


def _print_details(v: InstanceView) -> None:
    click.echo(f"\n  endpoint   {v.endpoint} ({v.exposure})")
    click.echo(f"  model      {v.model or '-'}")
    click.echo(f"  pid        {v.pid if v.pid is not None else '-'}")
    click.echo(f"  reason     {v.reason or '-'}")
    click.echo(f"  status     {v.status or '-'}{f': {v.status_detail}' if v.status_detail else ''}")
    health = v.health or "unknown"
    click.echo(f"  health     {health}{f': {v.health_reason}' if v.health_reason else ''}")
    if v.probe_latency_s is not None:
        click.echo(f"  probe      {v.probe_latency_s * 1000:.0f} ms, {v.misses} missed in a row")
    if v.last_exit is not None:
        e = v.last_exit
        how = f"signal {e.signal}" if e.signal is not None else f"exit code {e.exit_code}"
        pid = f"pid {e.pid}, " if e.pid is not None else ""
        click.echo(f"  last exit  {pid}{how}: {e.reason}")
    _print_accounting(v)


def _print_accounting(v: InstanceView) -> None:
    """The memory limit, OOM kills, and the tree's memory and CPU from its cgroup."""
    if v.memory_max_bytes is not None or v.oom_kills:
        limit = f"{v.memory_max_bytes} bytes" if v.memory_max_bytes is not None else "none"
        click.echo(f"  mem limit  {limit}, {v.oom_kills} OOM kill(s)")
    if v.cgroup_memory_bytes is not None or v.cpu_seconds is not None:
        mem = f"{v.cgroup_memory_bytes / 2**20:.1f} MiB" if v.cgroup_memory_bytes else "-"
        cpu = f"{v.cpu_seconds:.2f} s CPU" if v.cpu_seconds is not None else "- CPU"
        click.echo(f"  cgroup     {mem}, {cpu} (the whole process tree)")
