"""``infervisor replay``: the node state rebuilt from the chain alone, as of now
or as of a sequence number or a time (``--until``)."""

from __future__ import annotations

from pathlib import Path

import click

from ..clikit.command import Command
from ..clikit.failure import echo_json, fail
from ..node.where import chain_of
from .chain_inputs import first_stamp, stored_extent
from .offline import iso, parse_until, print_marker, read_offline, wrap
from .trust_options import Reading, reading_options

__all__ = ["replay"]


@click.command(cls=Command)
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.option(
    "--until",
    metavar="SEQ|TIME",
    help="The state as of event SEQ, or as of TIME (ISO 8601 / RFC 3339, e.g. "
    "2026-11-01T12:00:00Z; no offset: UTC): replay stops before the first event "
    "stamped later.",
)
@reading_options
@click.option("--json", "as_json", is_flag=True, help="Print the state as JSON.")
def replay(where: Path, until: str | None, reading: Reading, as_json: bool) -> None:
    """Rebuild and print the node state from the chain in WHERE alone.

    WHERE is the chain file, the node's data directory or its config file
    (.toml). One line per instance: id, lifecycle state, wanted state, pid,
    restarts, reason; --json prints the reducer's whole state (every sourced
    field). The chain is verified in the same pass that replays it, and
    against its checkpoints as chain verify does (--checkpoint FILE --key
    PUBKEY rules out truncation up to a checkpoint saved elsewhere): one that
    does not verify is refused (exit 1, naming the sequence number and why)
    unless --unverified, which replays it as stored and marks the output.
    Exit 1 also when an event does not fit (unknown kind, impossible
    transition) or --until names a seq beyond the chain's head or a time
    before its first event (beyond_head), 2 when WHERE cannot be read.
    """
    try:
        upto = None if until is None else parse_until(until)
    except ValueError:
        fail(
            f"--until {until!a} is neither a sequence number (ASCII digits 0-9) nor an "
            "ISO 8601 time (2026-11-01T00:00:00Z)",
            "bad_value",
            "--until",
        )
    db = chain_of(where)
    if upto is not None and upto.seq is not None:
        _within_head(db, upto.seq)  # before the replay: one indexed read, not the chain
    unverified = reading.unverified
    read = read_offline(db, unverified=unverified, until=upto, trust=reading.trust)
    if upto is not None and upto.ts_ns is not None and read.state.head_seq < 0:
        _before_first(db, until or "")
    state = read.state
    if as_json:
        echo_json(wrap(read, state) if unverified else state)
        return
    if unverified:
        print_marker(db, read)
    cut = f" (replayed up to seq {state.head_seq})" if until is not None else ""
    click.echo(
        f"node {state.node_id}: head seq {state.head_seq}, {state.boots} boots, "
        f"{len(state.instances)} instances{cut}"
    )
    for iid, inst in sorted(state.instances.items()):
        pid = inst.process.pid if inst.process else "-"
        click.echo(
            f"  {iid:<32} {inst.lifecycle:<10} wanted {inst.desired:<8} pid {pid!s:<8} "
            f"restarts {inst.restarts}  {one_line(inst.reason)}"
        )


#: Control characters as escapes: a reason comes from the chain, and one holding a
#: newline must not print a line that reads as another instance's.
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(32), 127)}


def one_line(text: str) -> str:
    """``text`` on one line: its control characters escaped (``\\x0a``)."""
    return text.translate(_ESCAPES)


def _within_head(db: Path, seq: int) -> None:
    """Refuse (exit 1, ``beyond_head``, naming ``--until``) a seq beyond the chain's
    head: the state "as of" an event that is not there would be the head's, said as
    if it were seq's (a newcomer's trial, stop 34, read exit 0 and no word).

    Raises:
        Failure: when ``seq`` is beyond the head.
    """
    _, head = stored_extent(db)
    if head is None or seq > head:
        held = f"{db} holds no event" if head is None else f"seq {head} in {db}"
        fail(
            f"--until {seq} is beyond the chain's head ({held}): give a seq up to "
            f"{head or 0}, or a time",
            "beyond_head",
            "--until",
        )


def _before_first(db: Path, until: str) -> None:
    """Refuse (exit 1, ``beyond_head``, naming ``--until``) a time before the chain's
    first event: there is no state as of then, and "head seq -1, 0 boots" read as
    one (a newcomer's trial, stop 34).

    Raises:
        Failure: always.
    """
    first = first_stamp(db)
    held = f"{db} holds no event" if first is None else f"its first event is at {iso(first)}"
    fail(
        f"--until {until!a} is before the chain's first event ({held}): give a time from "
        "then on, or a seq",
        "beyond_head",
        "--until",
    )
