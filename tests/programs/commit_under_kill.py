"""Appenders on a ChainWriter until killed, for tests/test_commit_kill.py.

argv: the chain file, the number of callers, and ``hold``: 0 appends until
killed; N > 0 holds the N-th transaction of more than one draft inside itself,
its rows inserted but not committed, prints ``inside <first seq> <last seq>``
and blocks there (the test kills it then).

Each caller appends its rounds 0, 1, 2, ... one at a time, each acknowledged
(durable) before the next, and prints ``ack <caller> <round> <seq> <hash>``
once it is.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence

from infervisor.actors.chain_writer import ChainWriter
from infervisor.actors.messages import Append
from infervisor.chain import EventDraft, SqliteChain, StoredEvent, encode_payload

path, callers, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
out = threading.Lock()
batches: list[int] = []  # seqs of each transaction of more than one draft
insert = SqliteChain._insert


def held_insert(
    chain: SqliteChain, head: StoredEvent, drafts: Sequence[EventDraft]
) -> list[StoredEvent]:
    stored = insert(chain, head, drafts)
    if len(drafts) > 1:
        batches.append(stored[0].seq)
        if len(batches) == hold:
            with out:
                print(f"inside {stored[0].seq} {stored[-1].seq}", flush=True)
            threading.Event().wait()  # until killed
    return stored


SqliteChain._insert = held_insert  # type: ignore[method-assign]
writer = ChainWriter.start(path, "node-a")


def caller(c: int) -> None:
    r = 0
    while True:
        draft = EventDraft(
            ts_ns=r, source="test", kind="test.event", subject=f"c{c}",
            payload=encode_payload({"c": c, "r": r}),
        )  # fmt: skip
        (event,) = writer.ask(Append(drafts=(draft,)))
        with out:
            print(f"ack {c} {r} {event.seq} {event.hash_hex()}", flush=True)
        r += 1


for c in range(callers):
    threading.Thread(target=caller, args=(c,), daemon=True).start()
threading.Event().wait()
