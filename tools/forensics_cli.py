"""The auditor's and analyst's offline commands: verified reads, ``events``, ``audit``.

Every command here reads a chain file (never a running node) and verifies it
in the same pass and snapshot it reads (`infervisor.replay.read_chain`): a
chain that does not verify is refused (exit 1, ``chain_invalid``, naming the
sequence number and the reason) unless ``--unverified`` is given; then it is
read as stored and every output says so (a first line in text, and a
``"verified"`` / ``"problem"`` wrapper in JSON). See docs/cli.md and
docs/forensics.md.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import msgspec

from infervisor.chain import GENESIS_KIND, ChainError, StoredEvent
from infervisor.chain.checks import Problem
from infervisor.replay import (
    ChainRead,
    EventDecodeError,
    ReplayError,
    TimelineEntry,
    read_chain,
    reason_of,
    timeline_of,
)
from infervisor.replay import events as ev
from infervisor.replay.audit import AuditReport, audit_chain
from infervisor.replay.callers import role_of
from infervisor.replay.policy import RestartPolicy

from .cli_failure import Failure, echo_json

__all__ = [
    "TIME",
    "Failure",
    "Resolver",
    "Until",
    "audit",
    "events",
    "parse_time",
    "parse_until",
    "print_marker",
    "read_offline",
    "wrap",
]

Resolver = Callable[[str, dict[str, str | None], str], str]
"""The command line's `_resolve`: the instance id a name (id or role) means, or exit."""


class Until(msgspec.Struct, frozen=True, kw_only=True):
    """Where `replay --until` stops: a seq, or a time (ns since the Unix epoch, UTC)."""

    seq: int | None = None
    ts_ns: int | None = None


def parse_time(text: str) -> int:
    """ISO 8601 / RFC 3339 TEXT as ns since the Unix epoch (no offset: UTC).

    Raises:
        ValueError: not a date and time.
    """
    when = dt.datetime.fromisoformat(text.strip().replace(" ", "T", 1))
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    delta = when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta // dt.timedelta(microseconds=1)) * 1000


def parse_until(text: str) -> Until:
    """``--until``'s value: digits are a seq, anything else an ISO 8601 time.

    Raises:
        ValueError: neither.
    """
    if text.strip().isdigit():
        return Until(seq=int(text))
    return Until(ts_ns=parse_time(text))


class _TimeParam(click.ParamType[int]):
    """An ISO 8601 / RFC 3339 time, as ns since the epoch."""

    name = "time"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int):
            return value
        try:
            return parse_time(str(value))
        except ValueError:
            self.fail(f"{value!r} is not an ISO 8601 time (2026-11-01T00:00:00Z)", param, ctx)


TIME = _TimeParam()
"""Click type of --since/--until: an ISO 8601 time, as ns since the epoch."""


def read_offline(
    db: Path,
    *,
    unverified: bool,
    until: Until | None = None,
    keep_events: bool = False,
) -> ChainRead:
    """Verify and replay DB in one pass.

    Raises:
        Failure: `chain_invalid` when it does not verify (unless `unverified`),
            `chain_unreadable` when it cannot be read, `chain_unreplayable`
            when an event does not fit.
    """
    try:
        read = read_chain(
            db,
            until_seq=None if until is None else until.seq,
            until_ns=None if until is None else until.ts_ns,
            unverified=unverified,
            keep_events=keep_events,
        )
    except ChainError as e:
        raise Failure(str(e), "chain_unreadable") from e
    except (EventDecodeError, ReplayError) as e:
        raise Failure(
            f"{db} cannot be replayed: {e} (check it with: infervisor chain verify {db})",
            "chain_unreplayable",
        ) from e
    problem = read.report.problem
    if problem is not None and not unverified:
        raise Failure(
            f"{db} does not verify: seq {problem.seq}: {problem.reason}: {problem.detail}; "
            "nothing shown (--unverified reads it anyway, marked)",
            "chain_invalid",
        )
    return read


def print_marker(db: Path, read: ChainRead) -> None:
    """Under --unverified, the first line of text output (and a warning on stderr)."""
    problem = read.report.problem
    if problem is None:
        click.echo(f"verified: {db} checks out ({read.report.events} events)")
        return
    line = (
        f"UNVERIFIED: {db} does not verify (seq {problem.seq}: {problem.reason}); shown as stored"
    )
    click.echo(line)
    click.echo(f"warning: {line}: {problem.detail}", err=True)


class Unverified(msgspec.Struct, frozen=True, kw_only=True):
    """``--unverified --json``: the answer wrapped with the verdict."""

    verified: bool
    problem: Problem | None
    answer: Any


def wrap(read: ChainRead, answer: Any) -> Unverified:
    """The --unverified JSON wrapper of `answer`."""
    return Unverified(verified=read.report.ok, problem=read.report.problem, answer=answer)


# ---------------------------------------------------------------- events
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


def iso(ts_ns: int) -> str:
    """ns since the epoch as ISO 8601 UTC with milliseconds (as the SQL views write it)."""
    seconds, ns = divmod(ts_ns, 1_000_000_000)
    when = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=seconds)
    return when.strftime("%Y-%m-%dT%H:%M:%S") + f".{ns // 1_000_000:03d}Z"


def every_role(read: ChainRead, current: dict[str, str | None]) -> dict[str, str | None]:
    """Each instance the chain ever had -> its role: the placed ones from
    ``current`` (their state), the unloaded ones from their last placement."""
    roles = dict(current)
    for subject, stored_events in read.by_subject.items():
        if not subject or subject in roles:
            continue
        roles[subject] = None
        for stored in stored_events:
            if stored.kind == "instance.placed":
                with contextlib.suppress(ValueError, TypeError, KeyError):
                    role = json.loads(stored.payload)["spec"]["role"]
                    roles[subject] = role if isinstance(role, str) else None
    return roles


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


def _matches(
    row: EventRow,
    *,
    instance: str | None,
    kinds: tuple[str, ...],
    source: str | None,
    since: int | None,
    until: int | None,
    grep: str | None,
) -> bool:
    return (
        (instance is None or row.instance == instance)
        and (not kinds or row.kind in kinds or row.kind.removeprefix("instance.") in kinds)
        and (source is None or row.source == source or role_of(row.source) == source)
        and (since is None or row.ts_ns >= since)
        and (until is None or row.ts_ns <= until)
        and (grep is None or grep.lower() in row.reason.lower())
    )


def _table(rows: list[EventRow]) -> str:
    cells = [
        (
            str(r.seq),
            r.time,
            r.instance or "-",
            r.kind,
            r.source,
            r.frm or "-",
            r.to or "-",
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


def _check_filters(kinds: tuple[str, ...], since: int | None, until: int | None) -> None:
    """Refuse filters that can match nothing by mistake (a kind mistyped, times swapped).

    Raises:
        Failure: ``bad_value``, naming the option and the allowed values.
    """
    known = sorted({*ev.EVENT_TYPES, GENESIS_KIND})
    short = {k.removeprefix("instance.") for k in known if k.startswith("instance.")}
    for kind in kinds:
        if kind not in known and kind not in short:
            raise Failure(
                f"--kind {kind!r} is not an event kind; one of {', '.join(known)} "
                "(an instance's without its 'instance.')",
                "bad_value",
                "--kind",
            )
    if since is not None and until is not None and since > until:
        raise Failure("--since is later than --until: nothing could match", "bad_value", "--since")


def events(  # noqa: PLR0917 - one parameter per option of `infervisor events`
    db: Path,
    instance: str | None,
    kinds: tuple[str, ...],
    source: str | None,
    since: int | None,
    until: int | None,
    grep: str | None,
    as_jsonl: bool,
    as_csv: bool,
    unverified: bool,
    resolve: Resolver,
    roles_of: Callable[[Any], dict[str, str | None]],
) -> None:
    """`infervisor events` (its help is in tools/cli.py): print the filtered events of DB.

    Raises:
        Failure: as `read_offline`; `usage` for --jsonl with --csv.
    """
    if as_jsonl and as_csv:
        raise Failure("--jsonl and --csv exclude each other: choose one", "usage", "--csv")
    _check_filters(kinds, since, until)
    read = read_offline(db, unverified=unverified, keep_events=True)
    subject = None
    if instance is not None:
        subjects = set(read.by_subject) - {""}
        if instance in subjects:
            subject = instance
        else:
            subject = resolve(instance, every_role(read, roles_of(read.state)), f"in {db}")
    rows = [
        r
        for r in _rows(read)
        if _matches(
            r, instance=subject, kinds=kinds, source=source, since=since, until=until, grep=grep
        )
    ]
    if unverified and not as_jsonl and not as_csv:
        print_marker(db, read)
    elif unverified and read.report.problem is not None:
        p = read.report.problem
        click.echo(f"warning: UNVERIFIED: {db} does not verify (seq {p.seq}: {p.reason})", err=True)
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


# ---------------------------------------------------------------- audit
def audit(db: Path, max_restarts: int | None, window_s: float | None, as_json: bool) -> int:
    """`infervisor audit` (its help is in tools/cli.py): print the report; the exit status.

    Raises:
        Failure: `usage` for --window without --max-restarts; `chain_unreadable`.
    """
    if window_s is not None and max_restarts is None:
        raise Failure("--window needs --max-restarts", "usage", "--window")
    policy = None
    if max_restarts is not None:
        policy = RestartPolicy(max_restarts=max_restarts, window_s=window_s)
    try:
        report = audit_chain(db, policy)
    except ChainError as e:
        raise Failure(str(e), "chain_unreadable") from e
    if as_json:
        echo_json(report)
    else:
        _print_audit(db, report)
    return 0 if report.ok else 1


def _print_audit(db: Path, report: AuditReport) -> None:
    v = report.verify
    if v.problem is not None:
        p = v.problem
        click.echo(f"INVALID chain at seq {p.seq}: {p.reason}: {p.detail} (audited as stored)")
    found = len(report.findings)
    click.echo(f"audit of {db}: {report.events} events, {found} finding{'s' * (found != 1)}")
    for f in report.findings:
        who = f.instance or "(node)"
        click.echo(f"  seq {f.seq:>6} {iso(f.ts_ns)} {who}: {f.rule}: {f.detail}")
