"""The trust policy's options on every reader (``--witness VKEY``, ``--quorum K``,
``--checkpoint FILE --key PUBKEY``) and its verdict as the commands print it
(chain/trust.py; docs/chain-format.md, "Cosignatures and the trust policy").

``chain verify``, ``audit``, ``replay``, ``timeline`` and ``events`` declare them
through :func:`trust_options` alone, so the README's "the same checks and the
same options" holds by construction (a newcomer's trial, stop 32: ``audit``
and ``events`` refused ``--checkpoint`` while ``audit``'s own warning asked
for it, so a chain truncated after an auditor-held checkpoint audited clean).

When WHERE is a config (.toml) and no ``--witness`` is given, its
``[[witnesses]]`` tables (``vkey``) and ``[node] witness_quorum`` are the
policy. They are read raw from the TOML here (:func:`config_witnesses`), so
this module does not depend on the node config's dataclasses.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar, cast

import click

from infervisor.chain import ChainError
from infervisor.chain.anchor import QUORUM_UNMET
from infervisor.chain.checkpoint import Checkpoint
from infervisor.chain.cosignature import WitnessKey, WitnessPolicy, parse_witness_key
from infervisor.chain.errors import CheckpointError, NoteError
from infervisor.chain.note import key_text
from infervisor.chain.trust import Problem, Verdict, assess, node_key

from ..clikit.command import UNVERIFIED_HELP
from ..clikit.failure import Failure
from ..clikit.paths import KEY, WITNESS_KEY
from .chain_inputs import KEY_HELP, foreign_origin, read_checkpoint, stored_extent

__all__ = [
    "NOT_VOUCHED",
    "Reading",
    "TrustArgs",
    "anchor_line",
    "config_witnesses",
    "external_checkpoint",
    "judge_chain",
    "located",
    "reading_options",
    "say_anchor",
    "trust_options",
]

F = TypeVar("F", bound=Callable[..., Any])


class TrustArgs(NamedTuple):
    """What a reader was told to trust: WHERE as given, ``--witness``, ``--quorum``,
    ``--key`` and ``--checkpoint`` (a file saved outside the node)."""

    where: Path
    witnesses: tuple[str, ...] = ()
    quorum: int | None = None
    key: str | None = None
    checkpoint: Path | None = None


def trust_options(f: F) -> F:
    """Add ``--checkpoint FILE``, ``--key PUBKEY``, ``--witness VKEY`` (repeatable)
    and ``--quorum K`` to a command (passed as ``checkpoint_file``, ``key``,
    ``witnesses``, ``quorum``)."""
    f = click.option(
        "--quorum",
        type=click.IntRange(min=1),
        help="How many of the --witness keys must have cosigned (default: all).",
    )(f)
    f = click.option(
        "--witness",
        "witnesses",
        multiple=True,
        metavar="VKEY",
        type=WITNESS_KEY,
        help="A witness's verifier key (name+hexid+base64, c2sp.org/tlog-cosignature), "
        "or a file holding one (as --key); repeat for each. Its cosignatures stored in "
        "the chain anchor the verdict. "
        "Default: the [[witnesses]] of WHERE when it is a config.",
    )(f)
    f = click.option("--key", type=KEY, help=KEY_HELP + " Needed with --checkpoint.")(f)
    return click.option(
        "--checkpoint",
        "checkpoint_file",
        type=click.Path(path_type=Path),
        metavar="FILE",
        help="A checkpoint saved earlier (infervisor chain checkpoint --out): rules out "
        "truncation and rewriting up to its tree size.",
    )(f)


class Reading(NamedTuple):
    """How an offline reader was told to read WHERE: ``--unverified``, and what to trust."""

    unverified: bool
    trust: TrustArgs


def reading_options(f: F) -> F:
    """Add ``--unverified`` and :func:`trust_options` to a command of WHERE
    (replay, timeline, events); it gets them as one ``reading`` (a :class:`Reading`)."""

    @functools.wraps(f)
    def command(
        *,
        where: Path,
        unverified: bool,
        witnesses: tuple[str, ...],
        quorum: int | None,
        key: str | None,
        checkpoint_file: Path | None,
        **options: Any,
    ) -> Any:
        reading = Reading(unverified, TrustArgs(where, witnesses, quorum, key, checkpoint_file))
        return f(where=where, reading=reading, **options)

    unverified = click.option("--unverified", is_flag=True, help=UNVERIFIED_HELP)
    return cast(F, unverified(trust_options(command)))


def config_witnesses(config: Path) -> tuple[tuple[str, ...], int | None]:
    """The ``vkey`` of each ``[[witnesses]]`` table and ``[node] witness_quorum`` of a
    config file, read raw from its TOML.

    Raises:
        Failure: the file is not TOML, or a value is of the wrong type.
    """
    import tomllib  # noqa: PLC0415 - only a config's WHERE pays for it (start-up)

    try:
        doc = tomllib.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise Failure(f"{config}: cannot read its [[witnesses]]: {e}", "bad_config") from e
    tables = doc.get("witnesses", [])
    node = doc.get("node", {})
    quorum = node.get("witness_quorum") if isinstance(node, dict) else None
    if not isinstance(tables, list) or not all(
        isinstance(t, dict) and isinstance(t.get("vkey"), str) for t in tables
    ):
        raise Failure(
            f"{config}: [[witnesses]] must be tables with a vkey string", "bad_config", "witnesses"
        )
    if quorum is not None and (type(quorum) is not int or quorum < 1):
        raise Failure(
            f"{config}: [node] witness_quorum must be an integer >= 1, found {quorum!r}",
            "bad_config",
            "witness_quorum",
        )
    return tuple(t["vkey"] for t in tables), quorum


def policy_of(args: TrustArgs) -> WitnessPolicy | None:
    """The witness policy of the options, else of WHERE's config; None without witnesses.

    Raises:
        Failure: a key that does not parse, or a quorum out of range (usage, exit 2).
    """
    vkeys, quorum, field = args.witnesses, args.quorum, "--witness"
    if not vkeys and args.where.suffix == ".toml":
        vkeys, quorum = config_witnesses(args.where)
        quorum, field = args.quorum or quorum, "[[witnesses]] vkey"
    if not vkeys:
        if args.quorum is not None:
            raise Failure("--quorum needs --witness VKEY", "usage", "--quorum")
        return None
    keys = [_witness_key(v, field) for v in vkeys]
    try:
        return WitnessPolicy.of(keys, quorum)
    except (ValueError, NoteError) as e:  # a key named twice, a quorum out of range
        named = "--quorum" if "quorum" in str(e) and args.quorum is not None else field
        raise Failure(f"{named}: {e}", "usage", named) from e


def _witness_key(value: str, field: str) -> WitnessKey:
    """A witness key from ``value``: a key string, or (``--witness``) a file holding
    one, read as ``--key`` reads one (chain/note.py ``key_text``).

    Raises:
        Failure: ``usage`` (exit 2) naming ``field`` and the file, when it does not parse.
    """
    from_file = field == "--witness" and Path(value).is_file()
    try:
        return parse_witness_key(key_text(value) if from_file else value)
    except NoteError as e:
        shown = f" {value}" if from_file else ""
        raise Failure(f"{field}{shown}: {e}", "usage", field) from e


def external_checkpoint(db: Path, args: TrustArgs) -> tuple[Checkpoint, str] | None:
    """``--checkpoint FILE`` read and its signature checked with ``--key`` (or a key
    the chain's rotations link to it), with the file's name; None without one.

    Raises:
        Failure: ``usage`` (exit 2) when ``--key`` is missing; the file unreadable
            (``bad_path``) or not a checkpoint signed by the key (``checkpoint_invalid``),
            or a checkpoint of another log (``checkpoint_invalid``, exit 1: the chain
            is not vouched for, and a chain made again under a new key looks the same).
    """
    if args.checkpoint is None:
        return None
    if args.key is None:
        raise Failure(
            "--checkpoint needs --key PUBKEY (the node's public key: DATA_DIR/node.pub, "
            "or its key string) to check the signature",
            "usage",
            "--key",
        )
    cp = read_checkpoint(args.checkpoint, args.key, db)
    foreign = foreign_origin(db, cp)
    if foreign is not None:
        raise Failure(f"--checkpoint {args.checkpoint}: {foreign}", "checkpoint_invalid")
    return cp, args.checkpoint.name


def judge_chain(
    db: Path, args: TrustArgs, external: tuple[Checkpoint, str] | None = None
) -> Verdict:
    """The trust policy's verdict on the chain file `db` (its rows verified by the
    caller), against `external`, else against ``args.checkpoint`` when given
    (:func:`external_checkpoint`).

    Raises:
        Failure: a bad key, checkpoint or policy, or the chain cannot be read.
    """
    if external is None:
        external = external_checkpoint(db, args)
    policy = policy_of(args)
    try:
        key = node_key(db, args.key)
    except CheckpointError as e:
        raise Failure(str(e), "bad_key", "--key") from e
    try:
        verdict = assess(db, key, policy, external)
    except ChainError as e:
        raise Failure(str(e), "chain_unreadable") from e
    return required_quorum(db, args, verdict)


def required_quorum(db: Path, args: TrustArgs, verdict: Verdict) -> Verdict:
    """`verdict`, failed (``witness quorum not met``) when ``--witness`` keys were
    given and no stored checkpoint was cosigned by their quorum: the caller asked
    for that anchor, so its absence is a finding (exit 1), not a warning to pass
    ``--witness`` (the newcomer's trial, stop 34, read exit 0). A config's
    ``[[witnesses]]``, used when no ``--witness`` is given, stay a warning: a node
    whose witness has not yet cosigned is not a failed chain.

    The problem covers the whole chain (``in seq 0..HEAD``): the witnesses vouch
    for none of it.
    """
    if not args.witnesses or verdict.problem is not None or verdict.shortfall is None:
        return verdict
    _, head = stored_extent(db)
    last = None if head is None or head <= 0 else head
    problem = Problem(0, QUORUM_UNMET, f"--witness: {verdict.shortfall}", last)
    return verdict._replace(problem=problem)


#: What a reader with ``--unverified`` says it did not do when it refuses.
NOTHING_SHOWN = "nothing shown (--unverified reads it anyway, marked)"


def refuse(db: Path, verdict: Verdict, *, shown: str = NOTHING_SHOWN) -> None:
    """Refuse (exit 1, ``chain_invalid``) a chain that fails the trust policy; the
    message ends with ``shown``, what the reader did not do.

    Raises:
        Failure: when it fails.
    """
    p = verdict.problem
    if p is not None:
        raise Failure(
            f"{db} does not verify against its checkpoints {located(p)}: {p.reason}: "
            f"{p.detail}; {shown}",
            "chain_invalid",
        )


def located(problem: Problem) -> str:
    """Where a trust problem is, for a headline: ``at seq N``, or ``in seq N..M``
    when the checkpoints bound the first event that differs only to a range
    (chain/locate.py; stop 32's trial read "at seq 0" of a fork in seq 0..57)."""
    if problem.last_seq is None:
        return f"at seq {problem.seq}"
    return f"in seq {problem.seq}..{problem.last_seq}"


NOT_VOUCHED = "unanchored: the chain does not verify; nothing vouches for it"
"""The anchor line under a verdict that is not ok (docs/chain-format.md, "Cosignatures
and the trust policy")."""


def anchor_line(verdict: Verdict, ok: bool) -> str:
    """The anchor line under the whole verdict ``ok``: the trust policy's own
    (``anchored: ...``, ``unanchored: ...``) when the chain verifies, else
    :data:`NOT_VOUCHED`: a checkpoint or a witness quorum that a chain fails
    against vouches for nothing, and ``anchored:`` under INVALID reads as
    assurance (the newcomer's trial, stop 31)."""
    return verdict.anchor if ok else NOT_VOUCHED


def say_anchor(verdict: Verdict, ok: bool = True) -> None:
    """The anchor line (:func:`anchor_line`), on stderr (stdout stays the command's output)."""
    click.echo(anchor_line(verdict, ok), err=True)
