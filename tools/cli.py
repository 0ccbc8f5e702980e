"""The ``infervisor`` command line: a thin layer over the library.

Exit status: 0 success; 1 the thing checked is bad (an invalid chain, a failed
demo step); 2 usage or I/O errors (click's own convention for usage).
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
from pathlib import Path
from typing import Any

import click
import msgspec

from infervisor.chain import ChainError, verify_chain
from infervisor.replay import NodeState, TimelineEntry, rebuild, timeline

__all__ = ["main"]


def _json(obj: Any) -> None:
    click.echo(msgspec.json.format(msgspec.json.encode(obj), indent=2))


def _fail_io(e: Exception) -> None:
    click.echo(f"error: {e}", err=True)
    sys.exit(2)


def _existing_db(path: Path) -> Path:
    if not path.is_file():
        _fail_io(FileNotFoundError(f"{path}: no such chain file"))
    return path


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
def demo(workdir: Path | None, as_json: bool) -> None:
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
    report = run_demo(workdir, say, progress)
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

    Started again on the same data directory, the node rebuilds itself from
    its chain: instances wanted running are started, stopped ones stay stopped.
    See examples/node.toml.
    """
    from .config import ConfigError, load_config  # noqa: PLC0415
    from .run import run_node  # noqa: PLC0415

    try:
        cfg = load_config(config)
    except ConfigError as e:
        _fail_io(e)
        return
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
        return
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
    """Rebuild and print the node state from the chain in DB alone."""
    state = _rebuild(db)
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


def _rebuild(db: Path) -> NodeState:
    try:
        return rebuild(_existing_db(db))
    except ChainError as e:
        _fail_io(e)
        raise


@cli.command("timeline")
@click.argument("db", type=click.Path(path_type=Path))
@click.argument("instance")
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON.")
def timeline_cmd(db: Path, instance: str, as_json: bool) -> None:
    """Print INSTANCE's transitions from the chain in DB: time, from, to, reason."""
    try:
        entries = timeline(_existing_db(db), instance)
    except ChainError as e:
        _fail_io(e)
        return
    if not entries:
        known = sorted(_rebuild(db).instances)
        click.echo(
            f"error: no events for instance {instance!r}; instances: {', '.join(known) or 'none'}",
            err=True,
        )
        sys.exit(2)
    if as_json:
        _json(entries)
    else:
        _print_timeline(entries)


def _print_timeline(entries: list[TimelineEntry]) -> None:
    for e in entries:
        when = dt.datetime.fromtimestamp(e.ts_ns / 1e9, tz=dt.UTC).strftime("%H:%M:%S.%f")[:-3]
        click.echo(f"  {e.seq:>5} {when} {e.frm:>10} -> {e.to:<10} {e.reason}")


def main() -> None:
    """Console entry point."""
    cli()
