"""An instance's observations waiting for the chain to record a decision.

When the chain refuses a decision's events (disk full, the write lock held by
another process past the busy timeout), the observation that led to it is
kept at the head of this backlog, and every later observation of the
instance is held behind it, undecided: a decision is a function of sourced
state, and the state the later ones would be decided on is not yet the
chain's. The instance actor retries the head with a capped exponential
backoff and no limit, and once an append succeeds decides the rest in order.

What may be merged while waiting (:data:`COALESCED`) is only what cannot
change a decision: a reconcile tick right behind another (the later one is
decided at the same moment, on the state the earlier one left), a socket
snapshot right behind another (the newer one supersedes it). Exits, timers,
spawn results, probe results and verbs' follow-ups are never merged or
dropped. A probe result waits its turn and is judged then, against the state
the chain has recorded by that time (one for a process whose exit was
recorded before it no longer matches the probe's token and is ignored); no
new probe is sent while observations wait.

Source: issue 17, item 5 ("a failed append never drops an observation");
the single-writer, decide-append-act rule of ARCHITECTURE.md.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable

from .core import observations as o

__all__ = ["COALESCED", "RETRY_BASE_S", "RETRY_CAP_S", "Backlog"]

#: The first retry of a refused append comes after this many seconds, doubling.
RETRY_BASE_S = 0.5
#: ... up to this many seconds between retries (and no limit on their number).
RETRY_CAP_S = 5.0
#: Observation types a newer one of the same type replaces at the backlog's tail.
COALESCED: tuple[type[o.Observation], ...] = (o.Tick, o.ListenersSeen)


class Backlog:
    """Observations waiting, in order, and the retry schedule of the head.

    Not thread-safe: owned by one instance actor.

    Attributes:
        held: how many times an observation of each type was put in the
            backlog (a running count for tests and diagnosis: coalesced ones
            count, and a head refused again counts at each retry).
    """

    def __init__(self, base_s: float = RETRY_BASE_S, cap_s: float = RETRY_CAP_S) -> None:
        self._waiting: deque[o.Observation] = deque()
        self._base_s = base_s
        self._cap_s = cap_s
        self._attempt = 0
        self._armed = False
        self._why = ""
        self._logged = ""
        self.held: Counter[str] = Counter()

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def __len__(self) -> int:
        return len(self._waiting)

    def waiting(self) -> list[o.Observation]:
        """The observations waiting, head first (a copy)."""
        return list(self._waiting)

    def hold(self, obs: o.Observation) -> None:
        """Keep ``obs`` behind everything already waiting (see :data:`COALESCED`)."""
        self.held[type(obs).__name__] += 1
        tail = self._waiting[-1] if self._waiting else None
        if isinstance(obs, COALESCED) and type(tail) is type(obs):
            self._waiting[-1] = obs
            return
        self._waiting.append(obs)

    def put_back(self, observations: Iterable[o.Observation]) -> None:
        """Put a refused observation and what followed it back at the head, in order."""
        for obs in reversed(list(observations)):
            self.held[type(obs).__name__] += 1
            self._waiting.appendleft(obs)

    def take(self) -> o.Observation:
        """The head, removed (put it back with :meth:`put_back` if refused again).

        Raises:
            IndexError: nothing waits.
        """
        return self._waiting.popleft()

    def failed(self, why: str) -> bool:
        """An append was refused for ``why``; True when that kind was not logged yet."""
        self._why = why
        if why == self._logged:
            return False
        self._logged = why
        return True

    def next_delay(self) -> float | None:
        """Seconds until the head is tried again, or None when a retry is already
        armed: ``RETRY_BASE_S`` doubling per refusal, at most ``RETRY_CAP_S``."""
        if self._armed:
            return None
        self._armed = True
        delay: float = min(self._cap_s, self._base_s * 2.0 ** min(self._attempt, 32))
        self._attempt += 1
        return delay

    @property
    def armed(self) -> bool:
        """A retry of the head is scheduled."""
        return self._armed

    def retry_due(self) -> None:
        """The scheduled retry came due (a refusal now schedules the next one)."""
        self._armed = False

    def recovered(self) -> bool:
        """Everything waiting was recorded: reset the backoff. True when appends
        had been refused (the recovery is worth a log line)."""
        was = bool(self._logged)
        self._attempt, self._why, self._logged = 0, "", ""
        return was

    def fault(self) -> str:
        """What the instance's status says while observations wait."""
        n = len(self._waiting)
        what = "observation waits" if n == 1 else "observations wait"
        return f"{self._why}; {n} {what}, in order, for the chain to record them"
