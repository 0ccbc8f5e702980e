"""The node's inventory (``GET /v1/node``'s ``inventory``) and models (``GET /v1/models``).

The GPU tools cannot run here (no GPU): faithful fakes of their
machine-readable output are put first on PATH, small scripts printing what
``nvidia-smi --query-gpu=index,name,memory.total,memory.free
--format=csv,noheader,nounits`` (MiB, ``", "`` between fields) and
``rocm-smi --showproductname --showmeminfo vram --json`` (bytes, as strings,
per ``card<N>``) print. Everything else is real: a node opened in this
process, its API on a Unix socket, answers checked against docs/openapi.json.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from click.testing import CliRunner
from conftest import NodeFactory
from support import wait_until
from test_openapi_doc import Contract

from infervisor.actors.node import Node
from infervisor.adapters.gpus import (
    NVIDIA_ARGS,
    ROCM_ARGS,
    Gpu,
    GpuCache,
    GpuReport,
    parse_nvidia_csv,
    parse_rocm_json,
    query_gpus,
)
from infervisor.adapters.registry import ModelFormat
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.tools.api.serving.server import ApiServer
from infervisor.tools.cli import cli

MIB = 1024 * 1024
NVIDIA_CSV = "0, NVIDIA GeForce RTX 4090, 24564, 23986\n1, NVIDIA A100-SXM4-80GB, 81920, 1024\n"
ROCM_JSON = {
    "card0": {
        "Card series": "Radeon RX 7900 XTX",
        "Card model": "0x744c",
        "Card vendor": "Advanced Micro Devices, Inc. [AMD/ATI]",
        "Card SKU": "D7070100",
        "VRAM Total Memory (B)": "25753026560",
        "VRAM Total Used Memory (B)": "1073741824",
    }
}


def fake_tool(bin_dir: Path, name: str, expect: tuple[str, ...], out: str, code: int = 0) -> None:
    """A script named ``name`` printing ``out`` when called with exactly ``expect``."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / name
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$*" != "{" ".join(expect)}" ]; then echo "unexpected: $*" >&2; exit 64; fi\n'
        f"cat <<'EOF'\n{out}\nEOF\n"
        f"exit {code}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def gpu_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder first on PATH, and nothing else: no real GPU tool is found."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sh = Path("/bin/sh")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{sh.parent}")
    return bin_dir


def test_nvidia_smi_csv_is_read_in_bytes() -> None:
    assert parse_nvidia_csv(NVIDIA_CSV) == GpuReport(gpus=[
        Gpu(vendor="nvidia", index=0, name="NVIDIA GeForce RTX 4090",
            memory_total_bytes=24564 * MIB, memory_free_bytes=23986 * MIB),
        Gpu(vendor="nvidia", index=1, name="NVIDIA A100-SXM4-80GB",
            memory_total_bytes=81920 * MIB, memory_free_bytes=1024 * MIB),
    ])  # fmt: skip
    assert parse_nvidia_csv("3, Tesla, with a comma, 16, 8\n").gpus[0].name == "Tesla, with a comma"
    mixed = parse_nvidia_csv("0, NVIDIA T4, [N/A], [N/A]\n1, NVIDIA T4, 15360, 15000\n2, x\n")
    assert [g.index for g in mixed.gpus] == [1]
    assert mixed.errors == [
        "nvidia-smi line '0, NVIDIA T4, [N/A], [N/A]': index and memory must be numbers",
        "nvidia-smi line '2, x': expected index, name, total, free",
    ]


def test_rocm_smi_json_is_read_in_bytes() -> None:
    doc = {**ROCM_JSON, "card1": {**ROCM_JSON["card0"], "Card series": ""}, "system": {}}
    report = parse_rocm_json(json.dumps(doc))
    assert report.errors == []
    assert report.gpus[0] == Gpu(
        vendor="amd", index=0, name="Radeon RX 7900 XTX",
        memory_total_bytes=25753026560, memory_free_bytes=25753026560 - 1073741824,
    )  # fmt: skip
    assert report.gpus[1].index == 1 and report.gpus[1].name == "0x744c"  # no series: the model
    broken = parse_rocm_json(
        json.dumps({"card0": {"Card series": "x"}, "card1": ROCM_JSON["card0"]})
    )
    assert [g.index for g in broken.gpus] == [1]
    assert broken.errors == ["rocm-smi card0: no VRAM Total (Used) Memory (B) in bytes"]
    assert parse_rocm_json("WARNING: no AMD GPU").errors[0].startswith("rocm-smi: not JSON")
    assert parse_rocm_json("[]").errors == ["rocm-smi: not an object"]


def test_each_tool_on_path_is_asked_and_failures_are_reported(gpu_path: Path) -> None:
    assert query_gpus() == GpuReport()  # neither tool: no GPU, no error
    fake_tool(gpu_path, "nvidia-smi", NVIDIA_ARGS, NVIDIA_CSV)
    fake_tool(gpu_path, "rocm-smi", ROCM_ARGS, json.dumps(ROCM_JSON))
    report = query_gpus()
    assert [(g.vendor, g.index) for g in report.gpus] == [("nvidia", 0), ("nvidia", 1), ("amd", 0)]
    assert report.errors == []
    fake_tool(
        gpu_path, "nvidia-smi", NVIDIA_ARGS,
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", code=9,
    )  # fmt: skip
    report = query_gpus()
    assert [g.vendor for g in report.gpus] == ["amd"]
    assert report.errors == [
        "nvidia-smi exited 9: NVIDIA-SMI has failed because it couldn't communicate "
        "with the NVIDIA driver."
    ]


def test_a_tool_that_hangs_is_reported_not_waited_for(gpu_path: Path) -> None:
    script = gpu_path / "rocm-smi"
    script.write_text("#!/bin/sh\nexec sleep 60\n")
    script.chmod(0o755)
    report = query_gpus(timeout_s=0.2)
    assert report.gpus == [] and report.errors == ["rocm-smi: no answer in 0.2 s"]


def test_the_gpu_report_is_cached_for_its_time() -> None:
    now = [100.0]
    asked: list[int] = []

    def query() -> GpuReport:
        asked.append(1)
        return GpuReport(errors=[f"query {len(asked)}"])

    cache = GpuCache(query, ttl_s=10.0, clock=lambda: now[0], background=False)
    assert cache.get().errors == ["query 1"]
    now[0] += 9.9
    assert cache.get().errors == ["query 1"]
    now[0] += 0.1
    assert cache.get().errors == ["query 2"] and len(asked) == 2


def test_a_stale_report_is_answered_while_a_refresh_runs_behind() -> None:
    now = [0.0]
    release = threading.Event()
    reports = iter([GpuReport(errors=["first"]), GpuReport(errors=["second"])])

    def query() -> GpuReport:
        report = next(reports)
        if report.errors == ["second"]:
            assert release.wait(60)  # a tool that takes its time
        return report

    cache = GpuCache(query, ttl_s=10.0, clock=lambda: now[0])
    assert cache.get().errors == ["first"]
    now[0] = 20.0
    assert cache.get().errors == ["first"]  # stale: answered now, refreshed behind
    assert cache.get().errors == ["first"]  # one refresh at a time
    release.set()
    wait_until(lambda: cache.get().errors == ["second"], 60, "the refresh landed")


@pytest.fixture
def served(
    nodes: NodeFactory, fake_llama: str, fake_model: Path, tmp_path: Path
) -> Iterator[tuple[Node, httpx.Client]]:
    """A node in this process with a budget, a port range and three models; its API
    on a Unix socket."""
    settings = nodes.settings(
        fake_llama, fake_model, memory_budget_bytes=10**9, allowed_ports=(20000, 20999),
        adapters=("infer.llamacpp", "infer.ollama.adopted"),
    )  # fmt: skip
    node = nodes.open(settings)
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    node.registry.adopt("llama3", None, format=ModelFormat.OLLAMA, ollama_tag="llama3:8b")
    (fake_model / "broken.toml").write_text("name = 'broken'\nformat = 'onnx'\n")
    data = Path(settings.data_dir)
    server = ApiServer.listen(data, settings.chain_path, settings.node_id)
    server.serve(node)
    transport = httpx.HTTPTransport(uds=str(data / "api.sock"))
    try:
        with httpx.Client(transport=transport, base_url="http://node", timeout=30) as client:
            yield node, client
    finally:
        server.close()


def test_the_node_tells_its_inventory(
    served: tuple[Node, httpx.Client], gpu_path: Path, fake_model: Path
) -> None:
    node, client = served
    fake_tool(gpu_path, "nvidia-smi", NVIDIA_ARGS, NVIDIA_CSV)
    contract = Contract()
    inventory = contract.check(client.get("/v1/node"))["inventory"]
    assert inventory["cpu_count"] == psutil.cpu_count()
    assert 0 < inventory["memory_available_bytes"] <= inventory["memory_total_bytes"]
    assert inventory["memory_total_bytes"] == psutil.virtual_memory().total
    assert inventory["gpus"][0] == {
        "vendor": "nvidia", "index": 0, "name": "NVIDIA GeForce RTX 4090",
        "memory_total_bytes": 24564 * MIB, "memory_free_bytes": 23986 * MIB,
    }  # fmt: skip
    assert len(inventory["gpus"]) == 2 and inventory["gpu_errors"] == []
    assert inventory["adapters"] == ["llamacpp", "ollama"]
    assert inventory["allowed_ports"] == [[20000, 20999]]
    assert inventory["memory_budget_bytes"] == 10**9
    assert inventory["memory_reserved_bytes"] == 0

    node.place(InstanceSpec(role="chat", flavor=Flavor.LLAMACPP, model="tiny", port=20001))
    ledger = node.ledger()
    assert ledger is not None
    inventory = contract.check(client.get("/v1/node"))["inventory"]
    assert inventory["memory_reserved_bytes"] == ledger.in_use_bytes


def test_models_lists_the_registry(served: tuple[Node, httpx.Client], fake_model: Path) -> None:
    node, client = served
    models = Contract().check(client.get("/v1/models"))["models"]
    tiny = node.registry.entry("tiny")
    assert models == [
        {"name": "llama3", "format": "ollama", "size_bytes": None, "digest": None},
        {"name": "tiny", "format": "gguf", "size_bytes": tiny.size_bytes, "digest": tiny.blake3},
    ]  # the broken manifest is left out
    assert tiny.size_bytes == (fake_model / "tiny.gguf").stat().st_size


def test_the_models_command_prints_them(served: tuple[Node, httpx.Client]) -> None:
    node = served[0]
    data = node.settings.data_dir
    as_json = CliRunner().invoke(cli, ["models", data, "--json"])
    assert as_json.exit_code == 0, as_json.output
    names = [m["name"] for m in json.loads(as_json.output)["models"]]
    assert names == ["llama3", "tiny"]
    table = CliRunner().invoke(cli, ["models", data])
    assert table.exit_code == 0 and table.output.splitlines()[1].startswith("tiny  ")
