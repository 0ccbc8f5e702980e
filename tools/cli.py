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

from infervisor.adapters.spec import Flavor
from infervisor.chain import ChainError, verify_chain
from infervisor.replay import (
    EventDecodeError,
    NodeState,
    ReplayError,
    TimelineEntry,
    rebuild,
    timeline,
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
    help="Work here instead of a new temporary folder (kept afterwards).",
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

    workdir = workdir or data_dir_default()
    workdir.mkdir(parents=True, exist_ok=True)
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


def main() -> None:
    """Console entry point."""
    cli()
