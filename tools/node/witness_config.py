"""The ``[[witnesses]]`` tables of the node's config, and their checks (issue 18).

Each names a C2SP tlog-witness (c2sp.org/tlog-witness) that cosigns the
node's checkpoints: ``url`` (the node posts to ``<url>/add-checkpoint``) and
``vkey`` (its cosignature/v1 verifier key). ``[node] witness_quorum`` is
how many of them must cosign.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import msgspec

from infervisor.chain.cosignature import parse_witness_key
from infervisor.chain.errors import NoteError

from .fragment import ConfigError

__all__ = ["ConfigError", "WitnessEntry", "check_witnesses"]


class WitnessEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[[witnesses]]``: a C2SP tlog-witness that cosigns this node's checkpoints.

    Attributes:
        url: its submission prefix (http or https); the node posts to
            ``<url>/add-checkpoint``.
        vkey: its cosignature/v1 verifier key, ``<name>+<hex key id>+<base64>``.
    """

    url: str
    vkey: str


def check_witnesses(witnesses: list[WitnessEntry], quorum: int | None, path: Path) -> None:
    """Raise ConfigError (one line) unless each ``[[witnesses]]`` has an http(s)
    url and a witness vkey, names are distinct, and ``[node] witness_quorum``
    is 1 .. their number."""
    names: list[str] = []
    for n, entry in enumerate(witnesses, 1):
        where = f"{path}: [[witnesses]] #{n}"
        if not _is_http(entry.url):
            raise ConfigError(
                f"{where} url {entry.url!r}: an http:// or https:// URL prefix without query "
                "(the node posts to <url>/add-checkpoint)"
            )
        try:
            key = parse_witness_key(entry.vkey)
        except NoteError as e:
            raise ConfigError(
                f"{where} vkey: {e} (a cosignature/v1 verifier key <name>+<hex id>+<base64>)"
            ) from None
        if key.name in names:
            raise ConfigError(f"{where} vkey: witness {key.name!r} is configured twice")
        names.append(key.name)
    if quorum is not None and not 1 <= quorum <= len(names):
        allowed = f"1 .. {len(names)}" if names else "none without [[witnesses]]"
        raise ConfigError(f"{path}: [node] witness_quorum {quorum}: allowed {allowed}")


def _is_http(text: str) -> bool:
    """An http(s) URL with a host and no query, fragment, space or control character."""
    try:
        url = urllib.parse.urlsplit(text)
        host = url.hostname
    except ValueError:
        return False
    plain = all(33 <= ord(c) <= 126 for c in text)
    bare = not url.query and not url.fragment
    return plain and bare and url.scheme in ("http", "https") and bool(host)
