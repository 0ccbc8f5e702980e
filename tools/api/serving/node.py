"""The node as a resource: its phase and chain head, its memory ledger, and the
heartbeats that renew a controller's lease."""

from __future__ import annotations

from litestar import Controller, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import JSONBody

from infervisor.actors.node import VERSION
from infervisor.replay.cordon_reason import cordon_in_force
from infervisor.replay.lapses import lapse_stopped
from infervisor.replay.views import LedgerView

from ..context import AdmittedNode, ApiContext, changing, last_of
from ..inventory import inventory_of
from ..openapi import BODIED, responses
from ..wire import HeartbeatAnswer, HeartbeatRequest, NodeInfo, WitnessInfo
from .params import PREFIX, IdempotencyKey

__all__ = ["NodeController"]


class NodeController(Controller):
    """``GET /v1/node``, ``GET /v1/ledger``, ``POST /v1/heartbeat``."""

    path = PREFIX

    @get("/node", operation_id="getNode", sync_to_thread=True, responses=responses())
    def get_node(self, api: NamedDependency[ApiContext], node: AdmittedNode) -> NodeInfo:
        """The node, its phase, its chain head, its inventory and its witnesses' lag;
        503 while it starts (a readiness check)."""
        seq, digest = last_of(api.chain_path)
        health = node.append_status()
        lag = node.witness_lag()
        views = node.list()
        now = None if node.cordon == "none" else cordon_in_force(api.chain_path)
        return NodeInfo(
            node_id=api.node_id,
            version=VERSION,
            phase=api.gate.phase.value,
            head_seq=seq,
            head_hash=digest,
            instances=len(views),
            lease_s=node.settings.lease_s,
            chain_writable=health.writable,
            chain_error=health.error,
            chain_failing_since_ns=health.since_ns,
            chain_append_failures=health.failures,
            containment=node.containment.mode,
            containment_reason=node.containment.reason,
            memory_cgroup=node.containment.memory,
            inventory=inventory_of(node, views, api.gpus.get()),
            witnesses=[WitnessInfo(**row._asdict()) for row in lag],
            witness_quorum=(node.settings.witness_quorum or len(lag)) if lag else None,
            cordon=node.cordon.value,
            cordon_reason=None if now is None else now.reason,
            cordon_since_ns=None if now is None else now.since_ns,
        )

    @get("/ledger", operation_id="getLedger", sync_to_thread=True, responses=responses())
    def get_ledger(self, node: AdmittedNode) -> LedgerView | None:
        """The memory budget and each reservation, bytes (null: the node has no budget)."""
        return node.ledger()

    @post(
        "/heartbeat",
        operation_id="sendHeartbeat",
        sync_to_thread=True,
        status_code=200,
        responses=responses(*BODIED),
        dependencies={"node": Provide(changing)},
    )
    def send_heartbeat(
        self,
        api: NamedDependency[ApiContext],
        node: AdmittedNode,
        data: JSONBody[HeartbeatRequest],
        idempotency_key: IdempotencyKey = None,
    ) -> HeartbeatAnswer:
        """Renew ``controller``'s lease (``node.lease_renewed`` is recorded at most
        once per fraction of the lease, actors/core/lease.py). ``lapsed``: its lease
        had lapsed before; ``stopped``: what that lapse stopped and nothing started
        since (from the chain). The node's own id is not a controller (400 ``invalid``)."""
        controller = data.controller
        lapsed = node.renew(controller)
        mine = [
            v.instance_id
            for v in node.list()
            if v.placed_by == controller and v.desired == "stopped"
        ]
        return HeartbeatAnswer(
            controller=controller,
            lease_s=node.settings.lease_s,
            lapsed=lapsed,
            stopped=lapse_stopped(api.chain_path, controller, mine),
        )
