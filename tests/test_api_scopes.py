"""The trust boundary of the control API: token scopes, one Authorization
header, JSON bodies only, bounded bodies, and a field named in every refusal.

One node in process, open, with the Unix socket and a loopback TCP listener
holding three tokens (``ro`` read, ``ops`` operate, ``ctl`` control); it has
one managed instance placed, never started (no server runs). Every refusal
leaves the chain's head where it was.
"""

from __future__ import annotations

import json
import sqlite3
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_api_auth import head as chain_head
from test_openapi_doc import Contract

from infervisor.actors.node import Node
from infervisor.actors.settings import NodeSettings
from infervisor.adapters.ports import free_port
from infervisor.replay.callers import identity_of, role_of
from infervisor.tools.api.auth import TcpAddress, load_or_create_tokens
from infervisor.tools.api.scopes import (
    ROUTE_SCOPES,
    ApiToken,
    Scope,
    default_scope,
    methods_for,
    scope_for,
    token_scopes,
)
from infervisor.tools.api.serving.openapi_cli import DOC
from infervisor.tools.api.serving.server import ApiServer, socket_path
from infervisor.tools.node.config import ConfigError, load_config

TOKENS = {"ro": Scope.READ, "app": Scope.INFER, "ops": Scope.OPERATE, "ctl": Scope.CONTROL}
MODEL_BYTES = b"GGUF" + struct.pack("<IQQ", 3, 0, 0) + bytes(40)
SPEC = {"role": "chat", "flavor": "llamacpp", "port": 18741, "model": "tiny"}
JSON = {"content-type": "application/json"}


@dataclass
class Api:
    url: str
    data: Path
    secrets: dict[str, str]
    instance_id: str

    def client(self, token: str | None) -> httpx.Client:
        """A TCP client with ``token``'s secret, or (None) a client of the socket."""
        if token is None:
            transport = httpx.HTTPTransport(uds=str(socket_path(self.data)))
            return httpx.Client(transport=transport, base_url="http://node", timeout=30)
        headers = {"authorization": f"Bearer {self.secrets[token]}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def head(self) -> tuple[int, bytes]:
        return chain_head(self.data / "chain.db")

    def sources(self) -> list[tuple[str, str]]:
        conn = sqlite3.connect(f"file:{self.data / 'chain.db'}?mode=ro", uri=True)
        try:
            return [(str(k), str(s)) for k, s in conn.execute("SELECT kind, source FROM events")]
        finally:
            conn.close()


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    data = tmp_path_factory.mktemp("scopes") / "data"
    models = data / "models"
    models.mkdir(parents=True)
    (models / "tiny.gguf").write_bytes(MODEL_BYTES)
    settings = NodeSettings(
        node_id="n1", data_dir=str(data), registry_dir=str(models), llamacpp_program="/bin/false"
    )
    port = free_port()
    server = ApiServer.listen(
        data,
        settings.chain_path,
        settings.node_id,
        tcp=TcpAddress("127.0.0.1", port),
        tokens=load_or_create_tokens(data, [ApiToken(name=n, scope=s) for n, s in TOKENS.items()]),
    )
    try:
        node = Node.open(settings)
        try:
            node.registry.adopt("tiny", models / "tiny.gguf")
            server.serve(node)
            secrets = json.loads((data / "api-tokens.json").read_text())
            api = Api(f"http://127.0.0.1:{port}", data, secrets, "")
            with api.client("ctl") as ctl:
                placed = ctl.post("/v1/instances", json={"spec": SPEC})
            assert placed.status_code == 200, placed.text
            api.instance_id = placed.json()["instance_id"]
            yield api
            server.stopping()
        finally:
            node.shutdown()
    finally:
        server.close()


def refused(answer: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert answer.status_code == status, (answer.status_code, answer.text)
    error: dict[str, Any] = answer.json()["error"]
    assert error["code"] == code, error
    return error


# ---------------------------------------------------------------- the table
def test_every_route_has_exactly_one_scope() -> None:
    documented = {
        (method.upper(), path)
        for path, item in json.loads(DOC.read_bytes())["paths"].items()
        for method in item
    }
    rows = [(method, route) for method, route, _ in ROUTE_SCOPES]
    assert len(rows) == len(set(rows))
    assert set(rows) == documented | {("GET", "/schema/openapi.json")}
    assert scope_for("POST", "/v1/instances/x/stop/") is Scope.OPERATE  # a trailing slash
    assert scope_for("GET", "/v1/nowhere") is None  # not listed: answered 404, never routed
    assert scope_for("DELETE", "/v1/node") is None
    assert methods_for("/v1/node/") == ("GET",)
    assert methods_for("/v1/instances") == ("GET", "POST")
    assert methods_for("/v1/nowhere") == ()
    assert scope_for("POST", "/v1/instances/x/deep-health") is Scope.OPERATE


def test_scopes_are_ordered_and_a_bare_name_has_its_default() -> None:
    read, operate, control = Scope.READ, Scope.OPERATE, Scope.CONTROL
    assert control.covers(operate) and control.covers(read) and operate.covers(read)
    assert not read.covers(operate) and not operate.covers(control)
    infer = Scope.INFER  # an application's: the front's inference, no verb of this API
    assert infer.covers(read) and operate.covers(infer) and not infer.covers(operate)
    assert not read.covers(infer)
    assert default_scope("operator") is operate and default_scope("controller") is control
    assert default_scope("grafana") is read


def config(tmp_path: Path, tokens: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(
        f'[node]\nnode_id = "n1"\ndata_dir = "data"\n[api]\ntcp = "127.0.0.1:8711"\n{tokens}\n'
    )
    return path


def test_the_config_gives_tokens_by_name_or_with_a_scope(tmp_path: Path) -> None:
    mixed = 'tokens = ["operator", "controller", "ci", { name = "fleet", scope = "control" }]'
    assert token_scopes(load_config(config(tmp_path, mixed)).api.tokens) == {
        "operator": Scope.OPERATE,
        "controller": Scope.CONTROL,
        "ci": Scope.READ,
        "fleet": Scope.CONTROL,
    }
    tables = '[[api.tokens]]\nname = "ops"\nscope = "operate"'
    assert token_scopes(load_config(config(tmp_path, tables)).api.tokens) == {"ops": Scope.OPERATE}
    for tokens, said in [
        ('tokens = [{ name = "x", scope = "admin" }]', "allowed: read, infer, operate, control"),
        ('tokens = [{ name = "x" }]', "missing key `scope`"),
        ('tokens = ["x\\n"]', "not a plain token name"),
        ('tokens = ["x", { name = "x", scope = "read" }]', "more than once"),
    ]:
        with pytest.raises(ConfigError, match=said):
            load_config(config(tmp_path, tokens))


# ---------------------------------------------------------------- scopes per route
def _request(method: str, route: str) -> tuple[str, dict[str, Any]]:
    """A request on ``route`` that changes nothing when allowed (an unknown instance, a
    body missing its required field)."""
    path = route.replace("{instance_id}", "nope")
    if path == "/v1/events":
        return path, {"params": {"from_seq": 0, "follow": False}}
    if path.startswith("/v1/node/"):  # cordon, drain, uncordon: a reason of the wrong type
        return path, {"content": b'{"reason": 5}', "headers": JSON}
    if method in ("POST", "PUT"):
        return path, {"content": b"{}", "headers": JSON}
    return path, {}


@pytest.mark.parametrize("token", sorted(TOKENS))
def test_a_token_is_refused_every_route_beyond_its_scope(api: Api, token: str) -> None:
    held = TOKENS[token]
    contract = Contract()
    before = api.head()
    forbidden = 0
    with api.client(token) as client:
        for method, route, needed in ROUTE_SCOPES:
            path, kwargs = _request(method, route)
            answer = client.request(method, path, **kwargs)
            if held.covers(needed):
                assert answer.status_code != 403, (method, route, answer.text)
                continue
            forbidden += 1
            error = refused(answer, 403, "forbidden")
            assert f"needs scope {needed.value}" in error["message"], error
            assert f"holds {held.value}" in error["message"], error
            contract.check(answer)
    assert forbidden == sum(not held.covers(needed) for _, _, needed in ROUTE_SCOPES)
    assert api.head() == before


#: Requests for no route of the API: an unknown path, a path under no version.
NO_ROUTE = [
    ("GET", "/v1/nowhere"),
    ("POST", "/v1/nowhere"),
    ("GET", "/v2/node"),
    ("GET", "/v1/instances/x/y"),
    ("PUT", "/"),
]


@pytest.mark.parametrize("token", [*sorted(TOKENS), None])
def test_an_unknown_route_is_404_and_a_wrong_method_405_whatever_the_scope(
    api: Api, token: str | None
) -> None:
    """A trial (stop 35): a read token asking for a route that does not exist was told
    403 "needs scope control", as if the route existed and were a controller's."""
    before = api.head()
    with api.client(token) as client:
        for method, path in NO_ROUTE:
            answer = client.request(method, path)
            error = refused(answer, 404, "not_found")
            assert f"no route {method} {path}" in error["message"], error
            assert "GET /schema/openapi.json" in error["message"], error
            assert "connection" not in answer.headers  # an authenticated caller keeps it
        for method, path, allow in [
            ("DELETE", "/v1/node", "GET"),
            ("HEAD", "/v1/instances", "GET, POST"),
            ("GET", "/v1/heartbeat", "POST"),
            ("OPTIONS", f"/v1/instances/{api.instance_id}/stop", "POST"),
        ]:
            answer = client.request(method, path)
            assert answer.status_code == 405, (method, path, answer.text)
            assert answer.headers["allow"] == allow
            if method != "HEAD":
                error = refused(answer, 405, "method_not_allowed")
                assert f"takes {allow}, not {method}" in error["message"], error
    assert api.head() == before


def test_an_unknown_route_without_a_token_is_401_first(api: Api) -> None:
    """Authentication comes first: a stranger learns nothing of which routes exist."""
    with httpx.Client(base_url=api.url, timeout=30) as stranger:
        for method, path in [*NO_ROUTE, ("GET", "/v1/node")]:
            answer = stranger.request(method, path)
            refused(answer, 401, "unauthorized")
            assert answer.headers["connection"] == "close"


def test_the_scope_is_recorded_in_the_source(api: Api) -> None:
    iid = api.instance_id
    with api.client("ops") as ops, api.client("ctl") as ctl:
        before = api.head()
        by_controller = ops.post(f"/v1/instances/{iid}/stop", json={"controller": "c1"})
        error = refused(by_controller, 403, "forbidden")
        assert "controller 'c1' needs scope control" in error["message"]
        assert api.head() == before
        # A controller's placement (never a start here: /bin/false would restart in the
        # background and move the chain's head under the other tests), which the
        # operator then unloads (a stop of a never-started instance records nothing).
        placing = {"spec": {**SPEC, "port": 18743}, "controller": "c1", "generation": 1}
        placed = ctl.post("/v1/instances", json=placing)
        assert placed.status_code == 200, placed.text
        theirs = placed.json()["instance_id"]
        assert ops.post(f"/v1/instances/{theirs}/unload").status_code == 200
    sources = {source for _, source in api.sources()}
    assert "operator:token=ops (scope operate)" in sources
    assert "operator:token=ctl (scope control)" in sources  # the fixture's placement
    assert "controller:c1 (token ctl)" in sources
    source = "operator:token=ops (scope operate)"
    assert (role_of(source), identity_of(source)) == ("operator", "token=ops (scope operate)")
    with api.client(None) as socket:  # the socket's peer holds control
        assert socket.post("/v1/heartbeat", json={"controller": "c1"}).status_code == 200


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("token", ["ctl", None])
@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("Authorization", "Bearer {secret}"),
        ("Content-Type", "application/json"),
        ("Idempotency-Key", "k1"),
        ("Last-Event-ID", "1"),
    ],
)
def test_a_header_sent_twice_is_refused(
    api: Api, token: str | None, header: str, value: str
) -> None:
    before = api.head()
    twice = value.format(secret=api.secrets["ctl"])
    with api.client(token) as client:
        for method, path in [("GET", "/v1/node"), ("POST", "/v1/heartbeat")]:
            request = client.build_request(method, path, json={"controller": "c1"})
            request.headers.update(httpx.Headers([(header, twice), (header, twice)]))
            assert len(request.headers.get_list(header)) == 2
            answer = client.send(request)
            error = refused(answer, 400, "bad_request")
            assert error["field"] == header and "send exactly one" in error["message"], error
            Contract().check(answer)
    assert api.head() == before


BODY_ROUTES = ["/v1/instances", "/v1/heartbeat", "/v1/instances/{}/stop", "/v1/instances/{}/start"]


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_body_not_sent_as_json_is_refused_415(api: Api, content_type: str | None) -> None:
    before = api.head()
    body = json.dumps({"spec": SPEC, "controller": "c1"}).encode()
    headers = {"content-type": content_type} if content_type else {}
    with api.client("ctl") as client:
        for route in BODY_ROUTES:
            answer = client.post(route.format(api.instance_id), content=body, headers=headers)
            error = refused(answer, 415, "unsupported_media_type")
            assert error["field"] == "Content-Type" and "application/json" in error["message"]
            Contract().check(answer)
        # No body where it is optional needs no Content-Type.
        stop = client.post(f"/v1/instances/{api.instance_id}/stop")
        assert stop.status_code == 200, stop.text
        charset = {"content-type": "application/json; charset=utf-8"}
        beat = client.post("/v1/heartbeat", content=b'{"controller": "c1"}', headers=charset)
        assert beat.status_code == 200, beat.text
    assert api.head()[0] >= before[0]


DEEP = 100_000
_RESTART = b'{"spec": {"role": "c", "flavor": "llamacpp", "port": 1, "model": "tiny", "restart": '
BAD = [
    ("/v1/instances", b"[" * DEEP + b"]" * DEEP, "body"),
    ("/v1/instances", _RESTART + b'{"a": ' + b"[" * DEEP + b"]" * DEEP + b"}}}", "body"),
    ("/v1/instances", _RESTART + b'{"a": ' + b"[" * 40 + b"]" * 40 + b"}}}", "body"),
    ("/v1/instances/{}/stop", b'{"controller": ' + b"[" * DEEP + b"]" * DEEP + b"}", "controller"),
    ("/v1/instances", {"spec": SPEC, "controller": "c1", "generation": 2**63}, "generation"),
    ("/v1/instances", {"spec": SPEC, "controller": "c1", "generation": -1}, "generation"),
    ("/v1/instances", {"spec": {**SPEC, "port": 2**64}}, "spec.port"),
    ("/v1/instances", {"spec": {**SPEC, "ctx_size": -(2**63) - 1}}, "spec.ctx_size"),
    ("/v1/instances", {"spec": {**SPEC, "restart": {"max_restarts": 2**64}}}, "spec.restart"),
    ("/v1/instances", {"spec": SPEC, "controller": "c1\n"}, "controller"),
    ("/v1/heartbeat", {"controller": "c1\n"}, "controller"),
    ("/v1/heartbeat", {"controller": "\nc1"}, "controller"),
    ("/v1/instances/{}/start", {"controller": "c1\n"}, "controller"),
    ("/v1/instances/{}/stop", b'{"grace_s": 1e400}', "grace_s"),
]


@pytest.mark.parametrize(("route", "body", "field"), BAD)
def test_a_bad_body_is_400_naming_its_field_and_records_nothing(
    api: Api, route: str, body: bytes | dict[str, Any], field: str
) -> None:
    before = api.head()
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    with api.client("ctl") as client:
        answer = client.post(route.format(api.instance_id), content=content, headers=JSON)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["field"] is not None and error["field"].startswith(field), error
    assert error["message"].startswith(f"{error['field']}: "), error
    if field == "generation":
        assert "0 to 2^63-1" in error["message"]
    Contract().check(answer)
    assert api.head() == before


NODE_REFUSED = [
    ({"role": ""}, "spec.role"),
    ({"port": 0}, "spec.port"),
    ({"ctx_size": 1}, "spec.ctx_size"),
    ({"host": "10.0.0.1"}, "spec.host"),
    ({"model": None}, "spec.model"),
    ({"model": "nope"}, "spec.model"),
    ({"env": {"LD_PRELOAD": "x"}}, "spec.env"),
    ({"kind": "nope"}, "spec.kind"),
    ({"restart": {"base_s": -1}}, "spec.restart"),  # or spec.restart.base_s
    ({"restart": {"bogus": 1}}, "spec.restart"),
]


@pytest.mark.parametrize(("change", "field"), NODE_REFUSED)
def test_every_bad_spec_the_node_refuses_names_its_field(
    api: Api, change: dict[str, Any], field: str
) -> None:
    before = api.head()
    with api.client("ctl") as client:
        answer = client.post("/v1/instances", json={"spec": {**SPEC, "port": 18742, **change}})
    error = refused(answer, 400, "bad_spec")
    assert error["field"] == field or error["field"].startswith(f"{field}."), error
    assert api.head() == before
