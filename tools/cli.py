"""The ``infervisor`` command line: a thin layer over the library.

Every command exits by one table (:mod:`.api.exit_codes`, docs/cli.md): 0 done or
already so; 1 refused or invalid; 2 usage; 3 no node takes verbs there. Bad
input is reported in one line, never a traceback; with ``--json`` the error
is also printed on stdout as one object (``{"error": {"code", "message",
"field"}}``). JSON output follows the schemas of :mod:`.schemas`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import logging
import math
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
import msgspec

from infervisor.actors.messages import InstanceView
from infervisor.chain import ChainError
from infervisor.replay import (
    EventDecodeError,
    NodeState,
    ReplayError,
    TimelineEntry,
    timeline_of,
)

from .api.client import DEFAULT_TIMEOUT_S, ApiClient
from .api.errors import (
    ApiError,
    NoAnswer,
    NodeStarting,
    NodeStopping,
    NodeUnavailable,
    NotRunning,
)
from .api.exit_codes import EPILOG, cut, exit_for
from .api.wire import NodeInfo, WatchEvent
from .schemas import (
    ErrorBody,
    ErrorRecord,
    InstanceRecord,
    from_state,
    from_timeline,
    from_view,
    place_record,
    verb_record,
)

__all__ = ["main"]

T = TypeVar("T")


def _json(obj: Any) -> None:
    click.echo(msgspec.json.format(msgspec.json.encode(obj), indent=2))


# ---------------------------------------------------------------- errors
def _json_mode() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.params.get("as_json"))


def _fail(message: str, code: str, field: str | None = None) -> NoReturn:
    """Report an error (stderr; stdout too as JSON under --json) and exit by its code."""
    message = cut(message)
    click.echo(f"error: {message}", err=True)
    if _json_mode():
        record = ErrorRecord(error=ErrorBody(code=code, message=message, field=field))
        ctx = click.get_current_context(silent=True)
        if ctx is not None and ctx.meta.get("json_lines"):
            _say(record)  # a JSON-lines stream ends with one more line, not a block
        else:
            _json(record)
    sys.exit(exit_for(code))


def _usage_field(e: click.UsageError) -> str | None:
    param = getattr(e, "param", None)
    if param is None:
        return None
    if isinstance(param, click.Option) and param.opts:
        return max(param.opts, key=len)
    return str(param.human_readable_name)


class _Command(click.Command):
    """A command whose --help ends with the exit-status table and whose usage
    errors are also one JSON object on stdout under --json."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("epilog", EPILOG)
        super().__init__(*args, **kwargs)

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        as_json = "--json" in args
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as e:
            if as_json:
                code = "bad_value" if isinstance(e, click.BadParameter) else "usage"
                body = ErrorBody(code=code, message=cut(e.format_message()), field=_usage_field(e))
                _json(ErrorRecord(error=body))
            raise


class _Group(click.Group):
    command_class = _Command

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("epilog", EPILOG)
        super().__init__(*args, **kwargs)


_Group.group_class = _Group


class _Seconds(click.ParamType[float]):
    """A finite, non-negative number of seconds (NaN and infinity refused), at most ``max_s``."""

    name = "seconds"

    def __init__(self, max_s: float | None = None) -> None:
        self.max_s = max_s

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, float):
            number = value
        else:
            try:
                number = float(value)
            except (TypeError, ValueError):
                self.fail(f"{cut(repr(str(value)))} is not a number of seconds", param, ctx)
        if not math.isfinite(number) or number < 0:
            self.fail(f"{cut(repr(str(value)))} is not a finite number of seconds >= 0", param, ctx)
        if self.max_s is not None and number > self.max_s:
            self.fail(f"{number:g} s is more than the {self.max_s:g} s allowed", param, ctx)
        return number


SECONDS = _Seconds()


# ---------------------------------------------------------------- where the chain and node are
def _where(arg: Path) -> tuple[Path, Path]:
    """(data_dir, chain file) named by ARG: a data directory, a config file
    (.toml, naming its data_dir) or the chain file itself."""
    from .config import ConfigError, load_config  # noqa: PLC0415 - keeps --help fast

    if not arg.exists():
        _fail(
            f"{arg}: no such chain file, data directory or config file (.toml)",
            "bad_path",
        )
    if arg.is_dir():
        return arg, arg / "chain.db"
    if arg.suffix == ".toml":
        try:
            folder = Path(load_config(arg).node.data_dir)
        except ConfigError as e:
            _fail(str(e), "bad_config")
        return folder, folder / "chain.db"
    return arg.parent, arg


def _chain_of(arg: Path) -> Path:
    db = _where(arg)[1]
    if not db.is_file():
        _fail(f"{db}: no such chain file (a node's data directory holds chain.db)", "no_chain")
    return db


def _read_chain(db: Path, query: Callable[[Path], T]) -> T:
    """Run a replay query on DB: exit 2 when unreadable, 1 when it cannot be replayed."""
    try:
        return query(db)
    except ChainError as e:
        _fail(str(e), "chain_unreadable")
    except (EventDecodeError, ReplayError) as e:
        _fail(
            f"{db} cannot be replayed: {e} (check it with: infervisor chain verify {db})",
            "chain_unreplayable",
        )


def _resolve(name: str, roles: Mapping[str, str | None], where: str) -> str:
    """The instance id NAME means: itself, or the one instance whose role it is.

    Refused (exit 1) when NAME is the role of several instances (naming them)
    or names none (naming the placed ones)."""
    if name in roles:
        return name
    matches = sorted(iid for iid, role in roles.items() if role == name)
    if len(matches) == 1:
        return matches[0]
    if matches:
        _fail(
            f"{name!r} is the role of {len(matches)} instances {where}: "
            f"{', '.join(matches)}; name one by its id",
            "ambiguous_instance",
            "INSTANCE",
        )
    placed = (
        ", ".join(f"{iid} ({role})" if role else iid for iid, role in sorted(roles.items()))
        or "none"
    )
    _fail(f"no instance {name!r} {where} (placed: {placed})", "unknown_instance", "INSTANCE")


def _chain_roles(state: NodeState) -> dict[str, str | None]:
    return {iid: from_state(inst).role for iid, inst in state.instances.items()}


class _FiniteRange(click.FloatRange):
    """click's FloatRange, refusing NaN too (every comparison with NaN is false, so
    the range alone lets it through)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return number


# ---------------------------------------------------------------- the commands
def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from infervisor.actors.node import VERSION  # noqa: PLC0415 - keeps --help fast

    click.echo(f"infervisor {VERSION}")
    ctx.exit(0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log what the actors do (to stderr).")
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Print the version and exit.",
)
def cli(verbose: bool) -> None:
    """Supervise local LLM model servers (llama.cpp, mlx-lm, Ollama) with an
    append-only, BLAKE3 hash-chained audit log in SQLite.

    \b
    Start here:   infervisor demo
    Run a node:   infervisor run examples/node.toml
    Operate it:   infervisor status examples/node.toml [-w]
                  infervisor stop|start|restart|unload WHERE INSTANCE
                  infervisor place WHERE --file FRAGMENT.toml
                  infervisor logs WHERE INSTANCE [-f]
                  infervisor watch WHERE [--json]
    Audit:        infervisor chain verify WHERE
                  infervisor replay WHERE
                  infervisor timeline WHERE INSTANCE

    WHERE is a node's data directory, its config file (.toml) or its chain
    file (DATA_DIR/chain.db); the operator verbs reach the node through its
    socket DATA_DIR/api.sock, or take --url URL --token SECRET instead of
    WHERE (a node's [api] tcp). INSTANCE is an instance id, or a role that
    names one instance. See docs/cli.md for the JSON schemas and error codes.
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
    from infervisor.adapters.spec import Flavor  # noqa: PLC0415

    from .demo import data_dir_default, run_demo  # noqa: PLC0415 - keeps --help fast

    if workdir is not None and workdir.exists() and any(workdir.iterdir()):
        _fail(f"--dir {workdir} is not empty: the demo needs a new or empty folder", "bad_path")
    workdir = workdir or data_dir_default()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _fail(f"--dir {workdir}: cannot create it: {e.strerror or e}", "bad_path", "--dir")
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

    Exit 0 after a clean stop; 1 when a server could not be stopped; 2 when
    the config or its data directory cannot be used (one line names the key,
    file or folder).
    """
    from .config import ConfigError, load_config  # noqa: PLC0415
    from .run import run_node  # noqa: PLC0415

    try:
        cfg = load_config(config)
    except ConfigError as e:
        _fail(str(e), "bad_config")
    sys.exit(run_node(cfg, lambda m: click.echo(m, err=True)))


@cli.group()
def chain() -> None:
    """Audit the event chain."""


_WHERE_HELP = (
    "WHERE is the chain file, the node's data directory (holding chain.db) or its "
    "config file (.toml)."
)


def _chain_cmd(work: Callable[[], int]) -> NoReturn:
    """Run a ``chain`` command of :mod:`.chain_cli`; its Failure goes through ``_fail``."""
    from .cli_failure import Failure  # noqa: PLC0415 - keeps --help fast

    try:
        status = work()
    except Failure as e:
        _fail(str(e), e.code, e.field)
    sys.exit(status)


_KEY_HELP = "The node's public key: a key string, or a file (DATA_DIR/node.pub)."


@chain.command("verify")
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.option(
    "--checkpoint",
    "checkpoint_file",
    type=click.Path(path_type=Path),
    help="A checkpoint saved earlier (infervisor chain checkpoint --out): rules out "
    "truncation and rewriting up to its tree size.",
)
@click.option("--key", help=_KEY_HELP + " Needed with --checkpoint.")
@click.option(
    "--proof",
    "proof_file",
    type=click.Path(path_type=Path),
    help="An inclusion or consistency proof (chain prove|consistency --json) to check.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
def chain_verify(
    where: Path,
    checkpoint_file: Path | None,
    key: str | None,
    proof_file: Path | None,
    as_json: bool,
) -> None:
    """Verify every hash and link of the chain in WHERE.

    WHERE is the chain file, the node's data directory (holding chain.db) or
    its config file (.toml). With --checkpoint FILE --key PUBKEY the chain is
    also checked against that signed checkpoint: a chain shorter than it
    (truncated), with another root at its size (rewritten) or not extending
    it (forked) is invalid, named with the sequence number. Without one,
    stderr (and "warning" in --json) says that truncation and rewriting
    cannot be ruled out. Exit 0 when valid; 1 when not, naming the first bad
    sequence number and why; 2 when the file cannot be read.
    """
    from . import chain_cli  # noqa: PLC0415

    db = _chain_of(where)
    _chain_cmd(
        lambda: chain_cli.verify(
            db, checkpoint_file=checkpoint_file, key=key, proof_file=proof_file, as_json=as_json
        )
    )


@chain.command("prove")
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.argument("seq", metavar="SEQ", type=click.IntRange(min=0))
@click.option(
    "--checkpoint",
    "checkpoint_file",
    required=True,
    type=click.Path(path_type=Path),
    help="The checkpoint whose tree the proof is for.",
)
@click.option("--key", help=_KEY_HELP + " When given, the checkpoint's signature is checked.")
@click.option("--json", "as_json", is_flag=True, help="Print the proof as JSON.")
def chain_prove(
    where: Path, seq: int, checkpoint_file: Path, key: str | None, as_json: bool
) -> None:
    """Print the RFC 6962 inclusion proof of event SEQ in the checkpoint's tree.

    The leaves are the events' BLAKE3 hashes in seq order (docs/chain-format.md).
    The --json output is what `chain verify --proof` (and any RFC 6962
    verifier) checks. Exit 1 when the chain does not match the checkpoint.
    """
    from . import chain_cli  # noqa: PLC0415

    db = _chain_of(where)
    _chain_cmd(
        lambda: chain_cli.prove(db, seq, checkpoint_file=checkpoint_file, key=key, as_json=as_json)
    )


@chain.command("consistency")
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.argument("old", metavar="OLD", type=click.Path(path_type=Path))
@click.argument("new", metavar="NEW", type=click.Path(path_type=Path))
@click.option("--key", help=_KEY_HELP + " When given, both signatures are checked.")
@click.option("--json", "as_json", is_flag=True, help="Print the proof as JSON.")
def chain_consistency(where: Path, old: Path, new: Path, key: str | None, as_json: bool) -> None:
    """Print the RFC 6962 consistency proof between checkpoint files OLD and NEW.

    Exit 1 when the chain does not extend OLD or match NEW (a fork or a rewrite).
    """
    from . import chain_cli  # noqa: PLC0415

    db = _chain_of(where)
    _chain_cmd(lambda: chain_cli.consistency(db, old, new, key=key, as_json=as_json))


@chain.command("checkpoint")
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), help="Write it to this file.")
@click.option("--json", "as_json", is_flag=True, help="Print it as JSON.")
def chain_checkpoint(where: Path, out: Path | None, as_json: bool) -> None:
    """Print (or write to --out) the latest signed checkpoint stored in the chain.

    Keep it off the node (with DATA_DIR/node.pub): `chain verify --checkpoint`
    then detects truncation, rewriting and forks up to its tree size.
    """
    from . import chain_cli  # noqa: PLC0415

    db = _chain_of(where)
    _chain_cmd(lambda: chain_cli.checkpoint(db, out=out, as_json=as_json))


@chain.command("backup")
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.argument("out", metavar="OUT", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def chain_backup(where: Path, out: Path, as_json: bool) -> None:
    """Copy the chain in WHERE to the new file OUT, consistently, while the node runs.

    Uses SQLite's online backup API: events still in the -wal file are
    copied too (a plain cp of chain.db can lose them).
    """
    from . import chain_cli  # noqa: PLC0415

    db = _chain_of(where)
    _chain_cmd(lambda: chain_cli.backup(db, out, as_json=as_json))


@chain.command("rotate-key")
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the keys and the event as JSON.")
def chain_rotate_key(where: Path, as_json: bool) -> None:
    """Replace the node's checkpoint key (node.key beside the chain in WHERE).

    The rotation is an event signed by the old and the new key (a C2SP signed
    note); the old public key is kept as node.pub.<key id>, so checkpoints
    signed before stay checkable. Refused while a node runs on the chain.
    """
    from . import chain_cli  # noqa: PLC0415

    db = _chain_of(where)
    _chain_cmd(lambda: chain_cli.rotate_key(db, as_json=as_json))


@chain.command("export")
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.argument("out", metavar="OUT", type=click.Path(path_type=Path))
@click.option("--key", help=_KEY_HELP + " Default: node.pub beside the chain.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def chain_export(where: Path, out: Path, key: str | None, as_json: bool) -> None:
    """Write the chain in WHERE as a bundle directory OUT (new or empty).

    OUT gets events.jsonl (every field and hash), checkpoints/, node.pub and
    manifest.json (counts, SHA-256 of each file): docs/chain-format.md.
    """
    from . import chain_cli  # noqa: PLC0415

    db = _chain_of(where)
    _chain_cmd(lambda: chain_cli.export(db, out, key=key, as_json=as_json))


@chain.command("verify-bundle")
@click.argument("bundle", metavar="BUNDLE", type=click.Path(path_type=Path))
@click.option("--key", help=_KEY_HELP + " Default: the bundle's node.pub.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
def chain_verify_bundle(bundle: Path, key: str | None, as_json: bool) -> None:
    """Verify an export bundle with no database: events, checkpoints, manifest.

    Exit 0 when valid; 1 when not, naming the sequence number and the reason.
    """
    from . import chain_cli  # noqa: PLC0415

    _chain_cmd(lambda: chain_cli.verify_bundle_cmd(bundle, key=key, as_json=as_json))


_UNVERIFIED_HELP = (
    "Read a chain that does not verify anyway, as stored; the output is marked "
    "(a first line in text; a verified/problem wrapper in --json)."
)


@cli.command()
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.option(
    "--until",
    metavar="SEQ|TIME",
    help="The state as of event SEQ, or as of TIME (ISO 8601 / RFC 3339, e.g. "
    "2026-11-01T12:00:00Z; no offset: UTC): replay stops before the first event "
    "stamped later.",
)
@click.option("--unverified", is_flag=True, help=_UNVERIFIED_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the state as JSON.")
def replay(where: Path, until: str | None, unverified: bool, as_json: bool) -> None:
    """Rebuild and print the node state from the chain in WHERE alone.

    WHERE is the chain file, the node's data directory or its config file
    (.toml). One line per instance: id, lifecycle state, wanted state, pid,
    restarts, reason; --json prints the reducer's whole state (every sourced
    field). The chain is verified in the same pass that replays it: one that
    does not verify is refused (exit 1, naming the sequence number and why)
    unless --unverified, which replays it as stored and marks the output.
    Exit 1 also when an event does not fit (unknown kind, impossible
    transition), 2 when WHERE cannot be read.
    """
    from .forensics_cli import parse_until, print_marker, read_offline, wrap  # noqa: PLC0415

    try:
        upto = None if until is None else parse_until(until)
    except ValueError:
        _fail(
            f"--until {until!r} is neither a sequence number nor an ISO 8601 time "
            "(2026-11-01T00:00:00Z)",
            "bad_value",
            "--until",
        )
    db = _chain_of(where)
    read = _forensics(lambda: read_offline(db, unverified=unverified, until=upto))
    state = read.state
    if as_json:
        _json(wrap(read, state) if unverified else state)
        return
    if unverified:
        print_marker(db, read)
    cut = f" (replayed up to seq {state.head_seq})" if until is not None else ""
    click.echo(
        f"node {state.node_id}: head seq {state.head_seq}, {state.boots} boots, "
        f"{len(state.instances)} instances{cut}"
    )
    for iid, inst in sorted(state.instances.items()):
        pid = inst.process.pid if inst.process else "-"
        click.echo(
            f"  {iid:<32} {inst.lifecycle:<10} wanted {inst.desired:<8} pid {pid!s:<8} "
            f"restarts {inst.restarts}  {inst.reason}"
        )


@cli.command("timeline")
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.argument("instance")
@click.option("--unverified", is_flag=True, help=_UNVERIFIED_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON.")
def timeline_cmd(where: Path, instance: str, unverified: bool, as_json: bool) -> None:
    """Print INSTANCE's events from the chain in WHERE, one line each.

    WHERE is the chain file, the node's data directory or its config file
    (.toml); INSTANCE an instance id, or a role naming one instance. Columns:
    seq, time (UTC), lifecycle state before -> after, reason. The chain is
    verified in the same pass: one that does not verify is refused (exit 1)
    unless --unverified (output marked). Exit 1 naming the chain's instances
    when INSTANCE names none of them.
    """
    from .forensics_cli import every_role, print_marker, read_offline, wrap  # noqa: PLC0415

    db = _chain_of(where)
    read = _forensics(lambda: read_offline(db, unverified=unverified, keep_events=True))
    # Unloaded instances too: their history stays in the chain.
    iid = _resolve(instance, every_role(read, _chain_roles(read.state)), f"in {db}")
    try:
        entries = timeline_of(read.by_subject.get(iid, []))
    except (EventDecodeError, ReplayError) as e:
        _fail(f"{db} cannot be replayed: {e}", "chain_unreplayable")
    if as_json:
        records = [from_timeline(e) for e in entries]
        _json(wrap(read, records) if unverified else records)
        return
    if unverified:
        print_marker(db, read)
    _print_timeline(entries)


def _print_timeline(entries: list[TimelineEntry]) -> None:
    for e in entries:
        when = dt.datetime.fromtimestamp(e.ts_ns / 1e9, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
        when = when[:-3] + "Z"
        click.echo(f"  {e.seq:>5} {when} {e.frm:>10} -> {e.to:<10} {e.reason}")


# ---------------------------------------------------------------- operator verbs
# Against the running node, through its control API (tools/api): the socket
# DATA_DIR/api.sock of the node WHERE names, or a URL with a bearer token.
_COLUMNS = (
    "INSTANCE",
    "FLAVOR",
    "MODE",
    "STATE",
    "WANTED",
    "SINCE",
    "RESTARTS",
    "ENDPOINT",
    "MEM MiB",
)
_MIB = 1024 * 1024
_WHERE_ARGS = (
    "WHERE is the node's data directory, its config file (.toml) or its chain file; "
    "without it, --url (or INFERVISOR_URL) names the node."
)
_UNAVAILABLE_CODE: dict[type[NodeUnavailable], str] = {
    NotRunning: "no_node",
    NodeStarting: "node_starting",
    NodeStopping: "node_stopping",
}
#: The API's field names, as the operator typed them.
_FIELDS = {"grace_s": "--grace", "stream": "--stream", "tail_bytes": "--tail"}


def _api_failure(e: ApiError, fields: Mapping[str, str] | None = None) -> NoReturn:
    """Exit for an error of the control API: its code goes straight to the exit table."""
    if isinstance(e, NoAnswer):
        _fail(f"{e} (--timeout SECONDS or INFERVISOR_TIMEOUT waits longer)", e.code, "--timeout")
    if isinstance(e, NodeUnavailable):
        _fail(str(e), _UNAVAILABLE_CODE.get(type(e), e.code))
    names = {**_FIELDS, **(fields or {})}
    field = names.get(e.field or "", e.field)
    message = str(e)
    for name, flag in names.items():
        message = message.replace(name, flag) if e.field == name else message
    _fail(message, e.code, field)


class _Target:
    """Where the node is (a data directory, or a URL and its token) and the
    command's other positional arguments."""

    def __init__(self, where: Path | None, url: str | None, token: str | None) -> None:
        self.where, self.url, self.token = where, url, token
        self.rest: tuple[str, ...] = ()
        #: Seconds to connect and for each answer (--timeout, INFERVISOR_TIMEOUT).
        self.timeout_s = DEFAULT_TIMEOUT_S

    @property
    def data_dir(self) -> Path | None:
        return None if self.where is None else _where(self.where)[0]

    def client(self) -> ApiClient:
        if self.url is not None:
            return ApiClient(url=self.url, token=self.token, timeout_s=self.timeout_s)
        assert self.data_dir is not None
        return ApiClient(self.data_dir, timeout_s=self.timeout_s)


def _token_of(token: str | None, token_file: Path | None, token_name: str) -> str | None:
    """The bearer secret: --token, else --token-file (the bare secret, or the node's
    api-tokens.json, from which --token-name picks), else INFERVISOR_TOKEN."""
    if token is not None:
        return token.strip() or None
    if token_file is None:
        return os.environ.get("INFERVISOR_TOKEN", "").strip() or None
    try:
        text = token_file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        _fail(f"--token-file {token_file}: cannot read it: {e}", "bad_path", "--token-file")
    if not text.startswith("{"):
        return text or None
    try:
        tokens = json.loads(text)
    except ValueError as e:
        _fail(f"--token-file {token_file}: not JSON: {e}", "bad_value", "--token-file")
    if not isinstance(tokens, dict) or not all(isinstance(v, str) for v in tokens.values()):
        _fail(
            f"--token-file {token_file}: expected the bare secret or a JSON object of "
            'token names and secrets ({"operator": "..."})',
            "bad_value",
            "--token-file",
        )
    if token_name not in tokens:
        _fail(
            f"--token-name {token_name!r} is not in {token_file}; "
            f"allowed: {', '.join(sorted(tokens)) or 'none'}",
            "bad_value",
            "--token-name",
        )
    return str(tokens[token_name])


def _target(args: tuple[str, ...], url: str | None, token: str | None, most: int) -> _Target:
    """WHERE and the rest of ARGS. With --url there is no WHERE; INFERVISOR_URL is
    used when no WHERE is given (a first argument naming a path, or one argument
    more than the command takes, is WHERE)."""
    if url is None and (env := os.environ.get("INFERVISOR_URL", "").strip()):
        names_a_path = bool(args) and Path(args[0]).exists()
        if len(args) <= most and not names_a_path:
            url = env
    if url is not None:
        if not url.startswith(("http://", "https://")):
            _fail(
                f"--url {url!r} is not an http:// or https:// URL "
                "(e.g. http://127.0.0.1:8765, the node's [api] tcp)",
                "bad_value",
                "--url",
            )
        target = _Target(None, url.rstrip("/"), token)
        target.rest = args
    else:
        if not args:
            _fail(
                "give WHERE (the node's data directory, its config file (.toml) or its "
                "chain file), or --url URL",
                "usage",
                "WHERE",
            )
        target = _Target(Path(args[0]), None, token)
        target.rest = args[1:]
    if len(target.rest) > most:
        _fail(
            f"unexpected argument {target.rest[most]!r}"
            + (" (with --url there is no WHERE)" if url is not None else ""),
            "usage",
        )
    return target


_TIMEOUT_ENV = "INFERVISOR_TIMEOUT"
_TIMEOUT_HELP = (
    "Seconds to wait for the node to answer (a verb that waits on the node, "
    "such as a stop's grace, gets its own wait on top) "
    f"[env: INFERVISOR_TIMEOUT; default: {DEFAULT_TIMEOUT_S:g}]."
)


def _answer_timeout(given: float | None) -> float:
    """--timeout, else INFERVISOR_TIMEOUT, else DEFAULT_TIMEOUT_S; 0 is refused."""
    where = "--timeout"
    if given is None and (env := os.environ.get(_TIMEOUT_ENV, "").strip()):
        where = _TIMEOUT_ENV
        try:
            given = float(env)
        except ValueError:
            given = math.nan
    if given is None:
        return DEFAULT_TIMEOUT_S
    if not math.isfinite(given) or given <= 0:
        _fail(f"{where} {given:g}: allowed more than 0 seconds", "bad_value", where)
    return given


def _node_command(
    metavar: str,
    most: int,
    *,
    timeout: bool = True,
    token_name: str = "operator",  # noqa: S107 -- a token's name, not its secret
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The positional ``[WHERE] ...`` arguments and the options naming the node
    (--url, --token, --token-file, --token-name) and bounding its answers
    (--timeout; ``timeout`` False: the command has a --timeout of its own and
    sets ``target.timeout_s`` itself) of an operator command; ``token_name`` is
    the token of an api-tokens.json used by default (a placement needs the
    control scope: ``controller``); the callback gets a :class:`_Target` as
    ``target``."""

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def wrapper(
            args: tuple[str, ...],
            url: str | None,
            token: str | None,
            token_file: Path | None,
            token_name: str,
            **kwargs: Any,
        ) -> Any:
            secret = _token_of(token, token_file, token_name)
            target = _target(args, url, secret, most)
            if timeout:
                target.timeout_s = _answer_timeout(kwargs.pop("answer_timeout"))
            return f(target=target, **kwargs)

        for option in reversed(_node_options(metavar, timeout, token_name)):
            wrapper = option(wrapper)
        return wrapper

    return decorate


def _node_options(
    metavar: str, timeout: bool, token_name: str
) -> list[Callable[[Callable[..., Any]], Callable[..., Any]]]:
    """The arguments and options of :func:`_node_command`, in their order."""
    options: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
        click.argument("args", nargs=-1, metavar=metavar),
        click.option(
            "--url",
            metavar="URL",
            help="The node's API over TCP (its [api] tcp, http://HOST:PORT) instead of "
            "WHERE's socket [env: INFERVISOR_URL].",
        ),
        click.option(
            "--token", metavar="SECRET", help="Bearer token for --url [env: INFERVISOR_TOKEN]."
        ),
        click.option(
            "--token-file",
            type=click.Path(dir_okay=False, path_type=Path),
            metavar="FILE",
            help="A file holding the token: the bare secret, or the node's "
            "DATA_DIR/api-tokens.json (--token-name picks one).",
        ),
        click.option(
            "--token-name",
            default=token_name,
            show_default=True,
            metavar="NAME",
            help="The token of --token-file's api-tokens.json to use.",
        ),
    ]
    if timeout:
        options.append(
            click.option(
                "--timeout", "answer_timeout", type=SECONDS, metavar="SECONDS", help=_TIMEOUT_HELP
            )
        )
    return options


@contextmanager
def _node(target: _Target) -> Iterator[ApiClient]:
    """A client of the node; exits by the table on any error of the API."""
    try:
        with target.client() as client:
            yield client
    except ApiError as e:
        _api_failure(e)


def _view_of(client: ApiClient, instance: str) -> InstanceView:
    """INSTANCE's view (by id or role); refused naming the placed ones when unknown."""
    views = client.list()
    roles: dict[str, str | None] = {v.instance_id: v.role for v in views}
    iid = _resolve(instance, roles, "on this node")
    return next(v for v in views if v.instance_id == iid)


def _say(answer: Any) -> None:
    """One JSON object on one line, flushed (for --json streams)."""
    sys.stdout.buffer.write(msgspec.json.encode(answer) + b"\n")
    sys.stdout.buffer.flush()


# ---------------------------------------------------------------- status
@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the instances as JSON.")
@click.option("--unverified", is_flag=True, help="From the chain: " + _UNVERIFIED_HELP)
@click.option(
    "-w",
    "--watch",
    is_flag=True,
    help="Keep it live: redraw on each chain event and every 2 s (Ctrl-C ends it).",
)
@_node_command("[WHERE] [INSTANCE]", 1)
def status(target: _Target, as_json: bool, unverified: bool, watch: bool) -> None:
    """Show the node's instances (or only INSTANCE): one line each, like `kubectl get`.

    WHERE is the node's data directory, its config file (.toml) or its
    chain file; without it, --url (or INFERVISOR_URL) names the node.
    INSTANCE is an instance id or a role naming one instance. Columns:
    INSTANCE, FLAVOR, MODE, STATE (lifecycle), WANTED (running or stopped),
    SINCE (how long in that state: 42s, 5m, 3h, 2d), RESTARTS (used/budget),
    ENDPOINT, MEM MiB (reserved by the budget/observed resident). With
    INSTANCE, its details follow (health, pid, reason, last exit, the memory
    limit and OOM kills, the tree's memory and CPU from its cgroup, and how
    the node contains its servers).

    While the node's chain refuses writes (disk full, write lock held
    elsewhere), a warning on stderr says so and since when.

    When no node runs on WHERE, the state is replayed from DATA_DIR/chain.db
    instead, and stderr says so; health and memory are then unknown. The
    chain is verified in the same pass: one that does not verify is refused
    (exit 1) unless --unverified (output marked). --json prints the same
    objects either way (docs/cli.md, schema "instance"), with "source":
    "node" or "chain"; what only the node knows is null from the chain.

    -w/--watch redraws the table on each chain event and at least every 2 s:
    on a terminal the screen is cleared first; in a pipe each table follows
    a blank line (each --json answer is one line). Ctrl-C ends it (exit 0).

    Exit 0; 1 when INSTANCE is not placed (the message names those that are);
    2 when WHERE names nothing; 3 when it has neither a running node nor a chain.
    """
    instance = target.rest[0] if target.rest else None
    if not watch:
        _show_status(target, instance, as_json, unverified, compact=False)
        return
    _watch_status(target, instance, as_json, unverified)


def _show_status(
    target: _Target, instance: str | None, as_json: bool, unverified: bool, *, compact: bool
) -> None:
    """Print the status once (``compact``: a --json answer on one line)."""
    try:
        with target.client() as client:
            views = [_view_of(client, instance)] if instance else client.list()
            refusal = _chain_refusal(client.node())
    except NoAnswer as e:  # a node holds the data directory: its chain is not the answer
        _api_failure(e)
    except NodeUnavailable as e:
        if target.where is None:
            _api_failure(e)
        folder, db = _where(target.where)
        _status_from_chain(folder, db, instance, as_json, e, unverified=unverified)
        return
    except ApiError as e:
        _api_failure(e)
    if refusal is not None:
        click.echo(f"warning: {refusal}", err=True)
    if as_json:
        records = [from_view(v) for v in views]
        answer: Any = records[0] if instance else records
        _say(answer) if compact else _json(answer)
        return
    _print_table([_row(from_view(v)) for v in views])
    if instance:
        _print_details(views[0])
        with contextlib.suppress(ApiError, NodeUnavailable), target.client() as client:
            node = client.node()
            click.echo(f"  contained  {node.containment}: {node.containment_reason}")


def _chain_refusal(info: NodeInfo) -> str | None:
    """What to warn of while the node's chain refuses writes (None while it takes them)."""
    if info.chain_writable:
        return None
    since = ""
    if info.chain_failing_since_ns is not None:
        at = dt.datetime.fromtimestamp(info.chain_failing_since_ns / 1e9, dt.UTC)
        since = f" since {at.isoformat(timespec='seconds')}"
    return (
        f"the node's chain refuses writes{since} ({info.chain_error}): observations wait, "
        "in order, and verbs are refused until it takes them again (free disk space, or "
        "end what holds chain.db's write lock)"
    )


def _watch_status(target: _Target, instance: str | None, as_json: bool, unverified: bool) -> None:
    """Redraw on each chain event (the watch stream, on a thread) and every 2 s."""
    terminal = sys.stdout.isatty() and not as_json
    wake: queue.SimpleQueue[int] = queue.SimpleQueue()

    def listen() -> None:
        with contextlib.suppress(Exception), target.client() as client:
            for event in client.events(None):
                wake.put(event.seq)

    listener: threading.Thread | None = None
    first = True
    try:
        while True:
            if listener is None or not listener.is_alive():
                listener = threading.Thread(target=listen, name="status-watch", daemon=True)
                listener.start()
            if terminal:
                click.echo("\x1b[H\x1b[2J", nl=False)
            elif not first and not as_json:
                click.echo("")
            _show_status(target, instance, as_json, unverified, compact=True)
            sys.stdout.flush()
            first = False
            with contextlib.suppress(queue.Empty):
                wake.get(timeout=_REDRAW_S)
                while True:  # one redraw for a burst of events
                    wake.get_nowait()
    except KeyboardInterrupt:
        sys.exit(0)


_REDRAW_S = 2.0


def _status_from_chain(
    folder: Path,
    db: Path,
    instance: str | None,
    as_json: bool,
    why: NodeUnavailable,
    *,
    unverified: bool = False,
) -> None:
    if not db.is_file():
        if not isinstance(why, NotRunning):
            _api_failure(why)  # a new node still opening: no chain yet
        _fail(
            f"no node is running on {folder}, and it holds no chain ({db}): give a node's "
            "data directory, its config file (.toml) or its chain file",
            "no_node",
        )
    from .forensics_cli import print_marker, read_offline, wrap  # noqa: PLC0415

    read = _forensics(lambda: read_offline(db, unverified=unverified))
    state = read.state
    click.echo(f"{_unavailable(why)}; state replayed from the chain", err=True)
    records = [from_state(inst) for _, inst in sorted(state.instances.items())]
    if instance:
        iid = _resolve(instance, _chain_roles(state), f"in {db}")
        records = [r for r in records if r.instance_id == iid]
    answer: Any = records[0] if instance else records
    if as_json:
        _json(wrap(read, answer) if unverified else answer)
        return
    if unverified:
        print_marker(db, read)
    _print_table([_row(r) for r in records])


_UNAVAILABLE: dict[type[NodeUnavailable], str] = {
    NotRunning: "no node running",
    NodeStarting: "node starting",
    NodeStopping: "node stopping",
}


def _unavailable(why: NodeUnavailable) -> str:
    return _UNAVAILABLE.get(type(why), str(why))


def age(seconds: float) -> str:
    """A duration as `kubectl get` shows ages: 42s, 5m, 3h, 2d (rounded down)."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _row(r: InstanceRecord, now_ns: int | None = None) -> tuple[str, ...]:
    now_ns = time.time_ns() if now_ns is None else now_ns
    offline = r.source == "chain"
    memory = f"{_mib(r.reserved_bytes)}/{'?' if offline else _mib(r.rss_bytes)}"
    budget = "-" if r.max_restarts is None else str(r.max_restarts)
    since = age((now_ns - r.since_ns) / 1e9) if r.since_ns else "-"
    return (
        r.instance_id,
        r.flavor or "?",
        r.mode or "?",
        r.lifecycle,
        r.desired,
        since,
        f"{r.restarts}/{budget}",
        r.endpoint or "-",
        memory,
    )


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
    click.echo(f"  pid        {v.pid if v.pid is not None else '-'}")
    click.echo(f"  reason     {v.reason or '-'}")
    click.echo(f"  status     {v.status or '-'}{f': {v.status_detail}' if v.status_detail else ''}")
    health = v.health or "unknown"
    click.echo(f"  health     {health}{f': {v.health_reason}' if v.health_reason else ''}")
    if v.probe_latency_s is not None:
        click.echo(f"  probe      {v.probe_latency_s * 1000:.0f} ms, {v.misses} missed in a row")
    if v.last_exit is not None:
        e = v.last_exit
        how = f"signal {e.signal}" if e.signal is not None else f"exit code {e.exit_code}"
        pid = f"pid {e.pid}, " if e.pid is not None else ""
        click.echo(f"  last exit  {pid}{how}: {e.reason}")
    _print_accounting(v)


def _print_accounting(v: InstanceView) -> None:
    """The memory limit, OOM kills, and the tree's memory and CPU from its cgroup."""
    if v.memory_max_bytes is not None or v.oom_kills:
        limit = f"{v.memory_max_bytes} bytes" if v.memory_max_bytes is not None else "none"
        click.echo(f"  mem limit  {limit}, {v.oom_kills} OOM kill(s)")
    if v.cgroup_memory_bytes is not None or v.cpu_seconds is not None:
        mem = f"{v.cgroup_memory_bytes / 2**20:.1f} MiB" if v.cgroup_memory_bytes else "-"
        cpu = f"{v.cpu_seconds:.2f} s CPU" if v.cpu_seconds is not None else "- CPU"
        click.echo(f"  cgroup     {mem}, {cpu} (the whole process tree)")


def _say_view(
    view: InstanceView, as_json: bool, *, seq: int, digest: str, already: bool = False
) -> None:
    if as_json:
        _json(verb_record(view, seq, digest))
        return
    pid = f", pid {view.pid}" if view.pid is not None else ""
    state = f"already {view.lifecycle}" if already else view.lifecycle
    reason = f": {view.reason}" if view.reason else ""
    click.echo(f"{view.instance_id}: {state} (wanted {view.desired}){pid}{reason}")


# ---------------------------------------------------------------- progress on a terminal
class _Progress:
    """One line on stderr rewritten in place, only when stderr is a terminal."""

    def __init__(self) -> None:
        self.on = sys.stderr.isatty()
        self._width = 0

    def show(self, line: str) -> None:
        if self.on:
            line = cut(line)[:120]
            click.echo("\r" + line.ljust(self._width), nl=False, err=True)
            self._width = len(line)

    def clear(self) -> None:
        if self.on and self._width:
            click.echo("\r" + " " * self._width + "\r", nl=False, err=True)
            self._width = 0


_LIVE = ("starting", "running", "unhealthy")
_WAIT_POLL_S = 0.25


def _wait_running(
    client: ApiClient, answer: InstanceView, timeout_s: float, progress: _Progress
) -> InstanceView:
    """Poll until the instance runs; exit 1 with the reason when it fails or time runs out."""
    began = time.monotonic()
    view = answer
    while view.lifecycle != "running":
        recorded = view.last_seq > answer.last_seq
        halted = view.lifecycle in ("loaded", "stopped") and recorded
        if (
            view.lifecycle not in (*_LIVE, "loaded", "stopped")
            or halted
            or view.desired != "running"
        ):
            progress.clear()
            why = view.reason or "no reason recorded"
            _fail(f"{view.instance_id} did not start: {view.lifecycle}: {why}", "start_failed")
        waited = time.monotonic() - began
        if waited > timeout_s:
            progress.clear()
            _fail(
                f"{view.instance_id} is still {view.lifecycle} after {timeout_s:g} s "
                f"(--timeout): {view.reason}",
                "timeout",
                "--timeout",
            )
        progress.show(f"{view.instance_id}: {view.lifecycle} {waited:.0f} s: {view.reason}")
        time.sleep(_WAIT_POLL_S)  # polling the node, not synchronising a test
        view = client.status(view.instance_id)
    progress.clear()
    return view


@contextmanager
def _ticking(show: Callable[[float], str], progress: _Progress) -> Iterator[None]:
    """While a verb blocks: ``show(seconds waited)`` once a second, on a terminal only."""
    done = threading.Event()

    def tick() -> None:
        began = time.monotonic()
        while True:
            progress.show(show(time.monotonic() - began))
            if done.wait(1.0):
                return

    thread = threading.Thread(target=tick, daemon=True) if progress.on else None
    if thread is not None:
        thread.start()
    try:
        yield
    finally:
        done.set()
        if thread is not None:
            thread.join()
        progress.clear()


def _countdown(iid: str, grace_s: float | None, progress: _Progress) -> Any:
    """While a stop blocks: the grace counting down to SIGKILL (elapsed seconds when
    the grace is the node's default)."""

    def show(waited: float) -> str:
        if grace_s is None:
            return f"stopping {iid}: {waited:.0f} s (SIGKILL after the node's grace)"
        if waited < grace_s:
            return f"stopping {iid}: SIGKILL in {math.ceil(grace_s - waited)} s"
        return f"stopping {iid}: SIGKILL sent, waiting for it to exit"

    return _ticking(show, progress)


def _elapsed(what: str, progress: _Progress) -> Any:
    return _ticking(lambda waited: f"{what} {waited:.0f} s", progress)


_VERB_EXIT = (
    "Exit 0 printing the resulting state; 1 when the node refuses (with its "
    "message: an unknown INSTANCE names the placed ones); 2 when the command "
    "line is wrong; 3 when no node runs on WHERE (or answers at --url)."
)


# ---------------------------------------------------------------- place
_PLACE_FLAGS = {
    "role": "--role",
    "flavor": "--flavor",
    "port": "--port",
    "model": "--model",
    "mode": "--mode",
    "host": "--host",
    "ctx_size": "--ctx-size",
    "kind": "--kind",
    "env": "--env",
    "draft_model": "--draft-model",
}


@cli.command()
@click.option(
    "--file",
    "fragment",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FRAGMENT.toml",
    help="The instance as TOML: the keys of a config's [[instances]] table, flat or "
    "in one [[instances]] table.",
)
@click.option("--role", help="The instance's job (a plain token): first part of its id.")
@click.option("--flavor", type=click.Choice(["llamacpp", "mlx-lm", "ollama"]))
@click.option("--port", type=click.IntRange(1, 65535), help="The server's TCP port.")
@click.option("--model", help="The model's registry name (managed: required).")
@click.option("--mode", type=click.Choice(["managed", "adopted"]), help="[default: managed]")
@click.option("--host", help="The address it listens on (managed: loopback only).")
@click.option("--ctx-size", type=click.IntRange(min=1), help="Context length in tokens.")
@click.option("--kind", help="Workload kind (health interval and judgement).")
@click.option("--env", "env", multiple=True, metavar="KEY=VALUE", help="Repeatable.")
@click.option("--draft-model", help="A draft model's registry name (speculative decoding).")
@click.option("--controller", metavar="ID", help="Place as this controller (with --generation).")
@click.option(
    "--generation",
    type=click.IntRange(min=0),
    metavar="N",
    help="The controller's placement generation: an older one is ignored.",
)
@click.option("--start", "start_it", is_flag=True, help="Start it once placed.")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@_node_command("[WHERE]", 0, token_name="controller")  # noqa: S106 -- a name, not a secret
def place(  # noqa: PLR0917 - one parameter per option, as click passes them
    target: _Target,
    fragment: Path | None,
    role: str | None,
    flavor: str | None,
    port: int | None,
    model: str | None,
    mode: str | None,
    host: str | None,
    ctx_size: int | None,
    kind: str | None,
    env: tuple[str, ...],
    draft_model: str | None,
    controller: str | None,
    generation: int | None,
    start_it: bool,
    as_json: bool,
) -> None:
    """Place an instance on the node: from --file FRAGMENT.toml, or from the flags.

    The fragment holds the keys of an [[instances]] table of the node's
    config (role, flavor, port, mode, model, host, ctx_size, draft_model,
    env, kind, continuous, restart, start), flat or in one [[instances]]
    table; flags given beside it override its keys. An unknown or mistyped
    key is refused naming it and the allowed keys or values; nothing is
    sent. As the node itself by default, or as --controller ID at
    --generation N (an older generation than the last one is ignored).
    --start (or `start = true` in the fragment) starts it once placed.

    Prints the outcome (applied, unchanged: the same spec again, or
    ignored: a stale generation), the instance id and the seq and hash of
    its last event in the chain (--json: the whole answer).

    WHERE is the node's data directory, its config file (.toml) or its
    chain file; without it, --url (or INFERVISOR_URL) names the node.
    Exit 0 once placed; 1 when the node refuses (port taken, admission or
    memory budget); 2 when the fragment, a key or a flag is wrong; 3 when no
    node runs on WHERE (or answers at --url).
    """
    flags: dict[str, Any] = {
        "role": role,
        "flavor": flavor,
        "port": port,
        "model": model,
        "mode": mode,
        "host": host,
        "ctx_size": ctx_size,
        "kind": kind,
        "draft_model": draft_model,
    }
    if env:
        flags["env"] = dict(_env_pair(item) for item in env)
    if generation is not None and controller is None:
        _fail("--generation needs --controller ID", "usage", "--generation")
    try:
        spec, start_key = _spec_of(fragment, {k: v for k, v in flags.items() if v is not None})
    except _SpecInput as e:
        _fail(str(e), e.code, e.field)
    with _node(target) as client:
        try:
            answer = client.place(
                spec,
                controller=controller,
                generation=generation or 0,
                start=start_it or start_key,
            )
        except ApiError as e:
            field = (e.field or "").removeprefix("spec.")
            named = {e.field or "": _PLACE_FLAGS[field]} if field in _PLACE_FLAGS else {}
            _api_failure(e, named if fragment is None else {})
    if as_json:
        _json(place_record(answer))
        return
    v = answer.instance
    click.echo(
        f"{answer.instance_id}: {answer.outcome} (generation {answer.generation}); "
        f"{v.lifecycle} (wanted {v.desired}); seq {answer.seq} hash {answer.hash}"
    )


def _env_pair(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        _fail(f"--env {item!r}: expected KEY=VALUE", "bad_value", "--env")
    return key, value


def _watch_line(event: WatchEvent) -> str:
    """``[seq] kind subject: reason``, as `infervisor run` prints events (run.event_line)."""
    from infervisor.chain import GENESIS_KIND, StoredEvent  # noqa: PLC0415
    from infervisor.replay import decode_event, reason_of  # noqa: PLC0415

    if event.kind == GENESIS_KIND:
        return f"[{event.seq}] {event.kind}: the chain of node {event.node} begins"
    stored = StoredEvent(
        seq=event.seq,
        ts_ns=event.ts_ns,
        node=event.node,
        source=event.source,
        kind=event.kind,
        subject=event.subject,
        payload=msgspec.json.encode(event.payload),
        payload_hash=b"",
        prev_hash=bytes.fromhex(event.prev_hash),
        hash=bytes.fromhex(event.hash),
    )
    try:
        why = reason_of(decode_event(stored))
    except EventDecodeError as e:
        why = str(e)
    subject = f" {event.subject}" if event.subject else ""
    return f"[{event.seq}] {event.kind}{subject}: {why}"


class _SpecInput(Exception):
    """A fragment or flag that makes no InstanceSpec: ``code`` and ``field`` for _fail."""

    def __init__(self, message: str, code: str, field: str | None) -> None:
        super().__init__(message)
        self.code, self.field = code, field


def _spec_of(fragment: Path | None, flags: dict[str, Any]) -> tuple[Any, bool]:
    """The InstanceSpec of the fragment's keys with ``flags`` over them, and its ``start``.

    Raises:
        _SpecInput: the fragment cannot be read, or a key is unknown or mistyped
            (named, with the allowed keys or values: tools/config.py's messages).
    """
    from . import config as config_module  # noqa: PLC0415

    raw: dict[str, Any] = {}
    where = "the flags"
    if fragment is not None:
        where = str(fragment)
        try:
            raw = config_module.parse_toml(
                fragment.read_text(encoding="utf-8"), f"--file {fragment}"
            )
        except OSError as e:
            message = f"--file {fragment}: cannot read: {e.strerror or e}"
            raise _SpecInput(message, "bad_path", "--file") from e
        except UnicodeDecodeError as e:
            raise _SpecInput(f"--file {fragment}: not valid TOML: {e}", "bad_spec", "--file") from e
        except config_module.ConfigError as e:
            raise _SpecInput(str(e), "bad_spec", "--file") from e
        if "instances" in raw:
            tables = raw.pop("instances")
            if raw or not isinstance(tables, list) or len(tables) != 1:
                raise _SpecInput(
                    f"{fragment}: give the instance's keys flat, or in exactly one "
                    "[[instances]] table (and nothing beside it)",
                    "bad_spec",
                    "--file",
                )
            raw = dict(tables[0])
    raw.update(flags)
    entry_type = config_module.InstanceEntry
    try:
        entry = msgspec.convert(raw, entry_type)
    except msgspec.ValidationError as e:
        message, key = _explain_spec(str(e), entry_type, config_module)
        flag = _PLACE_FLAGS.get(key or "") if key in flags or fragment is None else None
        # A whole-document error names the fragment: a bad_spec always names a field.
        raise _SpecInput(f"{where}: {message}", "bad_spec", flag or key or "--file") from e
    return entry.spec(), raw.get("start") is True  # the config's default is True


_SPEC_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$\.?(?P<path>[^`]*)`)?$", re.DOTALL)
_SPEC_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<key>[^`]*)`$")
_SPEC_MISSING = re.compile(r"^Object missing required field `(?P<key>[^`]*)`$")


def _explain_spec(message: str, cls: Any, config_module: Any) -> tuple[str, str | None]:
    """A msgspec message about an instance's keys in TOML terms, and the key at fault."""
    match = _SPEC_AT.match(message)
    what, path = (match["what"], match["path"] or "") if match else (message, "")
    if unknown := _SPEC_UNKNOWN.match(what):
        key = unknown["key"]
        return f"unknown key `{key}`; {config_module._allowed(cls, key)}", key
    if missing := _SPEC_MISSING.match(what):
        key = missing["key"]
        flag = _PLACE_FLAGS.get(key)
        return f"missing key `{key}`" + (f" (or {flag})" if flag else ""), key
    key = path.split(".")[0].split("[")[0] or None
    hint = config_module._enum_hint(cls, key) if what.startswith("Invalid enum value") else ""
    return f"key `{key}`: {what[:1].lower()}{what[1:]}{hint}", key


# ---------------------------------------------------------------- start, stop, restart, unload
@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the instance as JSON.")
@click.option(
    "--wait", is_flag=True, help="Answer once it runs (progress on a terminal), or its failure."
)
@click.option(
    "--timeout",
    type=SECONDS,
    default=300.0,
    show_default=True,
    metavar="SECONDS",
    help="How long --wait waits for it to run; when given, also how long the node "
    "may take to answer [default answer wait: INFERVISOR_TIMEOUT, else "
    f"{DEFAULT_TIMEOUT_S:g}].",
)
@_node_command("[WHERE] INSTANCE", 1, timeout=False)
def start(target: _Target, as_json: bool, wait: bool, timeout: float) -> None:
    """Start INSTANCE's server on the node.

    The instance is wanted running from now on, and its restart budget is
    reset. Answers once the server is spawned (lifecycle `starting`); with
    --wait, once it is `running` (exit 1 with the reason when it fails
    instead). An instance already starting or running is left as it is (its
    budget too): exit 0, "already running". An adopted server is only
    checked to answer. --json adds the seq and hash of the instance's last
    event in the chain.

    WHERE is the node's data directory, its config file (.toml) or its
    chain file; without it, --url (or INFERVISOR_URL) names the node.
    INSTANCE is an instance id, or a role naming one instance.
    Exit 0 printing the resulting state; 1 when the node refuses (with its
    message: an unknown INSTANCE names the placed ones); 2 when the command
    line is wrong; 3 when no node runs on WHERE (or answers at --url).
    """
    given = click.get_current_context().get_parameter_source("timeout")
    explicit = given is click.core.ParameterSource.COMMANDLINE
    target.timeout_s = _answer_timeout(timeout if explicit and timeout > 0 else None)
    instance = _instance_arg(target)
    progress = _Progress()
    with _node(target) as client:
        before = _view_of(client, instance)
        with _elapsed(f"starting {before.instance_id}:", progress):
            answer = client.start(before.instance_id)
        view = answer.instance
        already = before.lifecycle in _LIVE and view.last_seq == before.last_seq
        if wait:
            view = _wait_running(client, view, timeout, progress)
    _say_view(view, as_json, seq=answer.seq, digest=answer.hash, already=already)


def _instance_arg(target: _Target) -> str:
    if not target.rest:
        _fail("missing argument INSTANCE (an instance id, or a role)", "usage", "INSTANCE")
    return target.rest[0]


@cli.command()
@click.option(
    "--grace",
    type=_Seconds(max_s=3600.0),
    metavar="SECONDS",
    help="Seconds between SIGTERM and SIGKILL, at most 3600 [default: the node's stop_grace_s].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the instance as JSON.")
@_node_command("[WHERE] INSTANCE", 1)
def stop(target: _Target, grace: float | None, as_json: bool) -> None:
    """Stop INSTANCE's server on the node.

    SIGTERM to its process group, SIGKILL after --grace seconds; answers
    once nothing of the group is left (on a terminal, the grace counts down
    on stderr). The instance stays placed and is wanted stopped (the node
    will not restart it, nor will the next `infervisor run`): `infervisor
    start` brings it back. A stopped instance is left as it is: exit 0,
    "already stopped". Adopted servers are never stopped; `infervisor
    unload` forgets them. --json adds the seq and hash of the instance's
    last event in the chain.

    WHERE is the node's data directory, its config file (.toml) or its
    chain file; without it, --url (or INFERVISOR_URL) names the node.
    INSTANCE is an instance id, or a role naming one instance.
    Exit 0 printing the resulting state; 1 when the node refuses (with its
    message: an unknown INSTANCE names the placed ones); 2 when the command
    line is wrong; 3 when no node runs on WHERE (or answers at --url).
    """
    instance = _instance_arg(target)
    with _node(target) as client:
        before = _view_of(client, instance)
        with _countdown(before.instance_id, grace, _Progress()):
            answer = client.stop(before.instance_id, grace)
    view = answer.instance
    already = (
        before.pid is None and before.lifecycle not in _LIVE and view.last_seq == before.last_seq
    )
    _say_view(view, as_json, seq=answer.seq, digest=answer.hash, already=already)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the instance as JSON.")
@_node_command("[WHERE] INSTANCE", 1)
def restart(target: _Target, as_json: bool) -> None:
    """Restart INSTANCE's server on the node.

    Stops it (when running), then starts it again: a new process. Resets its
    restart budget; the instance is wanted running afterwards. On a terminal
    stderr shows the seconds waited. --json adds the seq and hash of the
    instance's last event in the chain.

    WHERE is the node's data directory, its config file (.toml) or its
    chain file; without it, --url (or INFERVISOR_URL) names the node.
    INSTANCE is an instance id, or a role naming one instance.
    Exit 0 printing the resulting state; 1 when the node refuses (with its
    message: an unknown INSTANCE names the placed ones); 2 when the command
    line is wrong; 3 when no node runs on WHERE (or answers at --url).
    """
    instance = _instance_arg(target)
    with _node(target) as client:
        iid = _view_of(client, instance).instance_id
        with _elapsed(f"restarting {iid}:", _Progress()):
            answer = client.restart(iid)
    _say_view(answer.instance, as_json, seq=answer.seq, digest=answer.hash)


@cli.command()
@click.option(
    "--json", "as_json", is_flag=True, help='Print {"unloaded": ID, "seq", "hash"} as JSON.'
)
@_node_command("[WHERE] INSTANCE", 1)
def unload(target: _Target, as_json: bool) -> None:
    """Forget INSTANCE on the node, stopping its server.

    The server gets SIGTERM and, 5 s later, SIGKILL. The node no longer
    supervises it; its history stays in the chain (`infervisor timeline`).
    An adopted server keeps running: only its registration is forgotten.
    The next `infervisor run` places it again while its config lists it:
    remove it there to keep it gone. --json prints the seq and hash of its
    instance.unloaded event.

    WHERE is the node's data directory, its config file (.toml) or its
    chain file; without it, --url (or INFERVISOR_URL) names the node.
    INSTANCE is an instance id, or a role naming one instance.
    Exit 0 once it is unloaded; 1 when the node refuses (with its message:
    an unknown INSTANCE names the placed ones); 2 when the command line is
    wrong; 3 when no node runs on WHERE (or answers at --url).
    """
    instance = _instance_arg(target)
    with _node(target) as client:
        iid = _view_of(client, instance).instance_id
        with _elapsed(f"unloading {iid}:", _Progress()):
            answer = client.unload(iid)
    if as_json:
        _json({"unloaded": iid, "seq": answer.seq, "hash": answer.hash})
    else:
        click.echo(f"{iid}: unloaded")


# ---------------------------------------------------------------- logs
@cli.command()
@click.option("-f", "--follow", is_flag=True, help="Keep printing what it appends (Ctrl-C ends).")
@click.option(
    "--stream",
    type=click.Choice(["stderr", "stdout"]),
    default="stderr",
    show_default=True,
    help="Which of the server's outputs.",
)
@click.option(
    "--tail",
    "tail_bytes",
    type=click.IntRange(0, 16 * 1024 * 1024),
    default=64 * 1024,
    show_default=True,
    metavar="BYTES",
    help="Start this many bytes before the end of its current log.",
)
@_node_command("[WHERE] INSTANCE", 1)
def logs(target: _Target, follow: bool, stream: str, tail_bytes: int) -> None:
    """Print INSTANCE's captured server output (the last --tail bytes); -f follows it.

    The node captures each managed server's stdout and stderr into files in
    its data directory; this asks the node for them (GET
    /v1/instances/ID/logs), so it works over --url too. Adopted servers have
    none. -f keeps printing what the server appends until Ctrl-C (exit 0) or
    the node stops.

    WHERE is the node's data directory, its config file (.toml) or its
    chain file; without it, --url (or INFERVISOR_URL) names the node.
    INSTANCE is an instance id, or a role naming one instance.
    Exit 0; 1 when INSTANCE is not placed; 2 when the command line is wrong;
    3 when no node runs on WHERE (or answers at --url).
    """
    instance = _instance_arg(target)
    out = sys.stdout.buffer
    try:
        with _node(target) as client:
            iid = _view_of(client, instance).instance_id
            for chunk in client.logs(iid, stream=stream, follow=follow, tail_bytes=tail_bytes):
                out.write(chunk)
                out.flush()
    except KeyboardInterrupt:
        sys.exit(0)
    except BrokenPipeError:
        sys.exit(0)


# ---------------------------------------------------------------- watch
@cli.command()
@click.option(
    "--from-seq",
    type=click.IntRange(min=0),
    metavar="N",
    help="Start at event N (the events already in the chain from N on first) "
    "[default: only new events, from the head on].",
)
@click.option("--json", "as_json", is_flag=True, help="One WatchEvent JSON object per line.")
@click.option("--no-follow", is_flag=True, help="End at the head instead of waiting for more.")
@click.option(
    "--retry-for",
    type=SECONDS,
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to keep reconnecting to a node that went away (0: exit at once).",
)
@_node_command("[WHERE]", 0)
def watch(
    target: _Target, from_seq: int | None, as_json: bool, no_follow: bool, retry_for: float
) -> None:
    """Print the chain's events as the node appends them, one line each.

    Text: `[SEQ] KIND SUBJECT: REASON`. --json: one object per line (seq,
    ts_ns, node, source, kind, subject, payload, hash, prev_hash; the
    WatchEvent of docs/api.md), flushed after each line, so a consumer that
    stops it (even with SIGKILL) resumes with --from-seq LAST+1 and gets
    every event exactly once. Without --from-seq it starts at the head:
    only events appended from now on.

    When the node goes away (restarting) it reconnects from the last seq
    seen + 1, with a bounded backoff, saying so on stderr; after
    --retry-for seconds without a node it exits 3. Ctrl-C ends it (exit 0).

    WHERE is the node's data directory, its config file (.toml) or its
    chain file; without it, --url (or INFERVISOR_URL) names the node.
    Exit 0 when --no-follow reaches the head, or on Ctrl-C; 2 when the
    command line is wrong; 3 when no node answers for --retry-for seconds.
    """
    click.get_current_context().meta["json_lines"] = True
    try:
        _watch_events(target, from_seq, as_json, follow=not no_follow, retry_for=retry_for)
    except KeyboardInterrupt:
        sys.exit(0)
    except BrokenPipeError:
        sys.exit(0)


_BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0)


def _watch_events(
    target: _Target, next_seq: int | None, as_json: bool, *, follow: bool, retry_for: float
) -> None:
    out = sys.stdout.buffer
    down_since: float | None = None
    tries = 0
    with target.client() as client:
        while True:
            try:
                head = client.node().head_seq  # the node answers: (re)connected
                if next_seq is None:
                    next_seq = head + 1  # resumable from here on
                if down_since is not None:
                    click.echo(f"watch: reconnected; from seq {next_seq}", err=True)
                    down_since, tries = None, 0
                for event in client.events(next_seq, follow=follow):
                    line = msgspec.json.encode(event) if as_json else _watch_line(event).encode()
                    out.write(line + b"\n")
                    out.flush()
                    next_seq = event.seq + 1
                if not follow:
                    return
                raise NodeStopping("the node ended the stream", "node_stopping", 0)
            except NodeUnavailable as e:
                now = time.monotonic()
                if down_since is None:
                    down_since = now
                    seq = "the head" if next_seq is None else f"seq {next_seq}"
                    click.echo(f"watch: {e}; reconnecting from {seq}", err=True)
                if now - down_since >= retry_for:
                    _fail(
                        f"{e} (no node for {retry_for:g} s, --retry-for)",
                        _UNAVAILABLE_CODE.get(type(e), e.code),
                    )
                pause = _BACKOFF_S[min(tries, len(_BACKOFF_S) - 1)]
                time.sleep(min(pause, max(0.0, retry_for - (now - down_since))))  # backoff
                tries += 1
            except ApiError as e:
                _api_failure(e)


from .health_cli import health_command  # noqa: E402 - last: it is built on the helpers above

cli.add_command(health_command(_node_command, _node, _view_of, _json, _Command))


# ---------------------------------------------------------------- forensics (forensics_cli.py)
def _forensics(work: Callable[[], T]) -> T:
    """Run a function of :mod:`.forensics_cli`; its Failure exits through ``_fail``."""
    from .cli_failure import Failure  # noqa: PLC0415 - keeps --help fast

    try:
        return work()
    except Failure as e:
        _fail(str(e), e.code, e.field)


class _LazyTime(click.ParamType[int]):
    """forensics_cli.TIME, imported when a value is converted."""

    name = "time"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from .forensics_cli import TIME  # noqa: PLC0415

        return TIME.convert(value, param, ctx)


@cli.command("events")
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.option("--instance", help="Only this instance (its id, or a role naming one).")
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    help="Only events of this kind (instance.exited, or just exited); repeatable.",
)
@click.option(
    "--source", help="Only events with this source, or this role (operator, supervisor, ...)."
)
@click.option(
    "--since", type=_LazyTime(), help="Only events stamped at or after this ISO 8601 time."
)
@click.option(
    "--until", type=_LazyTime(), help="Only events stamped at or before this ISO 8601 time."
)
@click.option("--grep", help="Only events whose reason contains this text (any case).")
@click.option("--jsonl", "as_jsonl", is_flag=True, help="One JSON object per line.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV with a header line.")
@click.option("--unverified", is_flag=True, help=_UNVERIFIED_HELP)
def events_cmd(  # noqa: PLR0917 - one parameter per option, as click passes them
    where: Path,
    instance: str | None,
    kinds: tuple[str, ...],
    source: str | None,
    since: int | None,
    until: int | None,
    grep: str | None,
    as_jsonl: bool,
    as_csv: bool,
    unverified: bool,
) -> None:
    """List the events of the chain in WHERE, filtered, as a table, JSON Lines or CSV.

    WHERE is the chain file, the node's data directory or its config file
    (.toml). Columns: seq, time (ISO 8601 UTC), instance, kind, source (who
    decided: role, or role:caller), lifecycle state before and after (for
    instance events), reason. The chain is verified in the same pass; a chain
    that does not verify is refused (exit 1) unless --unverified. Filters
    combine (all must hold). Exit 0, also when nothing matches.
    """
    from . import forensics_cli  # noqa: PLC0415

    db = _chain_of(where)
    _forensics(
        lambda: forensics_cli.events(
            db,
            instance,
            kinds,
            source,
            since,
            until,
            grep,
            as_jsonl,
            as_csv,
            unverified,
            _resolve,
            _chain_roles,
        )
    )


@cli.command("audit")
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.option(
    "--max-restarts",
    type=click.IntRange(min=0),
    help="The node's restart budget (its config's restart.max_restarts); without it the "
    "budget is checked only where the chain records it.",
)
@click.option(
    "--window",
    "window_s",
    type=_FiniteRange(min=0, min_open=True, max=7 * 24 * 3600.0),
    help="The budget's window in seconds (restart.window_s); needs --max-restarts.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def audit_cmd(where: Path, max_restarts: int | None, window_s: float | None, as_json: bool) -> None:
    """Replay the chain in WHERE through the lifecycle rules; report every forbidden transition.

    Flags, with sequence numbers: a restart after an operator (or
    controller) stop, a restart beyond the budget, a start of an exposed
    instance, an event for an instance never placed (or already unloaded),
    time going backwards, and any other transition the lifecycle table
    forbids. The chain is verified in the same pass. Exit 0 when there is
    nothing to report; 1 when something was found or the chain does not
    verify; 2 when WHERE cannot be read.
    """
    from . import forensics_cli  # noqa: PLC0415

    db = _chain_of(where)
    sys.exit(_forensics(lambda: forensics_cli.audit(db, max_restarts, window_s, as_json)))


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point."""
    cli.main(args=argv)
