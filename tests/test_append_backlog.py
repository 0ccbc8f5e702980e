"""A failed append never drops an observation (issue 17, item 5): the backlog.

The chain append seam (``SqliteChain.append_many``) fails on command with the
chain's own error, as a full disk makes it; the instance actor must keep the
refused observation and every later one, in order, decide nothing meanwhile,
refuse verbs at once, and tell the true story once the chain takes writes
again. Real processes (the fake llama.cpp server), a real chain, a manual
clock for the retries. The same with a real full disk and a real held lock:
tests/test_chain_refuses_writes.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sqlite3
from typing import Any

import msgspec
import pytest
from support import wait_until
from test_crash_recovery import POLICY, alive, consistent, server_pid
from test_crash_recovery_ownership import SLOW, retries_until
from test_misbehaving_servers import count, history, listening, nothing_left, rig, tick_to

from infervisor.actors import messages as m
from infervisor.actors.backlog import COALESCED, RETRY_CAP_S, Backlog
from infervisor.actors.core import observations as o
from infervisor.actors.errors import RecordFailed
from infervisor.actors.health_checks import Probed
from infervisor.adapters.probe import Health, HealthKind, ServerReport
from infervisor.chain import SqliteChain
from infervisor.chain.connect import immediate
from infervisor.chain.errors import ChainIOError
from infervisor.replay import RestartPolicy
from infervisor.tools.api.wire import NodeInfo
from infervisor.tools.operator.status import chain_refusal

DISK_FULL = "injected: database or disk is full"


class AppendSwitch:
    """The chain append seam, refusing every append while ``error`` is set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.error: Exception | None = None
        self.refused = 0
        original = SqliteChain.append_many

        def append_many(chain: SqliteChain, drafts: Any) -> Any:
            drafts = list(drafts)
            if self.error is not None and drafts:
                self.refused += 1
                raise self.error
            return original(chain, drafts)

        monkeypatch.setattr(SqliteChain, "append_many", append_many)


@pytest.fixture
def switch(monkeypatch: pytest.MonkeyPatch) -> AppendSwitch:
    return AppendSwitch(monkeypatch)


# ---------------------------------------------------------------- the backlog alone


def test_the_backlog_keeps_order_coalesces_only_ticks_and_backs_off_without_limit() -> None:
    b = Backlog(base_s=0.5, cap_s=RETRY_CAP_S)
    exit_ = o.GroupGone(pid=7, exit_code=None, signal=9)
    b.put_back([exit_])
    for obs in (o.Tick(), o.Tick(), o.ProcessExited(pid=7), o.Tick()):
        b.hold(obs)
    assert b.waiting() == [exit_, o.Tick(), o.ProcessExited(pid=7), o.Tick()]
    b.hold(o.ListenersSeen(owned_beyond=("0.0.0.0:1",)))
    b.hold(o.ListenersSeen(owned_beyond=("0.0.0.0:2",)))  # the newer snapshot replaces it
    assert b.waiting()[-1] == o.ListenersSeen(owned_beyond=("0.0.0.0:2",))
    assert len(b) == 5
    assert set(COALESCED) == {o.Tick, o.ListenersSeen}  # never an exit, a timer, a probe

    delays = []
    for _ in range(40):  # no limit on retries; the delay is capped
        delay = b.next_delay()
        assert delay is not None
        assert b.next_delay() is None  # one retry armed at a time
        b.retry_due()
        delays.append(delay)
    assert delays[:4] == [0.5, 1.0, 2.0, 4.0]
    assert max(delays) == RETRY_CAP_S == delays[-1]

    assert b.failed("disk full") and not b.failed("disk full") and b.failed("locked")
    assert "5 observations wait, in order" in b.fault()
    head = b.take()
    b.put_back([head])
    assert b.take() == exit_
    assert b.recovered()
    assert not b.recovered()


def test_a_commit_that_fails_is_rolled_back_and_the_connection_goes_on(tmp_path) -> None:
    """A COMMIT refused (here a deferred constraint; SQLITE_FULL and SQLITE_BUSY the
    same way) leaves no transaction open: the next BEGIN IMMEDIATE works."""
    conn = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("CREATE TABLE p (id INTEGER PRIMARY KEY)")
    conn.execute("CREATE TABLE c (p INTEGER REFERENCES p(id) DEFERRABLE INITIALLY DEFERRED)")
    with pytest.raises(sqlite3.IntegrityError), immediate(conn):
        conn.execute("INSERT INTO c VALUES (1)")  # refused only at COMMIT
    assert not conn.in_transaction
    with immediate(conn):
        conn.execute("INSERT INTO p VALUES (1)")
    assert conn.execute("SELECT count(*) FROM c").fetchone() == (0,)


# ---------------------------------------------------------------- the actor


#: Uptime is counted from the spawn and a restarted server is found ready at the
#: first health tick, ``SLOW`` s later: a longer stability period is not over then.
LONG_STABLE = RestartPolicy(max_restarts=3, base_s=1.0, cap_s=3.0, stable_after_s=1.5 * SLOW)

#: Every observation kind the backlog path must hold in the scenario below.
HELD = ("GroupGone", "Tick", "DeepChecked", "ProbeResult", "ProcessExited")


def _slow(nodes, tmp_path, fake_model, manual_clock, restart: RestartPolicy = POLICY) -> Any:
    """Health and reconcile ticks every ``SLOW`` s: the test sends its own."""
    return rig(
        nodes, tmp_path, fake_model, manual_clock, "fake_llama.py", restart=restart,
        health_interval_s=SLOW, reconcile_interval_s=SLOW,
    )  # fmt: skip


def _killed_while_refused(r: Any, switch: AppendSwitch) -> int:
    """The server SIGKILLed while the chain refuses: its exit waits. Returns its pid."""
    pid = server_pid(r)
    switch.error = ChainIOError(DISK_FULL)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: switch.refused, 20, "the exit's append to be refused")
    return pid


def test_every_observation_waits_in_order_and_the_exit_is_told_true(
    nodes, tmp_path, fake_model, manual_clock, switch, caplog
):
    r = _slow(nodes, tmp_path, fake_model, manual_clock)
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    before = len(history(r.node, r.iid))
    pid = _killed_while_refused(r, switch)
    ref = r.node._ref(r.iid)
    unreachable = ServerReport(health=Health(kind=HealthKind.UNREACHABLE, reason="refused"))
    for message in (
        m.HealthTick(),  # sends no probe: no verdict on a state the chain lacks
        m.ReconcileTick(listeners=None, processes=None),
        m.ReconcileTick(listeners=None, processes=None),  # coalesced with the one before
        o.DeepChecked(token=pid, error="no token"),
        Probed(token=pid, report=unreachable, latency_s=0.0),  # sent before the exit
        o.ProcessExited(pid=pid),  # a second report of the exit: never dropped
    ):
        ref.tell(message)
    for verb in (r.node.stop, r.node.start, r.node.restart):
        with pytest.raises(RecordFailed, match="nothing was done"):
            verb(r.iid)
    view = r.status()  # answered after every message above was handled
    assert (view.lifecycle, view.desired, view.pid) == ("running", "running", pid)
    assert "5 observations wait, in order, for the chain to record them" in view.reason
    assert DISK_FULL in view.reason
    status = r.node.append_status()
    assert not status.writable and status.since_ns is not None
    assert status.error is not None and DISK_FULL in status.error

    backlog: Backlog = ref.proxy().backlog.get(timeout=20)
    never = [kind for kind in HELD if not backlog.held[kind]]
    assert not never, f"never held in the backlog: {never}"
    assert [type(w).__name__ for w in backlog.waiting()] == list(HELD)
    assert r.node.settled(r.iid)  # no probe in flight: the health tick sent none
    assert len(history(r.node, r.iid)) == before  # nothing decided, nothing recorded
    retries_until(manual_clock, lambda: switch.refused >= 4, "the head retried, refused")
    said = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len([s for s in said if "could not record a decision" in s]) == 1  # once per kind
    assert len([s for s in said if s.startswith("the chain refuses writes")]) == 1
    assert [type(w).__name__ for w in backlog.waiting()] == list(HELD)

    switch.error = None
    retries_until(manual_clock, lambda: count(r.node, r.iid, "restart_scheduled"), "the exit")
    wait_until(lambda: r.node.append_status().writable, 20, "the chain writable again")
    after = history(r.node, r.iid)[before:]
    # The restart itself may follow already: retries_until may advance the clock to
    # its backoff in the moment between the scheduling's decision and its row.
    kinds = [s.kind.removeprefix("instance.") for s in after]
    assert kinds[:2] == ["exited", "restart_scheduled"] and kinds[2:] in ([], ["starting"]), kinds
    exited = after[0].event
    assert (exited.pid, exited.signal, exited.exit_code) == (pid, 9, None)
    assert exited.reason == "killed by a signal infervisor did not send: signal 9 (SIGKILL)"
    assert "fault" not in r.status().reason
    assert not backlog and r.node.append_status().failures == switch.refused
    retries_until(manual_clock, lambda: count(r.node, r.iid, "starting") == 2, "the restart")
    listening(r.port)
    r.node.stop(r.iid)
    assert not alive(pid)
    consistent(r.node)
    nothing_left(r.node)


def test_no_stable_is_recorded_for_a_server_whose_exit_waits(
    nodes, tmp_path, fake_model, manual_clock, switch
):
    """The issue's held lock: a tick after the lock was released found the dead
    server "stable" before its exit was recorded. The tick now waits its turn."""
    r = _slow(nodes, tmp_path, fake_model, manual_clock, restart=LONG_STABLE)
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    os.kill(server_pid(r), signal.SIGKILL)
    retries_until(manual_clock, lambda: count(r.node, r.iid, "starting") == 2, "a restart")
    listening(r.port)
    tick_to(r, "running")
    assert r.node.rebuild().instances[r.iid].restarts == 1  # not cleared yet
    before = len(history(r.node, r.iid))
    manual_clock.advance(LONG_STABLE.stable_after_s - SLOW)  # up long enough; no tick yet
    pid = _killed_while_refused(r, switch)
    switch.error = None  # the chain takes writes; the exit's retry is not due yet
    r.node._ref(r.iid).tell(m.ReconcileTick(listeners=None, processes=None))
    retries_until(manual_clock, lambda: count(r.node, r.iid, "exited") == 2, "the exit")
    wait_until(lambda: r.node.settled(r.iid), 20, "settled")
    kinds = [s.kind.removeprefix("instance.") for s in history(r.node, r.iid)[before:]]
    assert kinds[0] == "exited", kinds
    assert "stable" not in kinds
    with contextlib.suppress(RecordFailed):
        r.node.stop(r.iid)
    assert not alive(pid)
    consistent(r.node)
    nothing_left(r.node)


def test_status_warns_while_the_chain_refuses_writes() -> None:
    info = NodeInfo(
        node_id="n1", version="0", phase="open", head_seq=3, head_hash="ab", instances=1,
        lease_s=None, chain_writable=False, chain_error=f"ChainIOError: {DISK_FULL}",
        chain_failing_since_ns=1_800_000_000 * 10**9, chain_append_failures=4,
    )  # fmt: skip
    warning = chain_refusal(info)
    assert warning is not None
    assert "refuses writes since 2027-01-15T08:00:00+00:00" in warning
    assert DISK_FULL in warning and "free disk space" in warning
    assert chain_refusal(msgspec.structs.replace(info, chain_writable=True)) is None
