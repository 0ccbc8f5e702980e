"""Property: whatever verbs, health outcomes and process deaths happen, the
state replayed from the chain equals the live actors' state.

Real processes (the fake llama-protocol server), a real SQLite chain, and a
manual clock so backoff and health ticks happen exactly when the test says.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import FAKE_GGUF, PROGRAMS, make_launcher, wait_until

from infervisor.actors.clock import ManualClock
from infervisor.actors.errors import VerbRefused
from infervisor.actors.node import Node
from infervisor.actors.settings import NodeSettings
from infervisor.adapters.errors import AdapterError
from infervisor.adapters.ports import free_port
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.chain import verify_chain
from infervisor.replay import RestartPolicy

OPS = ["start", "stop", "restart", "kill", "fail", "heal", "tick", "tick", "backoff"]


def apply_op(node: Node, clock: ManualClock, iid: str, workdir: Path, op: str) -> None:
    try:
        if op == "start":
            node.start(iid)
        elif op == "stop":
            node.stop(iid, grace_s=2.0)
        elif op == "restart":
            node.restart(iid)
        elif op == "kill":
            pid = node.status(iid).pid
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):  # already dead, not yet recorded
                    os.kill(pid, signal.SIGKILL)
        elif op in ("fail", "heal"):
            workdir.mkdir(parents=True, exist_ok=True)
            (workdir / "health").write_text("fail" if op == "fail" else "ok")
        elif op == "tick":
            clock.advance(node.settings.health_interval_s)
        elif op == "backoff":
            clock.advance(node.settings.restart.cap_s)
    except (VerbRefused, AdapterError):
        pass  # a refused verb is a legal outcome; the property still has to hold


def settled_and_equal(node: Node, iid: str) -> bool:
    if not node.settled(iid):
        return False
    live = node.live_states()
    replayed = node.rebuild().instances
    return live == replayed


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=12))
def test_replayed_state_equals_live_state(ops: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        registry = base / "models"
        registry.mkdir()
        (registry / "tiny.gguf").write_bytes(FAKE_GGUF + bytes(40))
        clock = ManualClock()
        cfg = NodeSettings(
            node_id="prop",
            data_dir=str(base / "data"),
            registry_dir=str(registry),
            llamacpp_program=make_launcher(base, PROGRAMS / "fake_llama.py"),
            health_interval_s=1.0,
            miss_limit=2,
            stop_grace_s=2.0,
            health_kill_grace_s=1.0,
            restart=RestartPolicy(max_restarts=3, base_s=1.0, cap_s=4.0, stable_after_s=5.0),
        )
        node = Node.open(cfg, clock)
        try:
            node.registry.adopt("tiny", registry / "tiny.gguf")
            spec = InstanceSpec(role="p", flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
            iid = node.place(spec)
            workdir = base / "data" / "instances" / iid
            for op in ops:
                apply_op(node, clock, iid, workdir, op)
                wait_until(lambda: settled_and_equal(node, iid), 20, f"replay == live after {op}")
        finally:
            node.shutdown()
        assert verify_chain(cfg.chain_path).ok
