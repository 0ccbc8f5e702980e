"""INSTANCE on the command line: an instance id, or a role that names one instance."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .failure import fail
from .schemas import from_state

if TYPE_CHECKING:
    from infervisor.replay import NodeState

__all__ = ["chain_roles", "resolve"]


def resolve(name: str, roles: Mapping[str, str | None], where: str) -> str:
    """The instance id NAME means: itself, or the one instance whose role it is.

    Refused (exit 1) when NAME is the role of several instances (naming them)
    or names none (naming the placed ones)."""
    if name in roles:
        return name
    matches = sorted(iid for iid, role in roles.items() if role == name)
    if len(matches) == 1:
        return matches[0]
    if matches:
        fail(
            f"{name!r} is the role of {len(matches)} instances {where}: "
            f"{', '.join(matches)}; name one by its id",
            "ambiguous_instance",
            "INSTANCE",
        )
    placed = (
        ", ".join(f"{iid} ({role})" if role else iid for iid, role in sorted(roles.items()))
        or "none"
    )
    fail(f"no instance {name!r} {where} (placed: {placed})", "unknown_instance", "INSTANCE")


def chain_roles(state: NodeState) -> dict[str, str | None]:
    """Each placed instance of a replayed state -> its role (None: none)."""
    return {iid: from_state(inst).role for iid, inst in state.instances.items()}
