"""The front's refusals, in OpenAI's error shape.

Every answer the front makes itself (not a server's) is
``{"error": {"message", "type", "code", "param"}}`` (OpenAI's API reference,
"Error codes"; the shape its official clients parse into ``APIStatusError``).
``type`` is OpenAI's class of error for the status: ``invalid_request_error``
(400, 404), ``authentication_error`` (401), ``server_error`` (5xx);
``code`` is the front's own reason (``model_not_found``, ``queue_full``, a
:class:`~infervisor.actors.errors.NotResident` code...); ``param`` names the
field at fault, or null.

The tree::

    FrontError             status, message, type, code, param, headers
"""

from __future__ import annotations

import math

import msgspec

__all__ = ["ErrorDetail", "ErrorEnvelope", "FrontError", "error_type", "retry_after"]

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
}


def error_type(status: int) -> str:
    """OpenAI's ``type`` for an HTTP status (``server_error`` for 5xx and anything unlisted)."""
    return _TYPES.get(status, "server_error")


class ErrorDetail(msgspec.Struct, frozen=True):
    """The ``error`` object."""

    message: str
    type: str
    code: str
    param: str | None = None


class ErrorEnvelope(msgspec.Struct, frozen=True):
    """``{"error": {...}}``."""

    error: ErrorDetail


def retry_after(seconds: float) -> str:
    """A ``Retry-After`` value: whole seconds, rounded up, at least 1 (RFC 9110 10.2.3)."""
    return str(max(1, math.ceil(seconds)))


class FrontError(Exception):
    """A request the front answers itself with an error.

    Attributes:
        status: the HTTP status.
        code: the front's reason (``model_not_found``, ``queue_full``...).
        param: the request field at fault, or None.
        headers: extra response headers (``Retry-After``, ``WWW-Authenticate``).
    """

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> bytes:
        """The JSON body, in OpenAI's error shape."""
        detail = ErrorDetail(self.message, error_type(self.status), self.code, self.param)
        return msgspec.json.encode(ErrorEnvelope(detail))
