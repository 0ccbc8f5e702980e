"""The command class of every ``infervisor`` command, and its parameter types.

:class:`Command` ends each ``--help`` with the exit-status table, under
``--json`` also prints a usage error as one JSON object on stdout, and
reports a :class:`~.failure.Failure` its callback raises on the one error
path (:func:`~.failure.fail`), and ends quietly with exit 141 when its standard
output is closed early (:mod:`.closed_stdout`);
:class:`Group` makes its subcommands such commands. :data:`SECONDS` and
:class:`FiniteRange` refuse NaN and infinity, which click's own number types
let through.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from typing import Any

import click

from ..api.exit_codes import EPILOG, cut
from ..api.one_line import MAX_REASON, refusal
from .closed_stdout import quiet_on_closed_stdout
from .failure import Failure, echo_json, fail
from .paths import BadKey, BadPath
from .raw_args import check_raw

__all__ = [
    "SECONDS",
    "UNVERIFIED_HELP",
    "Command",
    "FiniteRange",
    "Group",
    "LazyGroup",
    "Seconds",
]

UNVERIFIED_HELP = (
    "Read a chain that does not verify anyway, as stored; the output is marked "
    "(a first line in text; a verified/problem wrapper in --json)."
)
"""The help of every --unverified option (status, replay, timeline, events)."""


def _usage_field(e: click.UsageError) -> str | None:
    param = getattr(e, "param", None)
    if param is None:
        return None
    if isinstance(param, click.Option) and param.opts:
        return max(param.opts, key=len)
    return str(param.human_readable_name)


class Command(click.Command):
    """A command whose --help ends with the exit-status table, whose usage
    errors are also one JSON object on stdout under --json, and whose
    callback's :class:`~.failure.Failure` exits through :func:`~.failure.fail`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("epilog", EPILOG)
        super().__init__(*args, **kwargs)

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with quiet_on_closed_stdout():  # --help, or a usage error's JSON, into a closed pipe
            return self._make_context(*args, **kwargs)

    def _make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        as_json = "--json" in args
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as e:
            if as_json:
                from .schemas import ErrorBody, ErrorRecord  # noqa: PLC0415 - as failure.fail

                code = "bad_value" if isinstance(e, click.BadParameter) else "usage"
                if isinstance(e, BadPath):
                    code = "bad_path"
                elif isinstance(e, BadKey):
                    code = "bad_key"
                body = ErrorBody(code=code, message=cut(e.format_message()), field=_usage_field(e))
                echo_json(ErrorRecord(error=body))
            raise

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Refuse an empty path and a single-valued option given twice (:mod:`.raw_args`),
        then parse as click does (the raw parse is a few microseconds)."""
        if args and not ctx.resilient_parsing:
            opts, _, order = self.make_parser(ctx).parse_args(args=list(args))
            check_raw(ctx, opts, order)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        with quiet_on_closed_stdout():  # its reader went away: exit 141, quietly
            try:
                return super().invoke(ctx)
            except Failure as e:
                fail(str(e), e.code, e.field)


class Group(click.Group):
    """A group of :class:`Command` (and of groups like itself), with the exit table too;
    its own output (``--help``, ``--version``) ends quietly on a closed pipe too."""

    command_class = Command

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("epilog", EPILOG)
        super().__init__(*args, **kwargs)

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with quiet_on_closed_stdout():
            return super().make_context(*args, **kwargs)


Group.group_class = Group


class LazyGroup(Group):
    """A :class:`Group` whose commands are imported when first asked for.

    ``lazy`` maps each command's name to ``"module:attribute"`` (a module
    relative to ``package``). Only this group's own ``--help`` and the command
    that runs import them, so the root ``--help`` and the other commands do not
    pay for their libraries (click's documented pattern, "Lazily Loading
    Subcommands")."""

    def __init__(self, *args: Any, lazy: Mapping[str, str], package: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy)
        self.package = package

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            module, attribute = self.lazy.pop(cmd_name).split(":")
            command = getattr(importlib.import_module(module, self.package), attribute)
            assert isinstance(command, click.Command), f"{module}:{attribute} is no command"
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)


class Seconds(click.ParamType[float]):
    """A finite, non-negative number of seconds (NaN and infinity refused), at most ``max_s``."""

    name = "seconds"

    def __init__(self, max_s: float | None = None) -> None:
        self.max_s = max_s

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, float):
            number = value
        else:
            try:
                number = float(value)
            except (TypeError, ValueError):
                self.fail(f"{cut(repr(str(value)))} is not a number of seconds", param, ctx)
        if not math.isfinite(number) or number < 0:
            self.fail(f"{cut(repr(str(value)))} is not a finite number of seconds >= 0", param, ctx)
        if self.max_s is not None and number > self.max_s:
            self.fail(f"{number:g} s is more than the {self.max_s:g} s allowed", param, ctx)
        return number


SECONDS = Seconds()


class FiniteRange(click.FloatRange):
    """click's FloatRange, refusing NaN too (every comparison with NaN is false, so
    the range alone lets it through)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return number


class OneLine(click.ParamType[str]):
    """Free text for the chain (a cordon's --reason): one line, not blank, at most
    ``max_len`` characters, by the one rule the API's ``reason`` follows too
    (tools/api/one_line.py)."""

    name = "text"

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = str(value)
        why = refusal(text, self.max_len)
        if why == "empty or blank":
            why = "empty: give the reason, or leave the option out"
        if why is not None:
            self.fail(why, param, ctx)
        return text


REASON = OneLine(MAX_REASON)
