"""The node's own events: its runs, its key, controllers heard, strays and
refusals that concern no instance of the chain. Members of :data:`.events.Event`
(the chain's one union) and re-exported there; their own module keeps events.py
short. None of them has an instance as its subject.
"""

from __future__ import annotations

from typing import Any

from .event_base import EventBase
from .state import Stamp

__all__ = [
    "AdmissionRefused",
    "KeyRotated",
    "LeaseRenewed",
    "NodeStarted",
    "NodeStopped",
    "NodeStraysEnded",
    "WitnessOverride",
]


class NodeStarted(EventBase, frozen=True, tag="node.started"):
    """The node process started (or restarted) on this chain."""

    pid: int
    boot_id: str
    version: str


class NodeStopped(EventBase, frozen=True, tag="node.stopped"):
    """The node shut down cleanly (servers were stopped first)."""

    reason: str


class KeyRotated(EventBase, frozen=True, tag="chain.key_rotated"):
    """The node's checkpoint key was replaced (``infervisor chain rotate-key``).

    ``old_key`` and ``new_key`` are C2SP verifier keys (``name+hash+base64``);
    ``note`` is the rotation statement as a C2SP signed note, signed by both
    (docs/chain-format.md, "Key rotation"). It changes no instance state.
    """

    old_key: str
    new_key: str
    note: str


class LeaseRenewed(EventBase, frozen=True, tag="node.lease_renewed"):
    """A controller other than this node was heard from. Recorded at most once
    per a fraction of that controller's lease, so each controller's lease
    survives a node restart without a chain row per heartbeat."""

    controller: str
    at: Stamp


class NodeStraysEnded(EventBase, frozen=True, tag="node.strays_ended"):
    """At boot, processes were found in the cgroup of an instance the chain does
    not have (one unloaded while its node died, say): they are killed, and the
    cgroup removed. ``instance_id`` names the cgroup's instance, ``pids`` the
    processes, ``cgroup`` where they were found. A node-level event: the chain
    has no instance to record it on."""

    instance_id: str
    pids: list[int]
    cgroup: str


class WitnessOverride(EventBase, frozen=True, tag="node.witness_override"):
    """At boot, the operator resumed a node that a witness's answer refused
    (``infervisor run --accept-witness-conflict``): recorded before anything
    else is appended. ``witness`` is the witness's key name, ``witness_size``
    the tree size it last cosigned for this node's origin, ``chain_size`` the
    events in the chain, ``reason`` why the boot check refused (a rollback:
    the witness cosigned more than the chain has; a fork: the chain is not an
    extension of what it cosigned), ``flag`` the command-line flag given. It
    changes no instance state."""

    witness: str
    witness_size: int
    chain_size: int
    reason: str
    flag: str


class AdmissionRefused(EventBase, frozen=True, tag="node.admission_refused"):
    """A placement was refused because of the node's own condition (a taken port)."""

    reason: str
    spec: dict[str, Any]
