"""The ``infervisor`` command line: a thin layer over the library.

Every command exits by one table (:mod:`.exit_codes`, docs/cli.md): 0 done or
already so; 1 refused or invalid; 2 usage; 3 no node takes verbs there. Bad
input is reported in one line, never a traceback; with ``--json`` the error
is also printed on stdout as one object (``{"error": {"code", "message",
"field"}}``). JSON output follows the schemas of :mod:`.schemas`.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
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

from .control import (
    ControlClient,
    ControlError,
    NodeStarting,
    NodeStopping,
    NodeUnavailable,
    NotRunning,
    VerbFailed,
)
from .exit_codes import EPILOG, cut, exit_for, kind_code
from .schemas import (
    ErrorBody,
    ErrorRecord,
    InstanceRecord,
    from_state,
    from_timeline,
    from_view,
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
        _json(ErrorRecord(error=ErrorBody(code=code, message=message, field=field)))
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
    """A finite, non-negative number of seconds (NaN and infinity refused)."""

    name = "seconds"

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
@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log what the actors do (to stderr).")
def cli(verbose: bool) -> None:
    """Supervise local LLM model servers (llama.cpp, mlx-lm, Ollama) with an
    append-only, BLAKE3 hash-chained audit log in SQLite.

    \b
    Start here:   infervisor demo
    Run a node:   infervisor run examples/node.toml
    Operate it:   infervisor status examples/node.toml
                  infervisor stop|start|restart|unload WHERE INSTANCE
    Audit:        infervisor chain verify WHERE
                  infervisor replay WHERE
                  infervisor timeline WHERE INSTANCE

    WHERE is a node's data directory, its config file (.toml) or its chain
    file (DATA_DIR/chain.db); INSTANCE an instance id, or a role that names
    one instance. See docs/cli.md for the JSON schemas and error codes.
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
_UNAVAILABLE_CODE: dict[type[NodeUnavailable], str] = {
    NotRunning: "no_node",
    NodeStarting: "node_starting",
    NodeStopping: "node_stopping",
}


def _control_failure(e: ControlError) -> NoReturn:
    """Exit for an error of the control socket, by the table."""
    if isinstance(e, VerbFailed):
        message = str(e).replace("grace_s", "--grace")
        _fail(message, kind_code(e.kind), "--grace" if "--grace" in message else None)
    if isinstance(e, NodeUnavailable):
        _fail(str(e), _UNAVAILABLE_CODE.get(type(e), "node_unreachable"))
    _fail(str(e), "node_error")


@contextmanager
def _node(where: Path) -> Iterator[ControlClient]:
    """A client of the node on WHERE; exits by the table on any error of the socket."""
    try:
        with ControlClient(_where(where)[0]) as client:
            yield client
    except ControlError as e:
        _control_failure(e)


def _view_of(client: ControlClient, instance: str) -> InstanceView:
    """INSTANCE's view (by id or role); refused naming the placed ones when unknown."""
    views = client.list()
    roles: dict[str, str | None] = {v.instance_id: v.role for v in views}
    iid = _resolve(instance, roles, "on this node")
    return next(v for v in views if v.instance_id == iid)


@cli.command()
@_DATA_DIR
@click.argument("instance", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the instances as JSON.")
@click.option("--unverified", is_flag=True, help="From the chain: " + _UNVERIFIED_HELP)
def status(data_dir: Path, instance: str | None, as_json: bool, unverified: bool) -> None:
    """Show the instances of the node running on DATA_DIR (or only INSTANCE).

    DATA_DIR is the node's data directory, its config file (.toml) or its
    chain file; INSTANCE an instance id or a role naming one instance.
    Columns: id, adapter, lifecycle state, wanted state, last health verdict,
    pid, restarts, memory reserved by the budget / resident (MiB), reason.

    When no node runs there, the state is replayed from DATA_DIR/chain.db
    instead, and stderr says so; health and memory are then unknown. The
    chain is verified in the same pass: one that does not verify is refused
    (exit 1) unless --unverified (output marked). --json
    prints the same objects either way (docs/cli.md, schema "instance"), with
    "source": "node" or "chain"; what only the node knows is null from the chain.

    Exit 0; 1 when INSTANCE is not placed (the message names those that are);
    2 when DATA_DIR names nothing; 3 when it has neither a running node nor a chain.
    """
    folder, db = _where(data_dir)
    try:
        with ControlClient(folder) as client:
            views = [_view_of(client, instance)] if instance else client.list()
    except NodeUnavailable as e:
        _status_from_chain(folder, db, instance, as_json, e, unverified=unverified)
        return
    except ControlError as e:
        _control_failure(e)
    if as_json:
        records = [from_view(v) for v in views]
        _json(records[0] if instance else records)
        return
    _print_table([_row(from_view(v)) for v in views])
    if instance:
        _print_details(views[0])


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
            _control_failure(why)  # a new node still opening: no chain yet
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


def _row(r: InstanceRecord) -> tuple[str, ...]:
    offline = r.source == "chain"
    unknown = "?" if offline else "-"
    memory = f"{_mib(r.reserved_bytes)}/{'?' if offline else _mib(r.rss_bytes)}"
    pid = str(r.pid) if r.pid is not None else "-"
    cells = (r.instance_id, r.adapter or "?", r.lifecycle, r.desired, r.health or unknown, pid)
    return (*cells, str(r.restarts), memory, r.reason or "")


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
        pid = f"pid {e.pid}, " if e.pid is not None else ""
        click.echo(f"  last exit  {pid}{how}: {e.reason}")


def _say_view(view: InstanceView, as_json: bool, *, already: bool = False) -> None:
    if as_json:
        _json(from_view(view))
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
    client: ControlClient, answer: InstanceView, timeout_s: float, progress: _Progress
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
def _countdown(iid: str, grace_s: float | None, progress: _Progress) -> Iterator[None]:
    """While a stop blocks: the grace counting down to SIGKILL (elapsed seconds when
    the grace is the node's default), once a second, on a terminal only."""
    done = threading.Event()

    def tick() -> None:
        began = time.monotonic()
        while True:
            waited = time.monotonic() - began
            if grace_s is None:
                progress.show(f"stopping {iid}: {waited:.0f} s (SIGKILL after the node's grace)")
            elif waited < grace_s:
                progress.show(f"stopping {iid}: SIGKILL in {math.ceil(grace_s - waited)} s")
            else:
                progress.show(f"stopping {iid}: SIGKILL sent, waiting for it to exit")
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


@cli.command()
@_DATA_DIR
@click.argument("instance")
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
    help="How long --wait waits for it to run.",
)
def start(data_dir: Path, instance: str, as_json: bool, wait: bool, timeout: float) -> None:
    """Start INSTANCE's server on the node running on DATA_DIR.

    The instance is wanted running from now on, and its restart budget is
    reset. Answers once the server is spawned (lifecycle `starting`); with
    --wait, once it is `running` (exit 1 with the reason when it fails
    instead). An instance already starting or running is left as it is (its
    budget too): exit 0, "already running". An adopted server is only
    checked to answer.

    DATA_DIR is the node's data directory, its config file (.toml) or its
    chain file; INSTANCE an instance id, or a role naming one instance.
    Exit 0 printing the resulting state; 1 when the node refuses (with its
    message: an unknown INSTANCE names the placed ones); 2 when the command
    line is wrong; 3 when no node runs on DATA_DIR.
    """
    with _node(data_dir) as client:
        before = _view_of(client, instance)
        view = client.start(before.instance_id)
        already = before.lifecycle in _LIVE and view.last_seq == before.last_seq
        if wait:
            view = _wait_running(client, view, timeout, _Progress())
    _say_view(view, as_json, already=already)


@cli.command()
@_DATA_DIR
@click.argument("instance")
@click.option(
    "--grace",
    type=SECONDS,
    metavar="SECONDS",
    help="Seconds between SIGTERM and SIGKILL [default: the node's stop_grace_s].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the instance as JSON.")
def stop(data_dir: Path, instance: str, grace: float | None, as_json: bool) -> None:
    """Stop INSTANCE's server on the node running on DATA_DIR.

    SIGTERM to its process group, SIGKILL after --grace seconds; answers
    once nothing of the group is left (on a terminal, the grace counts down
    on stderr). The instance stays placed and is wanted stopped (the node
    will not restart it, nor will the next `infervisor run`): `infervisor
    start` brings it back. A stopped instance is left as it is: exit 0,
    "already stopped". Adopted servers are never stopped; `infervisor
    unload` forgets them.

    DATA_DIR is the node's data directory, its config file (.toml) or its
    chain file; INSTANCE an instance id, or a role naming one instance.
    Exit 0 printing the resulting state; 1 when the node refuses (with its
    message: an unknown INSTANCE names the placed ones); 2 when the command
    line is wrong; 3 when no node runs on DATA_DIR.
    """
    with _node(data_dir) as client:
        before = _view_of(client, instance)
        with _countdown(before.instance_id, grace, _Progress()):
            view = client.stop(before.instance_id, grace)
    already = (
        before.pid is None and before.lifecycle not in _LIVE and view.last_seq == before.last_seq
    )
    _say_view(view, as_json, already=already)


@cli.command()
@_DATA_DIR
@click.argument("instance")
@click.option("--json", "as_json", is_flag=True, help="Print the instance as JSON.")
def restart(data_dir: Path, instance: str, as_json: bool) -> None:
    """Restart INSTANCE's server on the node running on DATA_DIR.

    Stops it (when running), then starts it again: a new process. Resets its
    restart budget; the instance is wanted running afterwards.

    DATA_DIR is the node's data directory, its config file (.toml) or its
    chain file; INSTANCE an instance id, or a role naming one instance.
    Exit 0 printing the resulting state; 1 when the node refuses (with its
    message: an unknown INSTANCE names the placed ones); 2 when the command
    line is wrong; 3 when no node runs on DATA_DIR.
    """
    with _node(data_dir) as client:
        view = client.restart(_view_of(client, instance).instance_id)
    _say_view(view, as_json)


@cli.command()
@_DATA_DIR
@click.argument("instance")
@click.option("--json", "as_json", is_flag=True, help='Print {"unloaded": ID} as JSON.')
def unload(data_dir: Path, instance: str, as_json: bool) -> None:
    """Forget INSTANCE on the node running on DATA_DIR, stopping its server.

    The server gets SIGTERM and, 5 s later, SIGKILL. The node no longer
    supervises it; its history stays in the chain (`infervisor timeline`).
    An adopted server keeps running: only its registration is forgotten.
    The next `infervisor run` places it again while its config lists it:
    remove it there to keep it gone.

    DATA_DIR is the node's data directory, its config file (.toml) or its
    chain file; INSTANCE an instance id, or a role naming one instance.
    Exit 0 once it is unloaded; 1 when the node refuses (with its message:
    an unknown INSTANCE names the placed ones); 2 when the command line is
    wrong; 3 when no node runs on DATA_DIR.
    """
    with _node(data_dir) as client:
        iid = _view_of(client, instance).instance_id
        client.unload(iid)
    if as_json:
        _json({"unloaded": iid})
    else:
        click.echo(f"{iid}: unloaded")


from .health_cli import health_command  # noqa: E402 - last: it is built on the helpers above

cli.add_command(health_command(_node, _view_of, _json, _Command))


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
