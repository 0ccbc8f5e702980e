"""A handle on one process that a reused pid cannot fool.

On Linux 5.3 and later a handle is a pidfd: a file descriptor for the very
process it was opened on, which becomes readable when that process exits and
through which a signal reaches that process or nobody. The pidfd is opened
first and the process's start time checked after, so a handle never names a
process that merely got the same pid. Where there are no pidfds (other
systems, older kernels, a sandbox forbidding them) a handle falls back on
psutil: waiting polls, and the start time is checked again right before each
signal, which leaves a window of one system call.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading

import psutil

from .errors import ProcessControlError
from .identity import same_process

__all__ = ["PidHandle"]

_FALLBACK_POLL = 1.0  # s between identity checks while psutil waits for a non-child


def _pidfd_open(pid: int) -> int | None:
    """A pidfd for ``pid``, None where pidfds are unavailable.

    Raises:
        ProcessLookupError: there is no such process.
    """
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        raise
    except (AttributeError, OSError):
        return None


class PidHandle:
    """One process, named by pid and start time (psutil's ``create_time``)."""

    def __init__(self, proc: psutil.Process, start_time: float, fd: int | None) -> None:
        self.pid = proc.pid
        self._proc = proc
        self._start_time = start_time
        self._fd = fd
        self._lock = threading.Lock()  # send and close never race over the descriptor

    @classmethod
    def open(cls, pid: int, start_time: float) -> PidHandle | None:
        """A handle on ``pid`` if it is still the process started at ``start_time``
        (zombies included), else None."""
        try:
            fd = _pidfd_open(pid)
        except ProcessLookupError:
            return None
        proc = same_process(pid, start_time)  # checked after opening: see the module doc
        if proc is None:
            if fd is not None:
                os.close(fd)
            return None
        return cls(proc, start_time, fd)

    def wait(self) -> None:
        """Block until the process has exited (a zombie counts as exited).

        Call :meth:`close` only after this returned (or was never called).
        """
        if self._fd is not None:
            poller = select.poll()
            poller.register(self._fd, select.POLLIN)
            while not poller.poll():
                pass
            return
        while not self._exited_within(_FALLBACK_POLL):
            pass

    def _exited_within(self, timeout: float) -> bool:
        try:
            self._proc.wait(timeout)
        except psutil.TimeoutExpired:
            return self._gone()
        except psutil.Error:
            pass
        return True

    def _gone(self) -> bool:
        try:
            # is_running() is False once the pid names another process.
            return not self._proc.is_running() or self._proc.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    def send(self, sig: int) -> bool:
        """Send ``sig`` to this very process; False if it is gone.

        Raises:
            ProcessControlError: not permitted.
        """
        try:
            with self._lock:
                if self._fd is not None:
                    signal.pidfd_send_signal(self._fd, sig)
                elif same_process(self.pid, self._start_time) is not None:
                    os.kill(self.pid, sig)
                else:
                    return False
        except ProcessLookupError:
            return False
        except PermissionError as e:
            name = signal.Signals(sig).name
            raise ProcessControlError(f"not permitted to send {name} to pid {self.pid}: {e}") from e
        return True

    def close(self) -> None:
        """Release the pidfd (idempotent)."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
