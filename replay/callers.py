"""Who did it: an event's source is a role, and for a request also the caller.

A source is ``ROLE`` or ``ROLE:IDENTITY``. The role says which part of the
system decided (and so which rules apply: an operator start resets the
restart budget, a controller placement is subject to the lease); the identity
says which caller asked, as the control API authenticated it:

- ``uid=1000(alice)``: a Unix socket peer, from ``SO_PEERCRED``;
- ``token=ci (scope operate)``: a named bearer token and its scope
  (tools/api/scopes.py; chains written before scopes say ``token=ci``).

A request naming a controller records the controller's name first, then the
credential it came with (:func:`controller_source`, issue 19):
``controller:ctl1 (token fleet-ctl)`` over TCP, ``controller:ctl1
(uid=0(root))`` over the Unix socket. Chains written before say
``controller:token=ci (scope control)`` (or ``controller:token=ci``): they
still parse (:func:`parse_source`), with no controller name. A stop decided by
a lapsed lease names the lapsed controller: ``lease:ctl1``.

Events recorded by the node itself carry the bare role (``supervisor``,
``node``, ``lease``, ``shutdown``). The same string is the event's ``source``
header and the ``by`` field of the verb's events, so "who stopped X" is one
column in docs/forensics.md's views.
"""

from __future__ import annotations

import enum
import re

import msgspec

__all__ = [
    "Role",
    "Source",
    "controller_source",
    "identity_of",
    "lease_source",
    "parse_source",
    "role_of",
    "source_for",
    "token_credential",
]

#: A controller's name as a source carries it: a plain token (tools/api/strict.py).
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
#: ``NAME (CREDENTIAL)``: a controller's identity part since issue 19.
_NAMED = re.compile(rf"(?P<name>{_NAME}) \((?P<credential>.+)\)")


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
    BOOT = "boot"  # a start the boot decided (or a shutdown's stop it resumed, to start again)


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


class Source(msgspec.Struct, frozen=True, kw_only=True):
    """An event's source, parsed (:func:`parse_source`).

    Attributes:
        role: who decided (:class:`Role`'s value, or a role this version does not know).
        controller: the controller named (``controller:ctl1 (...)``, ``lease:ctl1``), or None.
        credential: how the caller authenticated (``token fleet-ctl``, ``uid=0(root)``,
            an older chain's ``token=ci (scope control)``), or None.
    """

    role: str
    controller: str | None = None
    credential: str | None = None


def token_credential(token_name: str) -> str:
    """The credential part of a controller's source for a bearer token: ``token NAME``."""
    return f"token {token_name}"


def controller_source(controller: str, credential: str) -> str:
    """``controller:NAME (CREDENTIAL)``: who asked, for a request naming a controller.

    ``credential`` is :func:`token_credential`'s over TCP, the peer's ``uid=N(name)``
    over the Unix socket.

    Raises:
        ValueError: ``controller`` is not a plain token, or ``credential`` is empty.
    """
    if re.fullmatch(_NAME, controller) is None:
        raise ValueError(f"controller must be a plain token, got {controller!r}")
    if not credential:
        raise ValueError("a controller's source names the credential it came with")
    return source_for(Role.CONTROLLER, f"{controller} ({credential})")


def lease_source(controller: str) -> str:
    """``lease:NAME``: the source of what a lapse of ``controller``'s lease decided."""
    return source_for(Role.LEASE, controller)


def parse_source(source: str) -> Source:
    """Split a source into role, controller and credential (every form ever stored).

    ``controller:ctl1 (token fleet-ctl)`` -> controller ``ctl1``, credential
    ``token fleet-ctl``; ``lease:ctl1`` -> controller ``ctl1``; ``operator:uid=0(root)``
    and an older chain's ``controller:token=ci (scope control)`` -> credential only
    (a name holds no ``=``, so the two forms cannot be confused).
    """
    role = role_of(source)
    who = identity_of(source)
    if who is None:
        return Source(role=role)
    if role == Role.LEASE:
        return Source(role=role, controller=who)
    if role == Role.CONTROLLER:
        named = _NAMED.fullmatch(who)
        if named is not None:
            return Source(role=role, controller=named["name"], credential=named["credential"])
    return Source(role=role, credential=who)
