"""The ``infervisor`` command line: a thin layer over the library.

Exit status: 0 success; 1 the thing checked is bad (an invalid chain, a chain
that cannot be replayed, a failed demo step); 2 usage or I/O errors (click's
own convention for usage). Bad input is reported in one line, never a traceback.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
import msgspec

from infervisor.actors.messages import InstanceView
from infervisor.adapters.spec import Flavor, InstanceSpec
from infervisor.chain import ChainError, verify_chain
from infervisor.replay import (
    EventDecodeError,
    InstanceState,
    NodeState,
    ReplayError,
    TimelineEntry,
    rebuild,
    timeline,
)

from .control import (
    ControlClient,
    ControlError,
    NodeStarting,
    NodeStopping,
    NodeUnavailable,
    NotRunning,
    VerbFailed,
)

__all__ = ["main"]


def _json(obj: Any) -> None:
    click.echo(msgspec.json.format(msgspec.json.encode(obj), indent=2))


T = TypeVar("T")


def _fail(message: str, status: int = 2) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(status)


def _fail_io(e: Exception) -> NoReturn:
    _fail(str(e))


def _existing_db(path: Path) -> Path:
    if path.is_dir():
        _fail(f"{path} is a folder; give the chain file (DATA_DIR/chain.db)")
    if not path.is_file():
        _fail(f"{path}: no such chain file")
    return path


def _read_chain(db: Path, query: Callable[[Path], T]) -> T:
    """Run a replay query on DB: exit 2 when unreadable, 1 when it cannot be replayed."""
    try:
        return query(_existing_db(db))
    except ChainError as e:
        _fail_io(e)
    except (EventDecodeError, ReplayError) as e:
        _fail(f"{db} cannot be replayed: {e} (check it with: infervisor chain verify {db})", 1)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log what the actors do (to stderr).")
def cli(verbose: bool) -> None:
    """Supervise local LLM model servers (llama.cpp, mlx-lm, Ollama) with an
    append-only, BLAKE3 hash-chained audit log in SQLite.

    \b
    Start here:   infervisor demo
    Run a node:   infervisor run examples/node.toml
    Operate it:   infervisor status examples/node.toml
                  infervisor stop|start|restart|unload DATA_DIR INSTANCE_ID
    Audit:        infervisor chain verify DATA/chain.db
                  infervisor replay DATA/chain.db
                  infervisor timeline DATA/chain.db INSTANCE_ID
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@cli.command()
@click.option(
    "--dir",
    "workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Work in this new or empty folder instead of a new temporary one. Either way "
    "the folder is kept afterwards, so its chain can be audited.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report instead of text.")
@click.option(
    "--flavor",
    type=click.Choice(["llamacpp", "mlx-lm"]),
    default="llamacpp",
    show_default=True,
    help="Server software: llama.cpp (the llamacpp extra) or mlx-lm (the mlx extra).",
)
def demo(workdir: Path | None, as_json: bool, flavor: str) -> None:
    """Run the main job offline on a real llama.cpp server and a tiny generated model.

    Generates the model, starts a managed server, sends a completion,
    SIGKILLs the server and watches the supervised restart, stops it, verifies
    the chain and prints the instance's timeline. Exit 0 only if every step held.
    """
    from .demo import data_dir_default, run_demo  # noqa: PLC0415 - keeps --help fast

    if workdir is not None and workdir.exists() and any(workdir.iterdir()):
        _fail_io(
            FileExistsError(f"--dir {workdir} is not empty: the demo needs a new or empty folder")
        )
    workdir = workdir or data_dir_default()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _fail_io(OSError(f"--dir {workdir}: cannot create it: {e.strerror or e}"))
    quiet = as_json
    say = (lambda _m: None) if quiet else click.echo
    progress = (lambda _m: None) if quiet or not sys.stderr.isatty() else _progress
    if not quiet:
        click.echo(f"infervisor demo in {workdir}")
    report = run_demo(workdir, say, progress, Flavor(flavor))
    if as_json:
        _json(report)
    else:
        click.echo("\ntimeline of " + report.instance_id)
        _print_timeline(report.timeline)
        total = sum(s.seconds for s in report.steps)
        click.echo(
            f"\n{'demo ok' if report.ok else 'demo FAILED'} ({total:.1f} s); chain: "
            f"{workdir / 'chain.db'}"
        )
    sys.exit(0 if report.ok else 1)


def _progress(line: str) -> None:
    click.echo("\r" + line.ljust(60), nl=not line, err=True)


@cli.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def run(config: Path) -> None:
    """Run a node in the foreground from a TOML CONFIG until SIGINT or SIGTERM.

    On SIGINT (Ctrl-C) or SIGTERM the managed servers are stopped gracefully
    and recorded as still wanted running; a second signal kills them at once.
    Started again on the same data directory, the node rebuilds itself from
    its chain: instances wanted running are started, stopped ones stay
    stopped, and configured instances it does not know yet are placed. See
    examples/node.toml for every key.

    While it runs, `infervisor status CONFIG` shows its instances and
    `infervisor start|stop|restart|unload CONFIG INSTANCE` acts on them,
    through the socket DATA_DIR/control.sock.

    Exit 0 after a clean stop; 1 when a server could not be stopped; 2 when
    the config or its data directory cannot be used (one line names the key,
    file or folder).
    """
    from .config import ConfigError, load_config  # noqa: PLC0415
    from .run import run_node  # noqa: PLC0415

    try:
        cfg = load_config(config)
    except ConfigError as e:
        _fail_io(e)
    sys.exit(run_node(cfg, lambda m: click.echo(m, err=True)))


@cli.group()
def chain() -> None:
    """Audit the event chain."""


@chain.command("verify")
@click.argument("db", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
def chain_verify(db: Path, as_json: bool) -> None:
    """Verify every hash and link of the chain in DB.

    Exit 0 when valid; 1 when not, naming the first bad sequence number and
    why; 2 when the file cannot be read.
    """
    try:
        report = verify_chain(_existing_db(db))
    except ChainError as e:
        _fail_io(e)
    if as_json:
        _json(report)
    elif report.ok:
        click.echo(
            f"ok: {report.events} events, node {report.node}, head seq {report.head_seq} "
            f"{report.head_hash}"
        )
    else:
        p = report.problem
        assert p is not None
        click.echo(f"INVALID at seq {p.seq}: {p.reason}: {p.detail}")
    sys.exit(0 if report.ok else 1)


@cli.command()
@click.argument("db", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the state as JSON.")
def replay(db: Path, as_json: bool) -> None:
    """Rebuild and print the node state from the chain in DB alone.

    One line per instance: id, lifecycle state, wanted state, pid, restarts,
    reason. Replay does not check hashes: a chain that does not verify is
    replayed as stored, with a warning on stderr. Exit 1 when an event does
    not fit (unknown kind, impossible transition), 2 when DB cannot be read.
    """
    state = _read_chain(db, rebuild)
    _warn_unverified(db)
    if as_json:
        _json(state)
        return
    click.echo(
        f"node {state.node_id}: head seq {state.head_seq}, {state.boots} boots, "
        f"{len(state.instances)} instances"
    )
    for iid, inst in sorted(state.instances.items()):
        pid = inst.process.pid if inst.process else "-"
        click.echo(
            f"  {iid:<32} {inst.lifecycle:<10} wanted {inst.desired:<8} pid {pid!s:<8} "
            f"restarts {inst.restarts}  {inst.reason}"
        )


def _warn_unverified(db: Path) -> None:
    report = verify_chain(db)
    if report.problem is not None:
        p = report.problem
        click.echo(
            f"warning: {db} does not verify (seq {p.seq}: {p.reason}); "
            "replayed as stored: see infervisor chain verify",
            err=True,
        )


@cli.command("timeline")
@click.argument("db", type=click.Path(path_type=Path))
@click.argument("instance")
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON.")
def timeline_cmd(db: Path, instance: str, as_json: bool) -> None:
    """Print INSTANCE's events from the chain in DB, one line each.

    Columns: seq, time (UTC), lifecycle state before -> after, reason. Exit 2
    naming the chain's instances when INSTANCE has no events.
    """
    entries = _read_chain(db, lambda path: timeline(path, instance))
    if not entries:
        state: NodeState = _read_chain(db, rebuild)
        known = ", ".join(sorted(state.instances)) or "none"
        _fail(f"no events for instance {instance!r} in {db}; its instances: {known}")
    if as_json:
        _json(entries)
    else:
        _print_timeline(entries)


def _print_timeline(entries: list[TimelineEntry]) -> None:
    for e in entries:
        when = dt.datetime.fromtimestamp(e.ts_ns / 1e9, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
        when = when[:-3] + "Z"
        click.echo(f"  {e.seq:>5} {when} {e.frm:>10} -> {e.to:<10} {e.reason}")


# ---------------------------------------------------------------- operator verbs
# Against the node running on a data directory, through its control socket.
_DATA_DIR = click.argument("data_dir", metavar="DATA_DIR", type=click.Path(path_type=Path))
_COLUMNS = (
    "INSTANCE",
    "ADAPTER",
    "LIFECYCLE",
    "DESIRED",
    "HEALTH",
    "PID",
    "RESTARTS",
    "MiB RES/RSS",
    "REASON",
)
_MIB = 1024 * 1024


def _data_dir(arg: Path) -> Path:
    """The data directory named by ARG: itself, or the data_dir of a config file."""
    from .config import ConfigError, load_config  # noqa: PLC0415 - keeps --help fast

    if arg.suffix == ".toml" and not arg.is_dir():
        try:
            return Path(load_config(arg).node.data_dir)
        except ConfigError as e:
            _fail_io(e)
    if arg.is_file():
        _fail(f"{arg} is a file; give the node's data directory or its config file (.toml)")
    return arg


def _ask(data_dir: Path, verb: Callable[[ControlClient], T]) -> T:
    """Run VERB on the node: exit 1 with the node's message when refused, 2 when no node runs."""
    try:
        with ControlClient(data_dir) as client:
            return verb(client)
    except VerbFailed as e:
        _fail(str(e), 1)
    except ControlError as e:
        _fail(str(e))


@cli.command()
@_DATA_DIR
@click.argument("instance", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the instances' views as JSON.")
def status(data_dir: Path, instance: str | None, as_json: bool) -> None:
    """Show the instances of the node running on DATA_DIR (or only INSTANCE).

    DATA_DIR is the node's data directory or its config file (.toml).
    Columns: id, adapter, lifecycle state, wanted state, last health verdict,
    pid, restarts, memory reserved by the budget / resident (MiB), reason.

    When no node runs there, the state is replayed from DATA_DIR/chain.db
    instead, and stderr says so; health and memory are then unknown, and
    --json prints the chain's instance states (as `infervisor replay --json`).

    Exit 0; 1 when INSTANCE is not placed (the message names those that are);
    2 when DATA_DIR has neither a running node nor a chain.
    """
    folder = _data_dir(data_dir)
    try:
        with ControlClient(folder) as client:
            views = [client.status(instance)] if instance else client.list()
    except VerbFailed as e:
        _fail(str(e), 1)
    except NodeUnavailable as e:
        _status_from_chain(folder, instance, as_json, e)
        return
    except ControlError as e:
        _fail(str(e))
    if as_json:
        _json(views[0] if instance else views)
        return
    _print_table([_view_row(v) for v in views])
    if instance:
        _print_details(views[0])


def _status_from_chain(
    folder: Path, instance: str | None, as_json: bool, why: NodeUnavailable
) -> None:
    db = folder / "chain.db"
    if not db.is_file():
        if not isinstance(why, NotRunning):
            _fail(str(why))  # a new node still opening: no chain yet
        _fail(
            f"no node is running on {folder}, and it holds no chain ({db}): give a node's "
            "data directory or its config file (.toml)"
        )
    state = _read_chain(db, rebuild)
    click.echo(f"{_unavailable(why)}; state replayed from the chain", err=True)
    instances = sorted(state.instances.items())
    if instance:
        if instance not in state.instances:
            known = ", ".join(iid for iid, _ in instances) or "none"
            _fail(f"no instance {instance!r} in {db} (placed: {known})", 1)
        instances = [(instance, state.instances[instance])]
    if as_json:
        _json(instances[0][1] if instance else [inst for _, inst in instances])
    else:
        _print_table([_state_row(inst) for _, inst in instances])


_UNAVAILABLE: dict[type[NodeUnavailable], str] = {
    NotRunning: "no node running",
    NodeStarting: "node starting",
    NodeStopping: "node stopping",
}


def _unavailable(why: NodeUnavailable) -> str:
    return _UNAVAILABLE.get(type(why), str(why))


def _view_row(v: InstanceView) -> tuple[str, ...]:
    memory = f"{_mib(v.reserved_bytes)}/{_mib(v.rss_bytes)}"
    pid = str(v.pid) if v.pid is not None else "-"
    cells = (v.instance_id, v.adapter, v.lifecycle, v.desired, v.health or "-", pid)
    return (*cells, str(v.restarts), memory, v.reason)


def _state_row(inst: InstanceState) -> tuple[str, ...]:
    try:
        spec = msgspec.convert(inst.spec, InstanceSpec)
        adapter = spec.flavor.adapter_id(spec.mode)
    except msgspec.ValidationError:
        adapter = "?"
    pid = str(inst.process.pid) if inst.process else "-"
    cells = (inst.instance_id, adapter, inst.lifecycle, inst.desired, "?", pid)
    return (*cells, str(inst.restarts), "?/?", inst.reason)


def _mib(size: int | None) -> str:
    return "-" if size is None else f"{size / _MIB:.0f}"


def _print_table(rows: list[tuple[str, ...]]) -> None:
    lines = [_COLUMNS, *rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(_COLUMNS) - 1)]
    for line in lines:
        cells = [cell.ljust(width) for cell, width in zip(line, widths, strict=False)]
        click.echo("  ".join([*cells, line[-1]]).rstrip())


def _print_details(v: InstanceView) -> None:
    click.echo(f"\n  endpoint   {v.endpoint} ({v.exposure})")
    click.echo(f"  model      {v.model or '-'}")
    click.echo(f"  status     {v.status or '-'}{f': {v.status_detail}' if v.status_detail else ''}")
    if v.health_reason:
        click.echo(f"  health     {v.health}: {v.health_reason}")
    if v.last_exit is not None:
        e = v.last_exit
        how = f"signal {e.signal}" if e.signal is not None else f"exit code {e.exit_code}"
        click.echo(f"  last exit  pid {e.pid}, {how}: {e.reason}")


def _say_view(view: InstanceView, as_json: bool) -> None:
    if as_json:
        _json(view)
        return
    pid = f", pid {view.pid}" if view.pid is not None else ""
    click.echo(f"{view.instance_id}: {view.lifecycle} (wanted {view.desired}){pid}: {view.reason}")


@cli.command()
@_DATA_DIR
@click.argument("instance")
@click.option("--json", "as_json", is_flag=True, help="Print the instance's view as JSON.")
def start(data_dir: Path, instance: str, as_json: bool) -> None:
    """Start INSTANCE's server on the node running on DATA_DIR.

    Also resets its restart budget, and the instance is wanted running from
    now on. Answers once the server is spawned (lifecycle `starting`);
    `infervisor status` shows it become `running`. An adopted server is only
    checked to answer.

    Exit 0 printing the resulting state; 1 when the node refuses (with its
    message: an unknown INSTANCE names the placed ones); 2 when no node runs
    on DATA_DIR (the node's data directory or its .toml config).
    """
    _say_view(_ask(_data_dir(data_dir), lambda c: c.start(instance)), as_json)


@cli.command()
@_DATA_DIR
@click.argument("instance")
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Seconds between SIGTERM and SIGKILL [default: the node's stop_grace_s].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the instance's view as JSON.")
def stop(data_dir: Path, instance: str, grace: float | None, as_json: bool) -> None:
    """Stop INSTANCE's server on the node running on DATA_DIR.

    SIGTERM to its process group, SIGKILL after --grace seconds; answers
    once nothing of the group is left. The instance stays placed and is
    wanted stopped (the node will not restart it, nor will the next
    `infervisor run`): `infervisor start` brings it back. Adopted servers
    are never stopped; `infervisor unload` forgets them.

    Exit 0 printing the resulting state; 1 when the node refuses (with its
    message: an unknown INSTANCE names the placed ones); 2 when no node runs
    on DATA_DIR (the node's data directory or its .toml config).
    """
    _say_view(_ask(_data_dir(data_dir), lambda c: c.stop(instance, grace)), as_json)


@cli.command()
@_DATA_DIR
@click.argument("instance")
@click.option("--json", "as_json", is_flag=True, help="Print the instance's view as JSON.")
def restart(data_dir: Path, instance: str, as_json: bool) -> None:
    """Restart INSTANCE's server on the node running on DATA_DIR.

    Stops it (when running), then starts it again: a new process. Resets its
    restart budget; the instance is wanted running afterwards.

    Exit 0 printing the resulting state; 1 when the node refuses (with its
    message: an unknown INSTANCE names the placed ones); 2 when no node runs
    on DATA_DIR (the node's data directory or its .toml config).
    """
    _say_view(_ask(_data_dir(data_dir), lambda c: c.restart(instance)), as_json)


@cli.command()
@_DATA_DIR
@click.argument("instance")
def unload(data_dir: Path, instance: str) -> None:
    """Forget INSTANCE on the node running on DATA_DIR, stopping its server.

    The server gets SIGTERM and, 5 s later, SIGKILL. The node no longer
    supervises it; its history stays in the chain (`infervisor timeline`).
    An adopted server keeps running: only its registration is forgotten.
    The next `infervisor run` places it again while its config lists it:
    remove it there to keep it gone.

    Exit 0 once it is unloaded; 1 when the node refuses (with its message:
    an unknown INSTANCE names the placed ones); 2 when no node runs on
    DATA_DIR (the node's data directory or its .toml config).
    """
    _ask(_data_dir(data_dir), lambda c: c.unload(instance))
    click.echo(f"{instance}: unloaded")


def main() -> None:
    """Console entry point."""
    cli()
