"""A malformed node URL is a usage error naming where it came from, never a traceback.

``--url``, INFERVISOR_URL and ``chain pull URL`` are checked once where the command
reads them (tools/clikit/urls.py): http or https, a host, a port 1-65535. Before,
``http://[::1`` and ``http://[::1]:abc`` ended in httpx's ``InvalidURL`` traceback
(exit 1), and port 99999 read as "nothing answers" (exit 3).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import cli_here

BAD_URLS = [
    "http://[::1",
    "http://[::1]:abc",
    "http://127.0.0.1:99999",
    "http://127.0.0.1:0",
    "http://:8765",
    "ftp://127.0.0.1:8765",
    "127.0.0.1:8765",
    "http://127.0.0.1:8765/a b",
    "http://\udcff:1",  # a byte argv could not decode (httpx raised InvalidURL on it)
    "http://127.0.0.1:\uff18\uff10\uff18\uff10",  # full-width digits: int() reads 8080
]

VERBS = [
    ["status"],
    ["start", "chat"],
    ["stop", "chat"],
    ["logs", "chat"],
    ["health"],
]


def refused_naming(args: list[object], name: str, env: dict[str, str] | None = None) -> None:
    """Exit 2, never a traceback; the message (and --json's error, where the verb has
    --json) names ``name`` and what is allowed."""
    as_json = args[0] != "logs"  # logs streams text only
    result = cli_here(*args, *(["--json"] if as_json else []), env=env)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, (args, result.stdout, result.stderr)
    assert name in result.stderr
    assert "port 1-65535" in result.stderr, result.stderr
    if as_json:
        error = json.loads(result.stdout)["error"]
        assert (error["code"], error["field"]) == ("bad_value", name), (args, error)


@pytest.mark.parametrize("url", BAD_URLS)
def test_each_verb_refuses_a_malformed_url_naming_url(url: str) -> None:
    for verb in VERBS:
        refused_naming([*verb, "--url", url], "--url")


@pytest.mark.parametrize("url", BAD_URLS[:3])
def test_a_malformed_infervisor_url_is_named_as_the_variable(url: str) -> None:
    refused_naming(["status"], "INFERVISOR_URL", env={"INFERVISOR_URL": url})


@pytest.mark.parametrize("url", BAD_URLS)
def test_chain_pull_refuses_a_malformed_url_naming_url(url: str, tmp_path: Path) -> None:
    refused_naming(["chain", "pull", url, tmp_path / "mirror"], "URL")
    assert not (tmp_path / "mirror").exists()


def test_a_well_formed_url_still_reaches_the_node() -> None:
    """An IPv6 literal with a port in range passes the check: nothing answers (exit 3)."""
    result = cli_here("status", "--url", "http://[::1]:9", "--timeout", "2", "--json")
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 3, result.stdout + result.stderr


#: What each URL that urllib cannot split is refused with, in the project's words
#: (a newcomer's trial, stop 33: "Port could not be cast to integer value as 'abc'"
#: and "Invalid IPv6 URL" were urllib's, passed through).
OWN_WORDS = {
    "http://127.0.0.1:abc": "port 'abc' is not a number",
    "http://[::1]:abc": "port 'abc' is not a number",
    "http://127.0.0.1:99999": "port 99999 is out of range",
    "http://[::1": "an IPv6 host must be in brackets, [ and ] both",
    "http://::1]:8765": "an IPv6 host must be in brackets, [ and ] both",
    # Other scripts' digits, as every number option refuses them (clikit/raw_args.py;
    # stop 35's trial: "port \\uff18... is out of range" for a port 8080 in full-width).
    "http://127.0.0.1:\uff18\uff10\uff18\uff10": "port '\\uff18\\uff10\\uff18\\uff10': a number "
    "is written in ASCII digits (0-9), not other scripts' digits",
    "http://[::1]:\u0668\u0660": "port '\\u0668\\u0660': a number is written in ASCII digits (0-9)",
    "http://127.0.0.1:8_0": "port '8_0': a number is written in ASCII digits (0-9), without",
}
PYTHONS_WORDS = ("could not be cast", "Invalid IPv6 URL", "Port out of range", "not a URL (")


@pytest.mark.parametrize(("url", "said"), OWN_WORDS.items())
def test_a_url_urllib_cannot_split_is_refused_in_the_projects_words(url: str, said: str) -> None:
    result = cli_here("status", "--url", url, "--json")
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"--url {url!r}: {said}" in result.stderr, result.stderr
    assert "; allowed: http:// or https://" in result.stderr, result.stderr
    assert not any(words in result.stderr for words in PYTHONS_WORDS), result.stderr
