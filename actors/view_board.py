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
"""

from __future__ import annotations

from .view import Posted

__all__ = ["ViewBoard"]


class ViewBoard:
    """Each instance's last posted view by instance id (any thread)."""

    def __init__(self) -> None:
        self._posted: dict[str, Posted] = {}

    def post(self, iid: str, posted: Posted) -> None:
        """``posted`` is now ``iid``'s (a revived actor's replaces its predecessor's)."""
        self._posted[iid] = posted

    def drop(self, iid: str, owner: object) -> None:
        """Take ``iid``'s view off the board, if ``owner`` posted it (its actor stops)."""
        posted = self._posted.get(iid)
        if posted is not None and posted.owner is owner:
            self._posted.pop(iid, None)

    def get(self, iid: str) -> Posted | None:
        """``iid``'s last posted view (None: none posted, or its actor stopped)."""
        return self._posted.get(iid)
