"""Event records: the draft a caller builds and the event the chain stores.

Timestamps (`ts_ns`) are integer nanoseconds since the Unix epoch, UTC.
Payloads are opaque bytes to the chain; `encode_payload` produces the
canonical form (RFC 8785 JCS with exact integers, docs/chain-format.md)
callers should use. The bytes are stored exactly as they were
hashed and are never re-encoded to verify.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from infervisor.chain.errors import InvalidEventError

GENESIS_KIND = "chain.genesis"
"""Kind of the event at seq 0; no other event may have it."""

GENESIS_SOURCE = "node"
"""Source of the genesis event."""

FORMAT_VERSION = 1
"""Version of the chain format (docs/chain-format.md) this code writes and reads."""

HASH_NAME = "blake3"
"""Hash function named in the genesis payload."""

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT32_MAX = 2**32 - 1


class EventDraft(msgspec.Struct, frozen=True, kw_only=True):
    """An event before it is appended: everything but its place in the chain.

    Attributes:
        ts_ns: wall-clock time of the decision, integer ns since the Unix epoch, UTC.
        source: who decided: "operator", "supervisor", "controller", "node", ...
        kind: what happened, e.g. "instance.placed"; never `GENESIS_KIND`.
        subject: the instance id, or "" for node-level events.
        payload: canonical payload bytes, normally from `encode_payload`.
    """

    ts_ns: int
    source: str
    kind: str
    subject: str
    payload: bytes


class EventHeader(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Where a stored event stands and what it says happened: the fields that lead
    every form of it (`StoredEvent`; the API's watch stream, tools/api/wire.py).

    Attributes:
        seq: position in the chain; genesis is 0, then 1, 2, ... with no gaps.
        ts_ns: integer ns since the Unix epoch, UTC.
        node: id of the node whose chain this is.
        source, kind, subject: as in `EventDraft`.
    """

    seq: int
    ts_ns: int
    node: str
    source: str
    kind: str
    subject: str


class StoredEvent(EventHeader, frozen=True, kw_only=True, gc=False):
    """An event as stored in the chain (``gc=False``: it holds no reference cycles,
    and one is built per row read).

    Attributes:
        seq, ts_ns, node, source, kind, subject: as in `EventHeader`.
        payload: as in `EventDraft`.
        payload_hash: 32-byte BLAKE3 (derive_key mode) of `payload`.
        prev_hash: `hash` of the event at `seq - 1`; 32 zero bytes for genesis.
        hash: 32-byte BLAKE3 (derive_key mode) of this event's header.
    """

    payload: bytes
    payload_hash: bytes
    prev_hash: bytes
    hash: bytes

    def hash_hex(self) -> str:
        """Return `hash` as 64 lowercase hex digits."""
        return self.hash.hex()


def encode_payload(obj: object) -> bytes:
    """Encode a payload in the chain's canonical JSON (docs/chain-format.md, "Canonical payloads").

    RFC 8785 (JCS) with one documented departure: integers are written as
    exact decimal integers (JCS would round those beyond 2**53 to a double),
    and must fit in signed 64 bits. So: UTF-8, no insignificant whitespace,
    object members sorted by their keys' UTF-16 code units, strings escaped as
    JCS says, floats written as ECMAScript's Number.prototype.toString writes
    them (``10.0`` -> ``10``, ``-0.0`` -> ``0``, ``1e21`` -> ``1e+21``), so
    equal numbers give equal bytes.

    Args:
        obj: anything msgspec can turn into builtins (Structs, dicts with str
            or int keys, lists, tuples, str, int, float, bool, None).

    Returns:
        The canonical UTF-8 JSON bytes; equal values give equal bytes.

    Raises:
        InvalidEventError: `obj` cannot be encoded, or holds NaN, an infinity,
            an integer outside signed 64 bits or a str that is not valid
            Unicode; the message names the field path (``$.a.b[2]``).
    """
    try:
        tree = msgspec.to_builtins(obj, str_keys=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidEventError(f"payload cannot be encoded as canonical JSON: {exc}") from exc
    box = [tree]
    try:
        wide = _canonical(box)
    except _BadValue as bad:
        where = _where_bad(msgspec.to_builtins(obj, str_keys=True))
        raise InvalidEventError(f"payload field {where} {bad}") from None
    try:
        if wide:
            return msgspec.json.encode(_utf16_sorted(box[0]))
        return msgspec.json.encode(box[0], order="sorted")
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidEventError(f"payload cannot be encoded as canonical JSON: {exc}") from exc


class _BadValue(Exception):
    """A value with no canonical form (NaN, an infinity, a huge int, a lone surrogate)."""


def _canonical(node: list[Any]) -> bool:
    """Check the tree under `node` in place, floats replaced by their JCS text.

    Returns True if some key has a character beyond the BMP (code-point order
    then differs from UTF-16 order). The hot path of every append: no paths
    are built here; `_where_bad` finds the path once something is wrong.

    Raises:
        _BadValue: NaN, an infinity, an int beyond signed 64 bits, a lone surrogate.
    """
    wide = False
    todo: list[dict[str, Any] | list[Any]] = [node]
    pop, push = todo.pop, todo.append
    while todo:
        here = pop()
        if type(here) is dict:
            pairs: Any = here.items()
        else:
            pairs = enumerate(here)
        for key, value in pairs:
            if type(key) is str and not key.isascii() and _check_str(key):
                wide = True
            vt = type(value)
            if vt is float:
                if value.is_integer() and -_INT_FLOAT < value < _INT_FLOAT:
                    here[key] = int(value)  # 10.0 -> 10, -0.0 -> 0: as ECMAScript writes them
                else:
                    here[key] = msgspec.Raw(_number(value))
            elif vt is dict or vt is list:
                push(value)
            elif vt is int:
                if not INT64_MIN <= value <= INT64_MAX:
                    raise _BadValue(f"is {value}: integers must fit in signed 64 bits")
            elif vt is str and not value.isascii():
                _check_str(value)
    return wide


def _where_bad(node: Any, path: str = "$") -> str:
    """The path of the first value `_canonical` refuses under `node` ("$" if none)."""
    if type(node) in (dict, list):
        pairs = node.items() if type(node) is dict else enumerate(node)
        for key, value in pairs:
            step = f"{path}.{key}" if type(key) is str else f"{path}[{key}]"
            if type(key) is str:
                try:
                    _check_str(key)
                except _BadValue:
                    return f"{step} (its key)"
            found = _where_bad(value, step)
            if found != step or _refused(value):
                return found
        return path
    return path


def _refused(value: Any) -> bool:
    try:
        _canonical([value])
    except _BadValue:
        return True
    return False


def _check_str(value: str) -> bool:
    """Refuse lone surrogates; True if `value` has a character beyond the BMP."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _BadValue(f"is not valid Unicode (a lone surrogate): {value!r}") from None
    return any(ord(c) > 0xFFFF for c in value)


_INT_FLOAT = 2.0**63
"""Integral floats below this in magnitude are written through int (the same digits)."""


def _number(value: float) -> bytes:
    """The ECMAScript Number.prototype.toString form of a finite float (RFC 8785 3.2.2.3)."""
    if value - value != 0.0:  # NaN or an infinity
        raise _BadValue(f"is {value}: NaN and infinities have no JSON form")
    if value == 0:
        return b"0"  # -0.0 too
    text = repr(value)  # the shortest digits that read back as the same double
    if "e" not in text:  # Python's fixed range (1e-4 .. 1e16) is inside ECMAScript's
        return (text[:-2] if text.endswith(".0") else text).encode("ascii")
    sign = "-" if value < 0 else ""
    mantissa, _, exponent = text.lstrip("-").partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    point = len(whole) + int(exponent)
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    k, n = len(digits), point
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = f"{digits[:n]}.{digits[n:]}"
    elif -6 < n <= 0:
        out = "0." + "0" * -n + digits
    else:
        e = n - 1
        mant = digits if k == 1 else f"{digits[0]}.{digits[1:]}"
        out = f"{mant}e{'+' if e >= 0 else '-'}{abs(e)}"
    return (sign + out).encode("ascii")


def _utf16_sorted(node: Any) -> Any:
    """`node` with every object's members in UTF-16 code-unit order of their keys."""
    if type(node) is dict:
        keys = sorted(node, key=lambda k: k.encode("utf-16-be"))
        return {k: _utf16_sorted(node[k]) for k in keys}
    if type(node) is list:
        return [_utf16_sorted(v) for v in node]
    return node


def genesis_payload(node_id: str) -> bytes:
    """Return the canonical genesis payload for `node_id`."""
    return encode_payload({"format": FORMAT_VERSION, "node": node_id, "hash": HASH_NAME})


def genesis_draft(node_id: str, ts_ns: int) -> EventDraft:
    """Return the draft of the genesis event of `node_id`'s chain.

    Raises:
        InvalidEventError: `ts_ns` is not an int within signed 64 bits.
    """
    _check_ts(ts_ns)
    return EventDraft(
        ts_ns=ts_ns,
        source=GENESIS_SOURCE,
        kind=GENESIS_KIND,
        subject="",
        payload=genesis_payload(node_id),
    )


def check_node_id(node_id: object) -> str:
    """Return `node_id` if it can name a chain's node.

    Raises:
        InvalidEventError: not a non-empty str of valid UTF-8.
    """
    return _check_text("node_id", node_id, allow_empty=False)


def check_draft(draft: EventDraft) -> None:
    """Refuse a draft the chain format cannot represent or that is not appendable.

    Raises:
        InvalidEventError: naming the field, its value and what is allowed.
    """
    if not isinstance(draft, EventDraft):
        raise InvalidEventError(f"expected an EventDraft, got {type(draft).__name__}")
    _check_ts(draft.ts_ns)
    _check_text("source", draft.source, allow_empty=False)
    _check_text("kind", draft.kind, allow_empty=False)
    _check_text("subject", draft.subject, allow_empty=True)
    if draft.kind == GENESIS_KIND:
        raise InvalidEventError(f"kind {GENESIS_KIND!r} is reserved for the event at seq 0")
    if not isinstance(draft.payload, bytes):
        raise InvalidEventError(
            f"payload must be bytes (use encode_payload), got {type(draft.payload).__name__}"
        )


def check_drafts(drafts: Iterable[EventDraft]) -> list[EventDraft]:
    """Check every draft (see `check_draft`) and return them as a list."""
    checked = list(drafts)
    for draft in checked:
        check_draft(draft)
    return checked


def _check_ts(ts_ns: object) -> None:
    if type(ts_ns) is not int or not INT64_MIN <= ts_ns <= INT64_MAX:
        raise InvalidEventError(
            f"ts_ns must be an int of ns since the Unix epoch within signed 64 bits, got {ts_ns!r}"
        )


def _check_text(name: str, value: object, *, allow_empty: bool) -> str:
    if not isinstance(value, str):
        raise InvalidEventError(f"{name} must be a str, got {type(value).__name__}")
    if not value and not allow_empty:
        raise InvalidEventError(f"{name} must not be empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidEventError(f"{name} is not encodable as UTF-8: {value!r}") from exc
    if size > UINT32_MAX:
        raise InvalidEventError(f"{name} is {size} bytes long; at most {UINT32_MAX} allowed")
    return value
