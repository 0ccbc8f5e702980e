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
from infervisor.chain.checkpoint import PUBLIC_KEY_FILE, Checkpoint, compare
from infervisor.chain.checkpoint_store import read_stored, verified
from infervisor.chain.errors import ProofError
from infervisor.chain.merkle import leaf_hash, verify_consistency, verify_inclusion

from ..clikit.command import Command
from ..clikit.failure import Failure, echo_json
from ..node.where import chain_of
from .chain_inputs import KEY_HELP, read_checkpoint, read_text, stored_hashes, trusted, warn

__all__ = ["NO_CHECKPOINT_WARNING", "verify"]

STORED_CHECKPOINT_WARNING = (
    "checked against the chain's own latest signed checkpoint only: a rewrite of the "
    "whole file, its checkpoints included, cannot be ruled out: pass --checkpoint FILE "
    "--key PUBKEY (a checkpoint saved elsewhere earlier, and the node's public key)"
)
NO_CHECKPOINT_WARNING = (
    "without a checkpoint, truncation of the chain's tail and a rewrite of the whole "
    "chain cannot be ruled out: pass --checkpoint FILE --key PUBKEY (a checkpoint saved "
    "earlier with `infervisor chain checkpoint DB --out FILE`, and the node's public key, "
    "DATA_DIR/node.pub)"
)


@click.command("verify", cls=Command)
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.option(
    "--checkpoint",
    "checkpoint_file",
    type=click.Path(path_type=Path),
    help="A checkpoint saved earlier (infervisor chain checkpoint --out): rules out "
    "truncation and rewriting up to its tree size.",
)
@click.option("--key", help=KEY_HELP + " Needed with --checkpoint.")
@click.option(
    "--proof",
    "proof_file",
    type=click.Path(path_type=Path),
    help="An inclusion or consistency proof (chain prove|consistency --json) to check.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
def verify(
    where: Path,
    checkpoint_file: Path | None,
    key: str | None,
    proof_file: Path | None,
    as_json: bool,
) -> None:
    """Verify every hash and link of the chain in WHERE.

    WHERE is the chain file, the node's data directory (holding chain.db) or
    its config file (.toml). With --checkpoint FILE --key PUBKEY the chain is
    also checked against that signed checkpoint: a chain shorter than it
    (truncated), with another root at its size (rewritten) or not extending
    it (forked) is invalid, named with the sequence number. Without one,
    stderr (and "warning" in --json) says that truncation and rewriting
    cannot be ruled out. Exit 0 when valid; 1 when not, naming the first bad
    sequence number and why; 2 when the file cannot be read.
    """
    db = chain_of(where)
    if checkpoint_file is not None and key is None:
        raise Failure(
            "--checkpoint needs --key PUBKEY (the node's public key: DATA_DIR/node.pub, "
            "or its key string) to check the signature",
            "usage",
            "--key",
        )
    try:
        report = verify_chain(db)
    except ChainError as e:
        raise Failure(str(e), "chain_unreadable") from e
    cp, against, stored = _against_checkpoint(db, report, checkpoint_file, key)
    proof = _check_proof(db, proof_file, cp) if proof_file is not None else None
    warning = NO_CHECKPOINT_WARNING if cp is None else STORED_CHECKPOINT_WARNING if stored else None
    ok = report.ok and (against is None or against["ok"]) and (proof is None or proof["ok"])
    if as_json:
        doc = msgspec.to_builtins(report)
        doc.update(ok=ok, checkpoint=against, proof=proof, warning=warning)
        echo_json(doc)
    else:
        _say_verdict(report, against, proof)
    if warning is not None and (report.ok or not as_json):  # JSON carries it in "warning"
        warn(warning)
    sys.exit(0 if ok else 1)


def _against_checkpoint(
    db: Path, report: VerifyReport, checkpoint_file: Path | None, key: str | None
) -> tuple[Checkpoint | None, dict[str, Any] | None, bool]:
    """The checkpoint checked against (--checkpoint's, else the chain's own latest
    one whose signature checks out), the verdict against it, and whether it was
    the chain's own."""
    cp = None if checkpoint_file is None else read_checkpoint(checkpoint_file, key, db)
    stored = False
    if cp is None:  # the chain's own latest checkpoint, when its signature checks out
        cp, key = _own_checkpoint(db, key)
        stored = cp is not None
    against = _against(db, report, cp, key) if cp is not None else None
    if against is not None and stored:
        against["detail"] = f"{against['detail']} (the chain's own latest checkpoint)"
    return cp, against, stored


def _own_checkpoint(db: Path, key: str | None) -> tuple[Checkpoint | None, str | None]:
    """The latest checkpoint stored in the chain that ``key`` (default: node.pub
    beside the chain) signed, and the key; (None, key) when there is none or no key.

    It catches a tail cut below it in the same file; it cannot rule out a rewrite
    of the whole file, checkpoints included (a saved checkpoint can).
    """
    if key is None:
        beside = db.parent / PUBLIC_KEY_FILE
        if not beside.is_file():
            return None, None
        key = str(beside)
    try:
        signed = verified(read_stored(db), *trusted(db, key))
    except (ChainError, Failure):
        return None, key
    return (signed[-1] if signed else None), key


def _say_verdict(
    report: VerifyReport, against: dict[str, Any] | None, proof: dict[str, Any] | None
) -> None:
    if report.ok:
        click.echo(
            f"ok: {report.events} events, node {report.node}, head seq {report.head_seq} "
            f"{report.head_hash}"
        )
    else:
        p = report.problem
        assert p is not None
        click.echo(f"INVALID at seq {p.seq}: {p.reason}: {p.detail}")
    if against is not None:
        if against["ok"]:
            click.echo(
                f"ok against checkpoint: tree size {against['tree_size']}, root "
                f"{against['root']}: seq 0..{against['tree_size'] - 1} are as signed"
            )
        else:
            click.echo(
                f"INVALID against checkpoint at seq {against['seq']}: {against['reason']}: "
                f"{against['detail']}"
            )
    if proof is not None:
        word = "ok" if proof["ok"] else "INVALID"
        click.echo(f"{word} {proof['type']} proof: {proof['detail']}")


def _against(db: Path, report: VerifyReport, cp: Checkpoint, key: str | None) -> dict[str, Any]:
    hashes = stored_hashes(db)
    earlier: list[Checkpoint] = []
    if key is not None:
        try:
            earlier = verified(read_stored(db), *trusted(db, key))
        except ChainError:
            earlier = []
    base = {"tree_size": cp.tree_size, "root": cp.root.hex(), "origin": cp.origin}
    if report.node is not None and cp.node != report.node:
        detail = f"the checkpoint is of node {cp.node!r}, the chain of {report.node!r}"
        return {**base, "ok": False, "seq": 0, "reason": "other node", "detail": detail}
    mismatch = compare(hashes, cp, earlier)
    if mismatch is None:
        return {**base, "ok": True, "seq": None, "reason": None, "detail": "as signed"}
    return {
        **base,
        "ok": False,
        "seq": mismatch.seq,
        "reason": mismatch.reason,
        "detail": mismatch.detail,
    }


def _check_proof(db: Path, path: Path, cp: Checkpoint | None) -> dict[str, Any]:
    raw = read_text(path, "--proof")
    try:
        doc = json.loads(raw)
        kind = doc["type"]
        detail = (
            _check_inclusion(db, doc, cp) if kind == "inclusion" else _check_consistency(doc, cp)
        )
    except ProofError as e:
        return {"ok": False, "type": str(doc.get("type")), "detail": str(e)}
    except (ValueError, KeyError, TypeError) as e:
        raise Failure(
            f"--proof {path}: not a proof from `infervisor chain prove|consistency --json`: {e}",
            "bad_value",
            "--proof",
        ) from e
    return {"ok": True, "type": kind, "detail": detail}


def _hexes(values: Any) -> list[bytes]:
    if not isinstance(values, list):
        raise TypeError("expected a list of hex hashes")
    return [bytes.fromhex(v) for v in values]


def _check_inclusion(db: Path, doc: dict[str, Any], cp: Checkpoint | None) -> str:
    seq, size = int(doc["leaf_index"]), int(doc["tree_size"])
    root, event = bytes.fromhex(doc["root"]), bytes.fromhex(doc["event_hash"])
    if cp is not None and (cp.tree_size != size or cp.root != root):
        raise ProofError(
            f"the proof is for tree size {size} root {root.hex()}, the checkpoint signed "
            f"{cp.tree_size} {cp.root.hex()}"
        )
    verify_inclusion(seq, size, leaf_hash(event), _hexes(doc["path"]), root)
    hashes = stored_hashes(db)
    if seq >= len(hashes) or hashes[seq] != event:
        found = hashes[seq].hex() if seq < len(hashes) else "no such event"
        raise ProofError(
            f"the chain's event at seq {seq} is {found}, the proof is of {event.hex()}"
        )
    signed = " (the checkpoint's)" if cp is not None else " (not checked against a checkpoint)"
    return f"seq {seq} ({event.hex()}) is in the tree of size {size}, root {root.hex()}{signed}"


def _check_consistency(doc: dict[str, Any], cp: Checkpoint | None) -> str:
    if doc["type"] != "consistency":
        raise ValueError(f"type {doc['type']!r}: allowed inclusion, consistency")
    old, new = int(doc["old_size"]), int(doc["new_size"])
    old_root, new_root = bytes.fromhex(doc["old_root"]), bytes.fromhex(doc["new_root"])
    if cp is not None and (cp.tree_size, cp.root) not in ((old, old_root), (new, new_root)):
        raise ProofError("the proof names neither tree head of the checkpoint")
    verify_consistency(old, new, old_root, new_root, _hexes(doc["proof"]))
    return f"the tree of size {new} extends the tree of size {old}"
