"""The front's calls into the node (issue 21's seam with the residency core):
``demand`` an instance ready, and tell it a request began and ended.

These are the only places the front touches :class:`~infervisor.actors.node.Node`
besides :meth:`Node.list` and the registry. Each one blocks or not as the node's
method does: :func:`demand` blocks (run it on a worker thread), the other two
are actor tells.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from infervisor.actors.errors import NotResident, VerbTimeout

if TYPE_CHECKING:
    from infervisor.actors.node import Node
    from infervisor.replay.views import InstanceView

__all__ = ["demand", "request_began", "request_ended"]


def demand(
    node: Node, instance_id: str, *, request: str, model: str, by: str, timeout_s: float | None
) -> InstanceView:
    """The instance's view once it is running and ready (blocks: a worker thread's call).

    Raises:
        UnknownInstance: no such instance (unloaded meanwhile).
        NotResident: it cannot be served now (``code``, ``retry_after_s``).
    """
    real = getattr(node, "demand", None)
    if real is not None:
        view: InstanceView = real(
            instance_id, request=request, model=model, by=by, timeout_s=timeout_s
        )
        return view
    return _interim_demand(node, instance_id, by=by, timeout_s=timeout_s)


def request_began(node: Node, instance_id: str) -> None:
    """A request for the instance is being served (never blocks)."""
    real = getattr(node, "request_began", None)
    if real is not None:
        real(instance_id)


def request_ended(node: Node, instance_id: str) -> None:
    """A request for the instance has ended, however it ended (never blocks)."""
    real = getattr(node, "request_ended", None)
    if real is not None:
        real(instance_id)


# ------------------------------------------------------------------ interim
# Until the residency core's Node.demand is merged (branch s29-resid): start the
# instance and wait for it to run. Delete this function, and the getattr
# fallbacks above, at the merge.
_INTERIM_STARTABLE = frozenset({"loaded", "exited", "finished"})
_INTERIM_WAITING = frozenset({"starting", "restarting", "unhealthy"})


def _interim_demand(
    node: Node, instance_id: str, *, by: str, timeout_s: float | None
) -> InstanceView:
    view = node.status(instance_id)
    if view.lifecycle == "running":
        return view
    if view.lifecycle in ("stopped", "stopping"):
        raise NotResident(
            f"instance {instance_id} is stopped ({view.reason}): start it with "
            f"`infervisor start` first",
            code="stopped",
            retry_after_s=30.0,
        )
    if view.lifecycle == "failed":
        raise NotResident(
            f"instance {instance_id} failed ({view.reason})", code="failed", retry_after_s=30.0
        )
    if view.lifecycle in _INTERIM_STARTABLE:
        view = node.start(instance_id, by=by)
    wait = 120.0 if timeout_s is None else timeout_s
    try:
        view = node.wait_for(
            instance_id, lambda v: v.lifecycle in ("running", "stopped", "failed"), wait
        )
    except VerbTimeout as e:
        raise NotResident(str(e), code="start_timeout", retry_after_s=5.0) from e
    if view.lifecycle != "running":
        raise NotResident(
            f"instance {instance_id} is {view.lifecycle} ({view.reason})",
            code="stopped" if view.lifecycle == "stopped" else "failed",
            retry_after_s=30.0,
        )
    return view
