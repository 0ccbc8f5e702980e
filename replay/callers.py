"""Who did it: an event's source is a role, and for a request also the caller.

A source is ``ROLE`` or ``ROLE:IDENTITY``. The role says which part of the
system decided (and so which rules apply: an operator start resets the
restart budget, a controller placement is subject to the lease); the identity
says which caller asked, as the control API authenticated it:

- ``uid=1000(alice)``: a Unix socket peer, from ``SO_PEERCRED``;
- ``token=ci (scope operate)``: a named bearer token and its scope
  (tools/api/scopes.py; chains written before scopes say ``token=ci``).

Events recorded by the node itself carry the bare role (``supervisor``,
``node``, ``lease``, ``shutdown``). The same string is the event's ``source``
header and the ``by`` field of the verb's events, so "who stopped X" is one
column in docs/forensics.md's views.
"""

from __future__ import annotations

import enum

__all__ = ["Role", "identity_of", "role_of", "source_for"]


class Role(enum.StrEnum):
    """Which part of the system decided: the role part of an event's source.

    A StrEnum, so a source stored in the chain is the same string as before."""

    OPERATOR = "operator"  # a person through the CLI or the API: a start resets the budget
    CONTROLLER = "controller"  # a placement controller (subject to the lease)
    CONFIG = "config"  # the node's configuration file
    SUPERVISOR = "supervisor"  # the node's own supervision (restarts, health kills)
    NODE = "node"  # the node itself (boot)
    SHUTDOWN = "shutdown"  # the node stopping: leaves instances wanted as they were
    LEASE = "lease"  # a lapsed controller lease
    BOOT = "boot"  # a start the boot decided


def source_for(role: str, identity: str | None = None) -> str:
    """``role`` alone, or ``role:identity`` when a caller is known.

    Raises:
        ValueError: the role is empty or holds ``:`` (the separator).
    """
    if not role or ":" in role:
        raise ValueError(f"role must be a non-empty word without ':', got {role!r}")
    return f"{role}:{identity}" if identity else role


def role_of(source: str) -> str:
    """The role part of a source (``operator:uid=0(root)`` -> ``operator``)."""
    return source.partition(":")[0]


def identity_of(source: str) -> str | None:
    """The caller part of a source, or None when the node itself decided."""
    _, sep, who = source.partition(":")
    return who if sep and who else None
