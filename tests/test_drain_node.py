"""Cordon, drain and a controller's whole set on a real node (issue 19, point 1).

A node runs in process with fake llama.cpp servers (real processes, a real
chain file) behind its control API on the Unix socket; the test is the
controller and the operator, through :class:`ApiClient`:

- cordon refuses a new placement (409 ``cordoned``, nothing recorded); drain
  stops the controller's instances and not the operator's; a node restart
  keeps them stopped and the node drained; uncordon lets placements in; a
  node whose drain was recorded but whose stops never ran (killed between
  the two) holds and stops them at boot;
- ``PUT /v1/placements`` converges a node with extra, missing and older
  instances in one transaction for its record and new placements, and the
  same set again appends nothing (the chain's rows counted).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import NodeFactory
from support import chain_rows, cli_here

from infervisor.actors.append import WriterAppend
from infervisor.actors.node import Node
from infervisor.actors.settings import NodeSettings
from infervisor.adapters.ports import free_port
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.chain import EventDraft, SqliteChain, StoredEvent, verify_chain
from infervisor.replay import events as ev
from infervisor.tools.api.client import ApiClient
from infervisor.tools.api.errors import VerbFailed
from infervisor.tools.api.serving.server import ApiServer

CTL = "ctl1"
DEADLINE_S = 60.0


def spec(role: str) -> InstanceSpec:
    return InstanceSpec(role=role, flavor=Flavor.LLAMACPP, model="tiny", port=free_port())


@contextmanager
def served(
    nodes: NodeFactory, settings: NodeSettings, models: Path
) -> Iterator[tuple[Node, ApiClient]]:
    """The node open and served on its socket; shut down cleanly at the end."""
    data = Path(settings.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    server = ApiServer.listen(data, settings.chain_path, settings.node_id)
    try:
        node = nodes.open(settings)
        node.registry.adopt("tiny", models / "tiny.gguf", replace=True)
        server.serve(node)
        with ApiClient(data_dir=data, timeout_s=DEADLINE_S) as client:
            yield node, client
        server.stopping()
        node.shutdown()
    finally:
        server.close()


def refused(code: str, call: Callable[[], object]) -> VerbFailed:
    with pytest.raises(VerbFailed) as caught:
        call()
    assert caught.value.code == code, caught.value
    return caught.value


def lifecycle(node: Node, iid: str, want: str) -> None:
    node.wait_for(iid, lambda v: v.lifecycle == want, DEADLINE_S)


def kinds_after(db: Path, seq: int, subject: str) -> list[str]:
    return [k for q, _, k, s, _ in chain_rows(db) if q > seq and s == subject]


def test_cordon_drain_restart_uncordon(
    nodes: NodeFactory, fake_llama: str, fake_model: Path
) -> None:
    settings = nodes.settings(fake_llama, fake_model)
    db = settings.chain_path
    with served(nodes, settings, fake_model) as (node, client):
        own = client.place(spec("own"), start=True).instance_id  # the operator's
        c1 = client.place(spec("c1"), controller=CTL, generation=1, start=True).instance_id
        c2 = client.place(spec("c2"), controller=CTL, generation=1, start=True).instance_id
        for iid in (own, c1, c2):
            lifecycle(node, iid, "running")

        assert client.cordon("cordon", "kernel update").cordon == "cordoned"
        rows = len(chain_rows(db))
        error = refused("cordoned", lambda: client.place(spec("c3"), controller=CTL, generation=1))
        assert error.status == 409 and "uncordon" in str(error)
        assert len(chain_rows(db)) == rows  # a refused placement records nothing
        assert client.node().cordon == "cordoned"

        drained = client.cordon("drain")
        assert (drained.cordon, sorted(drained.stopped)) == ("drained", sorted([c1, c2]))
        for iid in (c1, c2):
            view = client.status(iid)
            assert (view.lifecycle, view.desired) == ("stopped", "stopped")
        assert client.status(own).lifecycle == "running"
        refused("cordoned", lambda: client.start(c1, controller=CTL))
        kinds = [k for _, _, k, _, _ in chain_rows(db)]
        assert kinds.index("node.drained") < kinds.index("instance.stop_requested")

    data = settings.data_dir
    gone = cli_here("drain", data, "--json")  # no node runs on it
    assert gone.returncode == 3 and '"no_node"' in gone.stdout, gone
    with served(nodes, settings, fake_model) as (node, client):  # the node restarted
        assert client.node().cordon == "drained"
        lifecycle(node, own, "running")
        for iid in (c1, c2):
            assert (client.status(iid).lifecycle, client.status(iid).desired) == (
                "stopped",
                "stopped",
            )
        status = cli_here("status", data)
        assert status.returncode == 0 and "node: drained" in status.stdout, status
        uncordoned = cli_here("uncordon", data, "--json", "--reason", "done")
        assert uncordoned.returncode == 0, uncordoned
        assert json.loads(uncordoned.stdout)["cordon"] == "none"
        assert chain_rows(db)[-1][2:] == (
            "node.uncordoned",
            "",
            {"event": "node.uncordoned", "reason": "done", "v": 1},
        )
        uncordons = [r for r in chain_rows(db) if r[2] == "node.uncordoned"]
        again = cli_here("uncordon", data)  # already so: 0, and says nothing was recorded
        assert again.returncode == 0, again
        assert again.stdout == "not cordoned: the node takes placements; nothing recorded\n"
        assert [r for r in chain_rows(db) if r[2] == "node.uncordoned"] == uncordons
        c3 = client.place(spec("c3"), controller=CTL, generation=1, start=True).instance_id
        client.start(c1, controller=CTL)
        lifecycle(node, c1, "running")
        lifecycle(node, c3, "running")
        # Killed between the drain's record and its stops: the chain has node.drained
        # and c1, c3 wanted running (a clean stop keeps them so, as a kill would).
        WriterAppend(node._writer, node.clock).append([ev.NodeDrained()], source="operator")
    booted_at = len(chain_rows(db)) - 1  # after the shutdown's stops

    with served(nodes, settings, fake_model) as (node, client):
        assert client.node().cordon == "drained"
        for iid in (c1, c3):
            # held: never started again, and the drain's stop recorded
            assert kinds_after(db, booted_at, iid) == ["instance.stop_requested"]
            assert client.status(iid).desired == "stopped"
        lifecycle(node, own, "running")
    assert verify_chain(db).ok


def test_a_placement_set_converges_and_repeats_nothing(
    nodes: NodeFactory, fake_llama: str, fake_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = nodes.settings(fake_llama, fake_model)
    db = settings.chain_path
    transactions: list[list[str]] = []
    original = SqliteChain.append_many

    def counting(chain: SqliteChain, drafts: Sequence[EventDraft]) -> list[StoredEvent]:
        transactions.append([d.kind for d in drafts])
        return original(chain, drafts)

    monkeypatch.setattr(SqliteChain, "append_many", counting)
    with served(nodes, settings, fake_model) as (node, client):
        own = client.place(spec("own")).instance_id
        extra = client.place(spec("extra"), controller=CTL, generation=1, start=True).instance_id
        older_spec, new_spec = spec("older"), spec("new")
        older = client.place(older_spec, controller=CTL, generation=1).instance_id
        lifecycle(node, extra, "running")

        the_set = [(older_spec, True), (new_spec, True)]
        done = client.put_placements(CTL, 2, the_set)
        new = next(iid for iid in done.placed)
        assert (done.placed, done.replaced, done.unloaded) == ([new], [older], [extra])
        assert sorted(done.started) == sorted([older, new])
        assert sorted(v.instance_id for v in client.list()) == sorted([own, older, new])
        assert {client.status(i).generation for i in (older, new)} == {2}
        assert ["node.placement_set", "instance.placed"] in transactions  # one transaction
        for iid in (older, new):
            lifecycle(node, iid, "running")

        rows = len(chain_rows(db))
        again = client.put_placements(CTL, 2, the_set)
        assert sorted(again.unchanged) == sorted([older, new])
        assert again.placed == again.replaced == again.unloaded == again.started == []
        assert len(chain_rows(db)) == rows  # the same set appends nothing

        error = refused("stale_generation", lambda: client.put_placements(CTL, 1, the_set))
        assert (error.status, error.field) == (409, "generation")
        bad = InstanceSpec(role="bad", flavor=Flavor.LLAMACPP, model="nope", port=free_port())
        error = refused("bad_spec", lambda: client.put_placements(CTL, 3, [*the_set, (bad, True)]))
        assert error.status == 400 and error.field == "placements[2].spec.model", error
        client.cordon("cordon")
        error = refused("cordoned", lambda: client.put_placements(CTL, 3, [(spec("more"), True)]))
        assert error.field == "placements[0]"
        assert len(chain_rows(db)) == rows + 1  # only node.cordoned: the refusals left it so
        assert client.status(older).lifecycle == "running"


def test_the_cli_names_its_own_commands_and_the_cordons_reason(
    nodes: NodeFactory, fake_llama: str, fake_model: Path, tmp_path: Path
) -> None:
    """Stop 32's trial, through the real CLI: a placement refused on a cordoned node
    told the operator the API's route (it names `infervisor uncordon`; the API's own
    answer keeps the route); an over-long --reason was called `reason`; `status --node`
    left out the cordon's reason (shown from the node, and replayed from its chain)."""
    settings = nodes.settings(fake_llama, fake_model)
    data = settings.data_dir
    fragment = tmp_path / "c3.toml"
    fragment.write_text(f'role = "c3"\nflavor = "llamacpp"\nmodel = "tiny"\nport = {free_port()}\n')
    with served(nodes, settings, fake_model) as (_, client):
        long = cli_here("cordon", data, "--reason", "x" * 501, "--json")
        assert long.returncode == 2, long
        error = json.loads(long.stdout)["error"]
        assert error["field"] == "--reason" and "--reason" in error["message"], error
        assert "x" * 20 not in long.stderr  # the value is not echoed back whole

        assert cli_here("cordon", data, "--reason", "kernel update").returncode == 0
        place = cli_here("place", data, "--file", fragment)
        assert place.returncode == 1, place
        assert "`infervisor uncordon`" in place.stderr and "/v1/" not in place.stderr, place
        api = refused("cordoned", lambda: client.place(spec("c4")))
        assert "POST /v1/node/uncordon" in str(api)  # the API's answer names its route

        shown = cli_here("status", data, "--node")
        assert shown.returncode == 0, shown
        said = shown.stdout.splitlines()[1]
        assert said.startswith("cordoned since 20") and said.endswith(", because: kernel update")
        doc = json.loads(cli_here("status", data, "--node", "--json").stdout)
        assert (doc["cordon"], doc["cordon_reason"]) == ("cordoned", "kernel update")
        assert client.node().cordon_reason == "kernel update"

    replayed = json.loads(cli_here("status", data, "--node", "--json").stdout)  # no node runs
    assert (replayed["source"], replayed["cordon_reason"]) == ("chain", "kernel update")
    with served(nodes, settings, fake_model) as (_, client):
        assert cli_here("uncordon", data).returncode == 0
        assert client.node().cordon_reason is None
        assert "because" not in cli_here("status", data, "--node").stdout


def test_a_reason_with_a_control_character_is_refused_and_nothing_recorded(
    nodes: NodeFactory, fake_llama: str, fake_model: Path
) -> None:
    """A newline in a cordon's reason was stored and printed raw: it split the rows of
    `events` and the lines of `status --node`. The CLI refuses it (exit 2 naming
    --reason), the API too (400 naming `reason`); the chain is left as it was."""
    settings = nodes.settings(fake_llama, fake_model)
    data, db = settings.data_dir, Path(settings.chain_path)
    with served(nodes, settings, fake_model) as (_, client):
        rows = len(chain_rows(db))
        for verb in ("cordon", "drain", "uncordon"):
            for reason in ("first\nsecond", "tab\there", "bell\x07", "c1\x85"):
                done = cli_here(verb, data, "--reason", reason, "--json")
                assert done.returncode == 2, done
                error = json.loads(done.stdout)["error"]
                assert (error["code"], error["field"]) == ("bad_value", "--reason"), error
                assert "control character" in error["message"], error
                api = refused("bad_request", lambda v=verb, r=reason: client.cordon(v, r))
                assert api.field == "reason", api
        assert len(chain_rows(db)) == rows
        assert client.node().cordon == "none"
        assert cli_here("cordon", data, "--reason", "kernel update, é 日本").returncode == 0
        assert client.node().cordon_reason == "kernel update, é 日本"


def test_a_new_reason_is_recorded_and_a_drain_keeps_its_own(
    nodes: NodeFactory, fake_llama: str, fake_model: Path
) -> None:
    """Stop 32's trial: `cordon --reason second` on a cordoned node answered 0 with the
    previous event's seq and kept `first`, silently. It records a new node.cordoned
    now (the replayed reason agrees); a cordon of a drained node records nothing and
    says so, naming the drain's reason; a drain of a drained node records its reason."""
    settings = nodes.settings(fake_llama, fake_model)
    data, db = settings.data_dir, Path(settings.chain_path)
    with served(nodes, settings, fake_model) as (_, client):
        first = json.loads(cli_here("cordon", data, "--reason", "first", "--json").stdout)
        second = cli_here("cordon", data, "--reason", "second", "--json")
        assert second.returncode == 0, second
        answer = json.loads(second.stdout)
        assert (answer["cordon"], answer["recorded"]) == ("cordoned", True)
        assert answer["seq"] == first["seq"] + 1
        assert chain_rows(db)[-1][2:5:2] == (
            "node.cordoned",
            {"event": "node.cordoned", "reason": "second", "v": 1},
        )
        assert ", because: second\n" in cli_here("status", data, "--node").stdout
        same = json.loads(cli_here("cordon", data, "--json").stdout)  # no reason: nothing
        assert (same["recorded"], same["seq"]) == (False, answer["seq"])

        drained = json.loads(cli_here("drain", data, "--reason", "rack move", "--json").stdout)
        kept = cli_here("cordon", data, "--reason", "x")
        assert kept.returncode == 0, kept
        assert re.search(r"already drained since \S+Z, because: rack move; nothing", kept.stdout)
        assert client.node().cordon_reason == "rack move"
        again = json.loads(cli_here("drain", data, "--reason", "rack 9", "--json").stdout)
        assert (again["recorded"], again["seq"]) == (True, drained["seq"] + 1)
        assert client.node().cordon_reason == "rack 9"
    replayed = json.loads(cli_here("status", data, "--node", "--json").stdout)  # no node runs
    assert (replayed["cordon"], replayed["cordon_reason"]) == ("drained", "rack 9")


@pytest.mark.parametrize(
    "reason",
    ["a\udcffb", "", "   ", "L1\u2028L2", "a\u202eb"],
    ids=["undecodable-byte", "empty", "blank", "line-separator", "bidi-override"],
)
def test_a_reason_that_is_empty_undecodable_or_splits_its_line_is_a_usage_error(
    reason: str, tmp_path: Path
) -> None:
    """A byte argv could not decode ended in a traceback (UnicodeEncodeError) and an
    empty reason replaced the one in force: each is refused before any node is asked."""
    for verb in ("cordon", "drain", "uncordon"):
        done = cli_here(verb, tmp_path, "--reason", reason, "--json")
        assert done.returncode == 2, done
        assert "Traceback" not in done.stderr, done.stderr
        error = json.loads(done.stdout)["error"]
        assert (error["code"], error["field"]) == ("bad_value", "--reason"), error
