"""Which instance serves a request's ``model``: the front's routing table.

A request names a model as its clients know it; an instance answers to:

- the name its server serves the model under: the registry name (llama.cpp is
  started with ``--alias <name>``; mlx-lm and adopted servers are asked for it),
  and for Ollama also the tag Ollama knows it by (``ollama_tag``; ``name`` and
  ``name:latest`` are the same model to Ollama);
- its role (``chat``, ``embed``);
- its instance id (``chat-1a2b3c4d-node``: the ``id`` ``GET /v1/models`` lists,
  the one name that picks one instance among several serving one model).

An instance id wins over a served name, and a served name over a role. Among
several instances answering to one name, the one most likely to serve the
request is taken (:func:`rank`): one running now, then one starting or coming
back, then one a request may start (resting: evicted, expired or on demand),
and only then one an operator or controller stopped, or a failed one (which
the node refuses to start for a request: 503 ``stopped`` or ``failed``); the
first by id among equals.

The table is a snapshot of :meth:`Node.list` (every instance's view) and the
registry; :class:`RouteTable` is immutable and built off the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from infervisor.adapters.proc.errors import AdapterError
from infervisor.replay.views import InstanceView

from ..api.json_words import shown
from .errors import FrontError

__all__ = ["Route", "RouteTable", "ollama_names", "rank"]

#: The lifecycle state in which a server answers requests.
READY = "running"
#: Up or on its way back under the supervisor: a demand waits for it
#: (actors/core/residency.py ``_UP``, ``_COMING_BACK``).
_COMING = frozenset({"starting", "restarting", "unhealthy"})
#: Where an instance that is not wanted running was stopped (by an operator, a
#: controller or a drain), or placed without a start (``loaded``): a request does
#: not start it (``_not_for_a_request`` there).
_HELD = frozenset({"stopped", "exited", "finished", "stopping", "loaded"})


def rank(view: InstanceView) -> int:
    """How likely ``view``'s instance is to serve a request now, best first: 0
    running, 1 starting or coming back (the wait is for it), 2 startable by a
    request (resting, or anything else the node's demand would start), 3 stopped
    by an operator or controller, or placed without a start, 4 failed (both
    refused to a request)."""
    wanted = view.desired == READY
    if view.lifecycle == READY:
        return 0
    if view.lifecycle in _COMING or (view.lifecycle == "exited" and wanted):
        return 1
    if view.lifecycle == "failed":
        return 4
    if view.lifecycle in _HELD and not wanted:
        return 3
    return 2


def ollama_names(tag: str) -> tuple[str, ...]:
    """The names Ollama takes for ``tag``: itself, and ``name``/``name:latest`` alike."""
    if ":" not in tag:
        return (tag, f"{tag}:latest")
    if tag.endswith(":latest"):
        return (tag, tag.removesuffix(":latest"))
    return (tag,)


@dataclass(frozen=True)
class Route:
    """One placed instance as the front routes to it.

    Attributes:
        view: the instance's view when the table was built.
        served: the model name its server answers to (the one sent upstream);
            None when the instance names no model (an adopted server).
        names: every name a request may use for it, the role last.
    """

    view: InstanceView
    served: str | None
    names: tuple[str, ...]

    @property
    def instance_id(self) -> str:
        return self.view.instance_id

    @property
    def base_url(self) -> str:
        """The server's ``http://host:port``."""
        return self.view.endpoint.rstrip("/")

    @property
    def ollama(self) -> bool:
        return self.view.flavor == "ollama"

    @property
    def ready(self) -> bool:
        """Running when the table was built (a stale answer is caught at connect)."""
        return self.view.lifecycle == READY


@dataclass(frozen=True)
class RouteTable:
    """Every placed instance's :class:`Route`, and the names that reach them."""

    routes: tuple[Route, ...] = ()
    _by_id: dict[str, Route] = field(default_factory=dict)
    _by_name: dict[str, tuple[Route, ...]] = field(default_factory=dict)
    _by_role: dict[str, tuple[Route, ...]] = field(default_factory=dict)

    @classmethod
    def build(cls, views: Iterable[InstanceView], tag_of: Callable[[str], str]) -> RouteTable:
        """The table of ``views``; ``tag_of(registry name)`` is an Ollama model's tag."""
        routes = tuple(_route(view, tag_of) for view in sorted(views, key=_order))
        by_name: dict[str, list[Route]] = {}
        by_role: dict[str, list[Route]] = {}
        for route in routes:
            for name in route.names[:-1]:
                by_name.setdefault(name, []).append(route)
            by_role.setdefault(route.view.role, []).append(route)
        return cls(
            routes,
            {route.instance_id: route for route in routes},
            {k: tuple(v) for k, v in by_name.items()},
            {k: tuple(v) for k, v in by_role.items()},
        )

    def find(
        self, model: str, *, ollama_only: bool = False, embeddings: bool = False
    ) -> Route | None:
        """The instance for ``model`` (an instance id, a served name, else a role), or
        None; with ``embeddings`` (``/v1/embeddings``), one placed with ``embeddings
        = true`` among the best ranked, else the first of them by id."""
        by_id = self._by_id.get(model)
        if by_id is not None and (by_id.ollama or not ollama_only):
            return by_id
        for table in (self._by_name, self._by_role):
            found = [r for r in table.get(model, ()) if r.ollama or not ollama_only]
            if found:  # the best ranked first (the table is in that order)
                best = rank(found[0].view)
                equals = (r for r in found if rank(r.view) == best and r.view.embeddings)
                return next(equals, found[0]) if embeddings else found[0]
        return None

    def refuse_unknown(self, model: str, *, ollama_only: bool = False) -> FrontError:
        """The 404 for a ``model`` no instance answers to, naming the ones there are
        (or, on Ollama's own routes, naming the instance of another flavor that
        ``model``, an instance id, a served name or a role, reaches on ``/v1/...``)."""
        other = self.find(model) if ollama_only else None  # of another flavor
        if other is not None:
            flavor = f"{_FLAVORS.get(other.view.flavor, 'an')} instance"
            if model == other.instance_id:
                what = f"instance {shown(model)} is {flavor}"
            else:
                what = f"model {shown(model)} is served by {flavor} ({other.instance_id})"
            return FrontError(
                404,
                f"{what}; Ollama's own routes (/api/...) reach only Ollama instances: "
                "send it to /v1/...",
                "model_not_found",
                param="model",
            )
        names = sorted(
            {n for r in self.routes if r.ollama or not ollama_only for n in r.names[:1]}
            | {r.view.role for r in self.routes if r.ollama or not ollama_only}
        )
        there = ", ".join(names) or "none"
        what = "Ollama model" if ollama_only else "model"
        return FrontError(
            404,
            f"the {what} {shown(model)} is served by no instance of this node; "
            f"models (served names and roles; or an instance id, GET /v1/models): {there}",
            "model_not_found",
            param="model",
        )


#: Each flavor as a message names it.
_FLAVORS = {"llamacpp": "a llama.cpp", "mlx-lm": "an mlx-lm", "ollama": "an Ollama"}


def _order(view: InstanceView) -> tuple[int, str]:
    return (rank(view), view.instance_id)


def _route(view: InstanceView, tag_of: Callable[[str], str]) -> Route:
    names: list[str] = []
    served = view.model
    if view.model:
        names.append(view.model)
        if view.flavor == "ollama":
            try:
                served = tag_of(view.model)
            except (AdapterError, OSError):
                served = view.model  # adopted: the name given is Ollama's
            names.extend(n for n in ollama_names(served) if n not in names)
    names.append(view.role)
    return Route(view, served, tuple(names))
