"""``chain verify``'s output under a verdict that is not ok: no line that reads as
assurance (``ok: ...``, ``ok against checkpoint``, ``anchored: ...``), and --json
fields that agree with ``ok`` (the newcomer's trial of stop 31 found ``anchored:
checkpoint F at size N`` printed under INVALID). docs/chain-format.md, "Cosignatures
and the trust policy", and docs/cli.md describe the output.

Chains with signed checkpoints come from tests/chain_tamper.py; the commands run in
process (click's CliRunner).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from chain_tamper import alter_payload, make_chain, rewrite_from, truncate
from test_cli_paths import Ran, run

from infervisor.tools.audit.trust_options import NOT_VOUCHED


class Saved(NamedTuple):
    db: Path
    key: Path
    checkpoint: Path
    proof: Path


@pytest.fixture
def saved(tmp_path: Path) -> Saved:
    """A chain of 12 events, its checkpoint and an inclusion proof saved off the node."""
    db = make_chain(tmp_path / "node", 12, every=4)
    checkpoint = tmp_path / "saved.checkpoint"
    assert run("chain", "checkpoint", db, "--out", checkpoint).code == 0
    proof = tmp_path / "proof.json"
    made = run("chain", "prove", db, "3", "--checkpoint", checkpoint, "--json")
    assert made.code == 0, made
    proof.write_text(made.stdout)
    return Saved(db, db.parent / "node.pub", checkpoint, proof)


def _rows_altered(s: Saved) -> None:
    alter_payload(s.db, 5)


def _rewritten(s: Saved) -> None:
    rewrite_from(s.db, 6)


def _truncated(s: Saved) -> None:
    truncate(s.db, 9)


def _proof_forged(s: Saved) -> None:
    doc = json.loads(s.proof.read_text())
    doc["path"][0] = "00" * 32
    s.proof.write_text(json.dumps(doc))


#: name -> (what is done to the saved chain or proof, the JSON "problem" reason or None)
FAULTS: dict[str, tuple[Callable[[Saved], None], str | None]] = {
    "rows altered": (_rows_altered, "payload altered"),
    "rewritten": (_rewritten, "rewritten"),
    "truncated": (_truncated, "truncated"),
    "proof forged": (_proof_forged, None),
}
ASSURANCE = ("ok", "anchored")


def _verify(s: Saved, *extra: str) -> Ran:
    return run(
        "chain", "verify", s.db, "--checkpoint", s.checkpoint, "--key", s.key,
        "--proof", s.proof, *extra,
    )  # fmt: skip


@pytest.mark.parametrize("fault", list(FAULTS))
def test_an_invalid_verdict_prints_no_line_that_reads_as_assurance(
    saved: Saved, fault: str
) -> None:
    FAULTS[fault][0](saved)
    ran = _verify(saved)
    assert ran.code == 1, ran
    lines = ran.stdout.splitlines()
    assert lines[0].startswith("INVALID"), lines
    assert not [line for line in lines if line.startswith(ASSURANCE)], lines
    assert lines[-1] == NOT_VOUCHED
    assert lines[-2].startswith("as stored: ")  # what was read, vouching for nothing


@pytest.mark.parametrize("fault", list(FAULTS))
def test_an_invalid_verdicts_json_agrees_with_it(saved: Saved, fault: str) -> None:
    change, reason = FAULTS[fault]
    change(saved)
    ran = _verify(saved, "--json")
    assert ran.code == 1, ran
    doc: dict[str, Any] = json.loads(ran.stdout)
    assert doc["ok"] is False
    assert doc["anchor"] == NOT_VOUCHED and not doc["anchor"].startswith("anchored")
    if reason is None:  # the chain verifies; the proof does not
        assert doc["problem"] is None and doc["proof"]["ok"] is False
    else:  # the first failure is the chain's problem, whichever check found it
        assert doc["problem"]["reason"] == reason


def test_a_valid_verdict_still_says_ok_and_anchored(saved: Saved) -> None:
    ran = _verify(saved)
    assert ran.code == 0, ran
    lines = ran.stdout.splitlines()
    assert lines[0].startswith("ok: 12 events")
    assert "ok against checkpoint: tree size 12: seq 0..11 are as signed" in lines
    assert lines[-1] == f"anchored: checkpoint {saved.checkpoint.name} at size 12"
    doc = json.loads(_verify(saved, "--json").stdout)
    assert (doc["ok"], doc["problem"], doc["anchor"]) == (True, None, lines[-1])


def test_audit_of_an_invalid_chain_is_not_anchored(saved: Saved) -> None:
    alter_payload(saved.db, 5)
    ran = run("audit", saved.db, "--json")
    assert ran.code == 1
    assert json.loads(ran.stdout)["anchor"] == NOT_VOUCHED
    assert run("audit", saved.db).stderr.splitlines()[-1] == NOT_VOUCHED


def test_the_documents_give_the_line() -> None:
    docs = Path(__file__).parents[1] / "docs"
    for name in ("chain-format.md", "cli.md"):
        assert f"`{NOT_VOUCHED}`" in (docs / name).read_text(), name


# ---------------------------------------------------------------- stop 32's trial
def test_as_stored_says_what_the_file_holds_and_how_far_it_verified(tmp_path: Path) -> None:
    """A payload altered at seq 13 of 57 events: the line under INVALID counted only
    the 13 that verified ("13 events, head seq 12"); it says the file holds 57."""
    db = make_chain(tmp_path / "node", 57, every=100)
    alter_payload(db, 13)
    ran = run("chain", "verify", db)
    assert ran.code == 1, ran
    (stored,) = [line for line in ran.stdout.splitlines() if line.startswith("as stored: ")]
    assert stored.startswith("as stored: 57 events, head seq 56; verified seq 0..12 (13 events)")
    doc = json.loads(run("chain", "verify", db, "--json").stdout)
    assert (doc["events"], doc["head_seq"]) == (13, 12)  # how far the rows verified
    assert doc["stored"] == {"events": 57, "head_seq": 56}  # what the file holds


def test_audit_of_a_chain_that_does_not_verify_audits_only_what_verified(
    tmp_path: Path,
) -> None:
    """``audit`` printed "N findings" of rows after the first bad one, which no check
    vouches for: it audits seq 0..12 and says the other 44 were not audited."""
    db = make_chain(tmp_path / "node", 57, every=100)
    alter_payload(db, 13)
    ran = run("audit", db)
    assert ran.code == 1, ran
    lines = ran.stdout.splitlines()
    assert lines[0].startswith("INVALID chain at seq 13: payload altered")
    assert lines[1].endswith(
        "only seq 0..12, the 13 events that verified, 12 findings; the other 44 of the "
        "57 events the file holds are not audited"
    ), lines
    assert all(int(line.split()[1]) < 13 for line in lines[2:]), lines  # no later row's
    doc = json.loads(run("audit", db, "--json").stdout)
    assert (doc["ok"], doc["events"], doc["stored_events"]) == (False, 13, 57)
    assert max(f["seq"] for f in doc["findings"]) == 12


def test_audit_of_a_truncated_chain_audits_what_is_left_and_says_what_is_not(
    tmp_path: Path,
) -> None:
    db = make_chain(tmp_path / "node", 20, every=4)
    truncate(db, 13)
    ran = run("audit", db)
    assert ran.code == 1, ran
    lines = ran.stdout.splitlines()
    assert lines[0].startswith("INVALID against its checkpoints at seq 13: truncated")
    assert lines[1].endswith(
        "13 events, 12 findings (every event the file holds; the events it lost cannot be audited)"
    ), lines


def test_audit_with_no_verified_event_makes_no_audit(tmp_path: Path) -> None:
    db = make_chain(tmp_path / "node", 8, every=100)
    alter_payload(db, 0)
    ran = run("audit", db)
    assert ran.code == 1, ran
    assert (
        "none made: the chain does not verify from seq 0 on (the file holds 8 events)" in ran.stdout
    )
    assert "findings" not in ran.stdout


def test_a_keyed_fork_names_the_range_and_the_checkpoints_that_bound_it(
    tmp_path: Path,
) -> None:
    """A chain whose one signed checkpoint (size 58) it no longer matches: the headline
    read "at seq 0" and "checkpoints of sizes none and 58"; it names seq 0..57 and the
    checkpoint it fails against. With checkpoints every 8 events it names the two that
    bound the change (a rewrite from seq 30: the chain matches 24, fails 32)."""
    db = make_chain(tmp_path / "one", 58, every=100)
    rewrite_from(db, 30)
    ran = run("chain", "verify", db)
    assert ran.code == 1, ran
    head = ran.stdout.splitlines()[0]
    assert head.startswith("INVALID against checkpoint in seq 0..57: rewritten: "), head
    assert "none" not in head and "at seq 0" not in head
    assert "does not match the checkpoint of size 58, and no smaller checkpoint" in head
    doc = json.loads(run("chain", "verify", db, "--json").stdout)
    assert (doc["checkpoint"]["seq"], doc["checkpoint"]["last_seq"]) == (0, 57)
    audit = run("audit", db)
    assert audit.stdout.startswith("INVALID against its checkpoints in seq 0..57: rewritten")
    assert "none made: the chain fails against its checkpoints from seq 0 on" in audit.stdout

    db = make_chain(tmp_path / "every", 58, every=8)
    rewrite_from(db, 30)
    head = run("chain", "verify", db).stdout.splitlines()[0]
    assert head.startswith("INVALID against checkpoint in seq 24..31: "), head
    assert "the chain matches the checkpoint of size 24 and not the one of size 32" in head
