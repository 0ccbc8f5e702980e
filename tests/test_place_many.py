"""Node.place_many: a batch of placements asked at once (issue 10, item 3).

Every placement of the batch is answered in the order of the specs, a refusal
in its own place without stopping the others; the applied ones are recorded
in ONE transaction (one durable round trip for the batch), each exactly as a
lone placement would have recorded it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from support import chain_rows
from test_probe_engine import keepalive  # noqa: F401 - the fixture

from infervisor.actors.host_work import Placement, PlacementOutcome
from infervisor.adapters.errors import AdmissionRefused
from infervisor.adapters.ports import free_port
from infervisor.adapters.spec import Flavor, InstanceSpec, Mode
from infervisor.chain import EventDraft, SqliteChain, StoredEvent


def test_a_batch_is_answered_in_order_with_refusals_in_place(
    nodes,
    fake_llama: str,
    fake_model: Path,
    keepalive: str,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = nodes.open(nodes.settings(fake_llama, fake_model))
    transactions: list[list[str]] = []  # the kinds each append_many stored
    original = SqliteChain.append_many

    def counting(chain: SqliteChain, drafts: Sequence[EventDraft]) -> list[StoredEvent]:
        transactions.append([d.kind for d in drafts])
        return original(chain, drafts)

    monkeypatch.setattr(SqliteChain, "append_many", counting)
    port = int(keepalive.rsplit(":", 1)[1])
    specs = [
        InstanceSpec(role=f"a{i}", flavor=Flavor.LLAMACPP, mode=Mode.ADOPTED, port=port)
        for i in range(12)
    ]
    nobody = free_port()  # nothing answers there: adopting it is refused
    specs.insert(
        5, InstanceSpec(role="gone", flavor=Flavor.LLAMACPP, mode=Mode.ADOPTED, port=nobody)
    )

    answers = node.place_many(specs, placed_by="ctl", generation=3)

    assert len(answers) == len(specs)
    refused = answers.pop(5)
    assert isinstance(refused, AdmissionRefused)
    assert f"no llamacpp server answering at http://127.0.0.1:{nobody}" in str(refused)
    assert all(isinstance(a, Placement) for a in answers), answers
    placed = [a for a in answers if isinstance(a, Placement)]
    assert [a.outcome for a in placed] == [PlacementOutcome.APPLIED] * 12
    assert [a.generation for a in placed] == [3] * 12
    assert sorted(v.instance_id for v in node.list()) == sorted(a.instance_id for a in placed)
    rows = [(kind, subj, p) for _, _, kind, subj, p in chain_rows(node.settings.chain_path)]
    recorded = {subj: p for kind, subj, p in rows if kind == "instance.placed"}
    assert set(recorded) == {a.instance_id for a in placed}
    assert {p["placed_by"] for p in recorded.values()} == {"ctl"}
    batches = [t for t in transactions if "instance.placed" in t]
    assert batches == [["instance.placed"] * 12]  # one transaction for the batch

    again = node.place_many(specs[:2] + specs[6:7], placed_by="ctl", generation=3)
    assert [a.outcome for a in again if isinstance(a, Placement)] == [
        PlacementOutcome.UNCHANGED
    ] * 3
