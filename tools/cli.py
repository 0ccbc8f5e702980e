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

import logging
from collections.abc import Sequence

import click

from .audit.chain_group import chain
from .audit.events import events
from .audit.replay import replay
from .audit.report import audit
from .audit.timeline import timeline
from .clikit.command import Group
from .demo.command import demo
from .node.run import run
from .operator.health import health
from .operator.logs import logs
from .operator.place import place
from .operator.status import status
from .operator.verbs import restart, start, stop, unload
from .operator.watch import watch

__all__ = ["cli", "main"]


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from infervisor.actors.node import VERSION  # noqa: PLC0415 - keeps --help fast

    click.echo(f"infervisor {VERSION}")
    ctx.exit(0)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
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


#: The commands, by who uses them.
BY_USER: dict[str, tuple[click.Command, ...]] = {
    "newcomer": (demo,),
    "node": (run,),
    "operator": (status, place, start, stop, restart, unload, logs, watch, health),
    "auditor": (chain, replay, timeline, events, audit),
}
for _commands in BY_USER.values():
    for _command in _commands:
        cli.add_command(_command)


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point."""
    cli.main(args=argv)
