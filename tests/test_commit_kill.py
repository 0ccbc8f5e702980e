"""kill -9 of a process whose chain writer is group-committing: only what was
not acknowledged may be lost.

The child (tests/programs/commit_under_kill.py) runs a ChainWriter with 16
callers appending one event at a time, each printing its acknowledgement. It
is SIGKILLed either inside a transaction (a batch of several callers' rows
inserted, not committed: the batch cut short) or after it has acknowledged
some appends, wherever the writer then is. Afterwards the chain verifies,
every acknowledged event is stored with the acknowledged seq and hash, each
caller's stored events are its rounds in order with no gap, and the chain
takes appends again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import PROGRAMS

from infervisor.chain import EventDraft, SqliteChain, verify_chain

CALLERS = 16
DEADLINE_S = 60.0
CHILD = PROGRAMS / "commit_under_kill.py"


def run_and_kill(db: Path, *, hold: int, acks_first: int) -> tuple[list[list[str]], str | None]:
    """Start the child; SIGKILL it once it holds its ``hold``-th batch (hold > 0)
    or once it printed ``acks_first`` acknowledgements. Its ack lines, and the
    ``inside`` line if it held one."""
    args = [sys.executable, str(CHILD), str(db), str(CALLERS), str(hold)]
    with subprocess.Popen(args, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        acks: list[list[str]] = []
        inside = None
        try:
            for line in child.stdout:
                words = line.split()
                if words[0] == "inside":
                    inside = line
                    break
                acks.append(words)
                if hold == 0 and len(acks) >= acks_first:
                    break
        finally:
            os.kill(child.pid, signal.SIGKILL)
        rest = child.stdout.read()  # printed before the kill: acknowledged too
        child.wait(DEADLINE_S)
    assert child.returncode == -signal.SIGKILL
    acks += [line.split() for line in rest.splitlines() if line.startswith("ack ")]
    return acks, inside


@pytest.mark.parametrize(
    ("hold", "acks_first"),
    [(3, 0), (0, 400)],
    ids=["inside-a-batch", "after-400-acks"],
)
def test_a_kill_loses_only_unacknowledged_appends(tmp_path: Path, hold: int, acks_first: int):
    db = tmp_path / "chain.db"
    acks, inside = run_and_kill(db, hold=hold, acks_first=acks_first)
    assert acks, "the child acknowledged nothing before the kill"
    assert (inside is not None) == (hold > 0), "the kill did not land inside a batch"
    report = verify_chain(db)
    assert report.ok, report
    with SqliteChain.open(db, "node-a") as chain:
        stored = {e.seq: e for e in chain.events(after=0)}
        rounds: dict[int, list[int]] = {}
        for seq in sorted(stored):
            payload = json.loads(stored[seq].payload)
            rounds.setdefault(payload["c"], []).append(payload["r"])
        for _ack, c, r, seq, digest in acks:
            event = stored.get(int(seq))
            assert event is not None, f"acknowledged seq {seq} was lost"
            assert event.hash_hex() == digest
            assert json.loads(event.payload) == {"c": int(c), "r": int(r)}
        for got in rounds.values():
            assert got == list(range(len(got)))  # each caller's rounds, in order, no gap
        if inside is not None:  # the batch cut short: none of it is stored
            _inside, first, last = inside.split()
            assert int(first) < int(last)
            assert chain.head().seq == int(first) - 1
        after = chain.append(
            EventDraft(ts_ns=1, source="test", kind="test.after", subject="", payload=b"{}")
        )
        assert after.seq == max(stored) + 1
    assert verify_chain(db).ok
