"""The control API under concurrency: 20 clients race 300 verbs at one
``infervisor run`` node whose supervision ticks race them too.

Every answer must agree with the chain (the seq and hash it carries are a
row of the chain, of that instance), every refusal must come in the error
shape with a code the verb may be refused with, the chain must verify, and
the chain replayed up to its head must equal what the live node shows.
Idempotent retries are answered byte for byte from the first answer and
append nothing. The test counts what it exercised and fails when a verb
kind or an outcome it claims to cover was never reached.
"""

from __future__ import annotations

import contextlib
import json
import random
import sqlite3
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from support import cli_here, wait_until
from test_run_resume import NodeRun, end_runs, put_model, toml_str

from infervisor.adapters.ports import free_port
from infervisor.adapters.spec import Flavor, InstanceSpec, instance_id
from infervisor.replay import rebuild
from infervisor.tools.api.client import ApiClient
from infervisor.tools.api.errors import ApiError
from infervisor.tools.api.wire import ErrorEnvelope, InstanceView, PlaceAnswer, VerbAnswer

pytestmark = pytest.mark.slow

SEED = 20261201
CLIENTS = 20
#: Enough to reach every verb kind, 200 and 409 answers, and placements applied and
#: unchanged, with margin: with this seed 300 verbs gave at least 24 successes of
#: each verb, 24 refusals (12 start, 4 restart, 8 place) and 26 applied and 17
#: unchanged placements; 1,000 only repeated them, at four times the CPU. The
#: test fails naming what it never reached.
VERBS = 300
RESENDS = 50
DEADLINE_S = 60.0  # a bound on a hang, never a measurement: generous at load 10
NODE_ID = "n1"
CONTROLLER = "ctl"

#: Relative weights of the verbs in the mix.
MIX = {
    "status": 18,
    "list": 12,
    "start": 15,
    "stop": 15,
    "restart": 10,
    "place": 18,
    "heartbeat": 12,
}

#: (status, code) each verb may be answered with; anything else fails the test.
OK = (200, None)
ALLOWED: dict[str, set[tuple[int, str | None]]] = {
    "status": {OK},
    "list": {OK},
    "heartbeat": {OK},
    # Refused while the instance is stopping (start it once it has stopped).
    "start": {OK, (409, "invalid_state")},
    # A stop of a stopped instance is answered as it is; one stopping escalates.
    "stop": {OK},
    # Refused while stopping; a restart already under way is joined.
    "restart": {OK, (409, "invalid_state")},
    # Refused while another placement of the same instance is in progress.
    "place": {OK, (409, "invalid_state")},
}
STABLE = {"running", "stopped", "loaded", "failed"}


# ---------------------------------------------------------------- the node
def config_text(program: str, ports: list[int]) -> str:
    """Node n1: c0, c1 (started), c2 (not started) from the config; p0, p1 placed later."""
    entries = "".join(
        f"""
[[instances]]
role = "c{i}"
flavor = "llamacpp"
model = "tiny"
port = {port}
start = {"true" if i < 2 else "false"}
"""
        for i, port in enumerate(ports)
    )
    return f"""
[node]
node_id = "{NODE_ID}"
data_dir = "data"
llamacpp_program = {toml_str(program)}
health_interval_s = 0.05
reconcile_interval_s = 0.2
stop_grace_s = 2.0

[[models]]
name = "tiny"
path = "tiny.gguf"
{entries}"""


@pytest.fixture
def node(tmp_path: Path, fake_llama: str) -> Iterator[NodeRun]:
    put_model(tmp_path / "data")
    config = tmp_path / "node.toml"
    config.write_text(config_text(fake_llama, [free_port() for _ in range(3)]))
    run = NodeRun(config, tmp_path / "run.log")
    try:
        run.until("the node running", lambda: "Ctrl-C or SIGTERM stops it" in run.output())
        yield run
        assert run.stop() == 0, run.output()
        assert "Traceback" not in run.output()
    finally:
        end_runs([run], tmp_path / "data" / "chain.db")


# ---------------------------------------------------------------- one request
@dataclass
class Raw:
    """One answer as it came over the wire."""

    method: str
    path: str
    body: bytes
    key: str | None
    status: int
    content: bytes
    headers: dict[str, str]


@dataclass
class Outcome:
    verb: str
    instance: str | None
    raw: Raw
    error: ApiError | None = None
    answer: Any = None


class Recorder:
    """An ApiClient whose every answer is also kept raw (an httpx response hook)."""

    def __init__(self, data_dir: Path) -> None:
        self.client = ApiClient(data_dir=data_dir, timeout_s=60.0)
        self.last: Raw | None = None
        self.client._http.event_hooks["response"].append(self._keep)

    def _keep(self, response: httpx.Response) -> None:
        response.read()
        request = response.request
        self.last = Raw(
            method=request.method,
            path=request.url.path,
            body=request.content,
            key=request.headers.get("idempotency-key"),
            status=response.status_code,
            content=response.content,
            headers=dict(response.headers),
        )

    def call(self, verb: str, instance: str | None, work: Callable[[ApiClient], Any]) -> Outcome:
        self.last = None
        try:
            answer, error = work(self.client), None
        except ApiError as e:
            answer, error = None, e
        assert self.last is not None, f"{verb} {instance}: no HTTP answer ({error})"
        return Outcome(verb, instance, self.last, error, answer)

    def resend(self, raw: Raw) -> Raw:
        """The same request again, byte for byte, with its key."""
        assert raw.key is not None
        headers = {"idempotency-key": raw.key, "content-type": "application/json"}
        self.last = None
        self.client._http.request(raw.method, raw.path, content=raw.body, headers=headers)
        assert self.last is not None
        return self.last


# ---------------------------------------------------------------- the race
@dataclass
class Placements:
    """The controller's generations, handed out under a lock."""

    specs: dict[str, InstanceSpec]
    generation: dict[str, int]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next(self, iid: str, new: bool) -> int:
        with self.lock:
            if new:
                self.generation[iid] += 1
            return self.generation[iid]


def one_verb(rec: Recorder, rng: random.Random, ids: list[str], placements: Placements) -> Outcome:
    verb = rng.choices(list(MIX), weights=list(MIX.values()))[0]
    iid = rng.choice(ids)
    key = uuid.uuid4().hex
    match verb:
        case "status":
            return rec.call(verb, iid, lambda c: c.status(iid))
        case "list":
            return rec.call(verb, None, lambda c: c.list())
        case "start":
            return rec.call(verb, iid, lambda c: c.start(iid, idempotency_key=key))
        case "stop":
            grace = rng.choice([0.0, 0.1, 0.3])
            return rec.call(verb, iid, lambda c: c.stop(iid, grace, idempotency_key=key))
        case "restart":
            return rec.call(verb, iid, lambda c: c.restart(iid, idempotency_key=key))
        case "place":
            pid = rng.choice(sorted(placements.specs))
            spec = placements.specs[pid]
            generation = placements.next(pid, new=rng.random() < 0.5)
            return rec.call(
                verb,
                pid,
                lambda c: c.place(
                    spec, controller=CONTROLLER, generation=generation, idempotency_key=key
                ),
            )
        case "heartbeat":
            return rec.call(verb, None, lambda c: c.heartbeat(CONTROLLER, idempotency_key=key))
    raise AssertionError(verb)


def race(data_dir: Path, ids: list[str], placements: Placements) -> list[Outcome]:
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    failures: list[BaseException] = []
    per_client = VERBS // CLIENTS

    def client(n: int) -> None:
        rng = random.Random(SEED * 100 + n)
        rec = Recorder(data_dir)
        try:
            for _ in range(per_client):
                got = one_verb(rec, rng, ids, placements)
                with lock:
                    outcomes.append(got)
        except BaseException as e:
            failures.append(e)
        finally:
            rec.client.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a client thread is still waiting for an answer"
    if failures:
        raise failures[0]
    assert len(outcomes) == VERBS
    return outcomes


# ---------------------------------------------------------------- checks
def chain_rows(db: Path) -> dict[int, tuple[str, str]]:
    """seq -> (hash hex, subject), read with sqlite3 read-only."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        rows = con.execute("SELECT seq, hash, subject FROM events").fetchall()
    return {seq: (bytes(h).hex(), subject or "") for seq, h, subject in rows}


def check_answer(got: Outcome, rows: dict[int, tuple[str, str]]) -> None:
    """The answer is one the verb may give, in its shape, and agrees with the chain."""
    raw = got.raw
    what = f"{got.verb} {got.instance}: HTTP {raw.status} {raw.content[:300]!r}"
    if got.error is not None:
        error = msgspec.json.decode(raw.content, type=ErrorEnvelope).error
        assert (error.code, raw.status) == (got.error.code, got.error.status), what
        assert (raw.status, error.code) in ALLOWED[got.verb], what
        assert error.message, what
        return
    assert (raw.status, None) in ALLOWED[got.verb], what
    answer = got.answer
    if isinstance(answer, VerbAnswer | PlaceAnswer):
        subject = answer.instance_id if isinstance(answer, PlaceAnswer) else None
        subject = subject or answer.instance.instance_id
        assert subject == got.instance, what
        assert answer.seq in rows, f"{what}: seq {answer.seq} is not in the chain"
        assert rows[answer.seq] == (answer.hash, subject), (
            f"{what}: the chain's row {answer.seq} is {rows[answer.seq]}"
        )


def assert_appended_nothing(db: Path, head: int, during: str) -> None:
    """No event after ``head``; else name what was appended (and so who did it)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
        later = con.execute(
            "SELECT seq, kind, subject, source FROM events WHERE seq > ? ORDER BY seq", (head,)
        ).fetchall()
    assert not later, f"appended during {during} (head was {head}): {later}"


def settled(client: ApiClient) -> list[InstanceView] | None:
    """Every instance in a stable state that fits what is wanted, and the head
    did not move while the views were read; None otherwise."""
    head = client.node().head_seq
    views = client.list()
    if client.node().head_seq != head:
        return None
    for v in views:
        if v.lifecycle not in STABLE:
            return None
        if v.desired == "running" and (v.lifecycle, v.health) != ("running", "up"):
            return None
        if v.desired == "stopped" and v.lifecycle == "running":
            return None
    return views


def live_and_replayed(client: ApiClient, data_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(live, replayed) lifecycle, desired, generation and restarts per instance,
    read at one chain head (read again while the head moves)."""

    def attempt() -> tuple[dict[str, Any], dict[str, Any]] | None:
        head = client.node().head_seq
        views = client.list()
        if client.node().head_seq != head:
            return None
        replayed = cli_here("replay", data_dir, "--until", head, "--json")
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr
        state = json.loads(replayed.stdout)
        assert state["head_seq"] == head
        live = {v.instance_id: (v.lifecycle, v.desired, v.generation, v.restarts) for v in views}
        offline = {
            iid: (i["lifecycle"], i["desired"], i["generation"], i["restarts"])
            for iid, i in state["instances"].items()
        }
        return live, offline

    got: tuple[dict[str, Any], dict[str, Any]] = wait_until(attempt, DEADLINE_S, "a still head")
    return got


# ---------------------------------------------------------------- the test
def test_twenty_clients_race_three_hundred_verbs(node: NodeRun, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    db = data_dir / "chain.db"
    client = ApiClient(data_dir=data_dir, timeout_s=60.0)
    try:
        # Two instances a controller places (generation 1), started.
        specs = {}
        for role in ("p0", "p1"):
            spec = InstanceSpec(role=role, flavor=Flavor.LLAMACPP, port=free_port(), model="tiny")
            placed = client.place(spec, controller=CONTROLLER, generation=1, start=True)
            assert placed.outcome == "applied"
            specs[placed.instance_id] = spec
            assert placed.instance_id == instance_id(spec, NODE_ID)
        ids = sorted(v.instance_id for v in client.list())
        assert len(ids) == 5, ids
        config_placed = {iid for iid, i in rebuild(db).instances.items() if i.placed_by == NODE_ID}
        assert len(config_placed) == 3
        node.until("the started instances running", lambda: settled(client), DEADLINE_S)

        outcomes = race(data_dir, ids, Placements(specs, dict.fromkeys(specs, 1)))

        views = node.until(
            "every instance settled after the race", lambda: settled(client), DEADLINE_S
        )
        rows = chain_rows(db)
        for got in outcomes:
            check_answer(got, rows)

        # What was exercised: every verb kind, and 2xx and 409 outcomes.
        verbs = Counter(o.verb for o in outcomes)
        statuses = Counter((o.verb, o.raw.status) for o in outcomes)
        codes = Counter(o.raw.status for o in outcomes)
        places = Counter(o.answer.outcome for o in outcomes if isinstance(o.answer, PlaceAnswer))
        print(f"verbs {dict(verbs)}\nstatuses {dict(codes)}\nper verb {dict(statuses)}")
        print(f"placements {dict(places)}")
        refusals = Counter(
            (o.verb, o.error.code, str(o.error).split(":")[-1][:60]) for o in outcomes if o.error
        )
        print(f"refusals {dict(refusals)}")
        print(f"settled {[(v.instance_id, v.lifecycle, v.desired) for v in views]}")
        assert set(verbs) == set(MIX), f"verbs never sent: {set(MIX) - set(verbs)}"
        assert codes[200] and codes[409], f"answers by status: {dict(codes)}"
        for verb in MIX:
            assert statuses[verb, 200], f"{verb} never succeeded: {dict(statuses)}"
        assert places["applied"] and places["unchanged"], f"placements: {dict(places)}"

        verified = cli_here("chain", "verify", data_dir)
        assert verified.returncode == 0, verified.stdout + verified.stderr
        live, offline = live_and_replayed(client, data_dir)
        assert live == offline

        # Idempotent retries, once quiescent: the first answer again, nothing appended.
        # Answers and refusals alike are kept (4xx); a sample of both.
        posts = [o.raw for o in outcomes if o.raw.method == "POST"]
        done = [r for r in posts if r.status == 200]
        refused = [r for r in posts if r.status == 409]
        pick = random.Random(SEED)
        sample = pick.sample(done, RESENDS - 10) + pick.sample(refused, min(10, len(refused)))
        rec = Recorder(data_dir)
        try:
            head = client.node().head_seq
            for raw in sample:
                again = rec.resend(raw)
                assert (again.status, again.content) == (raw.status, raw.content), raw.path
                assert again.headers.get("idempotent-replayed") == "true", again.headers
            assert_appended_nothing(db, head, "the repeated requests")

            # The same key with another body is refused, and changes nothing.
            placed = next(o.raw for o in outcomes if o.verb == "place")
            body = json.loads(placed.body)
            body["generation"] += 1000
            other = Raw(**{**placed.__dict__, "body": json.dumps(body).encode()})
            mismatch = rec.resend(other)
            assert mismatch.status == 422, mismatch.content
            error = msgspec.json.decode(mismatch.content, type=ErrorEnvelope).error
            assert (error.code, error.field) == ("idempotency_mismatch", "Idempotency-Key")
            assert_appended_nothing(db, head, "the mismatched request")
        finally:
            rec.client.close()
        # Still the same state as replayed (the repeats did nothing).
        assert live_and_replayed(client, data_dir) == (live, offline)
    finally:
        client.close()
