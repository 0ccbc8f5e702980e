"""The operator's commands load no part of the node: their module graph, not their timing.

Every ``infervisor status``/``start``/... is a process of its own, started
many times a minute by scripts and by this suite; what it imports is what it
costs (bench/cli_startup.py measures the CPU). A client needs the API's
client, its wire types and its errors (tools/api/client.py, wire.py,
errors.py), never the server (Litestar), the actors or the adapters' Ollama
client.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import probe_record

from infervisor.chain import SqliteChain

_PROBE = """
import json, sys
from infervisor.tools.cli import cli
try:
    cli.main(args=sys.argv[1:], standalone_mode=True)
except SystemExit as e:
    code = e.code
else:
    code = 0
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""

#: What a client without a node does not need either (issue 22, "CLI start-up"): the
#: chain and the reducer (``infervisor.replay`` loads its parts when asked; a client
#: needs only its records), logging (the inventory logs on the node's side),
#: and subprocess and shutil (the GPU query runs on the node's side).
#: What of the chain package a client may load: its lazy package and the record
#: types its wire shares (chain/records.py's EventHeader), not the store or verifier.
_CHAIN_FOR_A_CLIENT = {
    "infervisor.chain",
    "infervisor.chain.lazy",
    "infervisor.chain.errors",
    "infervisor.chain.records",
}
_STATUS_SPARED = (
    "infervisor.replay.events",
    "infervisor.replay.reducer",
    "logging",
    "subprocess",
    "shutil",
)
#: A whole instance spec, as ``infervisor place --file`` reads one.
_FRAGMENT = 'role = "chat"\nflavor = "llamacpp"\nmodel = "tiny"\nport = 18080\n'
_FORBIDDEN = ("litestar", "infervisor.actors", "infervisor.adapters.ollama", "uvicorn", "pykka")


def _modules(*args: str, cwd: Path) -> tuple[object, list[str]]:
    """The exit code and the modules loaded by ``infervisor ARGS`` run in a fresh process."""
    record = probe_record(_PROBE, *args, cwd=cwd)
    return record["code"], record["modules"]


def _loaded(modules: list[str], package: str) -> list[str]:
    return [m for m in modules if m == package or m.startswith(f"{package}.")]


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("status", "data"), id="status-no-node"),
        pytest.param(("status", "data", "--json"), id="status-json"),
        pytest.param(("stop", "data", "chat"), id="stop-no-node"),
        # The fragment is read and checked before the node is asked: with the
        # spec's own types (tools/node/fragment.py), not the node's whole config.
        pytest.param(("place", "data", "--file", "fragment.toml"), id="place-no-node"),
    ],
)
def test_an_operator_command_loads_no_part_of_the_node(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "fragment.toml").write_text(_FRAGMENT)
    code, modules = _modules(*args, cwd=tmp_path)
    # no node runs there: the whole client path ran (status then finds no chain
    # either: WHERE names nothing, 2; a verb has no node to ask, 3)
    assert code == (2 if args[0] == "status" else 3)
    assert "infervisor.tools.api.client" in modules
    # No socket, no request: neither the HTTP client nor psutil is loaded (issue 22).
    assert "httpx" not in modules
    assert _loaded(modules, "httpcore") == []
    assert _loaded(modules, "psutil") == []
    for package in _FORBIDDEN:
        assert _loaded(modules, package) == [], package
    for package in _STATUS_SPARED:
        assert _loaded(modules, package) == [], package
    assert set(_loaded(modules, "infervisor.chain")) <= _CHAIN_FOR_A_CLIENT


def test_the_root_help_loads_no_part_of_the_node(tmp_path: Path) -> None:
    code, modules = _modules("--help", cwd=tmp_path)
    assert code == 0
    for package in ("litestar", "infervisor.adapters.ollama", "uvicorn"):
        assert _loaded(modules, package) == [], package


#: What an auditor's read of a chain without a node key does not need (issue 22,
#: "CLI start-up"): Ed25519's native bindings (no signature to check), logging
#: (nothing logs unless -v), a TOML parser (WHERE is no config), the HTTP client, and
#: hashlib (OpenSSL: SHA-256 is for checkpoints and key ids, chain/merkle.py).
_AUDIT_SPARED = (
    "cryptography",
    "logging",
    "tomllib",
    "httpcore",
    "infervisor.tools.api.client",
    "hashlib",
)


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("chain", "verify", "chain.db"), id="verify"),
        pytest.param(("chain", "verify", "chain.db", "--json"), id="verify-json"),
        pytest.param(("replay", "chain.db"), id="replay"),
        pytest.param(("replay", "chain.db", "--json"), id="replay-json"),
    ],
)
def test_an_auditors_read_loads_only_what_it_uses(tmp_path: Path, args: tuple[str, ...]) -> None:
    with SqliteChain.open(tmp_path / "chain.db", "node-a"):
        pass
    code, modules = _modules(*args, cwd=tmp_path)
    assert code == 0  # the whole read ran: verified (and replayed)
    assert "infervisor.chain.trust" in modules  # the trust policy was asked
    assert "httpx" not in modules  # (tools/cli.py blocks httpx._main by name only)
    for package in _AUDIT_SPARED:
        assert _loaded(modules, package) == [], package
