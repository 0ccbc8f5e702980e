"""An instance's captured output (adapters/proc/output.py): the tail, then what is appended.

A server writes its stdout and stderr to files in its working directory
``<data_dir>/instances/<id>/``. The node's reader truncates a file that grows
past its limit (keeping the tail aside); a follower that finds the file
shorter than what it read starts again at its beginning.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import anyio

from infervisor.adapters.proc.output import log_paths

__all__ = ["CHUNK", "POLL_S", "STREAMS", "follow_log", "log_file"]

STREAMS = ("stderr", "stdout")
#: Bytes read at once.
CHUNK = 64 * 1024
#: Seconds between looks at a followed file that has not grown.
POLL_S = 0.25


def log_file(data_dir: Path, instance_id: str, stream: str) -> Path:
    """The current log file of ``stream`` (``stdout`` or ``stderr``) of the instance."""
    out, err = log_paths(str(data_dir / "instances" / instance_id))
    return Path(out if stream == "stdout" else err)


def _read_from(path: Path, offset: int, tail_bytes: int | None) -> tuple[bytes, int]:
    """What the file holds past ``offset`` (at most its last ``tail_bytes``), and the
    offset after it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return b"", 0
    try:
        size = os.fstat(fd).st_size
        if size < offset:  # truncated by the node's reader: start again
            offset = 0
        if tail_bytes is not None:
            offset = max(offset, size - tail_bytes)
        os.lseek(fd, offset, os.SEEK_SET)
        data = os.read(fd, min(CHUNK, max(size - offset, 0)))
    finally:
        os.close(fd)
    return data, offset + len(data)


async def follow_log(
    path: Path, *, tail_bytes: int, follow: bool, stopped: object
) -> AsyncIterator[bytes]:
    """The last ``tail_bytes`` of the file, then (``follow``) what is appended,
    until ``stopped`` (anything with a ``closed`` attribute) says the server stops."""
    data, offset = await anyio.to_thread.run_sync(_read_from, path, 0, tail_bytes)
    if data:
        yield data
    while True:
        data, offset = await anyio.to_thread.run_sync(_read_from, path, offset, None)
        if data:
            yield data
            continue
        if not follow or getattr(stopped, "closed", False):
            return
        await anyio.sleep(POLL_S)
