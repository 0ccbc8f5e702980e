"""The parameters several routes declare, with their OpenAPI descriptions."""

from __future__ import annotations

from typing import Annotated

from litestar.params import HeaderParameter, PathParameter

from ..wire import API_VERSION

__all__ = ["PREFIX", "IdempotencyKey", "InstanceId"]

#: Where the versioned routes are.
PREFIX = f"/{API_VERSION}"

InstanceId = Annotated[str, PathParameter(description="The instance's id (GET /v1/instances).")]
IdempotencyKey = Annotated[
    str | None,
    HeaderParameter(
        name="Idempotency-Key",
        required=False,
        max_length=255,
        description=(
            "Makes a retry safe (draft-ietf-httpapi-idempotency-key-header): the same "
            "key with the same request gets the first answer again, with "
            "`idempotent-replayed: true`; 409 while the first is in flight; 422 for a "
            "different request. At most 255 bytes; kept in the node's memory only."
        ),
    ),
]
