"""A placement on a port the node itself listens on is refused by one rule
(``ApiContext.refuse_own_port`` over ``own_ports``, for ``POST /v1/instances``
and each item of ``PUT /v1/placements``):
the control API's TCP port and the ``[front]``'s alike, 409 ``port_taken``,
nothing recorded.

A newcomer's trial (stop 33): a placement on the front's port was taken for a
foreign server (``something is already listening ...; adopt it instead``) and
recorded ``node.admission_refused``, while the API's port was refused as the
node's own with nothing recorded.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from conftest import NodeFactory
from support import chain_rows
from test_drain_node import DEADLINE_S, refused, spec

from infervisor.adapters.ports import free_port
from infervisor.tools.api.client import ApiClient
from infervisor.tools.api.serving.server import ApiServer
from infervisor.tools.node.boot import listen_for_clients
from infervisor.tools.node.config import load_config


def test_a_placement_on_the_fronts_port_is_refused_as_the_nodes_own(
    nodes: NodeFactory, fake_llama: str, fake_model: Path, tmp_path: Path
) -> None:
    settings = nodes.settings(fake_llama, fake_model)
    data, db = Path(settings.data_dir), Path(settings.chain_path)
    port = free_port()
    config = tmp_path / "front.toml"
    config.write_text(
        f'[node]\nnode_id = "{settings.node_id}"\ndata_dir = "{data}"\n\n'
        f'[api]\ntokens = ["ci"]\n\n[front]\nlisten = "127.0.0.1:{port}"\n'
    )
    data.mkdir(parents=True, exist_ok=True)
    control = ApiServer.listen(data, settings.chain_path, settings.node_id)
    try:
        front = listen_for_clients(load_config(config), control)
        assert front is not None
        node = nodes.open(settings)
        node.registry.adopt("tiny", fake_model / "tiny.gguf", replace=True)
        control.serve(node)
        try:
            with ApiClient(data_dir=data, timeout_s=DEADLINE_S) as client:
                rows = len(chain_rows(db))
                on_front = msgspec.structs.replace(spec("f1"), port=port)
                error = refused("port_taken", lambda: client.place(on_front))
                assert f"port {port} is the node's own front port ([front] listen)" in str(error)
                assert len(chain_rows(db)) == rows  # nothing recorded
                assert [v for v in node.list() if v.role == "f1"] == []
                # the whole-set verb by the same rule, naming the item
                fine = spec("f2")
                error = refused(
                    "port_taken",
                    lambda: client.put_placements("ctl", 1, [(fine, False), (on_front, False)]),
                )
                assert f"port {port} is the node's own front port" in str(error)
                assert error.field == "placements[1].spec.port", error.field
                assert len(chain_rows(db)) == rows  # nothing recorded
        finally:
            front.close()
        control.stopping()
        node.shutdown()
    finally:
        control.close()
