"""Issue 19's headline: three nodes on loopback followed by one ``infervisor fleet``.

Three ``infervisor run`` nodes (TCP API with tokens, a checkpoint per event):
n1 runs the real llama.cpp server (``infervisor-llama-server`` on the
project's tiny GGUF), n2 and n3 the fake llama-server. One real ``infervisor
fleet serve`` process follows them. The fleet is killed with SIGKILL while
the nodes append, a node is killed with SIGKILL and restarted (it resumes
from its chain), the fleet is started again, another node restarts under the
running fleet: the fleet's store ends up holding exactly each node's chain
(same seqs, same hashes; its primary key refuses a repeat, the comparison a
gap), its metrics show every node up, nothing behind, the newest checkpoint
verified and no failure; ``fleet check`` passes; ``fleet status --json``
agrees with each node's own ``GET /v1/instances``.

The drain, ``PUT /v1/placements`` and two-controller parts of the headline
are in tests/test_fleet_place.py (nodes in process, driven by ``infervisor
fleet`` and the API) and tests/test_drain_node.py (a drain across a restart).
"""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import sys
from contextlib import ExitStack, closing
from pathlib import Path

import pytest
from fleet_nodes import (
    DEADLINE_S,
    FleetServe,
    Member,
    chain_rows,
    converged,
    fleet_of,
    fleet_rows,
    make_members,
    running,
    wait_converged,
)
from support import cli_here, wait_until

from infervisor.chain.checkpoint_store import read_stored
from infervisor.tools.api.client import ApiClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

COMPARED = ("instance_id", "lifecycle", "desired", "generation", "placed_by", "last_seq")


def bounce(member: Member) -> None:
    """Stop and start the node's chat instance (a few events)."""
    with ApiClient(url=member.url, token=member.token(), timeout_s=DEADLINE_S) as client:
        (view,) = client.list()
        client.stop(view.instance_id, grace_s=2.0)
        client.start(view.instance_id)


def _failures(store: Path) -> list[tuple[str, str, str]]:
    """The verification failures the fleet recorded: (node, what, detail)."""
    with closing(sqlite3.connect(store)) as db:
        return list(db.execute("SELECT node, what, detail FROM failures"))


def test_no_gap_no_repeat_across_kills(tmp_path: Path, fake_llama: str, tiny_gguf: Path) -> None:
    members = make_members(tmp_path, ["n1", "n2", "n3"])
    real = str(Path(sys.executable).parent / "infervisor-llama-server")
    with ExitStack() as stack:
        for m in running(stack, members):
            if m.name == "n1":
                m.write(real, model=tiny_gguf)
            else:
                m.write(fake_llama)
            m.start()
        fleet = fleet_of(tmp_path, members, check_interval_s=0.5)
        store = tmp_path / "fleet.db"
        serve = FleetServe(fleet)
        stack.callback(serve.kill)
        wait_converged(store, members)

        # kill -9 of the fleet while the nodes append
        bounce(members[1])
        serve.kill()
        bounce(members[2])
        # kill -9 of a node; it resumes from its chain
        members[1].runs[-1].send(signal.SIGKILL)
        members[1].runs[-1].wait()
        members[1].start()
        serve = FleetServe(fleet)
        stack.callback(serve.kill)
        wait_converged(store, members)
        # a node's restart seen live by the running fleet
        members[2].runs[-1].stop()
        members[2].start()
        bounce(members[2])
        wait_converged(store, members)
        checked = cli_here("fleet", "check", fleet)
        assert checked.returncode == 0, checked.stdout + checked.stderr

        # n1's real server may still append (turning ready) after the check above,
        # and after wait_converged saw every chain equal to its copy: a node's
        # chain read after the fleet's copy may be ahead of it (a run here had
        # seq 21 appended in between), never different in what both hold.
        wait_converged(store, members)
        for m in members:
            stored = fleet_rows(store, m.name)
            assert [s for s, _ in stored] == list(range(len(stored))), m.name
            assert chain_rows(m.db)[: len(stored)] == stored, m.name

        def metrics_settled() -> dict[str, float] | None:
            samples = serve.metrics()
            for m in members:
                label = f'{{node="{m.name}"}}'
                latest = read_stored(m.db)[-1].tree_size
                if (
                    samples.get(f"infervisor_fleet_node_up{label}") != 1.0
                    or samples.get(f"infervisor_fleet_node_events_behind{label}") != 0.0
                    or samples.get(f"infervisor_fleet_node_verified_size{label}") != latest
                    or not converged(store, members)
                ):
                    return None
            return samples

        samples = wait_until(metrics_settled, DEADLINE_S, "the metrics settle")
        for m in members:
            label = f'{{node="{m.name}"}}'
            failed = samples[f"infervisor_fleet_node_verification_failures_total{label}"]
            assert failed == 0.0, _failures(store)

        # fleet status --json agrees with each node's own GET /v1/instances
        def agree() -> bool:
            ran = cli_here("fleet", "status", fleet, "--json")
            assert ran.returncode == 0, ran.stderr
            shown = {n["node"]: n for n in json.loads(ran.stdout)["nodes"]}
            for m in members:
                with ApiClient(url=m.url, token=m.token(), timeout_s=DEADLINE_S) as client:
                    own = [{k: getattr(v, k) for k in COMPARED} for v in client.list()]
                theirs = [{k: v[k] for k in COMPARED} for v in shown[m.name]["instances"]]
                if own != theirs:
                    return False
            return True

        wait_until(agree, DEADLINE_S, "fleet status agrees with the nodes")
        table = cli_here("fleet", "status", fleet)
        assert table.returncode == 0
        for m in members:
            assert re.search(rf"^{m.name}\s+chat-\S+\s+running\s+tiny", table.stdout, re.M), (
                table.stdout
            )
        assert wait_until(lambda: _chat_running(members[0]), DEADLINE_S, "llama.cpp serves")


def _chat_running(member: Member) -> bool:
    """The real llama.cpp server of `member` answers its health check."""
    with ApiClient(url=member.url, token=member.token(), timeout_s=DEADLINE_S) as client:
        (view,) = client.list()
    return view.lifecycle == "running" and view.health == "up"
