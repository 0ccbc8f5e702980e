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

Exit status: 0 after a clean stop; 1 when a server could not be stopped, or
when the chain fails its check at boot (a bad row, a checkpoint or a witness it
fails against, an event that cannot be replayed; a witness's refusal): a
finding about the data, as every reader's ``chain_invalid``; 2
when the node cannot run as configured (the data_dir cannot be created or is
used by another run, the chain belongs to another node, a model file is
missing): reported in one line, and found before anything is created or
recorded where it can be (:func:`.boot.preflight`). 3 when the node failed
while running (one of its node-wide actors died, or the supervisor stopped
ticking: see
:mod:`infervisor.actors.watchdog`): the cause is named in one line, the node
is shut down as far as it still can be, and the next run resumes from the
chain (a managed server it could not stop is re-attached then). A node never
runs on without its ticks.

While it runs, operators and controllers reach it through its control API
(:mod:`infervisor.tools.api`, docs/api.md) on ``<data_dir>/api.sock`` and, when ``[api] tcp``
is set, a loopback TCP port with bearer tokens: the listeners are open from
the moment the run lock is held (requests are answered 503 "starting" until
the node is open) until the node is shut down; once the shutdown begins,
verbs that change state are answered 503 "stopping", and the shutdown waits
for the verbs already in flight.

Under a service manager (``$NOTIFY_SOCKET``: systemd's ``Type=notify``) the
node says ``READY=1`` once it has resumed and its API answers, ``STATUS=``
lines as it goes, ``STOPPING=1`` when a graceful stop begins, and
``WATCHDOG=1`` from the supervisor's health tick when ``$WATCHDOG_USEC`` is
set (:mod:`infervisor.adapters.sdnotify`). On each change of what is loaded
it rewrites ``DATA_DIR/resident.json`` (and ``[node] features_file``):
:mod:`.resident`.

Signals are only queued by the handler (``SimpleQueue.put`` is safe there);
the main thread reads the queue, and looks at the node's failure, and does
the work.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click
import pykka

from infervisor.actors.errors import NodeError
from infervisor.actors.watchdog import NodeFailure
from infervisor.adapters.sdnotify import Notifier
from infervisor.chain import ChainError, StoredEvent
from infervisor.replay import EventDecodeError, decode_event, reason_of

from ..api.errors import ApiError
from ..clikit import startup
from ..clikit.command import Command
from ..clikit.failure import fail
from .lock import RunError, claim_data_dir
from .resident import ResidentFiles

if TYPE_CHECKING:
    from infervisor.actors.node import Node
    from infervisor.replay import NodeState

    from ..api.serving.server import ApiServer
    from ..front.server import FrontServer
    from .config import NodeConfig

__all__ = ["EXIT_FAILED", "STOP_SIGNALS", "event_line", "run", "run_node", "serve"]

#: Each stops the node gracefully; a second one kills what is still stopping.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: The exit status of a run whose node failed while running.
EXIT_FAILED = 3

#: Seconds beyond the stop grace the shutdown waits for changing verbs in flight
#: (a stop's grace is bounded by the node's; a placement's admission may take
#: longer: it is then answered 503 by the ended node).
IN_FLIGHT_WAIT_S = 30.0

log = logging.getLogger(__name__)

Say = Callable[[str], None]
_DONE = ""  # queued by the shutdown thread; signal names are never empty


@click.command(cls=Command)
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--accept-witness-conflict",
    is_flag=True,
    help="Resume although a witness refuses the chain at boot (it cosigned more of it than "
    "it has, or something it does not extend); recorded as node.witness_override.",
)
def run(config: Path, accept_witness_conflict: bool) -> None:
    """Run a node in the foreground from a TOML CONFIG until SIGINT, SIGTERM or SIGHUP.

    On SIGINT (Ctrl-C), SIGTERM or SIGHUP (closing the terminal) the managed
    servers are stopped gracefully and recorded as still wanted running; a
    second signal kills them at once. Events print as lines; Python logging
    goes to DATA_DIR/node.log.
    Started again on the same data directory, the node rebuilds itself from
    its chain: instances wanted running are started, stopped ones stay
    stopped, and configured instances it does not know yet are placed. See
    examples/node.toml for every key.

    While it runs, `infervisor status CONFIG` shows its instances and
    `infervisor start|stop|restart|unload CONFIG INSTANCE` acts on them,
    through its HTTP control API on the socket DATA_DIR/api.sock (and, with
    [api] tcp, a loopback port with bearer tokens: --url, --token).

    Under systemd (Type=notify, WatchdogSec=) it sends READY=1 once resumed
    and answering, and WATCHDOG=1 from its supervisor's ticks. It keeps
    DATA_DIR/resident.json (and [node] features_file, a Kubernetes NFD
    feature file) up to date with what is loaded (docs/deploy.md).

    With [[witnesses]] configured, the boot first asks each witness what it
    cosigned of this chain: a rollback or a fork is refused (exit 1, naming
    the witness and both sizes) unless --accept-witness-conflict; a witness
    that does not answer in time does not hold the boot back.

    Exit 0 after a clean stop; 1 when a server could not be stopped, or when
    the chain fails its check at boot (tampered, truncated, an event that
    cannot be replayed, a witness's refusal: one line names the seq); 2 when
    the config or its data directory cannot be used (one line names the key,
    file or folder).
    """
    from .config import ConfigError, load_config  # noqa: PLC0415 - keeps --help fast

    try:
        cfg = load_config(config)
    except ConfigError as e:
        fail(str(e), "bad_config")
    sys.exit(run_node(cfg, Terminal(), accept_witness_conflict=accept_witness_conflict))


class Terminal:
    """The operator's terminal (stderr), where ``run`` says what happens.

    Nothing the node does waits on anyone reading it: once a write fails (a
    closed pipe, as ``infervisor run | head`` leaves; EIO from a terminal that
    hung up), stderr is pointed at /dev/null and the lines are dropped, so the
    node boots, serves and stops gracefully as it would have (node.log and the
    chain keep the record).
    """

    def __init__(self) -> None:
        self.gone = False

    def __call__(self, line: str) -> None:
        if self.gone:
            return
        try:
            click.echo(line, err=True)
        except OSError:
            self.gone = True
            log.warning("the terminal is gone (stderr): further lines only in node.log")
            with contextlib.suppress(OSError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stderr.fileno())
                os.close(devnull)


def run_node(config: NodeConfig, say: Say, *, accept_witness_conflict: bool = False) -> int:
    """Run until SIGINT, SIGTERM or SIGHUP; returns the exit status (see the module docstring)."""
    from . import boot, placing  # noqa: PLC0415 - the node and its API load when it runs

    inbox: queue.SimpleQueue[str] = queue.SimpleQueue()
    notify = Notifier.from_environ()
    with _signals_into(inbox), contextlib.ExitStack() as held:
        try:
            notify.status("starting: checking the config and the data directory")
            boot.preflight(config)
            held.enter_context(claim_data_dir(config.node))
            log_file = Path(config.node.data_dir) / boot.LOG_FILE
            log = held.enter_context(boot.diagnostics_to(log_file))
            boot.raise_descriptor_limit(config.api)
            control = held.enter_context(boot.listen_for_operators(config))
            front = boot.listen_for_clients(config, control)
            if front is not None:
                held.callback(front.close)
            files = _resident_files(config, notify)
            notify.status("starting: verifying and replaying the chain, re-attaching servers")
            node = boot.open_node(
                config,
                on_event=_printing_and_waking(say, control, files.observe),
                accept_witness_conflict=accept_witness_conflict,
            )
        except RunError as e:
            say(f"error: {e}")
            notify.status(f"failed: {e}")
            return e.exit_status
        files.start()
        held.callback(files.stop)
        try:
            control.serve(node)
        except ApiError as e:
            say(f"error: {e}")
            node.shutdown(reason=f"the API cannot serve: {e}")
            return 2
        startup.done()  # the node is open and its API serves (tools/clikit/startup.py)
        if front is not None:
            front.serve(node)
        say(f"diagnostics (Python logging): {log}")
        for note in node.witness_notes:
            say(f"warning: {note}")
        placing.report_resumed(node, config, say)
        _ready(node, notify, say)
        placing.place_new(node, config, say, stop_requested=lambda: not inbox.empty())
        say(f"node {config.node.node_id} running; chain {config.node.chain_path}")
        say(f"control API: {control.path}" + (f" and {control.url}" if control.url else ""))
        if front is not None:
            say(f"OpenAI-compatible endpoint: {front.url}/v1 (the API's bearer tokens)")
        say(f"operator verbs: infervisor status|start|stop|restart|unload {control.path.parent}")
        say("Ctrl-C or SIGTERM stops it; so does SIGHUP (closing the terminal)")
        return serve(node, control, inbox, say, notify=notify, front=front)


def _resident_files(config: NodeConfig, notify: Notifier) -> ResidentFiles:
    """The resident-models files' writer, telling the service manager what runs."""

    def status(state: NodeState) -> None:
        running = sum(i.lifecycle == "running" for i in state.instances.values())
        notify.status(f"running: {running} of {len(state.instances)} instances running")

    node = config.node
    features = Path(node.features_file) if node.features_file else None
    return ResidentFiles(node.chain_path, Path(node.data_dir), features, on_change=status)


def _ready(node: Node, notify: Notifier, say: Say) -> None:
    """Tell the service manager the node has resumed and answers; ping its
    watchdog from the supervisor's ticks from now on (they stop if it stalls)."""
    if not notify.enabled:
        return
    if notify.watchdog_s is not None:
        if node.settings.tick_s > notify.watchdog_s / 4:
            say(
                f"warning: WatchdogSec ({notify.watchdog_s:g} s) should be at least 4 times "
                f"the supervisor's tick ({node.settings.tick_s:g} s)"
            )
        node.on_tick(notify.watchdog)
    views = node.list()
    running = sum(v.lifecycle == "running" for v in views)
    notify.ready(f"running: {running} of {len(views)} instances running")


def _printing_and_waking(
    say: Say, api: ApiServer, also: Callable[[StoredEvent], None] | None = None
) -> Callable[[StoredEvent], None]:
    """The node's event observer: one line per durable event, the API's watch
    streams woken, and ``also`` told (the resident-models files)."""

    def observe(stored: StoredEvent) -> None:
        api.notify(stored)  # first: a blocked terminal must not hold the watch streams back
        if also is not None:
            also(stored)
        say(event_line(stored))

    return observe


def serve(
    node: Node,
    control: ApiServer,
    inbox: queue.SimpleQueue[str],
    say: Say,
    *,
    notify: Notifier | None = None,
    front: FrontServer | None = None,
) -> int:
    """Run until a signal arrives or the node fails, then shut it down; the exit status.

    ``notify``: the service manager, told ``STOPPING=1`` when the stop begins;
    ``front``: the OpenAI-compatible endpoint, answering 503 from then on and
    closed once the node is shut down.
    """
    notify = notify or Notifier(None)
    stopped_by = _next_signal_or_failure(inbox, node)
    if isinstance(stopped_by, NodeFailure):
        say(f"error: the node failed: {stopped_by}")
        say("shutting it down; a run started again resumes from the chain")
        notify.stopping(f"failed: {stopped_by}; stopping")
        _shutdown(node, control, inbox, f"node failed: {stopped_by}", say, front=front)
        return EXIT_FAILED
    say(f"received {stopped_by}: stopping managed servers (send it again to kill them at once)")
    notify.stopping(f"stopping: received {stopped_by}; stopping the managed servers")
    status = _shutdown(
        node, control, inbox, f"infervisor run received {stopped_by}", say, front=front
    )
    if status == 0:
        say("stopped")
    return status


def event_line(stored: StoredEvent) -> str:
    """One line of live output for an event: seq, kind, instance, why."""
    try:
        why = reason_of(decode_event(stored))
    except EventDecodeError as e:
        why = str(e)
    subject = f" {stored.subject}" if stored.subject else ""
    return f"[{stored.seq}] {stored.kind}{subject}: {why}"


def _shutdown(
    node: Node,
    control: ApiServer,
    inbox: queue.SimpleQueue[str],
    reason: str,
    say: Say,
    *,
    front: FrontServer | None = None,
) -> int:
    """Stop the node on a helper thread; a signal meanwhile kills what is still stopping.

    Operator verbs that change state are refused from now on, and so are the
    front's new requests; the verbs still running finish first (a signal
    meanwhile kills a server they stop).
    """
    failed: list[Exception] = []

    def work() -> None:
        try:
            if front is not None:
                front.stopping()
            bound = node.settings.stop_grace_s + IN_FLIGHT_WAIT_S
            if not control.stopping(timeout_s=bound):
                log.warning(
                    "shutdown: verbs still in flight after %.0f s; stopping the servers anyway",
                    bound,
                )
            node.shutdown(reason=reason)
            control.close()  # 503 for every request from now on, streams ended
            if front is not None:
                front.close()
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
    """A second stop of a stopping instance SIGKILLs its group at once.

    Each instance's lifecycle is asked of its actor (``status``), not read from
    ``list``'s board of posted views, which may not yet show a stop that the
    chain (and so the operator sending this signal) already does."""
    for view in node.list():
        with contextlib.suppress(NodeError, pykka.ActorDeadError):
            if node.status(view.instance_id).lifecycle == "stopping":
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
