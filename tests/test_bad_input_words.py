"""Bad input answered in the project's words (stop 33b: a newcomer's findings).

- A body that is not a JSON object: msgspec said ``Input data was truncated`` for
  an empty body and for a lone surrogate escape (``"\\ud800"``), and ``not valid
  JSON: Expected `object | null`, got `array``` for ``[]`` (valid JSON): each is
  said as what it is, by the control API and the front alike, in no words of msgspec.
- A bad key of a spec's ``restart`` named ``spec.restart``, not the key.
- ``memory_max_bytes: 1000`` was placed, and the server OOM-killed at once, again
  and again.
- A caller's 100 KB value came back whole in the error (the front's 404, the API's
  400s).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from conftest import NodeFactory
from support import chain_rows
from test_api_bodies import (
    SPEC,
    starting,  # noqa: F401 - the fixture
)
from test_drain_node import refused, served
from test_front import assert_openai_error, client, front, llama, node

from infervisor.actors.node import Node
from infervisor.adapters.errors import SpecError
from infervisor.adapters.ports import free_port
from infervisor.adapters.spec import MIN_MEMORY_MAX_BYTES, Flavor, InstanceSpec
from infervisor.tools.api.answers import answer_for
from infervisor.tools.front import bodies
from infervisor.tools.front.errors import FrontError

__all__ = ["front", "node"]  # fixtures of test_front, used here

#: msgspec's own words, which no answer passes on.
MSGSPEC_WORDS = ("Input data was truncated", "JSON is malformed", "Expected `", "UTF-8 encoded")
JSON = {"content-type": "application/json"}


def api_refusal(c: httpx.Client, path: str, body: bytes) -> dict[str, Any]:
    answer = c.post(path, content=body, headers=JSON)
    assert answer.status_code == 400, (answer.status_code, answer.text)
    error: dict[str, Any] = answer.json()["error"]
    assert error["message"].startswith(f"{error['field']}: "), error
    assert not any(w in error["message"] for w in MSGSPEC_WORDS), error
    return error


@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        ("/v1/node/cordon", rb'{"reason":"\ud800"}', "lone UTF-16 surrogate escape (\\ud800)"),
        ("/v1/node/cordon", rb'{"reason":"a\udc00b"}', "lone UTF-16 surrogate escape (\\udc00)"),
        ("/v1/instances", b"[]", "body: the body must be a JSON object, not an array"),
        ("/v1/node/cordon", b"[]", "body: the body must be a JSON object, not an array"),
        ("/v1/heartbeat", b'"c1"', "body: the body must be a JSON object, not a string"),
        ("/v1/instances", b"", "body: the body is empty; a JSON object is expected"),
        ("/v1/heartbeat", b"  \n", "body: the body is empty; a JSON object is expected"),
        ("/v1/instances", b'{"spec": ', "body: not valid JSON: the body ends before"),
        (
            "/v1/heartbeat",
            b'{"controller": "c1"} x',
            "not valid JSON at byte 22: more follows the JSON value",
        ),
        ("/v1/heartbeat", b'{"controller": "\xff"}', "not valid JSON text: a string is not valid"),
    ],
)
def test_the_api_says_what_is_wrong_with_a_body_that_is_not_a_json_object(
    starting: httpx.Client,  # noqa: F811 - the fixture imported above
    path: str,
    body: bytes,
    said: str,
) -> None:
    error = api_refusal(starting, path, body)
    assert (error["field"], error["code"]) == ("body", "bad_request"), error
    assert said in error["message"], error


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("port", 2**64, "allowed 1-65535"),
        ("port", -(2**63) - 1, "allowed 1-65535"),
        ("ctx_size", 2**64, "allowed 8 to 16777216 tokens"),
        ("priority", 2**70, "allowed a whole number from -1000 to 1000"),
        ("memory_max_bytes", 2**64, "allowed a whole number of bytes from 67108864 (64 MiB)"),
        ("threads", 2**64, "allowed a whole number from 1 to 1024"),
        ("restart.max_restarts", 2**64, "allowed a whole number, 0 or more"),
        ("restart.base_s", 2**64, "allowed more than 0 to 604800 seconds, at most cap_s"),
        ("restart.cap_s", -(2**70), "allowed more than 0 to 604800 seconds, at least base_s"),
        ("restart.stable_after_s", 2**64, "allowed more than 0 to 604800 seconds"),
        ("restart.window_s", 2**64, "allowed more than 0 to 604800 seconds, or none"),
        ("restart.jitter", 2**64, "allowed 0 to 1"),
    ],
)
def test_a_spec_integer_beyond_64_bits_quotes_the_fields_own_range(
    starting: httpx.Client,  # noqa: F811 - the fixture imported above
    field: str,
    value: int,
    said: str,
) -> None:
    """Stop 34's trial: spec.port 2^64 was refused quoting the 64-bit range (and
    a restart override, spec.restart.base_s 2^64, too)."""
    outer, _, inner = field.rpartition(".")
    given: dict[str, Any] = {inner: value}
    spec = {**SPEC, outer: given} if outer else {**SPEC, **given}
    error = api_refusal(starting, "/v1/instances", msgspec.json.encode({"spec": spec}))
    assert (error["field"], error["code"]) == (f"spec.{field}", "bad_spec"), error
    assert f"{value} is out of range: {said}" in error["message"], error
    assert "64-bit" not in error["message"] and "9223372036854775807" not in error["message"]


@pytest.mark.parametrize(
    ("path", "body", "field", "code"),
    [
        (
            "/v1/instances",
            b'{"spec": {"role": "chat", "flavor": "llamacpp", "port": 18741, "model": "tiny", '
            b'"port": 9090}}',
            "spec.port",
            "bad_spec",
        ),
        (
            "/v1/instances",
            b'{"spec": {"role": "chat", "flavor": "llamacpp", "port": 18741, "model": "tiny", '
            b'"env": {"HOME": "/a", "HOME": "/b"}}}',
            "spec.env.HOME",
            "bad_spec",
        ),
        ("/v1/node/cordon", b'{"reason": "a", "reason": "b"}', "reason", "bad_request"),
        ("/v1/heartbeat", b'{"controller": "c1", "controller": "c2"}', "controller", "bad_request"),
    ],
)
def test_a_key_given_twice_is_refused_naming_it(
    starting: httpx.Client,  # noqa: F811 - the fixture imported above
    path: str,
    body: bytes,
    field: str,
    code: str,
) -> None:
    """Stop 34's trial: a duplicated key in a body was taken silently, the last one
    winning (msgspec's decode cannot see it)."""
    error = api_refusal(starting, path, body)
    assert (error["field"], error["code"]) == (field, code), error
    assert f"{field}: given twice in one object: give each key once" in error["message"]


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"", "/v1/chat/completions: the body is empty; a JSON object is expected"),
        (b"[]", "/v1/chat/completions: the body must be a JSON object, not an array"),
        (b"null", "/v1/chat/completions: the body must be a JSON object, not null"),
        (rb'{"model": "\ud800", "messages": []}', "lone UTF-16 surrogate escape (\\ud800)"),
        (b'{"model": "tiny",', "not valid JSON: the body ends before its JSON value does"),
        (b"{not json", "not valid JSON at byte 1: a key that is not a string"),
    ],
)
def test_the_front_says_what_is_wrong_with_a_body_that_is_not_a_json_object(
    body: bytes, said: str
) -> None:
    with pytest.raises(FrontError) as caught:
        bodies.parse("/v1/chat/completions", body)
    error = caught.value
    assert (error.status, error.code, error.param) == (400, "invalid_body", None)
    assert said in error.message, error.message
    assert not any(w in error.message for w in MSGSPEC_WORDS), error.message


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"model": "a", "messages": [], "model": "b"}', "model"),
        (b'{"model": "a", "messages": [{"role": "user", "role": "s"}]}', "messages.0.role"),
    ],
)
def test_the_front_refuses_a_key_given_twice_naming_it(body: bytes, field: str) -> None:
    """msgspec keeps the last (``model`` "b" would be routed); the control API's
    json_keys names it, with its path, in the front's own error shape."""
    with pytest.raises(FrontError) as caught:
        bodies.parse("/v1/chat/completions", body)
    error = caught.value
    assert (error.status, error.code, error.param) == (400, "invalid_body", field)
    assert error.message == (
        f"/v1/chat/completions: `{field}`: given twice in one object: give each key once"
    )


def test_an_empty_post_to_the_front_is_answered_so(node: Node, front: Any) -> None:
    node.place(llama("chat"))
    with client(front(node)) as c:
        answer = c.post("/v1/chat/completions", content=b"", headers=JSON)
    error = assert_openai_error(answer, 400, "invalid_body")
    assert error["message"] == (
        "/v1/chat/completions: the body is empty; a JSON object is expected"
    ), error


@pytest.mark.parametrize(
    ("restart", "field"),
    [
        ({"base_s": "2"}, "restart.base_s"),
        ({"base_s": -1}, "restart.base_s"),
        ({"max_restarts": -1}, "restart.max_restarts"),
        ({"max_restarts": 1.5}, "restart.max_restarts"),
        ({"cap_s": 1e-6}, "restart.cap_s"),  # below the node's base_s
        ({"jitter": 2}, "restart.jitter"),
        ({"bogus": 1}, "restart.bogus"),
    ],
)
def test_a_bad_restart_key_is_named_and_nothing_is_recorded(
    nodes: NodeFactory, fake_llama: str, fake_model: Path, restart: dict[str, Any], field: str
) -> None:
    settings = nodes.settings(fake_llama, fake_model)
    n = nodes.open(settings)
    rows = chain_rows(Path(settings.chain_path))
    spec = InstanceSpec(
        role="chat", flavor=Flavor.LLAMACPP, model="tiny", port=18741, restart=restart
    )
    with pytest.raises(SpecError) as caught:
        n.place(spec)
    assert caught.value.field == field, caught.value
    _, body = answer_for(caught.value)
    assert (body.code, body.field) == ("bad_spec", f"spec.{field}"), body
    assert body.message.startswith(field), body
    assert chain_rows(Path(settings.chain_path)) == rows
    assert n.list() == []


def test_the_api_names_the_restart_key_and_the_memory_floor_in_a_placement_and_a_set(
    nodes: NodeFactory, fake_llama: str, fake_model: Path
) -> None:
    settings = nodes.settings(fake_llama, fake_model)
    db = Path(settings.chain_path)
    with served(nodes, settings, fake_model) as (_, api):
        rows = chain_rows(db)
        good = InstanceSpec(role="ok", flavor=Flavor.LLAMACPP, model="tiny", port=free_port())
        for change, field in (
            ({"restart": {"base_s": "2"}}, "spec.restart.base_s"),
            ({"restart": {"max_restarts": -1}}, "spec.restart.max_restarts"),
            ({"memory_max_bytes": 1000}, "spec.memory_max_bytes"),
        ):
            bad = msgspec.structs.replace(good, role="bad", port=free_port(), **change)
            error = refused("bad_spec", lambda b=bad: api.place(b))
            assert (error.status, error.field) == (400, field), error
            error = refused(
                "bad_spec",
                lambda b=bad: api.put_placements("ctl-1", 1, [(good, False), (b, False)]),
            )
            assert (error.status, error.field) == (400, f"placements[1].{field}"), error
        assert chain_rows(db) == rows  # refused: nothing recorded
        assert api.list() == []


@pytest.mark.parametrize("limit", [1000, 16 << 20, MIN_MEMORY_MAX_BYTES - 1])
def test_a_memory_limit_below_what_a_server_needs_is_refused(limit: int) -> None:
    spec = InstanceSpec(
        role="chat", flavor=Flavor.LLAMACPP, model="tiny", port=8080, memory_max_bytes=limit
    )
    with pytest.raises(SpecError) as caught:
        spec.validate()
    assert caught.value.field == "memory_max_bytes"
    message = str(caught.value)
    assert message.startswith(f"memory_max_bytes {limit}: allowed at least 67108864 (64 MiB)")
    assert "OOM killer" in message


def test_a_memory_limit_at_the_floor_is_taken() -> None:
    InstanceSpec(
        role="chat",
        flavor=Flavor.LLAMACPP,
        model="tiny",
        port=8080,
        memory_max_bytes=MIN_MEMORY_MAX_BYTES,
    ).validate()


def test_the_fronts_404_quotes_a_long_model_cut_with_its_length(node: Node, front: Any) -> None:
    node.place(llama("chat"))
    asked = "x" + "a" * 100_000
    with client(front(node)) as c:
        answer = c.post("/v1/chat/completions", json={"model": asked, "messages": []})
        words = c.post("/v1/chat/completions", json={"model": "a b " * 25_000, "messages": []})
    error = assert_openai_error(answer, 404, "model_not_found")
    assert len(error["message"]) < 600, len(error["message"])
    assert f"'x{'a' * 198}… (100001 characters)" in error["message"], error["message"][:400]
    assert "models (served names and roles" in error["message"]  # what there is, still
    assert len(assert_openai_error(words, 404, "model_not_found")["message"]) < 600


@pytest.mark.parametrize(
    "spec",
    [
        {**SPEC, "flavor": "x" * 100_000},  # msgspec's "Invalid enum value 'xxx...'"
        {**SPEC, "role": "a b " * 25_000},  # the node's "role 'a b a b ...' must be ..."
    ],
)
def test_the_apis_answer_never_repeats_a_long_value_whole(
    starting: httpx.Client,  # noqa: F811 - the fixture imported above
    spec: dict[str, Any],
) -> None:
    body = msgspec.json.encode({"spec": spec})
    answer = starting.post("/v1/instances", content=body, headers=JSON)
    if answer.status_code == 503:  # the body decodes: the node's own check says it
        with pytest.raises(SpecError) as caught:
            msgspec.convert(spec, InstanceSpec).validate()
        _, error = answer_for(caught.value)
        message = error.message
    else:
        message = answer.json()["error"]["message"]
    assert len(message) < 2100, len(message)
