"""``infervisor chain verify``: every hash and link of a chain, and optionally a
signed checkpoint and an RFC 6962 proof against it (docs/chain-format.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
import msgspec

from infervisor.chain import ChainError, VerifyReport, verify_chain
from infervisor.chain.anchor import QUORUM_UNMET
from infervisor.chain.checkpoint import Checkpoint
from infervisor.chain.errors import ProofError
from infervisor.chain.merkle import leaf_hash, verify_consistency, verify_inclusion
from infervisor.chain.trust import Problem, Verdict

from ..clikit.command import Command
from ..clikit.failure import Failure, echo_json
from ..node.where import chain_of
from .chain_inputs import read_text, stored_extent, stored_hashes, warn
from .trust_options import (
    TrustArgs,
    anchor_line,
    external_checkpoint,
    judge_chain,
    located,
    trust_options,
)

__all__ = ["NO_CHECKPOINT_WARNING", "verify"]

STORED_CHECKPOINT_WARNING = (
    "checked against the chain's own signed checkpoints only: a rewrite of the whole "
    "file, its checkpoints re-signed with node.key, cannot be ruled out: pass --witness "
    "VKEY (its cosignatures stored in the chain) or --checkpoint FILE --key PUBKEY (a "
    "checkpoint saved elsewhere earlier, and the node's public key)"
)
NO_CHECKPOINT_WARNING = (
    "without a checkpoint, truncation of the chain's tail and a rewrite of the whole "
    "chain cannot be ruled out: pass --checkpoint FILE --key PUBKEY (a checkpoint saved "
    "earlier with `infervisor chain checkpoint DB --out FILE`, and the node's public key, "
    "DATA_DIR/node.pub)"
)


@click.command("verify", cls=Command)
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@trust_options
@click.option(
    "--proof",
    "proof_file",
    type=click.Path(path_type=Path),
    metavar="FILE",
    help="An inclusion or consistency proof (chain prove|consistency --json) to check.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
def verify(  # noqa: PLR0917 - one parameter per option, as click passes them
    where: Path,
    checkpoint_file: Path | None,
    key: str | None,
    witnesses: tuple[str, ...],
    quorum: int | None,
    proof_file: Path | None,
    as_json: bool,
) -> None:
    """Verify every hash and link of the chain in WHERE, and the chain against its checkpoints.

    WHERE is the chain file, the node's data directory (holding chain.db) or
    its config file (.toml): the verdict is the same for all three. The
    trust policy (docs/chain-format.md, "Cosignatures and the trust policy")
    checks every stored checkpoint's signature with the node key (--key,
    else node.pub beside the chain), the chain against each (truncated,
    rewritten, forked: named with the first sequence number the evidence
    allows), and the stored cosignatures of the --witness keys (or the
    config's [[witnesses]]); --checkpoint FILE --key PUBKEY adds a signed
    checkpoint saved elsewhere. One line says how far the verdict is
    anchored outside the node ("anchor" in --json); without an anchor,
    stderr (and "warning" in --json) says what cannot be ruled out. Exit 0
    when valid; 1 when not; 2 when the file cannot be read.
    """
    db = chain_of(where)
    args = TrustArgs(where, witnesses, quorum, key, checkpoint_file)
    try:
        report = verify_chain(db)
    except ChainError as e:
        raise Failure(str(e), "chain_unreadable") from e
    external = external_checkpoint(db, args)
    cp = None if external is None else external[0]
    verdict = judge_chain(db, args, external)
    against = _against(verdict, cp) if report.ok else None
    proof = _check_proof(db, proof_file, cp) if proof_file is not None else None
    warning = _warning(verdict, against)
    ok = report.ok and (against is None or against["ok"]) and (proof is None or proof["ok"])
    anchor = anchor_line(verdict, ok)
    count, last = stored_extent(db)
    stored = {"events": count, "head_seq": last}
    if as_json:
        doc = _doc(report, against, ok=ok, proof=proof, warning=warning, anchor=anchor)
        echo_json({**doc, "stored": stored})
    elif ok:
        _say_ok(report, against, proof)
    else:
        _say_invalid(report, against, proof)
        click.echo(_as_stored(report, count, last))
    if not as_json:
        click.echo(anchor)
    if warning is not None and (report.ok or not as_json):  # JSON carries it in "warning"
        warn(warning)
    sys.exit(0 if ok else 1)


def _doc(report: VerifyReport, against: dict[str, Any] | None, **fields: Any) -> dict[str, Any]:
    """The --json verdict: the rows' report, ``checkpoint`` (`against`) and `fields`.
    The checkpoints' failure is the chain's: ``problem`` names it when the rows
    verify, as the offline readers' wrapper does (a failed proof stays in ``proof``)."""
    doc: dict[str, Any] = msgspec.to_builtins(report)
    if report.problem is None and against is not None and not against["ok"]:
        doc["problem"] = {k: against[k] for k in ("seq", "reason", "detail")}
    doc.update(checkpoint=against, **fields)
    return doc


def _warning(verdict: Verdict, against: dict[str, Any] | None) -> str | None:
    """What cannot be ruled out without an anchor, and what to pass; None only when
    anchored (docs/cli.md, "chain verify --json"). Witnesses that vouch for no
    checkpoint are named, with no advice to pass --witness when they were given
    (stop 34's trial read "pass --witness" under ``--witness``, then, once that
    was dropped, ``"warning": null`` under a quorum not met)."""
    if verdict.anchored:
        return None
    if verdict.shortfall is not None:
        given = verdict.problem is not None and verdict.problem.reason == QUORUM_UNMET
        who = "the --witness keys" if given else "the config's [[witnesses]]"
        return (
            f"{who} vouch for no checkpoint: {verdict.shortfall}: a rewrite of the whole "
            "file, its checkpoints re-signed with node.key, cannot be ruled out"
        )
    return NO_CHECKPOINT_WARNING if against is None else STORED_CHECKPOINT_WARNING


def _against(verdict: Verdict, cp: Checkpoint | None) -> dict[str, Any] | None:
    """The verdict against the checkpoints, as the "checkpoint" field of --json
    (None when no checkpoint was checked)."""
    if cp is None and verdict.checkpoints == 0 and verdict.problem is None:
        return None
    own = "" if cp is not None else " (the chain's own latest checkpoint and those before it)"
    shown = cp or verdict.latest
    base: dict[str, Any] = {
        "tree_size": verdict.latest_size if shown is None else shown.tree_size,
        "root": None if shown is None else shown.root.hex(),
        "origin": None if shown is None else shown.origin,
    }
    p = verdict.problem
    if p is None:
        return {
            **base, "ok": True, "seq": None, "last_seq": None, "reason": None,
            "detail": "as signed" + own,
        }  # fmt: skip
    whose = "" if p.reason == QUORUM_UNMET else own  # the witnesses', not a checkpoint's
    return {
        **base, "ok": False, "seq": p.seq, "last_seq": p.last_seq, "reason": p.reason,
        "detail": p.detail + whose,
    }  # fmt: skip


def _say_ok(
    report: VerifyReport, against: dict[str, Any] | None, proof: dict[str, Any] | None
) -> None:
    """A valid verdict: the chain, the checkpoints, the proof, each ``ok``."""
    click.echo(f"ok: {_rows(report)}")
    if against is not None:
        click.echo(
            f"ok against checkpoint: tree size {against['tree_size']}: "
            f"seq 0..{against['tree_size'] - 1} are as signed"
        )
    if proof is not None:
        click.echo(f"ok {proof['type']} proof: {proof['detail']}")


def _say_invalid(
    report: VerifyReport, against: dict[str, Any] | None, proof: dict[str, Any] | None
) -> None:
    """A verdict that is not ok: each failure (rows, checkpoints, proof), then the
    chain as read, in words that vouch for nothing (no ``ok`` line: a part that
    checks out beside a failure is in --json, with its own ``ok``)."""
    p = report.problem
    if p is not None:
        click.echo(f"INVALID at seq {p.seq}: {p.reason}: {p.detail}")
    if against is not None and not against["ok"]:
        click.echo(
            f"INVALID against checkpoint {_at(against)}: {against['reason']}: {against['detail']}"
        )
    if proof is not None and not proof["ok"]:
        click.echo(f"INVALID {proof['type']} proof: {proof['detail']}")


def _at(against: dict[str, Any]) -> str:
    """Where the checkpoints' failure is: ``at seq N`` or ``in seq N..M``."""
    return located(Problem(against["seq"], against["reason"], "", against["last_seq"]))


def _as_stored(report: VerifyReport, count: int, last: int | None) -> str:
    """The chain as read, in words that vouch for nothing: what the file holds
    (every row, verified or not), then how far its rows verified (``events``
    of the report counts only the rows before the first bad one)."""
    held = f"{count} events" + ("" if last is None else f", head seq {last}")
    if report.head_seq is None:
        return f"as stored: {held}; none verified (node {report.node})"
    if report.ok:
        return f"as stored: {held}; every row's hash and link check out, node {report.node}"
    return (
        f"as stored: {held}; verified seq 0..{report.head_seq} ({report.events} events), "
        f"node {report.node}, last verified {report.head_hash}"
    )


def _rows(report: VerifyReport) -> str:
    return (
        f"{report.events} events, node {report.node}, head seq {report.head_seq} {report.head_hash}"
    )


def _check_proof(db: Path, path: Path, cp: Checkpoint | None) -> dict[str, Any]:
    raw = read_text(path, "--proof")
    try:
        doc = _proof_doc(raw)
        kind = doc["type"]
        detail = (
            _check_inclusion(db, doc, cp) if kind == "inclusion" else _check_consistency(doc, cp)
        )
    except ProofError as e:
        return {"ok": False, "type": str(doc.get("type")), "detail": str(e)}
    except _Malformed as e:
        raise Failure(
            f"--proof {path}: not a proof from `infervisor chain prove|consistency --json`: {e}",
            "bad_value",
            "--proof",
        ) from e
    return {"ok": True, "type": kind, "detail": detail}


def _proof_doc(raw: bytes) -> dict[str, Any]:
    """The JSON object of a --proof file, whose type is inclusion or consistency."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise _Malformed("it is not JSON") from None
    if not isinstance(doc, dict):
        raise _Malformed("it is not a JSON object")
    if doc.get("type") not in ("inclusion", "consistency"):
        raise _Malformed(f"type {doc.get('type')!r}; allowed: inclusion, consistency")
    return doc


class _Malformed(Exception):
    """A --proof file that is not a proof document: why, in the project's words
    (a newcomer's trial, stop 33, read Python's "non-hexadecimal number found in
    fromhex() arg at position 0")."""


def _field(doc: dict[str, Any], name: str) -> Any:
    if name not in doc:
        raise _Malformed(f"no {name!r} field")
    return doc[name]


def _count(doc: dict[str, Any], name: str) -> int:
    value = _field(doc, name)
    if type(value) is not int or value < 0:
        raise _Malformed(f"{name} {value!r} is not a whole number >= 0")
    return value


def _hash(value: Any, name: str) -> bytes:
    """A SHA-256 hash as the proof writes it: 64 hex digits."""
    if not isinstance(value, str) or len(value) != 64:
        raise _Malformed(f"{name} {value!r} is not a hash: 64 hex digits allowed")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise _Malformed(f"{name} {value!r} is not a hash: 64 hex digits allowed") from None


def _hexes(doc: dict[str, Any], name: str) -> list[bytes]:
    values = _field(doc, name)
    if not isinstance(values, list):
        raise _Malformed(f"{name} is not a list of hashes (64 hex digits each)")
    return [_hash(v, f"{name}[{i}]") for i, v in enumerate(values)]


def _check_inclusion(db: Path, doc: dict[str, Any], cp: Checkpoint | None) -> str:
    seq, size = _count(doc, "leaf_index"), _count(doc, "tree_size")
    root, event = _hash(_field(doc, "root"), "root"), _hash(_field(doc, "event_hash"), "event_hash")
    path = _hexes(doc, "path")
    if cp is not None and (cp.tree_size != size or cp.root != root):
        raise ProofError(
            f"the proof is for tree size {size} root {root.hex()}, the checkpoint signed "
            f"{cp.tree_size} {cp.root.hex()}"
        )
    verify_inclusion(seq, size, leaf_hash(event), path, root)
    hashes = stored_hashes(db)
    if seq >= len(hashes) or hashes[seq] != event:
        found = hashes[seq].hex() if seq < len(hashes) else "no such event"
        raise ProofError(
            f"the chain's event at seq {seq} is {found}, the proof is of {event.hex()}"
        )
    signed = " (the checkpoint's)" if cp is not None else " (not checked against a checkpoint)"
    return f"seq {seq} ({event.hex()}) is in the tree of size {size}, root {root.hex()}{signed}"


def _check_consistency(doc: dict[str, Any], cp: Checkpoint | None) -> str:
    old, new = _count(doc, "old_size"), _count(doc, "new_size")
    old_root = _hash(_field(doc, "old_root"), "old_root")
    new_root = _hash(_field(doc, "new_root"), "new_root")
    proof = _hexes(doc, "proof")
    if cp is not None and (cp.tree_size, cp.root) not in ((old, old_root), (new, new_root)):
        raise ProofError("the proof names neither tree head of the checkpoint")
    verify_consistency(old, new, old_root, new_root, proof)
    return f"the tree of size {new} extends the tree of size {old}"
