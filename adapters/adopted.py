"""An adopted server: somebody else started it; infervisor observes and never signals it.

Source: ``reference/infer_runtime.rs.txt`` (adopted mode) and
``reference/infer_lifecycle.rs.txt`` (``start_instance``: an adopted start
only confirms the server answers; ``stop_instance`` refuses).
"""

from __future__ import annotations

from .probe import HealthKind, ServerClient, ServerReport
from .server import AdapterKind
from .spec import InstanceSpec

__all__ = ["STOP_REFUSAL", "AdoptedServer"]

STOP_REFUSAL = (
    "{iid} is adopted: infervisor observes it and never stops it; unload forgets the registration"
)


class AdoptedServer:
    """Health-checks a server that is not ours."""

    kind: AdapterKind = "adopted"
    model_bytes = 0

    def __init__(self, spec: InstanceSpec, probe_timeout_s: float) -> None:
        self.spec = spec
        self.adapter_id = spec.flavor.adapter_id(spec.mode)
        self.served_model = spec.model
        self._client = ServerClient(spec.base_url, probe_timeout_s)

    plain_probe = True

    def probe(self) -> ServerReport:
        return self._client.probe(self.spec.flavor)

    def deep_model(self, report: ServerReport) -> str | None:
        """The spec's model, else the first the server lists."""
        return self.served_model or _first(report)

    @staticmethod
    def confirm_answers(report: ServerReport) -> tuple[str | None, bool]:
        """What an adopted start needs to know of a probe's ``report``: (why the
        server does not answer, or None when it answers; whether it answered that
        it is still loading)."""
        health = report.health
        if health.kind is HealthKind.UNREACHABLE:
            return health.reason or str(health.kind), False
        return None, health.kind is HealthKind.LOADING

    def address_taken(self) -> str | None:
        return None  # the address is the adopted server's own

    def exposure(self, wide: dict[int, list[str]] | None) -> str:
        """How reachable the server is, from a socket-table snapshot
        (:func:`~.ports.wide_listeners`; None before the first): its binding
        is not ours to enforce."""
        wide_here = (wide or {}).get(self.spec.port, [])
        if wide_here:
            return (
                f"lan: listening on {', '.join(wide_here)} "
                "(adopted: its binding is not ours to enforce)"
            )
        if wide is None:
            return "unknown (adopted: its sockets were not read yet; not ours to enforce)"
        return "loopback (adopted: seen listening on loopback only; not ours to enforce)"

    def close(self) -> None:
        self._client.close()


def _first(report: ServerReport) -> str | None:
    return report.models[0] if report.models else None
