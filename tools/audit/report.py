"""``infervisor audit``: the chain replayed through the lifecycle rules, every
forbidden transition reported with its sequence number (replay/audit.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import msgspec

from infervisor.chain import ChainError
from infervisor.replay.audit import AuditReport, audit_chain
from infervisor.replay.policy import RestartPolicy

from ..clikit.command import Command, FiniteRange
from ..clikit.failure import echo_json, fail
from ..node.where import chain_of
from .offline import iso
from .trust_options import TrustArgs, anchor_line, judge_chain, say_anchor, trust_options

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
    or the config's [[witnesses]]); the anchor line goes to stderr ("anchor"
    and "trust" in --json). Exit 0 when there is nothing to report; 1 when
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
    verdict = judge_chain(db, TrustArgs(where, witnesses, quorum))
    trusted = verdict.problem is None
    verifies = trusted and report.verify.problem is None
    if as_json:
        doc = msgspec.to_builtins(report)
        problem = None if trusted else verdict.problem._asdict()  # type: ignore[union-attr]
        doc.update(ok=report.ok and trusted, anchor=anchor_line(verdict, verifies), trust=problem)
        echo_json(doc)
    else:
        if verdict.problem is not None:
            p = verdict.problem
            click.echo(f"INVALID against its checkpoints at seq {p.seq}: {p.reason}: {p.detail}")
        _print_audit(db, report)
        say_anchor(verdict, verifies)
    sys.exit(0 if report.ok and trusted else 1)


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
