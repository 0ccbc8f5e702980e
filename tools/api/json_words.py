"""A body that is not a JSON object, and a caller's value quoted back, in the
project's words: the one place the control API (tools/api/strict.py) and the
front (tools/front/bodies.py) turn msgspec's decode errors into messages.

msgspec says ``Input data was truncated`` for an empty body and for a string
holding a lone UTF-16 surrogate escape (``"\\ud800"``: RFC 8259 section 8.2 leaves
it undefined; it is not Unicode text, so neither JSON nor the chain can hold
it), and ``Expected `object | null`, got `array``` for ``[]`` (valid JSON of the
wrong kind). Its wording is not passed on: each of its cases is said here.
"""

from __future__ import annotations

import re

import msgspec

__all__ = ["MAX_SHOWN", "malformed", "not_an_object", "shown"]

#: The most characters of a caller's value an error message quotes.
MAX_SHOWN = 200

_EXPECTED = re.compile(r"^Expected `[^`]*`, got `(?P<got>[^`]*)`$")
_AT_BYTE = re.compile(r"^JSON is malformed: (?P<what>.*) \(byte (?P<at>\d+)\)$")
#: A ``\\uD800``-``\\uDBFF`` escape not followed by a ``\\uDC00``-``\\uDFFF`` one,
#: or a ``\\uDC00``-``\\uDFFF`` escape not preceded by a high one (a backslash
#: before the escape's own is an escaped backslash: ``\\\\ud800`` is text).
_LONE = re.compile(
    r"(?<!\\)(?:\\\\)*(?:(?P<high>\\u[dD][89abAB][0-9a-fA-F]{2})(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})(?P<low>\\u[dD][c-fC-F][0-9a-fA-F]{2}))"
)
#: msgspec's reasons (after ``JSON is malformed:``) in words.
_REASONS = {
    "trailing characters": "more follows the JSON value",
    "trailing comma in array": "a comma before ']'",
    "trailing comma in object": "a comma before '}'",
    "expected ',' or ']'": "',' or ']' expected",
    "expected ',' or '}'": "',' or '}' expected",
    "expected '\"'": "a quoted key expected",
    "expected ':'": "':' expected",
    "invalid number": "a number that is not JSON's",
    "object keys must be strings": "a key that is not a string",
}
#: JSON's kinds as msgspec names them -> as a message says them.
_KINDS = {
    "array": "an array",
    "str": "a string",
    "int": "a number",
    "float": "a number",
    "bool": "true or false",
    "null": "null",
    "object": "an object",
}


def shown(value: object, limit: int = MAX_SHOWN) -> str:
    """``repr(value)``, or its first ``limit`` characters then ``…`` and the whole
    value's length (``'aaaa…' (100000 characters)``) for a longer one."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = len(value) if isinstance(value, str | bytes) else len(text)
    return f"{text[:limit]}… ({size} characters)"


def lone_surrogate(body: bytes) -> str | None:
    """The first lone UTF-16 surrogate escape in a JSON text (``\\ud800``), or None."""
    found = _LONE.search(body.decode("utf-8", "replace"))
    return (found["high"] or found["low"]) if found else None


def malformed(error: msgspec.MsgspecError, body: bytes) -> str:
    """Why ``body`` is not JSON, in words (``error``: msgspec's DecodeError decoding
    it): empty, a lone surrogate escape, not UTF-8, cut short, or the byte at fault."""
    said = str(error)
    if not body.strip():
        return "the body is empty; a JSON object is expected"
    lone = lone_surrogate(body)
    if lone is not None and ("truncated" in said or "surrogate" in said):
        return (
            f"not valid JSON text: a string holds a lone UTF-16 surrogate escape ({lone}), "
            "which is not a Unicode character"
        )
    if said.startswith("Invalid UTF-8"):
        return "not valid JSON text: a string is not valid UTF-8"
    if "truncated" in said:
        return "not valid JSON: the body ends before its JSON value does"
    at = _AT_BYTE.match(said)
    if at is None:
        return "not valid JSON"
    what = _REASONS.get(at["what"], "an unexpected character")
    return f"not valid JSON at byte {at['at']}: {what}"


def not_an_object(error: msgspec.ValidationError) -> str | None:
    """``the body must be a JSON object, not an array`` for msgspec's ``Expected
    `object`, got `array``` of the body as a whole (None: another error)."""
    found = _EXPECTED.match(str(error))
    if found is None:
        return None
    got = _KINDS.get(found["got"], found["got"])
    return f"the body must be a JSON object, not {got}"
