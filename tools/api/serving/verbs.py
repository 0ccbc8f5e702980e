"""A verb on one instance, done one way for every verb (start, stop, restart,
unload, and the start of a placement): given to a route as the Litestar
dependency ``verb`` (:func:`provide_verb`).

Its caller is the operator, or the controller its body names, which must then
hold scope control and whose lease the verb renews (as a heartbeat would); it
is answered once its events are durable, with the seq and hash of the
instance's last event then.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from litestar import Request
from litestar.di import NamedDependency, Provide

from infervisor.actors.node import Node
from infervisor.replay.callers import Role, controller_source, source_for

from ..auth import Caller, authorize
from ..context import AdmittedNode, ApiContext, changing, last_of
from ..scopes import Scope
from ..wire import VerbAnswer, VerbRequest

__all__ = ["VERB_DEPENDENCIES", "VerbCall", "provide_verb"]


@dataclass(frozen=True)
class VerbCall:
    """The node admitted for a change, and who asks (the request's caller)."""

    api: ApiContext
    node: Node
    request: Request[Any, Any, Any]

    def source(self, role: str) -> str:
        """The event source: ``role:`` and the caller the middleware named."""
        identity = str(self.request.scope.get("infervisor.identity") or "")
        return source_for(role, identity or None)

    def controller_source(self, controller: str) -> str:
        """A controller's event source: ``controller:ctl1 (token fleet-ctl)`` over TCP,
        ``controller:ctl1 (uid=0(root))`` over the socket (replay/callers.py)."""
        credential = str(self.request.scope.get("infervisor.credential") or "")
        if not credential:
            return self.source(Role.CONTROLLER)  # an app without the middleware (tests)
        return controller_source(controller, credential)

    def caller(self, data: VerbRequest | None) -> str:
        """The verb's source: ``controller:…`` (and the lease renewed) when the body
        names a controller, else ``operator:…``.

        Raises:
            ApiRefusal: 403 ``forbidden``: the body names a controller and the caller
                does not hold scope control (a controller's verb renews its lease).
        """
        controller = data.controller if data is not None else None
        if controller is None:
            return self.source("operator")
        held = self.request.scope.get("infervisor.scope")
        identity = str(self.request.scope.get("infervisor.identity") or "")
        authorize(
            Caller(identity=identity, scope=held if isinstance(held, Scope) else Scope.READ),
            Scope.CONTROL,
            f"a verb naming controller {controller!r}",
        )
        self.node.heartbeat(controller)
        return self.controller_source(controller)

    def do(self, instance_id: str, data: VerbRequest | None, act: Callable[..., object]) -> None:
        """``act(instance_id, by=caller)``: returns once its events are durable."""
        act(instance_id, by=self.caller(data))

    def answer(
        self, instance_id: str, data: VerbRequest | None, act: Callable[..., object]
    ) -> VerbAnswer:
        """:meth:`do`, answered with the instance's view and its last durable event."""
        self.do(instance_id, data, act)
        return self.view(instance_id)

    def view(self, instance_id: str) -> VerbAnswer:
        """The instance's view and its last durable event."""
        seq, digest = last_of(self.api.chain_path, instance_id)
        return VerbAnswer(instance=self.node.status(instance_id), seq=seq, hash=digest)


def provide_verb(
    api: NamedDependency[ApiContext], node: AdmittedNode, request: Request[Any, Any, Any]
) -> VerbCall:
    """The dependency ``verb``."""
    return VerbCall(api, node, request)


#: A verb's route: the node admitted for a change, and the verb.
VERB_DEPENDENCIES = {
    "node": Provide(changing),
    "verb": Provide(provide_verb, sync_to_thread=False),
}
