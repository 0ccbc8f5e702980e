"""Where an operator command finds the node, and how it talks to it.

Against the running node, through its control API (tools/api): the socket
DATA_DIR/api.sock of the node WHERE names, or a URL with a bearer token.
:func:`node_command` gives a command its ``[WHERE] ...`` arguments and the
options naming the node (--url, --token, --token-file, --token-name,
--timeout) and hands it a :class:`Target`; :func:`connected` opens a client
that exits by the error table on any error of the API (:func:`api_failure`).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click

from infervisor.replay.views import InstanceView

from ..api.client import DEFAULT_TIMEOUT_S, ApiClient
from ..api.errors import ApiError, NoAnswer, NodeStarting, NodeStopping, NodeUnavailable, NotRunning
from ..clikit.command import SECONDS
from ..clikit.failure import Failure, fail
from ..clikit.names import resolve
from ..clikit.tokens import token_of
from ..clikit.urls import checked_url
from ..node.where import where

__all__ = [
    "UNAVAILABLE_CODE",
    "Target",
    "answer_timeout",
    "api_failure",
    "connected",
    "instance_arg",
    "node_command",
    "running_healthy",
    "token_of",
    "view_of",
]

UNAVAILABLE_CODE: dict[type[NodeUnavailable], str] = {
    NotRunning: "no_node",
    NodeStarting: "node_starting",
    NodeStopping: "node_stopping",
}
#: The API's field names, as the operator typed them.
_FIELDS = {"grace_s": "--grace", "stream": "--stream", "tail_bytes": "--tail"}
#: The command that does what a refusal's route does: an operator at a terminal is
#: told the command (stop 32's trial: a placement on a cordoned node pointed to
#: POST /v1/node/uncordon); the API's own answer keeps naming the route.
_COMMAND_OF_ROUTE = {"POST /v1/node/uncordon": "`infervisor uncordon`"}
#: What an unknown or missing token is told (exit 2, usage, as every --url command
#: and docs/cli.md's exit table say; a token the node knows whose scope does not
#: cover the verb is ``forbidden``, a refusal, 1).
_FIX_UNKNOWN_KEY = (
    "fix --token (or --token-file, INFERVISOR_TOKEN): one of the node's tokens, as in "
    "its DATA_DIR/api-tokens.json"
)


def api_failure(e: ApiError, fields: Mapping[str, str] | None = None) -> NoReturn:
    """Exit for an error of the control API: its code goes straight to the exit table."""
    if isinstance(e, NoAnswer):
        fail(f"{e} (--timeout SECONDS or INFERVISOR_TIMEOUT waits longer)", e.code, "--timeout")
    if isinstance(e, NodeUnavailable):
        fail(str(e), e.code if e.code == "no_answer" else UNAVAILABLE_CODE.get(type(e), e.code))
    names = {**_FIELDS, **(fields or {})}
    field = names.get(e.field or "", e.field)
    message = str(e)
    for name, flag in names.items():
        message = message.replace(name, flag) if e.field == name else message
    for route, command in _COMMAND_OF_ROUTE.items():
        message = message.replace(route, command)
    if e.code == "unauthorized" and field is None:  # the token the command sent
        field, message = "--token", f"{message}: {_FIX_UNKNOWN_KEY}"
    fail(message, e.code, field)


class Target:
    """Where the node is (a data directory, or a URL and its token) and the
    command's other positional arguments."""

    def __init__(self, where: Path | None, url: str | None, token: str | None) -> None:
        self.where, self.url, self.token = where, url, token
        self.rest: tuple[str, ...] = ()
        #: Seconds to connect and for each answer (--timeout, INFERVISOR_TIMEOUT).
        self.timeout_s = DEFAULT_TIMEOUT_S

    @property
    def data_dir(self) -> Path | None:
        return None if self.where is None else where(self.where)[0]

    def client(self) -> ApiClient:
        if self.url is not None:
            return ApiClient(url=self.url, token=self.token, timeout_s=self.timeout_s)
        assert self.data_dir is not None
        return ApiClient(self.data_dir, timeout_s=self.timeout_s)


def _target(args: tuple[str, ...], url: str | None, token: str | None, most: int) -> Target:
    """WHERE and the rest of ARGS. With --url there is no WHERE; INFERVISOR_URL is
    used when no WHERE is given (a first argument naming a path, or one argument
    more than the command takes, is WHERE)."""
    name = "--url"
    if url is None and (env := os.environ.get("INFERVISOR_URL", "").strip()):
        names_a_path = bool(args) and Path(args[0]).exists()
        if len(args) <= most and not names_a_path:
            url, name = env, "INFERVISOR_URL"
    if url is not None:
        try:
            url = checked_url(url, name)
        except Failure as e:
            fail(str(e), e.code, e.field)
        target = Target(None, url, token)
        target.rest = args
    else:
        if not args:
            fail(
                "give WHERE (the node's data directory, its config file (.toml) or its "
                "chain file), or --url URL",
                "usage",
                "WHERE",
            )
        if not args[0].strip():  # Path("") is "." (stop 34's trial: --witness "")
            fail(
                "an empty WHERE: give the node's data directory, its config file (.toml) "
                "or its chain file",
                "bad_path",
                "WHERE",
            )
        target = Target(Path(args[0]), None, token)
        target.rest = args[1:]
    if len(target.rest) > most:
        fail(
            f"unexpected argument {target.rest[most]!r}"
            + (" (with --url there is no WHERE)" if url is not None else ""),
            "usage",
        )
    return target


_TIMEOUT_ENV = "INFERVISOR_TIMEOUT"
_TIMEOUT_HELP = (
    "Seconds to wait for the node to answer (a verb that waits on the node, "
    "such as a stop's grace, gets its own wait on top) "
    f"[env: INFERVISOR_TIMEOUT; default: {DEFAULT_TIMEOUT_S:g}]."
)


def answer_timeout(given: float | None) -> float:
    """--timeout, else INFERVISOR_TIMEOUT, else DEFAULT_TIMEOUT_S; 0 is refused, and
    so is a variable that is no number (named with its value as set, not as "nan")."""
    where, shown = "--timeout", "" if given is None else f"--timeout {given:g}"
    if given is None and (env := os.environ.get(_TIMEOUT_ENV, "").strip()):
        where, shown = _TIMEOUT_ENV, f"{_TIMEOUT_ENV}={env!a}"
        try:
            given = float(env) if env.isascii() else math.nan
        except ValueError:
            given = math.nan
    if given is None:
        return DEFAULT_TIMEOUT_S
    if not math.isfinite(given) or given <= 0:
        fail(
            f"{shown}: allowed a number of seconds more than 0 (ASCII, such as 30 or 2.5)",
            "bad_value",
            where,
        )
    return given


def node_command(
    metavar: str,
    most: int,
    *,
    timeout: bool = True,
    token_name: str = "operator",  # noqa: S107 -- a token's name, not its secret
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The positional ``[WHERE] ...`` arguments and the options naming the node
    (--url, --token, --token-file, --token-name) and bounding its answers
    (--timeout; ``timeout`` False: the command has a --timeout of its own and
    sets ``target.timeout_s`` itself) of an operator command; ``token_name`` is
    the token of an api-tokens.json used by default (a placement needs the
    control scope: ``controller``); the callback gets a :class:`Target` as
    ``target``."""

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def wrapper(
            args: tuple[str, ...],
            url: str | None,
            token: str | None,
            token_file: Path | None,
            token_name: str,
            **kwargs: Any,
        ) -> Any:
            secret = token_of(token, token_file, token_name)
            target = _target(args, url, secret, most)
            if timeout:
                target.timeout_s = answer_timeout(kwargs.pop("answer_timeout"))
            return f(target=target, **kwargs)

        for option in reversed(_node_options(metavar, timeout, token_name)):
            wrapper = option(wrapper)
        return wrapper

    return decorate


def _node_options(
    metavar: str, timeout: bool, token_name: str
) -> list[Callable[[Callable[..., Any]], Callable[..., Any]]]:
    """The arguments and options of :func:`node_command`, in their order."""
    options: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
        click.argument("args", nargs=-1, metavar=metavar),
        click.option(
            "--url",
            metavar="URL",
            help="The node's API over TCP (its [api] tcp, http://HOST:PORT) instead of "
            "WHERE's socket [env: INFERVISOR_URL].",
        ),
        click.option(
            "--token", metavar="SECRET", help="Bearer token for --url [env: INFERVISOR_TOKEN]."
        ),
        click.option(
            "--token-file",
            type=click.Path(dir_okay=False, path_type=Path),
            metavar="FILE",
            help="A file holding the token: the bare secret, or the node's "
            "DATA_DIR/api-tokens.json (--token-name picks one).",
        ),
        click.option(
            "--token-name",
            default=token_name,
            show_default=True,
            metavar="NAME",
            help="The token of --token-file's api-tokens.json to use.",
        ),
    ]
    if timeout:
        options.append(
            click.option(
                "--timeout", "answer_timeout", type=SECONDS, metavar="SECONDS", help=_TIMEOUT_HELP
            )
        )
    return options


@contextmanager
def connected(target: Target, fields: Mapping[str, str] | None = None) -> Iterator[ApiClient]:
    """A client of the node; exits by the table on any error of the API (``fields``:
    the command's option for each body field an error may name, as
    :func:`api_failure` takes them)."""
    try:
        with target.client() as client:
            yield client
    except ApiError as e:
        api_failure(e, fields)


def view_of(client: ApiClient, instance: str) -> InstanceView:
    """INSTANCE's view (by id or role); refused naming the placed ones when unknown."""
    views = client.list()
    roles: dict[str, str | None] = {v.instance_id: v.role for v in views}
    iid = resolve(instance, roles, "on this node")
    return next(v for v in views if v.instance_id == iid)


#: A last probe verdict that is a failure: not healthy, whatever the lifecycle says.
_PROBE_FAILED = ("unhealthy", "unreachable")


def running_healthy(view: InstanceView) -> bool:
    """What ``--check`` asks (``status``, ``health``): the node has it ``running``
    (its own verdict from its probes) and its last probe did not fail."""
    return view.lifecycle == "running" and view.health not in _PROBE_FAILED


def instance_arg(target: Target) -> str:
    if not target.rest:
        fail("missing argument INSTANCE (an instance id, or a role)", "usage", "INSTANCE")
    return target.rest[0]
