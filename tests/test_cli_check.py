"""Scripts test state: ``status --check`` and ``health --check`` (as ``systemctl
is-active``), ``restart --wait``, and ``no_answer`` (exit 4) for a verb whose
answer a node crash cut off.

One real ``infervisor run`` with the fake llama-protocol server; the verbs run
in this process (``cli_here``): the command line's own process is not what is
tested here.
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable
from subprocess import CompletedProcess

import pytest
from support import cli_here, wait_until
from test_operator_cli import Started, start_node  # noqa: F401 - a fixture
from test_run_resume import DEADLINE_S, read_state

from infervisor.tools.api.exit_codes import Exit


def _code(result: CompletedProcess[str]) -> int:
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode


def test_check_restart_wait_and_no_answer(
    start_node: Callable[..., Started],  # noqa: F811 - the fixture imported above
) -> None:
    node = start_node()
    data, embed = node.data, node.ids["embed"]
    # Running and healthy: 0; placed but not running: 1; no INSTANCE: usage.
    for verb in ("status", "health"):
        assert _code(cli_here(verb, data, "chat", "--check")) == Exit.OK
        assert _code(cli_here(verb, data, "embed", "--check")) == Exit.REFUSED
    assert _code(cli_here("status", data, "--check")) == Exit.USAGE
    checked = cli_here("status", data, "embed", "--check", "--json")
    assert _code(checked) == Exit.REFUSED and json.loads(checked.stdout)["instance_id"] == embed

    before = json.loads(cli_here("status", data, "chat", "--json").stdout)
    restarted = cli_here("restart", data, "chat", "--wait", "--json")
    assert _code(restarted) == Exit.OK, restarted.stderr
    after = json.loads(restarted.stdout)
    assert after["lifecycle"] == "running" and after["pid"] != before["pid"]

    # A start the node takes, then a crash before it runs: no_answer, not "no node".
    (data / "instances" / embed).mkdir(parents=True, exist_ok=True)
    (data / "instances" / embed / "health").write_text("loading")
    answer: list[CompletedProcess[str]] = []
    waiting = threading.Thread(
        target=lambda: answer.append(cli_here("start", data, "embed", "--wait", "--json"))
    )
    waiting.start()
    db = data / "chain.db"

    def embed_starting() -> bool:
        state = read_state(db)
        return state is not None and str(state.instances[embed].lifecycle) == "starting"

    wait_until(embed_starting, DEADLINE_S, "embed starting")
    node.run.send(signal.SIGKILL)
    node.run.wait()
    waiting.join(DEADLINE_S)
    assert answer, "start --wait did not return"
    assert _code(answer[0]) == Exit.NO_ANSWER, answer[0].stdout + answer[0].stderr
    assert json.loads(answer[0].stdout)["error"]["code"] == "no_answer"
    # Cut off in the POST ("went away before answering") or in --wait's polling
    # ("took the start ... went away"): either way, look before asking again.
    assert "infervisor status" in answer[0].stderr
    # No node now: --check says 3 (the chain is not read for a check).
    assert _code(cli_here("status", data, "chat", "--check")) == Exit.NO_NODE
    assert _code(cli_here("health", data, "chat", "--check")) == Exit.NO_NODE


def test_a_node_gone_while_wait_polls_is_no_answer_not_no_node(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from infervisor.replay.views import InstanceView
    from infervisor.tools.api.errors import NotRunning
    from infervisor.tools.operator.progress import Progress
    from infervisor.tools.operator.verbs import wait_running

    class Gone:
        def status(self, instance: str) -> InstanceView:
            raise NotRunning("no node is running on data", "no_node", 0)

    taken = InstanceView(
        instance_id="n1-chat", adapter="infer.llamacpp", placed_by="operator", generation=1,
        role="chat", flavor="llamacpp", mode="managed", model="tiny", endpoint="",
        lifecycle="starting", desired="running", reason="", since_ns=0, pid=None, restarts=0,
        health="", health_reason="", status="", status_detail=None, reserved_bytes=0,
        rss_bytes=None, exposure="loopback", last_exit=None, last_seq=9,
    )  # fmt: skip
    with pytest.raises(SystemExit) as ended:
        wait_running(Gone(), taken, 60.0, Progress(), verb="restart")  # type: ignore[arg-type]
    assert ended.value.code == Exit.NO_ANSWER
    assert "took the restart of n1-chat (recorded at seq 9)" in capsys.readouterr().err


def test_a_start_answers_what_is_true_of_the_new_server(
    start_node: Callable[..., Started],  # noqa: F811 - the fixture imported above
) -> None:
    """``start --json`` answered ``"lifecycle": "starting"`` beside ``"status":
    "running", "health": "up"`` (a newcomer's trial, stop 33): the last probe's
    report of the process before the stop. A view shows only a report of the server
    it names (its pid); the new one only ever says it is loading here."""
    node = start_node()
    data, chat = node.data, node.ids["chat"]
    ran = json.loads(cli_here("status", data, "chat", "--json").stdout)
    assert (ran["lifecycle"], ran["health"], ran["status"]) == ("running", "up", "running")
    assert _code(cli_here("stop", data, "chat")) == Exit.OK
    (data / "instances" / chat / "health").write_text("loading")  # the next one loads
    started = cli_here("start", data, "chat", "--json")
    assert _code(started) == Exit.OK, started.stderr
    answer = json.loads(started.stdout)
    assert answer["lifecycle"] == "starting" and answer["pid"] != ran["pid"], answer
    assert answer["health"] != "up" and answer["status"] != "running", answer
    assert node.run.stop() == 0, node.run.output()
