"""The main job: `infervisor demo` as a newcomer runs it, as a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from support import cli_here

from infervisor.chain import SqliteChain, verify_chain

pytestmark = pytest.mark.slow

INFERVISOR = str(Path(sys.executable).parent / "infervisor")


def spawned_pids(chain_path: Path) -> list[int]:
    with SqliteChain.open_readonly(chain_path) as chain:
        return [json.loads(e.payload)["pid"] for e in chain.events(kinds=["instance.spawned"])]


@pytest.mark.parametrize("flavor", ["llamacpp", "mlx-lm"])
def test_demo_exits_0_and_leaves_no_process(tmp_path: Path, flavor: str) -> None:
    if flavor == "mlx-lm":
        pytest.importorskip("mlx_lm", reason="the mlx extra is not installed")
    done = subprocess.run(
        [INFERVISOR, "demo", "--json", "--dir", str(tmp_path), "--flavor", flavor],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True
    assert all(step["ok"] for step in report["steps"])
    assert report["completion"]
    moves = [(e["from"], e["to"]) for e in report["timeline"] if e["from"] != e["to"]]
    assert ("running", "exited") in moves
    assert ("restarting", "starting") in moves
    assert moves[-1] == ("stopping", "stopped")
    chain = tmp_path / "chain.db"
    assert verify_chain(chain).ok
    pids = spawned_pids(chain)
    assert len(pids) == 2  # the first server and its supervised restart
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def test_demo_refuses_a_bad_flavor(tmp_path: Path) -> None:
    done = cli_here("demo", "--flavor", "vllm", "--dir", tmp_path)  # a usage error: in this process
    assert done.returncode == 2
    assert "'vllm' is not one of 'llamacpp', 'mlx-lm'" in done.stderr
