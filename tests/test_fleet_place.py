"""``infervisor fleet place`` and ``fleet drain`` against nodes in this process
(a Node with its API served over TCP with tokens; fake llama-server).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from fleet_support import FleetNode, write_fleet
from support import cli_here, wait_until

from infervisor.adapters.ports import free_port
from infervisor.chain.note import Signer
from infervisor.tools.api.auth import TcpAddress, load_or_create_tokens
from infervisor.tools.api.client import ApiClient
from infervisor.tools.api.serving.server import ApiServer


class Served:
    """Nodes opened in this process, each served over TCP, and the fleet file naming them."""

    def __init__(self, nodes: Any, tmp_path: Path, stack: ExitStack) -> None:
        self.nodes, self.tmp_path, self.stack = nodes, tmp_path, stack
        self.entries: list[FleetNode] = []
        self.running: dict[str, tuple[Any, ApiServer]] = {}
        self.opened: dict[str, tuple[Any, int]] = {}

    def _open(self, settings: Any, port: int, with_model: bool) -> tuple[Any, ApiServer]:
        data = Path(settings.data_dir)
        tokens = load_or_create_tokens(data, ["operator", "controller"])
        server = ApiServer.listen(
            data, settings.chain_path, settings.node_id,
            tcp=TcpAddress("127.0.0.1", port), tokens=tokens,
        )  # fmt: skip
        node = self.nodes.open(settings)
        if with_model:
            node.registry.adopt("tiny", Path(settings.registry_dir) / "tiny.gguf")
        server.serve(node)
        return node, server

    def _close(self, name: str) -> None:
        found = self.running.pop(name, None)
        if found is not None:
            node, server = found
            server.stopping(5.0)
            node.shutdown()
            server.close()

    def restart(self, name: str) -> None:
        """Shut the node down and open it again on its data dir (it resumes from its chain)."""
        self._close(name)
        settings, port = self.opened[name]
        self.running[name] = self._open(settings, port, False)  # adopted once: kept

    def add(
        self,
        name: str,
        program: str,
        registry: Path,
        with_model: bool = True,
        lease_s: float | None = None,
        **overrides: Any,
    ) -> ApiClient:
        data = self.tmp_path / name
        settings = self.nodes.settings(
            program, registry, node_id=name, data_dir=str(data), lease_s=lease_s, **overrides
        )
        data.mkdir(parents=True)
        port = free_port()
        self.running[name] = self._open(settings, port, with_model)
        self.opened[name] = (settings, port)
        self.stack.callback(lambda: self._close(name))
        server = self.running[name][1]
        pub = self.tmp_path / f"{name}.pub"
        pub.write_text(Signer.generate(f"infervisor/{name}").verifier.key_string() + "\n")
        assert server.url is not None
        self.entries.append(FleetNode(name, server.url, data / "api-tokens.json", pub))
        secret = json.loads((data / "api-tokens.json").read_text())["operator"]
        client = ApiClient(url=server.url, token=secret, timeout_s=60.0)
        self.stack.callback(client.close)
        return client

    def fleet(self) -> Path:
        return write_fleet(self.tmp_path, self.entries)


@pytest.fixture
def served(nodes: Any, tmp_path: Path) -> Iterator[Served]:
    with ExitStack() as stack:
        yield Served(nodes, tmp_path, stack)


def spec_file(
    tmp_path: Path, port: int | None = None, name: str = "spec.toml", more: str = ""
) -> Path:
    path = tmp_path / name
    port = free_port() if port is None else port
    path.write_text(f'role = "work"\nflavor = "llamacpp"\nmodel = "tiny"\nport = {port}\n{more}')
    return path


def test_place_on_a_named_node(
    served: Served, tmp_path: Path, fake_llama: str, fake_model: Path
) -> None:
    n1 = served.add("n1", fake_llama, fake_model)
    ran = cli_here("fleet", "place", served.fleet(), spec_file(tmp_path), "--node", "n1", "--json")
    assert ran.returncode == 0, ran.stderr
    answer = json.loads(ran.stdout)
    assert answer["node"] == "n1"
    assert [v.instance_id for v in n1.list()] == [answer["answer"]["instance_id"]]
    served.restart("n1")  # the placement is in the chain: fleet status shows it again
    shown = json.loads(cli_here("fleet", "status", served.fleet(), "--json").stdout)["nodes"][0]
    assert [v["instance_id"] for v in shown["instances"]] == [answer["answer"]["instance_id"]]
    unknown = cli_here("fleet", "place", served.fleet(), spec_file(tmp_path), "--node", "n9")
    assert unknown.returncode == 2
    assert "NODE 'n9' is not in" in unknown.stderr
    missing = cli_here("fleet", "place", served.fleet(), tmp_path / "nothing.toml")
    assert missing.returncode == 2, missing.stderr
    assert f"SPEC {tmp_path / 'nothing.toml'}: cannot read" in missing.stderr
    assert "--file" not in missing.stderr


def test_place_passes_over_a_node_whose_ports_exclude_it_and_one_that_refuses(
    served: Served, tmp_path: Path, fake_llama: str, fake_model: Path
) -> None:
    """`narrow` allows other ports (GET /v1/node inventory.allowed_ports): passed over.
    `busy` has the most room but holds that instance with another ctx_size: it refuses
    (409, nothing recorded) and the next, `free`, takes it. When every node refuses,
    each is named."""
    port = free_port()
    served.add("narrow", fake_llama, fake_model, allowed_ports=(1024, 1024))
    # one registry: adopted once, by narrow
    busy = served.add("busy", fake_llama, fake_model, False, memory_budget_bytes=10**12)
    free = served.add("free", fake_llama, fake_model, False, memory_budget_bytes=10**11)
    fleet = served.fleet()
    held = spec_file(tmp_path, port, "held.toml", "ctx_size = 1024\n")
    first = cli_here("fleet", "place", fleet, held, "--node", "busy")
    assert first.returncode == 0, first.stderr
    ran = cli_here("fleet", "place", fleet, spec_file(tmp_path, port), "--start", "--json")
    assert ran.returncode == 0, ran.stderr
    answer = json.loads(ran.stdout)
    assert answer["node"] == "free", answer
    reasons = {p["node"]: p["reason"] for p in answer["passed_over"]}
    assert reasons["narrow"] == f"port {port} is outside its allowed ports 1024-1024"
    assert reasons["busy"].startswith("it refused: "), reasons
    assert [v.lifecycle != "running" for v in busy.list()] == [True]  # as it was
    iid = answer["answer"]["instance_id"]
    wait_until(lambda: free.status(iid).lifecycle == "running", 60.0, "it runs on free")
    other = spec_file(tmp_path, port, "other.toml", "ctx_size = 2048\n")
    again = cli_here("fleet", "place", fleet, other)
    assert again.returncode == 1, again.stderr
    for name in ("narrow", "busy", "free"):
        assert f"{name}: " in again.stderr, again.stderr
    assert len(busy.list()) == len(free.list()) == 1


def test_drain_stops_what_a_controller_placed(
    served: Served, tmp_path: Path, fake_llama: str, fake_model: Path
) -> None:
    n1 = served.add("n1", fake_llama, fake_model)
    fleet = served.fleet()
    placed = cli_here(
        "fleet", "place", fleet, spec_file(tmp_path), "--node", "n1",
        "--controller", "ctl1", "--generation", "1", "--start", "--json",
    )  # fmt: skip
    assert placed.returncode == 0, placed.stderr
    iid = json.loads(placed.stdout)["answer"]["instance_id"]
    drained = cli_here("fleet", "drain", fleet, "n1", "--json")
    assert drained.returncode == 0, drained.stderr
    answer = json.loads(drained.stdout)["answer"]
    assert answer["cordon"] == "drained"
    assert answer["stopped"] == [iid]
    assert n1.status(iid).lifecycle == "stopped"
    refused = cli_here("fleet", "place", fleet, spec_file(tmp_path), "--node", "n1")
    assert refused.returncode == 1, refused.stderr
    assert "n1" in refused.stderr
    served.restart("n1")  # the drain is in the chain: it outlives the node
    shown = json.loads(cli_here("fleet", "status", fleet, "--json").stdout)["nodes"][0]
    assert shown["cordon"] == "drained"
    assert [(v["instance_id"], v["lifecycle"]) for v in shown["instances"]] == [(iid, "stopped")]


def put_placements(
    entry: FleetNode, controller: str, generation: int, specs: list[dict[str, Any]]
) -> dict[str, Any]:
    secret = json.loads(entry.token_file.read_text())["controller"]
    body = {
        "controller": controller,
        "generation": generation,
        "placements": [{"spec": spec, "start": False} for spec in specs],
    }
    got = httpx.put(
        f"{entry.url}/v1/placements",
        json=body,
        headers={"authorization": f"Bearer {secret}"},
        timeout=60.0,
    )
    assert got.status_code == 200, got.text
    answer: dict[str, Any] = got.json()
    return answer


def test_placements_converge_and_a_repeat_changes_nothing(
    served: Served, tmp_path: Path, fake_llama: str, fake_model: Path
) -> None:
    served.add("n1", fake_llama, fake_model)
    fleet, entry = served.fleet(), served.entries[0]
    a, b = ({"role": r, "flavor": "llamacpp", "model": "tiny", "port": free_port()} for r in "ab")
    first = put_placements(entry, "ctl1", 1, [a, b])
    assert len(first["placed"]) == 2
    again = put_placements(entry, "ctl1", 1, [a, b])
    assert sorted(again["unchanged"]) == sorted(first["placed"])
    assert again["seq"] == first["seq"]
    fewer = put_placements(entry, "ctl1", 2, [a])
    assert len(fewer["unloaded"]) == 1
    shown = json.loads(cli_here("fleet", "status", fleet, "--json").stdout)["nodes"][0]
    assert [v["role"] for v in shown["instances"]] == ["a"]


def test_only_the_silent_controllers_instances_stop(
    served: Served, tmp_path: Path, fake_llama: str, fake_model: Path
) -> None:
    served.add("n1", fake_llama, fake_model, lease_s=4.0)
    fleet = served.fleet()
    ids = {}
    for ctl in ("ctl1", "ctl2"):
        placed = cli_here(
            "fleet", "place", fleet, spec_file(tmp_path), "--node", "n1",
            "--controller", ctl, "--generation", "1", "--start", "--json",
        )  # fmt: skip
        assert placed.returncode == 0, placed.stderr
        ids[ctl] = json.loads(placed.stdout)["answer"]["instance_id"]
    secret = json.loads(served.entries[0].token_file.read_text())["controller"]
    with ApiClient(url=served.entries[0].url, token=secret, timeout_s=60.0) as client:

        def ctl1_stopped() -> bool:
            client.heartbeat("ctl2")
            return client.status(ids["ctl1"]).lifecycle == "stopped"

        wait_until(ctl1_stopped, 60.0, "ctl1's lease lapses while ctl2 beats")
        assert client.status(ids["ctl2"]).desired == "running"

        def ctl2_running() -> bool:  # its start may still be under way at load 10
            client.heartbeat("ctl2")
            return client.status(ids["ctl2"]).lifecycle == "running"

        wait_until(ctl2_running, 60.0, "ctl2's instance running while ctl2 beats")
        raw = httpx.post(
            f"{served.entries[0].url}/v1/heartbeat",
            json={"controller": "ctl1"},
            headers={"authorization": f"Bearer {secret}"},
            timeout=60.0,
        ).json()
    assert raw["lapsed"] is True
    assert raw["stopped"] == [ids["ctl1"]]


def _read_into(stream: Any, lines: list[str]) -> None:
    for line in stream:
        lines.append(line)


def test_status_watch_redraws_and_ctrl_c_ends_it(
    served: Served, tmp_path: Path, fake_llama: str, fake_model: Path
) -> None:
    """``fleet status -w`` in a pipe: a table, another once an instance is placed
    (no screen control codes), and Ctrl-C ends it with 0."""
    served.add("n1", fake_llama, fake_model)
    lines: list[str] = []
    command = [str(Path(sys.executable).parent / "infervisor"), "fleet", "status"]
    with subprocess.Popen(
        [*command, str(served.fleet()), "-w"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    ) as watching:  # fmt: skip
        threading.Thread(target=_read_into, args=(watching.stdout, lines), daemon=True).start()
        try:
            wait_until(lambda: any(line.startswith("NODE") for line in lines), 60, "a table")
            placed = cli_here("fleet", "place", served.fleet(), spec_file(tmp_path), "--json")
            iid = json.loads(placed.stdout)["answer"]["instance_id"]
            wait_until(lambda: any(iid in line for line in lines), 60, "a table with it")
        finally:
            watching.send_signal(signal.SIGINT)
            _, err = watching.communicate(timeout=60)
    assert watching.returncode == 0, err
    assert "\x1b[" not in "".join(lines)
