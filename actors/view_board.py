"""The node's board of instance views: each instance actor posts its view after
every change it makes, and ``list`` reads them without waking any actor.

Before, a ``list`` of 1,000 instances asked each of the 1,000 actors for its
view: 1,000 thread wake-ups, each a ``Condition`` handed across threads, for
views that had mostly not changed (bench/README.md: 200 ms for 1,000 on a
quiet machine, the views themselves about 27 us each). Now an instance actor
posts a :class:`~.view.Posted` here at its start, after each decision is
recorded (its events durable and applied: a post is never ahead of the chain)
and after each message it handles; the reader composes each posted view with
what changes without the actor (:func:`~.view.compose`: the last probe's
report, the restart window, the cgroup's counters), as ``status`` does on the
actor's thread.

One dict and no lock: a post is one assignment and a read one ``dict.get``
(each atomic under the GIL), so a thousand actors posting at once (a node's
shutdown answers every stop with a view) never wait for each other. Taking a
view off checks its owner first; should a revived actor post between that
check and the removal, its post is lost until its next one, and ``list`` asks
that actor meanwhile (an instance without a post is asked).

The board has a :attr:`ViewBoard.version`, a counter that changes whenever a
post changes what a router routes by (:func:`route_key`: the lifecycle, the
desired state, the served model, role, flavor, endpoint, residency fields),
an actor posts its first view or a view is taken off. A reader that built
something from :meth:`~.node_views.NodeViews.list` (the front's routing
table, tools/front/proxy.py) compares the version it read *before* listing
with the current one: equal, nothing it routes by changed since. A post's
version is taken after its view is on the board, so a post the listing missed
always carries a version never read before. Posts that change only the live
or per-request fields (``busy``, ``last_use_ns``, memory, probes) leave the
version as it is: a request's own ``request_began`` does not make the next
request rebuild its table.
"""

from __future__ import annotations

import itertools

from infervisor.replay.views import InstanceView

from .view import Posted

__all__ = ["ViewBoard", "route_key"]


class ViewBoard:
    """Each instance's last posted view by instance id (any thread)."""

    def __init__(self) -> None:
        self._posted: dict[str, Posted] = {}
        # next() of an itertools.count is atomic under the GIL: no two posts share a value.
        self._counter = itertools.count(1)
        self._version = 0

    @property
    def version(self) -> int:
        """Changes whenever what a router routes by changed on the board (see the
        module); compare for equality only (two racing posts may store theirs out
        of order, which reads as one more change)."""
        return self._version

    def post(self, iid: str, posted: Posted) -> None:
        """``posted`` is now ``iid``'s (a revived actor's replaces its predecessor's)."""
        before = self._posted.get(iid)
        self._posted[iid] = posted
        if (
            before is None
            or before.owner is not posted.owner
            or route_key(before.view) != route_key(posted.view)
        ):
            self._version = next(self._counter)

    def drop(self, iid: str, owner: object) -> None:
        """Take ``iid``'s view off the board, if ``owner`` posted it (its actor stops)."""
        posted = self._posted.get(iid)
        if posted is not None and posted.owner is owner:
            self._posted.pop(iid, None)
            self._version = next(self._counter)

    def get(self, iid: str) -> Posted | None:
        """``iid``'s last posted view (None: none posted, or its actor stopped)."""
        return self._posted.get(iid)


def route_key(view: InstanceView) -> tuple[object, ...]:
    """What of ``view`` a router routes by (tools/front/routes.py ranks and names
    instances by these): a change of any of them changes the board's version."""
    return (
        view.lifecycle,
        view.desired,
        view.model,
        view.role,
        view.flavor,
        view.mode,
        view.endpoint,
        view.generation,
        view.resting,
        view.on_demand,
        view.idle_ttl_s,
        view.priority,
        view.pinned,
    )
