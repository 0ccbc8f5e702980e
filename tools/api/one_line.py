"""One line of free text for the chain (a cordon's ``reason``): the one rule the
control API's ``reason`` (tools/api/fleet_wire.py, through msgspec's pattern,
400 naming ``reason``) and the command line's ``--reason``
(tools/clikit/command.py, exit 2 naming ``--reason``) both apply.

Not allowed, as each would split a line where the text is shown (``events``,
``timeline``, ``status --node``) or turn the text around it: a control
character (C0, DEL, C1: a newline, a tab, ...), the line and paragraph
separators (U+2028, U+2029); nor a format character (Unicode's general
category Cf), which is invisible where the text is shown, so that two reasons
that look alike could differ (spoofing): the bidirectional embeddings, overrides,
isolates and marks (U+202A to U+202E, U+2066 to U+2069, U+200E, U+200F, U+061C;
Unicode's UAX #9; the "Trojan Source" attack, CVE-2021-42574), the zero-width
space, non-joiner and joiner (U+200B to U+200D), the word joiner and invisible
operators (U+2060 to U+2064), the byte order mark (U+FEFF), the soft hyphen
(U+00AD) and the rest of Cf in the Basic Multilingual Plane (Unicode 14); nor a
text that is empty or blank (it would replace a reason in force with none); nor
more than :data:`MAX_REASON` characters.

What Cf costs ordinary text: an emoji joined with U+200D (a family, a rainbow
flag), Persian or Indic text written with a zero-width non-joiner or joiner,
and a soft hyphen are refused; letters, accents, CJK, emoji standing alone and
variation selectors (category Mn) are not. The format characters beyond the
Basic Multilingual Plane (the tags U+E0001, U+E0020 to U+E007F, and a few
historic scripts' controls) are not in the rule: :data:`PATTERN` is also the
OpenAPI schema's, read by ECMA-262 without its ``u`` flag, where no class can
name a character beyond U+FFFF.
"""

from __future__ import annotations

import re

__all__ = ["ALLOWED", "MAX_REASON", "PATTERN", "named", "refusal"]

#: The most characters a reason may have.
MAX_REASON = 500
#: The characters not allowed, as the body of a regular expression's class.
_CONTROL = r"\u0000-\u001f\u007f-\u009f"
#: Unicode 14's format characters (Cf) below U+10000, and the line and paragraph
#: separators (U+2028, U+2029, category Zl and Zp).
_FORMAT = (
    r"\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
    r"\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb"
)
_NOT_ALLOWED = _CONTROL + _FORMAT
#: The whole rule but the length, one pattern for JSON Schema (ECMA-262) and for
#: Python's ``re`` alike: not blank, then none of :data:`_NOT_ALLOWED`. ``(?!\n)$``:
#: Python's ``$`` also matches before a final newline (as ControllerId's pattern).
PATTERN = rf"^(?!\s*$)[^{_NOT_ALLOWED}]*(?!\n)$"
#: What is allowed, for an error's message.
ALLOWED = (
    f"one line of at most {MAX_REASON} characters, not blank: no control character "
    "(a newline, a tab, ...), line separator (U+2028, U+2029) or invisible format "
    "character (Unicode's category Cf: a bidirectional override or mark, U+202A to "
    "U+202E, U+2066 to U+2069, U+200E, U+200F; a zero-width space or joiner, U+200B "
    "to U+200D; a word joiner, U+2060 to U+2064; a byte order mark, U+FEFF; a soft "
    "hyphen, U+00AD, ...)"
)

_ONE_LINE = re.compile(PATTERN)
_ONE_BAD = re.compile(rf"[{_NOT_ALLOWED}]")


#: Names of the C0 and C1 controls, which ``unicodedata.name`` does not give.
_CONTROL_NAMES = {
    0x00: "NULL",
    0x09: "CHARACTER TABULATION",
    0x0A: "LINE FEED",
    0x0B: "LINE TABULATION",
    0x0C: "FORM FEED",
    0x0D: "CARRIAGE RETURN",
    0x1B: "ESCAPE",
    0x7F: "DELETE",
    0x85: "NEXT LINE",
}


def named(char: str) -> str:
    """``U+200B ZERO WIDTH SPACE``: a character's code point and Unicode name (a
    control's alias; the code point alone when it has neither). A newcomer's
    trial (stop 34) read "an invisible format character (U+200B, ...)" and could
    not tell which of the characters that look alike it was."""
    import unicodedata  # noqa: PLC0415 - only a refusal pays for it

    name = unicodedata.name(char, "") or _CONTROL_NAMES.get(ord(char), "")
    return f"U+{ord(char):04X} {name}".rstrip()


def refusal(text: str, max_len: int = MAX_REASON) -> str | None:
    """Why ``text`` is not one line of at most ``max_len`` characters (None: it
    is), in a few words: decided by :data:`PATTERN`, as the API decides it. A
    character not allowed is named with its index (0-based) in ``text``: ``an
    invisible format character, U+200B ZERO WIDTH SPACE at index 5, is not allowed``."""
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):  # bytes argv could not decode
        return "not valid UTF-8 text"
    if _ONE_LINE.search(text) is None:
        bad = _ONE_BAD.search(text)
        if bad is None:
            return "empty or blank"
        which = f"{named(bad[0])} at index {bad.start()}"
        if ord(bad[0]) < 32 or 127 <= ord(bad[0]) < 160:
            return f"a control character, {which}, is not allowed"
        if bad[0] in "\u2028\u2029":
            return f"a line separator, {which}, is not allowed"
        return f"an invisible format character (Unicode's category Cf), {which}, is not allowed"
    if len(text) > max_len:
        return f"{len(text)} characters: at most {max_len} allowed"
    return None
