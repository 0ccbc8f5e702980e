"""The model is verified before every launch, whoever asks for it (issue 11, item 1),
and what can be checked at load is (GGUF header and metadata, run_as)."""

from __future__ import annotations

import os
import signal
import struct
from pathlib import Path

import pytest
from support import FAKE_GGUF, gguf_registry, wait_until
from test_crash_recovery import crash, reopen
from test_misbehaving_servers import (
    count,
    history,
    listening,
    nothing_left,
    of_kind,
    rig,
    tick_to,
    wait_kind,
)

from infervisor.adapters.errors import AdmissionRefused, RegistryError
from infervisor.adapters.registry import ModelRegistry
from infervisor.replay import RestartPolicy
from infervisor.tools.node.config import ConfigError, load_config

POLICY = RestartPolicy(max_restarts=3, base_s=1.0, cap_s=3.0, stable_after_s=30.0)
#: A valid GGUF (version 3, no tensors, no metadata) followed by payload bytes to flip.
WEIGHTS = FAKE_GGUF + bytes(range(256)) * 4
FLIP_AT = 100


@pytest.fixture
def fake_model(tmp_path: Path) -> Path:
    """Overrides conftest's: the registry now refuses a GGUF header that does not parse."""
    return gguf_registry(tmp_path, WEIGHTS)


def flip(model: Path) -> tuple[str, str]:
    """Change one byte in place, size kept and mtime restored: the old cache passed it."""
    st = model.stat()
    data = bytearray(model.read_bytes())
    data[FLIP_AT] ^= 0xFF
    model.write_bytes(bytes(data))
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert model.stat().st_size == st.st_size
    assert model.stat().st_mtime_ns == st.st_mtime_ns
    import blake3

    return blake3.blake3(WEIGHTS).hexdigest(), blake3.blake3(bytes(data)).hexdigest()


def restore(model: Path) -> None:
    model.write_bytes(WEIGHTS)


def refusals(r) -> list[str]:
    return [s.event.reason for s in of_kind(history(r.node, r.iid), "start_refused")]


def assert_refused_with(r, expected: str, found: str) -> None:
    reasons = refusals(r)
    assert reasons, "no instance.start_refused recorded"
    assert f"expected digest {expected}" in reasons[-1]
    assert f"found {found}" in reasons[-1]
    assert found in r.status().reason


def test_operator_start_and_restart_are_refused_on_a_flipped_byte(
    nodes, tmp_path, fake_model, manual_clock
):
    r = rig(nodes, tmp_path, fake_model, manual_clock, "fake_llama.py", restart=POLICY)
    model = fake_model / "tiny.gguf"
    expected, found = flip(model)
    with pytest.raises(AdmissionRefused, match="expected digest"):
        r.node.start(r.iid)
    assert_refused_with(r, expected, found)
    assert count(r.node, r.iid, "starting") == 0
    with pytest.raises(AdmissionRefused):
        r.node.start(r.iid)
    assert count(r.node, r.iid, "start_refused") == 1  # once per cause

    restore(model)
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")

    flip(model)
    pid = r.status().pid
    with pytest.raises(AdmissionRefused, match="expected digest"):
        r.node.restart(r.iid)
    wait_kind(r.node, r.iid, "start_refused", 2)
    assert count(r.node, r.iid, "starting") == 1  # the restart did not launch
    # ... nor stop the server that still serves on the weights it loaded.
    assert r.status().lifecycle == "running" and r.status().pid == pid
    assert count(r.node, r.iid, "stop_requested") == 0
    r.node.stop(r.iid)
    nothing_left(r.node)


def test_supervisor_restart_after_sigkill_is_refused_then_resumes(
    nodes, tmp_path, fake_model, manual_clock
):
    r = rig(nodes, tmp_path, fake_model, manual_clock, "fake_llama.py", restart=POLICY)
    model = fake_model / "tiny.gguf"
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    expected, found = flip(model)
    pid = r.status().pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: r.status().lifecycle == "restarting", 20, "restarting")
    manual_clock.advance(POLICY.base_s)
    wait_kind(r.node, r.iid, "start_refused", 1)
    assert count(r.node, r.iid, "starting") == 1
    assert_refused_with(r, expected, found)

    restore(model)
    wait_until(
        lambda: (manual_clock.advance(POLICY.cap_s), count(r.node, r.iid, "starting") == 2)[1],
        20,
        "the restart once the bytes are back",
    )
    listening(r.port)
    tick_to(r, "running")
    r.node.stop(r.iid)
    nothing_left(r.node)


def test_start_at_boot_is_refused_on_a_flipped_byte(nodes, tmp_path, fake_model, manual_clock):
    r = rig(nodes, tmp_path, fake_model, manual_clock, "fake_llama.py", restart=POLICY)
    model = fake_model / "tiny.gguf"
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    pid = r.status().pid
    assert pid is not None
    crash(r.node)
    os.kill(pid, signal.SIGKILL)  # the server dies while the node is down
    wait_until(lambda: not _alive(pid), 20, "the server to be gone")
    expected, found = flip(model)

    b = reopen(nodes, r.node, manual_clock, r.iid, r.port)
    wait_until(
        lambda: (manual_clock.advance(POLICY.cap_s), count(b.node, b.iid, "start_refused") >= 1)[1],
        20,
        "the boot's start to be refused",
    )
    assert count(b.node, b.iid, "starting") == 1  # only the first, before the crash
    assert_refused_with(b, expected, found)
    b.node.stop(b.iid)
    nothing_left(b.node)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_cache_trusts_only_an_unchanged_file(tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    (root / "tiny.gguf").write_bytes(WEIGHTS)
    reg = ModelRegistry(root)
    reg.adopt("tiny", root / "tiny.gguf")
    reg.resolve("tiny")
    expected, found = flip(root / "tiny.gguf")
    with pytest.raises(RegistryError, match=f"expected digest {expected}, found {found}"):
        reg.resolve("tiny")


def test_gguf_with_valid_magic_and_random_bytes_is_refused_at_adopt(tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    bad = root / "bad.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(4096))
    with pytest.raises(RegistryError, match=r"bad\.gguf is not a GGUF file this node can read"):
        ModelRegistry(root).adopt("bad", bad)
    assert not (root / "bad.toml").exists()


def test_gguf_whose_metadata_runs_past_the_end_is_refused(tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    bad = root / "bad.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + struct.pack("<Q", 5) + b"key")
    with pytest.raises(RegistryError, match="metadata count 2 cannot fit"):
        ModelRegistry(root).adopt("bad", bad)


def test_the_generated_tiny_model_passes(tmp_path, tiny_gguf):
    root = tmp_path / "models"
    root.mkdir()
    (root / "tiny.gguf").write_bytes(tiny_gguf.read_bytes())
    reg = ModelRegistry(root)
    reg.adopt("tiny", root / "tiny.gguf")
    assert reg.resolve("tiny").path == (root / "tiny.gguf").resolve()


@pytest.mark.parametrize(
    ("run_as", "field"), [("[4000000000, 0]", "uid"), ("[0, 4000000000]", "gid")]
)
def test_run_as_naming_a_missing_user_or_group_is_refused_at_load(tmp_path, run_as, field):
    config = tmp_path / "node.toml"
    config.write_text(f'[node]\nnode_id = "n1"\ndata_dir = "data"\nrun_as = {run_as}\n')
    with pytest.raises(ConfigError, match=f"run_as {field} 4000000000 is not a"):
        load_config(config)
