"""Issue 21 with real llama.cpp servers (``infervisor-llama-server``) on the
project's tiny model, through the front and the official ``openai`` client.

The registry holds four copies of the tiny GGUF under different names, so the
ledger reserves real file sizes (plus the node's overhead); the memory budget
has room for two. What each test proves is in its name; the fake-server
versions of the same rules are in tests/test_residency_node.py.

Marked slow: run alone with ``pytest -m slow``.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import openai
import pytest
from conftest import NodeFactory
from support import chain_rows, free_ports, wait_until

from infervisor.actors.kinds import KindSettings
from infervisor.actors.node import Node
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.tools.api.auth import TcpAddress, Tokens
from infervisor.tools.api.scopes import Scope
from infervisor.tools.front import FrontConfig, FrontServer

pytestmark = pytest.mark.slow
pytest_plugins = ("real_front",)  # the fixtures front and sdk

OVERHEAD = 1_000_000
MODELS = ("m1", "m2", "m3", "m4")
HELLO = [{"role": "user", "content": "Hello"}]
#: The start-up deadline of the instances, seconds: how long a demand waits for room.
WAIT_S = 20.0


@pytest.fixture
def node(nodes: NodeFactory, tmp_path: Path, tiny_gguf: Path) -> Node:
    """A node whose budget has room for two of the four copies of the tiny model."""
    registry = tmp_path / "models"
    registry.mkdir()
    for name in MODELS:
        shutil.copy(tiny_gguf, registry / f"{name}.gguf")
    budget = 2 * (tiny_gguf.stat().st_size + OVERHEAD) + 10
    n = nodes.open(
        nodes.settings(
            "infervisor-llama-server",
            registry,
            memory_budget_bytes=budget,
            reserve_overhead_bytes=OVERHEAD,
            # A server paused mid-stream (below) must not be health-killed meanwhile.
            miss_limit=10_000,
            # A demand waits for busy instances up to its kind's start-up deadline
            # before it is refused (no_room): short here, so the refusal comes soon.
            kinds={"inference": KindSettings(startup_deadline_s=WAIT_S, startup_cap_s=WAIT_S)},
        )
    )
    for name in MODELS:
        n.registry.adopt(name, registry / f"{name}.gguf")
    return n


def place(node: Node, **fields: Any) -> dict[str, str]:
    """One on-demand instance per model (role = model name); ``fields[m]`` its extras."""
    ports = free_ports(len(MODELS))
    return {
        name: node.place(
            InstanceSpec(
                role=f"r-{name}",
                flavor=Flavor.LLAMACPP,
                model=name,
                port=ports[n],
                on_demand=True,
                **fields.get(name, {}),
            )
        )
        for n, name in enumerate(MODELS)
    }


def ask(sdk: openai.OpenAI, model: str) -> str:
    """A whole answer from ``model`` (4 tokens); its text."""
    answer = sdk.chat.completions.create(model=model, messages=HELLO, max_tokens=4)  # type: ignore[arg-type]
    assert answer.usage is not None and answer.usage.completion_tokens == 4
    return answer.choices[0].message.content or ""


def evictions(node: Node) -> list[tuple[str, dict[str, Any]]]:
    return [
        (s, p) for _, _, k, s, p in chain_rows(node.settings.chain_path) if k == "residency.evicted"
    ]


def used_after(node: Node, later: str, earlier: str) -> bool:
    return (node.status(later).last_use_ns or 0) > (node.status(earlier).last_use_ns or 0)


def idle(front: FrontServer, node: Node, *iids: str) -> None:
    """Every request to ``iids`` ended, and the node saw it (not busy)."""
    wait_until(
        lambda: (
            all(front.tally.snapshot().in_flight[i] == 0 for i in iids)
            and not any(node.status(i).busy for i in iids)
        ),
        30,
        f"{iids} idle",
    )


def test_eviction_takes_the_least_recently_used_and_never_a_pinned_or_higher_priority_one(
    node: Node, front: FrontServer, sdk: openai.OpenAI
) -> None:
    iid = place(node, m1={"pinned": True}, m4={"priority": 5})
    a, b, c, d = (iid[m] for m in MODELS)
    assert [node.status(i).lifecycle for i in (a, b, c, d)] == ["resting"] * 4

    # b then c fill the budget; b is used again, so c is the least recently used
    ask(sdk, "m2")
    ask(sdk, "m3")
    ask(sdk, "m2")
    idle(front, node, b, c)
    wait_until(lambda: used_after(node, b, c), 30, "b used after c")

    ask(sdk, "m1")  # a (pinned) does not fit: c goes, not b
    assert [node.status(i).lifecycle for i in (a, b, c)] == ["running", "running", "resting"]
    ((victim, first),) = evictions(node)
    assert victim == c and first["for_instance"] == a
    assert {x["instance_id"]: x["chosen"] for x in first["candidates"]} == {b: False, c: True}
    assert first["freed_bytes"] == first["needed_bytes"]  # copies of one file: one size
    assert first["budget_bytes"] == node.settings.memory_budget_bytes

    # b is used again: a (pinned) is now the least recently used, and still stays
    ask(sdk, "m2")
    idle(front, node, a, b)
    wait_until(lambda: used_after(node, b, a), 30, "b used after a")
    ask(sdk, "r-m4")  # d, priority 5, by its role
    assert node.status(a).lifecycle == "running" and node.status(b).lifecycle == "resting"
    victim, second = evictions(node)[1]
    assert victim == b and second["for_instance"] == d
    candidates = {x["instance_id"]: x for x in second["candidates"]}
    assert candidates[b]["chosen"] is True
    assert a not in candidates or candidates[a]["chosen"] is False
    assert candidates.get(a, {"pinned": True})["pinned"] is True

    # c (priority 0) finds a pinned and d of higher priority: nothing may go
    idle(front, node, a, d)
    with pytest.raises(openai.APIStatusError) as refused:
        ask(sdk, "m3")
    assert refused.value.status_code == 503
    assert refused.value.code == "no_room"
    assert int(refused.value.response.headers["retry-after"]) >= 1
    assert [node.status(i).lifecycle for i in (a, b, c, d)] == [
        "running",
        "resting",
        "resting",
        "running",
    ]
    assert len(evictions(node)) == 2  # the refusal evicted nothing
    refusals = [
        (s, p) for _, _, k, s, p in chain_rows(node.settings.chain_path) if k == "residency.refused"
    ]
    assert [s for s, _ in refusals] == [c]
    why = {x["instance_id"]: x["why_not"] for x in refusals[0][1]["candidates"]}
    assert why == {a: "pinned", d: "higher priority"}


def test_requests_during_a_load_are_queued_and_served_by_one_start(
    node: Node, front: FrontServer, sdk: openai.OpenAI
) -> None:
    a = place(node)["m1"]

    # four requests at once for a resting model: one start, all served
    answers: list[Any] = []

    def one(n: int) -> None:
        try:
            answers.append(ask(sdk, "m1"))
        except Exception as e:  # collected for the assertion
            answers.append(e)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [type(x) for x in answers] == [str] * 4, answers
    rows = [(k, s) for _, _, k, s, _ in chain_rows(node.settings.chain_path)]
    assert rows.count(("residency.demanded", a)) == 1
    assert rows.count(("instance.starting", a)) == 1


def test_a_model_mid_stream_is_never_evicted(
    node: Node, front: FrontServer, sdk: openai.OpenAI
) -> None:
    iid = place(node)
    a, b, c, d = (iid[m] for m in MODELS)
    ask(sdk, "m1")
    ask(sdk, "m2")  # a and b resident: the budget is full
    # Each server is paused (SIGSTOP of its group) BEFORE its stream is asked, so the
    # answer cannot end before the question for a third model, whatever the load: the
    # tiny model's whole answer (its 512-token context) takes well under a second on a
    # warm server, and a pause after the first chunk lost that race in a busy suite (the
    # answer ended into the sockets' buffers, the front ended the request, and the
    # instance was idle again, rightly evictable: the test raced the server, not the
    # rule). The front counts a request from the moment it sends it upstream.
    groups = [node.status(inst).pid for inst in (a, b)]
    streamed: dict[str, list[Any]] = {"m1": [], "m2": []}
    readers = [
        threading.Thread(target=stream_all, args=(sdk, name, out)) for name, out in streamed.items()
    ]
    paused: list[int] = []
    try:
        for group in groups:
            assert group is not None
            os.killpg(group, signal.SIGSTOP)
            paused.append(group)
        for reader in readers:
            reader.start()
        wait_until(lambda: busy_streams(front, node, a, b), 30, "both streams open and busy")

        # m3 waits up to its start-up deadline for one of them to end, then is refused
        with pytest.raises(openai.APIStatusError) as refused:
            ask(sdk, "m3")
        assert refused.value.status_code == 503 and refused.value.code == "no_room"
        assert int(refused.value.response.headers["retry-after"]) >= 1
        assert front.tally.snapshot().in_flight[a] == 1  # still streaming when refused
        assert front.tally.snapshot().in_flight[b] == 1
        assert evictions(node) == []
    finally:
        for group in paused:
            os.killpg(group, signal.SIGCONT)
        for reader in readers:
            if reader.ident is not None:  # started
                reader.join(120)

    for name, out in streamed.items():  # both streams then run to their end
        (reasons,) = out
        assert isinstance(reasons, list), (name, reasons)
        assert len(reasons) > 2 and reasons[-1] == "length", (name, reasons[-3:])
    assert [node.status(i).lifecycle for i in (a, b, c, d)] == [
        "running",
        "running",
        "resting",
        "resting",
    ]
    idle(front, node, a, b)
    ask(sdk, "m3")  # now one may go
    assert len(evictions(node)) == 1


def stream_all(sdk: openai.OpenAI, model: str, out: list[Any]) -> None:
    """Stream a 400-token answer of ``model`` to its end; its chunks' finish reasons
    (or the error) appended to ``out``."""
    try:
        stream: Any = sdk.chat.completions.create(
            model=model,
            messages=HELLO,  # type: ignore[arg-type]
            max_tokens=400,
            stream=True,
        )
        with stream:
            out.append([p.choices[0].finish_reason for p in stream if p.choices])
    except Exception as e:  # collected for the assertion
        out.append(e)


def busy_streams(front: FrontServer, node: Node, *iids: str) -> bool:
    """Each of ``iids`` holds one request open at the front and is busy at the node."""
    in_flight = front.tally.snapshot().in_flight
    return all(in_flight[i] == 1 and node.status(i).busy for i in iids)


def test_a_full_queue_is_503_with_retry_after_and_the_queued_requests_are_served_by_one_start(
    nodes: NodeFactory, tmp_path: Path, tiny_gguf: Path
) -> None:
    # The real server is held before it loads: its launcher waits on a FIFO (opened for
    # writing by the test) and then execs infervisor-llama-server, so the instance stays
    # `starting` for as long as the test needs, whatever the load, and then loads for real.
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    real = shutil.which("infervisor-llama-server") or str(
        Path(sys.executable).parent / "infervisor-llama-server"
    )
    launcher = tmp_path / "gated-llama-server"
    launcher.write_text(f'#!/bin/sh\ncat "{gate}" >/dev/null\nexec "{real}" "$@"\n')
    launcher.chmod(0o755)
    registry = tmp_path / "models"
    registry.mkdir()
    shutil.copy(tiny_gguf, registry / "m1.gguf")
    node = nodes.open(
        nodes.settings(
            str(launcher),
            registry,
            kinds={"inference": KindSettings(startup_deadline_s=120.0, startup_cap_s=120.0)},
        )
    )
    node.registry.adopt("m1", registry / "m1.gguf")
    iid = node.place(
        InstanceSpec(
            role="r-m1", flavor=Flavor.LLAMACPP, model="m1", port=free_ports(1)[0], on_demand=True
        )
    )
    port = free_ports(1)[0]
    config = FrontConfig(listen=f"127.0.0.1:{port}", queue_limit=2)
    secret = "queue-test-secret"
    tokens = Tokens({"ci": secret}, {"ci": Scope.OPERATE})
    with FrontServer.listen(config, TcpAddress("127.0.0.1", port), tokens, "n1") as front:
        front.serve(node)
        http = openai.DefaultHttpxClient(trust_env=False)
        with openai.OpenAI(
            base_url=f"{front.url}/v1", api_key=secret, max_retries=0, http_client=http
        ) as sdk:
            answers: list[Any] = []

            def one() -> None:
                try:
                    answers.append(ask(sdk, "m1"))
                except Exception as e:  # collected for the assertion
                    answers.append(e)

            waiters = [threading.Thread(target=one) for _ in range(2)]
            try:
                for t in waiters:
                    t.start()
                wait_until(lambda: front.tally.snapshot().waiting[iid] == 2, 60, "two waiting")
                assert node.status(iid).lifecycle == "starting"  # the requests started it
                with pytest.raises(openai.APIStatusError) as refused:
                    ask(sdk, "m1")  # a third: the queue (2) is full
                assert refused.value.status_code == 503 and refused.value.code == "queue_full"
                assert int(refused.value.response.headers["retry-after"]) >= 1
            finally:
                with open(gate, "wb"):  # the launcher's `cat` ends: the real server loads
                    pass
                for t in waiters:
                    t.join(120)
    assert [type(x) for x in answers] == [str, str], answers
    rows = [(k, s) for _, _, k, s, _ in chain_rows(node.settings.chain_path)]
    assert rows.count(("instance.starting", iid)) == 1  # one start served both
