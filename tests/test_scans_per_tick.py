"""Nothing per instance that is per machine (issue 10, item 4).

A reconcile tick reads the socket table once and the process table once for
the whole node, however many instances there are; health ticks, status and
list read neither; a socket's owner is looked up only for a wide listener on
an instance's port. Counted by wrapping the entry points, with real
servers (the fake llama-protocol server) on an injected clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from support import managed_fakes_running, wait_until

from infervisor.actors.clock import ManualClock
from infervisor.adapters import ports
from infervisor.adapters.proc import system

INSTANCES = 3


def counting(calls: Counter[str], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return fn(*args, **kwargs)

    return wrapper


def test_one_scan_per_tick_for_the_node_and_none_for_status(
    nodes, fake_llama: str, fake_model: Path, manual_clock: ManualClock, monkeypatch
) -> None:
    settings = nodes.settings(
        fake_llama, fake_model, health_interval_s=1.0, reconcile_interval_s=1.0
    )
    node = nodes.open(settings, manual_clock)
    node.registry.adopt("tiny", fake_model / "tiny.gguf")
    iids = managed_fakes_running(node, manual_clock, INSTANCES, "r")

    calls: Counter[str] = Counter()
    monkeypatch.setattr(
        psutil, "process_iter", counting(calls, "process_iter", psutil.process_iter)
    )
    monkeypatch.setattr(
        system, "read_proc_table", counting(calls, "process_table", system.read_proc_table)
    )
    monkeypatch.setattr(
        psutil, "net_connections", counting(calls, "net_connections", psutil.net_connections)
    )
    monkeypatch.setattr(
        ports, "listening_sockets", counting(calls, "socket_table", ports.listening_sockets)
    )
    monkeypatch.setattr(
        ports, "socket_owners", counting(calls, "socket_owners", ports.socket_owners)
    )
    monkeypatch.setattr(
        psutil.Process, "children", counting(calls, "children", psutil.Process.children)
    )

    for _ in range(20):
        for iid in iids:
            assert node.status(iid).pid is not None
        assert len(node.list()) == INSTANCES
    assert calls == Counter(), "status and list must not read the system"

    def ticked(count: int) -> bool:
        if calls["socket_table"] >= count:
            return True
        manual_clock.advance(0.25)  # small steps: the next tick is armed once one is handled
        return False

    for tick in range(1, 4):  # three reconcile ticks, and the health ticks meanwhile
        wait_until(lambda t=tick: ticked(t), 20, f"reconcile tick {tick}")
    wait_until(lambda: all(node.settled(i) for i in iids), 20, "the ticks handled")
    ticks = calls["socket_table"]
    wait_until(lambda: calls["process_table"] >= ticks, 20, "the last tick's process table read")
    assert calls["process_table"] == ticks  # one process-table read per tick, not per instance
    assert calls["process_iter"] == 0  # /proc read directly, not through psutil
    assert calls["children"] == 0  # no instance scans for its descendants itself
    # /proc/net is read; psutil's table, which reads every process's descriptors, is
    # not; and no owner is looked up while no server listens beyond loopback
    assert calls["net_connections"] == calls["socket_owners"] == 0
    for iid in iids:
        rss = node.status(iid).rss_bytes  # from the tick's table
        assert rss is not None and rss > 0
    for iid in iids:
        node.stop(iid)


@pytest.fixture
def manual_clock() -> ManualClock:
    return ManualClock()
