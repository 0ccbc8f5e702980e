"""``infervisor timeline``: one instance's events from the chain, one line each,
with the lifecycle state before and after (replay/timeline.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click

from infervisor.replay import EventDecodeError, ReplayError, TimelineEntry, timeline_of

from ..clikit.command import Command
from ..clikit.failure import echo_json, fail
from ..clikit.names import chain_roles, resolve
from ..clikit.schemas import from_timeline
from ..node.where import chain_of
from .offline import every_role, print_marker, read_offline, wrap
from .trust_options import Reading, reading_options

__all__ = ["print_timeline", "timeline"]


@click.command("timeline", cls=Command)
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.argument("instance")
@reading_options
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON.")
def timeline(where: Path, instance: str, reading: Reading, as_json: bool) -> None:
    """Print INSTANCE's events from the chain in WHERE, one line each.

    WHERE is the chain file, the node's data directory or its config file
    (.toml); INSTANCE an instance id, or a role naming one instance. Columns:
    seq, time (UTC), lifecycle state before -> after, reason. The chain is
    verified in the same pass, and against its checkpoints as chain verify
    does (--checkpoint FILE --key PUBKEY rules out truncation up to a
    checkpoint saved elsewhere): one that does not verify is refused (exit 1)
    unless --unverified (output marked). Exit 1 naming the chain's instances
    when INSTANCE names none of them.
    """
    db = chain_of(where)
    unverified = reading.unverified
    read = read_offline(db, unverified=unverified, keep_events=True, trust=reading.trust)
    # Unloaded instances too: their history stays in the chain.
    iid = resolve(instance, every_role(read, chain_roles(read.state)), f"in {db}")
    try:
        entries = timeline_of(read.by_subject.get(iid, []))
    except (EventDecodeError, ReplayError) as e:
        fail(f"{db} cannot be replayed: {e}", "chain_unreplayable")
    if as_json:
        records = [from_timeline(e) for e in entries]
        echo_json(wrap(read, records) if unverified else records)
        return
    if unverified:
        print_marker(db, read)
    print_timeline(entries)


def print_timeline(entries: list[TimelineEntry]) -> None:
    """One line per entry: seq, time (UTC, milliseconds), state before -> after, reason."""
    for e in entries:
        when = dt.datetime.fromtimestamp(e.ts_ns / 1e9, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
        when = when[:-3] + "Z"
        click.echo(f"  {e.seq:>5} {when} {e.frm:>10} -> {e.to:<10} {e.reason}")
