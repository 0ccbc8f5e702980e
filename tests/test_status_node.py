"""``infervisor status --node``: the node's own record, so a script can learn that the
node is cordoned or drained without ``status --json`` (the list of instances scripts
read) changing shape (the newcomer's trial of stop 31: a bare list cannot say it).

``infervisor run`` runs as a real process with the fake llama-protocol server
(tests/test_operator_cli.py ``start_node``); the commands run in this process
(support.cli_here). After the node stops, the record is replayed from its chain.
"""

from __future__ import annotations

import datetime as dt
import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import test_operator_cli
from support import chain_rows, cli_here
from test_cli_contract import validate
from test_operator_cli import Started, ok

from infervisor.tools.api.wire import WitnessInfo
from infervisor.tools.clikit.node_schema import NODE_SCHEMA, NodeRecord
from infervisor.tools.clikit.schemas import SCHEMAS

start_node = test_operator_cli.start_node  # the fixture: starts ``infervisor run``


def node_json(where: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(ok(cli_here("status", where, "--node", "--json")))
    validate(record, NODE_SCHEMA)
    return record


def test_a_script_learns_the_cordon_from_the_node_and_from_its_chain(
    start_node: Callable[..., Started],
) -> None:
    node = start_node()
    data = node.data
    before = node_json(data)
    assert (before["source"], before["node_id"], before["phase"]) == ("node", "n1", "open")
    assert (before["cordon"], before["takes_placements"]) == ("none", True)
    assert before["instances"] == 2 and before["chain_writable"] is True

    ok(cli_here("cordon", data, "--reason", "maintenance"))
    cordoned = node_json(data)
    assert (cordoned["cordon"], cordoned["takes_placements"]) == ("cordoned", False)
    assert cordoned["head_seq"] > before["head_seq"]  # the cordon is an event
    text = ok(cli_here("status", data, "--node"))
    assert "cordoned: no new placements" in text.splitlines()[0]
    # the list scripts read is unchanged: instances only
    listed = json.loads(ok(cli_here("status", data, "--json")))
    assert isinstance(listed, list) and {r["role"] for r in listed} == {"chat", "embed"}
    since = cordoned["cordon_since_ns"]  # the cordon's event's time, from the chain
    (at,) = [t for _, t, k, _, _ in chain_rows(data / "chain.db") if k == "node.cordoned"]
    assert since == at
    when = dt.datetime.fromtimestamp(at / 1e9, dt.UTC).isoformat(timespec="seconds")[:-6]
    cordon_line = (
        f"node: cordoned since {when}Z, because: maintenance: no new placements "
        "(`infervisor uncordon` ends it)"
    )
    assert cordon_line in ok(cli_here("status", data)).splitlines()

    assert node.run.stop(signal.SIGTERM) == 0, node.run.output()
    offline = cli_here("status", data, "--node", "--json")
    record = json.loads(ok(offline))
    validate(record, NODE_SCHEMA)
    assert (record["source"], record["cordon"], record["takes_placements"]) == (
        "chain",
        "cordoned",
        False,
    )
    assert record["phase"] is None and record["version"] is None  # only a node knows
    assert record["witnesses"] is None and record["witness_quorum"] is None
    assert "replayed from the chain" in offline.stderr
    # `status` read from the chain says it too, as the live one does (it left it out)
    assert cordon_line in ok(cli_here("status", data)).splitlines()


def test_node_is_refused_with_an_instance_or_watch(start_node: Callable[..., Started]) -> None:
    node = start_node()
    for extra in (["chat"], ["--watch"]):
        refused = cli_here("status", node.data, *extra, "--node")
        assert refused.returncode == 2 and "--node" in refused.stderr, refused
        assert "Traceback" not in refused.stderr


def test_the_schema_is_listed_and_matches_the_record() -> None:
    assert SCHEMAS["node"] is NODE_SCHEMA
    assert set(NODE_SCHEMA["properties"]) == set(NodeRecord.__struct_fields__)
    assert set(NODE_SCHEMA["required"]) == set(NodeRecord.__struct_fields__)
    witness = NODE_SCHEMA["properties"]["witnesses"]["items"]  # GET /v1/node's, whole
    assert set(witness["properties"]) == set(witness["required"])
    assert set(witness["required"]) == set(WitnessInfo.__struct_fields__)
