"""The probes seam (adapters/prober.py) and its scripted fake (adapters/prober_fake.py).

One contract, run against both: the real HttpProber against real servers
(tests/programs/http_fault.py in the mode that answers as scripted, a port
nobody listens on for DOWN) and the ScriptedProber. Then node-level tests
that need only probe behaviour, driven through the fake: no server runs.
"""

from __future__ import annotations

import queue
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import NodeFactory
from support import PROGRAMS, ollama_server, wait_until

from infervisor.actors.kinds import KindSettings
from infervisor.actors.node import Node
from infervisor.adapters import ollama
from infervisor.adapters.errors import AdmissionRefused, ProbeError
from infervisor.adapters.ollama_wire import RunningModel
from infervisor.adapters.ports import free_port
from infervisor.adapters.probe import Health, HealthKind, ProbeTarget, ServerReport
from infervisor.adapters.prober import HttpProber, Prober
from infervisor.adapters.prober_fake import Answer, ScriptedProber
from infervisor.adapters.spec import Flavor, InstanceSpec, Mode
from infervisor.replay import timeline

#: Seconds each request may take: a hung server's probe ends after this.
TIMEOUT_S = 0.5
#: Seconds a test waits for a report (real servers on a loaded machine).
WAIT_S = 20.0

MODES = {Answer.UP: "ok", Answer.LOADING: "loading-nested", Answer.GARBAGE: "garbage"}
MODES |= {Answer.HANG: "hang"}
KINDS = {
    Answer.UP: HealthKind.UP,
    Answer.LOADING: HealthKind.LOADING,
    Answer.GARBAGE: HealthKind.UNHEALTHY,
    Answer.DOWN: HealthKind.UNREACHABLE,
    Answer.HANG: HealthKind.UNREACHABLE,
}


class Under:
    """A prober under test and a way to have a server answer as asked."""

    def __init__(self, prober: Prober, serve: Callable[[Answer], str], hung: Callable[[], Any]):
        self.prober, self.serve, self.end_hung = prober, serve, hung


@pytest.fixture(params=["http", "scripted"])
def under(request: pytest.FixtureRequest) -> Iterator[Under]:
    if request.param == "scripted":
        fake = ScriptedProber(models=("tiny",))

        def script(answer: Answer) -> str:
            url = f"http://127.0.0.1:{free_port()}"
            fake.script(url, answer)
            return url

        yield Under(fake, script, fake.release)
        fake.close()
        return
    procs: list[subprocess.Popen[str]] = []

    def start(answer: Answer) -> str:
        if answer is Answer.DOWN:
            return f"http://127.0.0.1:{free_port()}"
        argv = [sys.executable, str(PROGRAMS / "http_fault.py"), "--mode", MODES[answer]]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout is not None
        line = p.stdout.readline()  # "PORT <n>", or "" if it died
        assert line.startswith("PORT "), f"fault server did not start: {line!r}"
        return f"http://127.0.0.1:{int(line.split()[1])}"

    real = HttpProber()
    yield Under(real, start, lambda: None)  # a hung probe ends at its own timeout
    real.close()
    for p in procs:
        p.kill()
        p.wait()
        assert p.stdout is not None
        p.stdout.close()


def probed(under: Under, answer: Answer) -> ServerReport:
    """One probe through the callback interface, as the health tick makes it."""
    target = ProbeTarget(under.serve(answer), Flavor.LLAMACPP, TIMEOUT_S)
    reports: queue.Queue[ServerReport] = queue.Queue()
    under.prober.probe("i", target, reports.put)
    if answer is Answer.HANG:
        under.end_hung()
    return reports.get(timeout=WAIT_S)


@pytest.mark.parametrize("answer", list(Answer))
def test_a_probe_reports_what_the_server_answered(under: Under, answer: Answer) -> None:
    report = probed(under, answer)
    assert report.health.kind is KINDS[answer], report
    assert report.flavor is Flavor.LLAMACPP
    if answer is Answer.UP:
        assert report.lists("tiny")
    if answer is Answer.HANG:
        assert f"no answer within {TIMEOUT_S} s" in report.health.reason
    if answer is Answer.DOWN:
        assert "cannot connect" in report.health.reason
    if answer is Answer.GARBAGE:
        assert "not JSON" in report.health.reason


@pytest.mark.parametrize("answer", [Answer.UP, Answer.LOADING, Answer.DOWN])
def test_check_answers_at_once_as_a_probe_does(under: Under, answer: Answer) -> None:
    report = under.prober.check(ProbeTarget(under.serve(answer), Flavor.LLAMACPP, TIMEOUT_S))
    assert report.health.kind is KINDS[answer], report


def test_deep_health_gives_one_token_of_an_up_server(under: Under) -> None:
    target = ProbeTarget(under.serve(Answer.UP), Flavor.LLAMACPP, 5.0)
    chosen: list[ServerReport] = []

    def model(report: ServerReport) -> str | None:
        chosen.append(report)
        return "tiny"

    token = under.prober.deep_health(target, model)
    assert isinstance(token, str) and token
    assert [r.health.kind for r in chosen] == [HealthKind.UP]


@pytest.mark.parametrize("answer", [Answer.DOWN, Answer.LOADING])
def test_deep_health_of_a_server_not_up_raises(under: Under, answer: Answer) -> None:
    target = ProbeTarget(under.serve(answer), Flavor.LLAMACPP, 5.0)
    with pytest.raises(ProbeError, match="deep health"):
        under.prober.deep_health(target, lambda _: None)


# ---------------------------------------------------------------- the fake alone


def test_a_script_is_taken_in_order_and_its_last_answer_repeats() -> None:
    fake = ScriptedProber()
    target = ProbeTarget("http://127.0.0.1:1", Flavor.LLAMACPP, 1.0)
    fake.script(target.base_url, Answer.LOADING, Answer.UP)
    kinds = [fake.check(target).health.kind for _ in range(3)]
    assert kinds == [HealthKind.LOADING, HealthKind.UP, HealthKind.UP]
    assert fake.check(ProbeTarget("http://127.0.0.1:2", Flavor.LLAMACPP, 1.0)).health.kind is (
        HealthKind.UNREACHABLE
    )  # unscripted: down


def test_a_hung_probe_holds_its_key_until_released() -> None:
    fake = ScriptedProber()
    target = ProbeTarget("http://127.0.0.1:1", Flavor.LLAMACPP, 1.0)
    fake.script(target.base_url, Answer.HANG, Answer.UP)
    reports: list[ServerReport] = []
    fake.probe("k", target, reports.append)
    assert reports == []
    fake.probe("k", target, reports.append)  # one probe per key at a time
    assert [r.health.reason for r in reports] == ["a probe is still running"]
    assert fake.release() == 1
    assert reports[-1].health.kind is HealthKind.UNREACHABLE
    fake.probe("k", target, reports.append)
    assert reports[-1].health.kind is HealthKind.UP


# ---------------------------------------------------------------- a node, through the fake

#: Deep checks every 0.1 s; two failures make the instance unhealthy.
DEEP = KindSettings(deep_interval_s=0.1, startup_deadline_s=20.0, startup_cap_s=20.0, miss_limit=2)


class Adopted:
    """A node probing through a ScriptedProber, with one adopted llama.cpp
    instance (of ``kind``) placed whose server answers ``first`` until scripted
    otherwise."""

    def __init__(
        self, nodes: NodeFactory, program: str, registry: Path, first: Answer, kind: str = ""
    ) -> None:
        self.fake = ScriptedProber(models=("tiny",))
        settings = nodes.settings(program, registry, kinds={"deep": DEEP})
        self.node = Node.open(settings, prober=self.fake)
        nodes.nodes.append(self.node)  # shut down in teardown
        self.node.registry.adopt("tiny", registry / "tiny.gguf")
        self.spec = InstanceSpec(
            port=free_port(), role="ext", flavor=Flavor.LLAMACPP, model="tiny", mode=Mode.ADOPTED,
            **({"kind": kind} if kind else {}),
        )  # fmt: skip
        self.fake.script(self.spec.base_url, first)
        self.iid = self.node.place(self.spec)


def test_an_adopted_server_loading_is_starting_until_it_answers_up(
    nodes: NodeFactory, fake_llama: str, fake_model: Path
) -> None:
    """tests/test_adopted_loading.py's scenario, with the answers scripted."""
    a = Adopted(nodes, fake_llama, fake_model, Answer.LOADING)
    node, fake, iid = a.node, a.fake, a.iid
    assert node.start(iid).lifecycle == "starting"  # it answered, but it is loading
    wanted = 3 * node.settings.miss_limit + 1  # many more loading answers than the miss limit
    wait_until(lambda: len(fake.probes) >= wanted, WAIT_S, f"{wanted} probes")
    view = node.status(iid)
    assert (view.lifecycle, view.health) == ("starting", "loading"), view

    fake.script(a.spec.base_url, Answer.UP)
    view = node.wait_for(iid, lambda v: v.lifecycle == "running", WAIT_S)
    assert "adopted server answers" in view.reason
    kinds = [e.kind for e in timeline(node.settings.chain_path, iid)]
    assert kinds == ["instance.placed", "instance.starting", "instance.ready"], kinds


def test_deep_health_asks_the_spec_model_through_the_prober(
    nodes: NodeFactory, fake_llama: str, fake_model: Path
) -> None:
    a = Adopted(nodes, fake_llama, fake_model, Answer.UP)
    a.fake.script_deep(a.spec.base_url, " hi", ProbeError("completion refused: HTTP 500"))
    a.node.start(a.iid)
    a.node.wait_for(a.iid, lambda v: v.lifecycle == "running", WAIT_S)
    assert a.node.deep_health(a.iid) == " hi"
    with pytest.raises(Exception, match="completion refused"):
        a.node.deep_health(a.iid)
    assert [model for _, model in a.fake.deep_asked] == ["tiny", "tiny"]


def test_an_adopted_server_that_does_not_answer_is_not_placed(
    nodes: NodeFactory, fake_llama: str, fake_model: Path
) -> None:
    with pytest.raises(AdmissionRefused, match="no llamacpp server answering"):
        Adopted(nodes, fake_llama, fake_model, Answer.DOWN)


def test_an_adopted_server_that_gives_no_token_is_unhealthy_after_miss_limit_checks(
    nodes: NodeFactory, fake_llama: str, fake_model: Path
) -> None:
    """tests/test_deep_health.py's scenario: /health answers, no completion does."""
    a = Adopted(nodes, fake_llama, fake_model, Answer.UP, kind="deep")
    a.fake.script_deep(a.spec.base_url, ProbeError("completion refused: HTTP 500: injected"))
    a.node.start(a.iid)
    view = a.node.wait_for(a.iid, lambda v: v.lifecycle == "unhealthy", WAIT_S)
    assert "injected" in view.reason
    kinds = [e.kind for e in timeline(a.node.settings.chain_path, a.iid)]
    assert kinds.count("instance.deep_health_failed") == DEEP.miss_limit, kinds


# ---------------------------------------------------------------- Ollama's /api/ps listing


def test_the_real_prober_reports_what_ollama_holds_in_memory() -> None:
    """An Ollama probe comes with /api/ps' listing (ServerReport.running)."""
    prober = HttpProber()
    try:
        with ollama_server("tinyllama", load_seconds=0.1) as srv:
            target = ProbeTarget(srv.url, Flavor.OLLAMA, 5.0)
            report = prober.check(target)
            assert report.health.kind is HealthKind.UP
            assert report.lists("tinyllama")
            assert report.running == []  # a list: nothing loaded, not "could not ask"
            ollama.load(srv.url, "tinyllama", timeout=20.0)
            reports: queue.Queue[ServerReport] = queue.Queue()
            prober.probe("o", target, reports.put)
            entry = reports.get(timeout=WAIT_S).running_model("tinyllama")
            assert entry is not None and entry.size_bytes > 0
    finally:
        prober.close()


def test_the_fake_reports_a_scripted_ollama_listing() -> None:
    fake = ScriptedProber()
    target = ProbeTarget("http://127.0.0.1:11434", Flavor.OLLAMA, 1.0)
    listing = ServerReport(
        Health(HealthKind.UP), ["tinyllama"], flavor=Flavor.OLLAMA,
        running=[RunningModel("tinyllama:latest", size_bytes=10)],
    )  # fmt: skip
    fake.script(target.base_url, listing, Answer.DOWN)
    assert fake.check(target).running_model("tinyllama") == RunningModel("tinyllama:latest", 10)
    assert fake.check(target).running is None
