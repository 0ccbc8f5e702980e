"""The instances as a resource: list, status and placement, the verbs on one
instance (done one way: tools/api/serving/verbs.py), its deep health check and
its captured output."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any

import msgspec
from litestar import Controller, MediaType, get, post
from litestar.di import NamedDependency
from litestar.params import JSONBody, QueryParameter, SkipValidation
from litestar.response import Stream

from infervisor.actors.errors import NodeError
from infervisor.adapters.proc.errors import AdapterError

from ..answers import answer_for
from ..context import AdmittedNode, ApiContext, evicted_for, last_of
from ..errors import ApiError
from ..logs import STREAMS, follow_log, log_file
from ..openapi import BODIED, POSTED, responses, text
from ..wire import (
    InstanceView,
    PlaceAnswer,
    PlaceRequest,
    StopRequest,
    TokenAnswer,
    UnloadAnswer,
    VerbAnswer,
    VerbRequest,
)
from .params import PREFIX, IdempotencyKey, InstanceId
from .verbs import VERB_DEPENDENCIES, VerbCall

__all__ = ["InstanceController"]

#: What the four verbs' routes have in common.
_VERB: dict[str, Any] = {
    "sync_to_thread": True,
    "status_code": 200,
    "responses": responses(*BODIED, 404, 504),
    "dependencies": VERB_DEPENDENCIES,
}
#: A verb route's parameters, named short so that its signature reads on one line (the
#: app gives the verb, never a caller: not validated).
Verb = NamedDependency[SkipValidation[VerbCall]]
Body = JSONBody[VerbRequest | None]
Key = IdempotencyKey


class InstanceController(Controller):
    """``/v1/instances`` and ``/v1/instances/{instance_id}/...``."""

    path = f"{PREFIX}/instances"

    @get(operation_id="listInstances", sync_to_thread=True, responses=responses())
    def list_instances(self, node: AdmittedNode) -> list[InstanceView]:
        """Every instance's view, ordered by id."""
        return node.list()

    @get(
        "/{instance_id:str}",
        operation_id="getInstance",
        sync_to_thread=True,
        responses=responses(404),
    )
    def get_instance(self, node: AdmittedNode, instance_id: InstanceId) -> InstanceView:
        """One instance's view."""
        return node.status(instance_id)

    @post(
        operation_id="placeInstance",
        sync_to_thread=True,
        status_code=200,
        responses=responses(*BODIED, 500, 504),
        dependencies=VERB_DEPENDENCIES,
    )
    def place_instance(
        self, verb: Verb, data: JSONBody[PlaceRequest], idempotency_key: Key = None
    ) -> PlaceAnswer:
        """Place an instance (a controller's, with its generation); with ``start``, start it.

        ``outcome`` is ``applied``, ``unchanged`` (same spec and generation:
        nothing recorded) or ``ignored`` (an older generation: recorded as
        ``instance.placement_ignored``, nothing changes).
        """
        verb.api.refuse_own_port(data.spec.port)
        by = verb.controller_source(data.controller) if data.controller else verb.source("operator")
        placed = verb.node.place_outcome(
            data.spec, placed_by=data.controller, generation=data.generation, source=by
        )
        iid = placed.instance_id
        started, refused = False, None
        before, _ = last_of(verb.api.chain_path)
        # Also when unchanged: a retry of a placement whose start was cut off starts it
        # (a start of a running instance records nothing).
        if data.start and placed.outcome.value != "ignored":
            try:
                verb.node.start(iid, by=by)
                started = True
            except (NodeError, AdapterError) as e:
                refused = answer_for(e)[1]  # the placement is recorded: it stands
        got = verb.view(iid)
        return PlaceAnswer(
            instance_id=iid,
            outcome=placed.outcome.value,
            generation=placed.generation,
            instance=got.instance,
            seq=got.seq,
            hash=got.hash,
            started=started,
            start_error=refused,
            evicted=evicted_for(verb.api.chain_path, iid, before) if started else [],
        )

    @post("/{instance_id:str}/start", operation_id="startInstance", **_VERB)
    def start_instance(
        self, verb: Verb, instance_id: InstanceId, data: Body = None, idempotency_key: Key = None
    ) -> VerbAnswer:
        """Start the server (an operator start resets the restart budget; a
        controller's does not). A start of a running instance records nothing.
        ``evicted`` names the instances evicted to make room for it."""
        return _making_room(verb, instance_id, data, verb.node.start)

    @post("/{instance_id:str}/stop", operation_id="stopInstance", **_VERB)
    def stop_instance(
        self,
        verb: Verb,
        instance_id: InstanceId,
        data: JSONBody[StopRequest | None] = None,
        idempotency_key: Key = None,
    ) -> VerbAnswer:
        """Stop the server: SIGTERM to its process group, SIGKILL after ``grace_s``;
        answered once nothing of it is left."""
        grace = data.grace_s if data is not None else None
        return verb.answer(instance_id, data, functools.partial(verb.node.stop, grace_s=grace))

    @post("/{instance_id:str}/restart", operation_id="restartInstance", **_VERB)
    def restart_instance(
        self, verb: Verb, instance_id: InstanceId, data: Body = None, idempotency_key: Key = None
    ) -> VerbAnswer:
        """Stop (when running), then start (``evicted``: as a start's)."""
        return _making_room(verb, instance_id, data, verb.node.restart)

    @post("/{instance_id:str}/unload", operation_id="unloadInstance", **_VERB)
    def unload_instance(
        self, verb: Verb, instance_id: InstanceId, data: Body = None, idempotency_key: Key = None
    ) -> UnloadAnswer:
        """Stop the server and forget the instance (answered once unloaded is durable)."""
        verb.do(instance_id, data, verb.node.unload)
        seq, digest = last_of(verb.api.chain_path, instance_id)
        return UnloadAnswer(instance_id=instance_id, seq=seq, hash=digest)

    @post(
        "/{instance_id:str}/deep-health",
        operation_id="checkInstanceDeepHealth",
        sync_to_thread=True,
        status_code=200,
        responses=responses(*POSTED, 404, 502, 504),
    )
    def check_instance_deep_health(
        self, node: AdmittedNode, instance_id: InstanceId, idempotency_key: Key = None
    ) -> TokenAnswer:
        """The normal probe plus one real generated token."""
        return TokenAnswer(instance_id=instance_id, token=node.deep_health(instance_id))

    @get(
        "/{instance_id:str}/logs",
        operation_id="getInstanceLogs",
        sync_to_thread=True,
        responses={
            200: text("text/plain", "The captured bytes (the server's own output, as is)."),
            **responses(404),
        },
    )
    def get_instance_logs(
        self,
        *,
        api: NamedDependency[ApiContext],
        node: AdmittedNode,
        instance_id: InstanceId,
        stream: Annotated[str, QueryParameter(description="stderr or stdout")] = "stderr",
        follow: Annotated[
            bool, QueryParameter(description="Keep sending what is appended.")
        ] = False,
        tail_bytes: Annotated[
            int,
            QueryParameter(
                ge=0, le=16 * 1024 * 1024, description="Bytes of the tail to send first."
            ),
        ] = 64 * 1024,
    ) -> Stream:
        """The server's captured output: the last ``tail_bytes`` bytes of its
        current log, then (``follow``) what it appends."""
        if stream not in STREAMS:
            raise ApiError(
                f"stream {stream!r}: allowed {', '.join(STREAMS)}", "bad_value", 400, "stream"
            )
        node.status(instance_id)  # 404 for an unknown one
        path = log_file(api.data_dir, instance_id, stream)
        chunks = follow_log(path, tail_bytes=tail_bytes, follow=follow, stopped=api.hub)
        return Stream(chunks, media_type=MediaType.TEXT)  # Litestar adds "; charset=utf-8"


def _making_room(
    verb: VerbCall, instance_id: str, data: VerbRequest | None, act: Callable[..., object]
) -> VerbAnswer:
    """A start (or restart) answered with the instances evicted for it: the
    ``residency.evicted`` events recorded for it while it made room (stop 32's
    trial: a start said nothing of its victims)."""
    before, _ = last_of(verb.api.chain_path)
    answer = verb.answer(instance_id, data, act)
    evicted = evicted_for(verb.api.chain_path, instance_id, before)
    return msgspec.structs.replace(answer, evicted=evicted)
