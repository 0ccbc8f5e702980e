"""Issue 21, crash: a node killed (SIGKILL, a real kill) between an eviction's
events and its effects decides the same after boot, and nothing runs twice.

A child node (tests/programs/residency_node.py) demands three on-demand
instances with room for two; the third evicts the least recently used. Its
servers ignore SIGTERM, so the victim's stop is in flight for the whole grace:
the node is killed then, with ``residency.evicted`` and the stop to rest
durable, the victim's server alive and the demanded start not yet made. The
node opened again on the same chain finishes the victim's stop (it rests),
resumes the recorded demand (its start made once, after the victim's memory
is back) and leaves the third instance running as it was.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import (
    CRASH_LEAVES_SOCKETS,
    FAKE_GGUF,
    PROGRAMS,
    chain_rows,
    free_ports,
    make_launcher,
    wait_until,
)

from infervisor.actors.node import Node
from infervisor.actors.settings import NodeSettings
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.chain import verify_chain
from infervisor.replay import RestartPolicy

pytestmark = [pytest.mark.slow, *CRASH_LEAVES_SOCKETS]

OVERHEAD = 1000
GRACE_S = 6.0  # the victim ignores SIGTERM: its stop is in flight this long


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def rows_of(db: Path, kind: str, subject: str) -> list[Any]:
    return [r for r in chain_rows(db) if r[2] == kind and r[3] == subject]


def three_on_demand(
    tmp_path: Path, *, stopped_c: bool = False, c_restart: dict[str, float] | None = None
) -> tuple[dict[str, Any], NodeSettings, list[str]]:
    """The child node's settings (fields and struct) and three on-demand instances
    with room for two, placed by a node that has closed (nothing runs): m1, m2, m3
    (``stopped_c``: c stopped by an operator; ``c_restart``: c's restart policy)."""
    models = tmp_path / "models"
    models.mkdir()
    for name in ("m1", "m2", "m3"):
        (models / f"{name}.gguf").write_bytes(FAKE_GGUF + bytes(4000))
    needs = (models / "m1.gguf").stat().st_size + OVERHEAD
    fields: dict[str, Any] = {
        "node_id": "n1",
        "data_dir": str(tmp_path / "data"),
        "registry_dir": str(models),
        "llamacpp_program": make_launcher(tmp_path, PROGRAMS / "fault_ignore_term.py"),
        "health_interval_s": 0.2,
        "reconcile_interval_s": 0.5,
        "stop_grace_s": GRACE_S,
        "health_kill_grace_s": 2.0,
        "memory_budget_bytes": 2 * needs + 10,
        "reserve_overhead_bytes": OVERHEAD,
        "restart": {"base_s": 0.2, "cap_s": 1.0, "stable_after_s": 60.0},
    }
    settings = NodeSettings(**{**fields, "restart": RestartPolicy(**fields["restart"])})
    ports = free_ports(3)
    with Node.open(settings) as placer:  # nothing runs: they rest
        for name in ("m1", "m2", "m3"):
            placer.registry.adopt(name, models / f"{name}.gguf")
        iids = [
            placer.place(
                InstanceSpec(
                    role=f"r{n}", flavor=Flavor.LLAMACPP, model=f"m{n + 1}", port=ports[n],
                    on_demand=True, restart=c_restart if n == 2 else None,
                )
            )
            for n in range(3)
        ]  # fmt: skip
        if stopped_c:
            placer.stop(iids[2], by="operator:uid=1(alice)")
    return fields, settings, iids


def run_child(fields: dict[str, Any], asked: list[str]) -> subprocess.Popen[bytes]:
    """tests/programs/residency_node.py on ``fields``, asking ``asked`` in turn."""
    return subprocess.Popen(
        [
            sys.executable,
            str(PROGRAMS / "residency_node.py"),
            json.dumps(fields),
            json.dumps(asked),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )


def end(child: subprocess.Popen[bytes], node: Node | None, db: Path) -> None:
    """Whatever the test left: the child, the node opened again, every server."""
    if child.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    for pipe in (child.stdin, child.stdout):
        if pipe is not None:
            pipe.close()
    if node is not None:
        node.shutdown()
    for r in chain_rows(db):
        if r[2] == "instance.spawned":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(r[4]["pgid"], signal.SIGKILL)


def kill_the_node_only(child: subprocess.Popen[bytes], db: Path, a: str) -> tuple[int, int]:
    """SIGKILL the node mid-eviction of ``a``, whose server lives on under its shim:
    (the victim's pid, the chain's head seq at the kill)."""
    victim = rows_of(db, "instance.spawned", a)[-1][4]["pid"]
    os.killpg(child.pid, signal.SIGKILL)  # the node only: its servers live on under their shims
    child.wait(timeout=30)
    assert alive(victim), "the victim died with the node"
    return victim, chain_rows(db)[-1][0]


def booted(node: Node, db: Path, ids: tuple[str, str, str], victim: int, head: int) -> list[Any]:
    """Once the node opened again has c running and a resting (a's server gone, b
    still running): the chain's rows recorded after ``head``."""
    a, b, c = ids
    wait_until(lambda: node.status(c).lifecycle == "running", 60, "c running after boot")
    wait_until(lambda: node.status(a).lifecycle == "resting", 30, "a resting")
    assert not alive(victim)
    assert node.status(b).lifecycle == "running"
    return [r for r in chain_rows(db) if r[0] > head]


@pytest.mark.parametrize("asker", ["request", "operator"])
def test_a_node_killed_mid_eviction_decides_the_same_after_boot(tmp_path: Path, asker: str) -> None:
    """``operator``: the third instance was stopped by an operator, and its start
    is the operator's verb (it makes room as a request's does; the start recorded
    as demanded is resumed at boot though the instance was stopped)."""
    fields, settings, (a, b, c) = three_on_demand(tmp_path, stopped_c=asker == "operator")
    db = settings.chain_path
    child = run_child(fields, [a, b, c if asker == "request" else f"start:{c}"])
    node: Node | None = None
    try:
        # the eviction of a (the least recently used) is durable; its server lives on
        wait_until(lambda: rows_of(db, "instance.stop_requested", a), 60, "a's eviction")
        (evicted,) = rows_of(db, "residency.evicted", a)
        assert evicted[4]["for_instance"] == c
        assert rows_of(db, "instance.stop_requested", a)[0][4]["then"] == "rest"
        (demanded,) = rows_of(db, "residency.demanded", c)
        assert demanded[4]["request"] == ("verb" if asker == "operator" else f"req-{c[:6]}")
        assert not rows_of(db, "instance.exited", a)
        assert not rows_of(db, "instance.starting", c)
        victim, head = kill_the_node_only(child, db, a)
        node = Node.open(settings)
        after = booted(node, db, (a, b, c), victim, head)
        # nothing ran twice: one eviction, one stop of a; one demand, one start of c; b reattached
        assert len(rows_of(db, "residency.evicted", a)) == 1
        assert len(rows_of(db, "instance.stop_requested", a)) == 1
        assert len(rows_of(db, "residency.demanded", c)) == 1
        assert len(rows_of(db, "instance.starting", c)) == 1
        assert len(rows_of(db, "instance.starting", b)) == 1
        assert not [r for r in after if r[2] == "residency.refused"]
        assert [r[2] for r in after if r[3] == b][:1] == ["instance.reattached"]
        (exited,) = rows_of(db, "instance.exited", a)
        starting = rows_of(db, "instance.starting", c)[0]
        assert exited[0] < starting[0]  # the start came once the victim's memory was back
        led = node.ledger()
        assert led is not None and led.in_use_bytes <= led.budget_bytes
        assert verify_chain(db).ok
    finally:
        end(child, node, db)


def test_a_victim_that_dies_with_the_node_mid_eviction_gives_its_memory_back_at_boot(
    tmp_path: Path,
) -> None:
    """As above, but the victim's server dies too (SIGKILL) before the node opens
    again: the boot records its exit in the victim's first decision, and the
    ledger the boot seeded with the victim's reservation lets it go, so the
    demanded start fits (before the fix: ``residency.refused ... needs N bytes
    beside 2N in use``, the victim held until a clean restart)."""
    fields, settings, (a, b, c) = three_on_demand(tmp_path)
    db = settings.chain_path
    child = run_child(fields, [a, b, c])
    node: Node | None = None
    try:
        wait_until(lambda: rows_of(db, "instance.stop_requested", a), 60, "a's eviction")
        assert not rows_of(db, "instance.exited", a)
        victim = rows_of(db, "instance.spawned", a)[-1][4]["pid"]
        held = rows_of(db, "instance.starting", a)[-1][4]["reserved_bytes"]
        assert held > 0
        os.killpg(child.pid, signal.SIGKILL)  # the node
        child.wait(timeout=30)
        os.kill(victim, signal.SIGKILL)  # and the victim's server, while no node runs
        wait_until(lambda: not alive(victim), 30, "the victim gone")
        head = chain_rows(db)[-1][0]

        node = Node.open(settings)
        wait_until(lambda: node.status(c).lifecycle == "running", 60, "c running after boot")
        assert node.status(a).lifecycle == "resting"
        assert node.status(b).lifecycle == "running"
        (exited,) = rows_of(db, "instance.exited", a)
        assert exited[0] > head  # recorded by the boot
        after = [r for r in chain_rows(db) if r[0] > head]
        assert not [r for r in after if r[2] in ("residency.refused", "instance.start_refused")]
        assert len(rows_of(db, "instance.starting", c)) == 1
        # the room was a's: nothing else evicted for c (b was, when a boot decision ran late)
        assert [r[3] for r in chain_rows(db) if r[2] == "residency.evicted"] == [a]
        led = node.ledger()
        assert led is not None
        assert a not in led.reservations, f"the victim still holds {led.reservations}"
        assert set(led.reservations) == {b, c}
        assert led.in_use_bytes == sum(led.reservations.values()) <= led.budget_bytes
        assert verify_chain(db).ok
    finally:
        end(child, node, db)


def test_a_node_killed_between_a_restarts_eviction_and_the_restart_decides_the_same(
    tmp_path: Path,
) -> None:
    """a, then c run; c's server is killed and, while its restart backs off, b takes
    its room. c's restart, due, evicts a (the least recently used); the node is
    killed with ``residency.evicted`` and a's stop durable, a's server alive and
    c's restart not made. The node opened again finishes a's stop (it rests) and
    makes c's restart once, after a's memory is back, as the supervisor's (no
    demand, no use); b is re-attached as it was."""
    fields, settings, (a, b, c) = three_on_demand(tmp_path, c_restart={"base_s": 4.0, "cap_s": 8.0})
    db = settings.chain_path
    child = run_child(fields, [a, c, f"crash:{c}", b])
    node: Node | None = None
    try:
        wait_until(lambda: rows_of(db, "instance.stop_requested", a), 60, "a's eviction")
        (evicted,) = rows_of(db, "residency.evicted", a)
        assert evicted[4]["for_instance"] == c
        assert evicted[4]["cause"] == "its restart after an exit (attempt 1)"
        assert len(rows_of(db, "instance.starting", c)) == 1  # its first start only
        assert not rows_of(db, "instance.exited", a)
        victim, head = kill_the_node_only(child, db, a)
        node = Node.open(settings)
        after = booted(node, db, (a, b, c), victim, head)
        assert len(rows_of(db, "residency.evicted", a)) == 1
        assert len(rows_of(db, "instance.stop_requested", a)) == 1
        assert len(rows_of(db, "residency.demanded", c)) == 1  # its first start's, no more
        starts = rows_of(db, "instance.starting", c)
        assert len(starts) == 2 and (starts[1][4]["by"], starts[1][4]["attempt"]) == (
            "supervisor",
            1,
        )
        assert len(rows_of(db, "instance.starting", b)) == 1
        assert not [r for r in after if r[2] in ("residency.refused", "instance.start_refused")]
        assert [r[2] for r in after if r[3] == b][:1] == ["instance.reattached"]
        (exited,) = rows_of(db, "instance.exited", a)
        assert exited[0] < starts[1][0]  # the restart came once the victim's memory was back
        led = node.ledger()
        assert led is not None and led.in_use_bytes <= led.budget_bytes
        assert verify_chain(db).ok
    finally:
        end(child, node, db)
