"""Every route of the control API against a real node, over both listeners, each
answer checked against docs/openapi.json.

One ``infervisor run`` process serves the module, with the real llama.cpp
server (the launcher's embedded one) on the project's tiny model, the Unix
socket and a loopback TCP listener with a bearer token from
DATA_DIR/api-tokens.json. Every answer goes through :class:`Contract`: a status
the document does not list for the route, another media type, a body that does
not validate (or holds an undocumented field) fails the test. Each verb's
``seq``/``hash`` is looked up in DATA_DIR/chain.db: that row has that hash and
is the instance's.

Marked slow: it starts real llama.cpp servers.
"""

from __future__ import annotations

import json
import shutil
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import pids_of_group, wait_until
from test_openapi_doc import Contract
from test_run_resume import MODEL_BYTES, NodeRun, end_runs, server_groups
from tiles_support import grow_chain

from infervisor.adapters.ports import free_port
from infervisor.tools.api.serving.openapi_cli import DOC

pytestmark = pytest.mark.slow

LISTENERS = ("unix", "tcp")
RUNNING_S = 60.0


@pytest.fixture(autouse=True)
def _no_leftover_children() -> None:
    """Replaces conftest's per-test check: the node and its servers outlive each test
    here; the module fixture checks that nothing is left once the node stopped."""
    return


class Api:
    """The running node: a client per listener, each answer checked by its Contract."""

    def __init__(self, data: Path, tcp_url: str, token: str, budget: int) -> None:
        self.data = data
        self.db = data / "chain.db"
        self.budget = budget
        transport = httpx.HTTPTransport(uds=str(data / "api.sock"))
        self.clients = {
            "unix": httpx.Client(transport=transport, base_url="http://localhost", timeout=90),
            "tcp": httpx.Client(
                base_url=tcp_url, headers={"authorization": f"Bearer {token}"}, timeout=90
            ),
        }
        self.contracts = {listener: Contract() for listener in LISTENERS}

    def close(self) -> None:
        for client in self.clients.values():
            client.close()

    def send(self, listener: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.clients[listener].request(method, path, **kwargs)

    def call(self, listener: str, method: str, path: str, expect: int, **kwargs: Any) -> Any:
        """The checked body of an answer that must have status ``expect``."""
        response = self.send(listener, method, path, **kwargs)
        assert response.status_code == expect, (
            f"{method} {path} over {listener}: {response.status_code} {response.text[:500]}"
        )
        return self.contracts[listener].check(response)

    def refused(
        self, listener: str, method: str, path: str, expect: int, code: str, **kwargs: Any
    ) -> dict[str, Any]:
        """The error body of a refusal with status ``expect`` and ``code``."""
        error: dict[str, Any] = self.call(listener, method, path, expect, **kwargs)["error"]
        assert error["code"] == code, error
        return error

    def _one(self, sql: str, *args: object) -> tuple[object, ...] | None:
        """The first row of a query on the chain, read-only."""
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        try:
            row: tuple[object, ...] | None = conn.execute(sql, args).fetchone()
        finally:
            conn.close()
        return row

    def source_of(self, kind: str) -> str:
        """The source of the newest event of ``kind``."""
        found = self._one(
            "SELECT source FROM events WHERE kind = ? ORDER BY seq DESC LIMIT 1", kind
        )
        assert found is not None, f"no {kind} event in the chain"
        return str(found[0])

    def row(self, seq: int) -> tuple[str, str, str]:
        """(hash hex, subject, kind) of the chain's event ``seq``."""
        found = self._one("SELECT hash, subject, kind FROM events WHERE seq = ?", seq)
        assert found is not None, f"no event {seq} in the chain"
        return bytes(found[0]).hex(), str(found[1]), str(found[2])

    def on_chain(self, answer: dict[str, Any], instance_id: str) -> str:
        """The answer's seq/hash are the chain's event of ``instance_id``; its kind."""
        digest, subject, kind = self.row(answer["seq"])
        assert (digest, subject) == (answer["hash"], instance_id), (answer, kind)
        return kind

    def view(self, listener: str, instance_id: str) -> dict[str, Any]:
        view: dict[str, Any] = self.call(listener, "GET", f"/v1/instances/{instance_id}", 200)
        return view

    def until_lifecycle(self, listener: str, instance_id: str, lifecycle: str) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            view = self.view(listener, instance_id)
            return view if view["lifecycle"] == lifecycle else None

        found: dict[str, Any] = wait_until(reached, RUNNING_S, f"{instance_id} {lifecycle}")
        return found


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[Api]:
    root = tmp_path_factory.mktemp("api")
    data = root / "data"
    (data / "models").mkdir(parents=True)
    shutil.copy(tiny_gguf, data / "models" / "tiny.gguf")
    budget = 4 * tiny_gguf.stat().st_size  # a few tiny servers fit; "huge" never does
    (data / "models" / "huge.gguf").write_bytes(MODEL_BYTES.ljust(budget + 1, b"\0"))
    grow_chain(data, "n1", 0)  # a chain with a signed checkpoint for /v1/log
    tcp_port = free_port()
    config = root / "node.toml"
    config.write_text(
        f"""
[node]
node_id = "n1"
data_dir = "data"
health_interval_s = 0.1
reconcile_interval_s = 0.5
stop_grace_s = 5.0
memory_budget_bytes = {budget}

[api]
tcp = "127.0.0.1:{tcp_port}"

[[models]]
name = "tiny"
path = "tiny.gguf"

[[models]]
name = "huge"
path = "huge.gguf"
"""
    )
    run = NodeRun(config, root / "run.log")
    try:
        run.until("the API socket", (data / "api.sock").exists)
        tokens = json.loads((data / "api-tokens.json").read_text())
        # "controller" holds scope control: it may place and heartbeat (docs/api.md).
        node = Api(data, f"http://127.0.0.1:{tcp_port}", tokens["controller"], budget)
        run.until("the node open", lambda: node.send("unix", "GET", "/v1/node").status_code == 200)
        yield node
        node.close()
        assert run.stop() == 0, run.output()
        left = [g for g in server_groups(node.db) if pids_of_group(g)]
        assert not left, f"server process groups left running: {left}"
    finally:
        end_runs([run], data / "chain.db")


def spec(role: str, port: int, **extra: Any) -> dict[str, Any]:
    return {"role": role, "flavor": "llamacpp", "model": "tiny", "port": port, **extra}


# ---------------------------------------------------------------- reading
@pytest.mark.parametrize("listener", LISTENERS)
def test_the_reading_routes(api: Api, listener: str) -> None:
    node = api.call(listener, "GET", "/v1/node", 200)
    assert node["phase"] == "open" and node["node_id"] == "n1"
    assert node["containment"] in ("cgroup2", "cgroup1", "pgroup")  # and why:
    assert node["containment_reason"]
    assert api.row(node["head_seq"])[0] == node["head_hash"]
    assert isinstance(api.call(listener, "GET", "/v1/instances", 200), list)
    ledger = api.call(listener, "GET", "/v1/ledger", 200)
    assert ledger["budget_bytes"] == api.budget
    assert node["inventory"]["memory_budget_bytes"] == api.budget
    models = api.call(listener, "GET", "/v1/models", 200)["models"]
    assert "tiny" in [m["name"] for m in models]
    metrics = api.call(listener, "GET", "/metrics", 200)
    assert "infervisor_up 1" in metrics

    events = api.call(listener, "GET", "/v1/events", 200, params={"from_seq": 0, "follow": False})
    assert [e.id for e in events] == [str(n) for n in range(len(events))]
    assert events[0].event == "chain.genesis"
    for e in events:
        body = json.loads(e.data)
        assert (body["seq"], body["kind"]) == (int(e.id), e.event)
        assert api.row(body["seq"])[0] == body["hash"]
    resumed = api.call(
        listener, "GET", "/v1/events", 200, params={"follow": False}, headers={"last-event-id": "0"}
    )
    assert resumed[0].id == "1"
    after = api.call(listener, "GET", "/v1/events", 200, params={"from_seq": 1, "follow": False})
    assert after[0].id == "1"

    # The chain as a tlog-tiles log (the fixture's chain has a checkpoint of size 1).
    note = api.call(listener, "GET", "/v1/log/checkpoint", 200)
    assert note.startswith("infervisor/n1/")  # the default origin: id and key hash
    assert api.call(listener, "GET", "/v1/log/key", 200).startswith("infervisor/n1/")
    api.call(listener, "GET", "/v1/log/tile/0/000.p/1", 200)
    api.call(listener, "GET", "/v1/log/tile/entries/000.p/1", 200)
    proof = api.call(listener, "GET", "/v1/log/proof/inclusion", 200, params={"seq": 0, "size": 1})
    assert proof["proof"] == []
    same = api.call(listener, "GET", "/v1/log/proof/consistency", 200, params={"old": 1, "new": 1})
    assert same["old_root"] == same["new_root"]

    served = api.send(listener, "GET", "/schema/openapi.json")
    assert served.status_code == 200
    assert served.json() == json.loads(DOC.read_bytes())


# ---------------------------------------------------------------- the verbs
@pytest.mark.parametrize("listener", LISTENERS)
def test_every_verb(api: Api, listener: str) -> None:
    controller = f"ctl-{listener}"
    placing = {
        "spec": spec(f"life-{listener}", free_port()),
        "controller": controller,
        "generation": 2,
        "start": True,
    }
    key = {"idempotency-key": f"place-{listener}"}
    placed = api.call(listener, "POST", "/v1/instances", 200, json=placing, headers=key)
    iid = placed["instance_id"]
    assert (placed["outcome"], placed["generation"]) == ("applied", 2)
    assert placed["instance"]["placed_by"] == controller
    assert placed["instance"]["desired"] == "running"
    assert api.on_chain(placed, iid) in ("instance.starting", "instance.spawned")

    # Idempotency-Key: the same request again is the first answer; another is refused.
    again = api.send(listener, "POST", "/v1/instances", json=placing, headers=key)
    assert again.headers.get("idempotent-replayed") == "true"
    assert api.contracts[listener].check(again) == placed
    other = {**placing, "generation": 3}
    error = api.refused(
        listener, "POST", "/v1/instances", 422, "idempotency_mismatch", json=other, headers=key
    )
    assert error["field"] == "Idempotency-Key"

    same = api.call(listener, "POST", "/v1/instances", 200, json={**placing, "start": False})
    assert same["outcome"] == "unchanged"
    older = api.call(listener, "POST", "/v1/instances", 200, json={**placing, "generation": 1})
    assert older["outcome"] == "ignored"
    api.on_chain(older, iid)
    changed = {**placing, "spec": {**placing["spec"], "ctx_size": 1024}}
    error = api.refused(listener, "POST", "/v1/instances", 409, "invalid_state", json=changed)
    assert "ctx_size" in error["message"]

    api.until_lifecycle(listener, iid, "running")
    # A start of a running instance answers it as running; nothing is recorded.
    head = api.call(listener, "GET", "/v1/node", 200)["head_seq"]
    started = api.call(listener, "POST", f"/v1/instances/{iid}/start", 200)
    assert started["instance"]["lifecycle"] == "running" and started["seq"] <= head
    api.on_chain(started, iid)

    token = api.call(listener, "POST", f"/v1/instances/{iid}/deep-health", 200)
    assert token["instance_id"] == iid and token["token"]
    logs = api.call(listener, "GET", f"/v1/instances/{iid}/logs", 200, params={"tail_bytes": 4096})
    assert logs and len(logs.encode()) <= 4096
    api.call(listener, "GET", f"/v1/instances/{iid}/logs", 200, params={"stream": "stdout"})
    error = api.refused(
        listener, "GET", f"/v1/instances/{iid}/logs", 400, "bad_value", params={"stream": "x"}
    )
    assert error["field"] == "stream" and "stderr" in error["message"]
    beat = api.call(listener, "POST", "/v1/heartbeat", 200, json={"controller": controller})
    assert beat["controller"] == controller

    stopped = api.call(listener, "POST", f"/v1/instances/{iid}/stop", 200, json={"grace_s": 2})
    assert stopped["instance"]["lifecycle"] == "stopped"
    assert stopped["instance"]["pid"] is None
    api.on_chain(stopped, iid)
    twice = api.call(listener, "POST", f"/v1/instances/{iid}/stop", 200)
    assert twice["instance"]["lifecycle"] == "stopped" and twice["seq"] == stopped["seq"]

    started = api.call(listener, "POST", f"/v1/instances/{iid}/start", 200)
    assert started["instance"]["desired"] == "running" and started["seq"] > stopped["seq"]
    api.on_chain(started, iid)
    first_pid = api.until_lifecycle(listener, iid, "running")["pid"]
    restarted = api.call(listener, "POST", f"/v1/instances/{iid}/restart", 200)
    assert restarted["seq"] > started["seq"]
    api.on_chain(restarted, iid)
    assert api.until_lifecycle(listener, iid, "running")["pid"] != first_pid

    unloaded = api.call(listener, "POST", f"/v1/instances/{iid}/unload", 200)
    assert unloaded["instance_id"] == iid
    assert api.on_chain(unloaded, iid) == "instance.unloaded"
    api.refused(listener, "GET", f"/v1/instances/{iid}", 404, "unknown_instance")
    assert iid not in {v["instance_id"] for v in api.call(listener, "GET", "/v1/instances", 200)}


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("listener", LISTENERS)
def test_refusals(api: Api, listener: str) -> None:
    bad = {"spec": {**spec(f"bad-{listener}", free_port()), "flavor": "vllm"}}
    error = api.refused(listener, "POST", "/v1/instances", 400, "bad_spec", json=bad)
    assert error["field"] == "spec.flavor" and "llamacpp" in error["message"]
    api.refused(listener, "POST", "/v1/instances", 400, "bad_request", json={"start": True})
    extra = {"spec": spec(f"bad-{listener}", free_port()), "colour": "red"}
    api.refused(listener, "POST", "/v1/instances", 400, "bad_request", json=extra)
    as_json = {"content-type": "application/json"}
    not_json = b"{not json"
    api.refused(
        listener, "POST", "/v1/instances", 400, "bad_request", content=not_json, headers=as_json
    )
    error = api.refused(
        listener, "POST", "/v1/instances", 415, "unsupported_media_type", content=not_json
    )
    assert error["field"] == "Content-Type"
    error = api.refused(
        listener, "POST", "/v1/heartbeat", 400, "bad_request", json={"controller": "-x"}
    )
    assert error["field"] == "controller"
    error = api.refused(
        listener, "GET", "/v1/events", 400, "bad_value", headers={"last-event-id": "x"}
    )
    assert error["field"] == "Last-Event-ID"
    api.refused(listener, "GET", "/v1/events", 400, "bad_request", params={"from_seq": -1})
    long_key = {"idempotency-key": "k" * 256}
    beat = {"controller": "c1"}
    error = api.refused(
        listener, "POST", "/v1/heartbeat", 400, "bad_request", json=beat, headers=long_key
    )
    assert error["field"] == "Idempotency-Key"

    for verb in ("start", "stop", "restart", "unload", "deep-health"):
        error = api.refused(listener, "POST", f"/v1/instances/nope/{verb}", 404, "unknown_instance")
        assert "nope" in error["message"]
    api.refused(listener, "GET", "/v1/instances/nope", 404, "unknown_instance")
    api.refused(listener, "GET", "/v1/instances/nope/logs", 404, "unknown_instance")

    # The API's own port, and a port another placed instance has.
    own = int(str(api.clients["tcp"].base_url).rsplit(":", 1)[-1].rstrip("/"))
    on_own = {"spec": spec(f"own-{listener}", own)}
    error = api.refused(listener, "POST", "/v1/instances", 409, "port_taken", json=on_own)
    assert error["field"] == "spec.port" and "api.tcp" in error["message"]
    port = free_port()
    first = api.call(
        listener, "POST", "/v1/instances", 200, json={"spec": spec(f"a-{listener}", port)}
    )
    second = {"spec": spec(f"b-{listener}", port)}
    error = api.refused(listener, "POST", "/v1/instances", 409, "port_taken", json=second)
    assert first["instance_id"] in error["message"] and str(port) in error["message"]
    assert error["field"] == "spec.port"

    # Nothing is placed over a port that is already listening.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        over = {"spec": spec(f"t-{listener}", taken)}
        error = api.refused(listener, "POST", "/v1/instances", 409, "port_taken", json=over)
        assert error["field"] == "spec.port" and str(taken) in error["message"]

    # Admission refused by the memory budget, with the numbers.
    huge = {"spec": {**spec(f"huge-{listener}", free_port()), "model": "huge"}}
    placed = api.call(listener, "POST", "/v1/instances", 200, json=huge)
    iid = placed["instance_id"]
    error = api.refused(listener, "POST", f"/v1/instances/{iid}/start", 422, "no_room")
    assert str(api.budget) in error["message"] and "nothing can be evicted" in error["message"]
    error = api.refused(
        listener, "POST", f"/v1/instances/{iid}/stop", 400, "bad_request", json={"grace_s": -1}
    )
    assert error["field"] == "grace_s"
    for instance_id in (iid, first["instance_id"]):
        api.call(listener, "POST", f"/v1/instances/{instance_id}/unload", 200)


@pytest.mark.parametrize("listener", LISTENERS)
def test_the_fleet_routes(api: Api, listener: str) -> None:
    """A placement set, cordon (refusing a new placement), drain and uncordon answer
    as documented; the set's controller then empties its set."""
    ctl = f"ctl-{listener}"
    body = {"spec": spec(f"set-{listener}", free_port()), "start": False}
    placed = api.call(
        listener,
        "PUT",
        "/v1/placements",
        200,
        json={"controller": ctl, "generation": 1, "placements": [body]},
    )
    assert len(placed["placed"]) == 1 and placed["controller"] == ctl
    credential = "token " if listener == "tcp" else "uid="
    for kind in ("node.placement_set", "instance.placed"):
        assert api.source_of(kind).startswith(f"controller:{ctl} ({credential}"), kind
    cordoned = api.call(listener, "POST", "/v1/node/cordon", 200, json={"reason": "contract"})
    assert cordoned["cordon"] == "cordoned"
    new = {"spec": spec(f"late-{listener}", free_port())}
    api.refused(listener, "POST", "/v1/instances", 409, "cordoned", json=new)
    assert api.call(listener, "POST", "/v1/node/drain", 200)["cordon"] == "drained"
    assert api.call(listener, "POST", "/v1/node/uncordon", 200)["cordon"] == "none"
    empty = {"controller": ctl, "generation": 2, "placements": []}
    assert (
        api.call(listener, "PUT", "/v1/placements", 200, json=empty)["unloaded"] == placed["placed"]
    )


def test_every_route_answered_on_both_listeners(api: Api) -> None:
    """Runs last: every documented route answered 200 on each listener, and the
    refusals above were seen on each."""
    routes = {
        (method, path)
        for path, item in json.loads(DOC.read_bytes())["paths"].items()
        for method in item
    }
    for listener, contract in api.contracts.items():
        answered = {(method, path) for method, path, status in contract.seen if status == 200}
        assert answered == routes, f"{listener}: not driven: {sorted(routes - answered)}"
        statuses = {status for _, _, status in contract.seen}
        assert {400, 404, 409, 415, 422} <= statuses, f"{listener}: {sorted(statuses)}"
