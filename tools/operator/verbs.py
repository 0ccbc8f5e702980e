"""``infervisor start``, ``stop``, ``restart`` and ``unload``: one instance's
lifecycle verbs, sent to the running node; each answers with the resulting
state (and, under --json, the seq and hash of its last event in the chain)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import click

from infervisor.replay.views import InstanceView

from ..api.client import DEFAULT_TIMEOUT_S, ApiClient
from ..api.errors import NodeUnavailable
from ..clikit.command import SECONDS, Command, Seconds
from ..clikit.failure import echo_json, fail
from ..clikit.schemas import verb_record
from ..clikit.wanted import state_words
from .progress import Progress, countdown, elapsed
from .target import Target, answer_timeout, connected, instance_arg, node_command, view_of

__all__ = ["LIVE", "restart", "start", "stop", "unload", "wait_running"]

LIVE = ("starting", "running", "unhealthy")
_WAIT_POLL_S = 0.25


#: The end of start's, stop's and restart's help: their arguments and exit codes.
_VERB_HELP_TAIL = """
    WHERE is the node's data directory, its config file (.toml) or its
    chain file; without it, --url (or INFERVISOR_URL) names the node.
    INSTANCE is an instance id, or a role naming one instance.
    Exit 0 printing the resulting state; 1 when the node refuses (with its
    message: an unknown INSTANCE names the placed ones); 2 when the command
    line is wrong; 3 when no node runs on WHERE (or listens at --url); 4
    (no_answer) when the node is there but does not answer within --timeout
    (a stopped process: `kill -CONT PID`), or went away after taking the
    verb, before it answered (or, with --wait, before it was running): see
    `status`.
    """


def _verb_help(f: Callable[..., None]) -> Callable[..., None]:
    """Append :data:`_VERB_HELP_TAIL` to a verb's docstring (its --help)."""
    f.__doc__ = (f.__doc__ or "").rstrip() + "\n" + _VERB_HELP_TAIL
    return f


def _wait_options(f: Callable[..., None]) -> Callable[..., None]:
    """--wait and the --timeout that bounds it (start, restart)."""
    f = click.option(
        "--timeout",
        type=SECONDS,
        default=300.0,
        show_default=True,
        metavar="SECONDS",
        help="How long --wait waits for it to run; when given, also how long the node "
        "may take to answer [default answer wait: INFERVISOR_TIMEOUT, else "
        f"{DEFAULT_TIMEOUT_S:g}].",
    )(f)
    return click.option(
        "--wait", is_flag=True, help="Answer once it runs (progress on a terminal), or its failure."
    )(f)


def _answer_timeout(target: Target, timeout: float) -> None:
    """--timeout, when given, also bounds the node's answers."""
    given = click.get_current_context().get_parameter_source("timeout")
    explicit = given is click.core.ParameterSource.COMMANDLINE
    target.timeout_s = answer_timeout(timeout if explicit and timeout > 0 else None)


@click.command(cls=Command)
@click.option("--json", "as_json", is_flag=True, help="Print the instance as JSON.")
@_wait_options
@node_command("[WHERE] INSTANCE", 1, timeout=False)
@_verb_help
def start(target: Target, as_json: bool, wait: bool, timeout: float) -> None:
    """Start INSTANCE's server on the node.

    The instance is wanted running from now on, and its restart budget is
    reset. Answers once the server is spawned (lifecycle `starting`); with
    --wait, once it is `running` (exit 1 with the reason when it fails
    instead). An instance already starting or running is left as it is (its
    budget too): exit 0, "already running". An adopted server is only
    checked to answer. --json adds the seq and hash of the instance's last
    event in the chain.

    """
    _answer_timeout(target, timeout)
    instance = instance_arg(target)
    progress = Progress()
    with connected(target) as client:
        before = view_of(client, instance)
        with elapsed(f"starting {before.instance_id}:", progress):
            answer = client.start(before.instance_id)
        view = answer.instance
        already = before.lifecycle in LIVE and view.last_seq == before.last_seq
        if wait:
            view = wait_running(client, view, timeout, progress)
    say_view(
        view, as_json, seq=answer.seq, digest=answer.hash, already=already, evicted=answer.evicted
    )


@click.command(cls=Command)
@click.option(
    "--grace",
    type=Seconds(max_s=3600.0),
    metavar="SECONDS",
    help="Seconds between SIGTERM and SIGKILL, at most 3600 [default: the node's stop_grace_s].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the instance as JSON.")
@node_command("[WHERE] INSTANCE", 1)
@_verb_help
def stop(target: Target, grace: float | None, as_json: bool) -> None:
    """Stop INSTANCE's server on the node.

    SIGTERM to its process group, SIGKILL after --grace seconds; answers
    once nothing of the group is left (on a terminal, the grace counts down
    on stderr). The instance stays placed and is wanted stopped (the node
    will not restart it, nor will the next `infervisor run`): `infervisor
    start` brings it back. A stopped instance, or one placed and never
    started, is left as it is: exit 0, "already stopped" ("already loaded"),
    nothing recorded. Adopted servers are never stopped; `infervisor
    unload` forgets them. --json adds the seq and hash of the instance's
    last event in the chain.

    """
    instance = instance_arg(target)
    with connected(target) as client:
        before = view_of(client, instance)
        with countdown(before.instance_id, grace, Progress()):
            answer = client.stop(before.instance_id, grace)
    view = answer.instance
    already = (
        before.pid is None and before.lifecycle not in LIVE and view.last_seq == before.last_seq
    )
    say_view(
        view, as_json, seq=answer.seq, digest=answer.hash, already=already, evicted=answer.evicted
    )


@click.command(cls=Command)
@click.option("--json", "as_json", is_flag=True, help="Print the instance as JSON.")
@_wait_options
@node_command("[WHERE] INSTANCE", 1, timeout=False)
@_verb_help
def restart(target: Target, as_json: bool, wait: bool, timeout: float) -> None:
    """Restart INSTANCE's server on the node.

    Stops it (when running), then starts it again: a new process. Resets its
    restart budget; the instance is wanted running afterwards. On a terminal
    stderr shows the seconds waited. With --wait, answers once it is
    `running` again (exit 1 with the reason when it fails instead), as
    start's --wait. --json adds the seq and hash of the instance's last
    event in the chain.

    """
    _answer_timeout(target, timeout)
    instance = instance_arg(target)
    progress = Progress()
    with connected(target) as client:
        iid = view_of(client, instance).instance_id
        with elapsed(f"restarting {iid}:", progress):
            answer = client.restart(iid)
        view = answer.instance
        if wait:
            view = wait_running(client, view, timeout, progress, verb="restart")
    say_view(view, as_json, seq=answer.seq, digest=answer.hash, evicted=answer.evicted)


@click.command(cls=Command)
@click.option(
    "--json", "as_json", is_flag=True, help='Print {"unloaded": ID, "seq", "hash"} as JSON.'
)
@node_command("[WHERE] INSTANCE", 1)
def unload(target: Target, as_json: bool) -> None:
    """Forget INSTANCE on the node, stopping its server.

    The server gets SIGTERM and, 5 s later, SIGKILL. The node no longer
    supervises it; its history stays in the chain (`infervisor timeline`).
    An adopted server keeps running: only its registration is forgotten.
    An instance its config lists stays unloaded at every later boot (the
    chain records the unload) until `infervisor place` places it again or
    its [[instances]] entry changes. --json prints the seq and hash of its
    instance.unloaded event.

    WHERE is the node's data directory, its config file (.toml) or its
    chain file; without it, --url (or INFERVISOR_URL) names the node.
    INSTANCE is an instance id, or a role naming one instance.
    Exit 0 once it is unloaded; 1 when the node refuses (with its message:
    an unknown INSTANCE names the placed ones); 2 when the command line is
    wrong; 3 when no node runs on WHERE (or answers at --url).
    """
    instance = instance_arg(target)
    with connected(target) as client:
        iid = view_of(client, instance).instance_id
        with elapsed(f"unloading {iid}:", Progress()):
            answer = client.unload(iid)
    if as_json:
        echo_json({"unloaded": iid, "seq": answer.seq, "hash": answer.hash})
    else:
        click.echo(f"{iid}: unloaded")


def say_view(
    view: InstanceView,
    as_json: bool,
    *,
    seq: int,
    digest: str,
    already: bool = False,
    evicted: Sequence[str] = (),
) -> None:
    """A verb's answer: the instance's line, then one line per instance evicted to
    make room for it (a start or restart; ``evicted`` in --json)."""
    if as_json:
        echo_json(verb_record(view, seq, digest, evicted))
        return
    pid = f", pid {view.pid}" if view.pid is not None else ""
    reason = f": {view.reason}" if view.reason else ""
    nothing = "; nothing recorded" if already else ""  # as a cordon sent again says
    click.echo(f"{view.instance_id}: {state_words(view, already)}{pid}{reason}{nothing}")
    for victim in evicted:
        click.echo(f"evicted {victim} to make room for it (it rests until a demand or start)")


def wait_running(
    client: ApiClient,
    answer: InstanceView,
    timeout_s: float,
    progress: Progress,
    *,
    verb: str = "start",
) -> InstanceView:
    """Poll until the instance runs; exit 1 with the reason when it fails or time
    runs out, 4 (``no_answer``) when the node goes away meanwhile: the ``verb``
    was taken (recorded), and what came of it is for the next node to say."""
    began = time.monotonic()
    view = answer
    while view.lifecycle != "running":
        recorded = view.last_seq > answer.last_seq
        halted = view.lifecycle in ("loaded", "stopped") and recorded
        if (
            view.lifecycle not in (*LIVE, "loaded", "stopped")
            or halted
            or view.desired != "running"
        ):
            progress.clear()
            why = view.reason or "no reason recorded"
            fail(f"{view.instance_id} did not start: {view.lifecycle}: {why}", "start_failed")
        waited = time.monotonic() - began
        if waited > timeout_s:
            progress.clear()
            fail(
                f"{view.instance_id} is still {view.lifecycle} after {timeout_s:g} s "
                f"(--timeout): {view.reason}",
                "timeout",
                "--timeout",
            )
        progress.show(f"{view.instance_id}: {view.lifecycle} {waited:.0f} s: {view.reason}")
        time.sleep(_WAIT_POLL_S)  # polling the node, not synchronising a test
        try:
            view = client.status(view.instance_id)
        except NodeUnavailable as e:
            progress.clear()
            fail(
                f"the node took the {verb} of {view.instance_id} (recorded at seq "
                f"{answer.last_seq}) and then went away before it was running ({e}); look "
                "with `infervisor status` once the node is back: it resumes from the chain",
                "no_answer",
            )
    progress.clear()
    return view
