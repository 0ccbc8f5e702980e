"""Spawn and handshake: starting a server through the exit-status shim.

The node does not start the server itself: it starts the shim (``shim.py``,
in a session of its own, through the :class:`~.system.System`'s ``spawn``),
moves it into the instance's ``shim`` cgroup, hands it the launch
configuration on its stdin and waits for its one-byte report on its stdout
(``L``: launched and recorded; ``E``: could not start, the exit record says
why). A launch that fails leaves nothing running: the shim, the server it may
have started and every process carrying the launch token are killed. See
``docs/process-supervision.md`` and the shim's docstring for the protocol.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import math
import os
import select
import signal
import subprocess
import sys
from collections.abc import Mapping

import msgspec

from .cgroups import InstanceCgroup
from .errors import ProcessControlError, SpawnError
from .output import STDERR_LOG, create_logs
from .pgroup import KILL_CONFIRM, kill_group, kill_identity
from .plan import LaunchPlan
from .records import (
    RECORD_POLL,
    TOKEN_VAR,
    LaunchRecord,
    alive,
    prepare_launch_dir,
    read_exit_record,
    read_launch_record,
)
from .system import REAL, Child, Spawn

__all__ = ["LAUNCH_REPORT_TIMEOUT", "SHIM", "carriers", "kill_carriers", "launch"]

#: The exit-status shim, run by path (``os.path.realpath``: an editable install
#: may link this module from elsewhere).
SHIM = os.path.join(os.path.dirname(os.path.realpath(__file__)), "shim.py")
#: Seconds a spawn waits for the shim to report the launch.
LAUNCH_REPORT_TIMEOUT = 5.0

_REPORT_LAUNCHED = b"L"
_log = logging.getLogger(__name__)


def _exec_problem(program: str, cwd: str, env: Mapping[str, str]) -> str | None:
    """Why ``program`` certainly cannot be executed from ``cwd`` with ``env``'s PATH
    (as subprocess resolves it), or None if it may be. A check before any file is
    written; the shim reports whatever it misses (a bad interpreter line, ...)."""
    if os.path.dirname(program):
        candidates = [os.path.join(cwd, program)]
    else:
        candidates = [os.path.join(cwd, d, program) for d in os.get_exec_path(dict(env))]
    denied = False
    for path in candidates:
        try:
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return None
        except ValueError as e:  # a NUL byte
            return str(e)
        denied = denied or os.path.exists(path)
    if denied:
        return f"not executable ({os.strerror(errno.EACCES)})"
    return f"no such program ({os.strerror(errno.ENOENT)})"


def _start_shim(cwd: str, token: str, err: int, out: int) -> Child:
    """The shim, started in a session of its own: stdin the configuration pipe,
    stdout the report pipe, stderr the server's stderr log; ``out`` (the stdout
    log) is passed on for the server. Raises OSError."""
    argv = [sys.executable, "-I", "-S", SHIM]
    return REAL.spawn(Spawn(argv, {TOKEN_VAR: token}, cwd, stderr=err, pass_fds=(out,)))


def _above_stdio(fd: int) -> int:
    """``fd`` moved to a number above 2 (close-on-exec); the original is closed.

    Raises:
        OSError: no descriptor is free.
    """
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(fd)


def _send(shim: Child, config: bytes) -> None:
    assert shim.stdin is not None
    # A shim that died first is noticed by the report (end of file).
    with contextlib.suppress(BrokenPipeError):
        shim.stdin.write(config)
    with contextlib.suppress(BrokenPipeError):
        shim.stdin.close()


def _await_report(shim: Child, timeout: float) -> bytes | None:
    """The shim's one-byte report, ``b""`` if it closed the pipe without one,
    None if nothing came within ``timeout`` seconds.

    ``poll(2)``, not ``select(2)``: select() cannot watch a descriptor numbered
    1024 (FD_SETSIZE) or above, which a node holding many API connections or
    log files reaches (issue 17); poll() has no such limit and needs no
    descriptor of its own (an epoll selector would, and could fail with EMFILE).
    """
    assert shim.stdout is not None
    fd = shim.stdout.fileno()
    poller = select.poll()
    poller.register(fd, select.POLLIN)  # POLLHUP/POLLERR are reported regardless
    deadline = REAL.monotonic() + timeout
    while (remaining := deadline - REAL.monotonic()) > 0:
        if poller.poll(max(1, math.ceil(remaining * 1000))):  # milliseconds
            return os.read(fd, 1)
    return None


def _prepare_cgroup(plan: LaunchPlan, cgroup: InstanceCgroup | None) -> None:
    """Make the instance's cgroups afresh (so their counters, OOM kills and CPU
    time, count this launch only); whatever is still in them is the instance's
    own leftover (an earlier launch): it is killed before a new one starts.

    Raises:
        SpawnError: the cgroups could not be made or emptied.
    """
    if cgroup is None:
        return
    try:
        cgroup.create()
        left = cgroup.members()
        if left:
            _log.warning(
                "%s: killing %s left in its cgroup before a launch", cgroup.iid, sorted(left)
            )
            cgroup.kill(everything=True)
        cgroup.remove()
        cgroup.create()
    except ProcessControlError as e:
        raise SpawnError(f"cannot start {plan.program}: {e}") from e


def _move_shim(plan: LaunchPlan, shim: Child, cgroup: InstanceCgroup | None) -> None:
    """Move the shim into the instance's ``shim`` cgroup before it is given its
    configuration (so it cannot start a server outside).

    Raises:
        SpawnError: it could not be moved (the shim, given nothing, is ended).
    """
    for path in cgroup.shim_procs() if cgroup is not None else ():
        assert cgroup is not None
        try:
            cgroup.system.cg_write(path, str(shim.pid))
        except OSError as e:
            shim.kill()  # given no configuration: it starts nothing
            shim.wait()
            for pipe in (shim.stdin, shim.stdout):
                if pipe is not None:
                    pipe.close()
            why = f"cannot move the launch shim into {path}: {e.strerror or e}"
            raise SpawnError(f"cannot start {plan.program}: {why}") from e


def launch(
    plan: LaunchPlan, token: str, inject: bool, cgroup: InstanceCgroup | None = None
) -> tuple[Child, LaunchRecord]:
    """Start ``plan`` through the shim (in ``cgroup`` when given); the shim's
    handle and the launch record.

    Raises:
        SpawnError: see :meth:`~.handles.ManagedProcess.spawn`.
    """
    if not os.path.isdir(plan.cwd):
        raise SpawnError(f"cannot start {plan.program}: working directory {plan.cwd} is missing")
    env = {**plan.env, TOKEN_VAR: token} if inject else dict(plan.env)
    argv = msgspec.structs.replace(plan, env=env).argv()  # the limits trampoline embeds env
    problem = _exec_problem(argv[0], plan.cwd, env)
    if problem is not None:
        raise SpawnError(f"cannot start {plan.program}: {problem}")
    _prepare_cgroup(plan, cgroup)
    try:
        prepare_launch_dir(plan.cwd, token)
        out, err = create_logs(plan.cwd)
        if out <= 2:  # a node started with fd 0, 1 or 2 closed: keep clear of the shim's
            out = _above_stdio(out)
    except OSError as e:
        raise SpawnError(f"cannot start {plan.program}: cannot write in {plan.cwd}: {e}") from e
    try:
        shim = _start_shim(plan.cwd, token, err, out)
    except OSError as e:
        raise SpawnError(f"cannot start {plan.program}: the launch shim did not start: {e}") from e
    finally:
        os.close(out)
        os.close(err)
    _move_shim(plan, shim, cgroup)
    config = {"argv": argv, "env": env, "stdout_fd": out}
    if cgroup is not None:
        config["cgroup_procs"] = cgroup.server_procs()
    _send(shim, msgspec.json.encode(config))
    try:
        report = _await_report(shim, LAUNCH_REPORT_TIMEOUT)
    except OSError:
        report = b""
    finally:
        assert shim.stdout is not None
        shim.stdout.close()
    if report == _REPORT_LAUNCHED and (record := read_launch_record(plan.cwd, token)) is not None:
        return shim, record
    raise _launch_failed(plan, token, shim, report)


def _launch_failed(plan: LaunchPlan, token: str, shim: Child, report: bytes | None) -> SpawnError:
    """Leave nothing of a failed launch running; the error saying why it failed."""
    cleanup = ""
    try:
        _abandon(plan.cwd, token, shim, patient=report is not None)
    except ProcessControlError as e:
        cleanup = f" (and cleaning up failed: {e})"
    ended = read_exit_record(plan.cwd, token)
    if ended is not None and ended.error is not None:
        why = ended.error
    elif report is None:
        why = f"the launch shim did not report within {LAUNCH_REPORT_TIMEOUT:g} s"
    elif report == _REPORT_LAUNCHED:
        why = "the launch shim's record of it is unreadable"
    else:
        why = f"the launch shim ended with status {shim.returncode} before starting it"
        why += _last_line(os.path.join(plan.cwd, STDERR_LOG))
    return SpawnError(f"cannot start {plan.program}: {why}{cleanup}")


def _abandon(cwd: str, token: str, shim: Child, *, patient: bool) -> None:
    """End the shim (given :data:`KILL_CONFIRM` s to end by itself if ``patient``),
    the server it recorded or started, and every process carrying the token.

    Raises:
        ProcessControlError: something could not be killed.
    """
    if patient:
        with contextlib.suppress(subprocess.TimeoutExpired):
            shim.wait(KILL_CONFIRM)
    children: dict[int, float] = {}
    if shim.poll() is None:
        # Its server may exist unrecorded (and, without an explicit token, unmarked).
        children = REAL.children(shim.pid)
        shim.kill()
        try:
            shim.wait(KILL_CONFIRM)
        except subprocess.TimeoutExpired as e:
            raise ProcessControlError(f"launch shim {shim.pid} outlived SIGKILL") from e
    launched = read_launch_record(cwd, token)
    if launched is not None:
        kill_identity(launched.identity())
    kill_carriers({**children, **carriers(token)})


def _last_line(path: str) -> str:
    """``": <the last line of the file>"`` (at most 300 characters), or ``""``."""
    try:
        with open(path, "rb") as f:
            f.seek(max(os.fstat(f.fileno()).st_size - 4096, 0))
            lines = f.read().decode("utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return f": {lines[-1][:300]}" if lines else ""


def carriers(token: str) -> dict[int, float]:
    """Live processes (other than this one) whose environment holds ``TOKEN_VAR=token``:
    pid -> start time. One scan of the process table."""
    return REAL.carriers(TOKEN_VAR, token)


def kill_carriers(procs: Mapping[int, float]) -> None:
    """SIGKILL each process (pid -> start time, identity-checked) and, when it leads
    a process group (a shim or a server), that group; block until all are gone.

    Raises:
        ProcessControlError: not permitted, or one outlived SIGKILL for 5 s.
    """
    for pid, started in procs.items():
        if not alive(pid, started):
            continue
        if REAL.pgid(pid) == pid:
            kill_group(pid, signal.SIGKILL)
        REAL.signal_exact(pid, started, signal.SIGKILL)
    deadline = REAL.monotonic() + KILL_CONFIRM
    while left := [pid for pid, started in procs.items() if alive(pid, started)]:
        if REAL.monotonic() >= deadline:
            raise ProcessControlError(f"pids {left} carrying a launch token outlived SIGKILL")
        REAL.sleep(RECORD_POLL)
