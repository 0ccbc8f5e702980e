"""``infervisor witness``: run a C2SP tlog-witness, print its key, show what it cosigned."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import click
import msgspec

from infervisor.chain.cosignature import Cosigner, parse_witness_key
from infervisor.chain.errors import NoteError
from infervisor.chain.witness_protocol import ADD_CHECKPOINT

from ..clikit.command import Group
from ..clikit.failure import Failure, echo_json
from .audit import ChainAuditor
from .config import (
    VKEY_FILE,
    ConfigError,
    WitnessConfig,
    load_config,
    load_or_create_cosigner,
    parse_listen,
)
from .store import DB_FILE, StoreError, WitnessStore

__all__ = ["witness"]


@click.group("witness", cls=Group)
def witness() -> None:
    """Witness other logs' checkpoints: a C2SP tlog-witness server (c2sp.org/tlog-witness).

    A witness keeps, for each log it is configured to witness (by origin and
    verifier key), the latest checkpoint it cosigned, and cosigns a new one
    only if the log signed it and a consistency proof shows it extends that
    one. Any infervisor node ([[witnesses]] url and vkey) and any other C2SP
    log can use it.

    \b
    Set up:   infervisor witness vkey witness.toml     (creates the key; give
                                                        this line to the logs)
    Serve:    infervisor witness run witness.toml
    Inspect:  infervisor witness status witness.toml [--json]

    See examples/witness.toml for the config and docs/chain-format.md
    ("Witness") for the protocol.
    """


def _config(path: Path) -> WitnessConfig:
    try:
        return load_config(path)
    except ConfigError as e:
        raise Failure(str(e), "bad_config", "CONFIG") from None


def _cosigner(config: WitnessConfig) -> Cosigner:
    try:
        return load_or_create_cosigner(config.data_dir, config.name)
    except ConfigError as e:
        raise Failure(str(e), "bad_key", "witness.key") from None


@witness.command("run")
@click.argument("config_path", metavar="CONFIG", type=click.Path(path_type=Path))
@click.option(
    "--listen",
    metavar="HOST:PORT",
    help="Listen here instead of the config's witness.listen.",
)
@click.option(
    "--audit",
    is_flag=True,
    help="Read each checkpoint's events from the log before cosigning (as witness.audit = true).",
)
def run(config_path: Path, listen: str | None, audit: bool) -> None:
    """Serve add-checkpoint for the logs of CONFIG until SIGINT or SIGTERM.

    Creates the witness key (DATA_DIR/witness.key, 0600) on first run. Every
    cosigned checkpoint is on disk (DATA_DIR/witness.db, fsynced) before its
    cosignature is sent. Prints one line when it listens:
    `witness NAME listening on http://HOST:PORT/add-checkpoint`. The config's
    shape: examples/witness.toml.

    --audit (or witness.audit = true): a semantic witness. Before cosigning,
    it mirrors the log's chain from each log's url (a node's API, or a
    file: url of a chain.db) into DATA_DIR/mirrors/, re-hashes its events,
    checks they make the checkpoint's root, replays them through the
    lifecycle rules as `infervisor audit` does, and refuses (422, the reason
    kept, shown by `witness status`) a checkpoint whose new events break a
    rule; a log it cannot read now gets a 503. Every log needs a url.
    """
    from .server import bind, serve  # noqa: PLC0415 - uvicorn only when serving
    from .service import Witness  # noqa: PLC0415

    config = _config(config_path)
    if listen is not None:
        try:
            host, port = parse_listen(listen, "--listen")
        except ConfigError as e:
            raise Failure(str(e), "bad_value", "--listen") from None
        config = msgspec.structs.replace(config, host=host, port=port)
    auditor = _auditor(config, audit)
    cosigner = _cosigner(config)
    store = _open_store(config.data_dir)
    try:
        try:
            sock = bind(config.host, config.port)
        except ConfigError as e:
            raise Failure(str(e), "port_taken", "witness.listen") from None
        host = f"[{config.host}]" if ":" in config.host else config.host
        click.echo(
            f"witness {config.name} listening on http://{host}:{config.port}{ADD_CHECKPOINT} "
            f"({len(config.logs)} logs)"
        )
        sys.stdout.flush()
        serve(Witness(cosigner, config.logs, store, auditor=auditor), config, sock)
    finally:
        store.close()


def _auditor(config: WitnessConfig, flag: bool) -> ChainAuditor | None:
    if not (flag or config.audit):
        return None
    for origin, log in config.logs.items():
        if log.url is None:
            raise Failure(
                f"log {origin!r} has no url: --audit reads each log's events from its url",
                "bad_config",
                "logs.url",
            )
    return ChainAuditor(config.data_dir)


def _open_store(data_dir: Path) -> WitnessStore:
    try:
        return WitnessStore(data_dir / DB_FILE)
    except StoreError as e:
        raise Failure(str(e), "bad_path", "DATA_DIR") from None


@witness.command("vkey")
@click.argument("config_path", metavar="CONFIG", type=click.Path(path_type=Path))
def vkey(config_path: Path) -> None:
    """Print the witness's verifier key (creating the key on first use).

    The line goes in each log's config: an infervisor node's
    `[[witnesses]] vkey = "..."`, beside `url = "http://HOST:PORT"`.
    """
    config = _config(config_path)
    click.echo(_cosigner(config).key.key_string())


class _LogStatus(msgspec.Struct):
    origin: str
    size: int | None
    root: str | None
    cosigned_at_s: int | None
    refused: int
    last_refusal: str | None


class _Status(msgspec.Struct):
    witness: str | None
    vkey: str | None
    logs: list[_LogStatus]


@witness.command("status")
@click.argument("where", metavar="WHERE", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the status as one JSON object.")
def status(where: Path, as_json: bool) -> None:
    """Show, per origin, the latest checkpoint the witness cosigned and what it refused.

    WHERE is the witness's config (its configured logs are listed, cosigned
    or not) or its data directory. Reads the state file only; the witness
    may be running. --json: {"witness", "vkey", "logs": [{"origin", "size",
    "root", "cosigned_at_s", "refused", "last_refusal"}]} (null: never).
    """
    logs: list[str] = []
    if not where.exists():
        raise Failure(
            f"{where} is neither a witness config nor its data directory", "bad_path", "WHERE"
        )
    if where.is_dir():
        data_dir = where
    else:
        config = _config(where)
        data_dir, logs = config.data_dir, list(config.logs)
    report = _status_of(data_dir, logs)
    if as_json:
        echo_json(report)
        return
    click.echo(f"witness {report.witness or '?'}  vkey {report.vkey or '(no key)'}")
    for row in report.logs:
        said = f"size {row.size:,}" if row.size is not None else "never cosigned"
        extra = f"; {row.refused} refused, last: {row.last_refusal}" if row.refused else ""
        click.echo(f"  {row.origin}: {said}{extra}")


def _status_of(data_dir: Path, configured: list[str]) -> _Status:
    if not (data_dir / DB_FILE).is_file():
        raise Failure(
            f"{data_dir} holds no {DB_FILE}: has the witness run there?", "bad_path", "WHERE"
        )
    store = _open_store(data_dir)
    try:
        held = {h.origin: h for h in store.all()}
        refused = store.refusal_counts()
    finally:
        store.close()
    try:
        key = parse_witness_key((data_dir / VKEY_FILE).read_text(encoding="ascii"))
        name, vk = key.name, key.key_string()
    except (OSError, UnicodeDecodeError, NoteError):
        name, vk = None, None
    rows = []
    for origin in sorted({*configured, *held, *refused}):
        h = held.get(origin)
        count, last = refused.get(origin, (0, None))
        rows.append(
            _LogStatus(
                origin,
                h.size if h else None,
                base64.b64encode(h.root).decode() if h else None,
                h.timestamp_s if h else None,
                count,
                last,
            )
        )
    return _Status(name, vk, rows)
