"""``infervisor status --node``: the node itself rather than its instances: whether
it takes placements (cordon, drain), its phase and its chain's head; from the
running node (``GET /v1/node``), else replayed from its chain.

``status --json`` stays the list of instances scripts read; the node's record is
one object of its own (docs/cli.md, schema ``node``), with the same keys whether
the node answered (``"source": "node"``) or its chain did (``"source": "chain"``:
what only a running node knows is null).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click

from infervisor.replay import NodeState
from infervisor.replay.cordon_reason import cordon_in_force, in_force_said

from ..api.errors import ApiError, NoAnswer, NodeUnavailable, NotRunning
from ..api.wire import NodeInfo, WitnessInfo
from ..clikit.failure import echo_json, fail
from ..clikit.node_schema import NodeRecord
from ..node.where import where
from .target import Target, api_failure

__all__ = ["show_node", "witness_lines"]

_TAKES = {
    "none": "takes placements",
    "cordoned": "cordoned: no new placements (`infervisor uncordon` ends it)",
    "drained": "drained: no new placements, its controllers' instances stay stopped "
    "(`infervisor uncordon` ends it)",
}


def show_node(target: Target, as_json: bool, unverified: bool) -> None:
    """Print the node's record: a line or two, or one JSON object (``--json``).

    Exits 3 (``api_failure``) when no node listens at --url, 4 when the node is
    there and does not answer, 2 (``no_chain``) when none runs on WHERE and no
    chain is there to read."""
    try:
        with target.client() as client:
            record = _of_node(client.node())
    except NoAnswer as e:
        api_failure(e)
    except NodeUnavailable as e:
        if target.where is None:
            api_failure(e)
        _from_chain(target.where, e, as_json=as_json, unverified=unverified)
        return
    except ApiError as e:
        api_failure(e)
    if as_json:
        echo_json(record)
        return
    _say(record)


def _say(record: NodeRecord) -> None:
    phase = record.phase or "not running"
    version = f" (infervisor {record.version})" if record.version else ""
    click.echo(f"node {record.node_id}{version}: {phase}; {_TAKES.get(record.cordon, '?')}")
    if record.cordon != "none":
        said = in_force_said(record.cordon_reason, record.cordon_since_ns)
        click.echo(f"{record.cordon}{said}" if said else f"{record.cordon}: no reason recorded")
    head = f"head seq {record.head_seq} {record.head_hash}"
    click.echo(f"chain: {head}, {record.instances} instances")
    for line in witness_lines(record.witnesses, record.witness_quorum):
        click.echo(line)
    if record.chain_writable is False:
        click.echo(f"warning: the chain refuses writes: {record.chain_error}", err=True)


def _of_node(info: NodeInfo) -> NodeRecord:
    return NodeRecord(
        source="node",
        node_id=info.node_id,
        version=info.version,
        phase=info.phase,
        cordon=info.cordon,
        cordon_reason=info.cordon_reason,
        cordon_since_ns=info.cordon_since_ns,
        takes_placements=info.cordon == "none",
        head_seq=info.head_seq,
        head_hash=info.head_hash,
        instances=info.instances,
        chain_writable=info.chain_writable,
        chain_error=info.chain_error,
        witnesses=info.witnesses,
        witness_quorum=info.witness_quorum,
    )


def _from_chain(given: Path, why: NodeUnavailable, *, as_json: bool, unverified: bool) -> None:
    """The record replayed from WHERE's chain (`given` as the operator gave it;
    verified and judged against its checkpoints unless ``unverified``, as
    ``status`` and ``replay``), printed as :func:`show_node` prints the node's."""
    folder, db = where(given)
    if not db.is_file():
        if not isinstance(why, NotRunning):
            api_failure(why)  # a new node still opening: no chain yet
        fail(  # a WHERE that names no node and no chain: a usage error, as `status`'s
            f"no node is running on {folder}, and it holds no chain ({db})", "no_chain", "WHERE"
        )
    # Imported here: verifying a chain loads its trust checks (checkpoints, notes).
    from ..audit.offline import print_marker, read_offline, wrap  # noqa: PLC0415
    from ..audit.trust_options import TrustArgs  # noqa: PLC0415

    read = read_offline(db, unverified=unverified, trust=TrustArgs(given))
    click.echo("no node answers; its record replayed from the chain", err=True)
    record = _of_state(read.state, db)
    if as_json:
        echo_json(wrap(read, record) if unverified else record)
        return
    if unverified:
        print_marker(db, read)
    _say(record)


def _of_state(state: NodeState, db: Path) -> NodeRecord:
    """The record of the replayed state; the cordon's reason read from the same
    chain, no later than the state's head (what verified, unless --unverified)."""
    now = None if state.cordon == "none" else cordon_in_force(db, state.head_seq)
    return NodeRecord(
        source="chain",
        node_id=state.node_id,
        version=None,
        phase=None,
        cordon=str(state.cordon),
        cordon_reason=None if now is None else now.reason,
        cordon_since_ns=None if now is None else now.since_ns,
        takes_placements=state.cordon == "none",
        head_seq=state.head_seq,
        head_hash=state.head_hash,
        instances=len(state.instances),
        chain_writable=None,
        chain_error=None,
        witnesses=None,
        witness_quorum=None,
    )


def witness_lines(witnesses: list[WitnessInfo] | None, quorum: int | None) -> list[str]:
    """A summary against the quorum, then ``witness NAME: cosigned size N, M events
    behind; last success ...; last error ...`` per witness ([] without witnesses, or
    None: not known, read from the chain); ``quorum`` None: all of them."""
    if not witnesses:
        return []
    current = sum(1 for w in witnesses if w.behind_events == 0 and w.cosigned_size > 0)
    quorum = quorum or len(witnesses)
    met = "met" if current >= quorum else "not met"
    lines = [
        f"witnesses: {current} of {len(witnesses)} cosigned the latest checkpoint "
        f"(quorum {quorum}: {met})"
    ]
    for w in witnesses:
        success = "never (this run)"
        if w.last_success_ns is not None:
            at = dt.datetime.fromtimestamp(w.last_success_ns / 1e9, dt.UTC)
            success = at.isoformat(timespec="seconds")
        error = f"; last error: {w.last_error}" if w.last_error else ""
        lines.append(
            f"witness {w.witness}: cosigned size {w.cosigned_size}, {w.behind_events} events "
            f"behind; last success {success}{error}"
        )
    return lines
