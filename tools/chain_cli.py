"""The ``infervisor chain`` commands behind tools/cli.py's ``chain`` group.

Each function does one command's work and prints its answer (text, or one
JSON object with ``as_json``); it returns the exit status, or raises
:class:`Failure` (code from :mod:`.api.exit_codes`, message, field) for the CLI
to report through its one error path.

Checkpoints, proofs, bundles: docs/chain-format.md, sections 8 to 12.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click
import msgspec

from infervisor.chain import ChainError, VerifyReport, verify_chain
from infervisor.chain.backup import backup_chain
from infervisor.chain.bundle import export_bundle, verify_bundle
from infervisor.chain.checkpoint import (
    PUBLIC_KEY_FILE,
    Checkpoint,
    compare,
    load_verifier,
    parse_checkpoint_text,
    read_checkpoint_by,
)
from infervisor.chain.checkpoint_store import read_stored, verified
from infervisor.chain.connect import connect_reader, translated
from infervisor.chain.errors import BundleError, CheckpointError, NoteError, ProofError
from infervisor.chain.keys import KEY_ROTATED_KIND, rotations_in, trusted_keys
from infervisor.chain.merkle import (
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    root_of_hashes,
    verify_consistency,
    verify_inclusion,
)
from infervisor.chain.note import Verifier, split_note

from .cli_failure import Failure, echo_json

__all__ = [
    "NO_CHECKPOINT_WARNING",
    "Failure",
    "backup",
    "checkpoint",
    "consistency",
    "export",
    "prove",
    "verify",
    "verify_bundle_cmd",
]

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


def _warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


# ---------------------------------------------------------------- reading inputs
def _read_text(path: Path, field: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise Failure(
            f"{field} {path}: cannot read it: {e.strerror or e}", "bad_path", field
        ) from e


def _verifier(key: str) -> Verifier:
    try:
        return load_verifier(key)
    except CheckpointError as e:
        raise Failure(str(e), "bad_key", "--key") from e


def _trusted(db: Path, key: str) -> list[Verifier]:
    """``key`` and every key the chain's recorded rotations link to it (a rotation
    note is signed by both of its keys: chain/keys.py ``trusted_keys``)."""
    anchor = _verifier(key)
    try:
        conn = connect_reader(str(db), text_as_bytes=True)
        try:
            with translated(str(db), "read"):
                rows = conn.execute(
                    "SELECT kind, payload FROM events WHERE kind = ? ORDER BY seq",
                    (KEY_ROTATED_KIND,),
                ).fetchall()
        finally:
            conn.close()
    except ChainError:
        return [anchor]
    return trusted_keys(anchor, rotations_in((k, bytes(p)) for k, p in rows))


def _checkpoint(path: Path, key: str | None, db: Path) -> Checkpoint:
    """The checkpoint in FILE: its signature verified with `key` (or a key the chain's
    rotations link to it), or only parsed without one."""
    note = _read_text(path, "--checkpoint")
    try:
        if key is not None:
            return read_checkpoint_by(note, _trusted(db, key))
        text, _ = split_note(note)
        node, size, root, head = parse_checkpoint_text(text)
    except (CheckpointError, NoteError) as e:
        raise Failure(f"--checkpoint {path}: {e}", "checkpoint_invalid", "--checkpoint") from e
    return Checkpoint(node, size, root, head, note.decode("utf-8"))


def _hashes(db: Path) -> list[bytes]:
    """The stored hash of every event, seq order, one snapshot."""
    try:
        conn = connect_reader(str(db))
        try:
            with translated(str(db), "read"):
                rows = conn.execute("SELECT hash FROM events ORDER BY seq")
                return [h if isinstance(h, bytes) else b"" for (h,) in rows]  # bad: verify names
        finally:
            conn.close()
    except ChainError as e:
        raise Failure(str(e), "chain_unreadable") from e


def _matches(db: Path, hashes: list[bytes], cp: Checkpoint, field: str) -> None:
    mismatch = compare(hashes, cp)
    if mismatch is not None:
        raise Failure(f"{db} does not match {field}: {mismatch}", "checkpoint_invalid", field)


# ---------------------------------------------------------------- chain verify
def verify(
    db: Path,
    *,
    checkpoint_file: Path | None,
    key: str | None,
    proof_file: Path | None,
    as_json: bool,
) -> int:
    """``chain verify``: rows, then the checkpoint, then the proof. Returns the exit status."""
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
    cp = None if checkpoint_file is None else _checkpoint(checkpoint_file, key, db)
    stored = False
    if cp is None:  # the chain's own latest checkpoint, when its signature checks out
        cp, key = _own_checkpoint(db, key)
        stored = cp is not None
    against = _against(db, report, cp, key) if cp is not None else None
    if against is not None and stored:
        against["detail"] = f"{against['detail']} (the chain's own latest checkpoint)"
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
        _warn(warning)
    return 0 if ok else 1


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
        signed = verified(read_stored(db), *_trusted(db, key))
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
    hashes = _hashes(db)
    earlier: list[Checkpoint] = []
    if key is not None:
        try:
            earlier = verified(read_stored(db), *_trusted(db, key))
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
    raw = _read_text(path, "--proof")
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
    hashes = _hashes(db)
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


# ---------------------------------------------------------------- chain prove / consistency
def _refuse_invalid(db: Path, what: str) -> None:
    """Refuse to make ``what`` of a chain whose rows do not verify: it would prove
    the hashes as stored, not the events as they happened.

    Raises:
        Failure: ``chain_invalid`` (exit 1) naming the first bad seq, or
            ``chain_unreadable`` when the file is not a chain.
    """
    try:
        report = verify_chain(db)
    except ChainError as e:
        raise Failure(str(e), "chain_unreadable") from e
    if report.problem is not None:
        p = report.problem
        raise Failure(
            f"{db} does not verify (INVALID at seq {p.seq}: {p.reason}): {what} of it would "
            "prove the hashes as stored, not the events; see infervisor chain verify",
            "chain_invalid",
        )


def prove(db: Path, seq: int, *, checkpoint_file: Path, key: str | None, as_json: bool) -> int:
    """``chain prove``: the RFC 6962 inclusion proof of event SEQ in the checkpoint's tree."""
    cp = _checkpoint(checkpoint_file, key, db)
    if not 0 <= seq < cp.tree_size:
        raise Failure(
            f"SEQ {seq} is not covered by the checkpoint (tree size {cp.tree_size}: seq 0.."
            f"{cp.tree_size - 1})",
            "bad_value",
            "SEQ",
        )
    _refuse_invalid(db, "an inclusion proof")
    hashes = _hashes(db)
    _matches(db, hashes, cp, "--checkpoint")
    leaves = [leaf_hash(h) for h in hashes[: cp.tree_size]]
    path = inclusion_proof(leaves, seq)
    doc = {
        "type": "inclusion",
        "origin": cp.origin,
        "leaf_index": seq,
        "tree_size": cp.tree_size,
        "event_hash": hashes[seq].hex(),
        "leaf_hash": leaves[seq].hex(),
        "root": cp.root.hex(),
        "path": [p.hex() for p in path],
    }
    if as_json:
        echo_json(doc)
        return 0
    click.echo(
        f"inclusion proof (RFC 6962 PATH) of seq {seq} in {cp.origin}, tree size {cp.tree_size}"
    )
    click.echo(f"event hash  {doc['event_hash']}  (the leaf's data)")
    click.echo(f"leaf hash   {doc['leaf_hash']}  (SHA-256(0x00 || event hash))")
    click.echo(f"root        {doc['root']}")
    click.echo(f"path ({len(path)} hashes, leaf's sibling first):")
    for p in path:
        click.echo(f"  {p.hex()}")
    return 0


def consistency(db: Path, old_file: Path, new_file: Path, *, key: str | None, as_json: bool) -> int:
    """``chain consistency``: the RFC 6962 consistency proof from OLD's tree to NEW's."""
    old = _checkpoint(old_file, key, db)
    new = _checkpoint(new_file, key, db)
    if old.tree_size > new.tree_size:
        raise Failure(
            f"OLD covers {old.tree_size} events, NEW only {new.tree_size}: give the earlier first",
            "bad_value",
            "OLD",
        )
    hashes = _hashes(db)
    _matches(db, hashes, new, "NEW")
    leaves = [leaf_hash(h) for h in hashes[: new.tree_size]]
    if root_of_hashes(leaves[: old.tree_size]) != old.root:
        raise Failure(
            f"OLD's root is not the root of the chain's first {old.tree_size} events: the chain "
            "(and NEW) do not extend OLD: a fork or a rewrite since OLD was signed",
            "checkpoint_invalid",
            "OLD",
        )
    proof = consistency_proof(leaves, old.tree_size)
    doc = {
        "type": "consistency",
        "origin": new.origin,
        "old_size": old.tree_size,
        "old_root": old.root.hex(),
        "new_size": new.tree_size,
        "new_root": new.root.hex(),
        "proof": [p.hex() for p in proof],
    }
    if as_json:
        echo_json(doc)
        return 0
    click.echo(
        f"consistency proof (RFC 6962 PROOF) from tree size {old.tree_size} to {new.tree_size} "
        f"of {new.origin}"
    )
    click.echo(f"old root  {doc['old_root']}")
    click.echo(f"new root  {doc['new_root']}")
    click.echo(f"proof ({len(proof)} hashes):")
    for p in proof:
        click.echo(f"  {p.hex()}")
    return 0


# ---------------------------------------------------------------- checkpoint / backup / export
def checkpoint(db: Path, *, out: Path | None, as_json: bool) -> int:
    """``chain checkpoint``: print (or write to OUT) the latest stored checkpoint."""
    try:
        stored = read_stored(db)
    except ChainError as e:
        raise Failure(str(e), "chain_unreadable") from e
    if not stored:
        raise Failure(
            f"{db} holds no checkpoint yet: a node signs one every checkpoint_every_events "
            "events and when it stops cleanly",
            "no_checkpoint",
        )
    latest = stored[-1]
    if out is not None:
        try:
            out.write_text(latest.note, encoding="utf-8")
        except OSError as e:
            raise Failure(
                f"--out {out}: cannot write: {e.strerror or e}", "bad_path", "--out"
            ) from e
    if as_json:
        echo_json(
            {
                "tree_size": latest.tree_size,
                "ts_ns": latest.ts_ns,
                "note": latest.note,
                "out": None if out is None else str(out),
            }
        )
    elif out is None:
        click.echo(latest.note, nl=False)
    else:
        click.echo(f"checkpoint of tree size {latest.tree_size} written to {out}")
    return 0


def backup(db: Path, out: Path, *, as_json: bool) -> int:
    """``chain backup``: a consistent copy with SQLite's online backup API."""
    if out.exists():
        raise Failure(f"OUT {out} exists: a backup goes to a new file", "bad_path", "OUT")
    try:
        count = backup_chain(db, out)
    except ChainError as e:
        raise Failure(str(e), "chain_unreadable") from e
    if as_json:
        echo_json({"backup": str(out), "events": count})
    else:
        click.echo(f"backed up {count} events of {db} to {out} (SQLite online backup)")
    return 0


def export(db: Path, out: Path, *, key: str | None, as_json: bool) -> int:
    """``chain export``: write the bundle directory OUT (also of a chain that does not
    verify, as evidence: then a warning on stderr says so)."""
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
            _warn("no node.pub beside the chain: verify-bundle will need --key PUBKEY")
    try:
        problem = verify_chain(db).problem
    except ChainError:
        problem = None  # it was read just now; verify-bundle will say what is wrong
    if problem is not None:
        _warn(
            f"the chain does not verify (INVALID at seq {problem.seq}: {problem.reason}); "
            "the bundle holds it as stored, and verify-bundle will refuse it"
        )
    return 0


def verify_bundle_cmd(out: Path, *, key: str | None, as_json: bool) -> int:
    """``chain verify-bundle``: verify a bundle with no database."""
    if not (out / "manifest.json").is_file():
        raise Failure(f"{out}: not a bundle (no manifest.json)", "bad_path", "BUNDLE")
    try:
        report = verify_bundle(out, key)
    except BundleError as e:
        if as_json:
            echo_json({"ok": False, "seq": e.seq, "reason": e.reason, "detail": str(e)})
        else:
            where = f" at seq {e.seq}" if e.seq is not None else ""
            click.echo(f"INVALID{where}: {e.reason}: {e}")
        return 1
    if as_json:
        echo_json({"ok": True, **msgspec.to_builtins(report)})
    else:
        click.echo(
            f"ok: {report.events} events, node {report.node}, head seq {report.head_seq} "
            f"{report.head_hash}; {len(report.checkpoints)} checkpoints verified "
            f"(covering seq 0..{report.covered - 1})"
            if report.covered
            else f"ok: {report.events} events, node {report.node}, head seq {report.head_seq} "
            f"{report.head_hash}; no checkpoint"
        )
    if report.warning:
        _warn(report.warning)
    return 0


def rotate_key(db: Path, *, as_json: bool) -> int:
    """``chain rotate-key``: a new node key, recorded as a signed event in the chain.

    Refused while a node runs on the chain (its run lock is held): the running
    node signs checkpoints with the key it loaded.
    """
    from infervisor.chain import SqliteChain  # noqa: PLC0415
    from infervisor.chain.keys import rotate_key as rotate  # noqa: PLC0415

    from .run import LOCK_FILE, RunError, holds_no_run  # noqa: PLC0415

    try:
        holds_no_run(db.parent / LOCK_FILE)
    except RunError as e:
        raise Failure(str(e), "invalid_state") from e
    try:
        with SqliteChain.open_readonly(db) as chain:
            node_id = chain.node_id
        rotation = rotate(db, node_id, time.time_ns())
    except (ChainError, CheckpointError) as e:
        raise Failure(str(e), "chain_unreadable") from e
    if as_json:
        echo_json(
            {
                "old_key": rotation.old.key_string(),
                "new_key": rotation.new.key_string(),
                "seq": rotation.event.seq,
                "checkpoint_size": rotation.checkpoint_size,
            }
        )
    else:
        click.echo(
            f"rotated the key of {node_id}: event seq {rotation.event.seq}, signed by both keys\n"
            f"  old {rotation.old.key_string()} (kept as node.pub.{rotation.old.key_id.hex()})\n"
            f"  new {rotation.new.key_string()} (node.pub)\n"
            f"checkpoints from tree size {rotation.checkpoint_size} on are signed by the new key"
        )
    return 0
