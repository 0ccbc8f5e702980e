"""``infervisor place``: an instance placed on the running node, from a TOML
fragment (the keys of a config's [[instances]] table) or from flags.

The fragment and flags are checked here with the config's own types
(tools/node/config.py), so a wrong key is refused naming it and the allowed
keys or values before anything is sent.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click
import msgspec

from infervisor.adapters.errors import SpecError
from infervisor.adapters.spec import MAX_IDLE_TTL_S, MAX_THREADS, MIN_IDLE_TTL_S

from ..api.errors import ApiError
from ..api.exit_codes import cut, exit_for
from ..clikit.command import Command
from ..clikit.failure import Failure, echo_json, fail
from ..clikit.schemas import place_record
from ..clikit.wanted import state_words
from .target import Target, api_failure, connected, node_command

if TYPE_CHECKING:  # only an annotation: the wire types load with the client
    from ..api.wire import ErrorBody, PlaceAnswer

__all__ = ["place"]

_PLACE_FLAGS = {
    "role": "--role",
    "flavor": "--flavor",
    "port": "--port",
    "model": "--model",
    "mode": "--mode",
    "host": "--host",
    "ctx_size": "--ctx-size",
    "kind": "--kind",
    "env": "--env",
    "draft_model": "--draft-model",
    "on_demand": "--on-demand",
    "idle_ttl_s": "--idle-ttl-s",
    "priority": "--priority",
    "pinned": "--pinned",
    "threads": "--threads",
}


@click.command(cls=Command)
@click.option(
    "--file",
    "fragment",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FRAGMENT.toml",
    help="The instance as TOML: the keys of a config's [[instances]] table, flat or "
    "in one [[instances]] table.",
)
@click.option("--role", help="The instance's job (a plain token): first part of its id.")
@click.option("--flavor", type=click.Choice(["llamacpp", "mlx-lm", "ollama"]))
@click.option("--port", type=click.IntRange(1, 65535), help="The server's TCP port.")
@click.option("--model", help="The model's registry name (managed: required).")
@click.option("--mode", type=click.Choice(["managed", "adopted"]), help="[default: managed]")
@click.option("--host", help="The address it listens on (managed: loopback only).")
@click.option("--ctx-size", type=click.IntRange(min=1), help="Context length in tokens.")
@click.option("--kind", help="Workload kind (health interval and judgement).")
@click.option("--env", "env", multiple=True, metavar="KEY=VALUE", help="Repeatable.")
@click.option("--draft-model", help="A draft model's registry name (speculative decoding).")
@click.option(
    "--on-demand", is_flag=True, default=None, help="Rest until a request or a start asks for it."
)
@click.option(
    "--idle-ttl-s",
    type=click.FloatRange(min=MIN_IDLE_TTL_S, max=MAX_IDLE_TTL_S),
    metavar="SECONDS",
    help="Released to resting after this long without a request (1 s to 7 days).",
)
@click.option(
    "--priority",
    type=int,
    metavar="N",
    help="Eviction takes lower or equal priority only (-1000 to 1000) [default: 0].",
)
@click.option("--pinned", is_flag=True, default=None, help="Never evicted.")
@click.option(
    "--threads",
    type=click.IntRange(1, MAX_THREADS),
    metavar="N",
    help="CPU threads of a managed llama.cpp server (llama-server's --threads) [default: 2].",
)
@click.option("--controller", metavar="ID", help="Place as this controller (with --generation).")
@click.option(
    "--generation",
    type=click.IntRange(min=0),
    metavar="N",
    help="The controller's placement generation: an older one is ignored.",
)
@click.option(
    "--start",
    "start_it",
    is_flag=True,
    help="Start it once placed (with --on-demand: load it now, as a request would).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@node_command("[WHERE]", 0, token_name="controller")  # noqa: S106 -- a name, not a secret
def place(  # noqa: PLR0917 - one parameter per option, as click passes them
    target: Target,
    fragment: Path | None,
    env: tuple[str, ...],
    controller: str | None,
    generation: int | None,
    start_it: bool,
    as_json: bool,
    **spec_flags: Any,
) -> None:
    """Place an instance on the node: from --file FRAGMENT.toml, or from the flags.

    The fragment holds the keys of an [[instances]] table of the node's
    config (role, flavor, port, mode, model, host, ctx_size, draft_model,
    env, kind, continuous, restart, memory_max_bytes, on_demand, idle_ttl_s,
    priority, pinned, embeddings, pooling, threads, start), flat or in one [[instances]]
    table; flags given beside it override its keys. An unknown or mistyped
    key is refused naming it and the allowed keys or values; nothing is
    sent. As the node itself by default, or as --controller ID at
    --generation N (an older generation than the last one is ignored).
    --start (or `start = true` in the fragment) starts it once placed; with
    --on-demand (which rests until asked for) it is a demand now: it loads,
    evicting as a request would, and stays on demand (released when idle).

    Prints the outcome (applied, unchanged: the same spec again, or ignored: a
    stale generation), the instance id and its last event's seq and hash, and
    each instance evicted to make room for its start (--json: all; "evicted").

    WHERE is the node's data directory, its config file (.toml) or its
    chain file; without it, --url (or INFERVISOR_URL) names the node.
    A --start the node refuses (no room: nothing can be evicted) leaves it
    placed but not started: stderr says so with the node's message, --json
    carries it as "start_error", and the exit is `infervisor start`'s for it.
    Exit 0 once placed (and started, with --start); 1 when the node refuses
    (port taken, admission or memory budget, or the start); 2 when the
    fragment, a key or a flag is wrong; 3 when no node runs on WHERE (or
    answers at --url).
    """
    # the spec's flags (_PLACE_FLAGS); an absent one leaves the fragment's key as it is
    flags = {key: value for key, value in spec_flags.items() if value is not None}
    if env:
        flags["env"] = _env_of(env)
    if generation is not None and controller is None:
        fail("--generation needs --controller ID", "usage", "--generation")
    spec, start_key = spec_of_fragment(fragment, flags)
    with connected(target) as client:
        try:
            answer = client.place(
                spec,
                controller=controller,
                generation=generation or 0,
                start=start_it or start_key,
            )
        except ApiError as e:
            field = (e.field or "").removeprefix("spec.")
            named = {e.field or "": _PLACE_FLAGS[field]} if field in _PLACE_FLAGS else {}
            api_failure(e, named if fragment is None else {})
    _say_placed(answer, as_json)


def _start_refused(error: ErrorBody) -> NoReturn:
    """Say on stderr that the start asked with the placement was refused (the node's
    message; the placement stands), and exit as `infervisor start` does for its code
    (no_room: 1). A newcomer's trial (stop 33): the refusal was only in the
    instance's reason, and the exit 0."""
    click.echo(f"error: placed, not started: {cut(error.message)}", err=True)
    sys.exit(exit_for(error.code))


def _say_placed(answer: PlaceAnswer, as_json: bool) -> None:
    """The outcome's line, then one line per instance its start evicted (as `start`'s);
    or the record (--json). A refused start then exits (:func:`_start_refused`)."""
    if as_json:
        echo_json(place_record(answer))
    else:
        _say_outcome(answer)
    if answer.start_error is not None:
        _start_refused(answer.start_error)


def _say_outcome(answer: PlaceAnswer) -> None:
    v = answer.instance
    click.echo(
        f"{answer.instance_id}: {answer.outcome} (generation {answer.generation}); "
        f"{state_words(v)}; seq {answer.seq} hash {answer.hash}"
    )
    for victim in answer.evicted:
        click.echo(f"evicted {victim} to make room for it (it rests until a demand or start)")


def _env_of(items: tuple[str, ...]) -> dict[str, str]:
    """The --env pairs as a mapping; a key given twice is refused (``bad_value``), as
    the API refuses ``spec.env`` with a key twice, rather than the last one kept."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--env {item!r}: expected KEY=VALUE", "bad_value", "--env")
        if key in env:
            fail(
                f"--env {key!r} given twice: give each key once (its values are not shown)",
                "bad_value",
                "--env",
            )
        env[key] = value
    return env


def spec_of_fragment(
    fragment: Path | None, flags: dict[str, Any], *, name: str = "--file"
) -> tuple[Any, bool]:
    """The InstanceSpec of the fragment's keys with ``flags`` over them, and its ``start``.

    ``name`` is the option or argument the fragment was given as, named in the
    messages (``infervisor place --file``; ``fleet place`` passes ``SPEC``).

    Raises:
        Failure: the fragment cannot be read, or a key is unknown or mistyped
            (named, with the allowed keys or values: tools/node/config_messages.py's hints).
    """
    from ..node import fragment as config_module  # noqa: PLC0415 - keeps --help fast

    raw: dict[str, Any] = {}
    where = "the flags"
    if fragment is not None:
        where = str(fragment)
        try:
            raw = config_module.parse_toml(
                fragment.read_text(encoding="utf-8"), f"{name} {fragment}"
            )
        except OSError as e:
            message = f"{name} {fragment}: cannot read: {e.strerror or e}"
            raise Failure(message, "bad_path", name) from e
        except UnicodeDecodeError as e:
            raise Failure(f"{name} {fragment}: not valid TOML: {e}", "bad_spec", name) from e
        except config_module.ConfigError as e:
            raise Failure(str(e), "bad_spec", name) from e
        if "instances" in raw:
            tables = raw.pop("instances")
            if raw or not isinstance(tables, list) or len(tables) != 1:
                raise Failure(
                    f"{fragment}: give the instance's keys flat, or in exactly one "
                    "[[instances]] table (and nothing beside it)",
                    "bad_spec",
                    name,
                )
            raw = dict(tables[0])
    raw.update(flags)
    entry_type = config_module.InstanceEntry
    try:
        entry = msgspec.convert(raw, entry_type)
    except msgspec.ValidationError as e:
        message, key = _explain_spec(str(e), entry_type)
        flag = _PLACE_FLAGS.get(key or "") if key in flags or fragment is None else None
        # A whole-document error names the fragment: a bad_spec always names a field.
        raise Failure(f"{where}: {message}", "bad_spec", flag or key or name) from e
    spec = entry.spec()
    try:  # here too: a value JSON cannot carry (inf, nan) never reaches the wire
        spec.validate()
    except SpecError as e:
        key = (e.field or "").split(".")[0]
        flag = _PLACE_FLAGS.get(key) if key in flags or fragment is None else None
        raise Failure(f"{where}: {e}", "bad_spec", flag or e.field or name) from e
    return spec, raw.get("start") is True  # the config's default is True


_SPEC_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$\.?(?P<path>[^`]*)`)?$", re.DOTALL)


def _explain_spec(message: str, cls: Any) -> tuple[str, str | None]:
    """A msgspec message about an instance's keys in TOML terms, and the key at fault."""
    from ..node.config_messages import (  # noqa: PLC0415 - keeps --help fast
        MISSING_KEY,
        UNKNOWN_KEY,
        allowed_keys,
        enum_hint,
    )

    match = _SPEC_AT.match(message)
    what, path = (match["what"], match["path"] or "") if match else (message, "")
    if unknown := UNKNOWN_KEY.match(what):
        key = unknown["key"]
        return f"unknown key `{key}`; {allowed_keys(cls, key)}", key
    if missing := MISSING_KEY.match(what):
        key = missing["key"]
        flag = _PLACE_FLAGS.get(key)
        return f"missing key `{key}`" + (f" (or {flag})" if flag else ""), key
    key = path.split(".")[0].split("[")[0] or None
    hint = enum_hint(cls, key) if what.startswith("Invalid enum value") else ""
    return f"key `{key}`: {what[:1].lower()}{what[1:]}{hint}", key
