"""A stop recorded but never sent: the node died between ``instance.stop_requested``
and its SIGTERM (a newcomer's trial, stop 33: the next boot found the grace spent
during the downtime and sent SIGKILL 27 ms after re-attaching).

The boot cannot know whether SIGTERM was sent, so it resumes a stop whose server
still lives with SIGTERM and the stop's full grace from the boot, recorded in an
``instance.terminating`` (actors/core/boot.py). Here the first node's SIGTERM is
suppressed (its effect handler does nothing), the node "crashes" in-process
(tests/test_crash_recovery.py ``crash``: actors dropped, the real server left
running), the ManualClock passes well beyond the grace, and a second node opens
the same data directory. The real server (tests/programs/fake_llama.py) ends on
SIGTERM; the clock stands still after the boot, so only SIGTERM can end it.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from conftest import NodeFactory
from support import CRASH_LEAVES_SOCKETS, wait_until
from test_crash_recovery import consistent, crash, reopen, server_pid
from test_misbehaving_servers import (
    Rig,
    history,
    listening,
    nothing_left,
    of_kind,
    rig,
    tick_to,
)
from test_run_resume import ignores_sigterm

from infervisor.actors import effects_runner
from infervisor.actors.clock import ManualClock
from infervisor.actors.core import effects as fx
from infervisor.actors.core.common import armed_kill
from infervisor.replay import events as ev

pytestmark = CRASH_LEAVES_SOCKETS

GRACE_S = 30.0  # the stop's grace; the downtime below is longer
SHORT_GRACE_S = 2.0  # waited out in real time (kill timers are physical)


def test_a_stop_the_dead_node_never_sent_gets_sigterm_and_its_grace_at_boot(
    nodes: NodeFactory,
    tmp_path: Path,
    fake_model: Path,
    manual_clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r = rig(nodes, tmp_path, fake_model, manual_clock, "fake_llama.py")
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    pid = server_pid(r)
    b = _stop_never_sent(nodes, r, monkeypatch, GRACE_S)
    wait_until(lambda: of_kind(history(b.node, b.iid), "exited"), 20, "the server's exit")
    steps = history(b.node, b.iid)
    exited = of_kind(steps, "exited")[-1].event
    assert isinstance(exited, ev.Exited) and exited.pid == pid
    # Ended by the boot's SIGTERM, not by a SIGKILL for a grace spent while down.
    assert exited.signal != signal.SIGKILL, exited
    resumed = of_kind(steps, "terminating")
    assert len(resumed) == 1, steps
    assert isinstance(resumed[0].event, ev.Terminating)
    assert resumed[0].event.grace_s == GRACE_S
    assert resumed[0].event.cause.startswith("stopped by operator")
    assert b.status().lifecycle == "stopped"
    consistent(b.node)
    nothing_left(b.node)


def _stop_never_sent(
    nodes: NodeFactory,
    r: Rig,
    monkeypatch: pytest.MonkeyPatch,
    grace_s: float,
) -> Rig:
    """Record a stop (``grace_s``) whose SIGTERM never leaves, crash the node, let
    three graces pass on its clock while no node runs, and boot a second node."""
    monkeypatch.setitem(effects_runner._HANDLERS, fx.Terminate, lambda runner, effect: None)
    r.node.stop(r.iid, grace_s=grace_s, wait=False)
    wait_until(lambda: of_kind(history(r.node, r.iid), "stop_requested"), 20, "stop_requested")
    crash(r.node)
    monkeypatch.undo()
    r.clock.advance(grace_s * 3)
    return reopen(nodes, r.node, r.clock, r.iid, r.port)


def test_a_server_ignoring_the_resumed_sigterm_is_killed_a_full_grace_after_the_boot(
    nodes: NodeFactory,
    tmp_path: Path,
    fake_model: Path,
    manual_clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real kill: a server that ignores SIGTERM (tests/programs/fault_ignore_term.py)
    gets SIGKILL once the boot's recorded grace has passed on the node's clock."""
    r = rig(nodes, tmp_path, fake_model, manual_clock, "fault_ignore_term.py")
    r.node.start(r.iid)
    listening(r.port)
    tick_to(r, "running")
    pid = server_pid(r)
    wait_until(lambda: ignores_sigterm(pid), 20, "the server ignoring SIGTERM")
    b = _stop_never_sent(nodes, r, monkeypatch, SHORT_GRACE_S)
    wait_until(lambda: of_kind(history(b.node, b.iid), "terminating"), 20, "the boot's grace")
    resumed = of_kind(history(b.node, b.iid), "terminating")[-1]
    inst = b.node.rebuild().instances[b.iid]
    due = armed_kill(inst)
    # The kill the chain records is due a full grace after the boot's decision.
    assert due is not None and due.wall_ns == resumed.ts_ns + int(SHORT_GRACE_S * 1e9)
    assert of_kind(history(b.node, b.iid), "exited") == []
    # Kill timers run in real time (actors/effects_runner.py: a grace is physical).
    wait_until(lambda: of_kind(history(b.node, b.iid), "exited"), 20, "the server's exit")
    exited = of_kind(history(b.node, b.iid), "exited")[-1]
    assert isinstance(exited.event, ev.Exited) and exited.event.signal == signal.SIGKILL
    assert b.status().lifecycle == "stopped"
    consistent(b.node)
    nothing_left(b.node)
