"""Files and directories named on the command line: one wording for what is wrong
with each, naming the option or argument (exit 2, ``bad_path``; never a traceback).

| a path given to read        | wrong when                 | says                                  |
|-----------------------------|----------------------------|---------------------------------------|
| a file (``--checkpoint``)   | missing                    | ``no such file``                      |
|                             | a directory                | ``is a directory, not a file``        |
|                             | unreadable                 | ``cannot read it: <why>``             |
| a directory (``BUNDLE``)    | missing                    | ``no such directory``                 |
|                             | a file                     | ``is a file, not a directory``        |
| a key (``--key``)           | not a key string: as a file, above                                 |
| a new file (``OUT``)        | its parent missing, or not a directory                             |

A ``--key`` is a key string or a file holding one (docs/chain-format.md); a
value without the key string's shape (``name+hexid+base64``: two ``+`` at
least) is taken as a file name, so ``--key /missing`` says the file is missing
rather than how a key string is spelt.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from .failure import Failure
from .key_shapes import NODE_PUB, WITNESS_VKEY, as_key_problem

__all__ = [
    "KEY",
    "WITNESS_KEY",
    "BadKey",
    "BadPath",
    "KeyOrFile",
    "file_problem",
    "need_dir",
    "need_file",
    "need_parent",
]


def file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read as a file, or None when it can."""
    if path.is_dir():
        return "is a directory, not a file"
    try:
        with path.open("rb"):
            return None
    except FileNotFoundError:
        return "no such file"
    except OSError as e:
        return f"cannot read it: {e.strerror or e}"


def need_file(path: Path, field: str) -> None:
    """Refuse (exit 2, ``bad_path``, naming ``field``) a file that cannot be read.

    Raises:
        Failure: the file is missing, a directory, or unreadable.
    """
    problem = file_problem(path)
    if problem is not None:
        raise Failure(f"{field} {path}: {problem}", "bad_path", field)


def need_dir(path: Path, field: str) -> None:
    """Refuse (exit 2, ``bad_path``, naming ``field``) a directory that is not one.

    Raises:
        Failure: the directory is missing, or a file.
    """
    if not path.exists():
        raise Failure(f"{field} {path}: no such directory", "bad_path", field)
    if not path.is_dir():
        raise Failure(f"{field} {path}: is a file, not a directory", "bad_path", field)


def need_parent(path: Path, field: str) -> None:
    """Refuse (exit 2, ``bad_path``) a new file or directory whose parent is not a
    directory (missing, or a file).

    Raises:
        Failure: naming ``field`` and the parent.
    """
    parent = path.parent
    if not parent.exists():
        raise Failure(
            f"{field} {path}: no such directory {parent} (it must exist)", "bad_path", field
        )
    if not parent.is_dir():
        raise Failure(f"{field} {path}: {parent} is a file, not a directory", "bad_path", field)


class BadPath(click.BadParameter):
    """A path option's value that names no usable file: a usage error (exit 2) whose
    JSON code is ``bad_path``, as the commands' own path refusals."""


class BadKey(click.BadParameter):
    """A ``--key`` whose value is plainly no verifier key (a checkpoint, the node's
    private key, not text): a usage error (exit 2) whose JSON code is ``bad_key``."""


#: How much of a --key file is read to judge its shape (a key is one short line).
_KEY_READ_BYTES = 64 * 1024


def _key_shaped(text: str) -> bool:
    """Whether ``text`` has the shape of a key string (``name+hexid+base64``, or a
    signer key ``PRIVATE+KEY+...``): two ``+`` at least; a file name seldom has."""
    return text.count("+") >= 2


class KeyOrFile(click.ParamType[str]):
    """``--key`` (and ``--witness``): a key string, or a file holding one. A value
    naming an existing path must be a readable file; one without a key string's
    shape must name one; one that is plainly no verifier key (a checkpoint, a
    private key, not text: tools/clikit/key_shapes.py) is refused, saying what
    it is. The value is returned as given: the key is read where it is used,
    by ``infervisor.chain.note.key_text`` (file or string, one implementation)."""

    name = "key"

    def __init__(self, field: str = "--key", takes: str = NODE_PUB) -> None:
        self._field = field
        self._takes = takes

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = os.fspath(value)
        path = Path(text)
        if not path.exists() and _key_shaped(text):
            data = text.encode("utf-8", "surrogateescape")
            why = as_key_problem(data, "the value", self._field, self._takes)
            if why is not None:
                raise BadKey(why, ctx, param)
            return text
        problem = file_problem(path)
        if problem is not None:
            hint = (
                "a key is a file such as DATA_DIR/node.pub, or a key string name+hexid+base64"
                if self._field == "--key"
                else f"{self._field} takes {self._takes}"
            )
            raise BadPath(f"{text}: {problem} ({hint})", ctx, param)
        try:
            with path.open("rb") as f:
                head = f.read(_KEY_READ_BYTES)
        except OSError as e:
            raise BadPath(f"{text}: cannot read it: {e.strerror or e}", ctx, param) from e
        why = as_key_problem(head, text, self._field, self._takes)
        if why is not None:
            raise BadKey(why, ctx, param)
        return text


KEY = KeyOrFile()
"""The type of every ``--key`` option."""

WITNESS_KEY = KeyOrFile("--witness", WITNESS_VKEY)
"""The type of every ``--witness`` option: a witness's vkey, or a file holding one."""
