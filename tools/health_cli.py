"""``infervisor health DATA_DIR INSTANCE [--deep]``: ask a running node how an instance is.

Without ``--deep`` it prints the last health verdict the node's probes
recorded (nothing is asked of the server). With ``--deep`` the node runs a
deep health check now, on demand, through the control socket's
``deep_health`` verb (tools/control.py): the normal probe, then one real
token of completion (``POST /v1/completions`` with ``max_tokens`` 1; for
Ollama its OpenAI-compatible route, Ollama's docs/openai.md), bounded by the
node's ``deep_timeout_s``. The same check runs on a schedule when the
instance's kind sets ``deep_interval_s`` (actors/kinds.py). An on-demand
check records nothing: only scheduled ones count toward unhealthy.

Exit 0 with the token; 1 when the check fails (with the server's answer) or
the node refuses; 2 on a wrong command line; 3 when no node runs on DATA_DIR.
tools/cli.py registers the command built by :func:`health_command`, handing it
its shared helpers (so this module never imports the command line's).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import click

from infervisor.actors.messages import InstanceView

from .control import ControlClient

__all__ = ["health_command"]

NodeOf = Callable[[Path], AbstractContextManager[ControlClient]]
ViewOf = Callable[[ControlClient, str], InstanceView]


def health_command(
    node: NodeOf,
    view_of: ViewOf,
    echo_json: Callable[[Any], None],
    cls: type[click.Command] = click.Command,
) -> click.Command:
    """The ``health`` command, built on the command line's helpers: ``node`` opens
    the control socket of the node on DATA_DIR (exiting by the error table on
    any failure), ``view_of`` resolves INSTANCE (an id, or a role naming one
    instance), ``echo_json`` prints a JSON answer; ``cls`` is the command line's
    command class (its --help ends with the exit table)."""

    @click.command("health", cls=cls)
    @click.argument("data_dir", metavar="DATA_DIR", type=click.Path(path_type=Path))
    @click.argument("instance")
    @click.option("--deep", is_flag=True, help="Ask the server for one real token now.")
    @click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
    def health(data_dir: Path, instance: str, deep: bool, as_json: bool) -> None:
        """Show INSTANCE's health on the node running on DATA_DIR; --deep checks it now.

        DATA_DIR is the node's data directory, its config file (.toml) or its
        chain file; INSTANCE an instance id, or a role naming one instance.
        Without --deep: the last probe's verdict. With --deep: one real token of
        completion, asked now.

        Exit 0 with the verdict or the token; 1 when the deep check gives no
        token (with the server's answer) or the node refuses (an unknown
        INSTANCE names the placed ones); 2 when the command line is wrong; 3
        when no node runs on DATA_DIR.
        """
        with node(data_dir) as client:
            view = view_of(client, instance)
            iid = view.instance_id
            if not deep:
                if as_json:
                    echo_json(
                        {"instance": iid, "health": view.health, "reason": view.health_reason}
                    )
                else:
                    why = f": {view.health_reason}" if view.health_reason else ""
                    click.echo(f"{iid}: {view.health or 'unknown'}{why}")
                return
            token = client.deep_health(iid)
        if as_json:
            echo_json({"instance": iid, "deep": True, "token": token})
        else:
            click.echo(f"{iid}: deep health ok: token {token!r}")

    return health
