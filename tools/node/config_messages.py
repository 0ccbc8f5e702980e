"""msgspec's validation messages of a config, rewritten in the TOML terms an operator reads.

msgspec says "Object contains unknown field `x` - at `$.instances[1]`"; the
operator wrote TOML, so :func:`explain` names the key and its section
(``unknown key `x` in [[instances]] #2; did you mean `y`?``), with the allowed
keys or values. ``infervisor place`` words a spec fragment's errors with the
same hints (:func:`allowed_keys`, :func:`enum_hint`; tools/operator/place.py).
"""

from __future__ import annotations

import difflib
import enum
import re
import types
import typing
from typing import Any

import msgspec

__all__ = ["MISSING_KEY", "UNKNOWN_KEY", "allowed_keys", "enum_hint", "explain"]

#: A message and the path msgspec appends to it (none for the whole document).
_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
#: msgspec's message for a key the struct does not have (``key``: that key).
UNKNOWN_KEY = re.compile(r"^Object contains unknown field `(?P<key>[^`]*)`$")
#: msgspec's message for a required key that is absent (``key``: that key).
MISSING_KEY = re.compile(r"^Object missing required field `(?P<key>[^`]*)`$")
_PART = re.compile(r"\.?(?P<name>[^.\[]+)(?:\[(?P<index>\d+|\.\.\.)\])?")
_TOP = "the top level"
#: A TOML bare key (written as it is in a section header; others are quoted).
_BARE = re.compile(r"[A-Za-z0-9_-]+")


def explain(message: str, root: type[msgspec.Struct], doc: Any = None) -> str:
    """Rewrite a msgspec validation message of a ``root`` document in TOML terms;
    ``doc``, the document as parsed (when given), names the table of a keyed section
    (``[node.kinds.inference]``) where msgspec's path says only ``[...]``."""
    match = _AT.match(message)
    if match is None:  # pragma: no cover - the pattern matches any string
        return message
    what, path = match["what"], match["path"] or ""
    section, cls, key = _locate(path, root, doc)
    place = "at the top level" if section == _TOP else f"in {section}"
    if unknown := UNKNOWN_KEY.match(what):
        return f"unknown key `{unknown['key']}` {place}; {allowed_keys(cls, unknown['key'])}"
    if missing := MISSING_KEY.match(what):
        return f"missing key `{missing['key']}` {place}"
    where = f"{section}, key `{key}`" if key else section
    hint = enum_hint(cls, key) if what.startswith("Invalid enum value") else ""
    return f"{where}: {what[:1].lower()}{what[1:]}{hint}"


def allowed_keys(cls: type[msgspec.Struct], key: str) -> str:
    """What to write instead of the unknown ``key`` in a ``cls`` table: its section
    (a ``[node]`` key given at the config's top level), the closest key, or all of them."""
    if _in_node_section(cls, key):
        return f"`{key}` belongs in the [node] section"
    names = [f.name for f in msgspec.structs.fields(cls)]
    close = difflib.get_close_matches(key, names, n=1)
    if close:
        return f"did you mean `{close[0]}`?"
    return f"allowed keys: {', '.join(names)}"


def _in_node_section(cls: type[msgspec.Struct], key: str) -> bool:
    """Whether ``cls`` has the config's ``[node]`` section and ``key`` is one of its keys.
    NodeSettings is imported only for a table with a ``node`` field: a spec fragment
    (``infervisor place --file``) has none, and its messages load none of the node's actors."""
    node = _struct_field(cls, "node")
    if node is None:
        return False
    from infervisor.actors.settings import NodeSettings  # noqa: PLC0415 - see above

    return node is NodeSettings and key in NodeSettings.__struct_fields__


def enum_hint(cls: type[msgspec.Struct], key: str | None) -> str:
    """``; allowed: a, b`` when ``cls``'s field ``key`` is an enum or a Literal, else ``""``."""
    t = _field_types(cls).get(key or "")
    if isinstance(t, type) and issubclass(t, enum.Enum):
        return f"; allowed: {', '.join(str(v.value) for v in t)}"
    if typing.get_origin(t) is typing.Literal:
        return f"; allowed: {', '.join(str(v) for v in typing.get_args(t))}"
    return ""


def _locate(
    path: str, root: type[msgspec.Struct], doc: Any = None
) -> tuple[str, type[msgspec.Struct], str | None]:
    """(TOML section, its struct, the key below it) of a msgspec path like ``.node.restart``.

    ``[n]`` indexes an array of tables (shown 1-based); ``[...]`` is a table
    keyed by any name: the name of its first table that does not convert, read
    from ``doc`` (``[node.kinds.inference]``), else ``[node.kinds.<name>]``
    (stop 33's trial read the placeholder).
    """
    cls = root
    names: list[str] = []
    section = _TOP
    parts = list(_PART.finditer(path))
    for i, m in enumerate(parts):
        child = _struct_field(cls, m["name"])
        if child is None:
            return section, cls, ".".join(p["name"] for p in parts[i:])
        doc = doc.get(m["name"]) if isinstance(doc, dict) else None
        index = m["index"]
        if index == "...":
            name = _failing_key(doc, _field_types(cls).get(m["name"]))
            doc = doc.get(name) if name is not None and isinstance(doc, dict) else None
            names.append(f"{m['name']}.{name or '<name>'}")
        else:
            names.append(m["name"])
            doc = doc[int(index)] if index and isinstance(doc, list) else doc
        dotted = ".".join(names)
        section = f"[[{dotted}]] #{int(index) + 1}" if index and index.isdigit() else f"[{dotted}]"
        cls = child
    return section, cls, None


def _failing_key(table: Any, field_type: Any) -> str | None:
    """The first key of ``table`` (a TOML table, of a field typed ``dict[str, V]``)
    whose value does not convert to ``V`` (msgspec converts a table in order): the
    one its error is of."""
    if not isinstance(table, dict) or typing.get_origin(field_type) is not dict:
        return None
    value_type = typing.get_args(field_type)[1]
    for name, value in table.items():
        try:
            msgspec.convert(value, value_type)
        except msgspec.ValidationError:
            return str(name) if _BARE.fullmatch(str(name)) else f'"{name}"'
    return None


def _struct_field(cls: type[msgspec.Struct], name: str) -> type[msgspec.Struct] | None:
    """The struct type of field ``name`` (or of its list items or table values), if one."""
    t = _field_types(cls).get(name)
    origin = typing.get_origin(t)
    if origin is list:
        t = typing.get_args(t)[0]
    elif origin is dict:
        t = typing.get_args(t)[1]
    if typing.get_origin(t) in (typing.Union, types.UnionType):  # `X | None`, `str | X`
        t = next((a for a in typing.get_args(t) if isinstance(a, type) and a is not str), None)
        t = None if t is type(None) else t
    return t if isinstance(t, type) and issubclass(t, msgspec.Struct) else None


def _field_types(cls: type[msgspec.Struct]) -> dict[str, Any]:
    return {f.name: f.type for f in msgspec.structs.fields(cls)}
