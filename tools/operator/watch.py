"""``infervisor watch``: the chain's events as the node appends them, one line
each (or one WatchEvent JSON object per line), resumable by seq, reconnecting
to a node that restarts."""

from __future__ import annotations

import sys
import time

import click
import msgspec

from infervisor.chain import GENESIS_KIND, StoredEvent
from infervisor.replay import EventDecodeError, decode_event, reason_of

from ..api.errors import ApiError, NodeStopping, NodeUnavailable
from ..api.wire import WatchEvent
from ..clikit.command import SECONDS, Command
from ..clikit.failure import fail
from .target import UNAVAILABLE_CODE, Target, api_failure, node_command

__all__ = ["watch", "watch_line"]


@click.command(cls=Command)
@click.option(
    "--from-seq",
    type=click.IntRange(min=0),
    metavar="N",
    help="Start at event N (the events already in the chain from N on first) "
    "[default: only new events, from the head on].",
)
@click.option("--json", "as_json", is_flag=True, help="One WatchEvent JSON object per line.")
@click.option("--no-follow", is_flag=True, help="End at the head instead of waiting for more.")
@click.option(
    "--retry-for",
    type=SECONDS,
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to keep reconnecting to a node that went away (0: exit at once).",
)
@node_command("[WHERE]", 0)
def watch(
    target: Target, from_seq: int | None, as_json: bool, no_follow: bool, retry_for: float
) -> None:
    """Print the chain's events as the node appends them, one line each.

    Text: `[SEQ] KIND SUBJECT: REASON`. --json: one object per line (seq,
    ts_ns, node, source, kind, subject, payload, hash, prev_hash; the
    WatchEvent of docs/api.md), flushed after each line, so a consumer that
    stops it (even with SIGKILL) resumes with --from-seq LAST+1 and gets
    every event exactly once. Without --from-seq it starts at the head:
    only events appended from now on.

    When the node goes away (restarting) it reconnects from the last seq
    seen + 1, with a bounded backoff, saying so on stderr; after
    --retry-for seconds without a node it exits 3. Ctrl-C ends it (exit 0).

    WHERE is the node's data directory, its config file (.toml) or its
    chain file; without it, --url (or INFERVISOR_URL) names the node.
    Exit 0 when --no-follow reaches the head, or on Ctrl-C; 1 when
    --from-seq is beyond the head + 1 (beyond_head: the events between would
    be skipped); 2 when the command line is wrong; 3 when no node runs (4:
    one is there but does not answer) for --retry-for seconds.
    """
    click.get_current_context().meta["json_lines"] = True
    try:
        _watch_events(target, from_seq, as_json, follow=not no_follow, retry_for=retry_for)
    except KeyboardInterrupt:
        sys.exit(0)


_BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0)


def _watch_events(
    target: Target, next_seq: int | None, as_json: bool, *, follow: bool, retry_for: float
) -> None:
    out = sys.stdout.buffer
    down_since: float | None = None
    tries, checked = 0, False
    with target.client() as client:
        while True:
            try:
                head = client.node().head_seq  # the node answers: (re)connected
                if next_seq is None:
                    next_seq = head + 1  # resumable from here on
                elif next_seq > head + 1 and not checked:
                    _beyond_head(next_seq, head)
                checked = True  # a reconnect resumes where it was, whatever the head
                if down_since is not None:
                    click.echo(f"watch: reconnected; from seq {next_seq}", err=True)
                    down_since, tries = None, 0
                for event in client.events(next_seq, follow=follow):
                    line = msgspec.json.encode(event) if as_json else watch_line(event).encode()
                    out.write(line + b"\n")
                    out.flush()
                    next_seq = event.seq + 1
                if not follow:
                    return
                raise NodeStopping("the node ended the stream", "node_stopping", 0)
            except NodeUnavailable as e:
                now = time.monotonic()
                if down_since is None:
                    down_since = now
                    seq = "the head" if next_seq is None else f"seq {next_seq}"
                    click.echo(f"watch: {e}; reconnecting from {seq}", err=True)
                if now - down_since >= retry_for:
                    fail(
                        f"{e} (no node for {retry_for:g} s, --retry-for)",
                        UNAVAILABLE_CODE.get(type(e), e.code),
                    )
                pause = _BACKOFF_S[min(tries, len(_BACKOFF_S) - 1)]
                time.sleep(min(pause, max(0.0, retry_for - (now - down_since))))  # backoff
                tries += 1
            except ApiError as e:
                api_failure(e)


def _beyond_head(from_seq: int, head: int) -> None:
    """Refuse (exit 1, ``beyond_head``, naming ``--from-seq``) a start beyond the next
    event: the events between the head and it would be skipped unseen, and with
    --no-follow nothing is printed (a newcomer's trial, stop 34, read exit 0)."""
    fail(
        f"--from-seq {from_seq} is beyond the chain's head (seq {head}): the next event "
        f"appended is seq {head + 1}; give at most {head + 1} (or leave it out: from "
        "the head on)",
        "beyond_head",
        "--from-seq",
    )


def watch_line(event: WatchEvent) -> str:
    """``[seq] kind subject: reason``, as `infervisor run` prints events (run.event_line)."""
    if event.kind == GENESIS_KIND:
        return f"[{event.seq}] {event.kind}: the chain of node {event.node} begins"
    stored = StoredEvent(
        seq=event.seq,
        ts_ns=event.ts_ns,
        node=event.node,
        source=event.source,
        kind=event.kind,
        subject=event.subject,
        payload=msgspec.json.encode(event.payload),
        payload_hash=b"",
        prev_hash=bytes.fromhex(event.prev_hash),
        hash=bytes.fromhex(event.hash),
    )
    try:
        why = reason_of(decode_event(stored))
    except EventDecodeError as e:
        why = str(e)
    subject = f" {event.subject}" if event.subject else ""
    return f"[{event.seq}] {event.kind}{subject}: {why}"
