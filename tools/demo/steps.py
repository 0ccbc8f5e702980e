"""``infervisor demo``: the steps of the main job end to end, offline, on a real llama.cpp server.

Steps: generate the tiny model, register it, open a node, place and start
one managed llama.cpp instance on a free loopback port (progress shown while
it loads), send one real completion, SIGKILL the server and watch the exit
recorded and the restart after the backoff, stop the instance and check its
process group is gone, verify the chain, print the instance's timeline.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec

from infervisor.actors.node import Node
from infervisor.actors.settings import NodeSettings
from infervisor.adapters.ports import free_port
from infervisor.adapters.probe import ServerClient
from infervisor.adapters.proc.pgroup import group_members
from infervisor.adapters.registry import ModelFormat
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.chain import verify_chain
from infervisor.replay import RestartPolicy, TimelineEntry, timeline
from infervisor.replay.views import InstanceView

from ..servers.extras import EXTRAS, missing_extra

__all__ = ["DemoReport", "StepResult", "run_demo"]

MODEL = "tiny-llama"
LOAD_TIMEOUT_S = 60.0


class StepResult(msgspec.Struct, kw_only=True):
    """One demo step: ``seconds`` is wall time spent in it."""

    name: str
    ok: bool
    seconds: float
    detail: str = ""


class DemoReport(msgspec.Struct, kw_only=True):
    """The demo's JSON report."""

    ok: bool
    dir: str
    instance_id: str = ""
    completion: str = ""
    steps: list[StepResult] = msgspec.field(default_factory=list)
    timeline: list[TimelineEntry] = msgspec.field(default_factory=list)


class StepFailed(Exception):
    """A demo step did not hold; the message says what was seen."""


class _Demo:
    def __init__(
        self,
        workdir: Path,
        flavor: Flavor,
        say: Callable[[str], None],
        progress: Callable[[str], None],
    ) -> None:
        self.dir = workdir
        self.flavor = flavor
        self.say = say
        self.progress = progress
        self.report = DemoReport(ok=False, dir=str(workdir))

    @contextmanager
    def step(self, name: str) -> Iterator[StepResult]:
        result = StepResult(name=name, ok=False, seconds=0.0)
        self.report.steps.append(result)
        t0 = time.monotonic()
        try:
            yield result
            result.ok = True
        finally:
            result.seconds = round(time.monotonic() - t0, 3)
            mark = "ok " if result.ok else "FAIL"
            detail = f": {result.detail}" if result.detail else ""
            self.say(f"[{mark}] {name} ({result.seconds:.2f} s){detail}")


def run_demo(
    workdir: Path,
    say: Callable[[str], None],
    progress: Callable[[str], None],
    flavor: Flavor = Flavor.LLAMACPP,
) -> DemoReport:
    """Run every step on ``flavor`` (llama.cpp or mlx-lm); the report's ``ok`` is
    True only if each held."""
    if flavor is Flavor.OLLAMA:
        raise ValueError("the demo runs llama.cpp or mlx-lm (Ollama cannot run offline here)")
    demo = _Demo(workdir, flavor, say, progress)
    try:
        _check_extra(demo)
        _run(demo)
        demo.report.ok = all(s.ok for s in demo.report.steps)
    except StepFailed as e:
        demo.say(f"demo failed: {e}")
    except Exception as e:  # noqa: BLE001 - the demo reports any failure as a failed step
        demo.say(f"demo failed: {type(e).__name__}: {e}")
        chain = workdir / "chain.db"
        if demo.report.instance_id and chain.exists():
            demo.report.timeline = timeline(chain, demo.report.instance_id)
    return demo.report


def _check_extra(demo: _Demo) -> None:
    """Refuse at once, naming the extra to install, when the flavor's is missing."""
    defaults = NodeSettings(node_id="demo", data_dir=str(demo.dir))
    llama = demo.flavor is Flavor.LLAMACPP
    program = defaults.llamacpp_program if llama else defaults.mlx_program
    with demo.step(f"check the {EXTRAS[demo.flavor][0]} extra is installed") as s:
        missing = missing_extra(demo.flavor, program)
        s.detail = missing or f"{program} found"
        _require(missing is None, missing or "")


def _run(demo: _Demo) -> None:
    settings = NodeSettings(
        node_id="demo",
        data_dir=str(demo.dir),
        health_interval_s=0.25,
        miss_limit=3,
        stop_grace_s=10.0,
        restart=RestartPolicy(base_s=2.0),
    )
    settings.registry_path.mkdir(parents=True, exist_ok=True)
    with demo.step(f"generate the tiny {demo.flavor.value} model") as s:
        model_file = _generate(demo.flavor, settings.registry_path)
        s.detail = f"{model_file} ({_size(model_file)} bytes)"
    node = Node.open(settings)
    try:
        _with_node(demo, node, model_file)
    finally:
        node.shutdown(reason="demo finished")
    with demo.step("verify the chain") as s:
        verdict = verify_chain(settings.chain_path)
        s.detail = f"{verdict.events} events, head {(verdict.head_hash or '')[:16]}"
        _require(verdict.ok, f"chain invalid: {verdict.problem}")
    demo.report.timeline = timeline(settings.chain_path, demo.report.instance_id)


def _generate(flavor: Flavor, registry: Path) -> Path:
    """The tiny model for the flavor, written into the registry folder."""
    if flavor is Flavor.MLX_LM:
        from ..servers.tinymlx import generate_tiny_mlx  # noqa: PLC0415 - needs the mlx extra

        return generate_tiny_mlx(registry / "tiny-mlx", seed=0)
    from ..servers.tinymodel import generate_tiny_gguf  # noqa: PLC0415 - needs the llamacpp extra

    return generate_tiny_gguf(registry / "tiny.gguf", seed=0)


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def _with_node(demo: _Demo, node: Node, model_file: Path) -> None:
    fmt = ModelFormat.MLX if demo.flavor is Flavor.MLX_LM else ModelFormat.GGUF
    with demo.step("register the model") as s:
        entry = node.registry.adopt(MODEL, model_file, format=fmt)
        s.detail = f"{entry.name}: blake3 {entry.blake3[:16]}"
    spec = InstanceSpec(role="chat", flavor=demo.flavor, model=MODEL, port=free_port())
    with demo.step(f"place and start a managed {demo.flavor.value} instance") as s:
        iid = node.place(spec)
        demo.report.instance_id = iid
        view = node.start(iid)
        s.detail = f"{iid} pid {view.pid} on {spec.base_url}"
    with demo.step("wait until it serves") as s:
        view = _wait_running(demo, node, iid)
        s.detail = f"running: {view.reason}"
    with demo.step("one real completion") as s:
        # mlx-lm must not be sent a model name: it would try to load that model instead.
        model = None if demo.flavor is Flavor.MLX_LM else MODEL
        demo.report.completion = _complete(spec.base_url, model)
        s.detail = repr(demo.report.completion)
    _kill_and_watch(demo, node, iid)
    with demo.step("stop the instance") as s:
        pgid = node.status(iid).pid or 0
        view = node.stop(iid)
        _require(view.lifecycle == "stopped", f"lifecycle is {view.lifecycle}")
        left = group_members(pgid)
        _require(not left, f"processes of the group left: {left}")
        s.detail = f"stopped; nothing of process group {pgid} left"


def _wait_running(demo: _Demo, node: Node, iid: str) -> InstanceView:
    t0 = time.monotonic()

    def running(v: InstanceView) -> bool:
        demo.progress(
            f"  {v.lifecycle:<10} health {v.health or 'not probed yet':<12} "
            f"{time.monotonic() - t0:5.1f} s"
        )
        return v.lifecycle == "running"

    view = node.wait_for(iid, running, LOAD_TIMEOUT_S, poll_s=0.1)
    demo.progress("")
    return view


def _complete(base_url: str, model: str | None) -> str:
    with ServerClient(base_url, timeout=60.0) as client:
        return client.complete(model, "Once upon a time", max_tokens=16)


def _kill_and_watch(demo: _Demo, node: Node, iid: str) -> None:
    with demo.step("SIGKILL the server; the exit is recorded") as s:
        before = node.status(iid)
        assert before.pid is not None
        os.kill(before.pid, signal.SIGKILL)
        view = node.wait_for(
            iid,
            lambda v: (
                v.lifecycle in ("exited", "restarting", "failed", "starting")
                and v.pid != before.pid
            ),
            30,
        )
        exit_ = view.last_exit
        _require(exit_ is not None and exit_.signal == 9, f"recorded exit: {exit_}")
        s.detail = f"pid {before.pid}: {exit_.reason if exit_ else ''}; now {view.lifecycle}"
    with demo.step("restarted after the backoff") as s:
        t0 = time.monotonic()
        view = _wait_running(demo, node, iid)
        _require(view.pid not in (None, before.pid), f"pid {view.pid}")
        waited = time.monotonic() - t0
        s.detail = f"new pid {view.pid}, restart {view.restarts}, serving after {waited:.1f} s"


def _require(cond: bool, why: str) -> None:
    if not cond:
        raise StepFailed(why)


def data_dir_default() -> Path:
    """A fresh temporary folder for a demo run."""
    import tempfile  # noqa: PLC0415

    return Path(tempfile.mkdtemp(prefix="infervisor-demo-"))
