"""The auditor's and analyst's reads of a chain file: verified, or marked unverified.

Every offline command (``replay``, ``timeline``, ``events``, ``status`` of a
stopped node) reads a chain file (never a running node) and verifies it in
the same pass and snapshot it reads (`infervisor.replay.read_chain`): a chain
that does not verify is refused (exit 1, ``chain_invalid``, naming the
sequence number and the reason), and so is one that fails the trust policy
against its checkpoints and cosignatures (chain/trust.py, with ``--witness`` /
``--quorum`` or a config's ``[[witnesses]]``), unless ``--unverified`` is given; then it is
read as stored and every output says so (a first line in text, and a
``"verified"`` / ``"problem"`` wrapper in JSON). See docs/cli.md and
docs/forensics.md.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from pathlib import Path
from typing import Any, cast

import click
import msgspec

from infervisor.chain import ChainError
from infervisor.chain.checks import Problem, Reason
from infervisor.replay import ChainRead, EventDecodeError, ReplayError, read_chain

from ..clikit.failure import Failure
from .trust_options import TrustArgs, judge_chain, refuse, say_anchor

__all__ = [
    "TIME",
    "Until",
    "Unverified",
    "every_role",
    "iso",
    "parse_time",
    "parse_until",
    "print_marker",
    "read_offline",
    "wrap",
]


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
    """``--until``'s value: ASCII digits are a seq, anything else an ISO 8601 time.

    Raises:
        ValueError: neither (``٣``, digits of another script, too: ``int()`` reads them).
    """
    if text.strip().isascii() and text.strip().isdigit():
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
    trust: TrustArgs | None = None,
) -> ChainRead:
    """Verify and replay DB in one pass, then apply the trust policy (chain/trust.py)
    with `trust`'s witnesses and key; its anchor line goes to stderr.

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
    if trust is not None:
        verdict = judge_chain(db, trust)
        if verdict.problem is not None and problem is None:
            if not unverified:
                refuse(db, verdict)
            # The trust policy's failure is the chain's verdict: the first line,
            # the JSON wrapper and each event's mark say it, as for a bad hash.
            p = verdict.problem  # the trust policy's reasons widen the row checks' Reason
            failed = Problem(seq=p.seq, reason=cast(Reason, p.reason), detail=p.detail)
            report = msgspec.structs.replace(read.report, ok=False, problem=failed)
            read = msgspec.structs.replace(read, report=report)
        say_anchor(verdict, read.report.problem is None)
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
