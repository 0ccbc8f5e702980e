"""Request bodies are decoded strictly, and a watch survives its keep-alives.

The strict decoding runs before the routes (tools/api/strict.py), so it is
checked against an API server whose node is not open yet: a bad body is
answered 400 naming the field, a good one reaches the gate (503
``node_starting``). The keep-alive test runs a real node in process with a
short keep-alive period.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from conftest import NodeFactory
from support import wait_until

from infervisor.adapters.spec import InstanceSpec
from infervisor.tools.api import watch
from infervisor.tools.api.auth import TOKENS_FILE, ApiConfigError, load_or_create_tokens
from infervisor.tools.api.client import ApiClient, _at
from infervisor.tools.api.idempotency import IdempotencyStore, _Stored
from infervisor.tools.api.serving.server import ApiServer, socket_path
from infervisor.tools.api.strict import MAX_BODY
from infervisor.tools.api.wire import (
    HeartbeatRequest,
    PlaceRequest,
    StopRequest,
    VerbRequest,
    WatchEvent,
)

SPEC = {"role": "chat", "flavor": "llamacpp", "port": 18741, "model": "tiny"}


@pytest.fixture(scope="module")
def starting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """A client of an API server whose node never opens (one for the module)."""
    data = tmp_path_factory.mktemp("starting") / "data"
    data.mkdir()
    server = ApiServer.listen(data, data / "chain.db", "n1")
    transport = httpx.HTTPTransport(uds=str(socket_path(data)))
    try:
        with httpx.Client(transport=transport, base_url="http://node") as client:
            yield client
    finally:
        server.close()


def refused(client: httpx.Client, path: str, body: bytes | Any) -> dict[str, Any]:
    content = body if isinstance(body, bytes) else httpx.Request("POST", "/", json=body).content
    answer = client.post(path, content=content, headers={"content-type": "application/json"})
    assert answer.status_code == 400, (answer.status_code, answer.text)
    error: dict[str, Any] = answer.json()["error"]
    return error


@pytest.mark.parametrize(
    ("path", "body", "field", "code"),
    [
        ("/v1/instances", {"spec": {**SPEC, "port": "18741"}}, "spec.port", "bad_spec"),
        ("/v1/instances/", {"spec": {**SPEC, "port": "18741"}}, "spec.port", "bad_spec"),
        ("/v1/heartbeat/", {"controller": 1}, "controller", "bad_request"),
        ("/v1/instances", {"spec": {**SPEC, "port": 18741.0}}, "spec.port", "bad_spec"),
        ("/v1/instances", {"spec": {**SPEC, "ctx_size": "512"}}, "spec.ctx_size", "bad_spec"),
        ("/v1/instances", {"spec": {**SPEC, "threads": "2"}}, "spec.threads", "bad_spec"),
        ("/v1/instances", {"spec": SPEC, "start": "true"}, "start", "bad_request"),
        ("/v1/instances", {"spec": SPEC, "generation": "0"}, "generation", "bad_request"),
        ("/v1/instances", {"spec": SPEC, "generation": -1}, "generation", "bad_request"),
        ("/v1/instances", {"spec": SPEC, "bogus": 1}, "bogus", "bad_request"),
        ("/v1/instances", {"spec": {**SPEC, "colour": "red"}}, "spec.colour", "bad_spec"),
        ("/v1/instances", {"spec": {**SPEC, "env": {"A": 1}}}, "spec.env", "bad_spec"),
        ("/v1/instances", {"generation": 1}, "spec", "bad_request"),
        ("/v1/instances", {"spec": 5}, "spec", "bad_spec"),
        ("/v1/instances", {"spec": {**SPEC, "flavor": "nope"}}, "spec.flavor", "bad_spec"),
        ("/v1/instances/x/stop", {"grace_s": "2"}, "grace_s", "bad_request"),
        ("/v1/instances/x/stop", {"grace_s": -1}, "grace_s", "bad_request"),
        ("/v1/instances/x/start", {"controller": 5}, "controller", "bad_request"),
        ("/v1/heartbeat", {"controller": "a b"}, "controller", "bad_request"),
        ("/v1/heartbeat", {}, "controller", "bad_request"),
    ],
)
def test_a_body_of_the_wrong_shape_is_refused_naming_the_field(
    starting: httpx.Client, path: str, body: Any, field: str, code: str
) -> None:
    error = refused(starting, path, body)
    assert (error["field"], error["code"]) == (field, code), error
    assert error["message"].startswith(f"{field}: "), error
    if field == "spec.flavor":
        assert "allowed: llamacpp, mlx-lm, ollama" in error["message"]
    if field == "bogus":
        assert "allowed: spec, controller, generation, start" in error["message"]
    if field == "spec.colour":
        assert "allowed: role, flavor, port, mode, model" in error["message"]


#: Values of every JSON type, and integers beyond the chain's 64 bits: each field
#: refuses at least one of them.
WRONG: list[Any] = [[], {}, "x", 1.5, True, 2**64, -(2**63) - 1, -1, 0]
#: Route -> (body type, a good body to change one field of).
WALKED: dict[str, tuple[type[msgspec.Struct], dict[str, Any]]] = {
    "/v1/instances": (PlaceRequest, {"spec": SPEC}),
    "/v1/heartbeat": (HeartbeatRequest, {"controller": "c1"}),
    "/v1/instances/x/stop": (StopRequest, {}),
    "/v1/instances/x/start": (VerbRequest, {}),
}


def _fields(body_type: type[msgspec.Struct]) -> list[str]:
    """The body's fields, the spec's as ``spec.<name>``."""
    names = [f.name for f in msgspec.structs.fields(body_type)]
    spec = [f"spec.{f.name}" for f in msgspec.structs.fields(InstanceSpec)]
    return [n for n in names if n != "spec"] + (spec if "spec" in names else [])


def _with(good: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    if field.startswith("spec."):
        return {**good, "spec": {**good["spec"], field.removeprefix("spec."): value}}
    return {**good, field: value}


@pytest.mark.parametrize("path", sorted(WALKED))
def test_every_way_a_body_can_be_wrong_names_a_field(starting: httpx.Client, path: str) -> None:
    """Each field of each body given each wrong value: every 400 names a field (and its
    message starts with it); every field is refused for at least one value."""
    body_type, good = WALKED[path]
    refused_fields: set[str] = set()
    whole = [b"{", b"[]", b"1", b'"x"', b"{}" if path == "/v1/instances" else b"[1]"]
    bodies: list[tuple[str, bytes]] = [("body", raw) for raw in whole]
    bodies += [("bogus", json.dumps({**good, "bogus": 1}).encode())]
    for field in _fields(body_type):
        bodies += [(field, json.dumps(_with(good, field, value)).encode()) for value in WRONG]
    for field, raw in bodies:
        answer = starting.post(path, content=raw, headers={"content-type": "application/json"})
        if answer.status_code == 503:  # a good body: it reached the (closed) gate
            continue
        assert answer.status_code == 400, (field, raw, answer.text)
        error = answer.json()["error"]
        assert error["field"], (field, raw, error)
        assert error["message"].startswith(f"{error['field']}: "), error
        in_spec = error["field"].startswith("spec.")
        assert error["code"] == ("bad_spec" if in_spec else "bad_request"), error
        refused_fields.add(field)
    never = {field for field, _ in bodies} - refused_fields
    assert not never, f"{path}: never refused: {sorted(never)}"


def test_a_body_that_is_not_json_is_refused(starting: httpx.Client) -> None:
    error = refused(starting, "/v1/instances", b'{"spec": ')
    assert error["code"] == "bad_request" and error["field"] == "body"
    assert "not valid JSON" in error["message"]


def test_a_body_beyond_the_limit_is_refused_413(starting: httpx.Client) -> None:
    answer = starting.post("/v1/heartbeat", content=b" " * (MAX_BODY + 1))
    assert answer.status_code == 413, answer.text
    error = answer.json()["error"]
    assert error["code"] == "body_too_large" and error["field"] == "body"  # too_large before
    assert f"at most {MAX_BODY} bytes" in error["message"]
    assert answer.headers["connection"] == "close"


def test_an_empty_idempotency_key_is_refused(starting: httpx.Client) -> None:
    answer = starting.post(
        "/v1/heartbeat", json={"controller": "c1"}, headers={"idempotency-key": ""}
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["field"] == "Idempotency-Key"


@pytest.mark.parametrize(
    ("path", "content"),
    [
        ("/v1/instances", None),  # no `content`: the well-formed placement below
        ("/v1/instances/x/stop", b""),
        ("/v1/instances/x/stop", b"null"),
        ("/v1/instances/x/stop", b"  \n"),
        ("/v1/instances/x/stop", b'{"grace_s": 2}'),
        ("/v1/instances/x/start", b'{"controller": "ctl-1"}'),
        ("/v1/instances/x/unload", b""),
    ],
)
def test_a_body_of_the_right_shape_reaches_the_gate(
    starting: httpx.Client, path: str, content: bytes | None
) -> None:
    body = httpx.Request("POST", "/", json={"spec": SPEC}).content if content is None else content
    answer = starting.post(path, content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "node_starting"


def test_a_watch_reads_through_keep_alives(
    nodes: NodeFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle stream sends keep-alive comments; the client skips them and the
    next event still arrives (an empty ``data:`` once crashed the client)."""
    monkeypatch.setattr(watch, "KEEPALIVE_S", 0.05)
    settings = nodes.settings("/bin/false", tmp_path / "models", lease_s=60.0)
    data = Path(settings.data_dir)
    data.mkdir(parents=True)
    server = ApiServer.listen(data, settings.chain_path, settings.node_id)
    try:
        node = nodes.open(settings)
        server.serve(node)
        seen: list[WatchEvent] = []
        failed: list[BaseException] = []

        def follow() -> None:
            try:
                with ApiClient(data_dir=data) as client:
                    for event in client.events(from_seq=0):
                        seen.append(event)
                        if event.kind == "node.lease_renewed":
                            return
            except BaseException as e:
                failed.append(e)

        watcher = threading.Thread(target=follow)
        watcher.start()
        wait_until(lambda: failed or any(e.kind == "node.started" for e in seen), 60)
        with (
            httpx.Client(
                transport=httpx.HTTPTransport(uds=str(socket_path(data))), base_url="http://node"
            ) as raw,
            raw.stream("GET", "/v1/events") as stream,
        ):
            alive = 0
            for line in stream.iter_lines():
                alive += line == ": keep-alive"
                if alive == 3:
                    break
        node.heartbeat("ctl-1")  # the first one heard is recorded: node.lease_renewed
        watcher.join(10)
        assert not failed, failed
        with httpx.Client(
            transport=httpx.HTTPTransport(uds=str(socket_path(data))), base_url="http://node"
        ) as raw:
            for headers, params in (
                ({"last-event-id": "\u00b2".encode("latin-1")}, {}),
                ({"last-event-id": "9" * 30}, {}),
                ({}, {"from_seq": str(10**23)}),
            ):
                answer = raw.get("/v1/events", headers=headers, params=params)
                assert answer.status_code == 400, (headers, params, answer.text)
        assert seen and seen[-1].kind == "node.lease_renewed", [e.kind for e in seen]
        assert [e.seq for e in seen] == list(range(len(seen)))
        server.stopping()
        node.shutdown()
    finally:
        server.close()


def test_a_tokens_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    first = load_or_create_tokens(tmp_path, ["operator"])
    path = tmp_path / TOKENS_FILE
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_or_create_tokens(tmp_path, ["operator"]).names == first.names
    path.chmod(0o644)
    with pytest.raises(ApiConfigError, match="chmod 600"):
        load_or_create_tokens(tmp_path, ["operator"])


def test_an_answer_is_kept_under_its_key_unless_nothing_was_done() -> None:
    """A 503 (nothing done) or no answer is forgotten; a 504 or 500 (accepted and
    recorded) is kept, so a retry with the key does not do the verb twice."""
    store = IdempotencyStore()
    for status, kept in (
        (200, True),
        (409, True),
        (500, True),
        (504, True),
        (503, False),
        (0, False),
    ):
        slot = ("uid=0(root)", str(status).encode())
        assert store.begin(slot, b"print") is None
        store.finish(slot, _Stored(b"print", status=status))
        assert (store.begin(slot, b"print") is not None) is kept, status


def test_an_instance_id_stays_one_path_segment() -> None:
    assert _at("../instances") == "/instances/..%2Finstances"
    assert _at("x?y", "stop") == "/instances/x%3Fy/stop"
