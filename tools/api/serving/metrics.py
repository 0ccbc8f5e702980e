"""The node's metrics as a resource: ``GET /metrics`` in the Prometheus text
exposition format (tools/api/metrics.py renders it)."""

from __future__ import annotations

from litestar import Controller, Response, get
from litestar.di import NamedDependency

from ..context import ApiContext
from ..errors import ApiError
from ..openapi import responses, text

__all__ = ["MetricsController"]

_EXPOSITION = text(
    "text/plain", "Prometheus text exposition format (Content-Type names its version)."
)


class MetricsController(Controller):
    """``GET /metrics`` (unversioned: where Prometheus looks by default)."""

    path = "/metrics"

    @get(
        operation_id="getMetrics",
        sync_to_thread=True,
        responses={
            200: _EXPOSITION,
            **{s: responses(404)[s] for s in (401, 403, 404, 500)},
        },
    )
    def get_metrics(self, api: NamedDependency[ApiContext]) -> Response[bytes]:
        """Prometheus text exposition of the node's instances and chain."""
        if api.metrics is None:
            raise ApiError("metrics are not enabled on this node", "not_found", 404)
        content, content_type = api.metrics()
        # As given: Litestar would append a second charset to a text/* media_type.
        return Response(content, headers={"content-type": content_type})
