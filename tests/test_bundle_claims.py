"""A bundle's own claims checked against what it carries (a newcomer's trial, stop 35).

Each test exports a real chain, tampers the bundle as whoever handed it out
could (the manifest is not signed: its files table is recomputed, `reseal`),
and expects verify-bundle to refuse it: exit 1, naming what disagrees.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from chain_tamper import make_chain
from click.testing import CliRunner

from infervisor.chain.note import Signer, sign_note
from infervisor.tools.cli import cli as main_cli

INDEPENDENT = Path(__file__).with_name("independent_bundle_verifier.py")


def independent(out: Path) -> tuple[int, str]:
    """The verdict of the verifier written from docs/chain-format.md alone."""
    done = subprocess.run(
        [sys.executable, str(INDEPENDENT), str(out)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    return done.returncode, done.stdout.strip()


class Verdict(NamedTuple):
    code: int
    line: str
    doc: dict[str, Any]


def verdict(out: Path, *extra: str) -> Verdict:
    """verify-bundle's text line and its --json verdict."""
    runner = CliRunner()
    text = runner.invoke(main_cli, ["chain", "verify-bundle", str(out), *extra])
    if text.exception is not None and not isinstance(text.exception, SystemExit):
        raise text.exception
    doc = runner.invoke(main_cli, ["chain", "verify-bundle", str(out), "--json", *extra])
    return Verdict(text.exit_code, text.stdout.strip(), json.loads(doc.stdout))


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    path = make_chain(tmp_path / "data", 12, every=4)
    out = tmp_path / "bundle"
    ran = CliRunner().invoke(main_cli, ["chain", "export", str(path), str(out)])
    assert ran.exit_code == 0, ran.output
    assert verdict(out).code == 0
    return out


def manifest(out: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((out / "manifest.json").read_text())
    return doc


def save(out: Path, doc: dict[str, Any]) -> None:
    (out / "manifest.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def reseal(out: Path) -> None:
    """Recompute the manifest's files table for the files now in the bundle."""
    doc = manifest(out)
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "manifest.json")
    doc["files"] = {
        p.relative_to(out).as_posix(): {
            "bytes": p.stat().st_size,
            "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
        }
        for p in files
    }
    save(out, doc)


def refused(out: Path, reason: str, *words: str, extra: tuple[str, ...] = ()) -> Verdict:
    got = verdict(out, *extra)
    assert got.code == 1, got
    assert got.doc["ok"] is False and got.doc["reason"] == reason, got.doc
    for word in words:
        assert word in got.line and word in got.doc["detail"], (word, got)
    return got


def test_an_edited_manifest_claim_is_refused_naming_field_and_values(bundle: Path) -> None:
    doc = manifest(bundle)
    head, other = doc["head_hash"], "ab" * 32
    edits: list[tuple[str, Any, tuple[str, ...]]] = [
        ("head_seq", 9, ("head_seq", "says 9", "show 11")),
        ("head_hash", other, ("head_hash", other, head)),
        ("node", "node-b", ("node", "'node-b'", "'node-a'")),
        ("checkpoints", [4, 8], ("checkpoints", "[4, 8]", "[4, 8, 12]")),
        ("key", None, ("key", "null", "node.pub")),
    ]
    for field, value, words in edits:
        save(bundle, {**doc, field: value})
        got = refused(bundle, "manifest", *words)
        assert got.line.startswith(f"INVALID: manifest: manifest.json {field}: "), got.line
        assert independent(bundle) == (1, f"bad - manifest {field}")
    save(bundle, {**doc, "events": 11})  # fewer than the lines: not a truncation
    refused(bundle, "manifest", "events", "says 11", "holds 12")
    save(bundle, {**doc, "events": 13})  # more: a line is missing
    assert refused(bundle, "truncated", "says 13", "holds 12: seq 12 is missing").doc["seq"] == 12
    save(bundle, doc)
    assert verdict(bundle).code == 0
    assert independent(bundle)[0] == 0


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("events", "26", 'events must be a whole number >= 1, found "26" (a string)'),
        ("events", True, "events must be a whole number >= 1, found true (a boolean)"),
        ("events", 0, "events must be a whole number >= 1, found 0"),
        ("head_seq", 11.0, "head_seq must be a whole number >= 0, found 11.0 (a number)"),
        ("head_hash", "AB" * 32, "head_hash must be 64 lowercase hex digits"),
        ("node", "", "node must be a non-empty string (the node id)"),
        ("checkpoints", [8, 4], "checkpoints must be a list of whole numbers >= 1, increasing"),
        ("checkpoints", "4", "checkpoints must be a list of whole numbers >= 1, increasing"),
        ("key", "other.pub", 'key must be "node.pub" or null, found "other.pub"'),
        ("format", "infervisor-bundle/2", 'format must be "infervisor-bundle/1"'),
        ("files", [], "files must be an object"),
        ("extra", 1, "unknown field 'extra' (fields: checkpoints, events, files, format"),
        ("head_seq", None, "no 'head_seq' field (a whole number >= 0)"),
    ],
)
def test_a_manifest_field_of_the_wrong_type_or_range_is_named(
    bundle: Path, field: str, value: object, words: str
) -> None:
    """Stop 35's trial: "events": "26" said 'the manifest counts 26 events,
    events.jsonl holds 26'."""
    doc = manifest(bundle)
    if value is None and field == "head_seq":
        del doc[field]
    else:
        doc[field] = value
    save(bundle, doc)
    got = refused(bundle, "manifest", f"manifest.json: {words}")
    assert "holds 26" not in got.line


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"../node.pub": {"bytes": 1, "sha256": "0" * 64}}, "'../node.pub' is not a bundle file"),
        ({"events.jsonl": {"bytes": "1", "sha256": "0" * 64}}, "files.events.jsonl.bytes must"),
        ({"events.jsonl": {"bytes": 1}}, "files.events.jsonl must be an object of"),
    ],
)
def test_a_files_entry_is_checked(bundle: Path, entry: dict[str, Any], words: str) -> None:
    doc = manifest(bundle)
    doc["files"].update(entry)
    save(bundle, doc)
    refused(bundle, "manifest", words)


def test_a_key_given_twice_is_refused(bundle: Path) -> None:
    text = (bundle / "manifest.json").read_text()
    (bundle / "manifest.json").write_text(
        text.replace('"events": 12,', '"events": 12, "events": 12,')
    )
    refused(bundle, "manifest", "manifest.json: the key 'events' is given twice")
    (bundle / "manifest.json").write_text(text)
    lines = (bundle / "events.jsonl").read_text().splitlines(keepends=True)
    lines[3] = '{"seq":99,' + lines[3][1:]  # json.loads keeps the last: 3
    (bundle / "events.jsonl").write_text("".join(lines))
    reseal(bundle)
    refused(bundle, "malformed row", "events.jsonl line 4: not an event line: the key 'seq'")


def test_an_extra_file_is_refused(bundle: Path) -> None:
    (bundle / "notes.txt").write_text("trust me\n")
    refused(bundle, "manifest", "notes.txt: in the bundle but not in the manifest's files")
    assert independent(bundle) == (1, "bad - manifest files")
    reseal(bundle)
    refused(bundle, "manifest", "files: 'notes.txt' is not a bundle file")


def test_a_checkpoint_under_another_size_is_refused(bundle: Path) -> None:
    four, eight = (bundle / "checkpoints/4.txt"), (bundle / "checkpoints/8.txt")
    a, b = four.read_bytes(), eight.read_bytes()
    four.write_bytes(b)
    eight.write_bytes(a)
    reseal(bundle)
    refused(bundle, "manifest", "checkpoints/4.txt holds the checkpoint of tree size 8")
    assert independent(bundle) == (1, "bad - manifest checkpoints")


def test_a_signature_line_of_another_key_is_refused(bundle: Path) -> None:
    """A bundle carries no cosignatures: a line that looks like a witness's would be
    read as one by a person, and verify-bundle checks none."""
    path = bundle / "checkpoints/12.txt"
    note = path.read_text()
    witness = Signer.generate("witness.example/w1")
    text = note[: note.rfind("\n\n") + 1]
    line = sign_note(text, witness).splitlines(keepends=True)[-1]
    path.write_text(note + line)
    reseal(bundle)
    refused(bundle, "checkpoint signature", "checkpoints/12.txt", "witness.example/w1")


def test_a_bundle_key_other_than_the_given_one_is_refused(bundle: Path, tmp_path: Path) -> None:
    given = (bundle / "node.pub").read_text().strip()
    other = Signer.generate("infervisor/node-a").verifier.key_string()
    (bundle / "node.pub").write_text(other + "\n")
    reseal(bundle)
    refused(bundle, "node key", "node.pub", other, extra=("--key", given))


def test_an_events_file_cut_inside_its_last_line_is_truncated(bundle: Path) -> None:
    events = bundle / "events.jsonl"
    events.write_bytes(events.read_bytes()[:-40])
    reseal(bundle)
    got = refused(bundle, "truncated", "events.jsonl ends inside line 12")
    assert got.doc["seq"] == 11
