"""``infervisor chain export`` and ``chain verify-bundle``: the chain as a bundle
directory (events.jsonl, checkpoints, node.pub, manifest.json) that an auditor
verifies with no database (docs/chain-format.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import msgspec

from infervisor.chain import ChainError, verify_chain
from infervisor.chain.bundle import export_bundle, verify_bundle
from infervisor.chain.checks import Problem
from infervisor.chain.errors import BundleError, CheckpointError

from ..clikit.command import Command
from ..clikit.failure import Failure, echo_json
from ..clikit.paths import KEY, need_dir
from ..node.where import chain_of
from .chain_files import say_swept
from .chain_inputs import KEY_HELP, verifier, warn
from .trust_options import TrustArgs, judge_chain, refuse

__all__ = ["OWN_KEY_WARNING", "export", "verify_bundle_cmd"]

OWN_KEY_WARNING = (
    "the checkpoints were checked with the bundle's own key (its node.pub), which whoever "
    "made the bundle chose: pass --key PUBKEY (the node's public key, obtained elsewhere)"
)
UNANCHORED = "unanchored: no checkpoint held outside this node"
NOTHING_EXPORTED = (
    "nothing exported (a bundle would not carry what fails, and verify-bundle would call it ok)"
)


@click.command("export", cls=Command)
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.argument("out", metavar="OUT", type=click.Path(path_type=Path))
@click.option("--key", type=KEY, help=KEY_HELP + " Default: node.pub beside the chain.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def export(where: Path, out: Path, key: str | None, as_json: bool) -> None:
    """Write the chain in WHERE as a bundle directory OUT (new or empty).

    OUT gets events.jsonl (every field and hash), checkpoints/, node.pub and
    manifest.json (counts, SHA-256 of each file): docs/chain-format.md.
    The chain is judged first as every reader judges it: one that fails the
    trust policy against its checkpoints (a dropped checkpoints table,
    changed triggers) is refused (exit 1) and nothing is written, as the
    bundle would not carry what fails; a file of another format, exit 2.
    One whose rows fail is exported as stored, with a warning (verify-bundle
    refuses it).
    """
    db = chain_of(where)
    problem = _judged(db, where, key)
    say_swept(out)
    try:
        manifest = export_bundle(db, out, key)
    except BundleError as e:
        raise Failure(str(e), "bad_path", "OUT") from e
    except CheckpointError as e:
        raise Failure(str(e), "bad_key", "--key") from e
    except ChainError as e:
        raise Failure(str(e), "chain_unreadable") from e
    if as_json:
        echo_json({"bundle": str(out), **manifest})
    else:
        key_note = "with the node's public key" if manifest["key"] else "without a public key"
        click.echo(
            f"exported {manifest['events']} events and {len(manifest['checkpoints'])} "
            f"checkpoint(s) of node {manifest['node']} to {out} ({key_note})"
        )
        if not manifest["key"]:
            warn("no node.pub beside the chain: verify-bundle will need --key PUBKEY")
    if problem is not None:
        warn(
            f"the chain does not verify (INVALID at seq {problem.seq}: {problem.reason}); "
            "the bundle holds it as stored, and verify-bundle will refuse it"
        )
    sys.exit(0)


def _judged(db: Path, where: Path, key: str | None) -> Problem | None:
    """Judge the chain as every reader does before anything is written: the rows
    (``verify_chain``), then the trust policy (chain/trust.py: checkpoints,
    their triggers, the events' triggers, the format version). A chain that
    fails the trust policy is refused: the bundle would not carry what fails
    (a dropped checkpoints table exports as a bundle without checkpoints,
    which verify-bundle calls ok: a newcomer's trial, stop 34). A row that
    fails is the bundle's to carry as stored (verify-bundle refuses it): its
    problem is returned, for a warning.

    Raises:
        Failure: ``chain_unreadable`` (2) when the file is not a chain of this
            format; ``chain_invalid`` (1) when it fails the trust policy.
    """
    try:
        report = verify_chain(db)
    except ChainError as e:
        raise Failure(str(e), "chain_unreadable") from e
    if report.problem is not None:
        return report.problem
    refuse(db, judge_chain(db, TrustArgs(where, key=key)), shown=NOTHING_EXPORTED)
    return None


@click.command("verify-bundle", cls=Command)
@click.argument("bundle", metavar="BUNDLE", type=click.Path(path_type=Path))
@click.option("--key", type=KEY, help=KEY_HELP + " Default: the bundle's node.pub.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
def verify_bundle_cmd(bundle: Path, key: str | None, as_json: bool) -> None:
    """Verify an export bundle with no database: events, checkpoints, manifest.

    Nothing in the unsigned manifest is believed: each field's type and
    range, the files it lists (exactly those the bundle holds), and its node,
    event count, head seq and hash, checkpoint sizes and key are checked
    against the events, checkpoints and key the bundle carries (docs/chain-
    format.md, section 13). Without --key the checkpoints are checked with
    the bundle's own node.pub, which whoever made the bundle chose: the
    output says so ("trusted_key": "bundle" in --json), and a bundle
    re-signed with another key verifies.
    A bundle carries no cosignatures: its verdict is unanchored (docs/chain-
    format.md, "Cosignatures and the trust policy"). Exit 0 when valid; 1 when
    not, naming the sequence number and the reason.
    """
    need_dir(bundle, "BUNDLE")
    if not (bundle / "manifest.json").is_file():
        raise Failure(f"{bundle}: not a bundle (no manifest.json)", "bad_path", "BUNDLE")
    if key is not None:
        verifier(key)  # a bad --key is usage naming it (2), not the bundle's "no key" (1)
    try:
        report = verify_bundle(bundle, key)
    except BundleError as e:
        if as_json:
            echo_json({"ok": False, "seq": e.seq, "reason": e.reason, "detail": str(e)})
        else:
            where = f" at seq {e.seq}" if e.seq is not None else ""
            click.echo(f"INVALID{where}: {e.reason}: {e}")
        sys.exit(1)
    trusted = "given" if key is not None else "bundle"
    if as_json:
        echo_json(
            {
                "ok": True,
                **msgspec.to_builtins(report),
                "trusted_key": trusted,
                "anchor": UNANCHORED,
            }
        )
    else:
        click.echo(
            f"ok: {report.events} events, node {report.node}, head seq {report.head_seq} "
            f"{report.head_hash}; {len(report.checkpoints)} checkpoints verified "
            f"(covering seq 0..{report.covered - 1})"
            if report.covered
            else f"ok: {report.events} events, node {report.node}, head seq {report.head_seq} "
            f"{report.head_hash}; no checkpoint"
        )
        click.echo(UNANCHORED)
    if key is None and report.covered:
        warn(OWN_KEY_WARNING)
    if report.warning:
        warn(report.warning)
    sys.exit(0)
