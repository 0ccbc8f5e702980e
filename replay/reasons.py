"""Why each event happened, in one line: the reasons timelines and status show.

One entry per event type (``REASONS``); :func:`reason_of` picks it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import events as ev
from . import residency_events as rev
from .durations import seconds

__all__ = ["REASONS", "reason_of"]


def _starting(e: ev.Starting) -> str:
    attempt = f" (restart {e.attempt})" if e.attempt else ""
    budget = "; restart budget reset" if e.reset_budget else ""
    return f"start by {e.by}{attempt}{budget}"


def _stop(e: ev.StopRequested) -> str:
    return f"stop by {e.by} (grace {seconds(e.grace_s)})" + (f": {e.reason}" if e.reason else "")


def _ready(e: ev.Ready) -> str:
    return "health probe answered: serving" + (f" ({e.detail})" if e.detail else "")


def _why(reason: str | None) -> str:
    return f" ({reason})" if reason else ""


def _evicted(e: rev.ResidencyEvicted) -> str:
    cause = f" ({e.cause})" if e.cause else ""
    return (
        f"evicted for {e.for_instance}{cause}: it needs {e.needed_bytes} bytes beside "
        f"{e.in_use_bytes} in use of {e.budget_bytes}; frees {e.freed_bytes}"
    )


REASONS: dict[type[Any], Callable[[Any], str]] = {
    rev.ResidencyDemanded: lambda e: f"demanded by {e.by} (request {e.request}, model {e.model})",
    rev.ResidencyEvicted: _evicted,
    rev.ResidencyExpired: lambda e: (
        f"idle longer than its idle_ttl_s {seconds(e.idle_ttl_s)}: resting"
    ),
    rev.ResidencyRefused: lambda e: (
        f"no room: needs {e.needed_bytes} bytes beside {e.in_use_bytes} in use of "
        f"{e.budget_bytes}, and nothing can be evicted"
    ),
    rev.ResidencyBusy: lambda e: "serving requests",
    rev.ResidencyIdle: lambda e: "idle: no request in flight",
    ev.Placed: lambda e: f"placed by {e.placed_by} (generation {e.generation})",
    ev.Replaced: lambda e: f"placed again by {e.placed_by} (generation {e.generation})",
    ev.PlacementIgnored: lambda e: (
        f"stale placement by {e.placed_by} ignored: generation {e.generation} "
        f"is older than {e.current}"
    ),
    ev.Starting: _starting,
    ev.Spawned: lambda e: f"spawned pid {e.pid} (group {e.pgid})",
    ev.Reattached: lambda e: f"re-attached pid {e.pid} after the node restarted",
    ev.StartRefused: lambda e: f"start by {e.by} refused: {e.reason}",
    ev.Ready: _ready,
    ev.Unhealthy: lambda e: f"{e.misses} missed health checks: {e.reason}",
    ev.Recovered: lambda e: "health recovered",
    ev.DeepHealthFailed: lambda e: f"deep health check failed ({e.misses} in a row): {e.reason}",
    ev.Exited: lambda e: e.reason,
    ev.RestartScheduled: lambda e: f"restart {e.attempt} in {seconds(e.delay_s)}: {e.reason}",
    ev.Failed: lambda e: e.reason,
    ev.Finished: lambda e: "one-shot run ended cleanly (exit code 0); not restarted",
    ev.StableAgain: lambda e: f"up {seconds(e.uptime_s)}: restart budget cleared",
    ev.StopRequested: _stop,
    ev.Unloaded: lambda e: f"unloaded by {e.by}",
    ev.Exposed: lambda e: f"listening beyond loopback on {', '.join(e.addresses)}: stopped",
    ev.StraysEnded: lambda e: (
        f"{len(e.pids)} unclaimed process(es) in its cgroup {e.cgroup} killed at boot: "
        f"pid {', '.join(map(str, e.pids[:8]))}"
    ),
    ev.Terminating: lambda e: f"{e.cause} (SIGKILL after {seconds(e.grace_s)})",
    ev.ModelClaimed: lambda e: (
        "model loaded by this node" if e.ours else "model already resident: not ours to unload"
    ),
    ev.MemoryReleased: lambda e: f"memory released ({e.bytes} bytes)",
    ev.UnloadFailed: lambda e: f"ollama did not unload the model: {e.error}; it is kept reserved",
    ev.ModelDropped: lambda e: (
        "ollama dropped the model: "
        + ("its keep_alive ran out" if e.expired else "before its keep_alive ran out")
    ),
    ev.MemoryCorrected: lambda e: (
        f"memory reservation corrected to {e.reserved_bytes} bytes "
        f"(ollama reports {e.size_bytes} bytes, {e.size_vram_bytes} in VRAM)"
    ),
    ev.LeaseRenewed: lambda e: f"controller {e.controller} heard",
    ev.AdmissionRefused: lambda e: f"placement refused: {e.reason}",
    ev.NodeStarted: lambda e: f"node started (pid {e.pid})",
    ev.NodeStopped: lambda e: f"node stopped: {e.reason}",
    ev.NodeStraysEnded: lambda e: (
        f"pids {e.pids} ended in the cgroup of {e.instance_id}, an instance the chain does not have"
    ),
    ev.KeyRotated: lambda e: f"checkpoint key rotated: {e.old_key} -> {e.new_key}",
    ev.NodeCordoned: lambda e: "node cordoned: no new placements" + _why(e.reason),
    ev.NodeDrained: lambda e: "node drained: controllers' instances stopped" + _why(e.reason),
    ev.NodeUncordoned: lambda e: "node uncordoned: placements taken again" + _why(e.reason),
    ev.PlacementSet: lambda e: (
        f"placement set of {e.controller} (generation {e.generation}): "
        f"{len(e.instances)} instance(s)"
    ),
    ev.WitnessOverride: lambda e: (
        f"resumed past witness {e.witness} ({e.flag}): it cosigned size {e.witness_size}, "
        f"the chain has {e.chain_size}: {e.reason}"
    ),
}


def reason_of(event: ev.Event) -> str:
    """One line saying why an event happened, for timelines and status."""
    return REASONS[type(event)](event)
