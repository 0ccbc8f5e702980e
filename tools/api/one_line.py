"""One line of free text for the chain (a cordon's ``reason``): the one rule the
control API's ``reason`` (tools/api/fleet_wire.py, through msgspec's pattern,
400 naming ``reason``) and the command line's ``--reason``
(tools/clikit/command.py, exit 2 naming ``--reason``) both apply.

Not allowed, as each would split a line where the text is shown (``events``,
``timeline``, ``status --node``) or turn the text around it: a control
character (C0, DEL, C1: a newline, a tab, ...), the line and paragraph
separators (U+2028, U+2029), the bidirectional embeddings and overrides
(U+202A to U+202E) and isolates (U+2066 to U+2069) (Unicode's UAX #9; the
"Trojan Source" attack, CVE-2021-42574); nor a text that is empty or blank
(it would replace a reason in force with none); nor more than
:data:`MAX_REASON` characters.
"""

from __future__ import annotations

import re

__all__ = ["ALLOWED", "MAX_REASON", "PATTERN", "refusal"]

#: The most characters a reason may have.
MAX_REASON = 500
#: The characters not allowed, as the body of a regular expression's class.
_NOT_ALLOWED = r"\u0000-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069"
#: The whole rule but the length, one pattern for JSON Schema (ECMA-262) and for
#: Python's ``re`` alike: not blank, then none of :data:`_NOT_ALLOWED`. ``(?!\n)$``:
#: Python's ``$`` also matches before a final newline (as ControllerId's pattern).
PATTERN = rf"^(?!\s*$)[^{_NOT_ALLOWED}]*(?!\n)$"
#: What is allowed, for an error's message.
ALLOWED = (
    f"one line of at most {MAX_REASON} characters, not blank: no control character "
    "(a newline, a tab, ...), line separator (U+2028, U+2029) or bidirectional "
    "override (U+202A to U+202E, U+2066 to U+2069)"
)

_ONE_LINE = re.compile(PATTERN)
_ONE_BAD = re.compile(rf"[{_NOT_ALLOWED}]")


def refusal(text: str, max_len: int = MAX_REASON) -> str | None:
    """Why ``text`` is not one line of at most ``max_len`` characters (None: it
    is), in a few words: decided by :data:`PATTERN`, as the API decides it."""
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):  # bytes argv could not decode
        return "not valid UTF-8 text"
    if _ONE_LINE.search(text) is None:
        bad = _ONE_BAD.search(text)
        if bad is None:
            return "empty or blank"
        if ord(bad[0]) < 32 or 127 <= ord(bad[0]) < 160:
            return "a control character (a newline, a tab, ...) is not allowed"
        return "a line separator or a bidirectional override is not allowed"
    if len(text) > max_len:
        return f"{len(text)} characters: at most {max_len} allowed"
    return None
