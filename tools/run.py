"""``infervisor run``: a node in the foreground until SIGINT, SIGTERM or SIGHUP.

On start the node rebuilds itself from its chain (instances wanted running
are started again, stopped ones stay stopped); instances in the config that
the chain does not know yet are placed, and started when ``start = true``.
On SIGINT/SIGTERM, and on SIGHUP (the terminal was closed), managed servers
are stopped gracefully (recorded, and still wanted running for the next
start) and the process exits 0; a second signal during that stop kills them
at once.

One bad instance never takes the node down: each configured instance is
placed (and started) on its own; one the node refuses (a serve program
missing, its port taken, no memory left) is reported in one line and the
others run. What the node records about it is the node's.

Output: one line per event and per step, on the ``say`` callback; Python
logging (the actors' diagnostics, with levels) goes to ``<data_dir>/node.log``
while the node runs, never between those lines.

Exit status: 0 after a clean stop; 1 when a server could not be stopped; 2
when the node cannot run as configured (the data_dir cannot be created or is
used by another run, the chain belongs to another node, a model file is
missing): reported in one line, and found before anything is created or
recorded where it can be (:func:`preflight`). 3 when the node failed while running (one of its
node-wide actors died, or the supervisor stopped ticking: see
:mod:`infervisor.actors.watchdog`): the cause is named in one line, the node
is shut down as far as it still can be, and the next run resumes from the
chain (a managed server it could not stop is re-attached then). A node never
runs on without its ticks.

While it runs, operators and controllers reach it through its control API
(:mod:`.api`, docs/api.md) on ``<data_dir>/api.sock`` and, when ``[api] tcp``
is set, a loopback TCP port with bearer tokens: the listeners are open from
the moment the run lock is held (requests are answered 503 "starting" until
the node is open) until the node is shut down; once the shutdown begins,
verbs that change state are answered 503 "stopping", and the shutdown waits
for the verbs already in flight.

Signals are only queued by the handler (``SimpleQueue.put`` is safe there);
the main thread reads the queue, and looks at the node's failure, and does
the work.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import queue
import resource
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pykka

from infervisor.actors.errors import NodeError
from infervisor.actors.node import Node
from infervisor.actors.settings import NodeSettings
from infervisor.actors.watchdog import NodeFailure
from infervisor.adapters.errors import RegistryError
from infervisor.adapters.proc.errors import AdapterError
from infervisor.adapters.proc.output import open_private
from infervisor.adapters.registry import ModelFormat, ModelRegistry
from infervisor.adapters.spec import Flavor, InstanceSpec, Mode, instance_id
from infervisor.chain import ChainError, SqliteChain, StoredEvent
from infervisor.replay import EventDecodeError, decode_event, reason_of

from .api.errors import ApiError
from .api.server import ApiServer
from .config import ApiConfig, ModelEntryConfig, NodeConfig
from .extras import install_hint, missing_extra, missing_modules

__all__ = [
    "EXIT_FAILED",
    "LOCK_FILE",
    "LOG_FILE",
    "STOP_SIGNALS",
    "RunError",
    "preflight",
    "raise_descriptor_limit",
    "register_models",
    "run_node",
    "serve",
]

#: Held (``flock``) in the data_dir while a node runs there: one node per data_dir.
LOCK_FILE = "run.lock"

#: Where Python logging goes (appended, with levels) while a node runs there.
LOG_FILE = "node.log"

#: Each stops the node gracefully; a second one kills what is still stopping.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: The exit status of a run whose node failed while running.
EXIT_FAILED = 3

#: Descriptors the node needs beyond the API's connections: the chain, logs,
#: pipes and pidfds of its servers, probes (a margin, not a count).
DESCRIPTOR_MARGIN = 512

#: Seconds beyond the stop grace the shutdown waits for changing verbs in flight
#: (a stop's grace is bounded by the node's; a placement's admission may take
#: longer: it is then answered 503 by the ended node).
IN_FLIGHT_WAIT_S = 30.0

log = logging.getLogger(__name__)

Say = Callable[[str], None]
_DONE = ""  # queued by the shutdown thread; signal names are never empty


class RunError(Exception):
    """The node cannot run as configured; the message says what, where and how to fix it."""


def run_node(config: NodeConfig, say: Say) -> int:
    """Run until SIGINT, SIGTERM or SIGHUP; returns the exit status (see the module docstring)."""
    inbox: queue.SimpleQueue[str] = queue.SimpleQueue()
    with _signals_into(inbox), contextlib.ExitStack() as held:
        try:
            preflight(config)
            held.enter_context(claim_data_dir(config.node))
            log = held.enter_context(diagnostics_to(Path(config.node.data_dir) / LOG_FILE))
            raise_descriptor_limit(config.api)
            control = held.enter_context(listen_for_operators(config))
            node = open_node(config, on_event=_printing_and_waking(say, control))
        except RunError as e:
            say(f"error: {e}")
            return 2
        try:
            control.serve(node)
        except ApiError as e:
            say(f"error: {e}")
            node.shutdown(reason=f"the API cannot serve: {e}")
            return 2
        say(f"diagnostics (Python logging): {log}")
        report_resumed(node, config, say)
        place_new(node, config, say, stop_requested=lambda: not inbox.empty())
        say(f"node {config.node.node_id} running; chain {config.node.chain_path}")
        say(f"control API: {control.path}" + (f" and {control.url}" if control.url else ""))
        say(f"operator verbs: infervisor status|start|stop|restart|unload {control.path.parent}")
        say("Ctrl-C or SIGTERM stops it; so does SIGHUP (closing the terminal)")
        return serve(node, control, inbox, say)


def _printing_and_waking(say: Say, api: ApiServer) -> Callable[[StoredEvent], None]:
    """The node's event observer: one line per durable event, and the API's watch streams woken."""

    def observe(stored: StoredEvent) -> None:
        api.notify(stored)  # first: a blocked terminal must not hold the watch streams back
        say(event_line(stored))

    return observe


def serve(node: Node, control: ApiServer, inbox: queue.SimpleQueue[str], say: Say) -> int:
    """Run until a signal arrives or the node fails, then shut it down; the exit status."""
    stopped_by = _next_signal_or_failure(inbox, node)
    if isinstance(stopped_by, NodeFailure):
        say(f"error: the node failed: {stopped_by}")
        say("shutting it down; a run started again resumes from the chain")
        _shutdown(node, control, inbox, f"node failed: {stopped_by}", say)
        return EXIT_FAILED
    say(f"received {stopped_by}: stopping managed servers (send it again to kill them at once)")
    status = _shutdown(node, control, inbox, f"infervisor run received {stopped_by}", say)
    if status == 0:
        say("stopped")
    return status


# ---------------------------------------------------------------- before the node opens
def preflight(config: NodeConfig) -> None:
    """What can be checked before anything is created: every model file to
    register exists, and the extra that generates a tiny model is installed.

    Raises:
        RunError: naming the model, its file, or the extra to install.
    """
    registry = config.node.registry_path
    for folder, key in ((Path(config.node.data_dir), "data_dir"), (registry, "registry_dir")):
        _check_creatable(folder, key)
    for model in config.models:
        if (registry / f"{model.name}.toml").is_file() or model.format is ModelFormat.OLLAMA:
            continue  # registered already: checked when an instance is placed or started
        file = registry / model.path
        if model.generate_tiny and not file.resolve().is_relative_to(registry.resolve()):
            raise RunError(
                f"[[models]] {model.name}: path {model.path!r} is outside the registry root "
                f"{registry.resolve()}: refused before writing"
            )
        if model.generate_tiny:
            if not file.exists() and (absent := missing_modules(Flavor.LLAMACPP)):
                raise RunError(
                    f"[[models]] {model.name}: generate_tiny needs the llamacpp extra: "
                    f"{install_hint(Flavor.LLAMACPP)} (missing: {', '.join(absent)})"
                )
        elif not file.exists():
            raise RunError(
                f"[[models]] {model.name}: {file} does not exist: put the model there "
                "(path is relative to the registry folder), or set generate_tiny = true"
            )


def raise_descriptor_limit(api: ApiConfig) -> int:
    """Raise this process's RLIMIT_NOFILE soft limit to its hard limit (logged),
    so the node is not the first to run out of descriptors (issue 17: 1,100
    API connections took a node with the usual soft limit of 1,024 to its
    end); warn when even the hard limit leaves too little beside the API's
    caps. Managed servers get limits of their own (adapters/proc/limits.py).

    Returns:
        The soft limit now in force (descriptors).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as e:
            log.warning("cannot raise the descriptor limit (RLIMIT_NOFILE) to %s: %s", hard, e)
        else:
            log.info("raised the descriptor limit (RLIMIT_NOFILE) from %s to %s", soft, hard)
            soft = hard
    needed = (2 if api.tcp else 1) * api.max_connections + DESCRIPTOR_MARGIN
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "the descriptor limit is %s; the API's listeners may hold %s connections "
            "([api] max_connections each) and the node needs about %s more: lower "
            "max_connections or raise the hard limit (ulimit -Hn, systemd LimitNOFILE=)",
            soft,
            needed - DESCRIPTOR_MARGIN,
            DESCRIPTOR_MARGIN,
        )
    return soft


def _check_creatable(folder: Path, key: str) -> None:
    """Refuse a folder that cannot be created because a file is in its way."""
    found = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if found is not None and not found.is_dir():
        raise RunError(f"{key} {folder}: cannot create it: {found} is not a folder")


@contextlib.contextmanager
def diagnostics_to(path: Path) -> Iterator[Path]:
    """Send Python logging to ``path`` (appended, with levels) instead of the
    terminal while the block runs; the root logger's level is kept.

    Raises:
        RunError: the file cannot be opened.
    """
    try:
        # Created 0600 whatever the umask (it logs specs and requests), then appended to.
        os.close(open_private(str(path), os.O_WRONLY | os.O_APPEND))
        handler = logging.FileHandler(path, encoding="utf-8")
    except OSError as e:
        raise RunError(f"{path}: cannot write the log there: {e.strerror or e}") from e
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    terminal = [h for h in root.handlers if _is_terminal(h)]
    for h in terminal:
        root.removeHandler(h)
    root.addHandler(handler)
    try:
        yield path
    finally:
        root.removeHandler(handler)
        handler.close()
        for h in terminal:
            root.addHandler(h)


def _is_terminal(handler: logging.Handler) -> bool:
    stream = getattr(handler, "stream", None)
    return isinstance(handler, logging.StreamHandler) and stream in (sys.stderr, sys.stdout)


@contextlib.contextmanager
def claim_data_dir(settings: NodeSettings) -> Iterator[None]:
    """Create the data and registry folders and hold the data_dir's run lock.

    Raises:
        RunError: a folder cannot be created or written, or another run holds the lock.
    """
    data_dir = Path(settings.data_dir)
    for folder, key in ((data_dir, "data_dir"), (settings.registry_path, "registry_dir")):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunError(f"{key} {folder}: cannot create it: {e.strerror or e}") from e
    lock = data_dir / LOCK_FILE
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise RunError(f"data_dir {data_dir}: cannot write there: {e.strerror or e}") from e
    try:
        _lock(fd, data_dir)
        yield
    finally:
        os.close(fd)  # releases the lock


def holds_no_run(lock: Path) -> None:
    """Check that no ``infervisor run`` holds the run lock at ``lock`` (a missing
    file is no run); the lock is let go at once.

    Raises:
        RunError: a run holds it (naming its pid), or it cannot be checked.
    """
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return
    except OSError as e:
        raise RunError(f"{lock}: cannot check the run lock: {e.strerror or e}") from e
    try:
        holder = _try_lock(fd, f"{lock}: cannot check the run lock")
        if holder is not None:
            raise RunError(f"a node runs on {lock.parent} (pid {holder}); stop it first")
    finally:
        os.close(fd)


def _try_lock(fd: int, cannot: str) -> str | None:
    """Take the run lock on ``fd`` without waiting: None when taken, else the
    pid its holder wrote (or "unknown").

    Raises:
        RunError: ``cannot`` and why, when the lock cannot be asked at all.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
            raise RunError(f"{cannot}: {e.strerror or e}") from e
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    return None


def _lock(fd: int, data_dir: Path) -> None:
    holder = _try_lock(fd, f"data_dir {data_dir}: cannot lock it")
    if holder is not None:
        raise RunError(
            f"data_dir {data_dir} is in use by another infervisor run (pid {holder}); "
            "one node runs per data_dir: stop that one or give this config its own data_dir"
        )
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def listen_for_operators(config: NodeConfig) -> ApiServer:
    """Open the control API (the data_dir's socket, and ``[api] tcp`` when set); it
    answers 503 "starting" until the node is open.

    Raises:
        RunError: a listener cannot be opened (socket path too long or in the way,
            the TCP port taken, a bad ``[api]`` key).
    """
    from .api.auth import load_or_create_tokens, parse_tcp  # noqa: PLC0415
    from .api.limits import ConnectionLimits  # noqa: PLC0415
    from .api.metrics import NodeMetrics  # noqa: PLC0415

    settings, api = config.node, config.api
    data_dir = Path(settings.data_dir)
    try:
        tcp = tokens = None
        if api.tcp is not None:
            tcp = parse_tcp(api.tcp, allow_non_loopback=api.allow_non_loopback)
            tokens = load_or_create_tokens(data_dir, api.tokens)
        limits = ConnectionLimits(
            max_connections=api.max_connections,
            read_timeout_s=api.read_timeout_s,
            keep_alive_s=api.keep_alive_s,
        )
        server = ApiServer.listen(
            data_dir, settings.chain_path, settings.node_id, tcp=tcp, tokens=tokens, limits=limits
        )
    except ApiError as e:
        raise RunError(f"data_dir {settings.data_dir}: {e}") from e
    gate = server.ctx.gate
    server.ctx.metrics = NodeMetrics(lambda: gate.node, settings.chain_path).render
    return server


def event_line(stored: StoredEvent) -> str:
    """One line of live output for an event: seq, kind, instance, why."""
    try:
        why = reason_of(decode_event(stored))
    except EventDecodeError as e:
        why = str(e)
    subject = f" {stored.subject}" if stored.subject else ""
    return f"[{stored.seq}] {stored.kind}{subject}: {why}"


def open_node(config: NodeConfig, on_event: Callable[[StoredEvent], None] | None = None) -> Node:
    """Check the chain is this node's, register the models, open the node.

    Raises:
        RunError: naming the chain, the model or the setting at fault.
    """
    settings = config.node
    check_chain_owner(settings)
    register_models(ModelRegistry(settings.registry_path), config.models)
    try:
        return Node.open(settings, on_event=on_event)
    except (ChainError, NodeError, AdapterError, OSError, ValueError, pykka.ActorDeadError) as e:
        raise RunError(f"cannot open the node on {settings.data_dir}: {e}") from e


def check_chain_owner(settings: NodeSettings) -> None:
    """Refuse a chain file that is unreadable or was written by another node id.

    Raises:
        RunError: naming the file and the node id it belongs to.
    """
    path = settings.chain_path
    if not path.exists():
        return
    try:
        with SqliteChain.open_readonly(path) as chain:
            owner = chain.node_id
    except ChainError as e:
        raise RunError(f"{e}; move it away or use another data_dir") from e
    if owner != settings.node_id:
        raise RunError(
            f"{path} is the chain of node {owner!r}, but [node] node_id is "
            f"{settings.node_id!r}: set node_id = {owner!r}, or use another data_dir"
        )


def register_models(registry: ModelRegistry, models: list[ModelEntryConfig]) -> None:
    """Make sure every configured model is in the registry (generating tiny ones if asked).

    Raises:
        RunError: a file is missing or not a model, or the tiny model cannot be generated.
    """
    for model in models:
        try:
            _register(registry, model)
        except RegistryError as e:
            raise RunError(f"[[models]] {model.name}: {e}") from e
        except ImportError as e:
            raise RunError(
                f"[[models]] {model.name}: generate_tiny needs the llamacpp extra "
                f"(pip install 'infervisor[llamacpp]'): {e}"
            ) from e
        except OSError as e:
            raise RunError(f"[[models]] {model.name}: {e}") from e


def _register(registry: ModelRegistry, model: ModelEntryConfig) -> None:
    file = registry.root / model.path
    root = registry.root.resolve()
    if model.generate_tiny and not file.resolve().is_relative_to(root):
        raise RegistryError(
            f"path {model.path!r} is outside the registry root {root}: refused before writing"
        )
    if model.generate_tiny and not file.exists():
        from .tinymodel import generate_tiny_gguf  # noqa: PLC0415 - needs the llamacpp extra

        file.parent.mkdir(parents=True, exist_ok=True)
        generate_tiny_gguf(file)
    if model.name in registry.names():
        _check_same(registry, model)
    else:
        registry.adopt(
            model.name,
            None if model.format is ModelFormat.OLLAMA else file,
            format=model.format,
            ollama_tag=model.ollama_tag,
            draft=model.draft,
        )


def _check_same(registry: ModelRegistry, model: ModelEntryConfig) -> None:
    """A configured model already registered must name the same weights: a
    registration is never silently kept over a config that says otherwise.

    Raises:
        RegistryError: the path, format or Ollama tag differ (names both and how
            to re-register).
    """
    entry = registry.entry(model.name)
    manifest = registry.root / f"{model.name}.toml"
    wanted = registry.root / model.path if model.path else None
    held = registry.root / entry.path if entry.path else None
    same_path = (wanted.resolve() if wanted else None) == (held.resolve() if held else None)
    differs = [
        what
        for what, same in (
            (f"path {model.path!r} (registered: {entry.path!r})", same_path),
            (f"format {model.format.value} (registered: {entry.format.value})",
             model.format is entry.format),
            (f"ollama_tag {model.ollama_tag!r} (registered: {entry.ollama_tag!r})",
             model.ollama_tag == entry.ollama_tag),
        )
        if not same
    ]  # fmt: skip
    if differs:
        raise RegistryError(
            f"the config gives {'; '.join(differs)}, but the name is already registered "
            f"in {manifest}: to register the new weights under this name, stop the node, "
            "remove that manifest (the weights are measured again at the next start), or "
            "give the new weights another name"
        )


# ---------------------------------------------------------------- once the node is open
def report_resumed(node: Node, config: NodeConfig, say: Say) -> None:
    """Say what the chain brought back, and where it and the config disagree."""
    recorded = node.rebuild().instances
    supervised = {view.instance_id: view for view in node.list()}
    configured = {instance_id(e.spec(), config.node.node_id): e for e in config.instances}
    for iid, inst in sorted(recorded.items()):
        view = supervised.get(iid)
        if view is None:
            say(f"warning: {iid} is in the chain but not supervised: see the error above")
            continue
        say(f"resumed {iid}: {view.lifecycle} (wanted {view.desired})")
        entry = configured.get(iid)
        if entry is None:
            say(f"note: {iid} is not in the config; it stays as the chain says")
            continue
        wanted = msgspec.to_builtins(entry.spec())
        changed = sorted(k for k, v in wanted.items() if inst.spec.get(k) != v)
        if changed:
            say(
                f"warning: {iid}: the config changed {', '.join(changed)} since the instance "
                "was placed; the recorded spec is used"
            )


def place_new(
    node: Node,
    config: NodeConfig,
    say: Say,
    *,
    stop_requested: Callable[[], bool] = lambda: False,
) -> list[str]:
    """Place (and start when asked) the configured instances the chain does not
    know. They are placed in batches (:meth:`Node.place_many`: admissions side
    by side, each batch's events in one transaction), in the config's order, so of two
    that want one address the first wins; then started one at a time in that
    order (a memory budget admits the first ones). One refused is said in one
    line and the rest go on. Returns the lines of the refusals."""
    known = set(node.rebuild().instances)
    new = [
        (n, entry, entry.spec())
        for n, entry in enumerate(config.instances, 1)
        if instance_id(entry.spec(), config.node.node_id) not in known
    ]
    refused: list[str] = []

    def refuse(n: int, spec: InstanceSpec, problem: str) -> None:
        line = f"[[instances]] #{n} ({spec.role} on port {spec.port}): {problem}"
        say(f"refused {line}")
        refused.append(line)

    placed: list[tuple[int, bool, InstanceSpec, str]] = []
    for first in range(0, len(new), PLACE_BATCH):
        if stop_requested():
            return refused
        batch = new[first : first + PLACE_BATCH]
        answers = node.place_many([spec for _, _, spec in batch], source="config")
        for (n, entry, spec), answer in zip(batch, answers, strict=True):
            if isinstance(answer, AdapterError | NodeError | pykka.ActorDeadError):
                refuse(n, spec, f"not placed: {_with_hint(config, spec, answer)}")
                continue
            if isinstance(answer, Exception):
                raise answer  # a bug, not a refusal: as a lone placement would
            say(f"placed {answer.instance_id}")
            placed.append((n, entry.start, spec, answer.instance_id))
    for n, start, spec, iid in placed:
        if stop_requested():
            break
        if start and (problem := _start_one(node, config, spec, iid, say)):
            refuse(n, spec, problem)
    return refused


#: Configured instances placed at once (each batch is one round of admissions).
PLACE_BATCH = 64


def _start_one(node: Node, config: NodeConfig, spec: InstanceSpec, iid: str, say: Say) -> str:
    """Start one placed instance; what went wrong ("" if nothing)."""
    try:
        view = node.start(iid, by="config")
    except (AdapterError, NodeError, pykka.ActorDeadError) as e:
        return f"placed as {iid} but not started: {_with_hint(config, spec, e)}"
    pid = f"pid {view.pid}, " if view.pid is not None else ""
    say(f"started {iid}: {view.lifecycle}, {pid}{view.endpoint}")
    return ""


def _with_hint(config: NodeConfig, spec: InstanceSpec, error: Exception) -> str:
    """The error, and the extra to install when the flavor's server is missing."""
    message = str(error) or type(error).__name__
    if spec.mode is not Mode.MANAGED or spec.flavor is Flavor.OLLAMA:
        return message
    llama = spec.flavor is Flavor.LLAMACPP
    program = config.node.llamacpp_program if llama else config.node.mlx_program
    hint = install_hint(spec.flavor)
    if hint in message or missing_extra(spec.flavor, program) is None:
        return message
    return f"{message} ({hint} installs it)"


def _shutdown(
    node: Node, control: ApiServer, inbox: queue.SimpleQueue[str], reason: str, say: Say
) -> int:
    """Stop the node on a helper thread; a signal meanwhile kills what is still stopping.

    Operator verbs that change state are refused from now on; the ones still
    running finish first (a signal meanwhile kills a server they stop).
    """
    failed: list[Exception] = []

    def work() -> None:
        try:
            bound = node.settings.stop_grace_s + IN_FLIGHT_WAIT_S
            if not control.stopping(timeout_s=bound):
                log.warning(
                    "shutdown: verbs still in flight after %.0f s; stopping the servers anyway",
                    bound,
                )
            node.shutdown(reason=reason)
            control.close()  # 503 for every request from now on, streams ended
        except (NodeError, ChainError, pykka.ActorDeadError) as e:
            failed.append(e)
        finally:
            inbox.put(_DONE)

    worker = threading.Thread(target=work, name="infervisor-shutdown")
    worker.start()
    while (name := _next_signal(inbox)) != _DONE:
        say(f"received {name} again: killing managed servers now")
        _kill_stopping(node)
    worker.join()
    if failed:
        say(f"error: the shutdown did not complete: {failed[0]}")
        with contextlib.suppress(NodeError, ChainError, pykka.ActorDeadError):
            node.shutdown(stop_servers=False, reason=f"{reason}; stop incomplete")
        return 1
    return 0


def _next_signal_or_failure(inbox: queue.SimpleQueue[str], node: Node) -> str | NodeFailure:
    """The next signal's name, or the node's failure if that comes first
    (looked at as often as the signal queue: twice a second)."""
    while (failure := node.failure) is None:
        try:
            return inbox.get(timeout=0.5)
        except queue.Empty:
            continue
    return failure


def _kill_stopping(node: Node) -> None:
    """A second stop of a stopping instance SIGKILLs its group at once."""
    with contextlib.suppress(NodeError, pykka.ActorDeadError):
        for view in node.list():
            if view.lifecycle == "stopping":
                node.stop(view.instance_id, grace_s=0, wait=False, by="shutdown")


def _next_signal(inbox: queue.SimpleQueue[str]) -> str:
    """Wait for the next entry, waking twice a second.

    The kernel may deliver SIGTERM to any of the node's threads; Python runs its
    handler only on the main thread, and only once that thread is back in the
    interpreter. A wait with no timeout could sleep through the signal for good.
    """
    while True:
        try:
            return inbox.get(timeout=0.5)
        except queue.Empty:
            continue


@contextlib.contextmanager
def _signals_into(inbox: queue.SimpleQueue[str]) -> Iterator[None]:
    def handler(signum: int, _frame: object) -> None:
        inbox.put(signal.Signals(signum).name)

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
