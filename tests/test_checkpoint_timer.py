"""The time-based checkpoint counts from the latest stored checkpoint, across runs
(a newcomer's trial, stop 33: the timer started over with every run, so a node
restarted more often than ``checkpoint_every_s`` never signed its events)."""

from __future__ import annotations

import time
from pathlib import Path

from chain_tamper import NODE, NOW, draft

from infervisor.actors.chain_writer import ChainWriter
from infervisor.actors.messages import Append
from infervisor.chain import SqliteChain
from infervisor.chain.checkpoint import Checkpoint, load_or_create_signer
from infervisor.chain.checkpoint_store import Checkpointer, read_stored

S = 1_000_000_000  # ns per second


class Clocks:
    """A wall clock (ns) and a monotonic one (s) that a test moves by hand; each run
    of a node starts its monotonic clock somewhere else (another process)."""

    def __init__(self, wall_ns: int) -> None:
        self.wall_ns = wall_ns
        self.mono = 0.0

    def advance(self, seconds: float) -> None:
        self.wall_ns += int(seconds * S)
        self.mono += seconds

    def restart(self, mono: float) -> None:
        """A new process: the monotonic clock reads something unrelated."""
        self.mono = mono


def _run(path: Path, clocks: Clocks, every_s: float = 10.0) -> Checkpointer:
    return Checkpointer(
        path,
        NODE,
        load_or_create_signer(path.parent, NODE),
        every_events=1000,
        every_s=every_s,
        monotonic=lambda: clocks.mono,
        now_ns=lambda: clocks.wall_ns,
    )


def _killed(cp: Checkpointer) -> None:
    """The run ends without `close` (SIGKILL): no last checkpoint is written."""
    cp._conn.close()  # what the kernel does to a killed process


def _cleanly_stopped_run(path: Path, clocks: Clocks, chain: SqliteChain) -> Checkpoint | None:
    """A run that appends one event and stops cleanly: its close signs the head."""
    first = _run(path, clocks)
    first.observe(chain.append_many([draft(1)]))
    return first.close()


def test_the_timer_counts_from_the_last_stored_checkpoint_across_runs(tmp_path: Path) -> None:
    path = tmp_path / "chain.db"
    clocks = Clocks(NOW)
    with SqliteChain.open(path, NODE, now_ns=lambda: NOW) as chain:
        assert _cleanly_stopped_run(path, clocks, chain) is not None  # tree size 2 at NOW
        seq = 2
        # Killed and restarted every 4 s: each run appends one event.
        for mono in (500.0, 9.0, 7000.0):
            clocks.advance(4.0)
            clocks.restart(mono)
            run = _run(path, clocks)
            clocks.advance(0.5)
            signed = run.observe(chain.append_many([draft(seq)]))
            seq += 1
            _killed(run)
            if signed is not None:
                break
    # 13.5 s after the checkpoint at NOW: the third run's commit signs.
    assert signed is not None and signed.tree_size == seq
    stored = read_stored(path)
    assert [c.tree_size for c in stored] == [2, seq]
    assert stored[-1].ts_ns == NOW + 13 * S + S // 2


def test_a_boot_whose_last_checkpoint_is_older_signs_at_its_first_commit(
    tmp_path: Path,
) -> None:
    path = tmp_path / "chain.db"
    clocks = Clocks(NOW)
    with SqliteChain.open(path, NODE, now_ns=lambda: NOW) as chain:
        _cleanly_stopped_run(path, clocks, chain)
        run = _run(path, clocks)
        run.observe(chain.append_many([draft(2)]))  # unsigned when the run is killed
        _killed(run)
        clocks.advance(60.0)
        clocks.restart(3.0)
        boot = _run(path, clocks)
        signed = boot.observe(chain.append_many([draft(3)]))  # say node.started
        assert signed is not None and signed.tree_size == 4
        assert boot.observe(chain.append_many([draft(4)])) is None  # the timer starts over
        _killed(boot)


def test_a_chain_never_signed_counts_from_its_genesis(tmp_path: Path) -> None:
    path = tmp_path / "chain.db"
    clocks = Clocks(NOW)
    with SqliteChain.open(path, NODE, now_ns=lambda: NOW) as chain:
        run = _run(path, clocks)
        assert run.observe(chain.append_many([draft(1)])) is None  # 0 s after the genesis
        _killed(run)
        clocks.advance(11.0)
        clocks.restart(0.0)
        boot = _run(path, clocks)
        signed = boot.observe(chain.append_many([draft(2)]))
        assert signed is not None and signed.tree_size == 3
        _killed(boot)


def test_a_wall_clock_behind_the_last_checkpoint_waits_the_whole_period(
    tmp_path: Path,
) -> None:
    path = tmp_path / "chain.db"
    clocks = Clocks(NOW)
    with SqliteChain.open(path, NODE, now_ns=lambda: NOW) as chain:
        _cleanly_stopped_run(path, clocks, chain)
        clocks.wall_ns = NOW - 3600 * S  # the clock stepped back an hour
        run = _run(path, clocks)
        assert run.observe(chain.append_many([draft(2)])) is None
        clocks.advance(10.0)
        signed = run.observe(chain.append_many([draft(3)]))
        assert signed is not None and signed.tree_size == 4
        run.close()


def test_a_node_booting_past_the_period_signs_its_first_commit(tmp_path: Path) -> None:
    """The chain writer as a node runs it (default period, 300 s): the last run's
    checkpoint was signed 400 s ago and one event after it went unsigned (killed)."""
    path = tmp_path / "chain.db"
    then = time.time_ns() - 400 * S
    with SqliteChain.open(path, NODE) as chain:
        last_run = Checkpointer(
            path, NODE, load_or_create_signer(tmp_path, NODE), now_ns=lambda: then
        )
        last_run.observe(chain.append_many([draft(1)]))
        last_run.close()  # a clean stop 400 s ago
        chain.append_many([draft(2)])  # a run killed before it signed
    writer = ChainWriter.start(path, NODE, checkpoint_every_events=1000)
    try:
        writer.ask(Append(drafts=(draft(3),)), timeout=10)  # say node.started
        sizes = [c.tree_size for c in read_stored(path)]
    finally:
        writer.stop()
    assert sizes == [2, 4]  # signed at the boot's first commit, not 300 s into the run
