"""Whether a boot places an instance the config declares and the node has not got,
pure: ``decide_config_entry(wanted, record) -> ConfigVerdict``.

The chain alone decides, so every boot on one chain and one config decides the
same (stop 33: an operator's ``unload`` of a config instance was undone by the
boot after the one that finished it, since the config placed whatever the
rebuilt state did not hold, and an unload removes the instance from it):

- never placed (no ``instance.placed`` for its id): **placed**;
- placed and not unloaded since: the node has it; never asked here;
- unloaded (``instance.unloaded`` after its last placement, by anyone) and the
  config's entry is the spec that placement recorded: **held** unloaded, said
  in one line, until an operator places it again or the entry changes;
- unloaded, and the config's entry differs from the recorded spec (a key the id
  does not cover: ctx_size, env, ...): **placed** again, saying which keys
  changed since the unload.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import msgspec

__all__ = ["ConfigVerdict", "Outcome", "Recorded", "decide_config_entry"]


class Recorded(msgspec.Struct, frozen=True, kw_only=True):
    """What the chain holds of one instance id: the spec of its last
    ``instance.placed`` (JSON builtins), and the seq and ``by`` of an
    ``instance.unloaded`` after it (``unloaded_seq`` None: none since)."""

    spec: dict[str, Any]
    unloaded_seq: int | None = None
    unloaded_by: str = ""


class Outcome(enum.StrEnum):
    PLACE = "place"
    HOLD = "hold"


class ConfigVerdict(msgspec.Struct, frozen=True, kw_only=True):
    """``outcome``; ``changed``: the keys whose config value differs from the
    recorded spec (sorted; set when placed again after an unload); ``note``: the
    line a boot says (empty for a first placement)."""

    outcome: Outcome
    changed: tuple[str, ...] = ()
    note: str = ""


def decide_config_entry(
    iid: str, wanted: Mapping[str, Any], record: Recorded | None
) -> ConfigVerdict:
    """Place the config's entry ``wanted`` (the spec as JSON builtins) for ``iid``,
    or hold it unloaded, from ``record`` (None: the chain never placed ``iid``).

    Raises nothing: any record gives a verdict."""
    if record is None or record.unloaded_seq is None:
        return ConfigVerdict(outcome=Outcome.PLACE)
    changed = tuple(sorted(k for k, v in wanted.items() if record.spec.get(k) != v))
    unloaded = f"unloaded by {record.unloaded_by} at [{record.unloaded_seq}]"
    if not changed:
        return ConfigVerdict(
            outcome=Outcome.HOLD,
            note=(
                f"note: {iid} stays unloaded ({unloaded}); its [[instances]] entry is "
                "unchanged since: place it again (infervisor place) or change the entry"
            ),
        )
    return ConfigVerdict(
        outcome=Outcome.PLACE,
        changed=changed,
        note=(
            f"warning: {iid} was {unloaded}; the config changed {', '.join(changed)} "
            "since, so it is placed again"
        ),
    )
