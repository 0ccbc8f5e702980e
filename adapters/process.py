"""Spawning, re-attaching and terminating a managed model server: the adapters' OS seam.

Source of the behaviour: ``reference/infer_lifecycle.rs.txt`` (``spawn`` builds a
``LaunchSpec`` with a cleared environment and ``OUTPUT_LIMIT`` bytes kept per
stream; ``terminate(grace)`` stops a server and collects its exit; a process is
only ever one this node spawned itself).

A server runs in its own session and process group (its pgid is its pid), so
terminating it reaches every child it started; children that leave the group
are tracked as descendants. Its stdout and stderr go to log files in its
working directory, so it outlives the node that started it, and a later node
can :meth:`AttachedProcess.attach` to it. Both kinds of handle satisfy
:class:`ServerProcess`.

The node does not start the server itself: it starts the exit-status shim
(``shim.py``, in a session of its own), whose child the server is for its
whole life. Each launch has a token; the shim records the launch in
``<cwd>/launch/<token>.json`` as soon as the server exists and its exit status
in ``<cwd>/launch/<token>.exit.json`` when it ends, whether or not a node is
alive. So a re-attached server's exit status is known, and
:func:`recover_launch` accounts at boot for a launch whose pid the node never
recorded. See ``docs/process-supervision.md``.

Every OS error is translated here: callers see :class:`SpawnError` and
:class:`ProcessControlError` only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import math
import os
import re
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Protocol, TypeAlias, TypeVar

import msgspec
import psutil

from .cgroups import InstanceCgroup
from .errors import ProcessControlError, SpawnError
from .limits import ProcLimits, wrap_argv
from .output import STDERR_LOG, STDOUT_LOG, create_logs
from .pgroup import (
    KILL_CONFIRM,
    ProcessIdentity,
    boot_id,
    find_process,
    group_members,
    identity_of,
    kill_group,
    same_process,
    terminate_group,
    terminate_identity,
    tree_rss_bytes,
)
from .pidfd import PidHandle
from .proc_table import ProcessTable
from .watch import OUTPUT_LIMIT, ExitInfo, WatchedProcess

__all__ = [
    "EXIT_RECORD_WAIT",
    "KEEP_LAUNCHES",
    "LAUNCH_DIR",
    "LAUNCH_REPORT_TIMEOUT",
    "OUTPUT_LIMIT",
    "SHIM",
    "STDERR_LOG",
    "STDOUT_LOG",
    "TOKEN_VAR",
    "AttachedProcess",
    "ExitInfo",
    "ExitRecord",
    "LaunchEnded",
    "LaunchNeverStarted",
    "LaunchPlan",
    "LaunchRecord",
    "LaunchRecovery",
    "LaunchRunning",
    "ManagedProcess",
    "ProcessIdentity",
    "ServerProcess",
    "boot_id",
    "find_process",
    "group_members",
    "kill_group",
    "launch_env",
    "launch_files",
    "new_token",
    "read_exit_record",
    "read_exit_status",
    "read_launch_record",
    "recover_launch",
    "terminate_group",
    "terminate_identity",
    "tree_rss_bytes",
]

#: The exit-status shim, run by path (``os.path.realpath``: an editable install
#: may link this module from elsewhere).
SHIM = os.path.join(os.path.dirname(os.path.realpath(__file__)), "shim.py")
#: The variable holding the launch token, in the shim's and the server's environment.
TOKEN_VAR = "INFERVISOR_LAUNCH_TOKEN"  # noqa: S105 -- a variable name, not a secret
#: Where the launch and exit records are kept, under the server's working directory.
LAUNCH_DIR = "launch"
#: Seconds :meth:`ManagedProcess.spawn` waits for the shim to report the launch.
LAUNCH_REPORT_TIMEOUT = 5.0
#: Seconds an exit report waits for the shim's exit record once the server is gone.
EXIT_RECORD_WAIT = 2.0
#: Launches (other than the current one) whose records are kept in ``LAUNCH_DIR``.
KEEP_LAUNCHES = 4

_RECORD_POLL = 0.01  # s between looks for a record the shim is about to write
_REPORT_LAUNCHED = b"L"
_REPORT_FAILED = b"E"
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")
_log = logging.getLogger(__name__)

_EMPTY: Mapping[str, str] = MappingProxyType({})


class LaunchPlan(msgspec.Struct, frozen=True, kw_only=True):
    """What to run: argv, the complete environment, the working directory.

    ``output_limit`` is the number of bytes kept per stream (the tail), in
    memory and in the log files in ``cwd``.
    """

    program: str
    args: list[str]
    env: dict[str, str]
    cwd: str
    output_limit: int = OUTPUT_LIMIT
    limits: ProcLimits | None = None
    run_as: tuple[int, int] | None = None

    def argv(self) -> list[str]:
        """What is executed: the program and its arguments, through the limits
        trampoline when limits or a user are set."""
        argv = [self.program, *self.args]
        if self.limits is None and self.run_as is None:
            return argv
        return wrap_argv(argv, self.limits or ProcLimits(), self.run_as, self.env)


def launch_env(
    passthrough: Sequence[str] = ("HOME", "PATH"), extra: Mapping[str, str] = _EMPTY
) -> dict[str, str]:
    """A cleared environment: only ``passthrough`` names copied from ``os.environ``
    (when set) plus ``extra``; an extra entry wins over a passed-through one."""
    env = {name: os.environ[name] for name in passthrough if name in os.environ}
    env.update(extra)
    return env


class ServerProcess(Protocol):
    """What the node holds for a server process, spawned or re-attached."""

    @property
    def identity(self) -> ProcessIdentity: ...

    def exit_info(self) -> ExitInfo | None: ...

    def wait_exit(self, timeout: float) -> ExitInfo | None: ...

    def output(self) -> tuple[str, str]: ...

    def dropped_bytes(self) -> tuple[int, int]: ...

    def track_descendants(self, table: ProcessTable | None = None) -> None: ...

    def survivors(self) -> list[int]: ...

    def settle(self, grace: float) -> None: ...

    def sigterm(self) -> None: ...

    def kill(self) -> None: ...

    @property
    def cgroup(self) -> InstanceCgroup | None: ...

    def terminate(self, grace: float) -> ExitInfo: ...


# ---------------------------------------------------------------- launch records


class LaunchRecord(msgspec.Struct, frozen=True):
    """``<cwd>/launch/<token>.json``, written by the shim as soon as the server exists.

    ``pid`` and ``pgid`` are the server's (equal: it leads its own group);
    ``start_time`` is psutil's ``create_time`` in seconds since the epoch (None
    where the shim could not read it); ``boot_id`` is the kernel's;
    ``shim_pid`` and ``shim_start_time`` name the shim the same way.
    """

    token: str
    pid: int
    pgid: int
    start_time: float | None
    boot_id: str
    shim_pid: int
    shim_start_time: float | None = None

    def identity(self) -> ProcessIdentity:
        """The server's identity (a missing start time is read now, 0.0 if gone)."""
        started = self.start_time
        if started is None:
            started = identity_of(self.pid).start_time
        return ProcessIdentity(self.pid, self.pgid, started, self.boot_id)


class ExitRecord(msgspec.Struct, frozen=True):
    """``<cwd>/launch/<token>.exit.json``, written by the shim once the server is reaped.

    ``exit_code`` when the server exited, ``signal`` when a signal killed it
    (the other None); ``ended_ns`` is nanoseconds since the Unix epoch. When
    the server could not be started at all, ``error`` says why (in the words
    of :class:`SpawnError`, such as ``no such program (No such file or
    directory)``) and ``pid``, ``exit_code`` and ``signal`` are None.
    """

    token: str
    pid: int | None
    exit_code: int | None
    signal: int | None
    ended_ns: int
    error: str | None = None


def new_token() -> str:
    """A fresh launch token: 32 lowercase hex digits (a UUID4)."""
    return uuid.uuid4().hex


_R = TypeVar("_R", LaunchRecord, ExitRecord)


def _check_token(token: str) -> str:
    if not _TOKEN.fullmatch(token):
        raise ValueError(f"launch token {token!r}: 1 to 64 letters, digits, '-' or '_' expected")
    return token


def launch_files(cwd: str, token: str) -> tuple[str, str]:
    """Paths of the (launch, exit) records of launch ``token`` in working directory ``cwd``.

    Raises:
        ValueError: ``token`` is not 1 to 64 letters, digits, ``-`` or ``_``.
    """
    base = os.path.join(cwd, LAUNCH_DIR, _check_token(token))
    return base + ".json", base + ".exit.json"


def _read_record(path: str, kind: type[_R], token: str) -> _R | None:
    try:
        with open(path, "rb") as f:
            record = msgspec.json.decode(f.read(), type=kind)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError) as e:
        _log.warning("ignoring the launch record %s: %s", path, e)
        return None
    return record if record.token == token else None


def read_launch_record(cwd: str, token: str) -> LaunchRecord | None:
    """The launch record of ``token`` in ``cwd``; None if there is none (or it is unreadable).

    Raises:
        ValueError: a malformed token (see :func:`launch_files`).
    """
    return _read_record(launch_files(cwd, token)[0], LaunchRecord, token)


def read_exit_record(cwd: str, token: str) -> ExitRecord | None:
    """The exit record of ``token`` in ``cwd``; None while there is none (or it is unreadable).

    Raises:
        ValueError: a malformed token (see :func:`launch_files`).
    """
    return _read_record(launch_files(cwd, token)[1], ExitRecord, token)


def read_exit_status(cwd: str, token: str) -> tuple[int | None, int | None] | None:
    """``(exit_code, signal)`` of launch ``token`` as its shim recorded it.

    Returns:
        None while no exit has been recorded; ``(None, None)`` when the server
        could not be started (see :attr:`ExitRecord.error`); else exactly one
        of the two is an int.

    Raises:
        ValueError: a malformed token (see :func:`launch_files`).
    """
    record = read_exit_record(cwd, token)
    return None if record is None else (record.exit_code, record.signal)


def _await_exit_record(
    cwd: str, token: str, shim: tuple[int, float | None] | None, timeout: float
) -> ExitRecord | None:
    """The exit record, waiting up to ``timeout`` s for the shim to write it;
    stops early once the shim (pid, start time) is seen gone."""
    deadline = time.monotonic() + timeout
    while (record := read_exit_record(cwd, token)) is None:
        if time.monotonic() >= deadline:
            return None
        if shim is not None and not _alive(*shim):
            return read_exit_record(cwd, token)
        time.sleep(_RECORD_POLL)
    return record


def _alive(pid: int, started: float | None) -> bool:
    """``pid`` still runs as the process started at ``started`` (unknown: only the pid)."""
    if started is None:
        return psutil.pid_exists(pid)
    proc = same_process(pid, started)
    try:
        return proc is not None and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# ---------------------------------------------------------------- launching through the shim


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


def _prepare_launch_dir(cwd: str, token: str) -> None:
    """Create ``<cwd>/launch`` (durably), refuse a used token, prune old launches.

    Raises:
        OSError: the directory could not be created.
        SpawnError: ``token`` has records already.
    """
    directory = os.path.join(cwd, LAUNCH_DIR)
    if not os.path.isdir(directory):
        os.makedirs(directory, exist_ok=True)
        _fsync_dir(cwd)
    if any(os.path.exists(path) for path in launch_files(cwd, token)):
        raise SpawnError(f"launch token {token} was used before in {cwd}; a launch needs a new one")
    try:
        _prune(cwd, token)
    except OSError as e:
        _log.warning("could not prune old launch records in %s: %s", directory, e)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def _prune(cwd: str, current: str) -> None:
    """Delete the records of all but the newest :data:`KEEP_LAUNCHES` other launches
    (never those of a server that is still running)."""
    directory = os.path.join(cwd, LAUNCH_DIR)
    newest: dict[str, float] = {}
    with os.scandir(directory) as entries:
        for entry in entries:
            token = entry.name.split(".", 1)[0]
            if token != current and _TOKEN.fullmatch(token):
                with contextlib.suppress(OSError):
                    mtime = entry.stat().st_mtime
                    newest[token] = max(newest.get(token, mtime), mtime)
    for token in sorted(newest, key=newest.__getitem__, reverse=True)[KEEP_LAUNCHES:]:
        launched = read_launch_record(cwd, token)
        if (
            launched is not None
            and read_exit_record(cwd, token) is None
            and find_process(launched.identity()) is not None
        ):
            continue
        for path in launch_files(cwd, token):
            for name in (path, path + ".tmp"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name)


def _start_shim(cwd: str, token: str, err: int, out: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-I", "-S", SHIM],
        env={TOKEN_VAR: token},
        cwd=cwd,
        stdin=subprocess.PIPE,  # the launch configuration
        stdout=subprocess.PIPE,  # the report
        stderr=err,
        pass_fds=(out,),
        start_new_session=True,
    )


def _above_stdio(fd: int) -> int:
    """``fd`` moved to a number above 2 (close-on-exec); the original is closed.

    Raises:
        OSError: no descriptor is free.
    """
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(fd)


def _send(shim: subprocess.Popen[bytes], config: bytes) -> None:
    assert shim.stdin is not None
    # A shim that died first is noticed by the report (end of file).
    with contextlib.suppress(BrokenPipeError):
        shim.stdin.write(config)
    with contextlib.suppress(BrokenPipeError):
        shim.stdin.close()


def _await_report(shim: subprocess.Popen[bytes], timeout: float) -> bytes | None:
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
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
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


def _move_shim(
    plan: LaunchPlan, shim: subprocess.Popen[bytes], cgroup: InstanceCgroup | None
) -> None:
    """Move the shim into the instance's ``shim`` cgroup before it is given its
    configuration (so it cannot start a server outside).

    Raises:
        SpawnError: it could not be moved (the shim, given nothing, is ended).
    """
    for path in cgroup.shim_procs() if cgroup is not None else ():
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, str(shim.pid).encode())
            finally:
                os.close(fd)
        except OSError as e:
            shim.kill()  # given no configuration: it starts nothing
            shim.wait()
            for pipe in (shim.stdin, shim.stdout):
                if pipe is not None:
                    pipe.close()
            why = f"cannot move the launch shim into {path}: {e.strerror or e}"
            raise SpawnError(f"cannot start {plan.program}: {why}") from e


def _launch(
    plan: LaunchPlan, token: str, inject: bool, cgroup: InstanceCgroup | None = None
) -> tuple[subprocess.Popen[bytes], LaunchRecord]:
    """Start ``plan`` through the shim (in ``cgroup`` when given); the shim's
    handle and the launch record.

    Raises:
        SpawnError: see :meth:`ManagedProcess.spawn`.
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
        _prepare_launch_dir(plan.cwd, token)
        out, err = create_logs(plan.cwd)
        if out <= 2:  # a node started with fd 0, 1 or 2 closed: keep clear of the shim's
            out = _above_stdio(out)
    except OSError as e:
        raise SpawnError(f"cannot start {plan.program}: cannot write in {plan.cwd}: {e}") from e
    try:
        shim = _start_shim(plan.cwd, token, err, out)
    except (OSError, subprocess.SubprocessError) as e:
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


def _launch_failed(
    plan: LaunchPlan, token: str, shim: subprocess.Popen[bytes], report: bytes | None
) -> SpawnError:
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


def _abandon(cwd: str, token: str, shim: subprocess.Popen[bytes], *, patient: bool) -> None:
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
        with contextlib.suppress(psutil.Error):
            children = {c.pid: c.create_time() for c in psutil.Process(shim.pid).children()}
        shim.kill()
        try:
            shim.wait(KILL_CONFIRM)
        except subprocess.TimeoutExpired as e:
            raise ProcessControlError(f"launch shim {shim.pid} outlived SIGKILL") from e
    launched = read_launch_record(cwd, token)
    if launched is not None:
        terminate_identity(launched.identity(), 0.0)
    _kill_all({**children, **_carriers(token)})


def _last_line(path: str) -> str:
    """``": <the last line of the file>"`` (at most 300 characters), or ``""``."""
    try:
        with open(path, "rb") as f:
            f.seek(max(os.fstat(f.fileno()).st_size - 4096, 0))
            lines = f.read().decode("utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return f": {lines[-1][:300]}" if lines else ""


def _carriers(token: str) -> dict[int, float]:
    """Live processes (other than this one) whose environment holds ``TOKEN_VAR=token``:
    pid -> start time. One scan of the process table."""
    found: dict[int, float] = {}
    me = os.getpid()
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(TOKEN_VAR) == token:
                found[proc.pid] = proc.create_time()
        except (psutil.Error, OSError):
            continue  # gone, a zombie, or not ours to read
    return found


def _kill_all(procs: Mapping[int, float]) -> None:
    """SIGKILL each process (pid -> start time, identity-checked) and, when it leads
    a process group (a shim or a server), that group; block until all are gone.

    Raises:
        ProcessControlError: not permitted, or one outlived SIGKILL for 5 s.
    """
    for pid, started in procs.items():
        handle = PidHandle.open(pid, started)
        if handle is None:
            continue
        try:
            with contextlib.suppress(OSError):
                if os.getpgid(pid) == pid:
                    kill_group(pid, signal.SIGKILL)
            handle.send(signal.SIGKILL)
        finally:
            handle.close()
    deadline = time.monotonic() + KILL_CONFIRM
    while alive := [pid for pid, started in procs.items() if _alive(pid, started)]:
        if time.monotonic() >= deadline:
            raise ProcessControlError(f"pids {alive} carrying a launch token outlived SIGKILL")
        time.sleep(_RECORD_POLL)


# ---------------------------------------------------------------- the handles


def _shim_identity(pid: int, started: float | None) -> ProcessIdentity | None:
    """The shim as a descendant-tracking root (it leads its own group)."""
    return None if started is None else ProcessIdentity(pid, pid, started, boot_id())


class ManagedProcess(WatchedProcess):
    """A server process this node launched; create it with :meth:`spawn`.

    ``token`` is its launch token, ``shim_pid`` the pid of its shim (this
    process's child, in a session of its own).
    """

    def __init__(  # noqa: PLR0917 -- built by spawn only
        self,
        shim: subprocess.Popen[bytes],
        cwd: str,
        on_exit: Callable[[ExitInfo], None],
        output_limit: int,
        record: LaunchRecord,
        cgroup: InstanceCgroup | None = None,
    ) -> None:
        self._popen = shim
        self._cwd = cwd
        self.token = record.token
        self.shim_pid = shim.pid
        identity = record.identity()
        # Only the shim can reap the server, so until the shim saw its exit the
        # pid is the server's; a handle refuses a later process with that pid.
        self._server = PidHandle.open(identity.pid, identity.start_time)
        self.oom_kills_at_start = cgroup.oom_kills() if cgroup is not None else None
        super().__init__(
            identity, cwd, on_exit, output_limit, resume=False, cgroup=cgroup,
            shim=_shim_identity(record.shim_pid, record.shim_start_time),
        )  # fmt: skip

    @classmethod
    def spawn(
        cls,
        plan: LaunchPlan,
        on_exit: Callable[[ExitInfo], None],
        token: str | None = None,
        cgroup: InstanceCgroup | None = None,
    ) -> ManagedProcess:
        """Start ``plan`` through the exit-status shim; returns once the server runs.

        The shim (this process's child, in a session of its own) starts the
        server in a new session and process group, records
        ``<cwd>/launch/<token>.json`` and reports; this waits up to
        :data:`LAUNCH_REPORT_TIMEOUT` seconds for that. The returned handle's
        ``identity`` is the server's (pid, pgid == pid, start time, boot id).
        Its stdout and stderr go to :data:`STDOUT_LOG` and :data:`STDERR_LOG`
        in ``plan.cwd`` (emptied first). ``on_exit`` is called exactly once,
        from a waiter thread, once the server has exited (by itself or through
        :meth:`terminate`) and the shim has recorded its status, with that
        status and the output written until then. It must not block for long;
        an exception it raises is logged and dropped. The records of all but
        the last :data:`KEEP_LAUNCHES` other launches in ``plan.cwd`` are
        pruned.

        Args:
            plan: what to run.
            on_exit: called with the exit report.
            token: the launch's token (see :func:`new_token`), recorded by the
                caller before calling this so that :func:`recover_launch` can
                account for the launch after a crash; it is also put in the
                server's environment as ``INFERVISOR_LAUNCH_TOKEN``. None: a
                fresh one is used for the records only and the server's
                environment is exactly ``plan.env`` (for callers that never
                recover a launch).
            cgroup: the instance's cgroups (``adapters/cgroups.py``): made
                and emptied first; the shim is moved into ``shim`` and the
                server joins ``server`` before ``exec``. None: no cgroups.

        Raises:
            SpawnError: naming the program (missing, not executable, bad cwd,
                a token used before, no report from the shim in time).
            ValueError: ``token`` is not 1 to 64 letters, digits, ``-`` or ``_``.
        """
        inject = token is not None
        token = _check_token(new_token() if token is None else token)
        shim, record = _launch(plan, token, inject, cgroup)
        return cls(shim, plan.cwd, on_exit, plan.output_limit, record, cgroup)

    def _await_exit(self) -> tuple[int | None, int | None]:
        try:
            self._popen.wait()
            record = read_exit_record(self._cwd, self.token)
            if record is None and self._server is not None:
                # The shim was killed: the server may still run, unwatched by it.
                _log.warning(
                    "shim %d ended with no exit record; waiting for the server", self.shim_pid
                )
                self._server.wait()
                record = read_exit_record(self._cwd, self.token)
        finally:
            if self._server is not None:
                self._server.close()
        if record is None or record.pid != self.identity.pid:
            return None, None
        return record.exit_code, record.signal


class AttachedProcess(WatchedProcess):
    """A server an earlier node process spawned and left running; see :meth:`attach`.

    It is not this process's child: its exit status is the one its shim
    recorded (given the launch ``token``), else unknown (``exit_code`` and
    ``signal`` None).
    """

    def __init__(
        self,
        identity: ProcessIdentity,
        handle: PidHandle,
        cwd: str,
        on_exit: Callable[[ExitInfo], None],
        output_limit: int,
        *,
        token: str | None = None,
        shim: tuple[int, float | None] | None = None,
        cgroup: InstanceCgroup | None = None,
    ) -> None:
        self._handle = handle
        self._cwd = cwd
        self.token = token
        self._shim = shim
        super().__init__(
            identity, cwd, on_exit, output_limit, resume=True, cgroup=cgroup,
            shim=None if shim is None else _shim_identity(*shim),
        )  # fmt: skip

    @classmethod
    def attach(
        cls,
        identity: ProcessIdentity,
        cwd: str,
        on_exit: Callable[[ExitInfo], None],
        output_limit: int = OUTPUT_LIMIT,
        *,
        token: str | None = None,
        cgroup: InstanceCgroup | None = None,
    ) -> AttachedProcess | None:
        """Watch the server ``identity`` names again, if that very process still runs.

        None when :func:`find_process` does not vouch for it (gone, a zombie,
        another boot, or its pid now names another process): nothing is
        signalled then. Otherwise the exit is awaited on a pidfd (psutil where
        there are none), the log files in ``cwd`` are followed from their
        current content, and the descendants an earlier node recorded there
        are remembered. ``on_exit`` is called exactly once, as for
        :meth:`ManagedProcess.spawn`. Returns at once.

        Args:
            identity: the server, as recorded when it was spawned.
            cwd: its working directory (log files, records).
            on_exit: called with the exit report.
            output_limit: bytes of each stream kept.
            token: its launch token. When given and its launch record names
                this very pid, the exit report carries the status from
                ``<cwd>/launch/<token>.exit.json`` (waiting up to
                :data:`EXIT_RECORD_WAIT` seconds for the shim to write it after
                the server is gone). Otherwise, or without the record, the
                status is None as it cannot be collected.
            cgroup: the instance's cgroups, if it has them.

        Raises:
            ValueError: ``token`` is malformed (see :func:`launch_files`).
        """
        shim: tuple[int, float | None] | None = None
        if token is not None:
            launched = read_launch_record(cwd, token)
            if launched is None or launched.pid != identity.pid:
                _log.warning(
                    "launch %s records no pid %d: exit status unknown", token, identity.pid
                )
                token = None
            else:
                shim = (launched.shim_pid, launched.shim_start_time)
        if find_process(identity) is None:
            return None
        handle = PidHandle.open(identity.pid, identity.start_time)
        if handle is None:
            return None
        return cls(
            identity, handle, cwd, on_exit, output_limit, token=token, shim=shim, cgroup=cgroup
        )

    def _await_exit(self) -> tuple[int | None, int | None]:
        try:
            self._handle.wait()
        finally:
            self._handle.close()
        if self.token is None:
            return None, None
        record = _await_exit_record(self._cwd, self.token, self._shim, EXIT_RECORD_WAIT)
        if record is None or record.pid != self.identity.pid:
            return None, None
        return record.exit_code, record.signal


# ---------------------------------------------------------------- recovery at boot


class LaunchRunning(msgspec.Struct, frozen=True, tag="running"):
    """The launch record exists and that very server still runs: it is adopted.

    ``process`` watches it (attached with the token, so its exit status will
    be known); ``identity`` is the server's.
    """

    process: AttachedProcess
    identity: ProcessIdentity


class LaunchEnded(msgspec.Struct, frozen=True, tag="ended"):
    """The server ran and ended while no node watched it (or could not start).

    ``exit_code``/``signal`` are what its shim recorded (exactly one set when
    known). ``error`` is set instead when the server could not be started
    (the words of a :class:`SpawnError`). ``pid`` is the server's, None if it
    never started; ``ended_ns`` nanoseconds since the Unix epoch. ``reason``
    is set when the status is unknown: why (the shim was killed, or the
    machine rebooted).
    """

    exit_code: int | None
    signal: int | None
    error: str | None = None
    pid: int | None = None
    ended_ns: int | None = None
    reason: str | None = None


class LaunchNeverStarted(msgspec.Struct, frozen=True, tag="never_started"):
    """No record of the launch and no process carries its token (or those that
    did were killed, having recorded nothing in time); ``reason`` says which."""

    reason: str


#: What :func:`recover_launch` found.
LaunchRecovery: TypeAlias = LaunchRunning | LaunchEnded | LaunchNeverStarted


def _ended(record: ExitRecord) -> LaunchEnded:
    return LaunchEnded(
        exit_code=record.exit_code,
        signal=record.signal,
        error=record.error,
        pid=record.pid,
        ended_ns=record.ended_ns,
    )


def recover_launch(
    cwd: str,
    token: str,
    on_exit: Callable[[ExitInfo], None],
    output_limit: int = OUTPUT_LIMIT,
    *,
    wait: float = LAUNCH_REPORT_TIMEOUT,
    cgroup: InstanceCgroup | None = None,
) -> LaunchRecovery:
    """Account at boot for launch ``token`` in ``cwd``, decided before the node stopped.

    - The exit record exists: :class:`LaunchEnded` with the recorded status.
    - The launch record exists and that very server runs: :class:`LaunchRunning`,
      attached (as :meth:`AttachedProcess.attach` with the token; ``on_exit``
      and ``output_limit`` as there). If it is gone, its shim is given up to
      ``wait`` seconds to record the exit; without it, :class:`LaunchEnded`
      with unknown status and a ``reason``.
    - Neither: the process table is scanned once for processes carrying the
      token. None: :class:`LaunchNeverStarted`. Some (a shim or server whose
      record is late): up to ``wait`` seconds for a record, handled as above;
      if none comes, their process groups are killed and
      :class:`LaunchNeverStarted` says so. With ``cgroup``, its members count
      as carriers too (the kernel's list: a process whose environment could
      not be read is still found), and it is emptied when no record comes.

    Args:
        cwd: the server's working directory.
        token: the launch's token, as given to :meth:`ManagedProcess.spawn`.
        on_exit: the exit callback for an adopted server.
        output_limit: bytes of each stream kept for an adopted server.
        wait: seconds to wait for a record a live shim is about to write.
        cgroup: the instance's cgroups, if it has them.

    Raises:
        ProcessControlError: a process carrying the token could not be killed.
        ValueError: ``token`` is malformed (see :func:`launch_files`).
    """
    if (ended := read_exit_record(cwd, token)) is not None:
        return _ended(ended)
    launched = read_launch_record(cwd, token)
    if launched is None:
        carriers = {**_carriers(token), **_members_of(cgroup)}
        if not carriers:
            return LaunchNeverStarted(
                reason=f"no record of launch {token} and no process carries it"
            )
        found = _await_any_record(cwd, token, carriers, wait)
        if isinstance(found, ExitRecord):
            return _ended(found)
        if found is None:
            _end_launch(token, carriers, cgroup)
            return LaunchNeverStarted(
                reason=f"pids {sorted(carriers)} carried launch {token} but recorded no launch "
                f"within {wait:g} s; their process groups were killed"
            )
        launched = found
    return _adopt(
        cwd=cwd, token=token, launched=launched, on_exit=on_exit,
        output_limit=output_limit, wait=wait, cgroup=cgroup,
    )  # fmt: skip


_RESCANS = 3  # scans for carriers after a kill (a server forked during the first)


def _end_launch(token: str, carriers: Mapping[int, float], cgroup: InstanceCgroup | None) -> None:
    """Kill a launch that recorded nothing in time: its carriers, then whatever
    carries the token now (a shim slow to record may have forked its server
    after the first scan: issue 17's unclaimed server), then its cgroups, the
    kernel's list, which misses nothing.

    Raises:
        ProcessControlError: something could not be killed.
    """
    _kill_all(carriers)
    for _ in range(_RESCANS):
        more = _carriers(token)
        if not more:
            break
        _kill_all(more)
    if cgroup is not None:
        cgroup.kill(everything=True)


def _members_of(cgroup: InstanceCgroup | None) -> dict[int, float]:
    """The live members of an instance's cgroups: pid -> start time."""
    found: dict[int, float] = {}
    for pid in cgroup.members() if cgroup is not None else ():
        with contextlib.suppress(psutil.Error):
            found[pid] = psutil.Process(pid).create_time()
    return found


def _await_any_record(
    cwd: str, token: str, carriers: Mapping[int, float], wait: float
) -> LaunchRecord | ExitRecord | None:
    """The first record of ``token`` to appear within ``wait`` s; None if none did
    (stops early once every carrier is gone)."""
    deadline = time.monotonic() + wait
    while True:
        if (ended := read_exit_record(cwd, token)) is not None:
            return ended
        if (launched := read_launch_record(cwd, token)) is not None:
            return launched
        if time.monotonic() >= deadline or not any(_alive(*c) for c in carriers.items()):
            return read_exit_record(cwd, token) or read_launch_record(cwd, token)
        time.sleep(_RECORD_POLL)


def _adopt(
    *,
    cwd: str,
    token: str,
    launched: LaunchRecord,
    on_exit: Callable[[ExitInfo], None],
    output_limit: int,
    wait: float,
    cgroup: InstanceCgroup | None,
) -> LaunchRecovery:
    if launched.boot_id != boot_id():
        why = "the machine restarted since the launch; no exit status was recorded"
        return LaunchEnded(exit_code=None, signal=None, pid=launched.pid, reason=why)
    identity = launched.identity()
    proc = AttachedProcess.attach(identity, cwd, on_exit, output_limit, token=token, cgroup=cgroup)
    if proc is not None:
        return LaunchRunning(process=proc, identity=identity)
    shim = (launched.shim_pid, launched.shim_start_time)
    if (ended := _await_exit_record(cwd, token, shim, wait)) is not None:
        return _ended(ended)
    why = f"pid {launched.pid} is gone and its shim recorded no exit status (was it killed?)"
    return LaunchEnded(exit_code=None, signal=None, pid=launched.pid, reason=why)
