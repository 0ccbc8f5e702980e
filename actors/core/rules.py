"""What the core knows of an instance besides its sourced state: its kind's
rules (data, not classes) and the few unsourced facts of its actor.
"""

from __future__ import annotations

import enum

import msgspec

from infervisor.adapters.spec import Flavor

from .supervision import Supervision

__all__ = ["Mode", "Rules", "Tracking"]


class Mode(enum.StrEnum):
    """How the node drives the server: the adapter's kind."""

    PROCESS = "process"  # managed llama.cpp, mlx-lm: a process of ours
    OLLAMA = "ollama"  # managed Ollama: a model we load through its API
    ADOPTED = "adopted"  # somebody else's server: observed, never signalled


class Rules(msgspec.Struct, frozen=True, kw_only=True):
    """An instance's rules. Durations in seconds.

    Attributes:
        mode: process, ollama or adopted.
        flavor: the server flavor (for reading its probe reports).
        served_model: the model id the server knows it by.
        continuous: a server (restarted when it exits) rather than a one-shot.
        supervision: its kind's health spec and restart policy.
        node_id: this node (the lease spares what it placed itself).
        stop_grace_s: default grace of a stop.
        health_kill_grace_s: grace of a health kill.
        exposure_grace_s: grace of a stop for listening beyond loopback.
        reserve_overhead_bytes: added to a model's size when memory is
            reserved for it (the node's ``reserve_overhead_bytes``), bytes.
        idle_ttl_s: released to ``resting`` after this long without a
            request (the spec's, seconds); None: never.
        priority: the spec's eviction priority.
        pinned: never evicted (the spec's).
    """

    mode: Mode
    flavor: Flavor
    served_model: str | None
    continuous: bool
    supervision: Supervision
    node_id: str
    stop_grace_s: float
    health_kill_grace_s: float
    exposure_grace_s: float = 3.0
    reserve_overhead_bytes: int = 0
    idle_ttl_s: float | None = None
    priority: int = 0
    pinned: bool = False


class Tracking(msgspec.Struct, frozen=True, kw_only=True):
    """The instance's unsourced facts: consecutive health misses. A node that
    restarts counts them from zero again (like a kubelet), so they are not
    worth a chain row per probe.

    Attributes:
        misses: consecutive missed probes.
        deep_misses: consecutive failed deep health checks (one real token);
            only a deep check that gives a token clears them (a probe that
            answers does not), and a new start does.
        ollama_expires_at_ns: when Ollama said the model expires (``/api/ps``
            ``expires_at``, ns since the epoch, UTC; None: not seen or never).
        inflight: requests routed to it and not yet ended (a node restart
            ends them all: they were the node's).
        ended_ns: when the last of them ended (ns since the epoch, UTC): the
            ``idle_since_ns`` recorded at the next tick (None: none ended).
        server_active: requests the server itself reports in progress (its
            own counters, :class:`~.observations.ServerActivity`: clients that
            talk to it directly); 0 when it reports none or nothing.
        refusals_folded: refusals for room not recorded since the last
            ``residency.refused`` (identical, within its window).
        refusals_folded_total: all of those since the node started (a metric).
    """

    misses: int = 0
    deep_misses: int = 0
    ollama_expires_at_ns: int | None = None
    inflight: int = 0
    ended_ns: int | None = None
    server_active: int = 0
    refusals_folded: int = 0
    refusals_folded_total: int = 0

    @property
    def serving(self) -> int:
        """Requests in flight as far as the node knows: routed by it, or reported
        by the server (the larger: the routed ones are among those it reports)."""
        return max(self.inflight, self.server_active)
