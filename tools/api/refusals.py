"""The app's exception handlers: every failure of a request becomes one
:class:`~.wire.ErrorEnvelope` with its status (tools/api/errors.py maps the
node's exceptions), never Litestar's own error body or a traceback.
"""

from __future__ import annotations

import logging
from typing import Any

import pykka
from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.types import ExceptionHandlersMap

from .answers import answer_for
from .context import provide_api
from .errors import ApiError, NodeStopping
from .gate import Phase
from .strict import ALLOWED
from .wire import API_VERSION, ErrorBody, ErrorEnvelope

__all__ = ["EXCEPTION_HANDLERS"]

log = logging.getLogger(__name__)


def _error_response(status: int, error: ErrorBody) -> Response[ErrorEnvelope]:
    return Response(ErrorEnvelope(error=error), status_code=status, media_type=MediaType.JSON)


def _on_error(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorEnvelope]:
    status, body = answer_for(exc)
    if body.code == "node_error" and not isinstance(exc, ApiError):  # a bug: keep its traceback
        log.error("control API: %s %s failed", request.method, request.url.path, exc_info=exc)
    return _error_response(status, body)


def _on_dead_actor(
    request: Request[Any, Any, Any], exc: pykka.ActorDeadError
) -> Response[ErrorEnvelope]:
    """An actor that ended mid-request: the node shut down (503), or the instance was
    unloaded meanwhile (409)."""
    if provide_api(request.app.state).gate.phase is not Phase.OPEN:
        named: ApiError = NodeStopping("the node shut down before answering", "node_stopping", 503)
    else:
        named = ApiError(
            "the instance's actor ended during the verb (unloaded meanwhile?)",
            "invalid_state",
            409,
        )
    return _on_error(request, named)


def _on_validation(_: Request[Any, Any, Any], exc: ValidationException) -> Response[ErrorEnvelope]:
    problems = exc.extra if isinstance(exc.extra, list) else []
    first = problems[0] if problems and isinstance(problems[0], dict) else {}
    key = str(first.get("key") or "") or None
    if key in (None, "data"):
        key = "body"  # Litestar's name for the request body
    message = str(first.get("message") or exc.detail)
    allowed = ALLOWED.get(key or "")
    if allowed and "allowed" not in message:
        message += f"; allowed: {allowed}"
    code = "bad_spec" if key and key.startswith("spec.") else "bad_request"
    where = f"{key}: " if key else ""
    return _error_response(400, ErrorBody(code=code, message=where + message, field=key))


def _on_http(_: Request[Any, Any, Any], exc: HTTPException) -> Response[ErrorEnvelope]:
    codes = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
    code = codes.get(exc.status_code, "bad_request")
    message = str(exc.detail)
    if exc.status_code == 404:
        message += f"; the routes are under /{API_VERSION}/ (GET /schema/openapi.json lists them)"
    return _error_response(exc.status_code, ErrorBody(code=code, message=message))


#: Most specific class first is Litestar's own rule (it walks the exception's MRO).
EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    ValidationException: _on_validation,
    HTTPException: _on_http,
    pykka.ActorDeadError: _on_dead_actor,
    Exception: _on_error,
}
