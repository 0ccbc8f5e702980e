"""``infervisor fleet``: the fleet's commands (status, place, drain, sync, check, serve).

Each takes the fleet file (:mod:`.config`) first. The work is in the
modules beside this one; here are the options, the output and the exit
statuses (docs/cli.md's table: 0 done; 1 refused, or a node's chain that
does not verify; 2 usage, a fleet file that cannot be used; 3 no node answers).
"""

from __future__ import annotations

import contextlib
import functools
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import click
import msgspec

from ..api.errors import ApiError, VerbFailed
from ..clikit.command import REASON, SECONDS, Group
from ..clikit.failure import Failure, echo_json, fail
from ..clikit.wanted import state_words
from .config import FleetConfig, FleetConfigError, NodeEntry, load_config
from .follow import Refused, diverged, follow
from .node_api import client_of
from .status import COLUMNS, gather, table_rows
from .store import FleetStore, StoreError
from .witness import CheckResult, check_node, diverged_failure

__all__ = ["fleet"]

_FILE = click.argument("fleet_file", metavar="FLEET.toml", type=click.Path(path_type=Path))
_JSON = click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
_TIMEOUT = click.option(
    "--timeout",
    "timeout_s",
    type=SECONDS,
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for each node's answer.",
)


def _config(path: Path) -> FleetConfig:
    try:
        return load_config(path)
    except FleetConfigError as e:
        raise Failure(str(e), "bad_config", "FLEET.toml") from e


def _store(config: FleetConfig) -> FleetStore:
    try:
        return FleetStore(config.store)
    except StoreError as e:
        raise Failure(str(e), "bad_path", "[fleet] store") from e


@click.group(cls=Group)
def fleet() -> None:
    """Follow many nodes through their APIs: one status table, placements, drains,
    and a witness of every node's chain.

    FLEET.toml lists the nodes ([[nodes]] name, url, token or token_file, pub)
    and the fleet's own store ([fleet] store, metrics): see docs/fleet.md.
    """


@fleet.command()
@_FILE
@_JSON
@_TIMEOUT
@click.option("-w", "--watch", is_flag=True, help="Redraw every 2 s (Ctrl-C ends it).")
def status(fleet_file: Path, as_json: bool, timeout_s: float, watch: bool) -> None:
    """One table of every node's instances (node, instance, state, model, memory),
    read live from each node; a node that does not answer is shown unreachable.

    --json: {"nodes": [{"node", "url", "up", "error", "node_id", "head_seq",
    "cordon", "instances": [the node's own GET /v1/instances]}]}.
    Exit 0 when every node answered, 3 when one did not.
    """
    config = _config(fleet_file)
    if not watch:
        sys.exit(_show(config, as_json, timeout_s))
    terminal = sys.stdout.isatty() and not as_json
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            if terminal:
                click.echo("\x1b[H\x1b[2J", nl=False)  # as `infervisor status -w`
            _show(config, as_json, timeout_s)
            sys.stdout.flush()
            time.sleep(_REDRAW_S)  # the redraw period, not a synchronisation
    sys.exit(0)


_REDRAW_S = 2.0


def _show(config: FleetConfig, as_json: bool, timeout_s: float) -> int:
    found = gather(config, timeout_s)
    if as_json:
        echo_json(found)
    else:
        lines = [COLUMNS, *table_rows(found)]
        widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
        for line in lines:
            click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
        for node in found.nodes:
            if not node.up:
                click.echo(f"{node.node}: {node.error}", err=True)
    return 0 if all(n.up for n in found.nodes) else 3


@fleet.command()
@_FILE
@click.argument("spec", metavar="SPEC.toml", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--node", "node_name", metavar="NAME", help="Place it on this node.")
@click.option("--controller", metavar="ID", help="Place as this controller (with --generation).")
@click.option("--generation", type=click.IntRange(min=0), default=0, metavar="N")
@click.option("--start", "start_it", is_flag=True, help="Start it once placed.")
@_JSON
@_TIMEOUT
def place(  # noqa: PLR0917 - one parameter per option, as click passes them
    fleet_file: Path,
    spec: Path,
    node_name: str | None,
    controller: str | None,
    generation: int,
    start_it: bool,
    as_json: bool,
    timeout_s: float,
) -> None:
    """Place the instance SPEC.toml describes (the keys of a node config's
    [[instances]] table, as `infervisor place --file`) on the node --node names,
    else on a node whose registry has its model (GET /v1/models), that is not
    cordoned, whose allowed ports take its port and has the most room for it
    (memory budget less reservations, else available memory: GET /v1/node's
    inventory). Without --node, a node that refuses it for a reason of its own
    (409 port_taken, cordoned...; 422 memory_budget, admission_refused: nothing
    recorded) is passed over for the next; never one that did not answer.

    Prints the node chosen and the node's answer (--json: {"node", "answer",
    "passed_over": [{"node", "reason"}]}). Exit 0 once placed; 1 when no node
    fits or every node refuses (each named) or a node refuses what every node
    would (400); 2 when the file or SPEC is wrong; 3 when no node is there, 4
    (no_answer) when it is there and did not answer (asked the placement, it
    may have taken it: see its GET /v1/instances); no other node is tried then.
    """
    from ..operator.place import spec_of_fragment  # noqa: PLC0415 - keeps --help fast

    config = _config(fleet_file)
    instance, start_key = spec_of_fragment(spec, {}, name="SPEC")
    on = functools.partial(
        _place_on,
        instance=instance,
        timeout_s=timeout_s,
        controller=controller,
        generation=generation,
        start=start_it or start_key,
    )
    passed: list[dict[str, str]] = []
    if node_name is not None:
        entry = _named(config, node_name)
        try:
            answer = on(entry)
        except ApiError as e:
            _api_failure(entry.name, e)
    else:
        entry, answer, passed = _place_anywhere(config, spec, instance, on, timeout_s)
    if as_json:
        echo_json({"node": entry.name, "answer": answer, "passed_over": passed})
        return
    click.echo(
        f"{entry.name}: {answer.instance_id}: {answer.outcome}; "
        f"{state_words(answer.instance)}; seq {answer.seq}"
    )


@fleet.command()
@_FILE
@click.argument("node_name", metavar="NODE")
@click.option("--reason", type=REASON, help="Why (recorded in the node's chain): one line.")
@_JSON
@_TIMEOUT
def drain(
    fleet_file: Path, node_name: str, reason: str | None, as_json: bool, timeout_s: float
) -> None:
    """Drain NODE (POST /v1/node/drain): it takes no new placements and stops the
    instances controllers placed, with their grace; POST /v1/node/uncordon ends it.
    Exit 0 once drained; 1 refused; 3 no answer.
    """
    config = _config(fleet_file)
    entry = _named(config, node_name)
    try:
        with client_of(entry, control=True, timeout_s=timeout_s) as client:
            answer = client.cordon("drain", reason)
    except ApiError as e:
        _api_failure(entry.name, e)
    if as_json:
        echo_json({"node": entry.name, "answer": answer})
        return
    stopped = ", ".join(answer.stopped) or "nothing"
    click.echo(f"{entry.name}: {answer.cordon}; stopped {stopped}")


def _place_on(entry: NodeEntry, *, instance: Any, timeout_s: float, **how: Any) -> Any:
    """`entry`'s answer to placing `instance` (``POST /v1/instances``).

    Raises:
        ApiError: the node refused it, or did not answer (it may have taken it).
    """
    with client_of(entry, control=True, timeout_s=timeout_s) as client:
        return client.place(instance, **how)


def _place_anywhere(
    config: FleetConfig, spec: Path, instance: Any, on: Any, timeout_s: float
) -> tuple[NodeEntry, Any, list[dict[str, str]]]:
    """Place on the best node that takes it: the weighed order (.placing), moving on
    only after a refusal about that node (:func:`_refusal_of_the_node`: nothing was
    recorded there); the node chosen, its answer and every node passed over, why."""
    from .placing import choose  # noqa: PLC0415 - keeps --help fast

    weighed = choose(config, instance.model, instance.port, timeout_s)
    fit = [c.entry for c in weighed if c.refused is None]
    unfit = [{"node": c.entry.name, "reason": str(c.refused)} for c in weighed if c.refused]
    refused: list[dict[str, str]] = []
    for i, entry in enumerate(fit):
        try:
            answer = on(entry)
        except ApiError as e:
            if not _refusal_of_the_node(e):
                _api_failure(entry.name, e)  # a timeout: it may have taken it
            refused.append({"node": entry.name, "reason": f"it refused: {e}"})
            continue
        less = [{"node": other.name, "reason": "less room"} for other in fit[i + 1 :]]
        return entry, answer, refused + less + unfit
    reasons = "; ".join(f"{p['node']}: {p['reason']}" for p in refused + unfit)
    fail(f"no node takes {spec}: {reasons}", "refused", "SPEC")


def _refusal_of_the_node(e: ApiError) -> bool:
    """A refusal about the node itself, which another may not make (409 port_taken,
    cordoned...; 422 memory_budget, admission_refused): nothing was recorded. Not a
    400 (bad_spec: every node refuses it), nor a timeout or a failure (maybe recorded)."""
    return isinstance(e, VerbFailed) and e.status in {409, 422}


def _named(config: FleetConfig, name: str) -> Any:
    try:
        return config.node(name)
    except FleetConfigError as e:
        raise Failure(str(e), "bad_value", "NODE") from e


def _api_failure(node: str, e: ApiError) -> NoReturn:
    code = getattr(e, "code", "node_error") or "node_error"
    fail(f"node {node}: {e}", code, getattr(e, "field", None))


@fleet.command()
@_FILE
@_JSON
@_TIMEOUT
def sync(fleet_file: Path, as_json: bool, timeout_s: float) -> None:
    """Store every node's events up to its head (from the last seq stored), checking
    each event's link. Exit 0 when all are stored; 1 when a node sent an event that
    does not verify (named; nothing of it stored) or its head is below the events
    stored of it (truncated); 3 when a node does not answer.
    """
    config = _config(fleet_file)
    with _store(config) as store, _store_failure():
        results = [_sync_one(e, store, timeout_s) for e in config.nodes]
    _finish(results, as_json)


@contextlib.contextmanager
def _store_failure() -> Iterator[None]:
    """A store that fails midway (disk full, locked beyond its timeout): one line, exit 1."""
    try:
        yield
    except StoreError as e:
        raise Failure(str(e), "record_failed", "[fleet] store") from e


def _sync_one(entry: Any, store: FleetStore, timeout_s: float) -> CheckResult:
    held = store.count(entry.name)
    try:
        with client_of(entry, timeout_s=timeout_s) as client:
            added = follow(entry, client, store, keep_following=False)
            found = diverged(client, store.last(entry.name))
    except ApiError as e:
        return CheckResult(
            node=entry.name, outcome="unreachable", verified_size=held, size=None, detail=str(e)
        )
    except Refused as e:
        return CheckResult(
            node=entry.name, outcome="event_refused", verified_size=held, size=None, detail=str(e)
        )
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        detail = f"node {entry.name}: an event not understood (another version?): {e}"
        return CheckResult(
            node=entry.name, outcome="event_refused", verified_size=held, size=None, detail=detail
        )
    departed = diverged_failure(entry, store, held + added, found)
    if departed is not None:
        return departed
    return CheckResult(
        node=entry.name,
        outcome="ok",
        verified_size=held,
        size=held + added,
        detail=f"{added} new events stored ({held + added} in all)",
    )


@fleet.command()
@_FILE
@_JSON
@_TIMEOUT
def check(fleet_file: Path, as_json: bool, timeout_s: float) -> None:
    """Witness every node's chain: store its new events (each link checked), then
    check its newest signed checkpoint against the last one the fleet verified:
    signed by the node's pub (or a key a rotation in its chain links to it), not
    smaller (truncated), consistent with it (RFC 6962 proof; else forked or
    rewritten), and committing to the events stored.

    One line per node (--json: {"nodes": [{"node", "outcome", "verified_size",
    "size", "detail"}]}). Exit 0 when every chain verifies; 1 naming the nodes whose
    chain does not; 3 when a node does not answer (and none failed).
    """
    config = _config(fleet_file)
    results: list[CheckResult] = []
    with _store(config) as store, _store_failure():
        for entry in config.nodes:
            synced = _sync_one(entry, store, timeout_s)
            if synced.outcome != "ok":
                results.append(synced)
                continue
            with client_of(entry, timeout_s=timeout_s) as client:
                results.append(check_node(entry, client, store))
    _finish(results, as_json)


def _finish(results: list[CheckResult], as_json: bool) -> NoReturn:
    if as_json:
        click.echo(msgspec.json.format(msgspec.json.encode({"nodes": results}), indent=2))
    else:
        for r in results:
            click.echo(f"{r.node}: {r.outcome}: {r.detail}")
    bad = [r for r in results if r.outcome not in ("ok", "no_checkpoint", "unreachable")]
    if bad:
        names = ", ".join(f"{r.node} ({r.outcome})" for r in bad)
        click.echo(f"error: the chain of {names} does not verify", err=True)
        sys.exit(1)
    down = [r.node for r in results if r.outcome == "unreachable"]
    if down:
        click.echo(f"error: no answer from {', '.join(down)}", err=True)
        sys.exit(3)
    sys.exit(0)


@fleet.command()
@_FILE
@click.option(
    "--metrics",
    "listen",
    metavar="HOST:PORT",
    help="Serve /metrics here (default: [fleet] metrics; port 0: any free port).",
)
def serve(fleet_file: Path, listen: str | None) -> None:
    """Follow every node continuously (its events into the store, reconnecting
    when it restarts), check its checkpoints each [fleet] check_interval_s, and
    serve Prometheus metrics per node (up, events behind, verified size,
    verification failures). Prints `listening on http://HOST:PORT/metrics`
    once serving. SIGTERM or Ctrl-C ends it (exit 0); a kill loses nothing
    committed: the next run resumes from the store.
    """
    from .config import parse_listen  # noqa: PLC0415
    from .serve import Fleet  # noqa: PLC0415 - prometheus-client only here

    config = _config(fleet_file)
    address = config.metrics
    if listen is not None:
        try:
            address = parse_listen(listen, "--metrics")
        except FleetConfigError as e:
            raise Failure(str(e), "bad_value", "--metrics") from e
    _store(config).close()
    running = Fleet(config)
    bound = running.start(address)
    if bound is not None:
        click.echo(f"listening on http://{bound[0]}:{bound[1]}/metrics", err=False)
        sys.stdout.flush()
    signal.signal(signal.SIGTERM, lambda *_: running.stop())
    with contextlib.suppress(KeyboardInterrupt):
        while not running.stopping.wait(1.0):
            pass
    sys.exit(0)
