"""What an operator reads of residency (issue 21), from a newcomer's trial: the
codes a start that does not fit is answered with, the status table's memory and
WANTED columns for a resting instance, and the floor of ``idle_ttl_s`` at the
place verb. Pure: no node runs (the verbs' own paths are in test_residency_node.py).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from support import cli_here

from infervisor.actors.errors import NotResident
from infervisor.actors.ledger import BudgetExceeded
from infervisor.replay.lifecycle import LifecycleState
from infervisor.replay.state import Desired, InstanceState
from infervisor.tools.api.answers import answer_for
from infervisor.tools.api.exit_codes import Exit, exit_for
from infervisor.tools.clikit.schemas import InstanceRecord, from_state
from infervisor.tools.operator import status

MIB = 2**20


def record(**fields: Any) -> InstanceRecord:
    base: dict[str, Any] = dict(
        source="node", instance_id="i1", role="chat", adapter="llamacpp", flavor="llamacpp",
        mode="managed", model="m1", endpoint="http://127.0.0.1:1", placed_by="n1",
        generation=0, lifecycle="running", desired="running", reason=None, since_ns=0,
        pid=None, restarts=0, max_restarts=None, health=None, health_reason=None,
        status=None, status_detail=None, reserved_bytes=None, rss_bytes=None,
        exposure="loopback", last_exit=None, last_seq=0,
    )  # fmt: skip
    converted: InstanceRecord = msgspec.convert({**base, **fields}, InstanceRecord)
    return converted


def test_a_start_that_does_not_fit_has_one_code_whether_the_instance_rests_or_was_stopped() -> None:
    # a stopped instance's start (the ledger's refusal) and a resting one's (the demand's)
    stopped = answer_for(BudgetExceeded("memory budget 10 bytes, 8 in use, 4 needed"))
    resting = answer_for(NotResident("no room for i1", code="no_room", retry_after_s=5.0))
    assert [(s, b.code) for s, b in (stopped, resting)] == [(422, "no_room"), (422, "no_room")]
    assert exit_for("no_room") == Exit.REFUSED
    assert "8 in use" in stopped[1].message  # the numbers stay in the message


def test_status_shows_half_a_mib_and_a_resting_instance_wanted_on_demand() -> None:
    half = status.row(record(reserved_bytes=MIB // 2, rss_bytes=3 * MIB + MIB // 2), 0)
    assert half[-1] == "0.5/3.5"
    assert status.row(record(reserved_bytes=512 * MIB, rss_bytes=0), 0)[-1] == "512/0"
    resting = record(lifecycle="resting", desired="stopped", resting=True, on_demand=True)
    assert status.row(resting, 0)[3:5] == ("resting", "on-demand")
    stopped = record(lifecycle="stopped", desired="stopped")
    assert status.row(stopped, 0)[3:5] == ("stopped", "stopped")  # an operator's stop stays


def test_place_refuses_an_idle_ttl_below_one_second_naming_the_flag_and_range() -> None:
    for value in ("1e-9", "0.5", "0"):
        result = cli_here(
            "place", "--url", "http://127.0.0.1:9", "--role", "x", "--flavor", "llamacpp",
            "--port", "9", "--model", "m", "--idle-ttl-s", value, "--json",
        )  # fmt: skip
        assert result.returncode == 2, (value, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
        error = json.loads(result.stdout)["error"]
        assert error["field"] == "--idle-ttl-s", error
        assert "1" in error["message"] and "604800" in error["message"], error


def test_a_chain_record_whose_spec_cannot_be_read_says_its_residency_is_unknown() -> None:
    # from the chain, what it cannot know is null (as role and model are), not "not
    # pinned, priority 0": a claim the recorded spec does not support

    state = InstanceState(
        instance_id="i1", spec={"role": "chat", "unknown_key": 1}, placed_by="n1",
        generation=0, lifecycle=LifecycleState.STOPPED, desired=Desired.STOPPED,
        since_ns=0, last_seq=3, last_use_ns=5,
    )  # fmt: skip
    r = from_state(state)
    assert (r.role, r.model) == ("chat", None)
    assert (r.on_demand, r.idle_ttl_s, r.priority, r.pinned, r.busy) == (None,) * 5
    assert status.residency_lines([r], 10) == []  # no policy known, not resting: no line
