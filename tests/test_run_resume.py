"""``infervisor run CONFIG`` as a real process: resume from the chain, signals, refusals.

The node runs the console script installed beside this Python. The fast
tests launch the fake llama-protocol server; the ``slow`` one runs
examples/node.toml (moved to a temporary data_dir and port) with the real
launcher and the generated tiny GGUF. Synchronisation is by condition and
deadline on the chain, read with ``replay.rebuild`` while the node writes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest
from support import PROGRAMS, cli_here, make_launcher, pids_of_group, wait_until

from infervisor.actors.kinds import KindSettings
from infervisor.actors.settings import NodeSettings
from infervisor.adapters.ports import free_port
from infervisor.chain import ChainError, SqliteChain
from infervisor.replay import NodeState, RestartPolicy, rebuild
from infervisor.tools.node.config import (
    ApiConfig,
    FrontConfig,
    InstanceEntry,
    ModelEntryConfig,
    WitnessEntry,
    load_config,
)
from infervisor.tools.node.lock import LOCK_FILE

INFERVISOR = Path(sys.executable).parent / "infervisor"
EXAMPLE = Path(__file__).parents[1] / "examples" / "node.toml"
DEADLINE_S = 60.0  # a bound on a hang, never a measurement: generous at load 10
EXIT_DEADLINE_S = 60.0
#: A valid GGUF header (version 3, no tensors, no metadata): the fake server never reads
#: the weights; the registry checks the header parses.
MODEL_BYTES = b"GGUF" + struct.pack("<IQQ", 3, 0, 0) + bytes(40)


# ---------------------------------------------------------------- helpers
def toml_str(value: object) -> str:
    return json.dumps(str(value))  # a JSON string is a TOML basic string


def write_config(
    tmp_path: Path,
    program: str,
    *,
    ports: tuple[int, int] | None = None,
    node_extra: str = "",
    instance_extra: str = "",
    top_extra: str = "",
    name: str = "node.toml",
) -> Path:
    """Node n1 on tmp_path/data with model "tiny"; chat (start = true), embed (start = false)."""
    chat_port, embed_port = ports or distinct_ports()
    path = tmp_path / name
    path.write_text(
        f"""{top_extra}
[node]
node_id = "n1"
data_dir = "data"
llamacpp_program = {toml_str(program)}
health_interval_s = 0.2
reconcile_interval_s = 0.5
stop_grace_s = 5.0
{node_extra}

[[models]]
name = "tiny"
path = "tiny.gguf"

[[instances]]
role = "chat"
flavor = "llamacpp"
model = "tiny"
port = {chat_port}
{instance_extra}
{embed_instance(embed_port)}"""
    )
    return path


def embed_instance(port: int) -> str:
    """The [[instances]] entry of role "embed": model "tiny" on ``port``, not started."""
    return f"""
[[instances]]
role = "embed"
flavor = "llamacpp"
model = "tiny"
port = {port}
start = false
"""


def distinct_ports() -> tuple[int, int]:
    first = free_port()
    return first, wait_until(lambda: (p := free_port()) != first and p, 5, "a second free port")


def put_model(data_dir: Path) -> None:
    models = data_dir / "models"
    models.mkdir(parents=True, exist_ok=True)
    (models / "tiny.gguf").write_bytes(MODEL_BYTES)


def cli(*args: object, timeout: float = EXIT_DEADLINE_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(INFERVISOR), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def assert_verifies(db: Path) -> None:
    """``infervisor chain verify DB`` exits 0 (run in this process: support.cli_here)."""
    verified = cli_here("chain", "verify", db)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def read_state(db: Path) -> NodeState | None:
    """The chain's state, or None while it does not exist yet."""
    if not db.exists():
        return None
    try:
        return rebuild(db)
    except ChainError:
        return None  # created but not initialised yet


def by_role(instances: dict[str, Any], role: str) -> tuple[str, Any]:
    """(id, state) of the one instance with ``role``; works for InstanceState and JSON."""
    found = [
        (iid, inst)
        for iid, inst in instances.items()
        if (inst["spec"] if isinstance(inst, dict) else inst.spec)["role"] == role
    ]
    assert len(found) == 1, f"instances with role {role}: {found}"
    return found[0]


def lifecycle(state: NodeState, role: str) -> str | None:
    try:
        return str(by_role(state.instances, role)[1].lifecycle)
    except AssertionError:
        return None


def events_of(db: Path) -> list[Any]:
    with SqliteChain.open_readonly(db) as chain:
        return list(chain.events())


def server_groups(db: Path) -> list[int]:
    """Every process group the node ever spawned a server in."""
    return [json.loads(e.payload)["pgid"] for e in events_of(db) if e.kind == "instance.spawned"]


class NodeRun:
    """One ``infervisor run`` process; its output goes to a file."""

    def __init__(self, config: Path, log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(INFERVISOR), "run", str(config)], stdout=out, stderr=subprocess.STDOUT
            )

    def output(self) -> str:
        return self.log.read_text()

    def send(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def stop(self, signum: int = signal.SIGTERM) -> int:
        self.send(signum)
        return self.wait()

    def wait(self) -> int:
        try:
            return self.proc.wait(timeout=EXIT_DEADLINE_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"infervisor run did not exit; output:\n{self.output()}")

    def until(self, what: str, predicate: Callable[[], Any], timeout: float = DEADLINE_S) -> Any:
        """Poll ``predicate`` while the process lives; fail with its output otherwise."""

        def check() -> Any:
            if self.proc.poll() is not None:
                pytest.fail(f"infervisor run exited {self.proc.returncode} waiting for {what}")
            return predicate()

        try:
            return wait_until(check, timeout, what)
        except pytest.fail.Exception as e:
            raise pytest.fail.Exception(f"{e}\noutput:\n{self.output()}") from None

    def until_state(
        self, db: Path, what: str, predicate: Callable[[NodeState], bool], timeout: float
    ) -> NodeState:
        state: NodeState = self.until(
            what, lambda: (s := read_state(db)) is not None and predicate(s) and s, timeout
        )
        return state


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Callable[[Path], NodeRun]]:
    """Starts ``infervisor run``; teardown ends what a failed test left running."""
    started: list[NodeRun] = []

    def start(config: Path) -> NodeRun:
        run = NodeRun(config, tmp_path / f"run-{len(started) + 1}.log")
        started.append(run)
        return run

    yield start
    end_runs(started, tmp_path / "data" / "chain.db")


def end_runs(started: list[NodeRun], db: Path) -> None:
    """Teardown: end the runs a failed test left going, then any server group they left."""
    for run in started:
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGTERM)
            try:
                run.proc.wait(timeout=EXIT_DEADLINE_S)
            except subprocess.TimeoutExpired:
                run.proc.kill()
                run.proc.wait()
    if db.exists():
        for pgid in server_groups(db):
            if pids_of_group(pgid):
                os.killpg(pgid, signal.SIGKILL)
    # A server spawned by a run killed before it recorded the spawn is in no recorded
    # group (the next boot would find it by its launch token).
    wait_until(lambda: not _kill_unrecorded(db.parent), EXIT_DEADLINE_S, "no unrecorded server")


def _kill_unrecorded(data: Path) -> list[psutil.Process]:
    """SIGKILL what a run left in ``data`` outside any recorded group; returns
    what it found (empty: nothing was left).

    A server's command names the data directory's model. Its launch shim's does
    not (``python -I -S shim.py``) but its working directory is the instance's,
    under ``data``, as is the shim's child before it execs the server: a run
    SIGKILLed mid-start left a shim that went on to start its server after a
    single scan by command line had passed (tests/test_cli_check.py), so this
    is called until a scan finds nothing."""
    inside = str(data) + os.sep
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        command, cwd = " ".join(proc.info["cmdline"] or ()), proc.info["cwd"] or ""
        if proc.pid != os.getpid() and (inside in command or (cwd + os.sep).startswith(inside)):
            found.append(proc)
            with contextlib.suppress(psutil.Error):
                proc.kill()
    return found


@pytest.fixture
def fast_config(tmp_path: Path, fake_llama: str) -> Path:
    put_model(tmp_path / "data")
    return write_config(tmp_path, fake_llama)


# ---------------------------------------------------------------- the scenario
def stop_resume_scenario(
    runs: Callable[[Path], NodeRun], config: Path, db: Path, deadline: float
) -> None:
    """Run, SIGTERM, check the chain; run again on the same data_dir, check the resume."""

    def chat_running_embed_placed(s: NodeState) -> bool:
        return lifecycle(s, "chat") == "running" and lifecycle(s, "embed") is not None

    first = runs(config)
    state = first.until_state(db, "chat running, embed placed", chat_running_embed_placed, deadline)
    chat_id, chat = by_role(state.instances, "chat")
    assert chat.process is not None
    first_pid = chat.process.pid
    assert first.stop() == 0, first.output()
    assert "Traceback" not in first.output()
    assert_verifies(db)

    replayed = cli_here("replay", db, "--json")
    assert replayed.returncode == 0, replayed.stderr
    instances = json.loads(replayed.stdout)["instances"]
    _, chat_json = by_role(instances, "chat")
    assert chat_json["lifecycle"] == "stopped"
    assert chat_json["desired"] == "running"  # stopped by the shutdown, still wanted
    assert "shutdown" in chat_json["reason"]
    assert chat_json["process"] is None
    embed_id, embed_json = by_role(instances, "embed")
    assert embed_json["lifecycle"] in ("loaded", "stopped")
    assert embed_json["desired"] == "stopped"

    second = runs(config)
    state = second.until_state(
        db,
        "chat running again with a new pid",
        lambda s: (
            lifecycle(s, "chat") == "running"
            and (p := by_role(s.instances, "chat")[1].process) is not None
            and p.pid != first_pid
        ),
        deadline,
    )
    assert lifecycle(state, "embed") == embed_json["lifecycle"]
    assert second.stop(signal.SIGINT) == 0, second.output()  # Ctrl-C
    out = second.output()
    assert f"resumed {chat_id}" in out
    assert f"resumed {embed_id}" in out
    assert not [line for line in out.splitlines() if line.startswith("placed ")]
    assert "Traceback" not in out

    assert_verifies(db)
    after = json.loads(cli_here("replay", db, "--json").stdout)["instances"]
    assert by_role(after, "embed")[1] == embed_json  # untouched by the second run
    assert by_role(after, "chat")[1]["desired"] == "running"
    events = events_of(db)
    placed = Counter(e.subject for e in events if e.kind == "instance.placed")
    assert placed == {chat_id: 1, embed_id: 1}
    kinds = Counter(e.kind for e in events)
    assert (kinds["node.started"], kinds["node.stopped"]) == (2, 2)
    groups = server_groups(db)
    assert len(groups) == 2  # one server per run, of chat only
    for pgid in groups:
        assert pids_of_group(pgid) == [], f"process group {pgid} outlived the node"


def test_stop_and_resume_with_the_fake_server(
    runs: Callable[[Path], NodeRun], fast_config: Path, tmp_path: Path
) -> None:
    stop_resume_scenario(runs, fast_config, tmp_path / "data" / "chain.db", DEADLINE_S)


@pytest.mark.slow
def test_stop_and_resume_the_example_with_the_real_server(
    runs: Callable[[Path], NodeRun], tmp_path: Path
) -> None:
    """examples/node.toml on its own data_dir and a free port, plus an instance not started."""
    chat_port, embed_port = distinct_ports()
    text = EXAMPLE.read_text()
    for old, new in (
        ('data_dir = "../.infervisor-example"', 'data_dir = "data"'),
        ("port = 18731", f"port = {chat_port}"),
    ):
        assert old in text, f"examples/node.toml no longer has {old!r}"
        text = text.replace(old, new)
    text += embed_instance(embed_port)
    config = tmp_path / "node.toml"
    config.write_text(text)
    stop_resume_scenario(runs, config, tmp_path / "data" / "chain.db", 90.0)
    assert (tmp_path / "data" / "models" / "tiny.gguf").read_bytes()[:4] == b"GGUF"


# ---------------------------------------------------------------- signals
def ignores_sigterm(pid: int) -> bool:
    """True once the process set SIGTERM to ignored (Linux: SigIgn in /proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"^SigIgn:\s*([0-9a-f]+)$", status, re.MULTILINE)
    assert found is not None, status
    return bool(int(found[1], 16) & (1 << (signal.SIGTERM - 1)))


def test_a_second_signal_kills_a_server_that_ignores_sigterm(
    runs: Callable[[Path], NodeRun], tmp_path: Path
) -> None:
    stubborn = make_launcher(tmp_path, PROGRAMS / "ignore_sigterm.py")
    put_model(tmp_path / "data")
    # A grace longer than the exit deadline: only the second signal can end it in time.
    config = write_config(tmp_path, stubborn)
    config.write_text(config.read_text().replace("stop_grace_s = 5.0", "stop_grace_s = 300.0"))
    db = tmp_path / "data" / "chain.db"
    run = runs(config)

    def spawned(s: NodeState) -> bool:
        process = by_role(s.instances, "chat")[1].process if lifecycle(s, "chat") else None
        return lifecycle(s, "chat") == "starting" and process is not None

    state = run.until_state(db, "chat spawned", spawned, DEADLINE_S)
    process = by_role(state.instances, "chat")[1].process
    assert process is not None
    # The signal must not reach it before it sets SIGTERM to ignored.
    run.until("the server ignoring SIGTERM", lambda: ignores_sigterm(process.pid))
    run.send(signal.SIGTERM)
    run.until_state(db, "chat stopping", lambda s: lifecycle(s, "chat") == "stopping", DEADLINE_S)
    assert run.stop(signal.SIGTERM) == 0, run.output()
    assert "killing managed servers now" in run.output()
    state = read_state(db)
    assert state is not None
    _, chat = by_role(state.instances, "chat")
    assert (chat.lifecycle, chat.desired) == ("stopped", "running")
    assert chat.last_exit is not None and chat.last_exit.signal == signal.SIGKILL
    for pgid in server_groups(db):
        assert pids_of_group(pgid) == []


def test_changed_spec_keys_are_reported_and_the_recorded_spec_kept(
    runs: Callable[[Path], NodeRun], tmp_path: Path, fake_llama: str
) -> None:
    put_model(tmp_path / "data")
    ports = distinct_ports()
    config = write_config(tmp_path, fake_llama, ports=ports)
    db = tmp_path / "data" / "chain.db"
    first = runs(config)
    first.until_state(db, "both placed", lambda s: lifecycle(s, "embed") is not None, DEADLINE_S)
    assert first.stop() == 0, first.output()
    write_config(tmp_path, fake_llama, ports=ports, instance_extra="ctx_size = 1024")
    second = runs(config)
    second.until("the node running", lambda: "Ctrl-C or SIGTERM stops it" in second.output())
    assert second.stop() == 0, second.output()
    assert "changed ctx_size since the instance was placed" in second.output()
    state = read_state(db)
    assert state is not None
    assert by_role(state.instances, "chat")[1].spec["ctx_size"] == 512
    assert Counter(e.kind for e in events_of(db))["instance.placed"] == 2


# ---------------------------------------------------------------- refusals: exit 2, one line
# A config refused by its load, or by the boot's checks before it opens anything
# (tools/node/run.py ``run_node``: ``preflight``, then the data directory's lock), runs
# ``infervisor run`` in this process (support.cli_here: the node never starts); a
# refusal once the boot has set up logging and its descriptor limit runs the real process.
def assert_refused(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("where", "extra", "section"),
    [
        ("top", {"top_extra": "colour = 1"}, "at the top level"),
        ("node", {"node_extra": "colour = 1"}, "in [node]"),
        ("instance", {"instance_extra": "colour = 1"}, "in [[instances]] #1"),
    ],
)
def test_an_unknown_key_is_refused_naming_it(
    tmp_path: Path, fake_llama: str, where: str, extra: dict[str, str], section: str
) -> None:
    config = write_config(tmp_path, fake_llama, **extra)
    result = cli_here("run", config)  # refused by the config's load: in this process
    assert_refused(result, "unknown key `colour`", section, str(config))
    assert not (tmp_path / "data").exists()  # nothing created, nothing recorded


def test_a_misspelt_key_gets_a_suggestion(tmp_path: Path, fake_llama: str) -> None:
    config = write_config(tmp_path, fake_llama)
    config.write_text(config.read_text().replace("start = false", "strat = false"))
    assert_refused(cli_here("run", config), "unknown key `strat`", "did you mean `start`?")


def test_a_missing_config_file_is_refused(tmp_path: Path) -> None:
    assert_refused(cli_here("run", tmp_path / "nowhere.toml"), "nowhere.toml", "does not exist")


def test_an_uncreatable_data_dir_is_refused(tmp_path: Path, fake_llama: str) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    config = write_config(tmp_path, fake_llama)
    config.write_text(config.read_text().replace('data_dir = "data"', 'data_dir = "a-file/data"'))
    assert_refused(cli_here("run", config), "data_dir", "a-file/data", "cannot create it")


def test_a_missing_model_file_is_refused_before_anything_is_recorded(
    tmp_path: Path, fake_llama: str
) -> None:
    config = write_config(tmp_path, fake_llama)
    assert_refused(cli_here("run", config), "[[models]] tiny", "tiny.gguf", "does not exist")
    assert not (tmp_path / "data" / "chain.db").exists()


def test_a_chain_of_another_node_is_refused(tmp_path: Path, fake_llama: str) -> None:
    put_model(tmp_path / "data")
    SqliteChain.open(tmp_path / "data" / "chain.db", "other-node").close()
    config = write_config(tmp_path, fake_llama)
    assert_refused(cli("run", config), "chain of node 'other-node'", "node_id")


def test_a_data_dir_in_use_is_refused(tmp_path: Path, fake_llama: str) -> None:
    put_model(tmp_path / "data")
    config = write_config(tmp_path, fake_llama)
    with (tmp_path / "data" / LOCK_FILE).open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("4242\n")
        held.flush()
        assert_refused(cli_here("run", config), "in use by another infervisor run", "pid 4242")


def test_an_instance_naming_an_unknown_model_is_refused_before_anything(
    tmp_path: Path, fake_llama: str
) -> None:
    put_model(tmp_path / "data")
    config = write_config(tmp_path, fake_llama)
    config.write_text(config.read_text().replace('model = "tiny"', 'model = "huge"', 1))
    result = cli_here("run", config)  # refused by the config's load: in this process
    assert_refused(result, "[[instances]] #1", "model 'huge' is not a [[models]] name")
    assert not (tmp_path / "data" / "chain.db").exists()


def test_the_example_config_is_valid_and_its_data_dir_ignored_by_git() -> None:
    config = load_config(EXAMPLE)
    root = EXAMPLE.parents[1]
    assert Path(config.node.data_dir) == root / ".infervisor-example"
    assert ".infervisor-example/" in (root / ".gitignore").read_text().splitlines()
    assert [m.generate_tiny for m in config.models] == [True]
    [instance] = config.instances
    assert (instance.port, instance.start, instance.host) == (18731, True, "127.0.0.1")


#: A commented-out setting (`# key = value`) or table header (`# [node.env]`, `# [[witnesses]]`).
COMMENTED = re.compile(
    r"^# ((?:[A-Za-z_]\w* = .+)|(?:\[[\w.]+\])|(?:\[\[[\w.]+\]\]))$", re.MULTILINE
)


def fields(cls: type[msgspec.Struct]) -> set[str]:
    return set(cls.__struct_fields__)


def test_the_example_documents_every_key_with_a_valid_value(tmp_path: Path) -> None:
    """With every `# key = value` line uncommented, the example still loads and sets every key."""
    text = COMMENTED.sub(r"\1", EXAMPLE.read_text())
    nfd = "/etc/kubernetes/node-feature-discovery/features.d"  # its folder must exist
    (tmp_path / "features.d").mkdir()
    text = text.replace(nfd, str(tmp_path / "features.d"))
    full = tmp_path / "node.toml"
    full.write_text(text)
    load_config(full)
    raw = tomllib.loads(text)
    documented = {
        "[node]": (set(raw["node"]), fields(NodeSettings)),
        "[node.restart]": (set(raw["node"]["restart"]), fields(RestartPolicy)),
        "[node.kinds.<name>]": (set(raw["node"]["kinds"]["inference"]), fields(KindSettings)),
        "[[models]]": (set(raw["models"][0]), fields(ModelEntryConfig)),
        "[[instances]]": (set(raw["instances"][0]), fields(InstanceEntry)),
        "[api]": (set(raw["api"]), fields(ApiConfig)),
        "[front]": (set(raw["front"]), fields(FrontConfig)),
        "[[witnesses]]": (set(raw["witnesses"][0]), fields(WitnessEntry)),
    }
    for section, (shown, known) in documented.items():
        assert shown == known, (
            f"examples/node.toml {section}: add {sorted(known - shown)}, "
            f"remove {sorted(shown - known)}"
        )


def test_the_examples_budget_comment_says_the_start_not_the_placement_is_refused() -> None:
    """Stop 32's trial: the comment said a placement that does not fit is refused; a
    placement is taken whatever its size (actors/node.py ``place`` checks no budget)
    and only its start is weighed (evictions, else ``no_room``)."""
    lines = EXAMPLE.read_text().splitlines()
    at = next(n for n, line in enumerate(lines) if line.startswith("# memory_budget_bytes"))
    start = max(n for n in range(at) if not lines[n].startswith("#")) + 1
    comment = " ".join(line.lstrip("# ") for line in lines[start:at])
    assert "a placement whose model" not in comment, comment
    assert "checked when an instance starts, not when it is placed" in comment, comment
    assert "refused (no_room) only when nothing can be evicted" in comment, comment
