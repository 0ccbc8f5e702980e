"""Forwarding one request to the instance that serves its model.

Per request: find the route (:mod:`.routes`), make sure the instance is ready
(``Node.demand``, on a worker thread, skipped when the table saw it running),
tell the node the request began (``Node.request_began``: :mod:`.told`, those of
one event-loop turn at once), send it upstream, pass the answer back as it
arrives, and tell the node it ended.

- **Waiters.** Requests for an instance that is not ready share one demand
  (one worker thread per instance, however many wait); at most
  ``queue_limit`` wait per instance, one more is answered 503 ``queue_full``.
  A refusal of the node (:class:`~infervisor.actors.errors.NotResident`) is a
  503 with ``Retry-After`` from its ``retry_after_s``.
- **A current table.** The table is built again, the request waiting, whenever
  the node's views version changed since it was built (``Node.views_version``:
  an instance placed, unloaded, started, stopped, evicted...), so a request
  routes by the states of the moment. An instance that changes between the
  check and the connection still refuses it, and the request then goes
  through the demand once; a demand refused ``stopped`` or ``failed`` for a
  request that named a served name or a role routes once more, on a fresh
  table, before the 503 (another instance may serve the name).
- **Streams.** Bytes pass through unchanged, as they arrive (what arrived
  together goes on together); the next is sent only once the client took the
  last (backpressure: uvicorn's ``send`` waits while the client's socket is
  full, and the upstream connection stops reading while 64 pieces wait:
  :mod:`.upstream`, so the server's socket fills and it waits). A client that
  goes away (``http.disconnect``) cancels the request, which closes the
  server's connection: llama-server and Ollama stop generating.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pykka

from infervisor.actors.errors import NodeError, NotResident, UnknownInstance
from infervisor.adapters.ollama_keep_alive import spec_keep_alive
from infervisor.adapters.proc.errors import AdapterError

from .bodies import KEEP_ALIVE_ROUTES, Asked, rewritten
from .errors import FrontError, retry_after
from .pipe import ClientSocket, client_socket, cut_off
from .routes import Route, RouteTable, ollama_names
from .tally import FrontTally
from .told import Told
from .upstream import (
    Answer,
    UpstreamDropped,
    UpstreamError,
    UpstreamRefused,
    Upstreams,
    UpstreamTimeout,
)
from .usage import StreamCounter, usage_of

if TYPE_CHECKING:
    from infervisor.actors.node import Node
    from infervisor.replay.views import InstanceView

__all__ = ["Proxy"]

log = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]

#: The node's refusals of an instance held so until an operator acts: no ``Retry-After``.
HELD_CODES = frozenset({"stopped", "failed"})
#: Their answer's header instead: OpenAI's SDKs retry a 503 unless told not to
#: (``x-should-retry: false``, read by openai-python's ``_should_retry``).
_NO_RETRY = {"x-should-retry": "false"}
#: ``Retry-After`` of a full queue, seconds.
QUEUE_FULL_RETRY_S = 2.0
#: Tries to send a request upstream: a kept-alive connection closed under it, or a
#: refused one to an instance seen running (then demanded), is tried again.
_ATTEMPTS = 3
#: Bytes of a whole (not streamed) answer kept to read its usage.
USAGE_BODY_MAX = 1 << 20
#: Request headers sent on to the server (the client's credentials never are).
_FORWARDED = frozenset({b"content-type", b"accept", b"accept-encoding", b"user-agent"})
#: Response headers not passed back (hop-by-hop, RFC 9110 7.6.1, and the server's own).
_DROPPED = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"date",
        b"server",
    }
)
_STREAMED = (b"text/event-stream", b"application/x-ndjson")


class Proxy:
    """The routing table, the waiters and the upstream clients of one front.

    Event loop thread only, apart from the worker threads it runs node calls on.
    """

    def __init__(
        self,
        node: Node,
        *,
        queue_limit: int,
        upstream_timeout_s: float,
        stream_flush_interval_s: float = 0.0,
    ) -> None:
        self.node = node
        self.queue_limit = queue_limit
        self.tally = FrontTally()
        self.told = Told(node)
        self.upstreams = Upstreams(upstream_timeout_s, stream_flush_interval_s)
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="infervisor-front")
        self._table = RouteTable()
        #: The node's views version when the table was built (None: build it again).
        self._version: tuple[int, int] | None = None
        self._building: asyncio.Future[tuple[RouteTable, tuple[int, int] | None]] | None = None
        self._pending: dict[str, asyncio.Future[InstanceView]] = {}
        self._waiting: Counter[str] = Counter()

    # ------------------------------------------------------------ the table
    async def table(self, *, fresh: bool = False) -> RouteTable:
        """The routing table, never older than the instances' states it routes by:
        built again (this call waiting) when ``fresh``, when there is none yet, or
        when the node's :meth:`~infervisor.actors.node_views.NodeViews.views_version`
        changed since it was built (a check of microseconds per request; a build
        of 1,000 instances takes a few ms and follows a change only).

        Raises:
            FrontError: 503 ``unavailable`` when the node cannot list its instances.
        """
        for _ in range(2):  # the second build began after this call: it saw the version read
            if not fresh and self._version is not None and self._version == self._current():
                return self._table
            await self._rebuild()
            fresh = False
        return self._table

    def _current(self) -> tuple[int, int] | None:
        try:
            return self.node.views_version()
        except (NodeError, pykka.ActorDeadError) as e:  # pragma: no cover - never raises
            log.warning("front: the node's views version cannot be read: %s", e)
            return None

    async def _rebuild(self) -> RouteTable:
        """A table built afresh (one build at a time, shared).

        Raises:
            FrontError: 503 ``unavailable`` when the node cannot list its instances.
        """
        building = self._building
        if building is None:
            loop = asyncio.get_running_loop()
            building = self._building = loop.run_in_executor(self._pool, self._build)
            building.add_done_callback(self._built)
        try:
            table, _ = await asyncio.shield(building)
            # taken now: the callback may run after this task resumes (uvloop's order)
            self._built(building)
        except (NodeError, AdapterError, OSError, pykka.ActorDeadError, pykka.Timeout) as e:
            raise FrontError(
                503,
                f"the node cannot list its instances now: {e}",
                "unavailable",
                headers={"Retry-After": retry_after(1.0)},
            ) from None
        return table

    def _build(self) -> tuple[RouteTable, tuple[int, int] | None]:
        """The table of the node's instances now, and the views version read before
        listing them (a change after that read is seen as a change)."""
        version = self._current()
        registry = self.node.registry
        return RouteTable.build(self.node.list(), lambda name: registry.entry(name).tag), version

    def _built(self, fut: asyncio.Future[tuple[RouteTable, tuple[int, int] | None]]) -> None:
        """Take a finished build's table (once: a later build's is never replaced)."""
        if self._building is not fut:
            return
        self._building = None
        if not fut.cancelled() and fut.exception() is None:
            self._table, self._version = fut.result()

    def stale(self) -> None:
        """Build the table afresh at its next use."""
        self._version = None

    async def route(self, asked: Asked, *, fresh: bool = False) -> Route:
        """The route of ``asked.model``; a miss looks again in a fresh table.

        Raises:
            FrontError: 404 ``model_not_found`` naming the models there are.
        """
        table = await self.table(fresh=fresh)
        found = table.find(asked.model, ollama_only=asked.ollama, embeddings=asked.embeddings)
        if found is None and not fresh:
            table = await self.table(fresh=True)
            found = table.find(asked.model, ollama_only=asked.ollama, embeddings=asked.embeddings)
        if found is None:
            raise table.refuse_unknown(asked.model, ollama_only=asked.ollama)
        return found

    # ------------------------------------------------------------ readiness
    async def ready(self, route: Route, model: str, by: str) -> str:
        """The base URL of ``route``'s instance once it is ready (waits while it loads).

        Raises:
            FrontError: 503 ``queue_full``, or the node's refusal (503 with its code
                and ``Retry-After``; 404 when the instance is gone).
        """
        iid = route.instance_id
        if self._waiting[iid] >= self.queue_limit:
            raise FrontError(
                503,
                f"{self._waiting[iid]} requests already wait for instance {iid} to load "
                f"(the node's [front] queue_limit is {self.queue_limit}): retry later",
                "queue_full",
                headers={"Retry-After": retry_after(QUEUE_FULL_RETRY_S)},
            )
        pending = self._pending.get(iid)
        if pending is None:
            call = functools.partial(
                self.node.demand,
                iid,
                request=f"front-{secrets.token_hex(6)}",
                model=model,
                by=by,
                timeout_s=None,
            )
            pending = asyncio.get_running_loop().run_in_executor(self._pool, call)
            self._pending[iid] = pending
            pending.add_done_callback(functools.partial(self._demanded, iid))
        self._waiting[iid] += 1
        self.tally.wait(iid, 1)
        try:
            view = await asyncio.shield(pending)
        except NotResident as e:
            # Stopped or failed: held so until an operator acts; a retry cannot help, so
            # none is invited, and OpenAI's SDKs are told not to retry on their own.
            held = e.code in HELD_CODES
            raise FrontError(
                503,
                f"instance {iid} ({model}): {e}",
                e.code,
                headers=dict(_NO_RETRY) if held else {"Retry-After": retry_after(e.retry_after_s)},
            ) from None
        except UnknownInstance:
            self.stale()
            raise (await self.table(fresh=True)).refuse_unknown(model) from None
        except (NodeError, AdapterError, pykka.ActorDeadError, pykka.Timeout) as e:
            raise FrontError(
                503,
                f"instance {iid} ({model}) cannot serve now: {e}",
                "unavailable",
                headers={"Retry-After": retry_after(1.0)},
            ) from None
        finally:
            self._waiting[iid] -= 1
            self.tally.wait(iid, -1)
        return view.endpoint.rstrip("/")

    def _demanded(self, iid: str, fut: asyncio.Future[InstanceView]) -> None:
        if self._pending.get(iid) is fut:
            del self._pending[iid]
        if not fut.cancelled() and fut.exception() is None:
            self.stale()  # the instance runs now: the table says otherwise

    # ------------------------------------------------------------ forwarding
    async def serve(
        self, scope: dict[str, Any], send: Send, *, asked: Asked, body: bytes, by: str
    ) -> None:
        """Route ``asked`` and :meth:`forward` it; when its instance is refused
        ``stopped`` or ``failed`` (stopped or failed since the table was built, or
        the best there is) and the request named a served name or a role, not
        that instance's id, route once more on a fresh table: another instance
        may serve the name now.

        Raises:
            FrontError: as :meth:`route` and :meth:`forward`.
        """
        route = await self.route(asked)
        try:
            await self.forward(scope, send, route=route, asked=asked, body=body, by=by)
        except FrontError as e:
            if e.code not in HELD_CODES or asked.model == route.instance_id:
                raise
            again = await self.route(asked, fresh=True)
            if again.instance_id == route.instance_id and not again.ready:
                raise
            await self.forward(scope, send, route=again, asked=asked, body=body, by=by)

    async def forward(
        self,
        scope: dict[str, Any],
        send: Send,
        *,
        route: Route,
        asked: Asked,
        body: bytes,
        by: str,
    ) -> None:
        """Send the request to ``route``'s instance and its answer back to the client.

        Raises:
            FrontError: the instance cannot be made ready, or its server cannot be
                reached (502) or does not answer in time (504), before any byte
                of the answer was sent.
        """
        iid = route.instance_id
        path = scope["path"]
        base = route.base_url if route.ready else await self._readied(route, asked, path, by)
        model = None
        if route.ollama and route.served and asked.model not in ollama_names(route.served):
            model = route.served  # asked by role or registry name
        keep_alive = self._keep_alive(route, path)
        if model is not None or keep_alive is not None:
            body = rewritten(body, model=model, keep_alive=keep_alive)
        headers = [(k, v) for k, v in scope["headers"] if k in _FORWARDED]
        if asked.stream and not route.ollama:
            # llama-server drops a connection kept alive after a stream (the next request
            # sent on it gets no answer): the stream's connection is not kept.
            headers.append((b"connection", b"close"))
        self.told.began(iid)
        self.tally.began(iid)
        status = 499  # the client went away before the server answered
        try:
            response = await self._open(
                route, asked=asked, base=base, path=path, headers=headers, body=body, by=by
            )
            try:
                status = response.status
                await self._pass_back(response, send, iid, scope)
            finally:
                await response.aclose()
        finally:
            self.told.ended(iid)
            self.tally.ended(iid, path, status)

    async def _readied(self, route: Route, asked: Asked, path: str, by: str) -> str:
        """:meth:`ready`, counting a client that goes away while it waits as a 499
        on the instance's route (nginx's "client closed request")."""
        try:
            return await self.ready(route, asked.model, by)
        except asyncio.CancelledError:
            self.tally.left(route.instance_id, path)
            raise

    def _keep_alive(self, route: Route, path: str) -> str | int | None:
        """The ``keep_alive`` a request on ``path`` carries to a managed Ollama
        instance: the one its loads carry (``spec_keep_alive`` of its
        ``idle_ttl_s`` and the node's ``ollama_keep_alive``), whatever the client
        sent, so a client can neither unload the model (``0``) nor pin it
        (``-1``) behind the node's back. None: the body goes as it is (not a
        managed Ollama instance, or a route that loads nothing)."""
        view = route.view
        if not route.ollama or view.mode != "managed" or path not in KEEP_ALIVE_ROUTES:
            return None
        return spec_keep_alive(view.idle_ttl_s, self.node.settings.ollama_keep_alive)

    async def _open(
        self,
        route: Route,
        *,
        asked: Asked,
        base: str,
        path: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        by: str,
    ) -> Answer:
        """The server's answer (its head; the body is streamed), once connected:
        a refused connection to an instance the table saw running is retried once
        after a demand (it was evicted or stopped since), and a kept-alive
        connection closed under the request once on a new one."""
        demanded = not route.ready
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                return await self.upstreams.send(base, "POST", path, headers, body)
            except UpstreamRefused as e:
                if demanded or attempt == _ATTEMPTS:
                    raise _unreachable(route, e) from None
                self.stale()
                base = await self.ready(route, asked.model, by)
                demanded = True
            except UpstreamDropped as e:
                # A kept-alive connection the server closed as it was reused (llama-server
                # does so now and then without saying so): again on another connection.
                if attempt == _ATTEMPTS:
                    raise _unreachable(route, e) from None
            except UpstreamTimeout as e:
                raise FrontError(
                    504,
                    f"instance {route.instance_id} did not answer in time ({e})",
                    "upstream_timeout",
                ) from None
            except UpstreamError as e:
                raise _unreachable(route, e) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def _pass_back(self, answer: Answer, send: Send, iid: str, scope: dict[str, Any]) -> None:
        headers = [(k, v) for k, v in answer.headers if k.lower() not in _DROPPED]
        headers.append((b"x-infervisor-instance", iid.encode()))
        await send({"type": "http.response.start", "status": answer.status, "headers": headers})
        streamed = answer.header(b"content-type").startswith(_STREAMED)
        sink = client_socket(send, scope) if streamed and answer.chunked else None
        if sink is not None:
            whole = await self._piped(answer, sink, iid)
        else:
            whole = await self._relayed(answer, send, iid, streamed)
        if whole:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:  # the client must not take a cut answer for a whole one
            cut_off(send)

    async def _relayed(self, answer: Answer, send: Send, iid: str, streamed: bool) -> bool:
        """The answer's body through ASGI messages, piece by piece (``streamed``: an
        event stream, its tokens counted as they pass); False when the server died
        or stalled mid-answer (:func:`_ended_early`)."""
        counter = StreamCounter() if streamed else None
        kept = bytearray()
        try:
            async with contextlib.aclosing(answer.chunks()) as chunks:
                async for chunk in chunks:
                    if counter is not None:
                        counter.feed(chunk)
                    elif len(kept) < USAGE_BODY_MAX:
                        kept += chunk
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UpstreamError as e:
            return _ended_early(iid, e)
        finally:  # also when the client went away: what was generated still counts
            usage = counter.close() if counter is not None else usage_of(bytes(kept))
            if usage is not None and answer.status < 400:
                self.tally.counted(iid, usage.prompt, usage.completion)
        return True

    async def _piped(self, answer: Answer, sink: ClientSocket, iid: str) -> bool:
        """A chunked stream to a chunked client: its bytes go from socket to socket
        (:mod:`.pipe`), its tokens counted by bytes; False when it ended early."""
        try:
            await answer.pipe(sink)
        except UpstreamError as e:
            return _ended_early(iid, e)
        finally:  # also when the client went away: what was generated still counts
            counter = answer.pipe_counter()
            if counter is not None and answer.status < 400:
                usage = counter.close()
                self.tally.counted(iid, usage.prompt, usage.completion)
        return True

    async def aclose(self) -> None:
        """Close the upstream clients and the worker threads (not waiting for them)."""
        self.told.flush()
        await self.upstreams.aclose()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _ended_early(iid: str, e: UpstreamError) -> bool:
    """The server died, stalled or broke its framing mid-answer (or the client went
    away): logged; the answer is not whole (False)."""
    log.warning("front: the answer of %s ended early: %s", iid, e)
    return False


def _unreachable(route: Route, e: Exception) -> FrontError:
    return FrontError(
        502,
        f"instance {route.instance_id} ({route.base_url}) cannot be reached: {e}",
        "upstream_unreachable",
    )


async def until_disconnect(receive: Receive) -> None:
    """Return when the client has gone away (the request's body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass
