"""One rule for a reason (tools/api/one_line.py): the control API's ``reason``
accepted a line separator (U+2028, U+2029), a bidirectional override or
isolate (U+202A-U+202E, U+2066-U+2069) and a blank text, which the command
line's ``--reason`` refuses (stop 32). Both apply the one rule now: the API
answers 400 naming ``reason`` and what is allowed, and nothing changes, the
state or the chain.
"""

from __future__ import annotations

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
REFUSED = [f"a{c}b" for c in SPLITS_OR_TURNS] + [
    "",
    "   ",
    "a\nb",
    "tab\there",
    "c1\x85",
    "x" * 501,
]
TAKEN = ["kernel update", "kernel update, é 日本", "emoji 🙂 ok", "x" * 500, " padded "]


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
            for reason in ("L1\u2028L2", "P1\u2029P2", "a\u202eb", "a\u2066b", " "):
                api = refused("bad_request", lambda v=verb, r=reason: client.cordon(v, r))
                assert api.field == "reason", api
                assert "allowed: one line" in str(api), api
        assert chain_rows(db) == rows
        node = client.node()
        assert (node.cordon, node.cordon_reason) == ("cordoned", "kernel update")
