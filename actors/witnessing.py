"""Witnessing while the node runs: each new checkpoint goes to every configured witness.

One :class:`WitnessSubmitter` actor per witness, on its own thread. The chain
writer hands each checkpoint it signs to :meth:`Witnessing.offer` (a pykka
``tell`` per witness: a queue put, never a wait), so a slow or dead witness
never delays an append or supervision. A submitter keeps only the newest
checkpoint it was told of (a witness that cosigns the latest has checked the
older ones through the consistency proof), submits it
(:func:`~.witness_submit.submit`), and while the witness is unreachable or
answers 5xx retries after a capped exponential backoff with jitter
(0.5 s doubling to 30 s, up to a quarter added at random). Submissions to one
witness start at least ``MIN_INTERVAL_S`` apart (the newest checkpoint then
is sent): each costs the node milliseconds of CPU (bench/witness_appends.py),
so a chain checkpointing every few events would otherwise spend on witnessing
what its appends need. Any other refusal
(422, 403, 404, ...) is kept as the witness's last error; the next checkpoint
is submitted afresh.

What each witness has cosigned, how far it is behind, its last error and
last success are on a shared :class:`WitnessBoard` that status, ``GET
/v1/node`` and ``/metrics`` read without asking any actor.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import threading
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import httpx
import pykka

from infervisor.adapters.tls import client_tls
from infervisor.chain.checkpoint import Checkpoint
from infervisor.chain.errors import ChainError

from .clock import Clock, Timer
from .witness_submit import Leaves, Outcome, WitnessTarget, cosigned_size, submit

__all__ = ["WitnessBoard", "WitnessLag", "WitnessSubmitter", "Witnessing", "http_client"]

log = logging.getLogger(__name__)

#: Seconds of the first retry after a witness did not answer; doubled each time up to the cap.
RETRY_FIRST_S = 0.5
RETRY_CAP_S = 30.0
#: At most this fraction of a delay is added at random (so many nodes do not retry together).
RETRY_JITTER = 0.25
#: Seconds at least between the starts of two submissions to one witness.
MIN_INTERVAL_S = 0.25
REFUSED_RETRY_S = 60.0
"""A witness that refused (a 404 for an origin it was not yet configured with, a
403, a 422) is asked again this often, seconds, or at the next checkpoint: an idle
node signs none, and a witness fixed by its operator would wait for ever."""
#: Per-request timeouts of a submission, seconds (connect, read, write, pool).
HTTP_TIMEOUT_S = 10.0
SHUTDOWN_FLUSH_S = 2.0
"""How long a node's shutdown waits for its witnesses to cosign the checkpoint
the shutdown signed (seconds, all witnesses together); a witness that takes
longer gets it at the next boot."""


def http_client(timeout_s: float = HTTP_TIMEOUT_S) -> httpx.Client:
    """An HTTP client for witnesses: keep-alive, every timeout bounded, no redirects."""
    return httpx.Client(
        timeout=httpx.Timeout(timeout_s),
        follow_redirects=False,
        trust_env=False,
        verify=client_tls(trust_env=False),
    )


class WitnessLag(NamedTuple):
    """One witness as the node sees it now.

    Attributes:
        witness: the witness's key name.
        url: its submission prefix.
        cosigned_size: the largest tree size of this chain it has cosigned here (0: none).
        checkpoint_size: the node's latest checkpoint's tree size.
        behind_events: events the witness has not cosigned: checkpoint_size - cosigned_size.
        last_error: its last failure, one line (None after a success).
        last_success_ns: when it last cosigned, ns since the Unix epoch (None: never, this run).
    """

    witness: str
    url: str
    cosigned_size: int
    checkpoint_size: int
    behind_events: int
    last_error: str | None
    last_success_ns: int | None


class WitnessBoard:
    """The witnesses' lag, shared by reference: submitters write, anyone reads (thread-safe)."""

    def __init__(self, targets: Sequence[WitnessTarget] = ()) -> None:
        self._lock = threading.Lock()
        self._rows: dict[str, WitnessLag] = {
            t.name: WitnessLag(t.name, t.url, 0, 0, 0, None, None) for t in targets
        }

    def update(self, witness: str, **changes: Any) -> None:
        """Change fields of one witness's row; ``behind_events`` follows the sizes."""
        with self._lock:
            row = self._rows[witness]._replace(**changes)
            behind = max(0, row.checkpoint_size - row.cosigned_size)
            self._rows[witness] = row._replace(behind_events=behind)

    def checkpoint(self, size: int) -> None:
        """The node signed a checkpoint of ``size`` events."""
        for name in list(self._rows):
            with self._lock:
                current = self._rows[name].checkpoint_size
            if size > current:
                self.update(name, checkpoint_size=size)

    def rows(self) -> list[WitnessLag]:
        """Every witness's row, in configuration order."""
        with self._lock:
            return list(self._rows.values())


class _Kick(NamedTuple):
    """Submit the newest checkpoint now (queued behind the notices already waiting)."""


class _Flush(NamedTuple):
    """Submit the newest checkpoint now and answer when done (at shutdown; skipped
    while backing off from an unreachable witness)."""


class WitnessSubmitter(pykka.ThreadingActor):
    """Submits the newest checkpoint to one witness; see the module docstring."""

    # A submission in flight to a witness that hangs must not hold the node's exit
    # past the shutdown's flush: a write cut short is a transaction never committed.
    use_daemon_thread = True

    def __init__(
        self,
        target: WitnessTarget,
        chain_path: str | os.PathLike[str],
        board: WitnessBoard,
        clock: Clock,
        latest: tuple[int, str] | None = None,
    ) -> None:
        super().__init__()
        self._target = target
        self._path = chain_path
        self._board = board
        self._clock = clock
        self._latest = latest
        self._cosigned = 0
        self._kick_pending = False
        self._retry: Timer | None = None  # a kick scheduled: a retry or the pace
        self._unreachable = False  # the last submission got no answer: backing off
        self._last_start = float("-inf")
        self._delay = RETRY_FIRST_S
        self._client: httpx.Client | None = None
        self._leaves = Leaves(chain_path)

    def on_start(self) -> None:
        self._client = http_client()
        try:
            self._cosigned = cosigned_size(self._path, self._target.key)
        except ChainError as e:
            log.warning("witness %s: cannot read its cosignatures: %s", self._target.name, e)
        self._board.update(self._target.name, cosigned_size=self._cosigned)
        if self._latest is not None:
            self._board.checkpoint(self._latest[0])
            self._kick()

    def on_stop(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
        if self._client is not None:
            self._client.close()
        self._leaves.close()

    def on_receive(self, message: Any) -> None:
        if isinstance(message, Checkpoint):
            if self._latest is None or message.tree_size > self._latest[0]:
                self._latest = (message.tree_size, message.note)
            if self._retry is not None and not self._unreachable:
                self._retry.cancel()  # a refusal's slow retry or the pace: decided anew
                self._retry, self._kick_pending = None, False
            if self._retry is None:  # while backing off, the retry takes the newest
                wait = self._last_start + MIN_INTERVAL_S - self._clock.monotonic()
                if wait > 0 and not self._kick_pending:
                    self._kick_after(wait)
                else:
                    self._kick()
        elif isinstance(message, _Kick):
            self._kick_pending = False
            self._submit()
        elif isinstance(message, _Flush):
            if not self._unreachable:  # a pace or refusal timer gives way to the flush
                if self._retry is not None:
                    self._retry.cancel()
                self._submit()
        else:
            raise TypeError(f"WitnessSubmitter takes Checkpoint, not {type(message).__name__}")

    def _kick(self) -> None:
        if not self._kick_pending:
            self._kick_pending = True
            self.actor_ref.tell(_Kick())

    def _submit(self) -> None:
        self._retry = None
        if self._latest is None or self._latest[0] <= self._cosigned or self._client is None:
            return
        name = self._target.name
        self._last_start = self._clock.monotonic()
        done = submit(
            self._client,
            self._target,
            self._path,
            self._latest,
            self._cosigned,
            leaves=self._leaves,
        )
        if done.outcome is Outcome.COSIGNED:
            self._unreachable = False
            self._cosigned = done.witness_size or self._cosigned
            self._delay = RETRY_FIRST_S
            self._board.update(
                name, cosigned_size=self._cosigned, last_error=None,
                last_success_ns=self._clock.wall_ns(),
            )  # fmt: skip
            return
        if done.outcome is Outcome.AHEAD and done.witness_size is not None:
            self._cosigned = done.witness_size  # submit again once the chain is past it
        self._board.update(name, last_error=f"{done.outcome.value}: {done.detail}")
        log.warning("witness %s (%s): %s", name, self._target.url, done.detail)
        self._unreachable = done.outcome is Outcome.UNREACHABLE
        if self._unreachable:
            self._schedule_retry()
        elif done.outcome is not Outcome.AHEAD:
            self._kick_after(REFUSED_RETRY_S)

    def _schedule_retry(self) -> None:
        delay = self._delay * (1 + random.uniform(0, RETRY_JITTER))  # noqa: S311 - not secret
        self._delay = min(self._delay * 2, RETRY_CAP_S)
        self._kick_after(delay)

    def _kick_after(self, delay: float) -> None:
        ref = self.actor_ref

        def again() -> None:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(_Kick())

        self._kick_pending = True
        self._retry = self._clock.call_later(delay, again)


class Witnessing:
    """The node's witness submitters, and what the chain writer calls with each checkpoint."""

    def __init__(
        self,
        targets: Sequence[WitnessTarget],
        chain_path: str | os.PathLike[str],
        clock: Clock,
        latest: tuple[int, str] | None = None,
    ) -> None:
        """Start one submitter per target; each submits ``latest`` (the newest
        stored checkpoint) first if its witness has not cosigned it."""
        self.board = WitnessBoard(targets)
        self._refs = [
            WitnessSubmitter.start(t, chain_path, self.board, clock, latest) for t in targets
        ]

    def offer(self, checkpoint: Checkpoint) -> None:
        """Hand a new checkpoint to every submitter (never blocks; safe on any thread)."""
        self.board.checkpoint(checkpoint.tree_size)
        for ref in self._refs:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(checkpoint)

    def stop(self, flush_s: float = SHUTDOWN_FLUSH_S) -> None:
        """Give the submitters up to `flush_s` seconds (together) to submit the newest
        checkpoint (the one the chain writer signed as it closed), then stop them
        without waiting for a submission in flight."""
        flushes = []
        for ref in self._refs:
            with contextlib.suppress(pykka.ActorDeadError):
                flushes.append(ref.ask(_Flush(), block=False))
        deadline = time.monotonic() + flush_s
        for flush in flushes:
            try:
                flush.get(timeout=max(0.0, deadline - time.monotonic()))
            except (pykka.Timeout, pykka.ActorDeadError):
                continue  # the next boot submits it
            except Exception:  # a shutdown goes on whatever one submitter raised
                log.exception("a witness submitter failed at shutdown")
        for ref in self._refs:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.stop(block=False)
