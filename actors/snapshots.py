"""The node's snapshot file: written beside the chain with its checkpoints, read at boot.

``<data_dir>/state.snapshot`` holds the projection at one event of the chain
(replay/snapshot.py gives the format and what binds it to the chain). It is
a cache, never evidence: it lives outside ``chain.db``, so what auditors copy
and verify is the same with or without it, and a node without it (or with
one it refuses) replays the whole chain.

Written atomically: to a temporary file in the same folder, fsynced, renamed
over the old one, the folder fsynced. A node killed while writing leaves the
previous snapshot whole and a temporary file, removed at the next start.

:class:`Snapshotter` takes the snapshots on a thread of its own: the chain
writer offers it each checkpoint it signs (a call that never blocks), and it
folds the events since its last snapshot onto that one, at most once every
``min_interval_s`` seconds, and once more at the chain's head when the node
stops.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infervisor.chain import SqliteChain
from infervisor.chain.errors import ChainError
from infervisor.replay import Folder, NodeState, ReplayError
from infervisor.replay.events import EventDecodeError
from infervisor.replay.snapshot import SNAPSHOT_FILE, encode_snapshot

__all__ = ["MIN_INTERVAL_S", "Snapshotter", "read_snapshot_file", "write_snapshot"]

log = logging.getLogger(__name__)
#: The least time between two snapshots, seconds (each costs a fold of the
#: events since the last one and an encoding of the whole state).
MIN_INTERVAL_S = 5.0
_TMP_PREFIX = f".{SNAPSHOT_FILE}."
_TMP_SUFFIX = ".tmp"


def snapshot_path(data_dir: str | os.PathLike[str]) -> Path:
    """Where the node's snapshot lives: ``<data_dir>/state.snapshot``."""
    return Path(data_dir) / SNAPSHOT_FILE


def read_snapshot_file(data_dir: str | os.PathLike[str]) -> bytes | None:
    """The snapshot file's bytes, or None when there is none or it cannot be read
    (logged: the node then replays the whole chain)."""
    path = snapshot_path(data_dir)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("snapshot %s cannot be read (%s)", path, e)
        return None


def write_snapshot(data_dir: str | os.PathLike[str], state: NodeState) -> bool:
    """Write `state` as the node's snapshot, atomically (see the module docstring).

    Returns False (logged) when it could not be encoded or written; the previous
    snapshot, if any, is then left as it was.
    """
    try:
        data = encode_snapshot(state)
    except ValueError as e:
        log.warning("no snapshot at seq %d: %s", state.head_seq, e)
        return False
    folder = Path(data_dir)
    tmp = folder / f"{_TMP_PREFIX}{os.getpid()}.{threading.get_ident()}{_TMP_SUFFIX}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, snapshot_path(folder))
        _fsync_dir(folder)
    except OSError as e:
        seq = state.head_seq
        log.warning("the snapshot at seq %d could not be written to %s: %s", seq, folder, e)
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False
    return True


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_leftovers(data_dir: str | os.PathLike[str]) -> None:
    """Remove temporary files a snapshot write killed midway left behind."""
    for leftover in Path(data_dir).glob(f"{_TMP_PREFIX}*{_TMP_SUFFIX}"):
        with contextlib.suppress(OSError):
            leftover.unlink()


class Snapshotter:
    """Takes the node's snapshots on its own thread (see the module docstring).

    Args:
        chain_path: the chain; the snapshot goes to its folder.
        state: the state the node booted on (the chain's head then).
        take_now: take a snapshot at once (the boot replayed many events).
        min_interval_s: the least time between two snapshots, seconds.
        monotonic: the clock the interval is measured on, seconds.
    """

    def __init__(
        self,
        chain_path: str | os.PathLike[str],
        state: NodeState,
        *,
        take_now: bool = False,
        min_interval_s: float = MIN_INTERVAL_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._path = Path(chain_path)
        self._folder = Folder.resume(state)
        self._written = state.head_seq if not take_now else -1
        self._interval = min_interval_s
        self._monotonic = monotonic
        self._last = monotonic() - min_interval_s
        self._due = threading.Event()
        self._stopping = threading.Event()
        self._failed = False
        if take_now:
            self._due.set()
        remove_leftovers(self._path.parent)
        self._thread = threading.Thread(target=self._run, name="snapshotter", daemon=True)
        self._thread.start()

    def offer(self, _checkpoint: Any = None) -> None:
        """A checkpoint was signed: take a snapshot once the interval allows. Never blocks."""
        self._due.set()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Take a last snapshot at the chain's head (call it once the writer stopped)
        and end the thread; waits at most `timeout_s` seconds."""
        self._stopping.set()
        self._due.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._due.wait()
            wait = self._last + self._interval - self._monotonic()
            if wait > 0 and self._stopping.wait(wait):
                break
            self._due.clear()
            self.take()
        self.take()

    def take(self) -> bool:
        """Fold the events stored since the last snapshot and write one at the head.

        Returns True when a snapshot was written. A failure is logged and ends
        snapshots for this run (the last one written stands).
        """
        self._last = self._monotonic()
        if self._failed:
            return False
        try:
            with SqliteChain.open_readonly(self._path) as chain:
                feed = self._folder.feed
                for stored in chain.events(after=self._folder.head_seq):
                    feed(stored)
        except (ChainError, ReplayError, EventDecodeError):
            self._failed = True
            log.exception("snapshots stopped: the chain could not be folded past its last one")
            return False
        state = self._folder.state()
        if state.head_seq == self._written:
            return False
        if write_snapshot(self._path.parent, state):
            self._written = state.head_seq
            return True
        return False
