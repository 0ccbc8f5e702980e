"""One rule for a reason (tools/api/one_line.py): the control API's ``reason``
accepted a line separator (U+2028, U+2029), a bidirectional override or
isolate (U+202A-U+202E, U+2066-U+2069) and a blank text, which the command
line's ``--reason`` refuses (stop 32). Both apply the one rule now: the API
answers 400 naming ``reason`` and what is allowed, and nothing changes, the
state or the chain.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import click
import msgspec
import pytest
from conftest import NodeFactory
from support import chain_rows
from test_drain_node import refused, served

from infervisor.tools.api.fleet_wire import CordonRequest
from infervisor.tools.api.strict import explain
from infervisor.tools.clikit.command import REASON

SPLITS_OR_TURNS = [
    "\u2028",
    "\u2029",
    *map(chr, range(0x202A, 0x202F)),
    *map(chr, range(0x2066, 0x206A)),
]
#: Invisible where a reason is shown (stop 33b): a reason holding one looked like one without.
INVISIBLE = [
    *map(chr, range(0x200B, 0x2010)),  # zero-width space, (non-)joiner, LRM, RLM
    *map(chr, range(0x2060, 0x2065)),  # word joiner, invisible operators
    "\ufeff",  # byte order mark (zero-width no-break space)
    "\u00ad",  # soft hyphen
    "\u061c",  # Arabic letter mark
]
REFUSED = [f"a{c}b" for c in SPLITS_OR_TURNS + INVISIBLE] + [
    "",
    "   ",
    "a\nb",
    "tab\there",
    "c1\x85",
    "x" * 501,
]
TAKEN = [
    "kernel update",
    "kernel update, é 日本",
    "emoji 🙂 ok",
    "x" * 500,
    " padded ",
    "variation ❤\ufe0f selector",  # Mn, not Cf
    "Ελληνικά, русский, עברית, العربية",  # right-to-left letters themselves are fine
]


def api_takes(reason: str) -> bool:
    try:
        msgspec.json.decode(msgspec.json.encode({"reason": reason}), type=CordonRequest)
    except msgspec.ValidationError:
        return False
    return True


def cli_takes(reason: str) -> bool:
    try:
        REASON.convert(reason, None, None)
    except click.BadParameter:
        return False
    return True


@pytest.mark.parametrize("reason", REFUSED + TAKEN, ids=ascii)
def test_the_api_and_the_command_line_take_the_same_reasons(reason: str) -> None:
    assert api_takes(reason) is cli_takes(reason) is (reason in TAKEN)


def test_the_apis_refusal_names_reason_and_what_is_allowed() -> None:
    body = msgspec.json.encode({"reason": "a\u202eb"})
    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.json.decode(body, type=CordonRequest)
    error = explain(caught.value, CordonRequest)
    assert (error.code, error.field) == ("bad_request", "reason")
    assert "U+2028, U+2029" in error.message and "U+202A to U+202E" in error.message
    assert "regex" not in error.message  # what is allowed, in words


def test_a_reason_that_splits_or_turns_its_line_is_refused_by_the_api_and_nothing_changes(
    nodes: NodeFactory, fake_llama: str, fake_model: Path
) -> None:
    settings = nodes.settings(fake_llama, fake_model)
    db = Path(settings.chain_path)
    with served(nodes, settings, fake_model) as (_, client):
        client.cordon("cordon", "kernel update")
        rows = chain_rows(db)
        for verb in ("cordon", "drain", "uncordon"):
            for reason in (
                "L1\u2028L2",
                "P1\u2029P2",
                "a\u202eb",
                "a\u2066b",
                " ",
                "a\u200bb",
                "\ufeffa",
            ):
                api = refused("bad_request", lambda v=verb, r=reason: client.cordon(v, r))
                assert api.field == "reason", api
                assert "allowed: one line" in str(api), api
        assert chain_rows(db) == rows
        node = client.node()
        assert (node.cordon, node.cordon_reason) == ("cordoned", "kernel update")


def test_every_format_character_below_u10000_is_refused_and_none_else_of_its_neighbours() -> None:
    """The rule is Unicode's category Cf (below U+10000, as the schema's pattern can name),
    with the controls and the line separators; a letter or a mark is not in it."""
    for code in range(0x10000):
        c = chr(code)
        if 0xD800 <= code <= 0xDFFF:
            continue
        category = unicodedata.category(c)
        expected = category in ("Cf", "Cc", "Zl", "Zp")
        assert api_takes(f"a{c}b") is not expected, (hex(code), category)


def test_an_invisible_characters_refusal_names_it_in_words() -> None:
    body = msgspec.json.encode({"reason": "kernel\u200bupdate"})
    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.json.decode(body, type=CordonRequest)
    error = explain(caught.value, CordonRequest)
    assert error.field == "reason" and "format character" in error.message
    assert "U+200B" in error.message and "U+FEFF" in error.message
    with pytest.raises(click.BadParameter, match="U\\+200B"):
        REASON.convert("kernel\u200bupdate", None, None)


@pytest.mark.parametrize(
    ("reason", "said"),
    [
        (
            "kernel\u200bupdate",
            "character (Unicode's category Cf), U+200B ZERO WIDTH SPACE at index 6",
        ),
        ("a\u202eb", "U+202E RIGHT-TO-LEFT OVERRIDE at index 1"),
        ("two\nlines", "a control character, U+000A LINE FEED at index 3"),
        ("L1\u2028L2", "a line separator, U+2028 LINE SEPARATOR at index 2"),
    ],
    ids=ascii,
)
def test_the_refusal_names_the_character_and_where_it_is(reason: str, said: str) -> None:
    """Stop 34's trial: the API's refusal of a zero-width space did not say which
    character it was nor where (the text looks the same without it)."""
    body = msgspec.json.encode({"reason": reason})
    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.json.decode(body, type=CordonRequest)
    error = explain(caught.value, CordonRequest, body)
    assert error.field == "reason" and said in error.message, error
    assert "allowed: one line" in error.message, error
    with pytest.raises(click.BadParameter) as cli:
        REASON.convert(reason, None, None)
    assert said in str(cli.value)
