"""`chain export` and `chain backup` killed mid-way (kill -9) leave nothing the next
run does not remove, and the next run says so (issue 18, item 8)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infervisor.chain import EventDraft, SqliteChain, encode_payload

INFERVISOR = Path(sys.executable).parent / "infervisor"
DEADLINE_S = 60.0  # a bound on a hang, never a measurement


def big_chain(folder: Path, events: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "chain.db"
    with SqliteChain.open(path, "big") as chain:
        for start in range(1, events, 10_000):
            chain.append_many(
                [
                    EventDraft(
                        ts_ns=n,
                        source="operator",
                        kind="test.event",
                        subject="x",
                        payload=encode_payload({"n": n, "pad": "x" * 200}),
                    )
                    for n in range(start, min(start + 10_000, events))
                ]
            )
    return path


def partials(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if ".infervisor-partial-" in p.name]


def kill_midway(args: list[str], folder: Path) -> int | None:
    """Run the command; kill -9 it once its temporary file appears. Its pid, or None
    when it finished before it could be caught."""
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + DEADLINE_S
    try:
        while time.monotonic() < deadline:
            if partials(folder):
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=DEADLINE_S)
                return proc.pid
            if proc.poll() is not None:
                return None
            time.sleep(0.0005)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=DEADLINE_S)
    raise AssertionError("the command neither finished nor wrote its temporary file")


@pytest.fixture(scope="module")
def big_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 60,000-event chain, built once for both commands: they only read it."""
    return big_chain(tmp_path_factory.mktemp("big") / "data", 60_000)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["export", "backup"])
def test_a_killed_run_leaves_nothing_the_next_run_does_not_remove(
    tmp_path: Path, big_db: Path, command: str
) -> None:
    db = big_db
    out = tmp_path / "out"
    out.mkdir()
    pid = None
    for attempt in range(10):  # the backup's window is short: try until a kill lands in it
        pid = kill_midway(
            [str(INFERVISOR), "chain", command, str(db), str(out / f"t{attempt}")], out
        )
        if pid is not None:
            break
        for done in out.iterdir():  # it finished: start again from an empty folder
            subprocess.run(["rm", "-rf", str(done)], check=True)
    assert pid is not None, "no kill landed while the temporary file existed"
    left = partials(out)
    assert left and all(str(pid) in p.name for p in left)
    assert not (out / f"t{attempt}").exists()  # never a half result under the target's name
    again = subprocess.run(
        [str(INFERVISOR), "chain", command, str(db), str(out / "next")],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S * 4,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert f"left by a killed backup or export (pid {pid})" in again.stderr
    assert partials(out) == []
    assert (out / "next").exists()
