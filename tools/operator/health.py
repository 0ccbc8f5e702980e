"""``infervisor health [WHERE] INSTANCE [--deep]``: ask a running node how an instance is.

Without ``--deep`` it prints the last health verdict the node's probes
recorded (nothing is asked of the server). With ``--deep`` the node runs a
deep health check now, on demand, through the control API's
``POST /v1/instances/{id}/deep-health`` (tools/api): the normal probe, then
one real token of completion (``POST /v1/completions`` with ``max_tokens``
1; for Ollama its OpenAI-compatible route, Ollama's docs/openai.md), bounded
by the node's ``deep_timeout_s``. The same check runs on a schedule when the
instance's kind sets ``deep_interval_s`` (actors/kinds.py). An on-demand
check records nothing: only scheduled ones count toward unhealthy.

Exit 0 with the token; 1 when the check fails (with the server's answer) or
the node refuses; 2 on a wrong command line; 3 when no node runs on WHERE.
"""

from __future__ import annotations

import sys

import click

from infervisor.replay.views import InstanceView

from ..api.exit_codes import Exit
from ..clikit.command import Command
from ..clikit.failure import echo_json
from .target import Target, connected, node_command, running_healthy, view_of

__all__ = ["health"]


@click.command("health", cls=Command)
@click.option("--deep", is_flag=True, help="Ask the server for one real token now.")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@click.option(
    "--check",
    is_flag=True,
    help="Exit 0 only when INSTANCE is running and healthy, else 1 (3: no node runs; "
    "4: it does not answer), like `systemctl is-active`.",
)
@node_command("[WHERE] INSTANCE", 1)
def health(target: Target, deep: bool, as_json: bool, check: bool) -> None:
    """Show INSTANCE's health on the node; --deep checks it now.

    WHERE is the node's data directory, its config file (.toml) or its
    chain file; without it, --url (or INFERVISOR_URL) names the node.
    INSTANCE is an instance id, or a role naming one instance.
    Without --deep: the last probe's verdict. With --deep: one real token of
    completion, asked now.

    --check, for scripts: after the same output, exit 1 unless the node has
    INSTANCE running and its last probe did not fail (with --deep, and the
    token came).

    Exit 0 with the verdict or the token; 1 when the deep check gives no
    token (with the server's answer) or the node refuses (an unknown
    INSTANCE names the placed ones); 2 when the command line is wrong; 3
    when no node runs on WHERE (or answers at --url).
    """
    if not target.rest:
        raise click.UsageError("missing argument INSTANCE (an instance id, or a role)")
    with connected(target) as client:
        view = view_of(client, target.rest[0])
        iid = view.instance_id
        if not deep:
            if as_json:
                echo_json(
                    {
                        "instance": iid,
                        "health": view.health or None,  # null: not probed yet
                        "reason": view.health_reason or None,
                    }
                )
            else:
                why = f": {view.health_reason}" if view.health_reason else ""
                click.echo(f"{iid}: {view.health or 'unknown'}{why}")
            _exit_checked(check, view)
            return
        token = client.deep_health(iid)
    if as_json:
        echo_json({"instance": iid, "deep": True, "token": token})
    else:
        click.echo(f"{iid}: deep health ok: token {token!r}")
    _exit_checked(check, view)


def _exit_checked(check: bool, view: InstanceView) -> None:
    """--check: exit 1 unless the instance runs healthy."""
    if check and not running_healthy(view):
        sys.exit(Exit.REFUSED)
