"""docs/openapi.json is the document the routes generate and the node serves,
and it says what the routes really send (error shape, media types, headers)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from infervisor.tools.api.serving.openapi_cli import DOC, REGENERATE, document, main
from infervisor.tools.api.serving.server import ApiServer

ERROR_REF = {"$ref": "#/components/schemas/ErrorEnvelope"}


class SseEvent:
    def __init__(self, fields: dict[str, str]) -> None:
        self.id = fields.get("id")
        self.event = fields.get("event")
        self.data = fields.get("data", "")


def parse_sse(text: str) -> list[SseEvent]:
    """The events of a text/event-stream body (comments dropped)."""
    events = []
    for block in re.split(r"\r?\n\r?\n", text):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            fields[name] = f"{fields[name]}\n{value}" if name in fields else value
        if fields:
            events.append(SseEvent(fields))
    return events


def _strict(schema: object) -> None:
    """Objects with documented properties may hold no others: an undocumented field fails."""
    if isinstance(schema, dict):
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
        for inner in schema.values():
            _strict(inner)
    elif isinstance(schema, list):
        for inner in schema:
            _strict(inner)


class Contract:
    """Checks answers against docs/openapi.json: the status is documented for the
    route, the media type is the documented one, the body validates (JSON Schema
    2020-12, undocumented fields refused), documented required headers are sent.
    ``seen`` collects (method, path, status) of every answer checked."""

    def __init__(self, doc: dict[str, Any] | None = None) -> None:
        self.doc = doc if doc is not None else json.loads(DOC.read_bytes())
        self.components = copy.deepcopy(self.doc["components"])
        _strict(self.components)
        self.seen: set[tuple[str, str, int]] = set()
        self._routes = [
            (re.compile("^" + re.sub(r"\{[^}]+\}", _param, path) + "$"), path)
            for path in self.doc["paths"]
        ]

    def template(self, path: str) -> str:
        found = [template for pattern, template in self._routes if pattern.match(path)]
        assert len(found) == 1, f"{path}: no documented route (or several): {found}"
        return found[0]

    def validate(self, value: object, schema: dict[str, Any], what: str) -> None:
        rooted = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
        rooted["components"] = self.components
        errors = sorted(
            jsonschema.Draft202012Validator(rooted).iter_errors(value), key=lambda e: e.path
        )
        assert not errors, f"{what}: " + "; ".join(
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:5]
        )

    def check(self, response: httpx.Response) -> Any:
        """The decoded body (JSON, the SSE events, or the text) once it matches."""
        method = response.request.method.lower()
        path = self.template(response.request.url.path)
        what = f"{method.upper()} {response.request.url.path} -> {response.status_code}"
        operation = self.doc["paths"][path][method]
        status = str(response.status_code)
        assert status in operation["responses"], (
            f"{what} is not documented ({sorted(operation['responses'])}): {response.text[:300]}"
        )
        documented = operation["responses"][status]
        for name, header in documented.get("headers", {}).items():
            if header.get("required"):
                assert name.lower() in response.headers, f"{what}: no {name} header"
        media = response.headers.get("content-type", "").split(";")[0].strip()
        content = documented.get("content", {})
        assert media in content, f"{what}: sent {media!r}, documented {sorted(content)}"
        schema = content[media]["schema"]
        self.seen.add((method, path, response.status_code))
        if media == "application/json":
            body = response.json()
            self.validate(body, schema, what)
            return body
        self.validate(response.text, schema, what)
        if media == "text/event-stream":
            events = parse_sse(response.text)
            event_schema = {"$ref": "#/components/schemas/WatchEvent"}
            for event in events:
                self.validate(json.loads(event.data), event_schema, f"{what} event {event.id}")
            return events
        return response.text


def _param(match: re.Match[str]) -> str:
    """A path parameter's pattern: one segment, or several for ``{tile_path}``."""
    return ".+" if match[0] == "{tile_path}" else "[^/]+"


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DOC.read_bytes())
    return loaded


def operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            yield path, method, operation


def test_the_checked_in_document_is_the_generated_one() -> None:
    assert DOC.read_bytes() == document(), f"docs/openapi.json is stale; run: {REGENERATE}"


def test_check_mode_fails_on_a_stale_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "openapi.json"
    stale.write_bytes(document().replace(b"infervisor control API", b"something else"))
    assert main(["--check", "--path", str(stale)]) == 1
    assert REGENERATE in capsys.readouterr().err
    assert main(["--write", "--path", str(stale)]) == 0
    assert main(["--check", "--path", str(stale)]) == 0


def test_the_node_serves_the_checked_in_document(tmp_path: Path) -> None:
    data = tmp_path / "d"
    data.mkdir()
    # The schema route needs no node: the API answers it while the node is starting.
    with ApiServer.listen(data, data / "chain.db", "n1") as server:
        transport = httpx.HTTPTransport(uds=str(server.path))
        with httpx.Client(transport=transport, base_url="http://localhost") as client:
            served = client.get("/schema/openapi.json")
            starting = client.get("/v1/node")
    assert served.status_code == 200, served.text
    assert served.json() == json.loads(DOC.read_bytes())
    assert starting.status_code == 503
    assert Contract().check(starting)["error"]["code"] == "node_starting"


def test_the_contract_refuses_what_the_document_does_not_say() -> None:
    contract = Contract()
    url = "http://localhost/v1/node"

    def answer(status: int, body: object) -> httpx.Response:
        return httpx.Response(status, json=body, request=httpx.Request("GET", url))

    node = {
        "node_id": "n1",
        "version": "1",
        "phase": "open",
        "head_seq": 1,
        "head_hash": "ab",
        "instances": 0,
        "lease_s": None,
    }
    assert contract.check(answer(200, node)) == node
    with pytest.raises(AssertionError, match="head_seq"):
        contract.check(answer(200, {**node, "head_seq": "1"}))
    with pytest.raises(AssertionError, match="Additional properties"):
        contract.check(answer(200, {**node, "extra": 1}))
    with pytest.raises(AssertionError, match="not documented"):
        contract.check(answer(418, node))
    litestar_400 = {"status_code": 400, "detail": "Validation failed"}
    with pytest.raises(AssertionError, match="error"):
        contract.check(answer(400, litestar_400))
    with pytest.raises(AssertionError, match="WWW-Authenticate"):
        contract.check(answer(401, {"error": {"code": "unauthorized", "message": "m"}}))


def test_every_route_is_documented(doc: dict[str, Any]) -> None:
    routes = {(path, method) for path, method, _ in operations(doc)}
    assert routes == {
        ("/v1/node", "get"),
        ("/v1/instances", "get"),
        ("/v1/instances", "post"),
        ("/v1/instances/{instance_id}", "get"),
        ("/v1/instances/{instance_id}/start", "post"),
        ("/v1/instances/{instance_id}/stop", "post"),
        ("/v1/instances/{instance_id}/restart", "post"),
        ("/v1/instances/{instance_id}/unload", "post"),
        ("/v1/instances/{instance_id}/deep-health", "post"),
        ("/v1/instances/{instance_id}/logs", "get"),
        ("/v1/heartbeat", "post"),
        ("/v1/ledger", "get"),
        ("/v1/models", "get"),
        ("/v1/events", "get"),
        ("/metrics", "get"),
        ("/v1/log/checkpoint", "get"),
        ("/v1/log/key", "get"),
        ("/v1/log/tile/{tile_path}", "get"),
        ("/v1/log/proof/inclusion", "get"),
        ("/v1/log/proof/consistency", "get"),
        ("/v1/node/cordon", "post"),
        ("/v1/node/drain", "post"),
        ("/v1/node/uncordon", "post"),
        ("/v1/placements", "put"),
    }


def test_every_error_is_the_error_envelope(doc: dict[str, Any]) -> None:
    for path, method, operation in operations(doc):
        for status, response in operation["responses"].items():
            if int(status) < 400:
                continue
            assert response["content"] == {"application/json": {"schema": ERROR_REF}}, (
                f"{method} {path} {status}"
            )
            assert "ValidationException" not in json.dumps(response)


def test_streams_and_metrics_are_text(doc: dict[str, Any]) -> None:
    def media(path: str) -> list[str]:
        return list(doc["paths"][path]["get"]["responses"]["200"]["content"])

    assert media("/metrics") == ["text/plain"]
    assert media("/v1/events") == ["text/event-stream"]
    assert media("/v1/instances/{instance_id}/logs") == ["text/plain"]
    assert "WatchEvent" in doc["components"]["schemas"]


def test_posts_take_an_idempotency_key_and_tcp_takes_a_bearer_token(doc: dict[str, Any]) -> None:
    for path, method, operation in operations(doc):
        headers = {p["name"] for p in operation.get("parameters", []) if p["in"] == "header"}
        assert ("Idempotency-Key" in headers) == (method == "post"), f"{method} {path}"
        if method == "post":
            assert {"409", "422"} <= set(operation["responses"]), f"{method} {path}"
            assert "idempotent-replayed" in operation["responses"]["200"]["headers"]
        assert "WWW-Authenticate" in operation["responses"]["401"]["headers"], f"{method} {path}"
    assert doc["components"]["securitySchemes"]["bearer"]["type"] == "http"
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert doc["security"] == [{"bearer": []}]
    assert any("unix-socket" in s["description"] for s in doc["servers"])


def test_stop_takes_an_optional_body(doc: dict[str, Any]) -> None:
    stop = doc["paths"]["/v1/instances/{instance_id}/stop"]["post"]
    assert stop["requestBody"]["required"] is False
    grace = doc["components"]["schemas"]["StopRequest"]["properties"]["grace_s"]
    assert (grace["minimum"], grace["maximum"]) == (0, 3600)


def test_the_file_is_pretty_and_key_sorted() -> None:
    def sorted_keys(value: object, where: str) -> None:
        if isinstance(value, dict):
            assert list(value) == sorted(value), where
            for key, inner in value.items():
                sorted_keys(inner, f"{where}/{key}")
        elif isinstance(value, list):
            for n, inner in enumerate(value):
                sorted_keys(inner, f"{where}/{n}")

    raw = DOC.read_bytes()
    sorted_keys(json.loads(raw), "")
    assert raw.endswith(b"}\n") and b'\n  "components": {' in raw


def test_every_operation_has_a_name_and_docs_api_md_gives_it(doc: dict[str, Any]) -> None:
    named = {
        (method, path): operation["operationId"] for path, method, operation in operations(doc)
    }
    assert sorted(named.values()) == sorted(
        [
            "getNode",
            "listModels",
            "getLedger",
            "sendHeartbeat",
            "listInstances",
            "getInstance",
            "placeInstance",
            "startInstance",
            "stopInstance",
            "restartInstance",
            "unloadInstance",
            "checkInstanceDeepHealth",
            "getInstanceLogs",
            "watchEvents",
            "getMetrics",
            "getCheckpoint",
            "getLogKey",
            "getTile",
            "getInclusionProof",
            "getConsistencyProof",
            "cordonNode",
            "drainNode",
            "uncordonNode",
            "putPlacements",
        ]
    )
    api_md = (DOC.parent / "api.md").read_text()
    for (method, path), name in named.items():
        route = path.replace("{instance_id}", "{id}")
        row = re.search(
            rf"^\| `{method.upper()} {re.escape(route)}[?`][^|]*\| `(\w+)` \|", api_md, re.M
        )
        assert row is not None and row[1] == name, f"docs/api.md: {method} {path} is not {name}"
