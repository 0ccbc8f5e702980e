"""Who may use the control API: bearer tokens on TCP, the socket's mode and
SO_PEERCRED on the Unix socket, the refusals of ``[api]`` at start, the tokens file.

Real ``infervisor run`` processes with no instances (fast). Every refusal is
checked against docs/openapi.json and leaves the chain's head where it was.
The other-uid checks run a forked child as uid 65534 (nobody): the tests run
as root here; they are skipped otherwise.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import sqlite3
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import cli_here
from test_openapi_doc import Contract
from test_run_resume import MODEL_BYTES, NodeRun, end_runs

from infervisor.adapters.ports import free_port
from infervisor.tools.node.config import ConfigError, load_config

NOBODY = 65534


def node_config(root: Path, tcp: str, extra_api: str = "", tail: str = "") -> Path:
    path = root / "node.toml"
    path.write_text(
        f"""
[node]
node_id = "n1"
data_dir = "data"

[api]
tcp = "{tcp}"
{extra_api}
{tail}"""
    )
    return path


def head(db: Path) -> tuple[int, bytes]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        seq, digest = conn.execute(
            "SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1"
        ).fetchone()
    finally:
        conn.close()
    return int(seq), bytes(digest)


def start_node(root: Path, config: Path, log: str = "run.log") -> NodeRun:
    run = NodeRun(config, root / log)
    data = root / "data"
    try:
        run.until("the API socket", (data / "api.sock").exists)
        transport = httpx.HTTPTransport(uds=str(data / "api.sock"))
        with httpx.Client(transport=transport, base_url="http://localhost") as client:
            run.until("the node open", lambda: client.get("/v1/node").status_code == 200)
    except BaseException:
        end_runs([run], data / "chain.db")  # a failed set-up leaves no node behind
        raise
    return run


class Node:
    def __init__(self, root: Path, run: NodeRun, port: int) -> None:
        self.root = root
        self.data = root / "data"
        self.db = self.data / "chain.db"
        self.sock = self.data / "api.sock"
        self.run = run
        self.url = f"http://127.0.0.1:{port}"
        self.tokens: dict[str, str] = json.loads((self.data / "api-tokens.json").read_text())


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    # Not under pytest's tmp dir (0700): uid 65534 must reach the socket's directory,
    # so that it is the socket's own mode that refuses it.
    root = Path(tempfile.mkdtemp(prefix="ivauth-"))
    try:
        root.chmod(0o711)
        (root / "data").mkdir(mode=0o711)
        port = free_port()
        run = start_node(root, node_config(root, f"127.0.0.1:{port}"))
        try:
            yield Node(root, run, port)
            assert run.stop() == 0, run.output()
        finally:
            end_runs([run], root / "data" / "chain.db")
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------- TCP
BAD_AUTHORIZATION = [
    None,
    "Bearer not-a-token-of-this-node",
    "Bearer",
    "Basic dXNlcjpwYXNz",
    "Token abc",
    "bearer",
]


@pytest.mark.parametrize("authorization", BAD_AUTHORIZATION)
def test_tcp_refuses_a_missing_wrong_or_malformed_token(
    node: Node, authorization: str | None
) -> None:
    contract = Contract()
    before = head(node.db)
    headers = {"authorization": authorization} if authorization is not None else {}
    with httpx.Client(base_url=node.url, headers=headers) as client:
        answers = [
            client.get("/v1/node"),
            client.get("/metrics"),
            client.get("/v1/events", params={"from_seq": 0, "follow": False}),
            client.post("/v1/heartbeat", json={"controller": "c1"}),
            client.post("/v1/instances/x/stop", headers={"idempotency-key": "k1"}),
            client.post("/v1/instances", json={"spec": {}}),
        ]
    for answer in answers:
        assert answer.status_code == 401, answer.text
        assert answer.headers["www-authenticate"] == 'Bearer realm="infervisor"'
        body = contract.check(answer)
        assert body["error"]["code"] == "unauthorized"
    assert head(node.db) == before


def test_tcp_takes_each_configured_token(node: Node) -> None:
    assert sorted(node.tokens) == ["controller", "operator"]
    for name, secret in node.tokens.items():
        with httpx.Client(base_url=node.url, headers={"authorization": f"Bearer {secret}"}) as c:
            answer = c.get("/v1/node")
        assert answer.status_code == 200, (name, answer.text)
        Contract().check(answer)


def test_the_default_tokens_hold_their_default_scopes(node: Node) -> None:
    """``operator`` operates but may not heartbeat (control); ``controller`` may."""
    before = head(node.db)
    beat = {"controller": "c1"}
    with httpx.Client(base_url=node.url) as client:
        bearer = {name: {"authorization": f"Bearer {s}"} for name, s in node.tokens.items()}
        refused = client.post("/v1/heartbeat", json=beat, headers=bearer["operator"])
        assert refused.status_code == 403, refused.text
        error = Contract().check(refused)["error"]
        assert error["code"] == "forbidden" and "needs scope control" in error["message"]
        assert head(node.db) == before
        stop = client.post("/v1/instances/nope/stop", headers=bearer["operator"])
        assert stop.status_code == 404, stop.text  # within operate: the instance is unknown
        answer = client.post("/v1/heartbeat", json=beat, headers=bearer["controller"])
        assert answer.status_code == 200, answer.text


# ---------------------------------------------------------------- another uid
def as_nobody(path: Path, request: bytes) -> dict[str, Any]:
    """Connect to ``path`` and send ``request`` as uid/gid 65534 (a forked child):
    ``{"errno": N}`` when the connect fails, else ``{"answer": raw HTTP answer}``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            out: dict[str, Any]
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.settimeout(20)
                    sock.connect(str(path))
                    sock.sendall(request)
                    chunks = []
                    while chunk := sock.recv(65536):
                        chunks.append(chunk)
                out = {"answer": b"".join(chunks).decode("latin-1")}
            except OSError as e:
                out = {"errno": e.errno}
            os.write(write_end, json.dumps(out).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        raw = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    result: dict[str, Any] = json.loads(raw)
    return result


def http_request(method: str, path: str, body: bytes = b"") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def as_response(raw: str, method: str, path: str) -> httpx.Response:
    head_part, _, body = raw.partition("\r\n\r\n")
    status_line, *lines = head_part.split("\r\n")
    headers = [tuple(line.split(": ", 1)) for line in lines]
    return httpx.Response(
        int(status_line.split()[1]),
        headers=headers,
        content=body.encode("latin-1"),
        request=httpx.Request(method, f"http://localhost{path}"),
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as uid 65534")
def test_another_uid_is_refused_by_the_socket_mode_then_by_its_credentials(node: Node) -> None:
    before = head(node.db)
    assert stat.S_IMODE(node.sock.stat().st_mode) == 0o600
    beat = http_request("POST", "/v1/heartbeat", b'{"controller":"c1"}')
    assert as_nobody(node.sock, beat) == {"errno": errno.EACCES}

    node.sock.chmod(0o666)
    try:
        contract = Contract()
        for method, path, request in [
            ("POST", "/v1/heartbeat", beat),
            ("GET", "/v1/node", http_request("GET", "/v1/node")),
            ("POST", "/v1/instances/x/unload", http_request("POST", "/v1/instances/x/unload")),
        ]:
            answer = as_response(as_nobody(node.sock, request)["answer"], method, path)
            assert answer.status_code == 403, answer.text
            error = contract.check(answer)["error"]
            assert error["code"] == "forbidden" and "uid=65534" in error["message"]
    finally:
        node.sock.chmod(0o600)
    assert head(node.db) == before


# ---------------------------------------------------------------- [api] at start
def test_a_non_loopback_address_is_refused_without_the_allowance(tmp_path: Path) -> None:
    config = node_config(tmp_path, f"0.0.0.0:{free_port()}")
    refused = cli_here("run", config)  # refused by the config's load: in this process
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = refused.stdout + refused.stderr
    assert "api.tcp" in said and "allow_non_loopback" in said
    assert not (tmp_path / "data" / "chain.db").exists()
    assert not (tmp_path / "data" / "api-tokens.json").exists()


def test_the_api_port_may_not_be_an_instance_port(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "data" / "models").mkdir(parents=True)
    (tmp_path / "data" / "models" / "tiny.gguf").write_bytes(MODEL_BYTES)
    instance = f"""
[[models]]
name = "tiny"
path = "tiny.gguf"

[[instances]]
role = "chat"
flavor = "llamacpp"
model = "tiny"
port = {port}
"""
    config = node_config(tmp_path, f"127.0.0.1:{port}", tail=instance)
    with pytest.raises(ConfigError) as refused:
        load_config(config)
    said = str(refused.value)
    assert "[[instances]] #1" in said and f"port {port}" in said and "[api] tcp" in said
    assert not (tmp_path / "data" / "chain.db").exists()


def test_beyond_loopback_with_the_allowance_tokens_are_needed_and_kept(tmp_path: Path) -> None:
    """``allow_non_loopback``: it starts on 0.0.0.0 and still needs a token; the
    tokens file is 0600 with the configured names, and the next start reuses it.
    ``alice`` (a bare name) holds read, ``bob`` the control its table gives."""
    port = free_port()
    api = 'allow_non_loopback = true\ntokens = ["alice", { name = "bob", scope = "control" }]'
    config = node_config(tmp_path, f"0.0.0.0:{port}", api)
    tokens = tmp_path / "data" / "api-tokens.json"
    runs = []
    first: dict[str, str] = {}
    try:
        for n in (1, 2):
            run = start_node(tmp_path, config, f"run-{n}.log")
            runs.append(run)
            assert stat.S_IMODE(tokens.stat().st_mode) == 0o600
            secrets = json.loads(tokens.read_text())
            assert sorted(secrets) == ["alice", "bob"]
            first = first or secrets
            assert secrets == first  # the second start reuses the first's secrets
            with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
                refused = client.get("/v1/node")
                assert refused.status_code == 401
                Contract().check(refused)
                for name, secret in secrets.items():
                    bearer = {"authorization": f"Bearer {secret}"}
                    answer = client.get("/v1/node", headers=bearer)
                    assert answer.status_code == 200, answer.text
                    beat = client.post("/v1/heartbeat", json={"controller": "c"}, headers=bearer)
                    assert beat.status_code == (200 if name == "bob" else 403), beat.text
            assert run.stop() == 0, run.output()
    finally:
        end_runs(runs, tmp_path / "data" / "chain.db")
