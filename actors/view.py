"""The status view of an instance, built from what its actor already knows."""

from __future__ import annotations

from infervisor.adapters.probe import ServerReport
from infervisor.adapters.process import ManagedProcess, tree_rss_bytes
from infervisor.adapters.spec import Flavor, Mode
from infervisor.adapters.status import map_report
from infervisor.replay import InstanceState

from .messages import InstanceView

__all__ = ["build_view"]


def build_view(
    state: InstanceState, report: ServerReport | None, proc: ManagedProcess | None
) -> InstanceView:
    """Combine sourced state, the last probe and the live process into one view."""
    spec = state.spec
    flavor = Flavor(spec["flavor"])
    model = spec.get("model")
    status, detail = "", None
    if report is not None and proc is not None:
        mapped = map_report(flavor, model, report, alive=True, adopted=False, load=None)
        status, detail = mapped.state.value, mapped.detail
    pid = proc.identity.pid if proc is not None else None
    host = spec.get("host", "127.0.0.1")
    host = f"[{host}]" if ":" in host else host
    return InstanceView(
        instance_id=state.instance_id,
        role=spec["role"],
        flavor=flavor.value,
        mode=spec.get("mode", Mode.MANAGED.value),
        model=model,
        endpoint=f"http://{host}:{spec['port']}",
        lifecycle=state.lifecycle.value,
        desired=state.desired.value,
        reason=state.reason,
        since_ns=state.since_ns,
        pid=pid,
        restarts=state.restarts,
        health=report.health.kind.value if report is not None and proc is not None else "",
        health_reason=report.health.reason if report is not None and proc is not None else "",
        status=status,
        status_detail=detail,
        rss_bytes=tree_rss_bytes(pid) if pid is not None else None,
        last_exit=state.last_exit,
        last_seq=state.last_seq,
    )
