"""``infervisor cordon``, ``drain`` and ``uncordon``: whether the node takes
placements, sent to the running node (``POST /v1/node/cordon|drain|uncordon``).
Recorded in the chain, so a node restart keeps them (actors/core/cordon.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
import msgspec

from infervisor.replay.cordon_reason import in_force_said

from ..api.fleet_wire import CordonAnswer
from ..clikit.command import REASON, Command
from ..clikit.failure import echo_json
from .target import Target, connected, node_command

__all__ = ["cordon", "drain", "uncordon"]

#: The end of each verb's help: its arguments and exit codes.
_HELP_TAIL = """
    WHERE is the node's data directory, its config file (.toml) or its
    chain file; without it, --url (or INFERVISOR_URL) names the node (a
    token with scope control: --token-name controller by default).
    --json prints {"cordon", "stopped", "seq", "hash", "recorded", "reason",
    "since_ns"}: the node's cordon after it (none, cordoned, drained), the
    instances stopped, the chain's head, whether an event was recorded
    (false: it was so already, the reason in force unchanged), and the reason
    and time (ns since the epoch, UTC) of the cordon in force. A cordon of a
    cordoned node or a drain of a drained one with a new --reason records it;
    with the reason in force, or none, it records nothing and says since when
    the node is so; a cordon of a drained node leaves the drain and its reason
    as they are.
    Exit 0 once recorded (or already so); 1 when the node
    refuses; 2 when the command line is wrong; 3 when no node runs on WHERE
    (or answers at --url).
    """

_SAID = {
    "none": "node uncordoned: it takes placements",
    "cordoned": "node cordoned: it takes no new placements",
    "drained": "node drained: no new placements; its controllers' instances stay stopped",
}


def _options(f: Callable[..., Any]) -> Callable[..., Any]:
    f.__doc__ = (f.__doc__ or "").rstrip() + "\n" + _HELP_TAIL
    f = node_command("[WHERE]", 0, token_name="controller")(f)  # noqa: S106 -- a name
    f = click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")(f)
    return click.option(
        "--reason",
        type=REASON,
        metavar="TEXT",
        help="Why, recorded in the chain: one line, at most 500 characters.",
    )(f)


def _run(target: Target, verb: str, reason: str | None, as_json: bool) -> None:
    with connected(target, {"reason": "--reason"}) as client:
        answer: CordonAnswer = client.cordon(verb, reason)
    if as_json:
        echo_json(msgspec.to_builtins(answer))
        return
    if not answer.recorded and answer.cordon == "none":
        # An uncordon of a node that was not cordoned (stop 33's trial: it read
        # "node uncordoned" though nothing was recorded), as a cordon re-sent says.
        click.echo("not cordoned: the node takes placements; nothing recorded")
        return
    click.echo(_SAID.get(answer.cordon, answer.cordon))
    if not answer.recorded:
        said = in_force_said(answer.reason, answer.since_ns)
        because = "" if answer.reason is not None else " (no reason recorded)"
        click.echo(f"already {answer.cordon}{said}{because}; nothing recorded")
    for iid in answer.stopped:
        click.echo(f"stopped {iid}")


@click.command(cls=Command)
@_options
def cordon(target: Target, reason: str | None, as_json: bool) -> None:
    """Cordon the node: it takes no new placements until `infervisor uncordon`.

    What runs keeps running, and placed instances may still be started and
    stopped. A new placement is refused (409 cordoned). A drained node stays
    drained.

    """
    _run(target, "cordon", reason, as_json)


@click.command(cls=Command)
@_options
def drain(target: Target, reason: str | None, as_json: bool) -> None:
    """Drain the node: cordon it, and stop every instance a controller placed.

    Each is stopped with its grace (SIGTERM, then SIGKILL); answers once all
    are stopped, naming them. They stay stopped, across a node restart too,
    until `infervisor uncordon` (then a controller, or `infervisor start`,
    starts them again). What an operator or the config placed keeps running.

    """
    _run(target, "drain", reason, as_json)


@click.command(cls=Command)
@_options
def uncordon(target: Target, reason: str | None, as_json: bool) -> None:
    """End cordon and drain: the node takes placements again.

    Nothing is started by it: a drained instance is started again by its
    controller (or `infervisor start`).

    """
    _run(target, "uncordon", reason, as_json)
