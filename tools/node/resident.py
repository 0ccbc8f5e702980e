"""The resident-models file: what the node has loaded, for Nomad, Kubernetes and scripts.

On each change of what is loaded (an instance placed, unloaded, or changing
state), the node rewrites ``DATA_DIR/resident.json`` and, when ``[node]
features_file`` is set, a Kubernetes node-feature-discovery local feature
file (its ``features.d`` format: ``key=value`` lines, ``#`` comments, a
``# +expiry-time=`` directive in RFC 3339). Both are written atomically: a
dot-file beside the target, fsynced, then renamed over it (NFD ignores dot
files), so a reader sees the old file or the new one, never half of one.

Both are derived from the projection: each durable event the chain writer
reports is folded with :func:`infervisor.replay.apply` into a
:class:`~infervisor.replay.NodeState` (rebuilt from the chain when the
writer thread starts), so a file is only ever written after the events it
shows are durable. A crash between the append and the write leaves an older
file; the next change or the next boot rewrites it (the boot always does).
The feature file expires :data:`FEATURES_EXPIRY_S` after it was written and
is written again every half of that while the node works, so the labels of
a node that died go stale and NFD drops them.

``resident.json`` (``format`` 1)::

    {"format": 1, "node_id": "gpu-01", "seq": 812, "written_at": "2026-12-03T01:02:03Z",
     "instances": [{"instance_id": "...", "role": "chat", "flavor": "llamacpp",
                    "mode": "managed", "model": "tiny" | null, "state": "running",
                    "desired": "running", "host": "127.0.0.1", "port": 8080}]}
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from infervisor.chain import StoredEvent
from infervisor.replay import EventDecodeError, NodeState, ReplayError, apply, rebuild
from infervisor.replay.lifecycle import LifecycleState

__all__ = [
    "FEATURES_EXPIRY_S",
    "LABEL_PREFIX",
    "RESIDENT_FILE",
    "ResidentFiles",
    "features_text",
    "resident_json",
    "write_atomically",
]

log = logging.getLogger(__name__)

#: The JSON file's name in the data directory.
RESIDENT_FILE = "resident.json"
#: The namespace of the node labels the feature file asks for.
LABEL_PREFIX = "infervisor.io"
#: How long NFD keeps the feature file's labels after it was written, seconds.
FEATURES_EXPIRY_S = 600.0

_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def instances_of(state: NodeState) -> list[dict[str, Any]]:
    """What each instance is, as the files show it (ordered by id)."""
    out = []
    for iid, inst in sorted(state.instances.items()):
        spec = inst.spec
        out.append(
            {
                "instance_id": iid,
                "role": spec.get("role"),
                "flavor": spec.get("flavor"),
                "mode": spec.get("mode", "managed"),
                "model": spec.get("model"),
                "state": str(inst.lifecycle),
                "desired": str(inst.desired),
                "host": spec.get("host", "127.0.0.1"),
                "port": spec.get("port"),
            }
        )
    return out


def resident_json(state: NodeState, now: datetime) -> str:
    """``resident.json``'s text for ``state`` (see the module docstring)."""
    body = {
        "format": 1,
        "node_id": state.node_id,
        "seq": state.head_seq,
        "written_at": _rfc3339(now),
        "instances": instances_of(state),
    }
    return json.dumps(body, indent=2) + "\n"


def label_value(text: str) -> str | None:
    """``text`` as a Kubernetes label value or name part (63 characters of
    ``[A-Za-z0-9._-]``, alphanumeric at both ends); None when nothing is left."""
    cleaned = _LABEL_UNSAFE.sub("-", text)[:63].strip("-._")
    return cleaned or None


def features_text(state: NodeState, now: datetime) -> str:
    """The NFD feature file for ``state``: a label per model served by a running
    instance (``infervisor.io/model.<name>=true``), their count, the node id."""
    expiry = datetime.fromtimestamp(now.timestamp() + FEATURES_EXPIRY_S, UTC)
    lines = [
        f"# infervisor: models resident on node {state.node_id} at seq {state.head_seq}",
        "# written by the node on each change (docs/deploy.md, 'Resident models')",
        f"# +expiry-time={_rfc3339(expiry)}",
    ]
    if (node := label_value(state.node_id)) is not None:
        lines.append(f"{LABEL_PREFIX}/node-id={node}")
    running = [i for i in state.instances.values() if i.lifecycle is LifecycleState.RUNNING]
    lines.append(f"{LABEL_PREFIX}/running={len(running)}")
    models = {m for i in running if (m := label_value(str(i.spec.get("model") or "")))}
    lines += [f"{LABEL_PREFIX}/model.{m[:57].rstrip('-._')}=true" for m in sorted(models)]
    return "\n".join(lines) + "\n"


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a dot-file beside ``path``, fsync it, rename it over ``path``.

    Raises:
        OSError: the folder is missing or not writable.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    with contextlib.suppress(OSError):
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class ResidentFiles:
    """Keeps the resident-models files up to date from the chain's events.

    :meth:`observe` is the chain writer's event observer (quick: it queues);
    a daemon thread started by :meth:`start` rebuilds the state from
    ``chain_path``, writes both files, then folds each queued event and
    rewrites them when what they show changed. A failed write is logged and
    tried again at the next change.

    Args:
        chain_path: the node's chain (read once when the thread starts).
        data_dir: where ``resident.json`` goes.
        features_file: the NFD feature file's path (None: none).
        alive: whether the node still works (the feature file's expiry is
            renewed only while it does).
        on_change: called with the state after each write (the ``STATUS=`` line).
    """

    def __init__(
        self,
        chain_path: Path,
        data_dir: Path,
        features_file: Path | None = None,
        *,
        alive: Callable[[], bool] = lambda: True,
        on_change: Callable[[NodeState], None] | None = None,
    ) -> None:
        self._chain_path = chain_path
        self._json_path = data_dir / RESIDENT_FILE
        self._features_path = features_file
        self._alive = alive
        self._on_change = on_change
        self._inbox: queue.SimpleQueue[StoredEvent | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._shown: Any = None

    def observe(self, stored: StoredEvent) -> None:
        """The chain writer's observer: one more durable event."""
        self._inbox.put(stored)

    def start(self) -> None:
        """Start the writer thread (a daemon: it holds nothing that must be flushed)."""
        self._thread = threading.Thread(target=self._run, name="resident-files", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Write what the events queued so far show, then end the thread."""
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout=10.0)

    def _run(self) -> None:
        state = self._rebuild()
        if state is None:
            return
        self._write(state, force=True)
        renew_s = FEATURES_EXPIRY_S / 2
        while True:
            try:
                stored = self._inbox.get(timeout=renew_s)
            except queue.Empty:
                if self._alive():
                    self._write(state, force=True)
                continue
            if stored is None:
                return
            state = self._fold(state, stored)
            if self._inbox.empty():
                self._write(state, force=False)

    def _rebuild(self) -> NodeState | None:
        try:
            return rebuild(self._chain_path)
        except Exception:
            log.exception("resident files: the chain could not be read; not written")
            return None

    def _fold(self, state: NodeState, stored: StoredEvent) -> NodeState:
        if stored.seq <= state.head_seq:
            return state  # already in the state rebuilt at start
        try:
            return apply(state, stored)
        except (ReplayError, EventDecodeError) as e:
            log.warning("resident files: event %d not folded (%s); rebuilding", stored.seq, e)
            return self._rebuild() or state

    def _write(self, state: NodeState, *, force: bool) -> None:
        shown = instances_of(state)
        if not force and shown == self._shown:
            return
        now = datetime.now(UTC)
        try:
            write_atomically(self._json_path, resident_json(state, now))
            if self._features_path is not None:
                write_atomically(self._features_path, features_text(state, now))
        except OSError as e:
            log.warning("resident files not written: %s; trying again at the next change", e)
            return
        self._shown = shown
        if self._on_change is not None:
            try:
                self._on_change(state)
            except Exception:
                log.exception("resident files: the change callback failed")


def _rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
