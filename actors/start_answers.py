"""The answers a start that makes room gets from an instance's actor
(actors/node_residency.py): asked, taken as a future, its refusal for memory
told apart, and awaited until the instance serves."""

from __future__ import annotations

import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import pykka

from infervisor.replay.views import InstanceView

from .core import observations as o
from .errors import InvalidState, NotResident
from .ledger import BudgetExceeded
from .node_boot import ASK_TIMEOUT_S

__all__ = ["ask", "own_refusal", "ready", "recorded", "started"]


def ask(ref: pykka.ActorRef[Any], msg: Any) -> Any:
    """Ask an instance's actor, waiting up to ASK_TIMEOUT_S."""
    return ref.ask(msg, block=True, timeout=ASK_TIMEOUT_S)


def started(ref: pykka.ActorRef[Any], asked: Any) -> Future[Any] | None:
    """Ask for the start (a demand, or a start or restart verb with ``room``); its
    answer, or None when the start does not fit (no room). The start's memory
    check runs in the decision, so a refusal is known at once.

    Raises:
        NotResident: stopped or failed (a demand's refusal); a verb's refusals.
    """
    try:
        answer = _as_future(ask(ref, asked))
    except BudgetExceeded:  # a start verb's: answered at once, not recorded
        return None
    if answer.done() and isinstance(answer.exception(), BudgetExceeded):
        return None
    if answer.done() and answer.exception() is not None:
        answer.result()  # raises it
    return answer


def own_refusal(ref: pykka.ActorRef[Any], asked: Any) -> Future[Any]:
    """The start asked once more, where the room planner sees room that the start
    does not find: its size changed between the plan's read and the start's (an
    Ollama model pulled again meanwhile), so no eviction was planned for it. Its
    answer if it fits now, else its own refusal, with its numbers.

    Raises:
        BudgetExceeded: a verb's (the API's 422 ``no_room``).
        NotResident: ``no_room``, a demand's, with the same message.
    """
    answer = _as_future(ask(ref, asked))  # a verb's BudgetExceeded is raised here
    refusal = answer.exception() if answer.done() else None
    if isinstance(refusal, BudgetExceeded):
        raise NotResident(str(refusal), code="no_room", retry_after_s=5.0) from refusal
    return answer


def recorded(asked: Any) -> Any:
    """The start to ask once more when the planner sees room the start does not
    find: a node's own start is asked to record its refusal (there is nothing
    to evict for it); any other is asked as it was."""
    if isinstance(asked, o.StartAgain):
        return o.StartAgain(by=asked.by, record=True)
    return asked


def _as_future(answer: Any) -> Future[Any]:
    """A demand's answer is a future already; a start verb's is its view."""
    if isinstance(answer, Future):
        return answer
    done: Future[Any] = Future()
    done.set_result(answer)
    return done


def ready(iid: str, answer: Future[InstanceView], deadline: float, wait_s: float) -> InstanceView:
    """The view once the instance serves.

    Raises:
        NotResident: it did not become ready in time, or will not by itself.
    """
    try:
        view = answer.result(timeout=max(0.0, deadline - time.monotonic()))
    except FutureTimeout:
        raise NotResident(
            f"{iid}: not ready within {wait_s:g} s (its start-up deadline); it goes on starting",
            code="start_timeout",
            retry_after_s=5.0,
        ) from None
    if view is None:
        raise InvalidState(f"{iid} was unloaded while it was demanded")
    if view.lifecycle == "running":
        return view
    code = "failed" if view.lifecycle == "failed" else "stopped"
    raise NotResident(
        f"{iid} is {view.lifecycle} and will not serve: {view.reason}",
        code=code,
        retry_after_s=0.0,
    )
