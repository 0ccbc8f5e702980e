"""The status view of an instance, built from what its actor already knows."""

from __future__ import annotations

from typing import Protocol

from infervisor.adapters.adopted import AdoptedServer
from infervisor.adapters.probe import ServerReport
from infervisor.adapters.process import tree_rss_bytes
from infervisor.adapters.server import ServerAdapter
from infervisor.adapters.status import map_report
from infervisor.replay import InstanceState
from infervisor.replay.policy import restarts_in_window
from infervisor.replay.state import Stamp

from .core.health import wants_probe
from .core.rules import Mode, Rules
from .effects_runner import EffectRunner
from .kinds import Supervision
from .messages import InstanceView

__all__ = ["Viewed", "build_view"]


class Viewed(Protocol):
    """What a view is built from: the instance actor's parts."""

    state: InstanceState
    adapter: ServerAdapter
    report: ServerReport | None
    rules: Rules
    supervision: Supervision
    effects: EffectRunner
    listeners: dict[int, list[str]] | None
    fault: str

    def now(self) -> Stamp: ...


def build_view(actor: Viewed) -> InstanceView:
    """Combine sourced state, the last probe and the live server into one view."""
    state, adapter, report = actor.state, actor.adapter, actor.report
    spec = adapter.spec
    pid = state.process.pid if state.process is not None else None
    observed = report is not None and wants_probe(state, actor.rules)
    status, detail = "", None
    if observed and report is not None:
        load = actor.effects.load.state if actor.effects.load is not None else None
        mapped = map_report(
            spec.flavor,
            adapter.served_model,
            report,
            alive=pid is not None,
            adopted=actor.rules.mode is Mode.ADOPTED,
            load=load if state.lifecycle.value == "starting" else None,
        )
        status, detail = mapped.state.value, mapped.detail
    exposure = (
        adapter.exposure(actor.listeners)
        if isinstance(adapter, AdoptedServer)
        else "loopback (managed)"
    )
    if state.exposed:
        exposure = f"stopped: listened beyond loopback on {', '.join(state.exposed)}"
    reason = state.reason if not actor.fault else f"{state.reason} [fault: {actor.fault}]"
    return InstanceView(
        instance_id=state.instance_id,
        adapter=adapter.adapter_id,
        placed_by=state.placed_by,
        generation=state.generation,
        role=spec.role,
        flavor=spec.flavor.value,
        mode=spec.mode.value,
        model=adapter.served_model,
        endpoint=spec.base_url,
        lifecycle=state.lifecycle.value,
        desired=state.desired.value,
        reason=reason,
        since_ns=state.since_ns,
        pid=pid,
        restarts=restarts_in_window(state, actor.supervision.restart, actor.now()),
        health=report.health.kind.value if observed and report is not None else "",
        health_reason=report.health.reason if observed and report is not None else "",
        status=status,
        status_detail=detail,
        reserved_bytes=state.reserved_bytes,
        rss_bytes=tree_rss_bytes(pid) if pid is not None else None,
        exposure=exposure,
        last_exit=state.last_exit,
        last_seq=state.last_seq,
    )
