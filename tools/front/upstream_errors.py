"""The errors of the front's upstream client (:mod:`.upstream`, :mod:`.pipe`).

The tree::

    UpstreamError               the server cannot be reached or did not answer
     +-- UpstreamRefused        no connection could be made (nothing listens)
     +-- UpstreamDropped        the connection closed before the answer's head
     +-- UpstreamTimeout        no connection, answer or next piece in time
"""

from __future__ import annotations

__all__ = ["UpstreamDropped", "UpstreamError", "UpstreamRefused", "UpstreamTimeout"]


class UpstreamError(Exception):
    """The server cannot be reached, or its answer failed (the cause's text)."""


class UpstreamRefused(UpstreamError):
    """No connection could be made to the server."""


class UpstreamDropped(UpstreamError):
    """The server closed the connection without answering (a kept-alive one
    closed under the request, which may be sent again on another)."""


class UpstreamTimeout(UpstreamError):
    """The server did not accept, answer or send the next piece in time."""
