"""A cordon re-sent with the reason already in force (a controller sending its
cordon again) was recorded again, one ``node.cordoned`` per re-send. It records
nothing now and says so: the API's answer (``recorded`` false, the reason in
force and ``since_ns``, its event's time) and ``infervisor cordon`` (``already
cordoned since T, because: R; nothing recorded``). A placement refused on a
cordoned node says since when too, through the API and ``infervisor place``.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from conftest import NodeFactory
from support import chain_rows, cli_here
from test_drain_node import refused, served, spec


def said(ts_ns: int) -> str:
    """How a message writes the time of an event (UTC, seconds)."""
    at = dt.datetime.fromtimestamp(ts_ns / 1e9, dt.UTC).isoformat(timespec="seconds")
    return at.replace("+00:00", "Z")


def test_a_cordon_resent_with_the_reason_in_force_records_nothing_and_says_since_when(
    nodes: NodeFactory, fake_llama: str, fake_model: Path, tmp_path: Path
) -> None:
    settings = nodes.settings(fake_llama, fake_model)
    data, db = settings.data_dir, Path(settings.chain_path)
    fragment = tmp_path / "c9.toml"
    fragment.write_text('role = "c9"\nflavor = "llamacpp"\nmodel = "tiny"\nport = 9\n')
    with served(nodes, settings, fake_model) as (_, client):
        first = client.cordon("cordon", "kernel update")
        (cordoned,) = [r for r in chain_rows(db) if r[2] == "node.cordoned"]
        assert first.recorded and (first.reason, first.since_ns) == ("kernel update", cordoned[1])
        rows = len(chain_rows(db))

        again = client.cordon("cordon", "kernel update")  # the API: nothing recorded
        assert (again.recorded, again.seq, again.cordon) == (False, first.seq, "cordoned")
        assert (again.reason, again.since_ns) == ("kernel update", cordoned[1])
        shown = cli_here("cordon", data, "--reason", "kernel update")  # the CLI: the same
        assert shown.returncode == 0, shown
        assert (
            f"already cordoned since {said(cordoned[1])}, because: kernel update; "
            "nothing recorded" in shown.stdout
        ), shown.stdout
        as_json = json.loads(cli_here("cordon", data, "--reason", "kernel update", "--json").stdout)
        assert (as_json["recorded"], as_json["since_ns"]) == (False, cordoned[1])
        assert len(chain_rows(db)) == rows
        assert client.node().cordon_since_ns == cordoned[1]

        api = refused("cordoned", lambda: client.place(spec("c4")))
        assert f"cordoned since {said(cordoned[1])}, because: kernel update:" in str(api)
        place = cli_here("place", data, "--file", fragment)
        assert place.returncode == 1, place
        assert f"cordoned since {said(cordoned[1])}" in place.stderr, place.stderr
        assert len(chain_rows(db)) == rows

        other = client.cordon("cordon", "rack move")  # a new reason is recorded
        assert other.recorded and other.seq == first.seq + 1 and other.reason == "rack move"
        assert other.since_ns == chain_rows(db)[-1][1]
        done = client.cordon("uncordon")
        assert (done.recorded, done.reason, done.since_ns) == (True, None, None)
