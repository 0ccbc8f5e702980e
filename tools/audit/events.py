"""``infervisor events``: the chain's events, filtered, as a table, JSON Lines or CSV.

The chain is read offline and verified in the same pass (:mod:`.offline`);
instance events carry the lifecycle state before and after, as the timeline
replays them. docs/forensics.md shows the same rows through SQL.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import NamedTuple

import click
import msgspec

from infervisor.chain import GENESIS_KIND, StoredEvent
from infervisor.replay import (
    ChainRead,
    EventDecodeError,
    ReplayError,
    TimelineEntry,
    reason_of,
    timeline_of,
)
from infervisor.replay import events as ev
from infervisor.replay.callers import parse_source

from ..clikit.command import Command
from ..clikit.failure import Failure, fail
from ..clikit.names import chain_roles, resolve
from ..node.where import chain_of
from .offline import TIME, every_role, iso, print_marker, read_offline
from .trust_options import Reading, reading_options

__all__ = ["EventRow", "events"]


@click.command("events", cls=Command)
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.option("--instance", help="Only this instance (its id, or a role naming one).")
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    help="Only events of this kind (instance.exited, or just exited), or of every kind "
    "under a prefix ending in .* ('residency.*': residency.demanded, residency.evicted, "
    "...); repeatable.",
)
@click.option(
    "--source",
    help="Only events with this source, this role (operator, supervisor, ...), or this "
    "controller (controller:ctl1, lease:ctl1).",
)
@click.option("--since", type=TIME, help="Only events stamped at or after this ISO 8601 time.")
@click.option("--until", type=TIME, help="Only events stamped at or before this ISO 8601 time.")
@click.option("--grep", help="Only events whose reason contains this text (any case).")
@click.option("--jsonl", "as_jsonl", is_flag=True, help="One JSON object per line.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV with a header line.")
@reading_options
def events(  # noqa: PLR0917 - one parameter per option, as click passes them
    where: Path,
    instance: str | None,
    kinds: tuple[str, ...],
    source: str | None,
    since: int | None,
    until: int | None,
    grep: str | None,
    as_jsonl: bool,
    as_csv: bool,
    reading: Reading,
) -> None:
    """List the events of the chain in WHERE, filtered, as a table, JSON Lines or CSV.

    WHERE is the chain file, the node's data directory or its config file
    (.toml). Columns: seq, time (ISO 8601 UTC), instance, kind, source (who
    decided: role, or role:caller), lifecycle state before and after (for
    instance events), reason. The chain is verified in the same pass, and
    against its checkpoints as chain verify does (--checkpoint FILE --key
    PUBKEY rules out truncation up to a checkpoint saved elsewhere); a chain
    that does not verify is refused (exit 1) unless --unverified. Filters
    combine (all must hold). Exit 0, also when nothing matches.
    """
    db = chain_of(where)
    if as_jsonl and as_csv:
        fail("--jsonl and --csv exclude each other: choose one", "usage", "--csv")
    _check_filters(kinds, since, until)
    unverified = reading.unverified
    read = read_offline(db, unverified=unverified, keep_events=True, trust=reading.trust)
    subject = None if instance is None else _subject(db, read, instance)
    wanted = _Filter(subject, kinds, source, since, until, grep)
    rows = [r for r in _rows(read) if wanted.matches(r)]
    if unverified and not as_jsonl and not as_csv:
        print_marker(db, read)
    elif unverified and read.report.problem is not None:
        p = read.report.problem
        click.echo(f"warning: UNVERIFIED: {db} does not verify (seq {p.seq}: {p.reason})", err=True)
    _print_rows(rows, read, as_jsonl=as_jsonl, as_csv=as_csv, unverified=unverified)


def _subject(db: Path, read: ChainRead, instance: str) -> str:
    """The subject --instance names: a subject of the chain, or an id or role resolved."""
    if instance in set(read.by_subject) - {""}:
        return instance
    return resolve(instance, every_role(read, chain_roles(read.state)), f"in {db}")


def _print_rows(
    rows: list[EventRow], read: ChainRead, *, as_jsonl: bool, as_csv: bool, unverified: bool
) -> None:
    if as_jsonl:
        encoder = msgspec.json.Encoder()
        for r in rows:
            line = msgspec.to_builtins(r)
            if unverified:
                line["verified"] = read.report.ok
            click.echo(encoder.encode(line).decode())
    elif as_csv:
        click.echo(_csv(rows))
    else:
        click.echo(_table(rows))


_EVENT_COLUMNS = ("SEQ", "TIME", "INSTANCE", "KIND", "SOURCE", "FROM", "TO", "REASON")


class EventRow(msgspec.Struct, frozen=True, kw_only=True, rename={"frm": "from"}):
    """One line of `infervisor events` (--jsonl: one object per line)."""

    seq: int
    ts_ns: int
    time: str
    instance: str
    kind: str
    source: str
    frm: str | None
    to: str | None
    reason: str
    exit_code: int | None


def _rows(read: ChainRead) -> list[EventRow]:
    """Every replayed event as a row; instance events with the state before and after."""
    rows: list[EventRow] = []
    for subject, stored_events in read.by_subject.items():
        entries: dict[int, TimelineEntry] = {}
        if subject:
            try:
                entries = {e.seq: e for e in timeline_of(stored_events)}
            except (ReplayError, EventDecodeError):
                entries = {}
        for stored in stored_events:
            rows.append(_row(stored, entries.get(stored.seq)))
    rows.sort(key=lambda r: r.seq)
    return rows


def _row(stored: StoredEvent, entry: TimelineEntry | None) -> EventRow:
    reason, exit_code = "", None
    if stored.kind != "chain.genesis":
        try:
            event = ev.decode_event(stored)
        except EventDecodeError as e:
            reason = f"(undecodable: {e})"
        else:
            reason = reason_of(event)
            if isinstance(event, ev.Exited):
                exit_code = event.exit_code
    return EventRow(
        seq=stored.seq,
        ts_ns=stored.ts_ns,
        time=iso(stored.ts_ns),
        instance=stored.subject,
        kind=stored.kind,
        source=stored.source,
        frm=None if entry is None or entry.frm == "-" else entry.frm,
        to=None if entry is None or entry.to == "-" else entry.to,
        reason=reason,
        exit_code=exit_code,
    )


class _Filter(NamedTuple):
    """The options that choose events; all must hold (None or empty: any)."""

    instance: str | None
    kinds: tuple[str, ...]
    source: str | None
    since: int | None  # ns since the epoch, UTC
    until: int | None  # ns since the epoch, UTC
    grep: str | None

    def matches(self, row: EventRow) -> bool:
        kinds = self.kinds
        return (
            (self.instance is None or row.instance == self.instance)
            and (not kinds or any(_kind_matches(row.kind, k) for k in kinds))
            and (self.source is None or self.source in _source_keys(row.source))
            and (self.since is None or row.ts_ns >= self.since)
            and (self.until is None or row.ts_ns <= self.until)
            and (self.grep is None or self.grep.lower() in row.reason.lower())
        )


def _source_keys(source: str) -> tuple[str, ...]:
    """What ``--source`` may name to match ``source``: it whole, its role, and
    ``role:controller`` when it names a controller (replay/callers.py)."""
    parsed = parse_source(source)
    if parsed.controller is None:
        return (source, parsed.role)
    return (source, parsed.role, f"{parsed.role}:{parsed.controller}")


def _table(rows: list[EventRow]) -> str:
    """The rows as a table. FROM and TO show a change of lifecycle only: an event
    that leaves it as it was (``residency.evicted`` before its stop, say) shows
    ``-`` in both, not ``running -> running`` (--jsonl keeps both states)."""
    cells = [
        (
            str(r.seq),
            r.time,
            r.instance or "-",
            r.kind,
            r.source,
            *(("-", "-") if r.frm == r.to else (r.frm or "-", r.to or "-")),
            r.reason,
        )
        for r in rows
    ]
    lines = [_EVENT_COLUMNS, *cells]
    widths = [max(len(line[i]) for line in lines) for i in range(len(_EVENT_COLUMNS) - 1)]
    out = []
    for line in lines:
        parts = [cell.ljust(width) for cell, width in zip(line, widths, strict=False)]
        out.append("  ".join([*parts, line[-1]]).rstrip())
    return "\n".join(out)


def _csv(rows: list[EventRow]) -> str:
    buffer = io.StringIO()
    names = [
        "seq",
        "time",
        "ts_ns",
        "instance",
        "kind",
        "source",
        "from",
        "to",
        "reason",
        "exit_code",
    ]
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(names)
    for r in rows:
        writer.writerow(
            [
                r.seq,
                r.time,
                r.ts_ns,
                r.instance,
                r.kind,
                r.source,
                r.frm or "",
                r.to or "",
                r.reason,
                "" if r.exit_code is None else r.exit_code,
            ]
        )
    return buffer.getvalue().rstrip("\n")


def _kind_matches(kind: str, wanted: str) -> bool:
    """``--kind wanted`` holds for ``kind``: the kind, an instance's without its
    ``instance.``, or a prefix (``residency.*``: every kind that starts ``residency.``)."""
    if wanted.endswith(".*"):
        return kind.startswith(wanted[:-1])
    return wanted in (kind, kind.removeprefix("instance."))


def _check_filters(kinds: tuple[str, ...], since: int | None, until: int | None) -> None:
    """Refuse filters that can match nothing by mistake (a kind mistyped, times swapped).

    Raises:
        Failure: ``bad_value``, naming the option and the allowed values.
    """
    known = sorted({*ev.EVENT_TYPES, GENESIS_KIND})
    for kind in kinds:
        if not any(_kind_matches(k, kind) for k in known) or "*" in kind[:-1]:
            raise Failure(
                f"--kind {kind!r} is not an event kind; one of {', '.join(known)} "
                "(an instance's without its 'instance.'), or a prefix of some ending in "
                ".* (residency.*)",
                "bad_value",
                "--kind",
            )
    if since is not None and until is not None and since > until:
        raise Failure("--since is later than --until: nothing could match", "bad_value", "--since")
