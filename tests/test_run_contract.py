"""The operator's contract of ``infervisor run`` (issue 11, items 3, 4, 10, 11).

One bad instance never takes the node down; a refused config creates
nothing; SIGHUP stops the node cleanly; the status reason quotes a crash's
output; server logs rotate across spawns; a missing extra is named. The runs
are real processes (see tests/test_run_resume.py), synchronised on the chain;
two tests that read the same run share it (a module fixture). A config refused
before the node opens anything (its load, the preflight: tools/node/run.py
``run_node``), and ``status``, run the CLI in this process (support.cli_here).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import test_run_resume
from support import PROGRAMS, cli_here, make_launcher, pids_of_group, wait_until
from test_run_resume import (
    DEADLINE_S,
    INFERVISOR,
    NodeRun,
    by_role,
    distinct_ports,
    end_runs,
    events_of,
    lifecycle,
    put_model,
    read_state,
    server_groups,
    toml_str,
    write_config,
)

from infervisor.actors.view import describe, last_lines
from infervisor.adapters.ports import free_port
from infervisor.adapters.proc.output import KEPT_SPAWNS, PREVIOUS, STDERR_LOG, create_logs
from infervisor.adapters.spec import Flavor, instance_id
from infervisor.replay import Desired, ExitRecord, InstanceState, LifecycleState, NodeState
from infervisor.tools.demo.steps import run_demo
from infervisor.tools.node.boot import LOG_FILE
from infervisor.tools.node.config import load_config
from infervisor.tools.servers import extras

#: A Python logging line (the format the command line configures).
LOGGING_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING|ERROR)")


runs = test_run_resume.runs  # the fixture: starts ``infervisor run``, ends it in teardown
fast_config = test_run_resume.fast_config  # the fixture: the fake server's config
FAKE_LLAMA = PROGRAMS / "fake_llama.py"


def mlx_instance(port: int) -> str:
    return f"""
[[instances]]
role = "mlx-chat"
flavor = "mlx-lm"
model = "tiny-mlx"
port = {port}
"""


def config_with_a_missing_program(tmp_path: Path, fake_llama: str) -> Path:
    """chat (started), an mlx-lm instance whose server program is missing, embed."""
    put_model(tmp_path / "data")
    (tmp_path / "data" / "models" / "tiny-mlx").mkdir()
    (tmp_path / "data" / "models" / "tiny-mlx" / "config.json").write_text("{}")
    chat_port, embed_port = distinct_ports()
    config = write_config(
        tmp_path,
        fake_llama,
        ports=(chat_port, embed_port),
        node_extra=f"mlx_program = {toml_str(tmp_path / 'no-such-mlx_lm.server')}",
    )
    text = config.read_text().replace(
        '[[instances]]\nrole = "embed"',
        '[[models]]\nname = "tiny-mlx"\npath = "tiny-mlx"\nformat = "mlx"\n'
        + mlx_instance(free_port())
        + '\n[[instances]]\nrole = "embed"',
    )
    config.write_text(text)
    return config


# ---------------------------------------------------------------- one bad instance
class Ran:
    """One ``infervisor run`` that ran and was stopped: its folder, chain, output, exit."""

    def __init__(self, folder: Path, config: Path, run: NodeRun) -> None:
        self.folder, self.config, self.db = folder, config, folder / "data" / "chain.db"
        self.status = run.wait()
        self.out = run.output()


@pytest.fixture(scope="module")
def missing_program_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ran]:
    """One run of the config with an instance whose program is missing (chat started,
    the bad mlx-lm one, embed), until chat runs and embed is placed, then SIGTERM:
    what the two tests below read (one node start, not two, for the same run)."""
    folder = tmp_path_factory.mktemp("missing-program")
    config = config_with_a_missing_program(folder, make_launcher(folder, FAKE_LLAMA))
    db = folder / "data" / "chain.db"
    run = NodeRun(config, folder / "run.log")
    try:

        def others_placed(s: NodeState) -> bool:
            return lifecycle(s, "chat") == "running" and lifecycle(s, "embed") is not None

        run.until_state(db, "chat running and embed (after the bad one) placed", others_placed, 60)
        run.until("the node running", lambda: "SIGTERM stops it" in run.output())
        run.send(signal.SIGTERM)
        yield Ran(folder, config, run)
    finally:
        end_runs([run], db)


def test_an_instance_whose_program_is_missing_leaves_the_others_running(
    missing_program_run: Ran,
) -> None:
    ran = missing_program_run
    assert ran.status == 0, ran.out
    refused = [line for line in ran.out.splitlines() if line.startswith("refused [[instances]] #2")]
    assert len(refused) == 1, ran.out
    assert "no-such-mlx_lm.server" in refused[0]
    assert "pip install 'infervisor[mlx]'" in refused[0]
    assert "Traceback" not in ran.out
    assert [e.kind for e in events_of(ran.db)][-1] == "node.stopped"


def test_an_instance_whose_program_is_missing_is_recorded(missing_program_run: Ran) -> None:
    ran = missing_program_run
    loaded = load_config(ran.config)
    bad = instance_id(loaded.instances[1].spec(), loaded.node.node_id)
    assert ran.status == 0, ran.out
    state = read_state(ran.db)
    assert state is not None and lifecycle(state, "embed") is not None  # placed after it
    assert bad in {e.subject for e in events_of(ran.db)}, "nothing recorded for the bad instance"


# ---------------------------------------------------------------- a refused config
def test_a_config_naming_an_unknown_model_creates_nothing(tmp_path: Path, fake_llama: str) -> None:
    config = write_config(tmp_path, fake_llama)
    config.write_text(config.read_text().replace('model = "tiny"', 'model = "huge"', 1))
    result = cli_here("run", config)  # refused by the config's load: in this process
    assert result.returncode == 2, result.stderr
    assert str(config) in result.stderr
    assert "[[instances]] #1: model 'huge' is not a [[models]] name" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "data").exists()


def test_a_missing_model_file_creates_nothing(tmp_path: Path, fake_llama: str) -> None:
    result = cli_here("run", write_config(tmp_path, fake_llama))  # by the preflight: in process
    assert result.returncode == 2, result.stderr
    assert "[[models]] tiny" in result.stderr and "tiny.gguf does not exist" in result.stderr
    assert not (tmp_path / "data").exists()


# ---------------------------------------------------------------- SIGHUP, clean output
@pytest.fixture(scope="module")
def sighup_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ran]:
    """One run of the fake server's config until chat runs, stopped by SIGHUP: what
    the SIGHUP test and the clean-output test read (one node start for both)."""
    folder = tmp_path_factory.mktemp("sighup")
    put_model(folder / "data")
    config = write_config(folder, make_launcher(folder, FAKE_LLAMA))
    db = folder / "data" / "chain.db"
    run = NodeRun(config, folder / "run.log")
    try:
        run.until_state(db, "chat running", lambda s: lifecycle(s, "chat") == "running", DEADLINE_S)
        run.until("the node running", lambda: "SIGTERM stops it" in run.output())
        run.send(signal.SIGHUP)
        yield Ran(folder, config, run)
    finally:
        end_runs([run], db)


def test_sighup_stops_the_node_cleanly(sighup_run: Ran) -> None:
    ran = sighup_run
    assert ran.status == 0, ran.out
    assert "received SIGHUP" in ran.out
    kinds = [e.kind for e in events_of(ran.db)]
    assert kinds[-1] == "node.stopped"
    state = read_state(ran.db)
    assert state is not None
    assert by_role(state.instances, "chat")[1].lifecycle == "stopped"
    assert not (ran.folder / "data" / "api.sock").exists()
    for pgid in server_groups(ran.db):
        assert pids_of_group(pgid) == []


def test_a_closed_terminal_leaves_the_node_running_and_stopping_cleanly(
    fast_config: Path, tmp_path: Path
) -> None:
    """``infervisor run CONFIG 2>&1 | head -2``: the pipe closes after two lines,
    and the node still boots, serves and stops gracefully on SIGTERM (its lines
    were written to a closed pipe: BrokenPipeError once took it down mid-boot or
    wedged its shutdown)."""
    db = tmp_path / "data" / "chain.db"
    proc = subprocess.Popen(
        [str(INFERVISOR), "run", str(fast_config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        for _ in range(2):
            proc.stdout.readline()
        proc.stdout.close()  # the reader is gone: every later line meets a closed pipe
        wait_until(
            lambda: (s := read_state(db)) is not None and lifecycle(s, "chat") == "running",
            DEADLINE_S,
            what="chat running behind a closed terminal",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DEADLINE_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [e.kind for e in events_of(db)][-1] == "node.stopped"
    for pgid in server_groups(db):
        assert pids_of_group(pgid) == []


def test_run_prints_clean_event_lines_and_logs_to_a_file(sighup_run: Ran) -> None:
    ran = sighup_run  # a run until chat ran, then stopped (by SIGHUP)
    assert ran.status == 0, ran.out
    assert not [line for line in ran.out.splitlines() if LOGGING_LINE.match(line)], ran.out
    assert "pid None" not in ran.out
    assert f"diagnostics (Python logging): {ran.folder / 'data' / LOG_FILE}" in ran.out
    assert (ran.folder / "data" / LOG_FILE).exists()


# ---------------------------------------------------------------- status tells the truth
def test_status_reason_quotes_the_crash_output(
    runs: Callable[[Path], NodeRun], tmp_path: Path
) -> None:
    crasher = make_launcher(tmp_path, PROGRAMS / "exit_nonzero.py", "1")
    put_model(tmp_path / "data")
    config = write_config(tmp_path, crasher, node_extra="[node.restart]\nmax_restarts = 0")
    db = tmp_path / "data" / "chain.db"
    run = runs(config)
    state = run.until_state(
        db, "chat failed", lambda s: lifecycle(s, "chat") == "failed", DEADLINE_S
    )
    chat_id, chat = by_role(state.instances, "chat")
    assert chat.last_exit is not None and "giving up" in chat.last_exit.output_tail
    shown = cli_here("status", config, chat_id)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "output: to stdout | to stderr: giving up" in shown.stdout
    assert run.stop() == 0, run.output()


def instance(lifecycle: str, **fields: object) -> InstanceState:
    return InstanceState(
        instance_id="i1",
        spec={},
        placed_by="n1",
        generation=0,
        lifecycle=LifecycleState(lifecycle),
        desired=Desired.RUNNING,
        since_ns=0,
        last_seq=1,
        **fields,  # type: ignore[arg-type]
    )


def crash(tail: str) -> ExitRecord:
    return ExitRecord(
        pid=1, exit_code=1, signal=None, reason="exit code 1", ts_ns=0, output_tail=tail
    )


def test_the_reason_shows_a_refusal_and_a_crash_tail() -> None:
    refused = instance("loaded", reason="placed by bad (generation 0)", refusal="over budget")
    assert describe(refused) == "placed by bad (generation 0); start refused: over budget"
    crashed = instance("failed", reason="exit code 1", last_exit=crash("a\n\nb\nerror: no\n\n"))
    assert describe(crashed) == "exit code 1; output: b | error: no"
    running = instance("running", reason="ready", last_exit=crash("old crash\n"))
    assert describe(running) == "ready"
    assert describe(running, "probe stuck") == "ready [fault: probe stuck]"
    long = last_lines("x" * 500)
    assert len(long) == 200 and long.startswith("...")


def test_server_logs_rotate_across_spawns(tmp_path: Path) -> None:
    cwd = str(tmp_path)
    stderr = tmp_path / STDERR_LOG
    for spawn in range(KEPT_SPAWNS + 2):
        out, err = create_logs(cwd)
        os.write(err, f"spawn {spawn}\n".encode())
        os.close(out)
        os.close(err)
    last = KEPT_SPAWNS + 1
    assert stderr.read_text() == f"spawn {last}\n"
    for n in range(1, KEPT_SPAWNS + 1):
        assert Path(f"{stderr}.{n}").read_text() == f"spawn {last - n}\n"
    assert not Path(f"{stderr}.{KEPT_SPAWNS + 1}").exists()


def test_a_rotated_log_keeps_what_was_saved_of_it_earlier(tmp_path: Path) -> None:
    stderr = tmp_path / STDERR_LOG
    out, err = create_logs(str(tmp_path))
    os.write(err, b"the end\n")
    os.close(out)
    os.close(err)
    Path(f"{stderr}{PREVIOUS}").write_text("the start\n")  # as a reader saves it
    out, err = create_logs(str(tmp_path))
    os.close(out)
    os.close(err)
    assert Path(f"{stderr}.1").read_text() == "the start\nthe end\n"
    assert not Path(f"{stderr}{PREVIOUS}").exists()
    assert stderr.read_text() == ""


# ---------------------------------------------------------------- extras
@pytest.mark.parametrize(
    ("flavor", "extra"), [(Flavor.MLX_LM, "mlx"), (Flavor.LLAMACPP, "llamacpp")]
)
def test_the_demo_names_a_missing_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flavor: Flavor, extra: str
) -> None:
    monkeypatch.setattr(extras, "_importable", lambda _module: False)
    lines: list[str] = []
    report = run_demo(tmp_path, lines.append, lambda _line: None, flavor)
    assert not report.ok
    assert [s.ok for s in report.steps] == [False]
    assert f"pip install 'infervisor[{extra}]'" in report.steps[0].detail
    assert any(f"needs the {extra} extra" in line for line in lines), lines
    assert not (tmp_path / "chain.db").exists()


def test_the_demo_names_a_missing_server_program(tmp_path: Path) -> None:
    missing = extras.missing_extra(Flavor.MLX_LM, str(tmp_path / "mlx_lm.server"))
    assert missing is not None
    assert "pip install 'infervisor[mlx]'" in missing and "mlx_lm.server" in missing
