"""``infervisor audit``: the chain replayed through the lifecycle rules, every
forbidden transition reported with its sequence number (replay/audit.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import msgspec

from infervisor.chain import ChainError
from infervisor.chain.trust import Verdict
from infervisor.replay.audit import AuditReport, audit_chain
from infervisor.replay.policy import RestartPolicy

from ..clikit.command import Command, FiniteRange
from ..clikit.failure import echo_json, fail
from ..node.where import chain_of
from .chain_inputs import stored_extent
from .offline import iso
from .trust_options import (
    TrustArgs,
    anchor_line,
    judge_chain,
    located,
    say_anchor,
    trust_options,
)

__all__ = ["audit"]


@click.command("audit", cls=Command)
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.option(
    "--max-restarts",
    type=click.IntRange(min=0),
    help="The node's restart budget (its config's restart.max_restarts); without it the "
    "budget is checked only where the chain records it.",
)
@click.option(
    "--window",
    "window_s",
    type=FiniteRange(min=0, min_open=True, max=7 * 24 * 3600.0),
    help="The budget's window in seconds (restart.window_s); needs --max-restarts.",
)
@trust_options
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def audit(  # noqa: PLR0917 - one parameter per option, as click passes them
    where: Path,
    max_restarts: int | None,
    window_s: float | None,
    checkpoint_file: Path | None,
    key: str | None,
    witnesses: tuple[str, ...],
    quorum: int | None,
    as_json: bool,
) -> None:
    """Replay the chain in WHERE through the lifecycle rules; report every forbidden transition.

    Flags, with sequence numbers: a restart after an operator (or
    controller) stop, a restart beyond the budget, a start of an exposed
    instance, an event for an instance never placed (or already unloaded),
    time going backwards, and any other transition the lifecycle table
    forbids. The chain is verified in the same pass, and against its
    checkpoints and cosignatures (the trust policy, with --witness/--quorum
    or the config's [[witnesses]]; --checkpoint FILE --key PUBKEY adds a
    signed checkpoint saved elsewhere, which rules out truncation up to its
    tree size); the anchor line goes to stderr ("anchor" and "trust" in
    --json). Exit 0 when there is nothing to report; 1 when
    something was found or the chain does not verify; 2 when WHERE cannot be
    read.
    """
    db = chain_of(where)
    if window_s is not None and max_restarts is None:
        fail("--window needs --max-restarts", "usage", "--window")
    policy = None
    if max_restarts is not None:
        policy = RestartPolicy(max_restarts=max_restarts, window_s=window_s)
    try:
        report = audit_chain(db, policy)
    except ChainError as e:
        fail(str(e), "chain_unreadable")
    verdict = judge_chain(db, TrustArgs(where, witnesses, quorum, key, checkpoint_file))
    trusted = verdict.problem is None
    verifies = trusted and report.verify.problem is None
    held, _ = stored_extent(db)
    audited = _verified_prefix(report, verdict)
    if as_json:
        doc = msgspec.to_builtins(audited)
        problem = None if trusted else verdict.problem._asdict()  # type: ignore[union-attr]
        doc.update(
            ok=report.ok and trusted,
            anchor=anchor_line(verdict, verifies),
            trust=problem,
            stored_events=held,
        )
        echo_json(doc)
    else:
        if verdict.problem is not None:
            p = verdict.problem
            click.echo(f"INVALID against its checkpoints {located(p)}: {p.reason}: {p.detail}")
        _print_audit(db, audited, held, verifies=verifies)
        say_anchor(verdict, verifies)
    sys.exit(0 if report.ok and trusted else 1)


def _verified_prefix(report: AuditReport, verdict: Verdict) -> AuditReport:
    """The audit of what verified: the events below the first seq a problem names
    (the rows', else the trust policy's), findings of later rows dropped.

    The audit folds events in seq order, so a finding at seq N depends only on
    seq 0..N: the findings below the problem are the prefix's own. Rows after a
    problem are not what the node recorded, or may not be: an audit of them
    would vouch for events nobody can vouch for (stop 32's trial read "0
    findings" under INVALID)."""
    first = report.verify.problem
    trust = verdict.problem
    limit = first.seq if first is not None else trust.seq if trust is not None else None
    if limit is None:
        return report
    return msgspec.structs.replace(
        report,
        events=min(report.events, limit),
        findings=[f for f in report.findings if f.seq < limit],
    )


def _none_verified(rows_ok: bool, held: int) -> str:
    """Why no event was audited, in chain verify's words: the rows fail from seq 0,
    or they all check out and the chain fails its checkpoints from seq 0 (their
    triggers changed, a fork at seq 0): stop 32's trial read "does not verify
    from seq 0 on" where chain verify said every row checks out."""
    if not rows_ok:
        return (
            f"the chain does not verify from seq 0 on (the file holds {held} events); "
            "see infervisor chain verify"
        )
    return (
        f"the chain fails against its checkpoints from seq 0 on, though every row's hash "
        f"and link check out (the file holds {held} events); see infervisor chain verify"
    )


def _print_audit(db: Path, report: AuditReport, held: int, *, verifies: bool) -> None:
    v = report.verify
    if v.problem is not None:
        p = v.problem
        click.echo(f"INVALID chain at seq {p.seq}: {p.reason}: {p.detail}")
    found = len(report.findings)
    findings = f"{found} finding{'s' * (found != 1)}"
    if verifies:
        click.echo(f"audit of {db}: {report.events} events, {findings}")
    elif report.events == 0:
        click.echo(f"audit of {db}: none made: {_none_verified(v.problem is None, held)}")
        return
    elif report.events >= held:  # a truncated chain: every row the file still holds
        click.echo(
            f"audit of {db}: {report.events} events, {findings} (every event the file "
            "holds; the events it lost cannot be audited)"
        )
    else:
        click.echo(
            f"audit of {db}: only seq 0..{report.events - 1}, the {report.events} events "
            f"that verified, {findings}; the other {held - report.events} of the "
            f"{held} events the file holds are not audited"
        )
    for f in report.findings:
        who = f.instance or "(node)"
        click.echo(f"  seq {f.seq:>6} {iso(f.ts_ns)} {who}: {f.rule}: {f.detail}")
