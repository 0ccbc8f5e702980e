"""Auditor's speeds on one 200,000-event chain: verify, replay, both in one pass, audit.

Builds a chain of ``--events`` events (default 200,000) of a realistic mix:
``--instances`` instances placed, then supervision cycles (starting, spawned,
ready, unhealthy, recovered, exited, restart_scheduled, stable) with a
controller lease renewal now and then; appended with ``append_many`` in
transactions of 10,000. Then, ``--rounds`` times over the same file and the
same rows, interleaved so that outside load hits every measurement alike:

- **bare loop (documented)**: read the rows (``ORDER BY seq``), BLAKE3 the
  payload, build the header, BLAKE3 it, compare both: the few dozen lines an
  auditor writes from docs/chain-format.md, hashing with
  ``blake3(data, derive_key_context=...)``;
- **bare loop (copied hasher)**: the same with a hasher copied from one
  prepared for the context (the derived key is computed once), which is what
  ``verify_chain`` does;
- **verify_chain**: every check of docs/chain-format.md section 5;
- **replay in process**: ``replay.fold`` over the events already in memory
  (the reducer alone: decode, transition check, state update);
- **rebuild (file)**: ``replay.rebuild``: read and fold, no verification;
- **verify + replay, one pass**: ``replay.read_chain``, what offline
  ``replay``/``status``/``timeline`` run: verify each row and feed it to the
  reducer in one snapshot;
- **audit**: ``replay.audit.audit_chain`` (verify + lifecycle rules);
- **event_log view**: ``SELECT count(*), max(time)`` over the decoded view.

Printed: the best events/s of the rounds per line and the ratios the issue's
targets are about: verify / bare (target >= 0.9), replay events/s (target
>= 200,000), one pass / verify in time (target <= 1.5).

Run: ``python bench/chain_audit.py [--events 200000] [--rounds 5]`` (~1-2 min).
"""

from __future__ import annotations

import argparse
import sqlite3
import struct
import time
from collections.abc import Callable
from pathlib import Path

import blake3
from _harness import machine, table, workdir

from infervisor.chain import (
    EVENT_CONTEXT,
    PAYLOAD_CONTEXT,
    EventDraft,
    SqliteChain,
    StoredEvent,
    verify_chain,
)
from infervisor.replay import events as ev
from infervisor.replay import fold, kind_of, read_chain, rebuild
from infervisor.replay.audit import audit_chain
from infervisor.replay.state import Stamp

ROWS = (
    "SELECT seq, ts_ns, node, source, kind, subject, payload, payload_hash, prev_hash, hash "
    "FROM events ORDER BY seq"
)
BATCH = 10_000


def build(path: Path, events: int, instances: int) -> int:
    """The benchmark chain; returns its length (genesis included)."""
    now = time.time_ns()
    boot = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    drafts: list[EventDraft] = []
    tick = 0

    def put(subject: str, event: ev.Event, source: str = "supervisor") -> None:
        nonlocal tick
        tick += 1
        drafts.append(
            EventDraft(
                ts_ns=now + tick * 1_000_000,
                source=source,
                kind=kind_of(event),
                subject=subject,
                payload=ev.encode_event(event),
            )
        )

    def stamp() -> Stamp:
        return Stamp(wall_ns=now + tick * 1_000_000, mono_s=tick / 1000, boot_id=boot)

    put("", ev.NodeStarted(pid=4321, boot_id=boot, version="0.1.0"), "node")
    names = [f"chat-{i:08x}-bench" for i in range(instances)]
    spec = {"role": "chat", "flavor": "llamacpp", "model": "tiny", "port": 18080}
    for name in names:
        put(name, ev.Placed(spec=spec, placed_by="bench"), "operator:uid=1000(alice)")
    pid = 10_000
    with SqliteChain.open(path, "bench", now_ns=lambda: now) as chain:
        while tick < events:
            for name in names:
                pid += 1
                put(name, ev.Starting(by="supervisor", attempt=1, at=stamp()))
                put(
                    name,
                    ev.Spawned(
                        pid=pid,
                        pgid=pid,
                        start_time=1_700_000_000.25,
                        boot_id=boot,
                        argv=["llama-server", "--port", "18080"],
                        at=stamp(),
                    ),
                    "node",
                )
                put(name, ev.Ready(detail="ok", at=stamp()))
                put(name, ev.Unhealthy(misses=3, reason="health probe timed out"))
                put(name, ev.Recovered(detail="ok"))
                put(
                    name,
                    ev.Exited(
                        pid=pid,
                        exit_code=None,
                        signal=9,
                        reason="exited on its own: signal 9 (SIGKILL)",
                        output_tail="main: server is listening on http://127.0.0.1:18080\n",
                    ),
                    "node",
                )
                put(
                    name,
                    ev.RestartScheduled(
                        attempt=1, delay_s=2.0, reason="crash", at=stamp(), due=stamp()
                    ),
                )
                put(name, ev.StableAgain(uptime_s=61.5))
            put("", ev.LeaseRenewed(controller="ctl-1", at=stamp()), "lease")
            if len(drafts) >= BATCH:
                chain.append_many(drafts)
                drafts.clear()
        chain.append_many(drafts)
        return chain.head().seq + 1


def bare(path: Path, *, copied: bool) -> int:
    """The auditor's loop: read, hash the payload, hash the header, compare."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.text_factory = bytes
    seq_ts, length = struct.Struct(">Qq").pack, struct.Struct(">I").pack
    n = 0
    try:
        if copied:
            payload_base = blake3.blake3(derive_key_context=PAYLOAD_CONTEXT).copy
            event_base = blake3.blake3(derive_key_context=EVENT_CONTEXT).copy
            for seq, ts, node, source, kind, subject, payload, ph, prev, digest in conn.execute(
                ROWS
            ):
                h = payload_base()
                h.update(payload)
                if h.digest() != ph:
                    raise SystemExit(f"payload altered at {seq}")
                h = event_base()
                h.update(
                    seq_ts(seq, ts)
                    + length(len(node))
                    + node
                    + length(len(source))
                    + source
                    + length(len(kind))
                    + kind
                    + length(len(subject))
                    + subject
                    + ph
                    + prev
                )
                if h.digest() != digest:
                    raise SystemExit(f"header altered at {seq}")
                n += 1
        else:
            b3 = blake3.blake3
            for seq, ts, node, source, kind, subject, payload, ph, prev, digest in conn.execute(
                ROWS
            ):
                if b3(payload, derive_key_context=PAYLOAD_CONTEXT).digest() != ph:
                    raise SystemExit(f"payload altered at {seq}")
                header = b"".join(
                    (
                        seq_ts(seq, ts),
                        length(len(node)),
                        node,
                        length(len(source)),
                        source,
                        length(len(kind)),
                        kind,
                        length(len(subject)),
                        subject,
                        ph,
                        prev,
                    )
                )
                if b3(header, derive_key_context=EVENT_CONTEXT).digest() != digest:
                    raise SystemExit(f"header altered at {seq}")
                n += 1
    finally:
        conn.close()
    return n


def timed(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--instances", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    print(f"chain_audit: {machine()}, {time.strftime('%Y-%m-%d %H:%M')}")
    with workdir("audit") as root:
        path = root / "chain.db"
        began = time.perf_counter()
        total = build(path, args.events, args.instances)
        size = path.stat().st_size
        print(
            f"built {total:,} events ({args.instances} instances, {size / 2**20:.0f} MiB) in "
            f"{time.perf_counter() - began:.1f} s; best of {args.rounds} interleaved rounds"
        )
        with SqliteChain.open_readonly(path) as chain:
            loaded: list[StoredEvent] = list(chain.events())
        assert verify_chain(path).ok
        assert not audit_chain(path).findings
        runs: dict[str, Callable[[], object]] = {
            "bare loop (documented)": lambda: bare(path, copied=False),
            "bare loop (copied hasher)": lambda: bare(path, copied=True),
            "verify_chain": lambda: verify_chain(path),
            "replay in process (fold)": lambda: fold("bench", loaded),
            "rebuild (file, unverified)": lambda: rebuild(path),
            "verify + replay, one pass": lambda: read_chain(path),
            "audit (verify + rules)": lambda: audit_chain(path),
            "event_log view scan": lambda: _view_scan(path),
        }
        best = dict.fromkeys(runs, float("inf"))
        for _ in range(args.rounds):
            for name, work in runs.items():
                best[name] = min(best[name], timed(work))
    rate = {name: total / seconds for name, seconds in best.items()}
    base = rate["bare loop (documented)"]
    rows = [[name, rate[name], best[name] * 1e3, f"{rate[name] / base:.2f}x"] for name in runs]
    print()
    print(table(["measurement", "events/s", "ms", "vs bare"], rows))
    verify_vs_bare = rate["verify_chain"] / base
    verify_vs_copied = rate["verify_chain"] / rate["bare loop (copied hasher)"]
    one_pass = best["verify + replay, one pass"] / best["verify_chain"]
    print()
    targets = [
        [
            "verify_chain / bare loop (documented)",
            f"{verify_vs_bare:.2f}",
            ">= 0.9",
            _ok(verify_vs_bare >= 0.9),
        ],
        [
            "verify_chain / bare loop (copied hasher)",
            f"{verify_vs_copied:.2f}",
            "(same hashing)",
            "",
        ],
        [
            "replay in process, events/s",
            f"{rate['replay in process (fold)']:,.0f}",
            ">= 200,000",
            _ok(rate["replay in process (fold)"] >= 200_000),
        ],
        [
            "one pass time / verify time",
            f"{one_pass:.2f}",
            "<= 1.5",
            _ok(one_pass <= 1.5),
        ],
    ]
    print(table(["ratio", "measured", "target", ""], targets))


def _view_scan(path: Path) -> None:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        conn.execute("SELECT count(*), max(time), count(reason) FROM event_log").fetchone()
    finally:
        conn.close()


def _ok(met: bool) -> str:
    return "met" if met else "MISSED"


if __name__ == "__main__":
    main()
