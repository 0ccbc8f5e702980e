"""Spawning and terminating a managed model server: the adapters' one OS seam.

Source of the behaviour: ``reference/infer_lifecycle.rs.txt`` (``spawn`` builds a
``LaunchSpec`` with a cleared environment and ``OUTPUT_LIMIT`` bytes kept per
stream; ``terminate(grace)`` stops a server and collects its exit; a process is
only ever one this node spawned itself).

A server runs in its own session and process group (its pgid is its pid), so
terminating it reaches every child it started. Three daemon threads serve each
process: two drain stdout and stderr into bounded tail buffers, one blocks in
``wait()`` and reports the exit once. Every OS error is translated here:
callers see :class:`SpawnError` and :class:`ProcessControlError` only.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import IO

import msgspec

from .errors import ProcessControlError, SpawnError
from .limits import ProcLimits, wrap_argv
from .pgroup import (
    KILL_CONFIRM,
    ProcessIdentity,
    boot_id,
    find_process,
    group_members,
    identity_of,
    kill_group,
    terminate_group,
    terminate_identity,
    tree_rss_bytes,
)

__all__ = [
    "ExitInfo",
    "LaunchPlan",
    "ManagedProcess",
    "ProcessIdentity",
    "boot_id",
    "find_process",
    "group_members",
    "kill_group",
    "launch_env",
    "terminate_group",
    "terminate_identity",
    "tree_rss_bytes",
]

_log = logging.getLogger(__name__)

_TAIL_BYTES = 4096  # ExitInfo.output_tail
_READ_CHUNK = 65536
_READER_DRAIN = 0.5  # s an exit report waits for the readers to reach end of output
_EMPTY: Mapping[str, str] = MappingProxyType({})


class LaunchPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What to run: argv, the complete environment, the working directory.

    ``output_limit`` is the number of bytes kept per stream (the tail).
    """

    program: str
    args: list[str]
    env: dict[str, str]
    cwd: str
    output_limit: int = 1024 * 1024
    limits: ProcLimits | None = None
    run_as: tuple[int, int] | None = None

    def argv(self) -> list[str]:
        """What is executed: the program and its arguments, through the limits
        trampoline when limits or a user are set."""
        argv = [self.program, *self.args]
        if self.limits is None and self.run_as is None:
            return argv
        return wrap_argv(argv, self.limits or ProcLimits(), self.run_as)


def launch_env(
    passthrough: Sequence[str] = ("HOME", "PATH"), extra: Mapping[str, str] = _EMPTY
) -> dict[str, str]:
    """A cleared environment: only ``passthrough`` names copied from ``os.environ``
    (when set) plus ``extra``; an extra entry wins over a passed-through one."""
    env = {name: os.environ[name] for name in passthrough if name in os.environ}
    env.update(extra)
    return env


class ExitInfo(msgspec.Struct, frozen=True):
    """How a process ended: ``exit_code`` when it exited, ``signal`` when killed by one.

    ``output_tail`` holds the last 4096 bytes of its stdout followed by its
    stderr (stderr last, so an error message survives), decoded as UTF-8 with
    undecodable bytes replaced.
    """

    pid: int
    exit_code: int | None
    signal: int | None
    output_tail: str


class _Tail:
    """The last ``limit`` bytes of a stream; ``dropped`` counts the bytes let go."""

    def __init__(self, limit: int) -> None:
        self._buf = bytearray()
        self._limit = max(limit, 0)
        self._lock = threading.Lock()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        with self._lock:
            self._buf += chunk
            excess = len(self._buf) - self._limit
            if excess > 0:
                del self._buf[:excess]
                self.dropped += excess

    def data(self) -> bytes:
        with self._lock:
            return bytes(self._buf)


def _decode(data: bytes, cut: bool) -> str:
    """UTF-8 with replacement; a head ``cut`` mid-character loses its continuation bytes."""
    if cut:
        start = 0
        while start < min(3, len(data)) and 0x80 <= data[start] < 0xC0:
            start += 1
        data = data[start:]
    return data.decode("utf-8", errors="replace")


def _drain(stream: IO[bytes], tail: _Tail) -> None:
    fd = stream.fileno()
    try:
        while chunk := os.read(fd, _READ_CHUNK):
            tail.add(chunk)
    except OSError:
        pass  # the pipe went away: nothing more to keep
    finally:
        stream.close()


def _popen(plan: LaunchPlan) -> subprocess.Popen[bytes]:
    if not os.path.isdir(plan.cwd):
        raise SpawnError(f"cannot start {plan.program}: working directory {plan.cwd} is missing")
    try:
        return subprocess.Popen(
            plan.argv(),
            env=plan.env,
            cwd=plan.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except FileNotFoundError as e:
        raise SpawnError(f"cannot start {plan.program}: no such program ({e.strerror})") from e
    except PermissionError as e:
        raise SpawnError(f"cannot start {plan.program}: not executable ({e.strerror})") from e
    except OSError as e:
        raise SpawnError(f"cannot start {plan.program}: {e}") from e


class ManagedProcess:
    """A server process this node spawned; create it with :meth:`spawn`."""

    identity: ProcessIdentity

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        on_exit: Callable[[ExitInfo], None],
        output_limit: int,
    ) -> None:
        self._popen = popen
        self._on_exit = on_exit
        self._out, self._err = _Tail(output_limit), _Tail(output_limit)
        self._exited = threading.Event()
        self._info: ExitInfo | None = None
        self._terminating = threading.Lock()
        # Read while the child cannot yet have been reaped, so the pid is still ours.
        self.identity = identity_of(popen.pid)
        self._readers = [self._thread(_drain, s, t) for s, t in self._streams()]
        self._thread(self._wait_and_report)

    @classmethod
    def spawn(cls, plan: LaunchPlan, on_exit: Callable[[ExitInfo], None]) -> ManagedProcess:
        """Start ``plan`` in a new session and process group; returns at once.

        ``on_exit`` is called exactly once, from a waiter thread, as soon as the
        process exits (by itself or through :meth:`terminate`). It must not block
        for long; an exception it raises is logged and dropped.

        Raises:
            SpawnError: naming the program (missing, not executable, bad cwd).
        """
        return cls(_popen(plan), on_exit, plan.output_limit)

    def _streams(self) -> list[tuple[IO[bytes], _Tail]]:
        assert self._popen.stdout is not None
        assert self._popen.stderr is not None
        return [(self._popen.stdout, self._out), (self._popen.stderr, self._err)]

    def _thread(self, target: Callable[..., None], *args: object) -> threading.Thread:
        name = f"{target.__name__.strip('_')}-{self._popen.pid}"
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        t.start()
        return t

    def _wait_and_report(self) -> None:
        code = self._popen.wait()
        # Output still in the pipes is read first; a child that outlived the server
        # and holds a pipe open delays the report by at most _READER_DRAIN seconds.
        drained_by = time.monotonic() + _READER_DRAIN
        for reader in self._readers:
            reader.join(max(drained_by - time.monotonic(), 0.0))
        self._info = ExitInfo(
            pid=self._popen.pid,
            exit_code=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            output_tail=self._exit_tail(),
        )
        self._exited.set()
        try:
            self._on_exit(self._info)
        except Exception:  # noqa: BLE001 -- a caller's bug must not go unseen or kill the waiter
            _log.exception("on_exit callback of pid %d failed", self._popen.pid)

    def _exit_tail(self) -> str:
        out, err = self._out.data(), self._err.data()
        both = out + err
        cut = len(both) > _TAIL_BYTES or bool(self._out.dropped or (not out and self._err.dropped))
        return _decode(both[-_TAIL_BYTES:], cut)

    def exit_info(self) -> ExitInfo | None:
        """How the process ended, or None while it runs (or is being reported)."""
        return self._info

    def wait_exit(self, timeout: float) -> ExitInfo | None:
        """Block up to ``timeout`` seconds for the exit; None if still running."""
        self._exited.wait(max(timeout, 0.0))
        return self._info

    def output(self) -> tuple[str, str]:
        """The kept tails of (stdout, stderr), decoded with replacement."""
        return (
            _decode(self._out.data(), self._out.dropped > 0),
            _decode(self._err.data(), self._err.dropped > 0),
        )

    def dropped_bytes(self) -> tuple[int, int]:
        """Bytes of (stdout, stderr) let go to keep the tails within the limit."""
        return self._out.dropped, self._err.dropped

    def terminate(self, grace: float) -> ExitInfo:
        """Stop the whole process group and return how the server ended (blocking).

        SIGTERM to the group, up to ``grace`` seconds for it to go, then SIGKILL
        until no member is left (deadline 5 s). Idempotent, and safe once the
        process has exited by itself; concurrent calls are serialised.

        Raises:
            ProcessControlError: the group could not be signalled or outlived SIGKILL.
        """
        with self._terminating:
            terminate_group(self.identity.pgid, grace)
            info = self.wait_exit(KILL_CONFIRM)
        if info is None:
            raise ProcessControlError(f"pid {self.identity.pid} was not reaped after SIGKILL")
        return info
