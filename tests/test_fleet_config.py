"""The fleet file: a bad entry is one line naming it and its key, exit 2, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import cli_here

from infervisor.chain.note import Signer

GOOD = {"name": "n1", "url": "http://127.0.0.1:7070", "token": "s3cret", "pub": "n1.pub"}


def fleet_file(tmp_path: Path, *nodes: dict[str, object], head: str = "") -> Path:
    (tmp_path / "n1.pub").write_text(Signer.generate("infervisor/n1").verifier.key_string() + "\n")
    (tmp_path / "junk.pub").write_text("not a key\n")
    (tmp_path / "n1.key").write_text(Signer.generate("infervisor/n1").key_string() + "\n")
    text = head
    for node in nodes:
        text += "\n[[nodes]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in node.items())
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("second", "head", "needle"),
    [
        ({**GOOD, "name": "n2", "url": "ftp://x"}, "", "[[nodes]] #2 url: 'ftp://x'"),
        ({**GOOD, "name": "n2", "pub": "nope.pub"}, "", "[[nodes]] #2 pub: "),
        ({**GOOD, "name": "n2", "pub": "junk.pub"}, "", "junk.pub: verifier key must be"),
        # stop 34: a node's private key where its public key is expected was taken
        ({**GOOD, "name": "n2", "pub": "n1.key"}, "", "#2 pub: {tmp}/n1.key: is a PRIVATE"),
        ({**GOOD, "name": "n2", "colour": 1}, "", "[[nodes]] #2 colour: unknown key"),
        ({**GOOD}, "", "[[nodes]] #2 name: 'n1' is given twice"),
        ({**GOOD, "name": "n 2"}, "", "[[nodes]] #2 name: 'n 2'"),
        ({"name": "n2", "url": GOOD["url"], "token": "x"}, "", "[[nodes]] #2 pub: missing"),
        ({**GOOD, "name": "n2", "token_file": "t"}, "", "give token or token_file, not both"),
        # stop 35: a token no Authorization header can carry was taken
        ({**GOOD, "name": "n2", "token": "s3\ncret"}, "", "#2 token: a token may hold visible"),
        ({**GOOD, "name": "n2"}, '[fleet]\nmetrics = "nowhere"\n', "[fleet] metrics: 'nowhere'"),
        ({**GOOD, "name": "n2"}, "[fleet]\ncheck_interval_s = 0\n", "[fleet] check_interval_s"),
        ({**GOOD, "name": "n2"}, "[fleets]\n", "unknown table 'fleets'"),
    ],
)
def test_a_bad_entry_is_one_line_naming_it(
    tmp_path: Path, second: dict[str, object], head: str, needle: str
) -> None:
    path = fleet_file(tmp_path, GOOD, second, head=head)
    ran = cli_here("fleet", "status", path)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert needle.format(tmp=tmp_path) in ran.stderr, ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1, ran.stderr
    if "PRIVATE" in needle:  # the public file to use instead, and the key's public line
        assert "name its public half (the line infervisor/n1+" in ran.stderr
    assert "Traceback" not in ran.stderr


def test_json_errors_are_one_object(tmp_path: Path) -> None:
    path = fleet_file(tmp_path, {**GOOD, "url": "x"})
    ran = cli_here("fleet", "check", path, "--json")
    assert ran.returncode == 2
    error = json.loads(ran.stdout)["error"]
    assert error["code"] == "bad_config"
    assert "[[nodes]] #1 url" in error["message"]


def test_no_nodes_and_no_file_are_usage_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty.toml"
    empty.write_text("[fleet]\n")
    assert "at least one node" in cli_here("fleet", "status", empty).stderr
    missing = cli_here("fleet", "status", tmp_path / "missing.toml")
    assert missing.returncode == 2
    assert "cannot read it" in missing.stderr


def test_a_node_that_does_not_answer_is_shown_and_exits_3(tmp_path: Path) -> None:
    path = fleet_file(tmp_path, {**GOOD, "url": "http://127.0.0.1:9"})
    ran = cli_here("fleet", "status", path, "--json", "--timeout", "5")
    assert ran.returncode == 3, ran.stderr
    (node,) = json.loads(ran.stdout)["nodes"]
    assert (node["node"], node["up"]) == ("n1", False)
    assert node["error"]


def test_an_api_tokens_file_gives_a_read_and_a_control_token(tmp_path: Path) -> None:
    from infervisor.tools.fleet.config import load_config

    (tmp_path / "tokens.json").write_text(json.dumps({"operator": "op", "controller": "ctl"}))
    node = {**GOOD, "token_file": "tokens.json"}
    del node["token"]
    entry = load_config(fleet_file(tmp_path, node)).nodes[0]
    assert (entry.token, entry.control_token) == ("op", "ctl")


#: Tokens no Authorization header can carry: a control character (CR, LF), a space,
#: a character beyond ASCII (an invisible one too).
UNSENDABLE = ["s3\ncret", "s3\rcret", "s3 cret", "s3\x01cret", "s3\x7fcret", "s3\u200bcret"]


@pytest.mark.parametrize("secret", UNSENDABLE)
def test_a_token_no_header_can_carry_is_refused_at_load_naming_its_key(
    tmp_path: Path, secret: str
) -> None:
    """A trial (stop 35): the fleet sent its config's tokens as they were; one holding
    a newline broke its Authorization header at the first request. The command line's
    --token is checked the same way (tools/netkit/bearer.py)."""
    from infervisor.tools.fleet.config import FleetConfigError, load_config

    (tmp_path / "bare").write_text(secret + "\n")
    (tmp_path / "tokens.json").write_text(json.dumps({"operator": "op", "controller": secret}))
    bare = {**GOOD, "token_file": "bare"}
    api = {**GOOD, "token_file": "tokens.json"}
    del bare["token"], api["token"]
    why = (
        "a token may hold visible ASCII only (letters, digits, punctuation; no spaces, "
        f"controls or other characters), found {secret[2]!a}"
    )
    for node, key in [
        ({**GOOD, "token": secret}, "token"),
        (api, f"token_file: {tmp_path / 'tokens.json'}: token 'controller'"),
    ]:
        with pytest.raises(FleetConfigError) as refused:
            load_config(fleet_file(tmp_path, node))
        assert str(refused.value) == f"{tmp_path / 'fleet.toml'}: [[nodes]] #1 {key}: {why}"
    # a bare secret's file is read as the command line reads it: a CR or LF is a second line
    with pytest.raises(FleetConfigError) as refused:
        load_config(fleet_file(tmp_path, bare))
    said = "more than one line" if secret[2] in "\r\n" else why
    assert f"[[nodes]] #1 token_file: {tmp_path / 'bare'}: {said}" in str(refused.value)


@pytest.mark.parametrize(
    ("content", "refused"),
    [(b"\xef\xbb\xbfs3cret\n", None), (b"", "it is empty"), (b"[1]", "JSON that is not an object")],
)
def test_a_token_file_is_read_as_the_command_line_reads_it(
    tmp_path: Path, content: bytes, refused: str | None
) -> None:
    """One reading of a token file (tools/netkit/bearer.py): a leading BOM dropped, an
    empty file or JSON other than an object refused (stop 35's trial; before, the
    BOM went out in the header and an empty file as no token)."""
    from infervisor.tools.fleet.config import FleetConfigError, load_config

    (tmp_path / "token").write_bytes(content)
    node = {**GOOD, "token_file": "token"}
    del node["token"]
    if refused is None:
        entry = load_config(fleet_file(tmp_path, node)).nodes[0]
        assert (entry.token, entry.control_token) == ("s3cret", "s3cret")
        return
    with pytest.raises(FleetConfigError, match=f"token_file: .*token: {refused}"):
        load_config(fleet_file(tmp_path, node))
