"""The status view of an instance, built from what its actor already knows."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infervisor.adapters.adopted import AdoptedServer
from infervisor.adapters.process import tree_rss_bytes
from infervisor.adapters.status import map_report

from .messages import InstanceView
from .ollama_driver import OllamaDriver

if TYPE_CHECKING:
    from .instance import InstanceActor

__all__ = ["build_view"]


def build_view(actor: InstanceActor) -> InstanceView:
    """Combine sourced state, the last probe and the live server into one view."""
    state, adapter, driver, report = actor.state, actor.adapter, actor.driver, actor.report
    spec = adapter.spec
    pid = driver.pid()
    observed = report is not None and actor.driver.wants_probe() is not None
    status, detail = "", None
    if observed and report is not None:
        load = driver.load_state() if isinstance(driver, OllamaDriver) else None
        adopted = adapter.kind == "adopted"
        alive = pid is not None
        mapped = map_report(
            spec.flavor, adapter.served_model, report, alive=alive, adopted=adopted, load=load
        )
        status, detail = mapped.state.value, mapped.detail
    exposure = (
        adapter.exposure(actor.listeners)
        if isinstance(adapter, AdoptedServer)
        else "loopback (managed)"
    )
    if state.exposed:
        exposure = f"stopped: listened beyond loopback on {', '.join(state.exposed)}"
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
        reason=state.reason,
        since_ns=state.since_ns,
        pid=pid,
        restarts=state.restarts,
        health=report.health.kind.value if observed and report is not None else "",
        health_reason=report.health.reason if observed and report is not None else "",
        status=status,
        status_detail=detail,
        reserved_bytes=actor.memory.held,
        rss_bytes=tree_rss_bytes(pid) if pid is not None else None,
        exposure=exposure,
        last_exit=state.last_exit,
        last_seq=state.last_seq,
    )
