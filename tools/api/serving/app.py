"""The control API's Litestar app, one actor message per verb.

Litestar is the framework: it takes msgspec Structs as bodies natively (the
node's own types, validated by msgspec on the way in) and generates the
OpenAPI 3.1 document from the same types (docs/openapi.json, tools/api/openapi.py).
The routes are controllers, one per resource (tools/api/serving/); each is
given the shared context and the node as Litestar dependencies
(tools/api/context.py). Handlers are synchronous and run on Litestar's worker
threads, since each one waits for an actor's answer; the event stream is
asynchronous on the server's loop.

Every answer that changes state is sent once the verb's events are durable
and carries the seq and hash of the instance's last event then
(:class:`~.wire.VerbAnswer`). Authentication, strict bodies and idempotency
are ASGI middleware around the app (tools/api/middleware.py).
"""

from __future__ import annotations

from litestar import Litestar
from litestar._openapi.plugin import OpenAPIPlugin
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi.spec import OpenAPI
from litestar.plugins import PluginProtocol
from litestar.plugins.core import MsgspecDIPlugin

from ..context import STATE_KEY, ApiContext, provide_api, reading
from ..openapi import amend, openapi_config
from ..refusals import EXCEPTION_HANDLERS
from . import CONTROLLERS

__all__ = ["build_app"]


class _App(Litestar):
    """Litestar with only the plugin our types need (msgspec's).

    Litestar adds its pydantic and attrs plugins whenever those libraries are
    installed (``Litestar._get_default_plugins``, litestar/app.py): importing
    them cost the node 0.3 s of CPU at each start, for types the API never
    uses (its bodies are msgspec Structs). Should Litestar rename that hook,
    this override goes unused and the node only starts slower again.
    """

    @staticmethod
    def _get_default_plugins(plugins: list[PluginProtocol]) -> list[PluginProtocol]:
        return [*plugins, MsgspecDIPlugin()]


def build_app(ctx: ApiContext) -> Litestar:
    """The Litestar app for ``ctx``: ``api`` is ``ctx`` and ``node`` the node admitted
    for a read (a verb's route admits it for a change instead)."""
    app = _App(
        route_handlers=list(CONTROLLERS),
        dependencies={
            "api": Provide(provide_api, sync_to_thread=False),
            "node": Provide(reading),
        },
        state=State({STATE_KEY: ctx}),
        openapi_config=openapi_config(),
        exception_handlers=EXCEPTION_HANDLERS,
        logging_config=None,
        debug=False,
    )
    app.plugins.get(OpenAPIPlugin).__class__ = _AmendedOpenAPI
    return app


class _AmendedOpenAPI(OpenAPIPlugin):
    """Litestar's OpenAPI plugin, whose document is amended (:func:`..openapi.amend`)
    when it is first built: on the first request for /schema/openapi.json, or
    ``app.openapi_schema``. Built at every node start, it cost 50 ms of CPU that
    almost no run uses. Litestar builds the document only in ``_build_openapi``
    (litestar/_openapi/plugin.py, also called by ``update_openapi_schema``); the
    class is swapped on the app's own instance (same slots), since the app makes
    it. Should Litestar rename the method, the document is served unamended, and
    the test of docs/openapi.json against the served one fails."""

    __slots__ = ()

    def _build_openapi(self) -> OpenAPI:
        document = super()._build_openapi()
        amend(document)
        return document
