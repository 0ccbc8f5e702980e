"""``infervisor logs``: an instance's captured server output, asked of the node
(GET /v1/instances/ID/logs), so it works over --url too; ``-f`` follows it."""

from __future__ import annotations

import sys

import click

from ..clikit.command import Command
from .target import Target, connected, instance_arg, node_command, view_of

__all__ = ["logs"]


@click.command(cls=Command)
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
@node_command("[WHERE] INSTANCE", 1)
def logs(target: Target, follow: bool, stream: str, tail_bytes: int) -> None:
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
    instance = instance_arg(target)
    out = sys.stdout.buffer
    try:
        with connected(target) as client:
            iid = view_of(client, instance).instance_id
            for chunk in client.logs(iid, stream=stream, follow=follow, tail_bytes=tail_bytes):
                out.write(chunk)
                out.flush()
    except KeyboardInterrupt:
        sys.exit(0)
