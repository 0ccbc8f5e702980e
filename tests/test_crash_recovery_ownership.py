"""More crash-safety regressions: Ollama ownership and memory across a node
restart, an exit whose append fails, and a start refused at boot.

Each test reproduces a symptom of the design before the decision core was split
from its executor (ownership and reservations held only in memory, an exit
lost when its append failed, a refused boot start never retried) and checks
what the node does now. A "crash" ends the node's actors without a shutdown
(tests/test_crash_recovery.py), so its servers outlive it.
"""

from __future__ import annotations

import os
import signal
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import pytest
import test_crash_recovery
import test_ollama_node
from conftest import NodeFactory
from support import CRASH_LEAVES_SOCKETS, PROGRAMS, OllamaTestServer, make_launcher, wait_until
from test_crash_recovery import (
    POLICY,
    alive,
    consistent,
    crash,
    reopen,
    server_pid,
)
from test_misbehaving_servers import (
    Rig,
    count,
    history,
    listening,
    nothing_left,
    of_kind,
    open_node,
    place,
    rig,
    tick_to,
    tick_until,
)
from test_ollama_node import (
    RESERVED,
    TAG,
    kinds,
    managed,
    released,
    reservations,
    resident,
)

from infervisor.actors.clock import ManualClock
from infervisor.actors.errors import NotResident, RecordFailed
from infervisor.actors.node import Node
from infervisor.adapters import ollama
from infervisor.adapters.manifest import ModelFormat
from infervisor.adapters.ports import port_in_use
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.chain import SqliteChain, verify_chain

OTHER = "qwen"  # a second pulled Ollama model (registry name)
OTHER_TAG = "qwen:0.5b"
SLOW = 100.0  # health and reconcile interval (s, manual clock) where no probe may interfere
RETRY_WINDOW_S = 5.0  # an append retry is due within this (0.5, 1, 2 s for three failures)
server = test_ollama_node.server  # the fixture: ``server(*models, **flags)``
holder = test_crash_recovery.holder  # the fixture: sockets closed in teardown
pytestmark = CRASH_LEAVES_SOCKETS

# ---------------------------------------------------------------- helpers


def ollama_node(nodes: NodeFactory, fake_llama: str, fake_model: Any, budget: int) -> Node:
    settings = nodes.settings(
        fake_llama,
        fake_model,
        memory_budget_bytes=budget,
        reserve_overhead_bytes=RESERVED,
        ollama_keep_alive="5m",
    )
    n = nodes.open(settings)
    n.registry.adopt(TAG, format=ModelFormat.OLLAMA, ollama_tag=TAG)
    n.registry.adopt(OTHER, format=ModelFormat.OLLAMA, ollama_tag=OTHER_TAG)
    return n


def reopen_real(nodes: NodeFactory, node: Node, iid: str) -> Node:
    """A new node (real clock) on the crashed node's data directory, once its boot
    of ``iid`` is decided (the status ask queues behind the boot)."""
    b = nodes.open(node.settings)
    b.status(iid)
    return b


def running_ollama(node: Node, srv: OllamaTestServer, spec: InstanceSpec | None = None) -> str:
    iid = node.place(spec or managed(srv))
    node.start(iid)
    node.wait_for(iid, lambda v: v.lifecycle == "running", 60)
    return iid


def fail_exits(monkeypatch: pytest.MonkeyPatch, times: int) -> list[int]:
    """Make the chain's ``append_many`` raise for a batch holding ``instance.exited``,
    ``times`` times, then store again. Returns a list that counts the failures."""
    original = SqliteChain.append_many
    failed: list[int] = []

    def append_many(self: SqliteChain, drafts: Any) -> Any:
        drafts = list(drafts)
        if len(failed) < times and any(d.kind == "instance.exited" for d in drafts):
            failed.append(1)
            raise OSError("injected: cannot record instance.exited")
        return original(self, drafts)

    monkeypatch.setattr(SqliteChain, "append_many", append_many)
    return failed


def killed_while_exits_fail(
    r: Rig, monkeypatch: pytest.MonkeyPatch, times: int
) -> tuple[int, list[int]]:
    """Start the instance, make its exit's append fail ``times`` times, SIGKILL its
    server and wait for the first failure. Returns the server's pid and the count."""
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    pid = server_pid(r)
    failed = fail_exits(monkeypatch, times)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: failed, 20, "the exit's append to fail")
    return pid, failed


def retries_until(clock: ManualClock, done: Any, what: str) -> Any:
    """Advance the clock to the next timer due within the retry window (an append
    retry, a restart's backoff) until ``done()`` holds; health and reconcile
    ticks (every ``SLOW`` s) are never reached."""

    def step() -> Any:
        value = done()
        if value:
            return value
        now = clock.monotonic()
        soon = [due for due in clock.pending() if now < due <= now + RETRY_WINDOW_S]
        if soon:
            clock.advance(soon[0] - now)
        return None

    return wait_until(step, 30, what)


def slow_rig(nodes, tmp_path, fake_model, clock) -> Rig:
    return rig(
        nodes,
        tmp_path,
        fake_model,
        clock,
        "fake_llama.py",
        restart=POLICY,
        health_interval_s=SLOW,
        reconcile_interval_s=SLOW,
    )


# ---------------------------------------------------------------- 1. Ollama ownership


def test_ollama_model_this_node_loaded_is_unloaded_after_a_node_restart(
    nodes, fake_llama, fake_model, server
):
    srv = server(TAG, load_seconds=0.2)
    node = ollama_node(nodes, fake_llama, fake_model, 10 * RESERVED)
    assert not resident(srv)
    iid = running_ollama(node, srv)
    assert node.status(iid).reason.endswith(f"(model {TAG} loaded by this node)")
    assert resident(srv)
    crash(node)
    assert resident(srv)  # a crash unloads nothing

    b = reopen_real(nodes, node, iid)
    assert b.status(iid).lifecycle == "running"
    assert b.rebuild().instances[iid].ollama_owned is True
    assert b.stop(iid).lifecycle == "stopped"
    assert not resident(srv)  # ours: unloaded by the node that booted
    released(b, iid)
    assert "instance.memory_released" in kinds(b, iid)
    assert b.rebuild().instances[iid].reserved_bytes == 0
    consistent(b)


def test_ollama_model_resident_before_our_start_stays_after_a_node_restart(
    nodes, fake_llama, fake_model, server
):
    srv = server(TAG, load_seconds=0.2)
    ollama.load(srv.url, TAG, keep_alive=-1)  # somebody else loads it, through the API
    assert resident(srv)
    node = ollama_node(nodes, fake_llama, fake_model, 10 * RESERVED)
    iid = running_ollama(node, srv)
    assert "already resident: not ours to unload" in node.status(iid).reason
    crash(node)

    b = reopen_real(nodes, node, iid)
    assert b.status(iid).lifecycle == "running"
    assert b.rebuild().instances[iid].ollama_owned is not True
    assert b.stop(iid).lifecycle == "stopped"
    assert resident(srv)  # somebody else's model stays loaded
    released(b, iid)
    consistent(b)


# ---------------------------------------------------------------- 2. Ollama memory


def test_ollama_reservation_survives_a_node_restart_and_refuses_what_does_not_fit(
    nodes, fake_llama, fake_model, server
):
    srv = server(TAG, load_seconds=0.2)
    second = server(OTHER_TAG, load_seconds=0.2)  # one managed instance per Ollama address
    budget = RESERVED + RESERVED // 2  # one Ollama start fits, two do not
    node = ollama_node(nodes, fake_llama, fake_model, budget)
    iid = running_ollama(node, srv)
    assert reservations(node) == {iid: RESERVED}
    crash(node)

    b = reopen_real(nodes, node, iid)
    assert reservations(b) == {iid: RESERVED}  # the ledger is a fold of the chain
    ledger = b.ledger()
    assert ledger is not None
    assert ledger.in_use_bytes == RESERVED
    # of lower priority, it may not evict the running one (issue 21): refused, with the numbers
    other = b.place(
        InstanceSpec(role="other", flavor=Flavor.OLLAMA, model=OTHER, port=second.port, priority=-1)
    )
    with pytest.raises(NotResident) as refused:
        b.start(other)
    assert refused.value.code == "no_room"
    message = str(refused.value)
    assert f"needs {RESERVED} bytes beside {RESERVED} in use of the budget {budget}" in message
    assert not ollama.resident(second.url, OTHER_TAG, timeout=5.0)  # nothing was asked of it
    assert reservations(b) == {iid: RESERVED}
    assert b.status(other).reserved_bytes == 0
    assert b.status(iid).lifecycle == "running"
    b.stop(iid)
    released(b, iid)
    consistent(b)


# ---------------------------------------------------------------- 3. exit append fails


def test_an_exit_whose_append_fails_is_retried_and_the_policy_follows(
    nodes, tmp_path, fake_model, manual_clock, monkeypatch
):
    r = slow_rig(nodes, tmp_path, fake_model, manual_clock)
    pid, failed = killed_while_exits_fail(r, monkeypatch, 3)
    view = r.status()
    assert "fault" in view.reason
    assert (view.lifecycle, view.desired, view.pid) == ("running", "running", pid)
    sourced = r.node.rebuild().instances[r.iid]
    assert sourced.lifecycle == "running"
    assert sourced.process is not None and sourced.process.pid == pid
    assert count(r.node, r.iid, "exited") == 0
    consistent(r.node)

    retries_until(manual_clock, lambda: count(r.node, r.iid, "exited"), "the exit recorded")
    assert len(failed) == 3
    steps = history(r.node, r.iid)
    assert len(of_kind(steps, "exited")) == 1
    assert of_kind(steps, "exited")[0].event.pid == pid
    wait_until(lambda: r.status().lifecycle == "restarting", 20, "restarting")
    assert "fault" not in r.status().reason
    assert count(r.node, r.iid, "restart_scheduled") == 1
    retries_until(manual_clock, lambda: count(r.node, r.iid, "starting") == 2, "the restart")
    assert r.status().restarts == 1  # (cleared again once stable_after_s has passed)
    listening(r.port)
    tick_to(r, "running")
    assert server_pid(r) != pid
    consistent(r.node)
    r.node.stop(r.iid)
    consistent(r.node)
    nothing_left(r.node)


def test_a_stop_while_the_exit_waits_for_the_chain_is_refused_at_once(
    nodes, tmp_path, fake_model, manual_clock, monkeypatch
):
    """A verb is never held behind a waiting exit: it is refused at once, and
    nothing of it is done; the exit, recorded later, is followed by the policy."""
    r = slow_rig(nodes, tmp_path, fake_model, manual_clock)
    pid, _ = killed_while_exits_fail(r, monkeypatch, 2)
    before = len(history(r.node, r.iid))

    with pytest.raises(RecordFailed) as refused:
        r.node.stop(r.iid)
    assert "could not record" in str(refused.value)
    assert "1 observation waits" in str(refused.value)
    assert str(refused.value).endswith("nothing was done")
    assert len(history(r.node, r.iid)) == before  # the chain is as it was
    view = r.status()
    assert (view.lifecycle, view.desired, view.pid) == ("running", "running", pid)
    assert "observation waits" in view.reason

    retries_until(manual_clock, lambda: count(r.node, r.iid, "exited"), "the exit recorded")
    assert count(r.node, r.iid, "stop_requested") == 0
    assert count(r.node, r.iid, "restart_scheduled") == 1  # the policy, as if no stop was asked
    retries_until(manual_clock, lambda: count(r.node, r.iid, "starting") == 2, "the restart")
    listening(r.port)
    assert "fault" not in r.status().reason
    view = r.node.stop(r.iid)
    assert (view.lifecycle, view.desired) == ("stopped", "stopped")
    assert not alive(pid)
    consistent(r.node)
    nothing_left(r.node)


# ---------------------------------------------------------------- 4. start refused at boot


def refused_at_boot(
    nodes: NodeFactory, tmp_path: Any, fake_model: Any, clock: ManualClock, holder: list
) -> tuple[Rig, int, str]:
    """A managed fake placed and started, the node crashed, its server killed and
    its port bound by a plain socket, the node reopened: the start it decides at
    boot (after the backoff) is refused. The new rig, the old pid, the refusal."""
    program = make_launcher(tmp_path, PROGRAMS / "fake_llama.py")
    node = open_node(nodes, fake_model, clock, program, restart=POLICY)
    iid, port = place(node)
    node.start(iid)
    listening(port)
    r = Rig(node, clock, iid, port)
    tick_to(r, "running")
    pid = server_pid(r)
    crash(node)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not alive(pid), 20, "the server to die")
    wait_until(lambda: not port_in_use("127.0.0.1", port), 20, "the port to be free")
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    holder.append(squatter)

    b = reopen(nodes, node, clock, iid, port)
    tick_until(b.node, clock, iid, lambda: count(b.node, iid, "start_refused"), "the refusal")
    refused = of_kind(history(b.node, iid), "start_refused")[0].event
    assert f"127.0.0.1:{port}" in refused.reason
    return b, pid, refused.reason


def test_a_start_refused_at_boot_for_a_taken_port_is_retried_once_it_frees(
    nodes, tmp_path, fake_model, manual_clock, holder
):
    b, pid, why = refused_at_boot(nodes, tmp_path, fake_model, manual_clock, holder)
    iid, port = b.iid, b.port
    reconcile = b.node.settings.reconcile_interval_s
    end = manual_clock.monotonic() + 5 * reconcile + 4 * POLICY.cap_s
    tick_until(b.node, manual_clock, iid, lambda: manual_clock.monotonic() >= end, "ticks")
    assert count(b.node, iid, "start_refused") == 1  # recorded once, not once per tick
    assert count(b.node, iid, "starting") == 1
    assert count(b.node, iid, "failed") == 0
    view = b.status()
    assert (view.lifecycle, view.desired) == ("restarting", "running")
    assert why in view.reason  # status says why it is not starting
    assert b.node.live_states()[iid].refusal == why
    assert b.node.rebuild().instances[iid].refusal == why
    consistent(b.node)

    holder.pop().close()
    manual_clock.advance(reconcile)
    tick_until(b.node, manual_clock, iid, lambda: count(b.node, iid, "starting") == 2, "a start")
    listening(port)
    tick_to(b, "running")
    assert server_pid(b) != pid
    assert count(b.node, iid, "start_refused") == 1
    assert why not in b.status().reason
    b.node.stop(iid)
    consistent(b.node)
    nothing_left(b.node)


# ---------------------------------------------------------------- an unload cut short by a crash
def test_an_unload_a_crash_cut_short_is_finished_at_boot_and_the_instance_forgotten(
    nodes, tmp_path, fake_model, manual_clock
):
    """The node dies while an unload waits out the server's grace; the next boot
    finishes it (exited, unloaded) and the host forgets the instance: it is not
    listed, its id is free again, and the node shuts down cleanly."""
    r = rig(nodes, tmp_path, fake_model, manual_clock, "fault_ignore_term.py")
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    pid = server_pid(r)
    unloading = ThreadPoolExecutor(1).submit(r.node.unload, r.iid)  # SIGTERM is ignored
    wait_until(lambda: count(r.node, r.iid, "stop_requested") >= 1, 20, "the unload under way")
    crash(r.node)
    os.kill(pid, signal.SIGKILL)  # the server dies while no node runs
    wait_until(lambda: not alive(pid), 20, "the server gone")
    with_error = unloading.exception(20)  # the crashed node's caller heard it end
    assert with_error is not None

    b = nodes.open(r.node.settings, manual_clock)
    wait_until(lambda: r.iid not in b.rebuild().instances, 20, "the unload finished at boot")
    wait_until(lambda: all(v.instance_id != r.iid for v in b.list()), 20, "the host forgot it")
    last = [s.kind for s in history(b, r.iid)][-2:]
    assert last == ["instance.exited", "instance.unloaded"], history(b, r.iid)
    spec = msgspec.convert(history(b, r.iid)[0].event.spec, InstanceSpec)
    assert b.place(spec) == r.iid  # its id is free again
    b.unload(r.iid)
    b.shutdown()  # nothing left that refuses the shutdown's stop
    assert verify_chain(b.settings.chain_path).ok
    assert [e.kind for e in history(b, r.iid)][-1] == "instance.unloaded"
