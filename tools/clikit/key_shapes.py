"""What a file given to ``--key`` or ``--checkpoint`` looks like it is, so that a
refusal says so in the project's words rather than a codec's (a newcomer's trial,
stop 33: ``--checkpoint`` and ``--key`` swapped read "'ascii' codec can't decode
...", and ``--key node.key``, the node's private key, was taken without a word).

The shapes (docs/chain-format.md, sections 9 and 10; c2sp.org/signed-note):

| shape        | looks like                                                        |
|--------------|-------------------------------------------------------------------|
| ``private``  | ``PRIVATE+KEY+<name>+<hexid>+<base64>``: a signer key (node.key)  |
| ``verifier`` | one line ``<name>+<8 hex>+<base64>``: a verifier key (node.pub)   |
| ``note``     | text, a blank line, then ``— <name> <base64>`` lines: a checkpoint |
| ``binary``   | not UTF-8 text (a chain.db, an image, ...)                        |
| ``other``    | anything else                                                     |

Only the shape is judged here; the key or note is parsed where it is used.
"""

from __future__ import annotations

import re
from typing import Literal

__all__ = [
    "NODE_PUB",
    "WITNESS_VKEY",
    "Shape",
    "as_checkpoint_problem",
    "as_key_problem",
    "shape_of",
]

Shape = Literal["private", "verifier", "note", "binary", "other"]

#: Where an auditor gets the node's verifier key, as the refusals say it.
NODE_PUB = "DATA_DIR/node.pub (its public half, written beside node.key: name+hexid+base64)"

#: What ``--witness`` takes, as the refusals say it.
WITNESS_VKEY = (
    "a witness's verifier key (name+hexid+base64, c2sp.org/tlog-cosignature), or a file holding one"
)

_VERIFIER = re.compile(r"[^\s+]+\+[0-9a-f]{8}\+[A-Za-z0-9+/]+=*")
_SIGNATURE_LINE = "\n\n\u2014 "  # a blank line, then U+2014 (em dash) and a space


def shape_of(data: bytes) -> Shape:
    """The shape of ``data`` (a file's first bytes, or a value as typed)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "binary"
    if "\x00" in text:
        return "binary"
    stripped = text.strip()
    if stripped.startswith("PRIVATE+KEY+"):
        return "private"
    if _SIGNATURE_LINE in text:
        return "note"
    if _VERIFIER.fullmatch(stripped):
        return "verifier"
    return "other"


def as_key_problem(
    data: bytes, shown: str, field: str = "--key", takes: str = NODE_PUB
) -> str | None:
    """Why ``data`` (shown as ``shown``: a file name, or "the value") is no verifier
    key for ``field`` (which takes ``takes``), when its shape says so; None when it
    may be one (it is parsed where it is used)."""
    shape = shape_of(data)
    if shape == "private" and field == "--key":
        return (
            f"{shown} is a PRIVATE signing key (PRIVATE+KEY+..., the node's node.key), "
            f"not a verifier key: keep it on the node; auditors verify with {takes}"
        )
    if shape == "private":
        return (
            f"{shown} is a PRIVATE signing key (PRIVATE+KEY+...), not a verifier key: "
            f"keep it where it signs; {field} takes {takes}"
        )
    if shape == "note":
        return (
            f"{shown} is a checkpoint (a signed note), not a verifier key; did you swap "
            f"--checkpoint and {field}? {field} takes {takes}"
        )
    if shape == "binary":
        return f"{shown} is not text, so not a verifier key; {field} takes {takes}"
    return None


def as_checkpoint_problem(data: bytes, shown: str, field: str) -> str | None:
    """Why ``data`` (the file ``shown``) is no checkpoint for ``field``, when its
    shape says so; None when it may be one."""
    shape = shape_of(data)
    if shape == "verifier":
        return (
            f"{field} {shown} is a verifier key (a node.pub), not a checkpoint; did you swap "
            "--checkpoint and --key? A checkpoint is a signed note written by "
            "`infervisor chain checkpoint WHERE --out FILE`"
        )
    if shape == "private":
        return (
            f"{field} {shown} is a PRIVATE signing key (a node.key), not a checkpoint: keep "
            "it on the node; a checkpoint is a signed note written by `infervisor chain "
            "checkpoint WHERE --out FILE`"
        )
    if shape == "binary":
        return (
            f"{field} {shown} is not text, so not a checkpoint; a checkpoint is a signed note "
            "written by `infervisor chain checkpoint WHERE --out FILE`"
        )
    return None
