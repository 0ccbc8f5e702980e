"""The chain's events as a resource: one Server-Sent Events stream of them,
from a seq or the head on (the HTML Living Standard's EventSource: ``id`` is
the seq, so a client's ``Last-Event-ID`` resumes after it)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Annotated

import msgspec
from litestar import Controller, get
from litestar.di import NamedDependency
from litestar.params import HeaderParameter, QueryParameter
from litestar.response import ServerSentEvent, ServerSentEventMessage

from ..context import ApiContext, last_of, require_open
from ..errors import ApiError
from ..openapi import responses, text
from ..watch import stream_events
from .params import PREFIX

__all__ = ["MAX_SEQ", "EventController"]

#: The largest seq a request may name (SQLite's INTEGER is 64-bit).
MAX_SEQ = 2**63 - 2

_STREAM = text(
    "text/event-stream",
    "Server-Sent Events: `id` = seq, `event` = kind, `data` = one WatchEvent "
    "(#/components/schemas/WatchEvent) as JSON; `: keep-alive` comments while idle.",
)


class EventController(Controller):
    """``GET /v1/events``."""

    path = f"{PREFIX}/events"

    @get(operation_id="watchEvents", responses={200: _STREAM, **responses()})
    async def watch_events(
        self,
        api: NamedDependency[ApiContext],
        from_seq: Annotated[
            int | None, QueryParameter(ge=0, le=MAX_SEQ, description="First seq to send.")
        ] = None,
        follow: Annotated[bool, QueryParameter(description="Keep sending new events.")] = True,
        last_event_id: Annotated[
            str | None,
            HeaderParameter(
                name="Last-Event-ID",
                required=False,
                description="The seq of the last event seen: the stream resumes after it "
                "(from_seq wins when both are given).",
            ),
        ] = None,
    ) -> ServerSentEvent:
        """Chain events as Server-Sent Events (``id`` = seq, ``event`` = kind,
        ``data`` = :class:`WatchEvent` JSON), from ``from_seq`` or one past the
        ``Last-Event-ID`` header, else from the head on."""
        require_open(api)
        start = _resume_from(last_event_id, from_seq, api)

        async def messages() -> AsyncIterator[ServerSentEventMessage]:
            async for item in stream_events(api.chain_path, api.hub, start, follow=follow):
                if item is None:
                    yield ServerSentEventMessage(comment="keep-alive", data=None)
                    continue
                yield ServerSentEventMessage(
                    data=msgspec.json.encode(item).decode(), event=item.kind, id=str(item.seq)
                )

        return ServerSentEvent(messages())


def _resume_from(last: str | None, from_seq: int | None, api: ApiContext) -> int:
    """The first seq to send: ``from_seq``, one past ``Last-Event-ID``, else past the head.

    Raises:
        ApiError: 400 ``bad_value``: ``Last-Event-ID`` is not a seq.
    """
    if from_seq is not None:
        return from_seq
    if last is not None:
        if not re.fullmatch(r"[0-9]{1,18}", last.strip()):
            raise ApiError(
                f"Last-Event-ID {last!r}: expected the seq of the last event seen",
                "bad_value",
                400,
                "Last-Event-ID",
            )
        return int(last) + 1
    return last_of(api.chain_path)[0] + 1
