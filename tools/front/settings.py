"""``[front]``: the node's OpenAI-compatible endpoint, as the config file sets it.

Only msgspec here: the config loader imports this module, and the command
line stays light (the server is :mod:`.server`).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

__all__ = ["DEFAULT_QUEUE_LIMIT", "FrontConfig"]

#: Requests that may wait per instance while it loads, unless ``queue_limit`` says.
DEFAULT_QUEUE_LIMIT = 64


class FrontConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``[front]``: one OpenAI-compatible endpoint for every instance of the node
    (docs/front.md).

    Attributes:
        listen: ``HOST:PORT`` of the endpoint (IPv6 as ``[::1]:PORT``); loopback
            unless ``allow_non_loopback``.
        allow_non_loopback: allow ``listen`` beyond loopback (every request still
            needs a token).
        queue_limit: requests that may wait per instance while it is started or
            loads (1-65536); one more is answered 503 ``queue_full`` with
            ``Retry-After``.
        max_connections: client connections open at once (1-65536; each holds at
            most one request); one more takes the place of the oldest that has
            not sent a whole request head, else of the oldest idle kept-alive
            one; when each has a request in flight it is answered 503
            ``too_many_connections`` with ``Retry-After`` and closed (as the
            control API's listeners: tools/api/limits.py).
        upstream_timeout_s: seconds to wait for a server's answer to start, and
            between two pieces of a stream (a generation that stalls that long is
            ended: 504 before its first byte).
        stream_flush_interval_s: after a stream's first token, the server's socket
            is read at most once this often (seconds, 0-1; 0: each piece passes
            the moment it comes): the pieces sent meanwhile go to the client in
            one write. 5 ms holds a token at most 5 ms and, for a model faster than
            200 tokens a second a stream, spares the node and the client a
            wake-up per token (tools/front/pipe.py; bench/README.md).
    """

    listen: str
    allow_non_loopback: bool = False
    queue_limit: Annotated[int, msgspec.Meta(ge=1, le=65536)] = DEFAULT_QUEUE_LIMIT
    max_connections: Annotated[int, msgspec.Meta(ge=1, le=65536)] = 1024
    upstream_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=86400)] = 600.0
    stream_flush_interval_s: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.005
