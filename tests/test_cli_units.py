"""Pieces of the commands that need no node: ages, rows, watch lines, tokens, lazy loading."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from infervisor.replay import events as ev
from infervisor.tools.api.wire import WatchEvent
from infervisor.tools.cli import cli
from infervisor.tools.clikit.schemas import InstanceRecord
from infervisor.tools.operator import status, target, watch


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0, "0s"), (42.9, "42s"), (60, "1m"), (359, "5m"), (3 * 3600 + 5, "3h"), (2 * 86400, "2d")],
)
def test_ages_read_as_kubectl_shows_them(seconds: float, shown: str) -> None:
    assert status.age(seconds) == shown


def record(**fields: object) -> InstanceRecord:
    required = InstanceRecord.__struct_fields__[
        : len(InstanceRecord.__struct_fields__) - len(InstanceRecord.__struct_defaults__)
    ]
    base: dict[str, object] = dict.fromkeys(required)
    base.update(
        source="node", instance_id="chat-1", placed_by="n1", generation=0, lifecycle="running",
        desired="running", since_ns=1_000_000_000, restarts=1, last_seq=3, flavor="llamacpp",
        mode="managed", endpoint="http://127.0.0.1:8080",
    )  # fmt: skip
    base.update(fields)
    converted: InstanceRecord = msgspec.convert(base, InstanceRecord)
    return converted


def test_a_row_shows_restarts_against_the_budget_and_memory_in_mib() -> None:
    now = 1_000_000_000 + 300 * 10**9
    row = status.row(record(max_restarts=5, reserved_bytes=512 * 2**20, rss_bytes=300 * 2**20), now)
    assert row == (
        "chat-1", "llamacpp", "managed", "running", "running", "5m", "1/5",
        "http://127.0.0.1:8080", "512/300",
    )  # fmt: skip
    offline = status.row(record(source="chain", reserved_bytes=None), now)
    assert (offline[6], offline[8]) == ("1/-", "-/?")


def test_a_watch_line_is_the_run_output_line() -> None:
    stop = ev.StopRequested(by="operator", grace_s=5.0, reason="operator stop")
    payload = msgspec.to_builtins(stop)
    event = WatchEvent(
        seq=7, ts_ns=1, node="n1", source="operator", kind="instance.stop_requested",
        subject="chat-1", payload=payload, hash="00" * 32, prev_hash="11" * 32,
    )  # fmt: skip
    line = watch.watch_line(event)
    assert line.startswith("[7] instance.stop_requested chat-1: ")
    genesis = WatchEvent(
        seq=0, ts_ns=1, node="n1", source="node", kind="chain.genesis", subject="",
        payload={}, hash="00" * 32, prev_hash="00" * 32,
    )  # fmt: skip
    assert watch.watch_line(genesis) == "[0] chain.genesis: the chain of node n1 begins"


def test_a_token_file_is_the_bare_secret_or_the_nodes_tokens(tmp_path: Path) -> None:
    bare = tmp_path / "secret"
    bare.write_text("s3cret\n")
    assert target.token_of(None, bare, "operator") == "s3cret"
    tokens = tmp_path / "api-tokens.json"
    tokens.write_text(json.dumps({"operator": "a", "controller": "b"}))
    assert target.token_of(None, tokens, "controller") == "b"
    assert target.token_of("given", tokens, "operator") == "given"
    with pytest.raises(SystemExit) as ended:
        target.token_of(None, tokens, "nobody")
    assert ended.value.code == 2


def test_a_token_file_written_with_a_byte_order_mark_gives_the_secret(tmp_path: Path) -> None:
    """Editors on Windows write a UTF-8 BOM first (stop 35's trial: refused as a
    token holding '\ufeff'); one is dropped, for the bare secret and the JSON."""
    bare = tmp_path / "secret"
    bare.write_bytes(b"\xef\xbb\xbfs3cret\r\n")
    assert target.token_of(None, bare, "operator") == "s3cret"
    tokens = tmp_path / "api-tokens.json"
    tokens.write_bytes(b"\xef\xbb\xbf" + json.dumps({"operator": "a"}).encode())
    assert target.token_of(None, tokens, "operator") == "a"


def test_the_command_line_loads_a_commands_libraries_only_when_it_runs() -> None:
    """The root group and its --help do not import the node, its API or the chain
    group's checkpoint and bundle libraries; `chain --help` lists every chain command."""
    heavy = ("infervisor.actors.node", "litestar", "infervisor.chain.bundle")
    probe = (
        "import sys; from infervisor.tools.cli import cli; "
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert loaded.stdout.strip() == "[]"
    listed = CliRunner().invoke(cli, ["chain", "--help"]).output
    for name in ("verify", "prove", "consistency", "checkpoint", "backup", "rotate-key",
                 "export", "verify-bundle"):  # fmt: skip
        assert f"  {name} " in listed
