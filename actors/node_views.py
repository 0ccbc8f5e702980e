"""The node's read views: what a caller reads without changing anything (an
instance's view, the list, the ledger, the chain's append health and latency,
the node's failure), and the plumbing that finds an instance's actor.

:class:`NodeViews` is the base of :class:`~.node.Node`; none of it waits for
the host, and only :meth:`NodeViews.wait_for` and :meth:`NodeViews.wait_failed`
wait at all.
"""

from __future__ import annotations

import builtins
import contextlib
import time
from collections.abc import Callable
from typing import Any

import pykka

from infervisor.adapters.proc.containment import Containment
from infervisor.replay import NodeState
from infervisor.replay.views import InstanceView, LedgerView

from . import messages as m
from .append_health import AppendStatus
from .chain_writer import CommitLatency, LatencySnapshot
from .errors import VerbTimeout
from .ledger import snapshot
from .node_boot import ASK_TIMEOUT_S, NodeActors, rebuild
from .routes import Routes
from .settings import NodeSettings
from .view import compose
from .watchdog import NodeFailure
from .witnessing import WitnessLag

__all__ = ["NodeViews"]


class NodeViews:
    """The read side of a node (see :class:`~.node.Node` for the verbs)."""

    settings: NodeSettings
    _actors: NodeActors
    _routes: Routes
    _supervisor: pykka.ActorRef[Any]
    _ledger: pykka.ActorRef[Any] | None

    @property
    def containment(self) -> Containment:
        """How this node contains its managed servers: ``mode`` and ``reason``."""
        return self._actors.containment

    @property
    def failure(self) -> NodeFailure | None:
        """Why the node stopped working (a node-wide actor died, or the supervisor's
        ticks stopped), or None while it works. A failed node stays failed."""
        return None if self._actors.watchdog is None else self._actors.watchdog.failure

    def wait_failed(self, timeout_s: float | None = None) -> NodeFailure | None:
        """Block until the node fails (its failure) or ``timeout_s`` seconds pass (None)."""
        if self._actors.watchdog is None:
            return None
        return self._actors.watchdog.wait_failed(timeout_s)

    def on_tick(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` on each supervisor health tick while the node works
        (:meth:`.watchdog.Watchdog.on_tick`): a sign of life that stops when the
        supervisor stops ticking. Quick and non-blocking, please."""
        if self._actors.watchdog is not None:
            self._actors.watchdog.on_tick(callback)

    def ledger(self) -> LedgerView | None:
        """The memory budget and each instance's reservation (None without a budget)."""
        return snapshot(self._ledger) if self._ledger is not None else None

    def status(self, instance_id: str) -> InstanceView:
        """The instance's view (never waits for a probe, nor for the host).

        Raises:
            UnknownInstance, InvalidState: no such instance, or it is being unloaded.
        """
        view: InstanceView = self._ask(self._ref(instance_id), m.GetStatus())
        return view

    def list(self) -> builtins.list[InstanceView]:
        """Every routed instance's view, ordered by id, as :meth:`status` would
        answer it: composed from the view its actor last posted (actors/view_board.py;
        no actor is woken), or asked of the actor that has posted none.

        Instances being unloaded are not listed, nor one whose actor ended
        between the snapshot of the routes and its answer (unloaded meanwhile).
        """
        refs, board = self._routes.current.refs, self._actors.views
        got: builtins.list[InstanceView | pykka.Future[Any] | None] = []
        for iid in sorted(refs):
            ref, posted = refs[iid], board.get(iid)
            if posted is None:
                got.append(ref.ask(m.GetStatus(), block=False))
            else:
                got.append(compose(posted) if ref.is_alive() else None)
        views = []
        for reply in got:
            if isinstance(reply, InstanceView):
                views.append(reply)
                continue
            with contextlib.suppress(pykka.ActorDeadError):
                if reply is not None:
                    views.append(reply.get(timeout=ASK_TIMEOUT_S))
        return views

    def views_version(self) -> tuple[int, int]:
        """A value that changes whenever what :meth:`list` answers changed in what
        a router routes by: an instance placed, unloaded or unloading (the
        published routes), or its lifecycle, desired state, served model, role,
        endpoint or residency fields (the view board's version,
        actors/view_board.py). Read it *before* :meth:`list`; equal later:
        nothing routed by changed. Microseconds, never waits; compare for
        equality only."""
        return (self._routes.version, self._actors.views.version)

    def wait_for(
        self,
        instance_id: str,
        predicate: Callable[[InstanceView], bool],
        timeout_s: float,
        *,
        poll_s: float = 0.05,
    ) -> InstanceView:
        """Poll ``status`` until ``predicate`` holds (real time, ``timeout_s`` seconds).

        Raises:
            VerbTimeout: naming the last state seen.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            view = self.status(instance_id)
            if predicate(view):
                return view
            if time.monotonic() >= deadline:
                raise VerbTimeout(
                    f"{instance_id}: condition not met in {timeout_s:g} s "
                    f"(now {view.lifecycle}: {view.reason})"
                )
            time.sleep(poll_s)

    def settled(self, instance_id: str) -> bool:
        """True when no probe or termination of the instance is in flight.

        Raises:
            UnknownInstance, InvalidState: no such instance, or it is being unloaded.
        """
        ref = self._ref(instance_id)
        # The supervisor first: once it answers, every tick it handled before has been
        # told to the instance, whose mailbox then holds it ahead of this question.
        self._supervisor.ask(m.IsSettled(), timeout=ASK_TIMEOUT_S)
        answer: bool = self._ask(ref, m.IsSettled())
        return answer

    def rebuild(self) -> NodeState:
        """The node state replayed from the chain file alone."""
        return rebuild(self.settings.chain_path)

    def live_states(self) -> dict[str, Any]:
        """Each routed instance actor's sourced state (for comparing with :meth:`rebuild`)."""
        refs = self._routes.current.refs
        return {iid: ref.proxy().state.get(timeout=ASK_TIMEOUT_S) for iid, ref in refs.items()}

    # ------------------------------------------------------------------ metrics
    def append_latency(self) -> LatencySnapshot:
        """The chain writer's group-commit latency histogram, read now without
        asking the writer: (bucket upper bounds in seconds, cumulative count at
        or below each bound, count of transactions, their total in seconds).

        Each observation is one transaction, from ``BEGIN`` to ``COMMIT`` done.
        All zeros when the node was started without the histogram.
        """
        latency = self._actors.commit_latency
        if latency is None:
            return CommitLatency().snapshot()
        return latency.snapshot()

    def append_status(self) -> AppendStatus:
        """Whether the chain takes appends now, read without asking the writer
        (which may be waiting on another process's write lock): ``writable``,
        the last ``error``, ``since_ns`` (when the refusals began, ns since the
        epoch, UTC) and the count of failed append transactions. While the
        chain refuses writes, instances keep their observations waiting (in
        order) and refuse verbs with ``RecordFailed``.
        """
        health = self._actors.append_health
        return AppendStatus(True, None, None, 0) if health is None else health.snapshot()

    def witness_lag(self) -> builtins.list[WitnessLag]:
        """Each configured witness as the node sees it now (configuration order;
        [] without witnesses), read without asking any actor: the size it last
        cosigned, the node's latest checkpoint size, events behind, its last
        error and last success (ns since the epoch, UTC)."""
        witnessing = self._actors.witnessing
        return [] if witnessing is None else witnessing.board.rows()

    # ------------------------------------------------------------------ plumbing
    def _ref(self, instance_id: str) -> pykka.ActorRef[Any]:
        """The instance's actor, from the routes the host published (never asks it)."""
        return self._routes.current.lookup(instance_id)

    def _refs(self) -> builtins.list[pykka.ActorRef[Any]]:
        return list(self._routes.current.refs.values())

    @staticmethod
    def _ask(ref: pykka.ActorRef[Any], msg: Any) -> Any:
        return ref.ask(msg, block=True, timeout=ASK_TIMEOUT_S)
