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


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        ("status --url {url} --token a --token b", "--token"),
        ("status --url {url} --timeout 5 --timeout 6", "--timeout"),
        ("stop --url {url} chat --grace 1 --grace 2", "--grace"),
        ("cordon --url {url} --reason a --reason b", "--reason"),
        ("place --url {url} --port 18001 --port 18002 --model m", "--port"),
        ("replay {db} --until 5 --until 6", "--until"),
        ("status --url {url} --url {url}", "--url"),
    ],
)
def test_a_single_valued_option_given_twice_is_usage(tmp_path: Path, argv: str, field: str) -> None:
    db = make_chain(tmp_path / "node", 9)
    ran = run(*argv.format(url=NOBODY, db=db).split(), "--json")
    assert ran.code == 2, ran
    message = f"{field} given 2 times: it takes one value (give it once)"
    assert message in ran.stderr
    assert json.loads(ran.stdout)["error"] == {"code": "usage", "message": message, "field": field}


def test_a_flag_given_twice_is_left_alone(tmp_path: Path) -> None:
    db = make_chain(tmp_path / "node", 9)
    ran = run("chain", "verify", db, "--json", "--json")
    assert ran.code == 0, ran


PLACE = ("place", "--url", NOBODY, "--role", "r", "--flavor", "llamacpp", "--model", "m")


def test_place_refuses_an_env_key_given_twice() -> None:
    ran = run(*PLACE, "--port", "18001", "--env", "A=1", "--env", "A=2")
    assert ran.code == 2, ran
    assert "--env 'A' given twice" in ran.stderr
    assert "=1" not in ran.stderr and "=2" not in ran.stderr
    assert run(*PLACE, "--port", "18001", "--env", "A=1", "--env", "B=2").code == 3


@pytest.mark.parametrize(
    ("how", "secret", "field"),
    [
        ("--token", "a\nb", "--token"),
        ("--token", "a b", "--token"),
        ("--token", "caf\u00e9", "--token"),
        ("env", "a\rb", "INFERVISOR_TOKEN"),
        ("--token-file", "a\tb", "--token-file"),
        ("--token-file", '{"operator": "a\\u0000b"}', "--token-file"),
    ],
)
def test_a_token_a_header_cannot_carry_is_a_bad_value(
    tmp_path: Path, how: str, secret: str, field: str
) -> None:
    file = tmp_path / "token"
    file.write_text(secret)
    given = {"--token": ["--token", secret], "--token-file": ["--token-file", str(file)]}
    env = {"INFERVISOR_TOKEN": secret if how == "env" else ""}
    ran = run("status", "--url", NOBODY, *given.get(how, []), "--json", env=env)
    assert ran.code == 2, ran
    named = f"--token-file {file}" if how == "--token-file" else field  # the file too
    assert f"error: {named}" in ran.stderr, ran.stderr
    assert ": a token may hold visible ASCII only" in ran.stderr, ran.stderr
    assert json.loads(ran.stdout)["error"]["code"] == "bad_value"
    assert json.loads(ran.stdout)["error"]["field"] == field


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("[1]", "JSON that is not an object of token names and secrets"),
        ('"s3cret"', "JSON that is not an object of token names and secrets"),
        ("s3cret\nsecond line\n", "more than one line"),
        ("", "it is empty"),
        ("\n \n", "it is empty"),
        ("\ufeff", "it is empty"),
        ("\ufeff\ufeffs3cret", "a token may hold visible ASCII only"),  # one BOM is dropped
    ],
)
def test_a_token_file_holding_no_one_secret_is_refused_naming_the_option_and_file(
    tmp_path: Path, content: str, why: str
) -> None:
    """Stop 35's trial: `[1]` and a second line went out as the bearer secret, an
    empty file as no token at all (the node then said 'unauthorized')."""
    file = tmp_path / "token"
    file.write_text(content, encoding="utf-8")
    ran = run("status", "--url", NOBODY, "--token-file", file, "--json")
    assert ran.code == 2, ran
    assert f"--token-file {file}: {why}" in ran.stderr, ran.stderr
    error = json.loads(ran.stdout)["error"]
    assert (error["code"], error["field"]) == ("bad_value", "--token-file")


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (
            "place --url {url} --role r --flavor llamacpp --model m --port "
            "\u0661\u0668\u0667\u0667\u0667",
            "--port",
        ),
        ("watch --url {url} --retry-for 0 --from-seq \u0661\u0666\u0660", "--from-seq"),
        ("status --url {url} --timeout \u0665", "--timeout"),
        ("stop --url {url} chat --grace \uff15", "--grace"),
        ("chain prove {db} \u0663", "SEQ"),
        ("place --url {url} --role r --flavor llamacpp --model m --port 1_8777", "--port"),
        ("stop --url {url} chat --grace 1_0", "--grace"),
    ],
)
def test_a_number_in_other_digits_is_a_bad_value(tmp_path: Path, argv: str, field: str) -> None:
    db = make_chain(tmp_path / "node", 9)
    ran = run(*argv.format(url=NOBODY, db=db).split(), "--json")
    assert ran.code == 2, ran
    assert "a number is written in ASCII digits (0-9)" in ran.stderr
    assert json.loads(ran.stdout)["error"]["code"] == "bad_value"
    assert json.loads(ran.stdout)["error"]["field"] == field


def test_replay_until_in_other_digits_is_a_bad_value(tmp_path: Path) -> None:
    from test_cli import build_chain

    db = build_chain(tmp_path / "chain.db")
    assert run("replay", db, "--until", "3").code == 0
    ran = run("replay", db, "--until", "\u0663")
    assert ran.code == 2, ran
    assert "--until '\\u0663' is neither a sequence number (ASCII digits 0-9)" in ran.stderr


def test_replay_until_a_time_before_the_first_event_is_beyond_head(tmp_path: Path) -> None:
    from test_cli import build_chain

    db = build_chain(tmp_path / "chain.db")
    ran = run("replay", db, "--until", "1970-01-01T00:00:00Z", "--json")
    assert ran.code == 1, ran
    assert "is before the chain's first event (its first event is at 2026-" in ran.stderr
    error = json.loads(ran.stdout)["error"]
    assert (error["code"], error["field"]) == ("beyond_head", "--until")


def test_an_empty_checkpoint_says_it_takes_a_file(tmp_path: Path) -> None:
    db = make_chain(tmp_path / "node", 3)
    ran = run("chain", "verify", db, "--checkpoint", "")
    assert ran.code == 2, ran
    assert "--checkpoint takes a file name" in ran.stderr


def test_a_timeout_variable_that_is_no_number_is_named_with_its_value() -> None:
    ran = run("status", "--url", NOBODY, env={"INFERVISOR_TIMEOUT": "abc"})
    assert ran.code == 2, ran
    assert "INFERVISOR_TIMEOUT='abc': allowed a number of seconds" in ran.stderr
    assert "nan" not in ran.stderr


def test_a_model_name_that_does_not_print_is_shown_escaped_only(tmp_path: Path) -> None:
    from infervisor.adapters import planning
    from infervisor.adapters.registry import ModelRegistry, RegistryError

    for look in (planning._resolve, planning._locate):
        with pytest.raises(RegistryError) as err:
            look(ModelRegistry(tmp_path), "ab\u200bc", "model")
        assert "\u200b" not in str(err.value)
        assert str(err.value).startswith("model 'ab\\u200bc': ")


def test_threads_on_another_flavor_names_the_flavor_not_the_range() -> None:
    ran = run(*PLACE[:6], "mlx-lm", "--model", "m", "--port", "18001", "--threads", "2")
    assert ran.code == 2, ran
    assert "threads 2: only a managed llama.cpp server takes threads" in ran.stderr
    assert "this one is mlx-lm, managed" in ran.stderr
    assert "allowed a whole number" not in ran.stderr


def test_threads_out_of_range_still_says_the_range() -> None:
    from infervisor.adapters.spec import Flavor, InstanceSpec, SpecError

    spec = InstanceSpec(role="r", flavor=Flavor.MLX_LM, model="m", port=18001, threads=0)
    with pytest.raises(SpecError) as err:
        spec.validate()
    assert "threads 0: allowed a whole number from 1 to" in str(err.value)
