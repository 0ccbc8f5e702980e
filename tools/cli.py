"""The ``infervisor`` command line: the root group, which adds each subpackage's commands.

Each command is declared once, in the module with its body: the operator's
verbs in :mod:`.operator`, the auditor's and analyst's offline reads in
:mod:`.audit`, ``infervisor run`` in :mod:`.node`, ``infervisor demo`` in
:mod:`.demo`. Every command exits by one table (docs/cli.md): 0 done or
already so; 1 refused or invalid; 2 usage; 3 no node takes verbs there. Bad
input is reported in one line, never a traceback; with ``--json`` the error
is also printed on stdout as one object (``{"error": {"code", "message",
"field"}}``, :mod:`.clikit`). JSON output follows the schemas of
:mod:`.clikit.schemas`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from .clikit import startup
from .clikit.command import LazyGroup

__all__ = ["cli", "main"]

# httpx imports its own command line (httpx._main, which loads rich and pygments:
# 0.1 s of CPU at every start) whenever click is installed. This program never
# runs it; a module that is None in sys.modules fails to import, which httpx's
# __init__ expects (it then defines a stub `httpx.main`).
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    # The installed distribution's version (pyproject.toml), as the node records
    # it in node.started: importing the node for it cost 0.5 s; importlib.metadata
    # itself costs 50 ms, so only --version loads it.
    import importlib.metadata  # noqa: PLC0415

    click.echo(f"infervisor {importlib.metadata.version('infervisor')}")
    ctx.exit(0)


#: The commands, by who uses them: each name -> where it is declared (a module of
#: this package). They are imported when asked for, so a command pays only for its
#: own libraries (a CLI started many times a minute by scripts starts quickly).
BY_USER: dict[str, dict[str, str]] = {
    "newcomer": {"demo": ".demo.command:demo"},
    "node": {"run": ".node.run:run"},
    "operator": {
        name: f".operator.{module}:{name}"
        for name, module in (
            ("status", "status"),
            ("models", "models"),
            ("place", "place"),
            ("start", "verbs"),
            ("stop", "verbs"),
            ("restart", "verbs"),
            ("unload", "verbs"),
            ("logs", "logs"),
            ("watch", "watch"),
            ("health", "health"),
            ("cordon", "cordon"),
            ("drain", "cordon"),
            ("uncordon", "cordon"),
        )
    },
    "auditor": {
        "chain": ".audit.chain_group:chain",
        "replay": ".audit.replay:replay",
        "timeline": ".audit.timeline:timeline",
        "events": ".audit.events:events",
        "audit": ".audit.report:audit",
    },
    "witness": {"witness": ".witness.command:witness"},
    "fleet": {"fleet": ".fleet.command:fleet"},
}
COMMANDS = {name: where for commands in BY_USER.values() for name, where in commands.items()}
#: The commands that say themselves when their start-up is over (clikit/startup.py):
#: the node's is over once it is open and its API serves (tools/node/run.py).
OWN_STARTUP = {"run"}


@click.group(
    cls=LazyGroup,
    lazy=COMMANDS,
    package=__package__,
    context_settings={"help_option_names": ["-h", "--help"]},
)
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
                  infervisor models WHERE
                  infervisor stop|start|restart|unload WHERE INSTANCE
                  infervisor place WHERE --file FRAGMENT.toml
                  infervisor logs WHERE INSTANCE [-f]
                  infervisor watch WHERE [--json]
                  infervisor cordon|drain|uncordon WHERE
    Audit:        infervisor chain verify WHERE
                  infervisor replay WHERE
                  infervisor timeline WHERE INSTANCE
    Witness:      infervisor witness run witness.toml
    Fleet:        infervisor fleet status|check|serve FLEET.toml

    WHERE is a node's data directory, its config file (.toml) or its chain
    file (DATA_DIR/chain.db); the operator verbs reach the node through its
    socket DATA_DIR/api.sock, or take --url URL --token SECRET instead of
    WHERE (a node's [api] tcp). INSTANCE is an instance id, or a role that
    names one instance. See docs/cli.md for the JSON schemas and error codes.
    """
    if click.get_current_context().invoked_subcommand not in OWN_STARTUP:
        startup.done()  # the command's module is loaded (see below)
    if not verbose and "logging" not in sys.modules:
        # The command's module is imported by now (click resolves it before this
        # callback) and nothing it loaded logs: do not load logging only to
        # configure it (10 ms of a start-up: issue 22). Python's last-resort
        # handler still prints a warning to stderr should a later import log one.
        return
    import logging  # noqa: PLC0415 - see above

    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: the process's start-up runs without the cyclic garbage
    collector (clikit/startup.py)."""
    startup.begin()
    cli.main(args=argv)
