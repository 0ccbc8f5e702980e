"""Every file or directory the auditor's commands are given: missing, a directory
where a file is wanted (or a file where a directory is), or unreadable, is refused
with exit 2, naming the option or argument and saying which, never a traceback
(tools/clikit/paths.py; the newcomer's trial of stop 31 found ``chain verify --key
/missing`` reporting how a key string is spelt).

The commands run in process (click's CliRunner) on a small chain with signed
checkpoints (tests/chain_tamper.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

import pytest
from chain_tamper import make_chain
from click.testing import CliRunner

from infervisor.tools.cli import cli as main_cli


class Ran(NamedTuple):
    code: int
    stdout: str
    stderr: str


def run(*args: object) -> Ran:
    result = CliRunner().invoke(main_cli, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a traceback: what is refused here
    return Ran(result.exit_code, result.stdout, result.stderr)


class Chain(NamedTuple):
    db: Path
    pub: Path
    cp: Path


@pytest.fixture
def chain(tmp_path: Path) -> Chain:
    db = make_chain(tmp_path / "node", 9, every=4)
    cp = tmp_path / "saved.checkpoint"
    assert run("chain", "checkpoint", db, "--out", cp).code == 0
    return Chain(db, db.parent / "node.pub", cp)


#: (name, the command line with BAD where the path goes, the field named, file or dir)
CASES = [
    ("verify --key", "chain verify {db} --key BAD", "--key", "file"),
    (
        "verify --checkpoint",
        "chain verify {db} --checkpoint BAD --key {pub}",
        "--checkpoint",
        "file",
    ),
    ("verify --proof", "chain verify {db} --proof BAD", "--proof", "file"),
    ("prove --checkpoint", "chain prove {db} 1 --checkpoint BAD", "--checkpoint", "file"),
    ("prove --key", "chain prove {db} 1 --checkpoint {cp} --key BAD", "--key", "file"),
    ("consistency OLD", "chain consistency {db} BAD {cp}", "OLD", "file"),
    ("consistency NEW", "chain consistency {db} {cp} BAD", "NEW", "file"),
    ("consistency --key", "chain consistency {db} {cp} {cp} --key BAD", "--key", "file"),
    ("export --key", "chain export {db} {tmp}/bundle --key BAD", "--key", "file"),
    ("verify-bundle --key", "chain verify-bundle {tmp}/bundle --key BAD", "--key", "file"),
    ("verify-bundle BUNDLE", "chain verify-bundle BAD", "BUNDLE", "dir"),
    ("pull --key", "chain pull {url} {tmp}/pulled --key BAD", "--key", "file"),
    (
        "pull --token-file",
        "chain pull {url} {tmp}/pulled --token-file BAD",
        "--token-file",
        "file",
    ),
    ("pull DIR", "chain pull {url} BAD", "DIR", "dir"),
]
MISSING = {"file": "no such file", "dir": "no such directory"}
WRONG_KIND = {"file": "is a directory, not a file", "dir": "is a file, not a directory"}


def _argv(template: str, chain: Chain, bad: Path) -> list[str]:
    values = {
        "db": chain.db,
        "pub": chain.pub,
        "cp": chain.cp,
        "tmp": chain.db.parent.parent,
        "url": "http://127.0.0.1:9",
    }
    return [str(bad) if w == "BAD" else w.format(**values) for w in template.split()]


def _refused(ran: Ran, field: str, needle: str) -> None:
    assert ran.code == 2, ran
    assert field in ran.stderr and needle in ran.stderr, ran.stderr
    assert "Traceback" not in ran.stderr


@pytest.fixture
def bundle(chain: Chain) -> Path:
    out = chain.db.parent.parent / "bundle"
    assert run("chain", "export", chain.db, out).code == 0
    return out


#: pull makes its DIR when it is missing
READ = [c for c in CASES if c[0] != "pull DIR"]


@pytest.mark.parametrize(("name", "template", "field", "kind"), READ, ids=[c[0] for c in READ])
def test_a_missing_path_is_named_missing(
    chain: Chain, bundle: Path, tmp_path: Path, name: str, template: str, field: str, kind: str
) -> None:
    if name == "export --key":
        bundle.rename(tmp_path / "old-bundle")  # export wants a new directory
    _refused(run(*_argv(template, chain, tmp_path / "missing")), field, MISSING[kind])


@pytest.mark.parametrize(("name", "template", "field", "kind"), CASES, ids=[c[0] for c in CASES])
def test_a_path_of_the_wrong_kind_says_so(
    chain: Chain, bundle: Path, tmp_path: Path, name: str, template: str, field: str, kind: str
) -> None:
    if name == "export --key":
        bundle.rename(tmp_path / "old-bundle")
    wrong = tmp_path / "a-dir"
    if kind == "file":
        wrong.mkdir()
    else:
        wrong.write_text("not a directory\n")
    _refused(run(*_argv(template, chain, wrong)), field, WRONG_KIND[kind])


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
@pytest.mark.parametrize(
    ("name", "template", "field", "kind"),
    [c for c in CASES if c[3] == "file"],
    ids=[c[0] for c in CASES if c[3] == "file"],
)
def test_an_unreadable_file_says_so(
    chain: Chain, bundle: Path, tmp_path: Path, name: str, template: str, field: str, kind: str
) -> None:
    if name == "export --key":
        bundle.rename(tmp_path / "old-bundle")
    locked = tmp_path / "locked"
    locked.write_text("secret\n")
    locked.chmod(0)
    _refused(run(*_argv(template, chain, locked)), field, "cannot read it")


def test_a_missing_key_file_is_a_path_error_in_json_too(chain: Chain, tmp_path: Path) -> None:
    ran = run("chain", "verify", chain.db, "--key", tmp_path / "missing", "--json")
    assert ran.code == 2
    error = json.loads(ran.stdout)["error"]
    assert (error["code"], error["field"]) == ("bad_path", "--key")
    assert "no such file" in error["message"]


def test_a_key_string_and_a_key_file_are_both_still_keys(chain: Chain) -> None:
    key = chain.pub.read_text().strip()
    assert "/" in key  # a key string's name may hold a slash: the shape is the two "+"
    assert run("chain", "verify", chain.db, "--key", key).code == 0
    assert run("chain", "verify", chain.db, "--key", chain.pub).code == 0
    bad = run("chain", "verify", chain.db, "--key", "n+0123abcd+bm90IGEga2V5")
    assert bad.code == 2 and "--key" in bad.stderr and "no such file" not in bad.stderr


def test_a_backup_into_a_file_is_refused_naming_out(chain: Chain, tmp_path: Path) -> None:
    a_file = tmp_path / "plain"
    a_file.write_text("x\n")
    _refused(run("chain", "backup", chain.db, a_file / "copy.db"), "OUT", "is a file")
    _refused(run("chain", "backup", chain.db, tmp_path / "no" / "copy.db"), "OUT", "no such")


@pytest.mark.parametrize("command", ["chain verify", "replay", "events", "audit"])
def test_where_names_itself_when_it_names_nothing(tmp_path: Path, command: str) -> None:
    _refused(run(*command.split(), tmp_path / "missing"), "WHERE", "no such chain file")
    empty = tmp_path / "empty"
    empty.mkdir()
    _refused(run(*command.split(), empty), "WHERE", "no such chain file")


EMPTY = [*CASES, ("verify --witness", "chain verify {db} --witness BAD", "--witness", "file")]


@pytest.mark.parametrize(("name", "template", "field", "kind"), EMPTY, ids=[c[0] for c in EMPTY])
def test_an_empty_path_is_usage_naming_the_option(
    chain: Chain, name: str, template: str, field: str, kind: str
) -> None:
    """Stop 34's trial: ``--witness ""`` was read as the current directory (Path("")
    is "."); an empty value is refused before it becomes one, as bad_path (exit 2)."""
    argv = [w.format(db=chain.db, pub=chain.pub, cp=chain.cp, tmp=chain.db.parent.parent,
                     url="http://127.0.0.1:9") for w in template.split()]  # fmt: skip
    argv = ["" if w == "BAD" else w for w in argv]
    _refused(run(*argv), field, f"an empty value: {field} takes ")
    as_json = run(*argv, "--json") if "--json" not in argv and name != "pull DIR" else None
    if as_json is not None and as_json.stdout.startswith("{"):
        error = json.loads(as_json.stdout)["error"]
        assert error["code"] == "bad_path" and error["field"] == field, error


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        ("chain verify {db} --checkpoint {cp} --checkpoint {cp} --key {pub}", "--checkpoint"),
        ("chain verify {db} --key {pub} --key {pub}", "--key"),
        ("replay {db} --checkpoint {cp} --key {pub} --checkpoint {cp}", "--checkpoint"),
        ("chain prove {db} 1 --checkpoint {cp} --checkpoint {cp}", "--checkpoint"),
    ],
)
def test_a_path_option_given_twice_is_usage_naming_it(chain: Chain, argv: str, field: str) -> None:
    """Stop 34's trial: ``--checkpoint A --checkpoint B`` checked B alone, silently."""
    words = argv.format(db=chain.db, pub=chain.pub, cp=chain.cp).split()
    ran = run(*words)
    assert ran.code == 2, ran
    assert f"{field} given 2 times: it takes one value" in ran.stderr, ran.stderr
    doc = json.loads(run(*words, "--json").stdout)
    assert doc["error"] == {
        "code": "usage",
        "message": f"{field} given 2 times: it takes one value (give it once)",
        "field": field,
    }
    twice = run("chain", "verify", chain.db, "--witness", "a+b+c", "--witness", "d+e+f")
    assert "given 2 times" not in twice.stderr  # --witness is repeatable


KEYED = [
    "chain verify {db} --key BAD",
    "chain verify {db} --checkpoint {cp} --key BAD",
    "chain prove {db} 1 --checkpoint {cp} --key BAD",
    "chain consistency {db} {cp} {cp} --key BAD",
    "chain export {db} {tmp}/out --key BAD",
    "chain verify-bundle {tmp}/bundle --key BAD",
    "chain pull http://127.0.0.1:9 {tmp}/pulled --key BAD",
    "audit {db} --checkpoint {cp} --key BAD",
]


@pytest.mark.parametrize("template", KEYED)
@pytest.mark.parametrize("content", ["twice", "none", "junk"])
def test_every_key_file_error_names_the_option(
    chain: Chain, bundle: Path, tmp_path: Path, template: str, content: str
) -> None:
    """Stop 34's trial: "two.pub holds 2 keys" named no option, and verify-bundle
    read a bad --key as the bundle's missing key (exit 1)."""
    key = chain.pub.read_text().strip()
    bad = tmp_path / f"{content}.pub"
    bad.write_text(
        {"twice": f"{key}\n{key}\n", "none": "# only a comment\n", "junk": "junk\n"}[content]
    )
    ran = run(*_argv(template, chain, bad))
    assert ran.code == 2, ran
    assert f"error: --key {bad}: " in ran.stderr, ran.stderr
    assert "Traceback" not in ran.stderr


@pytest.mark.parametrize("argv", [["status", ""], ["stop", "", "chat"], ["logs", "", "chat"]])
def test_an_empty_where_of_an_operator_verb_is_refused(argv: list[str]) -> None:
    """As ``--witness ""`` (stop 34): an empty WHERE was read as the current directory."""
    ran = run(*argv)
    assert ran.code == 2, ran
    assert "an empty WHERE: give the node's data directory" in ran.stderr, ran.stderr
