"""``infervisor chain prove`` and ``chain consistency``: RFC 6962 inclusion and
consistency proofs of the chain's Merkle tree, for a signed checkpoint's tree
(docs/chain-format.md; any RFC 6962 verifier checks them)."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import click

from infervisor.chain.merkle import consistency_proof, inclusion_proof, leaf_hash, root_of_hashes

from ..clikit.command import Command
from ..clikit.failure import Failure, echo_json
from ..clikit.paths import KEY
from ..node.where import chain_of
from .chain_inputs import KEY_HELP, matches, read_checkpoint, refuse_invalid, stored_hashes

__all__ = ["consistency", "prove"]


@click.command("prove", cls=Command)
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.argument("seq", metavar="SEQ", type=click.IntRange(min=0))
@click.option(
    "--checkpoint",
    "checkpoint_file",
    required=True,
    type=click.Path(path_type=Path),
    metavar="FILE",
    help="The checkpoint whose tree the proof is for.",
)
@click.option(
    "--key", type=KEY, help=KEY_HELP + " When given, the checkpoint's signature is checked."
)
@click.option("--json", "as_json", is_flag=True, help="Print the proof as JSON.")
def prove(where: Path, seq: int, checkpoint_file: Path, key: str | None, as_json: bool) -> None:
    """Print the RFC 6962 inclusion proof of event SEQ in the checkpoint's tree.

    The leaves are the events' BLAKE3 hashes in seq order (docs/chain-format.md).
    The --json output is what `chain verify --proof` (and any RFC 6962
    verifier) checks. Exit 1 when the chain does not match the checkpoint.
    """
    db = chain_of(where)
    cp = read_checkpoint(checkpoint_file, key, db)
    if not 0 <= seq < cp.tree_size:
        raise Failure(
            f"SEQ {seq} is not covered by the checkpoint (tree size {cp.tree_size}: seq 0.."
            f"{cp.tree_size - 1})",
            "bad_value",
            "SEQ",
        )
    refuse_invalid(db, "an inclusion proof")
    hashes = stored_hashes(db)
    matches(db, hashes, cp, "--checkpoint")
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
        "path_base64": [_b64(p) for p in path],
    }
    if as_json:
        echo_json(doc)
        sys.exit(0)
    click.echo(
        f"inclusion proof (RFC 6962 PATH) of seq {seq} in {cp.origin}, tree size {cp.tree_size}"
    )
    click.echo(f"event hash  {doc['event_hash']}  (the leaf's data)")
    click.echo(f"leaf hash   {doc['leaf_hash']}  (SHA-256(0x00 || event hash))")
    click.echo(f"root        {doc['root']}")
    click.echo(f"path ({len(path)} hashes, leaf's sibling first):")
    for p in path:
        click.echo(f"  {p.hex()}")
    click.echo(
        "path as base64 lines (as c2sp.org/tlog-witness and tlog-tiles clients take hashes):"
    )
    for p in path:
        click.echo(_b64(p))
    sys.exit(0)


def _b64(digest: bytes) -> str:
    """A hash in standard base64 (RFC 4648, padded): a proof line of c2sp.org/tlog-witness."""
    return base64.b64encode(digest).decode("ascii")


@click.command("consistency", cls=Command)
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.argument("old", metavar="OLD", type=click.Path(path_type=Path))
@click.argument("new", metavar="NEW", type=click.Path(path_type=Path))
@click.option("--key", type=KEY, help=KEY_HELP + " When given, both signatures are checked.")
@click.option("--json", "as_json", is_flag=True, help="Print the proof as JSON.")
def consistency(where: Path, old: Path, new: Path, key: str | None, as_json: bool) -> None:
    """Print the RFC 6962 consistency proof between checkpoint files OLD and NEW.

    Exit 1 when the chain does not extend OLD or match NEW (a fork or a rewrite).
    """
    db = chain_of(where)
    old_cp = read_checkpoint(old, key, db, "OLD")
    new_cp = read_checkpoint(new, key, db, "NEW")
    if old_cp.tree_size > new_cp.tree_size:
        raise Failure(
            f"OLD covers {old_cp.tree_size} events, NEW only {new_cp.tree_size}: "
            "give the earlier first",
            "bad_value",
            "OLD",
        )
    hashes = stored_hashes(db)
    matches(db, hashes, new_cp, "NEW")
    leaves = [leaf_hash(h) for h in hashes[: new_cp.tree_size]]
    if root_of_hashes(leaves[: old_cp.tree_size]) != old_cp.root:
        raise Failure(
            f"OLD's root is not the root of the chain's first {old_cp.tree_size} events: the chain "
            "(and NEW) do not extend OLD: a fork or a rewrite since OLD was signed",
            "checkpoint_invalid",
            "OLD",
        )
    proof = consistency_proof(leaves, old_cp.tree_size)
    doc = {
        "type": "consistency",
        "origin": new_cp.origin,
        "old_size": old_cp.tree_size,
        "old_root": old_cp.root.hex(),
        "new_size": new_cp.tree_size,
        "new_root": new_cp.root.hex(),
        "proof": [p.hex() for p in proof],
        "proof_base64": [_b64(p) for p in proof],
    }
    if as_json:
        echo_json(doc)
        sys.exit(0)
    click.echo(
        f"consistency proof (RFC 6962 PROOF) from tree size {old_cp.tree_size} to "
        f"{new_cp.tree_size} of {new_cp.origin}"
    )
    click.echo(f"old root  {doc['old_root']}")
    click.echo(f"new root  {doc['new_root']}")
    click.echo(f"proof ({len(proof)} hashes):")
    for p in proof:
        click.echo(f"  {p.hex()}")
    click.echo(
        "as a witness takes it (c2sp.org/tlog-witness add-checkpoint: the old size, then "
        "one base64 hash a line, then a blank line and NEW's note):"
    )
    click.echo(f"old {old_cp.tree_size}")
    for p in proof:
        click.echo(_b64(p))
    sys.exit(0)
