"""The exit-status shim: the parent of one managed server, outliving the node.

:meth:`infervisor.adapters.proc.handles.ManagedProcess.spawn` does not start a
model server itself: it starts this file (``python -I -S shim.py``, in a
session of its own), which starts the server as its child, records the launch
and, once the server has ended, its exit status. The shim is the server's
parent for the server's whole life, so the status can always be collected
(``waitpid``), whether or not a node is alive to hear it; conmon and
containerd-shim do the same for containers. See ``docs/process-supervision.md``.

This file is executed by path and must stay standard-library only: it never
imports ``infervisor`` (nor anything outside the standard library), and keeps
its start-up short.

What the node hands over:

- environment: ``INFERVISOR_LAUNCH_TOKEN=<token>`` (the shim's only variable;
  the token names the launch's records and marks its processes);
- working directory: the server's (the plan's ``cwd``); records go to
  ``./launch/``;
- fd 0: the launch configuration, one JSON object read to end of file:
  ``{"argv": [str, ...], "env": {str: str}, "stdout_fd": int, "cgroup_procs":
  [str, ...]}`` (``cgroup_procs`` optional: the ``cgroup.procs`` files the
  server joins before ``exec``, see ``adapters/proc/cgroups.py``);
- fd 1: the report pipe: the shim writes one byte, ``L`` once
  ``launch/<token>.json`` is durable, ``E`` once ``launch/<token>.exit.json``
  holds an error (the server could not be started), then closes it;
- fd 2: the server's stderr log (``O_APPEND``), inherited by the server, and
  where a traceback of the shim itself would land;
- fd ``stdout_fd``: the server's stdout log (``O_APPEND``).

What the shim writes (each atomically: a temporary file renamed into place,
so a reader sees the whole record or none; not fsynced, see
:func:`write_atomically`):

- ``launch/<token>.json`` right after the server exists and before anything
  else: ``{"token", "pid", "pgid", "start_time", "boot_id", "shim_pid",
  "shim_start_time"}``. ``start_time`` is psutil's ``create_time`` (seconds
  since the epoch: ``starttime`` of ``/proc/<pid>/stat`` in clock ticks plus
  ``btime`` of ``/proc/stat``), null where there is no ``/proc``;
- ``launch/<token>.exit.json`` once the server has been reaped:
  ``{"token", "pid", "exit_code", "signal", "ended_ns", "error"}``;
  ``exit_code`` when it exited, ``signal`` when a signal killed it, the other
  null; ``ended_ns`` is nanoseconds since the Unix epoch; ``error`` is null,
  or says why the server could not be started (then ``pid``, ``exit_code``
  and ``signal`` are null and there is no launch file). Its space is set
  aside before the launch record is written (``<token>.exit.json.tmp``,
  :data:`EXIT_RESERVE` spaces, overwritten in place), so a disk that fills
  while the server runs cannot cost its exit status: the node records the
  real cause once it can write again. The record may end in spaces.

Signals: SIGHUP, SIGINT and SIGTERM are caught by a handler that does
nothing, and SIGPIPE is ignored, so the shim outlives its node and anything
sent to it but SIGKILL. A handler rather than ``SIG_IGN``: an ignored signal
stays ignored across ``exec``, so the server would ignore SIGTERM too; a
caught one is reset to its default there. The server runs in a new session
and process group of its own, so a signal to the server's group never reaches
the shim.

Where Linux offers it, the shim makes itself a child subreaper
(``PR_SET_CHILD_SUBREAPER``): a descendant of the server orphaned while the
shim lives (one that escaped the server's group with ``setsid()`` and whose
parent exited) is re-parented to the shim instead of init, and the shim reaps
it when it exits. Once the server has been reaped and its status recorded,
the shim reaps whichever of those are already dead and exits at once: one
still alive is then re-parented to init, as without a shim, and never delays
the exit report.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

TOKEN_VAR = "INFERVISOR_LAUNCH_TOKEN"  # noqa: S105 -- a variable name, not a secret
LAUNCH_DIR = "launch"
REPORT_LAUNCHED = b"L"
REPORT_FAILED = b"E"
#: Bytes set aside at launch for the exit record (one is under 200 bytes).
EXIT_RESERVE = 512
_TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
_TOKEN_MAX = 64
_PR_SET_CHILD_SUBREAPER = 36
_CLONE_NEWCGROUP = 0x02000000  # <linux/sched.h>
_REPORT_FD = 1
_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _noop(signum: int, frame: object) -> None:
    """Catch a signal and carry on (see the module docstring: not SIG_IGN)."""


def _ignore_signals() -> None:
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _noop)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # subprocess restores it in the server


def _become_subreaper() -> bool:
    """Ask Linux to re-parent orphaned descendants to this process (best effort).

    Returns:
        Whether the kernel agreed; False on other systems or older kernels.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes  # noqa: PLC0415 -- only where it can be used

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def valid_token(token: str | None) -> bool:
    """A token is 1 to 64 ASCII letters, digits, ``-`` or ``_`` (it names files)."""
    return bool(token) and len(token or "") <= _TOKEN_MAX and set(token or "") <= _TOKEN_CHARS


def _boot_id() -> str:
    try:
        with open(_BOOT_ID, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def start_time(pid: int) -> float | None:
    """``pid``'s start in seconds since the epoch, computed as psutil's ``create_time``.

    ``starttime`` (field 22 of ``/proc/<pid>/stat``, clock ticks since boot)
    divided by ``SC_CLK_TCK``, plus ``btime`` of ``/proc/stat``. A zombie
    still has it.

    Returns:
        The start time, or None where it cannot be read (no ``/proc``).
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # The command name (field 2) is in parentheses and may hold anything.
        ticks = float(stat[stat.rindex(b")") + 2 :].split()[19])
        with open("/proc/stat", "rb") as f:
            btime = next(float(line.split()[1]) for line in f if line.startswith(b"btime"))
        return ticks / os.sysconf("SC_CLK_TCK") + btime
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def write_atomically(directory: str, name: str, record: dict[str, Any]) -> None:
    """Write ``record`` as JSON to ``directory/name``: a temporary file, renamed
    into place. A reader sees the whole record or none.

    Not fsynced, on purpose: a record matters only during the boot it was
    written in (readers check ``boot_id``), and a rename is visible to every
    process at once through the page cache. Only a power loss could lose it,
    and that ends the servers too. Two fsyncs on the exit path cost
    milliseconds between a server's death and its durable ``exited`` event.

    Raises:
        OSError: the record could not be written.
    """
    path = os.path.join(directory, name)
    temporary = path + ".tmp"
    data = json.dumps(record, separators=(",", ":")).encode()
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the node's user only, whatever the umask
        reserved = os.fstat(fd).st_size
        if len(data) <= reserved:
            # Over the bytes :func:`reserve` set aside, in place: no new block is
            # needed, so a disk filled since the launch cannot refuse it.
            # Trailing spaces are JSON whitespace.
            data = data.ljust(reserved)
        else:
            os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.replace(temporary, path)


def reserve(directory: str, name: str, size: int = EXIT_RESERVE) -> None:
    """Set aside ``size`` bytes for the record ``directory/name`` that
    :func:`write_atomically` will write later (its temporary file, filled with
    spaces), so it can be written even once the disk is full.

    Raises:
        OSError: the space could not be set aside.
    """
    fd = os.open(
        os.path.join(directory, name) + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600
    )
    try:
        view = memoryview(b" " * size)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _report(byte: bytes) -> None:
    """Tell the node (if it still listens) and let go of the pipe."""
    with contextlib.suppress(OSError):  # the node is gone: the records say it all
        os.write(_REPORT_FD, byte)
    _to_devnull(_REPORT_FD, os.O_WRONLY)


def _to_devnull(fd: int, flags: int) -> None:
    null = os.open(os.devnull, flags | os.O_CLOEXEC)
    os.dup2(null, fd)  # dup2 leaves the copy inheritable; fine for 0-2
    os.close(null)


def _read_config() -> dict[str, Any]:
    """The launch configuration from fd 0 (see the module docstring).

    Raises:
        ValueError: it is missing, truncated or malformed.
    """
    chunks = []
    while chunk := os.read(0, 65536):
        chunks.append(chunk)
    _to_devnull(0, os.O_RDONLY)
    cfg = json.loads(b"".join(chunks) or b"null")
    problem = _config_problem(cfg)
    if problem is not None:
        raise ValueError(problem)
    return dict(cfg)


def _config_problem(cfg: object) -> str | None:
    if not isinstance(cfg, dict):
        return "no launch configuration was received (the node ended first?)"
    argv, env, fd = cfg.get("argv"), cfg.get("env"), cfg.get("stdout_fd")
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        return "the launch configuration has no argv"
    if not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
        return "the launch configuration has no env"
    if not isinstance(fd, int):
        return "the launch configuration has no stdout_fd"
    procs = cfg.get("cgroup_procs", [])
    if not (isinstance(procs, list) and all(isinstance(p, str) for p in procs)):
        return "the launch configuration's cgroup_procs is not a list of paths"
    return None


def _joiner(paths: list[str]) -> Any:
    """A ``preexec_fn`` that moves the child into each cgroup (``0``: the writer
    itself) before ``exec``, so nothing the server runs is ever outside them,
    then gives it a cgroup namespace rooted there.

    A process may move itself to any cgroup whose ``cgroup.procs`` it can write:
    a server running as root could leave its own. Inside a cgroup namespace the
    kernel refuses a v2 migration out of the namespace's root (cgroup-v2.rst,
    "Namespace confinement"), so the server's tree stays in its cgroup. Making
    the namespace needs CAP_SYS_ADMIN: without it (a server that is not root,
    which cannot write the node's cgroups anyway) it is skipped. v1 has no such
    confinement (docs/process-supervision.md). The shim has one thread, so
    ``preexec_fn`` is safe here.
    """
    unshare = _unshare()

    def join() -> None:
        for path in paths:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        if unshare is not None:
            unshare(_CLONE_NEWCGROUP)  # its failure (EPERM) leaves the confinement off

    return join if paths else None


def _unshare() -> Any:
    """libc's ``unshare``, loaded before the fork (None where there is none)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes  # noqa: PLC0415 -- only where it can be used

        return ctypes.CDLL(None, use_errno=True).unshare
    except (OSError, AttributeError):
        return None


def _cgroup_problem(paths: list[str]) -> str | None:
    """Why the server could not join its cgroups (checked first: an error in
    ``preexec_fn`` reaches the shim without its reason)."""
    for path in paths:
        if not os.access(path, os.W_OK):
            return f"cannot join its cgroup: {path} is missing or not writable"
    return None


def _failed(directory: str, token: str, error: str) -> int:
    """Record that the server could not be started, report it; the shim's exit code."""
    record = {
        "token": token,
        "pid": None,
        "exit_code": None,
        "signal": None,
        "ended_ns": time.time_ns(),
        "error": error,
    }
    write_atomically(directory, f"{token}.exit.json", record)
    _report(REPORT_FAILED)
    return 0


def _start(cfg: dict[str, Any]) -> subprocess.Popen[bytes] | str:
    """The server, started in a new session; or why it could not be (the
    same words as the node's own messages: ``no such program (...)``)."""
    procs = list(cfg.get("cgroup_procs", []))
    problem = _cgroup_problem(procs)
    if problem is not None:
        with contextlib.suppress(OSError):
            os.close(cfg["stdout_fd"])
        return problem
    try:
        return subprocess.Popen(
            cfg["argv"],
            env=cfg["env"],
            stdin=subprocess.DEVNULL,
            stdout=cfg["stdout_fd"],
            stderr=None,  # fd 2: the stderr log
            start_new_session=True,
            preexec_fn=_joiner(procs),  # noqa: PLW1509 -- single-threaded here
        )
    except FileNotFoundError as e:
        return f"no such program ({e.strerror})"
    except PermissionError as e:
        return f"not executable ({e.strerror})"
    except subprocess.SubprocessError as e:
        return f"cannot join its cgroup ({e})" if procs else str(e)
    except (OSError, ValueError) as e:
        return str(e)
    finally:
        with contextlib.suppress(OSError):
            os.close(cfg["stdout_fd"])


def _record_launch(directory: str, token: str, server: subprocess.Popen[bytes]) -> None:
    try:
        pgid = os.getpgid(server.pid)
    except OSError:
        pgid = server.pid  # it leads the session it was started in
    record = {
        "token": token,
        "pid": server.pid,
        "pgid": pgid,
        "start_time": start_time(server.pid),
        "boot_id": _boot_id(),
        "shim_pid": os.getpid(),
        "shim_start_time": start_time(os.getpid()),
    }
    write_atomically(directory, f"{token}.json", record)


def _wait_for(pid: int) -> int:
    """Reap children (orphans re-parented here included) until ``pid`` is among
    them; its wait status."""
    while True:
        reaped, status = os.waitpid(-1, 0)
        if reaped == pid:
            return status


def _reap_dead() -> None:
    """Reap every child that has already exited; wait for none."""
    while True:
        try:
            reaped, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if reaped == 0:
            return


def main() -> int:
    """Run one server to its end; the shim's exit code (0 once all is recorded).

    Returns:
        0 when the launch (or why it failed) and the exit are recorded; 2 when
        there is no usable token; 1 when a record could not be written.
    """
    _ignore_signals()
    _become_subreaper()
    token = os.environ.get(TOKEN_VAR)
    if token is None or not valid_token(token):
        sys.stderr.write(f"infervisor shim: no valid {TOKEN_VAR} in its environment\n")
        return 2
    directory = os.path.join(os.getcwd(), LAUNCH_DIR)
    try:
        os.makedirs(directory, exist_ok=True)
        try:
            cfg = _read_config()
        except (OSError, ValueError) as e:
            return _failed(directory, token, f"launch shim: {e}")
        server = _start(cfg)
        if isinstance(server, str):
            return _failed(directory, token, server)
        try:
            reserve(directory, f"{token}.exit.json")
            _record_launch(directory, token, server)
        except OSError as e:
            # An unrecorded server must not run: no node could ever find it.
            with contextlib.suppress(OSError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait()
            return _failed(directory, token, f"cannot record the launch in {directory}: {e}")
        _report(REPORT_LAUNCHED)
        status = _wait_for(server.pid)
        ended = time.time_ns()
        server.returncode = code = os.waitstatus_to_exitcode(status)
        write_atomically(
            directory,
            f"{token}.exit.json",
            {
                "token": token,
                "pid": server.pid,
                "exit_code": code if code >= 0 else None,
                "signal": -code if code < 0 else None,
                "ended_ns": ended,
                "error": None,
            },
        )
    except OSError as e:
        sys.stderr.write(f"infervisor shim: {e}\n")
        return 1
    _reap_dead()
    return 0


if __name__ == "__main__":
    exit_code = main()
    sys.stderr.flush()
    # Skip the interpreter's teardown: the node's waiter hears of the server's
    # death when the shim ends, and a teardown costs it milliseconds.
    os._exit(exit_code)
