"""The control API's server side: the Litestar app (:mod:`.app`), the server that
binds and serves it (:mod:`.server`), and one Litestar controller per resource.

Nothing in ``tools.api`` imports this package (the client, the wire types and
the helpers the routes share live there), so the two have no import cycle.

The node (:mod:`.node`: ``/v1/node``, ``/v1/ledger``, ``/v1/heartbeat``), its
models (:mod:`.models`: ``/v1/models``), its instances (:mod:`.instances`:
``/v1/instances/...``, the verbs and the logs), the chain's events
(:mod:`.events`: ``/v1/events``), cordon, drain and placement sets (:mod:`.fleet`:
``/v1/node/cordon|drain|uncordon``, ``/v1/placements``), the chain as a tlog-tiles
log with its proofs (:mod:`.log`: ``/v1/log/...``) and the metrics
(:mod:`.metrics`: ``/metrics``). Each route is given what it needs as Litestar
dependencies (tools/api/context.py): ``api`` (the shared context) and
``node`` (the node, admitted by the gate for the request's length).
"""

from __future__ import annotations

from .events import EventController
from .fleet import FleetController
from .instances import InstanceController
from .log import LogController
from .metrics import MetricsController
from .models import ModelController
from .node import NodeController

__all__ = ["CONTROLLERS"]

#: Every controller the app serves.
CONTROLLERS = (
    NodeController,
    ModelController,
    InstanceController,
    EventController,
    MetricsController,
    LogController,
    FleetController,
)
