"""What each caller may do: the scopes of the control API and the one table
that gives every route its scope.

Scopes are ordered, each covering the ones below it::

    read < infer < operate < control

- ``read``: what only looks (node, models, instances, status, ledger, the chain's
  events, its checkpoint, tiles and proofs, logs, metrics, the OpenAPI document).
- ``infer``: an application's inference through the OpenAI-compatible front
  (tools/front/): a request may start a resting instance and evict others for
  it, by the node's residency policy, but no verb of this API: an application
  token cannot stop, start, restart or unload an instance by name.
- ``operate``: the verbs on placed instances (start, stop, restart, unload)
  and the deep health check: it makes the model server generate a token, real
  work on the inference server (it competes with real requests), so a
  monitoring token that may only look may not drive it.
- ``control``: what a node controller does (placements and placement sets,
  heartbeats, cordon and drain, and any
  verb whose body names a ``controller``: it renews that controller's lease).

A bearer token's scope comes from the node's config (``[api] tokens``); a
peer of the Unix socket (the node's uid or root) holds ``control``. A request
the table does not list is for no route: once its caller is authenticated it
is answered 404 ``not_found`` (405 ``method_not_allowed`` when the path is
listed for other methods: :func:`methods_for`) whatever the caller's scope,
and never reaches the app (fails closed: a route the app had and the table
lacked would be answered 404, not served). A trial (stop 35) found it was
answered 403 "needs scope control" to a lower scope, as if the route existed.
``tests/test_api_scopes.py`` checks that every route of the app is in the table.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable

import msgspec

__all__ = [
    "ROUTE_SCOPES",
    "SCOPE_ORDER",
    "ApiToken",
    "Scope",
    "default_scope",
    "methods_for",
    "scope_for",
    "token_scopes",
]


class Scope(enum.StrEnum):
    """A token's scope; ``a.covers(b)`` when ``a`` may do what ``b`` may."""

    READ = "read"
    INFER = "infer"
    OPERATE = "operate"
    CONTROL = "control"

    @property
    def rank(self) -> int:
        """0 for read, 1 for infer, 2 for operate, 3 for control."""
        return list(Scope).index(self)

    def covers(self, needed: Scope) -> bool:
        """True when this scope may do what ``needed`` may."""
        return self.rank >= needed.rank


#: The scopes in order, as messages say it: each covers the ones before it.
SCOPE_ORDER = " < ".join(s.value for s in Scope)

#: The scope of a bare token name in ``[api] tokens`` (any other name: read).
_DEFAULT_SCOPES = {"operator": Scope.OPERATE, "controller": Scope.CONTROL}


def default_scope(name: str) -> Scope:
    """The scope of a token given by name only: ``operator`` operate,
    ``controller`` control, any other name read (least privilege)."""
    return _DEFAULT_SCOPES.get(name, Scope.READ)


class ApiToken(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A bearer token given with its scope (``[api] tokens``):
    ``{ name = "grafana", scope = "read" }``."""

    name: str
    scope: Scope


def token_scopes(tokens: Iterable[str | ApiToken]) -> dict[str, Scope]:
    """Each token's name and scope, in the order given (a bare name: :func:`default_scope`;
    a name given twice: the last)."""
    return {
        t.name if isinstance(t, ApiToken) else t: (
            t.scope if isinstance(t, ApiToken) else default_scope(t)
        )
        for t in tokens
    }


#: (method, route as docs/openapi.json writes it, scope needed). One row per route.
ROUTE_SCOPES: tuple[tuple[str, str, Scope], ...] = (
    ("GET", "/v1/node", Scope.READ),
    ("GET", "/v1/models", Scope.READ),
    ("GET", "/v1/instances", Scope.READ),
    ("GET", "/v1/instances/{instance_id}", Scope.READ),
    ("GET", "/v1/instances/{instance_id}/logs", Scope.READ),
    ("GET", "/v1/ledger", Scope.READ),
    ("GET", "/v1/events", Scope.READ),
    ("GET", "/v1/log/checkpoint", Scope.READ),
    ("GET", "/v1/log/key", Scope.READ),
    ("GET", "/v1/log/tile/{tile_path}", Scope.READ),
    ("GET", "/v1/log/proof/inclusion", Scope.READ),
    ("GET", "/v1/log/proof/consistency", Scope.READ),
    ("GET", "/metrics", Scope.READ),
    ("GET", "/schema/openapi.json", Scope.READ),
    ("POST", "/v1/instances/{instance_id}/start", Scope.OPERATE),
    ("POST", "/v1/instances/{instance_id}/stop", Scope.OPERATE),
    ("POST", "/v1/instances/{instance_id}/restart", Scope.OPERATE),
    ("POST", "/v1/instances/{instance_id}/unload", Scope.OPERATE),
    ("POST", "/v1/instances/{instance_id}/deep-health", Scope.OPERATE),
    ("POST", "/v1/instances", Scope.CONTROL),
    ("POST", "/v1/heartbeat", Scope.CONTROL),
    ("POST", "/v1/node/cordon", Scope.CONTROL),
    ("POST", "/v1/node/drain", Scope.CONTROL),
    ("POST", "/v1/node/uncordon", Scope.CONTROL),
    ("PUT", "/v1/placements", Scope.CONTROL),
)


def _pattern(route: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[^}]+\})", route)
    return re.compile(
        "".join(_PARAM.get(p, "[^/]+") if p.startswith("{") else re.escape(p) for p in parts)
    )


#: Path parameters that span several segments (Litestar's ``{name:path}``).
_PARAM = {"{tile_path}": "[^?#]+"}


_COMPILED = tuple((method, _pattern(route), scope) for method, route, scope in ROUTE_SCOPES)


def _route_path(path: str) -> str:
    """``path`` as the table matches it: a trailing slash names the same route, as
    Litestar routes it."""
    return path.rstrip("/") or "/"


def scope_for(method: str, path: str) -> Scope | None:
    """The scope a request needs: its row of :data:`ROUTE_SCOPES` (a trailing
    slash names the same route), else None: the API has no such route."""
    path, method = _route_path(path), method.upper()
    for row_method, pattern, scope in _COMPILED:
        if row_method == method and pattern.fullmatch(path):
            return scope
    return None


def methods_for(path: str) -> tuple[str, ...]:
    """The methods :data:`ROUTE_SCOPES` lists for ``path``, sorted (``()``: no route),
    for a 405's ``Allow``."""
    path = _route_path(path)
    return tuple(sorted({m for m, pattern, _ in _COMPILED if pattern.fullmatch(path)}))
