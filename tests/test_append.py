"""The chain append seam (actors/append.py) and its fake (actors/append_fake.py).

One contract, run against both: the real client on a real ChainWriter and
SQLite file, and the in-memory fake. Then what only the fake can do on
command (refuse, hang), and an instance actor on the fake: a refused append
runs no effect of its decision and drops no observation (issue 20: decide,
append, then act).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pykka
import pytest
from support import wait_until
from test_managed_lifecycle import spec

from infervisor.actors import messages as m
from infervisor.actors.append import ChainAppend, Entry, WriterAppend
from infervisor.actors.append_fake import FakeAppend
from infervisor.actors.backlog import RETRY_BASE_S
from infervisor.actors.chain_writer import ChainWriter
from infervisor.actors.clock import ManualClock
from infervisor.actors.context import InstanceContext
from infervisor.actors.instance import InstanceActor
from infervisor.adapters import planning
from infervisor.adapters.ports import free_port
from infervisor.adapters.registry import ModelRegistry
from infervisor.adapters.spec import instance_id
from infervisor.chain import SqliteChain, StoredEvent
from infervisor.chain.errors import ChainIOError
from infervisor.replay import InstanceState, apply_instance
from infervisor.replay import events as ev

TIMEOUT_S = 20.0
NODE = "node-a"
STARTED = ev.NodeStarted(pid=1, boot_id="boot", version="test")

#: A contract case: the append under test, and how to read back what it stored.
Case = tuple[ChainAppend, Callable[[], list[StoredEvent]]]


@pytest.fixture(params=["writer", "fake"])
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Case]:
    clock = ManualClock()
    if request.param == "fake":
        fake = FakeAppend(clock, NODE)
        yield fake, lambda: list(fake.stored)
        return
    path = tmp_path / "chain.db"
    writer = ChainWriter.start(path, NODE)

    def read() -> list[StoredEvent]:
        with SqliteChain.open_readonly(path) as chain:
            return [e for e in chain.events() if e.seq > 0]  # past genesis

    try:
        yield WriterAppend(writer, clock), read
    finally:
        writer.stop()


def test_an_append_answers_its_records_in_order_once_stored(case: Case) -> None:
    chain, read = case
    (started,) = chain.append([STARTED], source="node", ts_ns=42)
    refused = ev.StartRefused(by="boot", reason="model gone")
    batch = chain.append_batch([Entry(refused, "node", "i1"), Entry(refused, "operator", "i2")])
    later = chain.submit([STARTED], source="controller").get(timeout=TIMEOUT_S)
    assert chain.append([], source="node") == ()  # nothing asked
    stored = read()
    assert stored == [started, *batch, *later]
    assert [e.seq for e in stored] == sorted({e.seq for e in stored})
    assert (started.ts_ns, started.kind, started.source, started.subject) == (
        42, "node.started", "node", "",
    )  # fmt: skip
    assert [(e.kind, e.source, e.subject) for e in batch] == [
        ("instance.start_refused", "node", "i1"),
        ("instance.start_refused", "operator", "i2"),
    ]
    assert ev.decode_event(batch[0]) == refused


def test_the_writer_append_fails_once_the_writer_is_gone(tmp_path: Path) -> None:
    writer = ChainWriter.start(tmp_path / "chain.db", NODE)
    chain = WriterAppend(writer, ManualClock())
    writer.stop()
    with pytest.raises(pykka.ActorDeadError):
        chain.append([STARTED], source="node")


def test_the_fake_refuses_stores_nothing_and_hangs_on_command() -> None:
    fake = FakeAppend(ManualClock(), NODE)
    fake.append([STARTED], source="node")
    fake.refuse(ChainIOError("injected: database or disk is full"))
    with pytest.raises(ChainIOError, match="disk is full"):
        fake.append([STARTED, STARTED], source="node")
    assert (fake.refused, fake.kinds()) == (1, ["node.started"])  # all or nothing

    fake.refuse(None)
    fake.hang()
    with pytest.raises(pykka.Timeout):
        fake.append([STARTED], source="node", timeout_s=0.01)  # never answered while hung
    held = fake.submit([STARTED], source="controller")
    assert fake.kinds() == ["node.started"]
    fake.release()  # as a writer that gets the lock: what it held commits, in order
    assert [e.seq for e in held.get(timeout=TIMEOUT_S)] == [3]
    assert [e.source for e in fake.stored] == ["node", "node", "controller"]


# ---------------------------------------------------------------- an actor on the fake


def _instance(
    nodes, fake_llama: str, fake_model: Path, chain: FakeAppend, clock: ManualClock
) -> tuple[pykka.ActorRef[InstanceActor], str]:
    """A placed (not started) llama.cpp instance's actor recording into ``chain``."""
    settings = nodes.settings(fake_llama, fake_model)
    Path(settings.data_dir).mkdir(parents=True)
    registry = ModelRegistry(settings.registry_path)
    registry.adopt("tiny", fake_model / "tiny.gguf")
    placed = spec(free_port())
    iid = instance_id(placed, settings.node_id)
    adapter = planning.build_adapter(placed, iid, registry, settings.adapter_settings())
    event = ev.Placed(spec=msgspec.to_builtins(placed), placed_by="n1")
    (record,) = chain.append([event], source="operator", subject=iid)
    state: InstanceState | None = apply_instance(None, record, event)
    assert state is not None
    ctx = InstanceContext(settings.node_id, chain, clock, settings)
    return InstanceActor.start(state, adapter, ctx), iid


def test_a_refused_append_runs_no_effect_and_keeps_the_observation(
    nodes, fake_llama: str, fake_model: Path
) -> None:
    clock = ManualClock()
    chain = FakeAppend(clock, "n1")
    actor, iid = _instance(nodes, fake_llama, fake_model, chain, clock)
    try:
        chain.refuse(ChainIOError("injected: database or disk is full"))
        view = actor.ask(m.Start(by="operator"), timeout=TIMEOUT_S)
        # The start's checks passed; its instance.starting was refused: no spawn.
        assert (view.lifecycle, view.pid) == ("loaded", None)
        assert "1 observation waits" in view.reason
        assert chain.kinds(iid) == ["instance.placed"] and chain.refused == 1

        chain.refuse(None)
        clock.advance(RETRY_BASE_S)  # the backlog's retry: the kept observation is decided
        wait_until(lambda: "instance.spawned" in chain.kinds(iid), TIMEOUT_S, "the spawn")
        assert chain.kinds(iid)[:3] == ["instance.placed", "instance.starting", "instance.spawned"]
        stopped = actor.ask(m.Stop(by="operator"), timeout=TIMEOUT_S).result(TIMEOUT_S)
        assert stopped.pid is None and "fault" not in stopped.reason
    finally:
        actor.stop()
