"""Values the command line refuses before it sends or reads anything (a newcomer's
trial, stop 34): a private signing key as a bearer token, options given twice, a
token a header cannot carry, non-ASCII digits, a replay time before the first event.

The commands run in process (click's CliRunner); ``--url`` names a port nobody
listens on, so a value that got through would read as exit 3 (unreachable).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import pytest
from chain_tamper import make_chain
from click.testing import CliRunner

from infervisor.tools.cli import cli as main_cli

NOBODY = "http://127.0.0.1:9"  # the discard port: nothing answers there


class Ran(NamedTuple):
    code: int
    stdout: str
    stderr: str


def run(*args: object, env: dict[str, str] | None = None) -> Ran:
    result = CliRunner().invoke(main_cli, [str(a) for a in args], env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a traceback: what is refused here
    return Ran(result.exit_code, result.stdout, result.stderr)


@pytest.fixture
def node_key(tmp_path: Path) -> Path:
    db = make_chain(tmp_path / "node", 3)
    return db.parent / "node.key"


@pytest.mark.parametrize(
    ("how", "field"),
    [
        ("--token-file", "--token-file"),
        ("--token", "--token"),
        ("env", "INFERVISOR_TOKEN"),
    ],
)
def test_a_private_key_is_never_sent_as_a_token(node_key: Path, how: str, field: str) -> None:
    secret = node_key.read_text()
    assert secret.startswith("PRIVATE+KEY+")
    given: list[object] = {"--token-file": [how, node_key], "--token": [how, secret]}.get(how, [])
    env = {"INFERVISOR_TOKEN": secret} if how == "env" else {"INFERVISOR_TOKEN": ""}
    ran = run("status", "--url", NOBODY, *given, "--json", env=env)
    assert ran.code == 2, ran
    assert "PRIVATE signing key" in ran.stderr
    assert "token file holds" in ran.stderr
    assert secret.strip() not in ran.stderr + ran.stdout
    assert json.loads(ran.stdout)["error"] == {
        "code": "bad_value",
        "message": ran.stderr.removeprefix("error: ").strip(),
        "field": field,
    }


def test_chain_pull_refuses_a_private_key_token(node_key: Path, tmp_path: Path) -> None:
    ran = run("chain", "pull", NOBODY, tmp_path / "pulled", "--token-file", node_key)
    assert ran.code == 2, ran
    assert "--token-file" in ran.stderr and "PRIVATE" in ran.stderr
    assert not (tmp_path / "pulled").exists()
