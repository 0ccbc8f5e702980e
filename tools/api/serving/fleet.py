"""A node in a fleet: cordon, drain and uncordon (``/v1/node/...``) and a
controller's whole desired set (``PUT /v1/placements``). The node decides in
the core (actors/core/cordon.py, actors/core/placement_set.py) and answers
once what it decided is durable and done."""

from __future__ import annotations

from typing import Any

from litestar import Controller, post, put
from litestar.di import NamedDependency
from litestar.params import JSONBody, SkipValidation

from infervisor.actors.core import cordon as rule
from infervisor.actors.errors import SetItemRefused
from infervisor.actors.node_fleet import CordonOutcome, SetRefused

from ..answers import answer_for
from ..context import last_of
from ..errors import ApiError
from ..fleet_wire import CordonAnswer, CordonRequest, PlacementSet, PlacementSetAnswer
from ..openapi import BODIED, responses
from .params import PREFIX, IdempotencyKey
from .verbs import VERB_DEPENDENCIES, VerbCall

__all__ = ["FleetController"]

Verb = NamedDependency[SkipValidation[VerbCall]]
Body = JSONBody[CordonRequest | None]
#: What the three cordon routes have in common.
_CORDON: dict[str, Any] = {
    "sync_to_thread": True,
    "status_code": 200,
    "responses": responses(*BODIED, 504),
    "dependencies": VERB_DEPENDENCIES,
}


class FleetController(Controller):
    """``POST /v1/node/cordon|drain|uncordon`` and ``PUT /v1/placements``."""

    path = PREFIX

    @post("/node/cordon", operation_id="cordonNode", **_CORDON)
    def cordon_node(
        self, verb: Verb, data: Body = None, idempotency_key: IdempotencyKey = None
    ) -> CordonAnswer:
        """Take no new placements (409 ``cordoned``) until uncordoned; what runs keeps
        running. Recorded (``node.cordoned``), so a restart keeps it."""
        return _answer(verb, rule.CordonAsked(_reason(data)))

    @post("/node/drain", operation_id="drainNode", **_CORDON)
    def drain_node(
        self, verb: Verb, data: Body = None, idempotency_key: IdempotencyKey = None
    ) -> CordonAnswer:
        """Cordon, and stop every instance a controller placed, with its grace:
        ``node.drained`` is durable before the first stop; they stay stopped, across
        a node restart too, until uncordoned. Answered once they are stopped."""
        return _answer(verb, rule.DrainAsked(_reason(data)))

    @post("/node/uncordon", operation_id="uncordonNode", **_CORDON)
    def uncordon_node(
        self, verb: Verb, data: Body = None, idempotency_key: IdempotencyKey = None
    ) -> CordonAnswer:
        """End cordon and drain (``node.uncordoned``); nothing is started by it."""
        return _answer(verb, rule.UncordonAsked(_reason(data)))

    @put(
        "/placements",
        operation_id="putPlacements",
        sync_to_thread=True,
        status_code=200,
        responses=responses(404, 409, 413, 415, 422, 504),
        dependencies=VERB_DEPENDENCIES,
    )
    def put_placements(self, verb: Verb, data: JSONBody[PlacementSet]) -> PlacementSetAnswer:
        """Make ``placements`` the whole set ``controller`` wants on this node: place
        what is new, raise what is older to ``generation``, unload what it placed and
        the set no longer names, start what should run. The set's record and its new
        placements are one chain transaction; the same set again records nothing. A
        generation older than the controller's last set is 409 ``stale_generation``;
        a bad item is answered naming it (``placements[2].spec.model``), nothing done."""
        for n, item in enumerate(data.placements):
            verb.api.refuse_own_port(item.spec.port, f"placements[{n}].spec.port")
        items = [(item.spec, item.start) for item in data.placements]
        by = verb.controller_source(data.controller)
        try:
            done = verb.node.put_placements(data.controller, data.generation, items, source=by)
        except SetRefused as e:
            raise ApiError(str(e), e.code, 400 if e.code == "bad_value" else 409, e.field) from e
        except SetItemRefused as e:
            raise _item_error(e) from e
        seq, digest = last_of(verb.api.chain_path)
        return PlacementSetAnswer(
            controller=data.controller,
            generation=data.generation,
            placed=done.placed,
            replaced=done.replaced,
            unloaded=done.unloaded,
            unchanged=done.unchanged,
            started=done.started,
            seq=seq,
            hash=digest,
            start_errors={iid: answer_for(e)[1] for iid, e in done.start_errors.items()},
        )


def _item_error(e: SetItemRefused) -> ApiError:
    """An item's refusal as the API answers it, its field under ``placements[N]``."""
    status, body = answer_for(e.error)
    at = f"placements[{e.index}]"
    return ApiError(f"{at}: {body.message}", body.code, status, f"{at}.{body.field or 'spec'}")


def _reason(data: CordonRequest | None) -> str | None:
    return None if data is None else data.reason


def _answer(verb: VerbCall, asked: rule.CordonObservation) -> CordonAnswer:
    done: CordonOutcome = verb.node.cordon_verb(asked, by=verb.source("operator"))
    seq, digest = last_of(verb.api.chain_path)
    now = done.in_force
    return CordonAnswer(
        cordon=done.cordon.value,
        stopped=done.stopped,
        seq=seq,
        hash=digest,
        recorded=done.recorded,
        reason=None if now is None else now.reason,
        since_ns=None if now is None else now.since_ns,
    )
