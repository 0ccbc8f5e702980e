"""Where the operator's verbs reach a node: its Unix socket (private, replaced when a
crash left it stale, removed after the run; a file in its place or a path too long
for a Unix socket refused before the node opens) and a loopback TCP listener with
bearer tokens (``--url`` with ``--token``, ``--token-file`` or the environment).

``infervisor run`` runs as a real process with the fake llama-protocol server
(tests/test_operator_cli.py ``start_node``); the verbs run the CLI's click group in
this process (support.cli_here), the console script where its environment is what is
checked. Synchronisation is by condition and deadline, never by sleeping.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import test_operator_cli
from support import cli_here
from test_operator_cli import (
    NO_NODE,
    Started,
    chain_sources,
    json_error,
    ok,
    refused,
    table,
)
from test_run_resume import (
    EXIT_DEADLINE_S,
    INFERVISOR,
    cli,
    put_model,
    write_config,
)

from infervisor.adapters.ports import free_port
from infervisor.tools.api.client import SOCKET_FILE, ApiClient
from infervisor.tools.api.errors import ApiError, VerbFailed
from infervisor.tools.api.serving.server import SOCKET_FILE as SERVER_SOCKET_FILE
from infervisor.tools.api.serving.server import check_socket_path

start_node = test_operator_cli.start_node  # the fixture: starts ``infervisor run``


# ---------------------------------------------------------------- --url and tokens
def test_the_verbs_over_tcp_with_a_token(start_node: Callable[..., Started]) -> None:
    api_port = free_port()
    node = start_node(top=f'[api]\ntcp = "127.0.0.1:{api_port}"\ntokens = ["operator", "ctl"]\n')
    chat, data = node.ids["chat"], node.data
    url = f"http://127.0.0.1:{api_port}"
    tokens = data / "api-tokens.json"
    secret = json.loads(tokens.read_text())["operator"]

    rows = table(ok(cli_here("status", "--url", url, "--token", secret)))
    assert rows[chat][3] == "running"
    by_file = json.loads(
        ok(cli_here("status", "--url", url, "--token-file", tokens, chat, "--json"))
    )
    assert by_file["instance_id"] == chat
    bare = data.parent / "secret.txt"
    bare.write_text(secret + "\n")
    ok(cli_here("status", "--url", url, "--token-file", bare))
    env = {**os.environ, "INFERVISOR_URL": url, "INFERVISOR_TOKEN": secret}
    by_env = subprocess.run(
        [str(INFERVISOR), "stop", "chat", "--grace", "5", "--json"],
        capture_output=True, text=True, env=env, timeout=EXIT_DEADLINE_S, check=False,
    )  # fmt: skip
    assert by_env.returncode == 0, by_env.stdout + by_env.stderr
    assert json.loads(by_env.stdout)["lifecycle"] == "stopped"
    sources = {(k, s): src for k, s, src in chain_sources(data / "chain.db")}
    assert sources[("instance.stop_requested", chat)] == "operator:token=operator (scope operate)"

    # Refusals in this process (support.cli_here): the same command, no process start.
    wrong = cli_here("status", "--url", url, "--token", "not-the-secret", "--json")
    assert wrong.returncode == 2, wrong.stdout + wrong.stderr
    assert json_error(wrong)["code"] == "unauthorized"
    refused(cli_here("status", "--url", url, "--token-file", tokens, "--token-name", "x"), 2, "ctl")
    refused(cli_here("status", "--url", url, data, chat), 2, "with --url there is no WHERE")
    nobody = cli_here("status", "--url", f"http://127.0.0.1:{free_port()}", "--json")
    assert nobody.returncode == 3, nobody.stdout + nobody.stderr
    assert json_error(nobody)["code"] == "no_node"
    assert node.run.stop() == 0, node.run.output()


#: Every operator command over --url, with what it needs after the options.
URL_COMMANDS = [
    ("status",), ("status", "chat"), ("health", "chat"), ("models",), ("start", "chat"),
    ("stop", "chat"), ("restart", "chat"), ("unload", "chat"), ("cordon",), ("drain",),
    ("uncordon",), ("watch",),
]  # fmt: skip


def test_an_unknown_token_is_usage_for_every_command_and_a_narrow_scope_a_refusal(
    start_node: Callable[..., Started],
) -> None:
    """docs/cli.md: a missing or unknown token is usage (2, ``unauthorized``: fix
    --token); a known token whose scope does not cover the verb is a refusal (1,
    ``forbidden``). A newcomer's trial (stop 33) read ``status``'s 2 as the odd one
    out: every command says the same, and names --token as the field at fault."""
    api_port = free_port()
    node = start_node(
        top=f'[api]\ntcp = "127.0.0.1:{api_port}"\n'
        'tokens = ["operator", { name = "grafana", scope = "read" }]\n'
    )
    url = f"http://127.0.0.1:{api_port}"
    for command in URL_COMMANDS:
        wrong = cli_here(*command, "--url", url, "--token", "not-the-secret", "--json")
        assert wrong.returncode == 2, (command, wrong.stdout, wrong.stderr)
        error = json_error(wrong)
        assert (error["code"], error["field"]) == ("unauthorized", "--token"), (command, error)
        assert "fix --token (or --token-file, INFERVISOR_TOKEN)" in wrong.stderr
    logs = cli_here("logs", "chat", "--url", url, "--token", "not-the-secret")
    assert logs.returncode == 2 and "fix --token" in logs.stderr, logs.stderr
    reader = json.loads((node.data / "api-tokens.json").read_text())["grafana"]
    ok(cli_here("status", "--url", url, "--token", reader))
    narrow = cli_here("stop", "chat", "--url", url, "--token", reader, "--json")
    assert narrow.returncode == 1, narrow.stdout + narrow.stderr
    assert json_error(narrow)["code"] == "forbidden"
    assert node.run.stop() == 0, node.run.output()


# ---------------------------------------------------------------- the socket
def test_the_socket_is_private_and_removed_after_the_run(
    start_node: Callable[..., Started],
) -> None:
    assert SOCKET_FILE == SERVER_SOCKET_FILE
    node = start_node()
    path = node.data / SOCKET_FILE
    assert stat.S_ISSOCK(path.lstat().st_mode)
    assert stat.S_IMODE(path.lstat().st_mode) == 0o600
    with ApiClient(node.data) as first, ApiClient(node.data) as second:
        ids = [v.instance_id for v in first.list()]
        assert [v.instance_id for v in second.list()] == ids
        with pytest.raises(VerbFailed, match="nope") as refusal:
            second.stop("nope")
        assert (refusal.value.code, refusal.value.status) == ("unknown_instance", 404)
        assert first.ledger() is None  # no memory budget configured
    assert node.run.stop() == 0, node.run.output()
    assert not path.exists()


def test_a_stale_socket_is_replaced_and_without_a_node_the_verbs_exit_3(
    start_node: Callable[..., Started], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    put_model(data)
    with socket.socket(socket.AF_UNIX) as crashed:  # bound, never unlinked: what a crash leaves
        crashed.bind(str(data / SOCKET_FILE))
    assert (data / SOCKET_FILE).exists()
    refused(cli_here("restart", data, "chat"), 3, f"{NO_NODE} {data}", "infervisor run CONFIG")
    refused(cli_here("status", data), 2, f"{NO_NODE} {data}", "holds no chain")

    node = start_node()
    assert stat.S_IMODE((data / SOCKET_FILE).lstat().st_mode) == 0o600
    assert node.ids["chat"] in ok(cli_here("status", data))
    assert node.run.stop() == 0, node.run.output()
    assert not (data / SOCKET_FILE).exists()


def test_a_file_in_the_sockets_place_stops_the_run_before_the_node_opens(
    tmp_path: Path, fake_llama: str
) -> None:
    put_model(tmp_path / "data")
    (tmp_path / "data" / SOCKET_FILE).write_text("not a socket")
    result = cli("run", write_config(tmp_path, fake_llama))
    refused(result, 2, f"{SOCKET_FILE} exists and is not a socket; move it away")
    assert not (tmp_path / "data" / "chain.db").exists()


def test_a_socket_path_too_long_for_unix_sockets_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ApiError, match="use a shorter data_dir"):
        check_socket_path(tmp_path / ("d" * 120) / SOCKET_FILE)
