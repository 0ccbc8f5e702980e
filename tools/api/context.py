"""What the control API's routes share, and the node given to each route as a
Litestar dependency (``Provide``, docs.litestar.dev "Dependency Injection").

The app holds one :class:`ApiContext` in its state; the dependency ``api``
hands it to a route, and ``node`` hands over the node admitted by the gate
(tools/api/gate.py) for the length of the request: :func:`reading` for a
route that changes nothing, :func:`changing` for a verb, which the gate counts
while it runs so that a shutdown waits for it. Both are generator
dependencies: Litestar throws the route's exception into them and re-raises it
unchanged, so the count is released on every path.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.params import SkipValidation

from infervisor.actors.node import Node
from infervisor.adapters.gpus import GpuCache
from infervisor.chain.connect import connect_reader

from .auth import Tokens
from .errors import ApiError, NodeStarting, NodeStopping
from .gate import Gate, Phase
from .idempotency import IdempotencyStore
from .watch import WatchHub

__all__ = [
    "AdmittedNode",
    "ApiContext",
    "changing",
    "last_of",
    "provide_api",
    "reading",
    "require_open",
]


@dataclass
class ApiContext:
    """What the routes share: the gate, the chain file, who may call, the API's own port,
    and ``own_ports``: each TCP port the node itself listens on (the API's, the
    front's) and what to call it in a refusal (``API port (api.tcp)``)."""

    data_dir: Path
    chain_path: Path
    node_id: str
    node_uid: int
    tokens: Tokens | None = None
    api_port: int | None = None
    own_ports: dict[int, str] = field(default_factory=dict)
    gate: Gate = field(default_factory=Gate)
    hub: WatchHub = field(default_factory=lambda: WatchHub(-1))
    idempotency: IdempotencyStore = field(default_factory=IdempotencyStore)
    metrics: Callable[[], tuple[bytes, str]] | None = None
    gpus: GpuCache = field(default_factory=GpuCache)

    def refuse_own_port(self, port: int, at: str = "spec.port") -> None:
        """Refuse a placement on a port the node itself listens on (the API's, the
        front's: ``own_ports``), before anything is recorded; ``at`` names the field.
        The one rule of ``POST /v1/instances`` and ``PUT /v1/placements``. Stop 33's
        trial: the front's port was taken for a foreign server ("adopt it instead")
        and its refusal recorded.

        Raises:
            ApiError: ``port_taken`` (409), naming the port and whose it is.
        """
        if (own := self.own_ports.get(port)) is not None:
            raise ApiError(
                f"port {port} is the node's own {own}; choose another port", "port_taken", 409, at
            )


#: A route's parameter ``node``: the node the gate admitted. The app gives it, never
#: a caller, so Litestar does not validate it (a test may give a stand-in).
AdmittedNode = NamedDependency[SkipValidation[Node]]

#: The key of the app's state that holds the context.
STATE_KEY = "api"


def provide_api(state: State) -> ApiContext:
    """The dependency ``api``: the context the app was built with."""
    api = state[STATE_KEY]
    assert isinstance(api, ApiContext)
    return api


def reading(api: NamedDependency[ApiContext]) -> Iterator[Node]:
    """The dependency ``node`` of a route that changes nothing.

    Raises:
        NodeStarting: 503, the node is not open yet.
        NodeStopping: 503, the node has shut down.
    """
    with api.gate.admit(changes=False) as node:
        yield node


def changing(api: NamedDependency[ApiContext]) -> Iterator[Node]:
    """The dependency ``node`` of a verb: counted by the gate until the route has
    answered, so :meth:`Gate.stopping` waits for it.

    Raises:
        NodeStarting: 503, the node is not open yet.
        NodeStopping: 503, the node is shutting down: it takes no more changes.
    """
    with api.gate.admit(changes=True) as node:
        yield node


def require_open(api: ApiContext) -> None:
    """Refuse a stream while the node is not open (a stream holds no admission:
    it may outlive the verbs a shutdown waits for).

    Raises:
        NodeStarting: 503, the node is not open yet.
        NodeStopping: 503, the node has shut down.
    """
    if api.gate.node is None and api.gate.phase is Phase.STOPPING:
        raise NodeStopping("the node has shut down", "node_stopping", 503)
    if api.gate.node is None:
        raise NodeStarting(
            "the node is starting (resuming from its chain); try again", "node_starting", 503
        )


def last_of(chain_path: Path, instance_id: str | None = None) -> tuple[int, str]:
    """The seq and hash (hex) of the instance's last durable event, or of the chain's
    head (None, or an instance with no event of its own); ``(-1, "")`` on no event."""
    conn = connect_reader(str(chain_path))
    try:
        row = None
        if instance_id is not None:
            row = conn.execute(_LAST + "WHERE subject = ? " + _NEWEST, (instance_id,)).fetchone()
        if row is None:
            row = conn.execute(_LAST + _NEWEST).fetchone()
    finally:
        conn.close()
    return (int(row[0]), bytes(row[1]).hex()) if row else (-1, "")


def evicted_for(chain_path: Path, instance_id: str, after_seq: int) -> list[str]:
    """The instances evicted for ``instance_id`` since ``after_seq``: the subjects
    of the ``residency.evicted`` events after it whose ``for_instance`` names it,
    in seq order (the answer of a start that made room)."""
    conn = connect_reader(str(chain_path))
    try:
        rows = conn.execute(
            "SELECT subject, payload FROM events WHERE seq > ? AND kind = ? ORDER BY seq",
            (after_seq, "residency.evicted"),
        ).fetchall()
    finally:
        conn.close()
    return [str(s) for s, p in rows if json.loads(bytes(p)).get("for_instance") == instance_id]


_LAST = "SELECT seq, hash FROM events "
_NEWEST = "ORDER BY seq DESC LIMIT 1"
