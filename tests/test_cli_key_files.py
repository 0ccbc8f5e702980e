"""What ``--key`` and ``--checkpoint`` say of a file that is not what they take
(tools/clikit/key_shapes.py): a newcomer's trial (stop 33).

- The two swapped (the checkpoint given to ``--key``, node.pub to
  ``--checkpoint``) read "'ascii' codec can't decode ...": each now says what
  the file looks like it is and asks whether they were swapped.
- A malformed checkpoint file exited 1 where a malformed key file exited 2:
  both are the caller's input, a usage error (2, docs/cli.md "Exit status");
  a well-formed checkpoint the key does not verify stays ``checkpoint_invalid`` (1).
- ``--key node.key``, the node's PRIVATE signing key, was taken without a word:
  it is refused (2), pointing to the verifier key, DATA_DIR/node.pub.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli_paths import Chain, Ran, chain, run

__all__ = ["chain"]  # the fixture, shared with test_cli_paths

#: Readers that share chain verify's trust options (tools/audit/trust_options.py) and
#: take --json (events prints JSON Lines; replay would first refuse these test
#: chains as unreplayable: the options are one declaration either way).
READERS = [("chain", "verify"), ("audit",)]


def _error(ran: Ran) -> dict[str, str]:
    body: dict[str, str] = json.loads(ran.stdout)["error"]
    return body


def _plain(ran: Ran) -> None:
    """No traceback and none of Python's own words passed through."""
    said = ran.stdout + ran.stderr
    for words in ("Traceback", "codec", "ordinal not in range", "position"):
        assert words not in said, said


@pytest.mark.parametrize("command", READERS, ids=[" ".join(c) for c in READERS])
def test_checkpoint_and_key_swapped_say_so(chain: Chain, command: tuple[str, ...]) -> None:
    ran = run(*command, chain.db, "--checkpoint", chain.pub, "--key", chain.cp, "--json")
    assert ran.code == 2, ran
    _plain(ran)
    assert _error(ran)["code"] == "bad_key"
    assert _error(ran)["field"] == "--key"
    assert (
        f"{chain.cp} is a checkpoint (a signed note), not a verifier key; did you swap "
        "--checkpoint and --key?"
    ) in ran.stderr


@pytest.mark.parametrize("command", READERS, ids=[" ".join(c) for c in READERS])
def test_a_key_given_as_the_checkpoint_says_so(chain: Chain, command: tuple[str, ...]) -> None:
    ran = run(*command, chain.db, "--checkpoint", chain.pub, "--key", chain.pub, "--json")
    assert ran.code == 2, ran
    _plain(ran)
    assert (_error(ran)["code"], _error(ran)["field"]) == ("bad_value", "--checkpoint")
    assert (
        f"--checkpoint {chain.pub} is a verifier key (a node.pub), not a checkpoint; did you "
        "swap --checkpoint and --key?"
    ) in ran.stderr


@pytest.mark.parametrize("command", READERS, ids=[" ".join(c) for c in READERS])
def test_a_malformed_checkpoint_exits_2_as_a_malformed_key_does(
    chain: Chain, tmp_path: Path, command: tuple[str, ...]
) -> None:
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("this is no checkpoint\n")
    bad_cp = run(*command, chain.db, "--checkpoint", garbage, "--key", chain.pub, "--json")
    bad_key = run(*command, chain.db, "--checkpoint", chain.cp, "--key", garbage, "--json")
    assert (bad_cp.code, bad_key.code) == (2, 2), (bad_cp, bad_key)
    assert (_error(bad_cp)["code"], _error(bad_cp)["field"]) == ("bad_value", "--checkpoint")
    assert f"--checkpoint {garbage}: not a checkpoint" in bad_cp.stderr
    assert "infervisor chain checkpoint WHERE --out FILE" in bad_cp.stderr
    _plain(bad_cp)


def test_a_binary_file_is_no_key_and_no_checkpoint(chain: Chain) -> None:
    as_key = run("chain", "verify", chain.db, "--checkpoint", chain.cp, "--key", chain.db)
    as_cp = run("chain", "verify", chain.db, "--checkpoint", chain.db, "--key", chain.pub)
    assert (as_key.code, as_cp.code) == (2, 2), (as_key, as_cp)
    assert f"{chain.db} is not text, so not a verifier key" in as_key.stderr
    assert f"--checkpoint {chain.db} is not text, so not a checkpoint" in as_cp.stderr
    _plain(as_key)
    _plain(as_cp)


PRIVATE_KEY_COMMANDS = [
    "chain verify {db} --checkpoint {cp} --key KEY",
    "audit {db} --checkpoint {cp} --key KEY",
    "chain prove {db} 1 --checkpoint {cp} --key KEY",
    "chain consistency {db} {cp} {cp} --key KEY",
]


@pytest.mark.parametrize("template", PRIVATE_KEY_COMMANDS)
@pytest.mark.parametrize("given", ["file", "string"])
def test_the_private_key_is_refused_as_a_verifier_key(
    chain: Chain, template: str, given: str
) -> None:
    private = chain.db.parent / "node.key"
    key = str(private) if given == "file" else private.read_text().strip()
    values = {"db": chain.db, "cp": chain.cp}
    argv = [key if w == "KEY" else w.format(**values) for w in template.split()]
    ran = run(*argv, "--json")
    assert ran.code == 2, ran
    _plain(ran)
    assert (_error(ran)["code"], _error(ran)["field"]) == ("bad_key", "--key")
    assert "is a PRIVATE signing key" in ran.stderr
    assert "auditors verify with DATA_DIR/node.pub" in ran.stderr
    assert "AbwP" not in ran.stderr and key not in ran.stderr.replace(str(private), "")


def test_the_verifier_key_still_verifies(chain: Chain) -> None:
    ran = run("chain", "verify", chain.db, "--checkpoint", chain.cp, "--key", chain.pub)
    assert ran.code == 0, ran
    by_string = chain.pub.read_text().strip()
    assert run("chain", "verify", chain.db, "--checkpoint", chain.cp, "--key", by_string).code == 0
