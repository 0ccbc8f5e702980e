"""``infervisor models [WHERE]``: the models a running node can serve.

Asks the node's control API (``GET /v1/models``): each model of its registry
with its format, the weights' size and their BLAKE3 digest, as a controller
sees them before it places. Nothing is changed.

Exit 0 with the list (empty: no model); 2 on a wrong command line; 3 when no
node runs on WHERE.
"""

from __future__ import annotations

import click

from ..clikit.command import Command
from ..clikit.failure import echo_json
from .target import Target, connected, node_command

__all__ = ["models"]


@click.command("models", cls=Command)
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@node_command("[WHERE]", 0)
def models(target: Target, as_json: bool) -> None:
    """List the models of the node's registry: name, format, size, digest.

    WHERE is the node's data directory, its config file (.toml) or its
    chain file; without it, --url (or INFERVISOR_URL) names the node.
    With --json: {"models": [{"name", "format", "size_bytes", "digest"}]}
    (size and digest null for an Ollama model).

    Exit 0 with the list; 2 when the command line is wrong; 3 when no node
    runs on WHERE (or answers at --url).
    """
    with connected(target) as client:
        answer = client.models()
    if as_json:
        echo_json(answer)
        return
    if not answer.models:
        click.echo("no model in the registry")
        return
    width = max(len(m.name) for m in answer.models)
    for m in answer.models:
        size = "-" if m.size_bytes is None else f"{m.size_bytes} B"
        digest = "-" if m.digest is None else m.digest[:16]
        click.echo(f"{m.name:<{width}}  {m.format.value:<6}  {size:>14}  {digest}")
